#!/usr/bin/env bash
# build-postgresql.sh: builds a PostgreSQL major version that Debian 12's
# archive does not carry (17 from trixie, 18 from sid) from Debian's source
# package, into a directory of its own, once per machine, and links it
# from the checkout's .tmp/ (the Makefile's PG=VERSION runs it).
#
# Usage:
#   scripts/build-postgresql.sh [--check] VERSION
#
# What it does:
#   1. Looks for a finished build in $PGLEASE_PG_CACHE/postgresql-VERSION
#      (default /var/cache/pglease, or ~/.cache/pglease for a user who
#      cannot write there); when there is one, only the link
#      .tmp/postgresql-VERSION is made, so a fresh clone of the repository
#      on the same machine reuses the build.
#   2. Otherwise fetches Debian's source package postgresql-VERSION with
#      `apt-get source --download-only`, through a sources list of its own
#      (deb-src lines for trixie and sid, checked with Debian's archive
#      keyring) and apt lists and caches of its own under the cache
#      directory: the machine's apt sources are neither read nor changed.
#   3. Unpacks the upstream tarball of that package (Debian's patches are
#      not applied: they are about packaging) and builds, with
#      `nice -n 15 make -j2` by default (PGLEASE_PG_JOBS), the server and
#      client programs (src/) and pg_stat_statements (localpg preloads it
#      when present; the benchmarks read it); no documentation, no other
#      contrib modules. configure: --without-icu, with readline and zlib.
#   4. Installs into postgresql-VERSION.new beside the final directory and
#      renames it into place (PostgreSQL finds its lib/ and share/
#      relative to bin/), then writes BUILT (the Debian version and the
#      upstream one) into it; a second run at the same time waits on a
#      lock instead of building again.
#
# Time: on 2 cores, shared with other work, about 10 to 20 minutes per
# version (fetching: under a minute); a cached build: no time at all.
# Disk: about 60 MB per installed version; the sources and build tree are
# removed afterwards.
#
# Needs: apt-get, Debian's archive keyring, a C compiler, make, bison,
# flex, perl, the readline and zlib headers. For root, missing build tools
# are installed from Debian's packages (gcc make bison flex perl
# libreadline-dev zlib1g-dev debian-archive-keyring); a user who is not
# root is told what is missing.
#
# With --check: exit status 0 when the build is in the cache (and the link
# made), 1 when it is not; nothing is fetched or built.
set -euo pipefail

PROG="build-postgresql"
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	log "$*"
	exit 1
}

usage() {
	sed -n '7,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

check=0
version=""
for a in "$@"; do
	case "$a" in
	--check) check=1 ;;
	-h | --help) usage ;;
	[0-9][0-9]) version="$a" ;;
	*)
		log "unknown: $a (want a major version: 17 or 18)"
		usage
		;;
	esac
done
[[ -n "$version" ]] || usage
case "$version" in
17 | 18) ;;
*) die "PostgreSQL $version: only 17 and 18 are built from source; 15 is Debian 12's package (scripts/install-deps.sh postgresql)" ;;
esac

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"

default_cache=/var/cache/pglease
if [[ "$(id -u)" != 0 ]] && ! { mkdir -p "$default_cache" 2>/dev/null && [[ -w "$default_cache" ]]; }; then
	default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/pglease"
fi
cache="${PGLEASE_PG_CACHE:-$default_cache}"
final="$cache/postgresql-$version"
link="$root/.tmp/postgresql-$version"

built() { [[ -f "$final/BUILT" && -x "$final/bin/postgres" && -x "$final/bin/initdb" ]]; }

make_link() {
	mkdir -p "$root/.tmp"
	ln -sfn "$final" "$link"
}

if built; then
	make_link
	((check)) || log "PostgreSQL $version: cached in $final ($(head -1 "$final/BUILT")); linked from .tmp/postgresql-$version"
	exit 0
fi
if ((check)); then
	log "PostgreSQL $version: not built yet (cache: $final)"
	exit 1
fi

mkdir -p "$cache"
exec 9>"$cache/.lock-$version"
if ! flock -n 9; then
	log "PostgreSQL $version: another build is running; waiting for it"
	flock 9
fi
if built; then
	make_link
	log "PostgreSQL $version: built by the other run, in $final"
	exit 0
fi

start=$SECONDS

# --------------------------------------------------------------- tools
tools_missing=()
for t in apt-get gcc make bison flex perl; do
	command -v "$t" >/dev/null 2>&1 || tools_missing+=("$t")
