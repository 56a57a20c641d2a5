#!/usr/bin/env bash
# localpg.sh: a throwaway local PostgreSQL for tests, demos and development,
# with a PgBouncer in transaction mode in front of it.
#
# Usage:
#   scripts/localpg.sh run [--] CMD [ARGS...]
#       Runs CMD with PGLEASE_TEST_DSN, DATABASE_URL and PGLEASE_TEST_RESTART_CMD
#       pointing at a fresh PostgreSQL that lives only as long as CMD, and
#       PGLEASE_TEST_PGBOUNCER_DSN (the same database and user through a
#       PgBouncer in transaction mode, sslmode=disable),
#       PGLEASE_TEST_PGBOUNCER_PIDFILE and PGLEASE_TEST_PGBOUNCER_LOG. The
#       server and PgBouncer are stopped and their files removed when CMD
#       ends, fails, or this script is interrupted. Exits with CMD's exit
#       status.
#       If PGLEASE_TEST_DSN (or, failing that, DATABASE_URL) is already set,
#       no server is started: CMD runs against that database, and a PgBouncer
#       is started in front of it when one can be (PgBouncer must be able to
#       log in with the user and password of that URL). If
#       PGLEASE_TEST_PGBOUNCER_DSN is set too, no PgBouncer is started either.
#       PgBouncer is installed (Debian package 'pgbouncer') when missing and
#       running as root; when it cannot be, a warning says so and the
#       PGLEASE_TEST_PGBOUNCER_* variables stay unset (the tests that need
#       them fail and say why).
#   scripts/localpg.sh restart DATADIR
#       Restarts the server of DATADIR (same port and settings) and returns
#       once it accepts connections again. This is what
#       PGLEASE_TEST_RESTART_CMD runs. PgBouncer keeps running: it drops the
#       server connections the restart closed and opens new ones.
#
# The server runs with fsync, synchronous_commit and full_page_writes off,
# which makes tests fast and loses nothing a throwaway server needs. With
# LOCALPG_DURABLE=1 they stay on (PostgreSQL's defaults: every commit waits
# for its WAL to reach the disk), as `make bench` wants for comparing
# pglease with brokers that fsync. Only a server this script starts is
# affected: a database given in PGLEASE_TEST_DSN runs as it is configured.
#
# PgBouncer's log is $PGLEASE_TEST_PGBOUNCER_LOG while CMD runs; a crash
# shows there as a FATAL line (e.g. "FATAL server_proto: server in bad
# state"), and this script prints the log's last lines at the end when
# PgBouncer did not live as long as CMD.
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

APT_UPDATED=0

