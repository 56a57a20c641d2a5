package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvKeepSchema names the environment variable that, when set, keeps the
// schemas of [NewSchema] after the test (their names are logged).
const EnvKeepSchema = "PGLEASE_TEST_KEEP_SCHEMA"

// ShortSkipMessage is why a test that needs PostgreSQL skips under -short.
const ShortSkipMessage = "needs PostgreSQL: skipped under -short; `make test` runs it (or go test without -short, with " + EnvDSN + " set)"

// Main is the TestMain of a package whose tests use PostgreSQL; it returns
// the exit code for os.Exit. Under -short it looks for no database and
// runs the tests, those that need one skipping through [SkipShort].
// Otherwise it finds a database with [DSN], passes its URL to use and runs
// the tests; without one it prints why, naming `make test`, and returns 1:
// the tests fail, they do not skip. It calls [Terminate] at the end. name
// prefixes the message (the package's name).
func Main(m *testing.M, name string, use func(dsn string)) int {
	flag.Parse()
	if !testing.Short() {
		dsn, err := DSN()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s tests: %v\n", name, err)
			return 1
		}
		use(dsn)
	}
	code := m.Run()
	Terminate()
	return code
}

// SkipShort skips t under -short with [ShortSkipMessage]. Every test that
// needs PostgreSQL calls it first, directly or through a helper of this
// package.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip(ShortSkipMessage)
	}
}

// NewPool returns a pool on dsn with at most maxConns connections (0:
// pgxpool's default), closed at the end of the test. It skips under
// -short.
func NewPool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	SkipShort(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse the test database's URL: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool on the test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewSchema returns the name of a PostgreSQL schema of the test's own,
// prefix followed by random hex, dropped with everything in it at the end
// of the test (unless PGLEASE_TEST_KEEP_SCHEMA is set). It does not create
// it: the caller does, or pglease's schema set-up.
func NewSchema(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	name := prefix + RandomHex(6)
	t.Cleanup(func() {
		if os.Getenv(EnvKeepSchema) != "" {
			t.Logf("kept schema %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// WaitFor checks cond every few milliseconds until it holds, and fails
// the test, saying what it waited for, when timeout passes first.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// DedicatedConn returns a connection of pool held for the whole test.
func DedicatedConn(t *testing.T, pool *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatalf("acquire a connection: %v", err)
	}
	t.Cleanup(conn.Release)
	return conn
}

// WaitBlockedOnLock waits until the backend pid waits for a lock, or fails
// the test; done, when closed first, means the statement finished instead.
func WaitBlockedOnLock(t *testing.T, pool *pgxpool.Pool, pid uint32, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			return false
		default:
		}
		var waiting bool
		if err := pool.QueryRow(context.Background(),
			`SELECT COALESCE(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
			t.Fatalf("read the wait of backend %d: %v", pid, err)
		}
		if waiting {
			return true
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d neither finished nor waited for a lock within 10s", pid)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
