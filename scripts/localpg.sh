#!/usr/bin/env bash
# localpg.sh: a throwaway local PostgreSQL for tests, demos and development.
#
# Usage:
#   scripts/localpg.sh run [--] CMD [ARGS...]
#       Runs CMD with PGLEASE_TEST_DSN, DATABASE_URL and PGLEASE_TEST_RESTART_CMD
#       pointing at a fresh PostgreSQL that lives only as long as CMD. The
#       server is stopped and its files removed when CMD ends, fails, or this
#       script is interrupted. Exits with CMD's exit status.
#       If PGLEASE_TEST_DSN (or, failing that, DATABASE_URL) is already set,
#       no server is started: CMD runs against that database.
#   scripts/localpg.sh restart DATADIR
#       Restarts the server of DATADIR (same port and settings) and returns
#       once it accepts connections again. This is what
#       PGLEASE_TEST_RESTART_CMD runs.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
SELF="$SCRIPT_DIR/$(basename -- "${BASH_SOURCE[0]}")"
PROG="localpg"

# Seconds a child gets to exit after a forwarded SIGTERM/SIGHUP (or a SIGINT
# without a terminal) before it is killed.
GRACE_SECONDS="${LOCALPG_GRACE_SECONDS:-20}"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

usage() {
	cat >&2 <<EOF
usage: $SELF run [--] CMD [ARGS...]
       $SELF restart DATADIR
EOF
	exit 2
}

is_root() { [[ "$(id -u)" == 0 ]]; }

have_server_bins() {
	local d="$1"
	[[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]]
}

# Prints the directory holding initdb/pg_ctl/postgres, or nothing.
find_bindir() {
	local d
	if command -v pg_config >/dev/null 2>&1; then
		d="$(pg_config --bindir 2>/dev/null || true)"
		if have_server_bins "$d"; then
			printf '%s\n' "$d"
			return 0
		fi
	fi
	# Newest Debian-style install.
	local best=""
	while IFS= read -r d; do
		if have_server_bins "$d"; then
			best="$d"
		fi
	done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -V || true)
	if [[ -n "$best" ]]; then
		printf '%s\n' "$best"
		return 0
	fi
	# Anything on PATH (e.g. a Homebrew or source install).
	if command -v initdb >/dev/null 2>&1; then
		d="$(dirname -- "$(readlink -f -- "$(command -v initdb)")")"
		if have_server_bins "$d"; then
			printf '%s\n' "$d"
			return 0
		fi
	fi
	return 0
}

