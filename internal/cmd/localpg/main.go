// Command localpg runs a command against a throwaway local PostgreSQL with
// a PgBouncer in transaction mode in front of it: the database of `make
// test`, `make demo` and the other make targets that need one.
//
// Usage:
//
//	go run ./internal/cmd/localpg run [--] CMD [ARGS...]
//	go run ./internal/cmd/localpg restart DATADIR
//
// run starts a PostgreSQL server that lives only as long as CMD (initdb in
// a temporary directory, 127.0.0.1 on a free port, trust authentication
// for the user postgres; see internal/pgrepl, whose single-server mode it
// is), a PgBouncer in transaction mode in front of it, and runs CMD with:
//
//	PGLEASE_TEST_DSN, DATABASE_URL  the server's URL (database and user postgres)
//	PGLEASE_TEST_RESTART_CMD        a command that restarts that server (below)
//	PGLEASE_TEST_PGBOUNCER_DSN      the same database and user through PgBouncer (sslmode=disable)
//	PGLEASE_TEST_PGBOUNCER_PIDFILE  PgBouncer's pid file
//	PGLEASE_TEST_PGBOUNCER_LOG      PgBouncer's log
//
// When CMD ends, fails, or localpg gets SIGINT, SIGTERM or SIGHUP (which
// it passes on to CMD, killing it LOCALPG_GRACE_SECONDS later, default
// 20, when it is still there), PgBouncer and the server are stopped and
// their files removed; localpg exits with CMD's exit status (128+N when
// signal N ended CMD). When PgBouncer did not live as long as CMD, the last
// lines of its log are printed (a crash shows there as a FATAL line).
//
// The server runs with fsync, synchronous_commit and full_page_writes off,
// which makes tests fast and loses nothing a throwaway server needs; with
// LOCALPG_DURABLE=1 they are on, as `make bench` wants for comparing
// pglease with brokers that fsync.
//
// When PGLEASE_TEST_DSN (or, failing that, DATABASE_URL) is set, no server
// is started: both variables name that database, and a PgBouncer is put
// in front of it when one can be (it logs in with the user and password of
// that URL); with PGLEASE_TEST_PGBOUNCER_DSN set too, none is, and CMD
// runs as it is. PGLEASE_TEST_RESTART_CMD is then left as it is.
//
// restart restarts the server of DATADIR, started by a `localpg run` that
// still runs, on the same port with the same settings, and returns once it
// accepts connections again: it is what PGLEASE_TEST_RESTART_CMD runs.
// PgBouncer keeps running and its clients stay connected: it drops the
// server connections the restart closed and opens new ones.
//
// localpg installs nothing: scripts/install-deps.sh installs PostgreSQL
// and PgBouncer (`make test` runs it when one is missing). Without
// PgBouncer, localpg says so and runs CMD without one (the tests that need
// it fail, saying why). PostgreSQL and PgBouncer refuse to run as root: as
// root, both run as the system user postgres.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: localpg run [--] CMD [ARGS...]
       localpg restart DATADIR

run:     runs CMD against a throwaway PostgreSQL with a PgBouncer in front of it
restart: restarts the server of DATADIR (what PGLEASE_TEST_RESTART_CMD runs)
`

func main() {
	os.Exit(mainCode(os.Args[1:]))
}

func mainCode(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:])
	case "restart":
		return cmdRestart(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return 0
	default:
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
}

// logf writes one line to stderr, prefixed with the program's name.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "localpg: "+format+"\n", args...)
}