done
hdr_missing=()
[[ -f /usr/include/readline/readline.h ]] || hdr_missing+=(libreadline-dev)
[[ -f /usr/include/zlib.h ]] || hdr_missing+=(zlib1g-dev)
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$keyring" ]] || hdr_missing+=(debian-archive-keyring)
if ((${#tools_missing[@]} + ${#hdr_missing[@]} > 0)); then
	command -v apt-get >/dev/null 2>&1 || die "missing: ${tools_missing[*]} ${hdr_missing[*]}; this script fetches Debian's source package with apt-get (on another system: install PostgreSQL $version and put its bin directory in PGLEASE_PG_BINDIR)"
	pkgs=("${hdr_missing[@]}")
	for t in "${tools_missing[@]}"; do
		case "$t" in
		gcc) pkgs+=(gcc libc6-dev) ;;
		*) pkgs+=("$t") ;;
		esac
	done
	[[ "$(id -u)" == 0 ]] || die "missing: ${pkgs[*]}, and not root: apt-get install ${pkgs[*]}"
	log "installing the build tools ${pkgs[*]} with apt-get"
	DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >&2
fi

# -------------------------------------------------------------- source
work="$cache/.work-$version"
rm -rf -- "$work" "$final.new"
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
trap 'rm -rf -- "$work" "$final.new"' EXIT
cat >"$work/apt/sources.list" <<EOF
deb-src [signed-by=$keyring] http://deb.debian.org/debian trixie main
deb-src [signed-by=$keyring] http://deb.debian.org/debian sid main
EOF
apt_opts=(
	-o "Dir::Etc::SourceList=$work/apt/sources.list"
	-o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$work/apt/lists"
	-o "Dir::Cache=$work/apt/cache"
	-o Dir::Cache::pkgcache=
	-o Dir::Cache::srcpkgcache=
	-o APT::Sandbox::User=root
	-o Acquire::Languages=none
	-q
)
# The sandbox user (_apt) downloads as itself; root keeps it as root here,
# since the files are written under the cache directory.
[[ "$(id -u)" == 0 ]] || apt_opts+=(-o Debug::NoLocking=1)
log "PostgreSQL $version: fetching Debian's source package postgresql-$version (trixie, sid) into $work"
apt-get "${apt_opts[@]}" update >&2
if (cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only "postgresql-$version" >&2); then
	dsc="$(ls "$work/src"/postgresql-"$version"_*.dsc 2>/dev/null | head -1)"
	[[ -n "$dsc" ]] || die "no source package postgresql-$version found"
	debver="$(sed -n 's/^Version: //p' "$dsc")"
	orig="$(ls "$work/src"/postgresql-"$version"_*.orig.tar.* | head -1)"
else
	# The archive's index names a version whose files the mirror does not
	# serve (seen on a caching mirror that keeps the previous point
	# release's files): take the pinned one below, checked against the
	# SHA-256 that its Debian .dsc names.
	case "$version" in
	17)
		debver=17.11-0+deb13u1
		file=postgresql-17_17.11.orig.tar.bz2
		sum=dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979
		;;
	18)
		debver=18.6-3
		file=postgresql-18_18.6.orig.tar.bz2
		sum=555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f
		;;
	esac
	log "PostgreSQL $version: the archive's current postgresql-$version could not be fetched; taking the pinned $debver, checked by its SHA-256"
	orig="$work/src/$file"
	/usr/lib/apt/apt-helper download-file "http://deb.debian.org/debian/pool/main/p/postgresql-$version/$file" "$orig" "SHA256:$sum" >&2 ||
		die "could not fetch $file from deb.debian.org either"
fi
[[ -n "$orig" ]] || die "no upstream tarball in the source package postgresql-$version $debver"
tar -xf "$orig" -C "$work/src"
srcdir="$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$version*" | head -1)"
[[ -n "$srcdir" && -x "$srcdir/configure" ]] || die "the upstream tarball $orig has no configure"
upver="$(sed -n "s/^PACKAGE_VERSION='\(.*\)'/\1/p" "$srcdir/configure")"
log "PostgreSQL $version: source package $debver (upstream $upver), fetched in $((SECONDS - start))s"

# --------------------------------------------------------------- build
jobs="${PGLEASE_PG_JOBS:-2}"
niceness=(nice -n 15)
t0=$SECONDS
log "PostgreSQL $version: configure and make -j$jobs (nice 15); this takes 10 to 20 minutes on 2 cores"
(
	cd "$srcdir"
	"${niceness[@]}" ./configure --prefix="$final.new" --without-icu --with-readline --with-zlib \
		>"$work/configure.log" 2>&1 ||
		{
			tail -30 "$work/configure.log" >&2
			exit 1
		}
	"${niceness[@]}" make -s -j"$jobs" -C src >"$work/make.log" 2>&1 ||
		{
			tail -40 "$work/make.log" >&2
			exit 1
		}
	"${niceness[@]}" make -s -j"$jobs" -C contrib/pg_stat_statements >>"$work/make.log" 2>&1 ||
		{
			tail -40 "$work/make.log" >&2
			exit 1
		}
	make -s -C src install >>"$work/make.log" 2>&1
	make -s -C contrib/pg_stat_statements install >>"$work/make.log" 2>&1
)
printf 'postgresql-%s %s (upstream %s), built %s in %ss by scripts/build-postgresql.sh: configure --without-icu --with-readline --with-zlib; src/ and contrib/pg_stat_statements\n' \
	"$version" "$debver" "$upver" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((SECONDS - t0))" >"$final.new/BUILT"
chmod -R a+rX "$final.new"
rm -rf -- "$final"
mv -- "$final.new" "$final"
make_link
log "PostgreSQL $version: $upver built in $((SECONDS - start))s into $final ($("$final/bin/postgres" --version)); linked from .tmp/postgresql-$version"
