package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvPgBouncerDSN names the environment variable that holds the URL of the
// database of [EnvDSN], with the same user, through a PgBouncer in
// transaction mode (sslmode=disable). localpg (internal/cmd/localpg) sets it.
const EnvPgBouncerDSN = "PGLEASE_TEST_PGBOUNCER_DSN"

// EnvPgBouncerPidFile names the environment variable that holds the path
// of the pid file of the PgBouncer behind [EnvPgBouncerDSN].
const EnvPgBouncerPidFile = "PGLEASE_TEST_PGBOUNCER_PIDFILE"

// EnvPgBouncerLog names the environment variable that holds the path of
// the log file of the PgBouncer behind [EnvPgBouncerDSN].
const EnvPgBouncerLog = "PGLEASE_TEST_PGBOUNCER_LOG"

const (
	// aliveQueryTimeout bounds the connection and query of PgBouncerAlive.
	aliveQueryTimeout = 10 * time.Second
	// logTailLines is how much of PgBouncer's log an error quotes.
	logTailLines = 20
)

// PgBouncerDSN returns the URL of the test database through a PgBouncer in
// transaction mode: the value of PGLEASE_TEST_PGBOUNCER_DSN, or an error
// that says to run the tests through `make test` (localpg, internal/cmd/localpg),
// which starts one. Callers fail the test on that error; they do not skip.
//
// The URL has no pgx settings: add default_query_exec_mode=exec (or
// simple_protocol) for pgx, since PgBouncer 1.18 in transaction mode does
// not keep named prepared statements. It is safe for concurrent use.
func PgBouncerDSN() (string, error) {
	if dsn := os.Getenv(EnvPgBouncerDSN); dsn != "" {
		return dsn, nil
	}
	return "", fmt.Errorf("pgtest: no PgBouncer for tests: %s is not set; run the tests "+
		"through `make test` (or `go run ./internal/cmd/localpg run -- go test ...`), which starts a "+
		"PgBouncer in transaction mode in front of the test PostgreSQL "+
		"(if it could not, its output says why)", EnvPgBouncerDSN)
}

// PgBouncerAlive returns nil when the PgBouncer of [PgBouncerDSN] still
// runs and answers: the process of PGLEASE_TEST_PGBOUNCER_PIDFILE exists,
// and `SELECT 1` through the DSN succeeds within 10 s. When the pid file
// variable is not set (a PgBouncer of the caller's own) only the query is
// checked. An error quotes the end of PGLEASE_TEST_PGBOUNCER_LOG, where a
// crash shows as a FATAL line. It is safe for concurrent use.
func PgBouncerAlive() error {
	dsn, err := PgBouncerDSN()
	if err != nil {
		return err
	}
	if pidFile := os.Getenv(EnvPgBouncerPidFile); pidFile != "" {
		if err := processAlive(pidFile); err != nil {
			return fmt.Errorf("pgtest: PgBouncer is not running: %w%s", err, logTail())
		}
	}
	if err := selectOne(dsn); err != nil {
		return fmt.Errorf("pgtest: no answer through PgBouncer (%s): %w%s", EnvPgBouncerDSN, err, logTail())
	}
	return nil
}

// processAlive reads a pid file and checks that its process exists. A
// process of another user counts as existing.
func processAlive(pidFile string) error {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		// PgBouncer removes its pid file when it shuts down.
		return fmt.Errorf("read pid file: %w", err)
	}
	field, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(field))
	if err != nil || pid <= 0 {
		return fmt.Errorf("pid file %s holds no process id: %q", pidFile, b)
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return fmt.Errorf("process %d of pid file %s: %w", pid, pidFile, err)
	}
	if err := p.Signal(syscall.Signal(0)); err != nil && !errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("process %d of pid file %s: %w", pid, pidFile, err)
	}
	return nil
}

// selectOne runs SELECT 1 on a connection of its own to dsn, with the
// simple protocol (no prepared statement for the pooler to lose).
func selectOne(dsn string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	ctx, cancel := context.WithTimeout(context.Background(), aliveQueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return err
	}
	if one != 1 {
		return fmt.Errorf("SELECT 1 returned %d", one)
	}
	return nil
}

// logTail returns the last lines of PgBouncer's log, ready to append to an
// error message, or "" when there is no log to read.
func logTail() string {
	path := os.Getenv(EnvPgBouncerLog)
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf(" (log %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return fmt.Sprintf("; the end of its log (%s):\n%s", path, bytes.Join(lines, []byte("\n")))
}