install_postgres() {
	is_root || die "no PostgreSQL server binaries found (initdb, pg_ctl, postgres) and not root, cannot install them: install PostgreSQL or set PGLEASE_TEST_DSN"
	command -v apt-get >/dev/null 2>&1 || die "no PostgreSQL server binaries found and no apt-get to install them"
	log "no PostgreSQL server binaries found; installing the Debian package 'postgresql'"
	# Do not let the package create and start a cluster of its own.
	mkdir -p /etc/postgresql-common
	if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
		printf 'create_main_cluster = false\n' >/etc/postgresql-common/createcluster.conf
	fi
	# Keep that file as it is (no prompt: there may be no stdin).
	export DEBIAN_FRONTEND=noninteractive UCF_FORCE_CONFFOLD=1
	local dpkg_opts=(-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
	apt-get update -q >&2 || die "apt-get update failed"
	apt-get install -y -q --no-install-recommends "${dpkg_opts[@]}" postgresql >&2 ||
		die "apt-get install postgresql failed"
}

ensure_postgres_user() {
	if ! id -u postgres >/dev/null 2>&1; then
		log "creating the system user 'postgres'"
		useradd --system --user-group --no-create-home --home-dir /var/lib/postgresql \
			--shell /bin/sh postgres || die "could not create the user 'postgres'"
	fi
}

# Runs "$@" as USER when root, else as the current user, from DIR (so that an
# unreadable current directory does not bother the server tools).
run_as() {
	local user="$1" dir="$2"
	shift 2
	if is_root; then
		(cd -- "$dir" && runuser -u "$user" -- "$@")
	else
		(cd -- "$dir" && "$@")
	fi
}

port_in_use() {
	local port="$1"
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		return 0
	fi
	if command -v ss >/dev/null 2>&1; then
		if [[ -n "$(ss -Htan "sport = :$port" 2>/dev/null || true)" ]]; then
			return 0
		fi
	fi
	return 1
}

pick_port() {
	local i port
	for ((i = 0; i < 200; i++)); do
		port=$((20000 + (RANDOM * 32768 + RANDOM) % 40001))
		if ! port_in_use "$port"; then
			printf '%s\n' "$port"
			return 0
		fi
	done
	die "found no free TCP port on 127.0.0.1"
}

# Kills the postmaster of DATADIR if it is still there after pg_ctl stop.
kill_postmaster() {
	local data="$1" pid
	[[ -f "$data/postmaster.pid" ]] || return 0
	pid="$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)"
	if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
		local i
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	fi
}

# ---------------------------------------------------------------- restart

cmd_restart() {
	[[ $# -eq 1 ]] || usage
	local data="$1"
	[[ -d "$data" ]] || die "restart: no data directory $data"
	data="$(cd -- "$data" && pwd -P)"
	local base bindir logfile owner
	base="$(dirname -- "$data")"
	bindir=""
	if [[ -f "$base/bindir" ]]; then
		bindir="$(cat -- "$base/bindir")"
	fi
	have_server_bins "$bindir" || bindir="$(find_bindir)"
	have_server_bins "$bindir" || die "restart: no PostgreSQL server binaries found"
	logfile="$base/postgres.log"
	owner="$(stat -c %U -- "$data")"
	run_as "$owner" "$base" "$bindir/pg_ctl" restart -D "$data" -m fast -w -t 60 -l "$logfile" >/dev/null ||
		die "restart: pg_ctl restart failed (log: $logfile)"
}

# -------------------------------------------------------------------- run

TMP_ROOT=""
DATA_DIR=""
BIN_DIR=""
PG_USER=""
CHILD_PID=""
CHILD_PGID=""
WATCHDOG_PID=""

# Sends signal SIG to the child's process group when it has one of its own,
# else to the child alone.
signal_child() {
	local sig="$1" pid="$2" pgid="$3"
	if [[ -n "$pgid" ]] && kill -s "$sig" -- "-$pgid" 2>/dev/null; then
		return 0
	fi
	kill -s "$sig" "$pid" 2>/dev/null || true
}

cleanup() {
	if [[ -n "$WATCHDOG_PID" ]]; then
		kill -s TERM "$WATCHDOG_PID" 2>/dev/null || true
		WATCHDOG_PID=""
	fi
	# Whatever the command left running in its own process group would only
	# talk to a database that is about to go away.
	if [[ -n "$CHILD_PGID" ]]; then
		kill -s TERM -- "-$CHILD_PGID" 2>/dev/null || true
		CHILD_PGID=""
	fi
	if [[ -n "$DATA_DIR" && -f "$DATA_DIR/postmaster.pid" ]]; then
		# A fast shutdown waits for every backend to exit; the checkpoint
		# it writes is cheap with fsync off.
		run_as "$PG_USER" "$TMP_ROOT" "$BIN_DIR/pg_ctl" stop -D "$DATA_DIR" -m fast -w -t 30 \
			>/dev/null 2>&1 ||
			run_as "$PG_USER" "$TMP_ROOT" "$BIN_DIR/pg_ctl" stop -D "$DATA_DIR" -m immediate -w -t 10 \
				>/dev/null 2>&1 ||
			true
		kill_postmaster "$DATA_DIR"
	fi
	if [[ -n "$TMP_ROOT" && -d "$TMP_ROOT" ]]; then
		rm -rf -- "$TMP_ROOT" || true
	fi
	TMP_ROOT=""
	DATA_DIR=""
}

on_exit() {
	local rc=$?
	cleanup
	exit "$rc"
}

# Kills the child if it is still running GRACE_SECONDS from now.
arm_watchdog() {
	[[ -n "$CHILD_PID" && -z "$WATCHDOG_PID" ]] || return 0
	local pid="$CHILD_PID" pgid="$CHILD_PGID" grace="$GRACE_SECONDS"
	(
		trap - INT HUP EXIT
		sleep "$grace" &
		sleeper=$!
		trap 'kill -s TERM "$sleeper" 2>/dev/null; exit 0' TERM
		wait "$sleeper" || true
		if kill -0 "$pid" 2>/dev/null; then
			printf '%s: command (pid %s) still running %ss after the signal; killing it\n' \
				"$PROG" "$pid" "$grace" >&2
			signal_child KILL "$pid" "$pgid"
		fi
	) </dev/null &
	WATCHDOG_PID=$!
}

on_signal() {
	local sig="$1"
	if [[ -z "$CHILD_PID" ]]; then
		# Still setting up: nothing to wait for.
		cleanup
		case "$sig" in
		INT) exit 130 ;;
		HUP) exit 129 ;;
		*) exit 143 ;;
		esac
	fi
	signal_child "$sig" "$CHILD_PID" "$CHILD_PGID"
	# A Ctrl-C at a terminal also reached the child, which may rightly ignore
	# it (an interactive shell does). Otherwise make sure the child ends.
	if [[ "$sig" != INT || ! -t 0 ]]; then
		arm_watchdog
	fi
}

