#!/usr/bin/env bash
# install-chromium.sh: makes sure there is a headless-capable Chromium for
# the browser tests of `pglease ui` (cmd/pglease/uitest), and prints its
# path on stdout.
#
# Usage:
#   scripts/install-chromium.sh
#       Prints the first of $PGLEASE_CHROMIUM, chromium, chromium-browser
#       found. Otherwise, as root with apt-get, installs Debian's package
#       'chromium' (apt-get install -y chromium) and prints its path. When
#       it cannot, it says why on stderr and exits 1: the browser tests fail
#       rather than skip.
set -euo pipefail

PROG="install-chromium"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }

find_chromium() {
	if [[ -n "${PGLEASE_CHROMIUM:-}" && -x "${PGLEASE_CHROMIUM}" ]]; then
		printf '%s\n' "$PGLEASE_CHROMIUM"
		return 0
	fi
	local c
	for c in chromium chromium-browser; do
		if command -v "$c" >/dev/null 2>&1; then
			command -v "$c"
			return 0
		fi
	done
	return 1
}

if find_chromium; then
	exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
	log "no chromium found and not root, cannot install it (Debian, Ubuntu: apt-get install chromium); or set PGLEASE_CHROMIUM"
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "no chromium found and no apt-get to install it; set PGLEASE_CHROMIUM to a Chromium or Chrome binary"
	exit 1
fi
log "no chromium found; installing the Debian package 'chromium'"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q chromium >&2; then
	log "apt-get install failed; updating the package lists and trying again"
	apt-get update -q >&2
	apt-get install -y -q chromium >&2
fi
find_chromium || {
	log "chromium was installed but is not on PATH"
	exit 1
}