# Runs apt-get update once per run of this script.
apt_update() {
	((APT_UPDATED)) && return 0
	apt-get update -q >&2 || return 1
	APT_UPDATED=1
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
	apt_update || die "apt-get update failed"
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

# ---------------------------------------------------------------- pgbouncer

# PostgreSQL's max_connections for the throwaway server.
PG_MAX_CONNECTIONS=400

PGB_DIR=""
PGB_PID=""

# Prints the path of the pgbouncer program, or nothing. Debian puts it in
# /usr/sbin, which is not on a normal user's PATH.
find_pgbouncer() {
	local p
	for p in "$(command -v pgbouncer 2>/dev/null || true)" /usr/sbin/pgbouncer \
		/usr/local/sbin/pgbouncer /usr/local/bin/pgbouncer /opt/homebrew/bin/pgbouncer; do
		if [[ -n "$p" && -x "$p" ]]; then
			printf '%s\n' "$p"
			return 0
		fi
	done
	return 0
}

# Installs Debian's pgbouncer package. Returns 1, having said why, when it
# cannot.
install_pgbouncer() {
	if ! is_root; then
		log "no PgBouncer found and not root, cannot install it (Debian, Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer)"
		return 1
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		log "no PgBouncer found and no apt-get to install it"
		return 1
	fi
	log "no PgBouncer found; installing the Debian package 'pgbouncer'"
	export DEBIAN_FRONTEND=noninteractive UCF_FORCE_CONFFOLD=1
	local dpkg_opts=(-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
	if ! apt_update; then
		log "apt-get update failed"
		return 1
	fi
	if ! apt-get install -y -q --no-install-recommends "${dpkg_opts[@]}" pgbouncer >&2; then
		log "apt-get install pgbouncer failed"
		return 1
	fi
}

# Reports whether PID is a live pgbouncer process (not a zombie that init
# has yet to reap).
pgbouncer_alive() {
	local pid="$1" stat
	[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
	if [[ -r "/proc/$pid/stat" ]]; then
		stat="$(cat "/proc/$pid/stat" 2>/dev/null || true)"
		[[ "$stat" == *"(pgbouncer) "[!Z]* ]] || return 1
	fi
	return 0
}

# The server connections PgBouncer may open per database and user: a quarter
# of what the server allows (MAX_CONNECTIONS, less the superuser's reserve),
# at most 40, so that direct connections of the same tests still fit.
pgbouncer_pool_size() {
	local max="$1" n
	n=$(((max - 3) / 4))
	((n > 40)) && n=40
	((n < 2)) && n=2
	printf '%s\n' "$n"
}

# Writes a value of PgBouncer's auth_file: double quotes, with a double
# quote doubled.
auth_file_quote() {
	local v="$1"
	printf '"%s"' "${v//\"/\"\"}"
}

# Percent-encodes $1 for the user or path of a URL.
url_encode() {
	local LC_ALL=C s="$1" out="" c i
	for ((i = 0; i < ${#s}; i++)); do
		c="${s:i:1}"
		case "$c" in
		[A-Za-z0-9._~-]) out+="$c" ;;
		*) out+="$(printf '%%%02X' "'$c")" ;;
		esac
	done
	printf '%s\n' "$out"
}

# Writes pgbouncer.ini and userlist.txt into PGB_DIR. Arguments: the
# server's host, port, the user (and its password, may be empty), its
# sslmode and root certificate (may be empty), the pool size, the listen
# port and the most client connections.
write_pgbouncer_config() {
	local host="$1" port="$2" user="$3" password="$4" sslmode="$5" rootcert="$6"
	local pool="$7" listen_port="$8" max_clients="$9"
	local ca=""
	if [[ -n "$rootcert" ]]; then
		ca="server_tls_ca_file = $rootcert"
	fi
	# The user, in PgBouncer's auth_file. With auth_type = trust the client
	# sends no password; a password given here is the one PgBouncer logs in
	# to the server with.
	printf '%s %s\n' "$(auth_file_quote "$user")" "$(auth_file_quote "$password")" >"$PGB_DIR/userlist.txt"
	chmod 0600 "$PGB_DIR/userlist.txt"
	cat >"$PGB_DIR/pgbouncer.ini" <<EOF
; Written by localpg.sh: a throwaway PgBouncer for tests.
[databases]
; Any database name the client asks for, on the one server: tests and
; benchmarks create databases of their own.
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen_port
; No Unix socket: TCP on 127.0.0.1 only.
unix_socket_dir =
pidfile = $PGB_DIR/pgbouncer.pid
logfile = $PGB_DIR/pgbouncer.log
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
admin_users = $user
stats_users = $user

pool_mode = transaction
; Watermill's universal test suite opens hundreds of client connections.
max_client_conn = $max_clients
default_pool_size = $pool
min_pool_size = 0
reserve_pool_size = 0
listen_backlog = 4096
; pgx sends no startup parameter that PgBouncer does not know (it sends
; user, database and the URL's run-time parameters); JDBC and lib/pq send
; extra_float_digits. Not ignored: search_path, options (ignoring them would
; silently give the client another schema).
ignore_startup_parameters = extra_float_digits
; Only used in session mode; transaction mode never resets a connection.
server_reset_query = DISCARD ALL
; A failed login (the server restarting) makes PgBouncer fail new clients
; at once for this long; the default of 15 s would outlast a restart.
server_login_retry = 1
server_tls_sslmode = $sslmode
$ca
; Thousands of connections per test run: log only what goes wrong.
log_connections = 0
log_disconnections = 0
log_pooler_errors = 1
EOF
	if is_root; then
		chown "$PG_USER": "$PGB_DIR/pgbouncer.ini" "$PGB_DIR/userlist.txt"
	fi
}

# Waits until the PgBouncer of PGB_DIR runs and accepts TCP connections on
# PORT; sets PGB_PID. Returns 1 when it exits or does not listen within 15 s.
wait_pgbouncer() {
	local port="$1" pid="" i
	for ((i = 0; i < 150; i++)); do
		if [[ -z "$pid" && -s "$PGB_DIR/pgbouncer.pid" ]]; then
			pid="$(head -n 1 "$PGB_DIR/pgbouncer.pid" 2>/dev/null || true)"
			[[ "$pid" =~ ^[0-9]+$ ]] || pid=""
			PGB_PID="$pid"
		fi
		if [[ -n "$pid" ]]; then
			pgbouncer_alive "$pid" || return 1
			if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
				return 0
			fi
		fi
		sleep 0.1
	done
	return 1
}

# Stops the PgBouncer of PGB_DIR, if it runs: SIGTERM (immediate shutdown),
# then SIGKILL after 5 s.
stop_pgbouncer() {
	local pid="$PGB_PID" i
	if [[ -z "$pid" && -n "$PGB_DIR" && -s "$PGB_DIR/pgbouncer.pid" ]]; then
		pid="$(head -n 1 "$PGB_DIR/pgbouncer.pid" 2>/dev/null || true)"
	fi
	PGB_PID=""
	pgbouncer_alive "$pid" || return 0
	kill -s TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		pgbouncer_alive "$pid" || return 0
		sleep 0.1
	done
	kill -s KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		pgbouncer_alive "$pid" || return 0
		sleep 0.1
	done
}

# Starts a PgBouncer in transaction mode in front of a server, with its
# files in TMP_ROOT/pgbouncer, run as PG_USER; on success exports
# PGLEASE_TEST_PGBOUNCER_DSN, _PIDFILE and _LOG. Arguments: the server's
# host, port, user, password (may be empty), database, sslmode, root
# certificate (may be empty) and max_connections. Returns 1, having said
# why, when it cannot.
start_pgbouncer() {
	local host="$1" port="$2" user="$3" password="$4" db="$5" sslmode="$6" rootcert="$7" max_conns="$8"
	local bin
	bin="$(find_pgbouncer)"
	if [[ -z "$bin" ]]; then
		install_pgbouncer || return 1
		bin="$(find_pgbouncer)"
		if [[ -z "$bin" ]]; then
			log "PgBouncer still not found after installing"
			return 1
		fi
	fi

	PGB_DIR="$TMP_ROOT/pgbouncer"
	mkdir -p -- "$PGB_DIR"
	chmod 0755 "$PGB_DIR"
	if is_root; then
		chown "$PG_USER": "$PGB_DIR"
	fi

	# PgBouncer needs a file descriptor per client and server connection:
	# raise the soft limit as far as the hard one allows and keep the
	# clients within it.
	local nofile hard max_clients=2000
	hard="$(ulimit -Hn)"
	if [[ "$hard" == unlimited ]] || ((hard > 8192)); then
		nofile=8192
	else
		nofile="$hard"
	fi
	if ((nofile < max_clients + 200)); then
		max_clients=$((nofile - 200))
	fi
	if ((max_clients < 100)); then
		log "the open files limit ($nofile) is too low for PgBouncer"
		return 1
	fi

	local pool attempt lport="" started=0
	pool="$(pgbouncer_pool_size "$max_conns")"
	for attempt in 1 2 3 4 5; do
		lport="$(pick_port)"
		[[ -n "$lport" ]] || return 1
		write_pgbouncer_config "$host" "$port" "$user" "$password" "$sslmode" "$rootcert" \
			"$pool" "$lport" "$max_clients"
		rm -f -- "$PGB_DIR/pgbouncer.pid" "$PGB_DIR/pgbouncer.log"
		if run_as "$PG_USER" "$PGB_DIR" sh -c 'ulimit -n "$1" 2>/dev/null || true; exec "$2" -d -q "$3"' \
			sh "$nofile" "$bin" "$PGB_DIR/pgbouncer.ini" >"$PGB_DIR/start.log" 2>&1 &&
			wait_pgbouncer "$lport"; then
			started=1
			break
		fi
		stop_pgbouncer
		if ! grep -qiE 'address already in use|could not bind' "$PGB_DIR/pgbouncer.log" "$PGB_DIR/start.log" 2>/dev/null; then
			break
		fi
		log "port $lport was taken meanwhile; trying another for PgBouncer (attempt $attempt)"
	done
	if ((started == 0)); then
		cat "$PGB_DIR/start.log" >&2 2>/dev/null || true
		tail -n 30 "$PGB_DIR/pgbouncer.log" >&2 2>/dev/null || true
		log "PgBouncer did not start"
		return 1
	fi

	export PGLEASE_TEST_PGBOUNCER_DSN="postgres://$(url_encode "$user")@127.0.0.1:$lport/$(url_encode "$db")?sslmode=disable"
	export PGLEASE_TEST_PGBOUNCER_PIDFILE="$PGB_DIR/pgbouncer.pid"
	export PGLEASE_TEST_PGBOUNCER_LOG="$PGB_DIR/pgbouncer.log"
	local version
	version="$("$bin" --version 2>/dev/null | awk 'NR == 1 {print $2}' || true)"
	log "PgBouncer ${version:-?} on 127.0.0.1:$lport in transaction mode, in front of $host:$port (pool size $pool, at most $max_clients clients; log $PGLEASE_TEST_PGBOUNCER_LOG)"
}

# Says whether PgBouncer died before the end, with the last lines of its log.
report_pgbouncer_death() {
	[[ -n "$PGB_PID" ]] || return 0
	pgbouncer_alive "$PGB_PID" && return 0
	log "PgBouncer (pid $PGB_PID) exited before the command ended; the last lines of its log:"
	tail -n 20 "$PGB_DIR/pgbouncer.log" >&2 2>/dev/null || true
	PGB_PID=""
}

# url_decode prints $1 with its %XX escapes decoded.
url_decode() {
	local s="${1//\\/\\\\}"
	printf '%b' "${s//%/\\x}"
}

# dsn_set records the value of one keyword of a connection string.
dsn_set() {
	case "$1" in
	host) DSN_HOST="$2" ;;
	port) DSN_PORT="$2" ;;
	user) DSN_USER="$2" ;;
	password) DSN_PASSWORD="$2" ;;
	dbname) DSN_DB="$2" ;;
	sslmode) DSN_SSLMODE="$2" ;;
	sslrootcert) DSN_SSLROOTCERT="$2" ;;
	esac
}