cmd_run() {
	[[ "${1:-}" == "--" ]] && shift
	[[ $# -ge 1 ]] || usage

	# An existing database: use it as is.
	if [[ -n "${PGLEASE_TEST_DSN:-}" ]]; then
		export DATABASE_URL="${DATABASE_URL:-$PGLEASE_TEST_DSN}"
		exec "$@"
	fi
	if [[ -n "${DATABASE_URL:-}" ]]; then
		export PGLEASE_TEST_DSN="$DATABASE_URL"
		exec "$@"
	fi

	trap on_exit EXIT
	trap 'on_signal INT' INT
	trap 'on_signal TERM' TERM
	trap 'on_signal HUP' HUP

	BIN_DIR="$(find_bindir)"
	if ! have_server_bins "$BIN_DIR"; then
		install_postgres
		BIN_DIR="$(find_bindir)"
		have_server_bins "$BIN_DIR" || die "PostgreSQL server binaries still not found after installing"
	fi

	if is_root; then
		ensure_postgres_user
		PG_USER=postgres
	else
		PG_USER="$(id -un)"
	fi

	# The socket path must stay short (about 100 bytes) and, when the server
	# runs as another user, the parent directory must be reachable by it.
	local tmp_parent="${TMPDIR:-/tmp}"
	if is_root || ((${#tmp_parent} > 60)) || [[ ! -d "$tmp_parent" ]]; then
		tmp_parent=/tmp
	fi
	TMP_ROOT="$(mktemp -d "$tmp_parent/pglease-pg.XXXXXXXX")"
	DATA_DIR="$TMP_ROOT/data"
	local logfile="$TMP_ROOT/postgres.log"
	printf '%s\n' "$BIN_DIR" >"$TMP_ROOT/bindir"
	chmod 0755 "$TMP_ROOT"
	if is_root; then
		chown -R "$PG_USER": "$TMP_ROOT"
	fi

	if ! run_as "$PG_USER" "$TMP_ROOT" "$BIN_DIR/initdb" -D "$DATA_DIR" --auth=trust -U postgres \
		--encoding=UTF8 --no-locale >"$TMP_ROOT/initdb.log" 2>&1; then
		cat "$TMP_ROOT/initdb.log" >&2 || true
		die "initdb failed"
	fi

	local preload=""
	local pkglibdir=""
	if [[ -x "$BIN_DIR/pg_config" ]]; then
		pkglibdir="$("$BIN_DIR/pg_config" --pkglibdir 2>/dev/null || true)"
	fi
	if [[ -f "$pkglibdir/pg_stat_statements.so" || -f "$BIN_DIR/../lib/pg_stat_statements.so" ]]; then
		preload="pg_stat_statements"
	fi

	# Settings common to every attempt; the port goes into an included file
	# so that a retry on another port only rewrites that one.
	cat >>"$DATA_DIR/postgresql.conf" <<EOF

# --- added by localpg.sh (throwaway test server) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$TMP_ROOT'
max_connections = 400
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 256MB
track_io_timing = off
shared_preload_libraries = '$preload'
logging_collector = off
include 'localpg_port.conf'
EOF

	local port="" attempt started=0
	for attempt in 1 2 3 4 5; do
		port="$(pick_port)"
		printf "port = %s\n" "$port" >"$DATA_DIR/localpg_port.conf"
		if is_root; then
			chown "$PG_USER": "$DATA_DIR/localpg_port.conf"
		fi
		if run_as "$PG_USER" "$TMP_ROOT" "$BIN_DIR/pg_ctl" start -D "$DATA_DIR" -w -t 60 -l "$logfile" \
			>/dev/null 2>&1; then
			started=1
			break
		fi
		kill_postmaster "$DATA_DIR"
		if ! grep -qiE 'could not bind|address already in use' "$logfile" 2>/dev/null; then
			break
		fi
		log "port $port was taken meanwhile; trying another (attempt $attempt)"
		: >"$logfile"
	done
	if ((started == 0)); then
		tail -n 30 "$logfile" >&2 2>/dev/null || true
		die "PostgreSQL did not start"
	fi

	local dsn="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	export PGLEASE_TEST_DSN="$dsn"
	export DATABASE_URL="${DATABASE_URL:-$dsn}"
	export PGLEASE_TEST_RESTART_CMD="$SELF restart $DATA_DIR"
	local version
	version="$("$BIN_DIR/postgres" --version 2>/dev/null | awk '{print $3}' || true)"
	log "PostgreSQL ${version:-?} on 127.0.0.1:$port (data dir $DATA_DIR, log $logfile)"

	# Run CMD as a child with our stdin. Without job control bash would start
	# it with SIGINT and SIGQUIT ignored, hence the 'trap -'. At a terminal
	# it stays in our process group so that it keeps the terminal (an
	# interactive shell needs it; Ctrl-C reaches it directly). Otherwise it
	# gets a session and process group of its own, so that a signal reaches
	# all its processes (e.g. the test binaries under 'go test'). The
	# subshell is no group leader, so setsid execs in place: the group id is
	# the child's pid.
	local own_group=0
	if [[ ! -t 0 ]] && command -v setsid >/dev/null 2>&1; then
		own_group=1
	fi
	(
		trap - INT QUIT
		if ((own_group)); then
			exec setsid -- "$@"
		fi
		exec "$@"
	) <&0 &
	CHILD_PID=$!
	if ((own_group)); then
		CHILD_PGID=$CHILD_PID
	fi
	# 'wait' returns early when a trapped signal arrives, so loop until the
	# child is really gone.
	local status=0
	while :; do
		status=0
		wait "$CHILD_PID" || status=$?
		if ((status > 128)) && kill -0 "$CHILD_PID" 2>/dev/null; then
			continue
		fi
		break
	done
	CHILD_PID=""
	exit "$status"
}

main() {
	[[ $# -ge 1 ]] || usage
	local sub="$1"
	shift
	case "$sub" in
	run) cmd_run "$@" ;;
	restart) cmd_restart "$@" ;;
	-h | --help | help) usage ;;
	*) usage ;;
	esac
}

main "$@"
