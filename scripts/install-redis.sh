#!/usr/bin/env bash
# install-redis.sh: makes sure there is a redis-server program for the
# Redis Streams peer of `make bench` (benchmarks/redis.go), which starts a
# throwaway server of its own for every run and stops it afterwards.
#
# Usage:
#   scripts/install-redis.sh
#       Does nothing when redis-server is on PATH or in /usr/bin. Otherwise,
#       as root with apt-get, installs the Debian package 'redis-server'
#       without letting the package start its own Redis service. When it
#       cannot, it says why and exits 0: the benchmark then leaves Redis out
#       and says so in its report.
set -euo pipefail

PROG="install-redis"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }

have_redis() {
	command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]]
}

if have_redis; then
	exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
	log "warning: no redis-server found and not root, cannot install it (Debian, Ubuntu: apt-get install redis-server; macOS: brew install redis); the benchmark leaves Redis Streams out"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "warning: no redis-server found and no apt-get to install it; the benchmark leaves Redis Streams out"
	exit 0
fi

log "no redis-server found; installing the Debian package 'redis-server'"
# The package would start a Redis service on port 6379 where it can; the
# benchmark needs none. A policy-rc.d that says 101 ("action forbidden")
# stops that, unless the machine has one already (containers usually do).
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e "$policy" ]]; then
	printf '#!/bin/sh\n# Written by install-redis.sh for the length of one apt-get install.\nexit 101\n' >"$policy"
	chmod 0755 "$policy"
	own_policy=1
fi
cleanup() {
	if ((own_policy)); then
		rm -f -- "$policy"
	fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive UCF_FORCE_CONFFOLD=1
dpkg_opts=(-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
if ! apt-get update -q >&2; then
	log "warning: apt-get update failed; the benchmark leaves Redis Streams out"
	exit 0
fi
if ! apt-get install -y -q --no-install-recommends "${dpkg_opts[@]}" redis-server >&2; then
	log "warning: apt-get install redis-server failed; the benchmark leaves Redis Streams out"
	exit 0
fi
if ! have_redis; then
	log "warning: redis-server still not found after installing; the benchmark leaves Redis Streams out"
fi