# parse_dsn splits a libpq connection string, URL or keyword/value form,
# into DSN_HOST, DSN_PORT, DSN_USER, DSN_PASSWORD, DSN_DB, DSN_SSLMODE and
# DSN_SSLROOTCERT; the PG* environment variables and libpq's defaults fill
# in what it does not say (a password file is not read). Returns 1, having
# said why, for a string it cannot read or several hosts.
parse_dsn() {
	local dsn="$1" k v
	DSN_HOST="" DSN_PORT="" DSN_USER="" DSN_PASSWORD="" DSN_DB="" DSN_SSLMODE="" DSN_SSLROOTCERT=""
	if [[ "$dsn" =~ ^postgres(ql)?:// ]]; then
		local rest="${dsn#*://}" query="" auth="" hostport path=""
		if [[ "$rest" == *\?* ]]; then
			query="${rest#*\?}"
			rest="${rest%%\?*}"
		fi
		# The last @ ends the user information (a password may hold an
		# unescaped @ or /).
		if [[ "$rest" == *@* ]]; then
			auth="${rest%@*}"
			rest="${rest##*@}"
		fi
		hostport="${rest%%/*}"
		if [[ "$rest" == */* ]]; then
			path="${rest#*/}"
		fi
		if [[ -n "$auth" ]]; then
			DSN_USER="$(url_decode "${auth%%:*}")"
			if [[ "$auth" == *:* ]]; then
				DSN_PASSWORD="$(url_decode "${auth#*:}")"
			fi
		fi
		if [[ "$hostport" == *,* ]]; then
			log "the database URL names several hosts; PgBouncer can stand in front of one"
			return 1
		fi
		if [[ "$hostport" =~ ^\[([^]]*)\](:([0-9]*))?$ ]]; then
			DSN_HOST="${BASH_REMATCH[1]}"
			DSN_PORT="${BASH_REMATCH[3]}"
		elif [[ "$hostport" =~ ^([^:]*)(:([0-9]*))?$ ]]; then
			DSN_PORT="${BASH_REMATCH[3]}"
			DSN_HOST="$(url_decode "${BASH_REMATCH[1]}")"
		else
			log "cannot read the host and port of the database URL"
			return 1
		fi
		if [[ -n "$path" ]]; then
			DSN_DB="$(url_decode "$path")"
		fi
		local pair
		while IFS= read -r -d '&' pair; do
			[[ "$pair" == *=* ]] || continue
			k="$(url_decode "${pair%%=*}")"
			v="$(url_decode "${pair#*=}")"
			if [[ -n "$v" ]]; then
				dsn_set "$k" "$v"
			fi
		done <<<"$query&"
	else
		# key = value pairs separated by white space; a value may be in
		# single quotes, with \' and \\ escaped.
		local i=0 n=${#dsn} c
		while ((i < n)); do
			while ((i < n)) && [[ "${dsn:i:1}" == [[:space:]] ]]; do ((i++)) || true; done
			((i < n)) || break
			k=""
			while ((i < n)) && [[ "${dsn:i:1}" != [=[:space:]] ]]; do
				k+="${dsn:i:1}"
				((i++)) || true
			done
			while ((i < n)) && [[ "${dsn:i:1}" == [[:space:]] ]]; do ((i++)) || true; done
			if [[ "${dsn:i:1}" != "=" ]]; then
				log "cannot read the connection string (no = after '$k')"
				return 1
			fi
			((i++)) || true
			while ((i < n)) && [[ "${dsn:i:1}" == [[:space:]] ]]; do ((i++)) || true; done
			v=""
			if [[ "${dsn:i:1}" == "'" ]]; then
				((i++)) || true
				while ((i < n)) && [[ "${dsn:i:1}" != "'" ]]; do
					c="${dsn:i:1}"
					if [[ "$c" == '\' ]]; then
						((i++)) || true
						c="${dsn:i:1}"
					fi
					v+="$c"
					((i++)) || true
				done
				if ((i >= n)); then
					log "cannot read the connection string (unterminated quote)"
					return 1
				fi
				((i++)) || true
			else
				while ((i < n)) && [[ "${dsn:i:1}" != [[:space:]] ]]; do
					c="${dsn:i:1}"
					if [[ "$c" == '\' ]]; then
						((i++)) || true
						c="${dsn:i:1}"
					fi
					v+="$c"
					((i++)) || true
				done
			fi
			dsn_set "$k" "$v"
		done
		if [[ "$DSN_HOST" == *,* ]]; then
			log "the connection string names several hosts; PgBouncer can stand in front of one"
			return 1
		fi
	fi
	DSN_HOST="${DSN_HOST:-${PGHOST:-localhost}}"
	DSN_PORT="${DSN_PORT:-${PGPORT:-5432}}"
	DSN_USER="${DSN_USER:-${PGUSER:-$(id -un)}}"
	DSN_PASSWORD="${DSN_PASSWORD:-${PGPASSWORD:-}}"
	DSN_DB="${DSN_DB:-${PGDATABASE:-$DSN_USER}}"
	DSN_SSLMODE="${DSN_SSLMODE:-${PGSSLMODE:-prefer}}"
	DSN_SSLROOTCERT="${DSN_SSLROOTCERT:-${PGSSLROOTCERT:-}}"
	case "$DSN_SSLMODE" in
	disable | allow | prefer | require | verify-ca | verify-full) ;;
	*)
		log "unknown sslmode '$DSN_SSLMODE' in the database URL"
		return 1
		;;
	esac
	if [[ ! "$DSN_PORT" =~ ^[0-9]+$ ]]; then
		log "the port of the database URL is not a number: '$DSN_PORT'"
		return 1
	fi
}

# The server's max_connections, asked with psql when there is one; else a
# guess of 100 (PostgreSQL's default).
server_max_connections() {
	local dsn="$1" n=""
	if command -v psql >/dev/null 2>&1; then
		n="$(PGCONNECT_TIMEOUT=10 psql "$dsn" -XAtq -c 'SELECT current_setting($$max_connections$$)::int - current_setting($$superuser_reserved_connections$$)::int' 2>/dev/null || true)"
	fi
	[[ "$n" =~ ^[0-9]+$ ]] || n=100
	printf '%s\n' "$n"
}

# Starts a PgBouncer in front of the database of PGLEASE_TEST_DSN (an
# existing server), when it can; says so when it cannot.
start_pgbouncer_external() {
	local why="tests that need PgBouncer (PGLEASE_TEST_PGBOUNCER_DSN) will fail"
	if [[ -n "${PGLEASE_TEST_PGBOUNCER_DSN:-}" ]]; then
		log "using the PgBouncer of PGLEASE_TEST_PGBOUNCER_DSN as given"
		return 0
	fi
	if ! parse_dsn "$PGLEASE_TEST_DSN"; then
		log "warning: no PgBouncer in front of PGLEASE_TEST_DSN; $why"
		return 0
	fi
	if is_root; then
		ensure_postgres_user
		PG_USER=postgres
	else
		PG_USER="$(id -un)"
	fi
	local tmp_parent="${TMPDIR:-/tmp}"
	if is_root || ((${#tmp_parent} > 60)) || [[ ! -d "$tmp_parent" ]]; then
		tmp_parent=/tmp
	fi
	TMP_ROOT="$(mktemp -d "$tmp_parent/pglease-pgbouncer.XXXXXXXX")"
	chmod 0755 "$TMP_ROOT"
	if is_root; then
		chown "$PG_USER": "$TMP_ROOT"
	fi
	if ! start_pgbouncer "$DSN_HOST" "$DSN_PORT" "$DSN_USER" "$DSN_PASSWORD" "$DSN_DB" \
		"$DSN_SSLMODE" "$DSN_SSLROOTCERT" "$(server_max_connections "$PGLEASE_TEST_DSN")"; then
		log "warning: no PgBouncer in front of PGLEASE_TEST_DSN; $why"
		cleanup
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
PG_PORT=""
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
	# PgBouncer first: its server connections would only hold up the
	# server's shutdown.
	report_pgbouncer_death
	stop_pgbouncer
	PGB_DIR=""
	if [[ -n "$DATA_DIR" && -f "$DATA_DIR/postmaster.pid" ]]; then
		# A fast shutdown waits for every backend to exit; the checkpoint
		# it writes is cheap with fsync off (LOCALPG_DURABLE unset).
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

	trap on_exit EXIT
	trap 'on_signal INT' INT
	trap 'on_signal TERM' TERM
	trap 'on_signal HUP' HUP

	# An existing database: use it as is, behind a PgBouncer of our own when
	# one can be started.
	if [[ -n "${PGLEASE_TEST_DSN:-}" || -n "${DATABASE_URL:-}" ]]; then
		export PGLEASE_TEST_DSN="${PGLEASE_TEST_DSN:-$DATABASE_URL}"
		export DATABASE_URL="${DATABASE_URL:-$PGLEASE_TEST_DSN}"
		start_pgbouncer_external
		if [[ -z "$TMP_ROOT" ]]; then
			# Nothing of ours to stop afterwards.
			trap - EXIT INT TERM HUP
			exec "$@"
		fi
		run_child "$@"
	fi

	start_postgres

	# The PgBouncer of a database given by the caller would stand in front
	# of another server.
	unset PGLEASE_TEST_PGBOUNCER_DSN PGLEASE_TEST_PGBOUNCER_PIDFILE PGLEASE_TEST_PGBOUNCER_LOG
	if [[ -z "$(find_pgbouncer)" ]] && ! is_root; then
		log "warning: no PgBouncer found and not root, cannot install it (Debian, Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer); tests that need PgBouncer (PGLEASE_TEST_PGBOUNCER_DSN) will fail"
	else
		start_pgbouncer 127.0.0.1 "$PG_PORT" postgres "" postgres disable "" "$PG_MAX_CONNECTIONS" ||
			die "PgBouncer did not start"
	fi

	run_child "$@"
}

# Starts the throwaway server in a new TMP_ROOT and exports
# PGLEASE_TEST_DSN, DATABASE_URL and PGLEASE_TEST_RESTART_CMD; sets PG_PORT.
start_postgres() {
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

	local durability=off
	if [[ "${LOCALPG_DURABLE:-}" == 1 ]]; then
		durability=on
	fi

	# Settings common to every attempt; the port goes into an included file
	# so that a retry on another port only rewrites that one.
	cat >>"$DATA_DIR/postgresql.conf" <<EOF

# --- added by localpg.sh (throwaway test server) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$TMP_ROOT'
max_connections = $PG_MAX_CONNECTIONS
fsync = $durability
synchronous_commit = $durability
full_page_writes = $durability
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
	log "PostgreSQL ${version:-?} on 127.0.0.1:$port with fsync $durability (data dir $DATA_DIR, log $logfile)"
	PG_PORT="$port"
}

# Runs "$@" as a child and exits with its status (see on_signal for how
# signals reach it).
run_child() {
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
