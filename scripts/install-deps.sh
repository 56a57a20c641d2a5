#!/usr/bin/env bash
# install-deps.sh: installs the programs the tests and make targets run
# that Go does not bring, from Debian's packages, when they are missing,
# and says what it installs. The Makefile runs `install-deps.sh --check
# WHAT || install-deps.sh WHAT`, so it only runs when something is missing.
#
# Usage:
#   scripts/install-deps.sh [--check] WHAT...
#
# WHAT is one or more of:
#   postgresql  PostgreSQL's server programs (initdb, pg_ctl, postgres,
#               pg_basebackup; package 'postgresql', without a cluster of
#               its own), and, for a root user, the system user 'postgres'
#               that localpg and internal/pgrepl run them as
#   pgbouncer   PgBouncer (package 'pgbouncer'), for the tests behind a
#               transaction pooler
#   chromium    a headless Chromium (package 'chromium'; or set
#               PGLEASE_CHROMIUM to a Chromium or Chrome), for the browser
#               test of `pglease ui`
#   redis       redis-server (package 'redis-server'), for the Redis Streams
#               peer of `make bench`
#   test        postgresql pgbouncer chromium: what `make test` needs
#
# With --check nothing is installed: what is missing is listed on stderr,
# and the exit status is 1 when something is. Otherwise the missing ones are
# installed with apt-get (root only; one 'apt-get update' first), without
# starting any service of theirs, and the exit status is 1 when one is
# still missing afterwards.
set -euo pipefail

PROG="install-deps"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }

usage() {
	sed -n '7,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

# ----------------------------------------------------------------- finding

have_server_bins() {
	local d="$1" p
	[[ -n "$d" ]] || return 1
	for p in initdb pg_ctl postgres pg_basebackup; do
		[[ -x "$d/$p" ]] || return 1
	done
}

# As internal/pgrepl's FindBindir: pg_config --bindir, else the newest
# /usr/lib/postgresql/*/bin, else the directory of initdb on PATH.
have_postgresql() {
	local d
	if command -v pg_config >/dev/null 2>&1; then
		d="$(pg_config --bindir 2>/dev/null || true)"
		have_server_bins "$d" && return 0
	fi
	for d in /usr/lib/postgresql/*/bin; do
		have_server_bins "$d" && return 0
	done
	if command -v initdb >/dev/null 2>&1; then
		d="$(dirname -- "$(readlink -f -- "$(command -v initdb)")")"
		have_server_bins "$d" && return 0
	fi
	return 1
}

have_postgres_user() {
	[[ "$(id -u)" != 0 ]] || id -u postgres >/dev/null 2>&1
}

# As localpg: PATH, then where Debian and Homebrew put it.
have_pgbouncer() {
	local p
	command -v pgbouncer >/dev/null 2>&1 && return 0
	for p in /usr/sbin/pgbouncer /usr/local/sbin/pgbouncer /usr/local/bin/pgbouncer /opt/homebrew/bin/pgbouncer; do
		[[ -x "$p" ]] && return 0
	done
	return 1
}

# As cmd/pglease/uitest: PGLEASE_CHROMIUM, chromium, chromium-browser.
have_chromium() {
	[[ -n "${PGLEASE_CHROMIUM:-}" && -x "${PGLEASE_CHROMIUM}" ]] && return 0
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

have_redis() {
	command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]]
}

# present WHAT: whether WHAT is there.
present() {
	case "$1" in
	postgresql) have_postgresql && have_postgres_user ;;
	pgbouncer) have_pgbouncer ;;
	chromium) have_chromium ;;
	redis) have_redis ;;
	esac
}

# package WHAT: its Debian package.
package() {
	case "$1" in
	postgresql) echo postgresql ;;
	pgbouncer) echo pgbouncer ;;
	chromium) echo chromium ;;
	redis) echo redis-server ;;
	esac
}

# hint WHAT: how to install it elsewhere.
hint() {
	case "$1" in
	postgresql) echo "Debian, Ubuntu: apt-get install postgresql; macOS: brew install postgresql; or set PGLEASE_TEST_DSN for the tests that need no server programs of their own" ;;
	pgbouncer) echo "Debian, Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer" ;;
	chromium) echo "Debian, Ubuntu: apt-get install chromium; or set PGLEASE_CHROMIUM to a Chromium or Chrome" ;;
	redis) echo "Debian, Ubuntu: apt-get install redis-server; macOS: brew install redis" ;;
	esac
}

# ------------------------------------------------------------------ main

check=0
wanted=()
for a in "$@"; do
	case "$a" in
	--check) check=1 ;;
	test) wanted+=(postgresql pgbouncer chromium) ;;
	postgresql | pgbouncer | chromium | redis) wanted+=("$a") ;;
	-h | --help) usage ;;
	*)
		log "unknown: $a"
		usage
		;;
	esac
done
((${#wanted[@]} > 0)) || usage

missing=()
for w in "${wanted[@]}"; do
	if ! present "$w" && [[ " ${missing[*]} " != *" $w "* ]]; then
		missing+=("$w")
	fi
done
if ((${#missing[@]} == 0)); then
	((check)) || log "nothing to install: ${wanted[*]} present"
	exit 0
fi
if ((check)); then
	for w in "${missing[@]}"; do
		log "missing: $w (Debian package '$(package "$w")')"
	done
	exit 1
fi

if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	why="not root"
	[[ "$(id -u)" != 0 ]] || why="no apt-get"
	for w in "${missing[@]}"; do
		log "missing: $w, and $why, so not installed ($(hint "$w"))"
	done
	exit 1
fi

pkgs=()
for w in "${missing[@]}"; do
	pkgs+=("$(package "$w")")
done
log "installing the Debian packages ${pkgs[*]} (missing: ${missing[*]}) with apt-get"

# No package may start a service of its own (PostgreSQL's main cluster, a
# PgBouncer or Redis on their usual ports): a policy-rc.d that says 101
# ("action forbidden") for the length of the install, unless the machine
# has one already (containers usually do), and no main cluster for
# PostgreSQL.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e "$policy" ]]; then
	printf '#!/bin/sh\n# Written by install-deps.sh for the length of one apt-get install.\nexit 101\n' >"$policy"
	chmod 0755 "$policy"
	own_policy=1
fi
cleanup() {
	if ((own_policy)); then
		rm -f -- "$policy"
	fi
}
trap cleanup EXIT
if [[ " ${missing[*]} " == *" postgresql "* ]]; then
	mkdir -p /etc/postgresql-common
	if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
		printf 'create_main_cluster = false\n' >/etc/postgresql-common/createcluster.conf
	fi
fi

# Keep configuration files as they are, with no prompt (there may be no
# standard input).
export DEBIAN_FRONTEND=noninteractive UCF_FORCE_CONFFOLD=1
dpkg_opts=(-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
apt-get update -q >&2
lean=()
for p in "${pkgs[@]}"; do
	[[ "$p" == chromium ]] || lean+=("$p")
done
if ((${#lean[@]} > 0)); then
	apt-get install -y -q --no-install-recommends "${dpkg_opts[@]}" "${lean[@]}" >&2
fi
# Chromium with its recommended packages (fonts among them).
if [[ " ${pkgs[*]} " == *" chromium "* ]]; then
	apt-get install -y -q "${dpkg_opts[@]}" chromium >&2
fi

if [[ " ${missing[*]} " == *" postgresql "* ]] && ! id -u postgres >/dev/null 2>&1; then
	log "creating the system user 'postgres'"
	useradd --system --user-group --no-create-home --home-dir /var/lib/postgresql --shell /bin/sh postgres
fi

status=0
for w in "${missing[@]}"; do
	if ! present "$w"; then
		log "$w is still missing after installing '$(package "$w")'"
		status=1
	fi
done
((status)) || log "installed: ${missing[*]}"
exit "$status"
