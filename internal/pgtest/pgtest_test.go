package pgtest_test

import (
	"context"
	"os"
	"os/exec"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Terminate()
	os.Exit(code)
}

func TestRestartCommandFromEnv(t *testing.T) {
	t.Setenv(pgtest.EnvRestartCmd, "  /abs/localpg restart\t/tmp/x/data ")
	want := []string{"/abs/localpg", "restart", "/tmp/x/data"}
	if got := pgtest.RestartCommand(); !reflect.DeepEqual(got, want) {
		t.Fatalf("RestartCommand() = %q, want %q", got, want)
	}
}

func TestConnectAndRestart(t *testing.T) {
	pgtest.SkipShort(t)
	dsn, err := pgtest.DSN()
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	before := startTime(ctx, t, dsn)
	bouncer := pgBouncerConn(ctx, t)

	cmd := pgtest.RestartCommand()
	if cmd == nil {
		t.Logf("no restart command (%s unset and no test container): restart not checked", pgtest.EnvRestartCmd)
		return
	}
	out, err := exec.CommandContext(ctx, cmd[0], cmd[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("restart command %q: %v\n%s", cmd, err, out)
	}

	// The server may take a moment to accept connections again (a container
	// restart returns early); poll until a deadline.
	deadline := time.Now().Add(time.Minute)
	var lastErr error
	for attempt := 0; ; attempt++ {
		after, err := queryStartTime(ctx, dsn)
		if err == nil {
			if !after.After(before) {
				t.Fatalf("pg_postmaster_start_time() = %v after the restart, want later than %v", after, before)
			}
			t.Logf("restarted: postmaster start time %v -> %v (connected on attempt %d)", before, after, attempt+1)
			pgBouncerAfterRestart(ctx, t, bouncer)
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("no connection within a minute after the restart: %v", lastErr)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for the restarted server: %v (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startTime connects to dsn, checks that `select 1` works and returns
// pg_postmaster_start_time().
func startTime(ctx context.Context, t *testing.T, dsn string) time.Time {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	defer conn.Close(ctx)

	var one int
	if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil {
		t.Fatalf("select 1: %v", err)
	}
	if one != 1 {
		t.Fatalf("select 1 returned %d", one)
	}
	var start time.Time
	if err := conn.QueryRow(ctx, "select pg_postmaster_start_time()").Scan(&start); err != nil {
		t.Fatalf("select pg_postmaster_start_time(): %v", err)
	}
	return start
}

func queryStartTime(ctx context.Context, dsn string) (time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, dsn)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close(cctx)
	var start time.Time
	err = conn.QueryRow(cctx, "select pg_postmaster_start_time()").Scan(&start)
	return start, err
}

// pgBouncerConn returns a connection through the PgBouncer of `make
// test`, on which a query ran, closed at the end of the test; nil when
// there is no PgBouncer (TestPgBouncerAlive fails then).
func pgBouncerConn(ctx context.Context, t *testing.T) *pgx.Conn {
	t.Helper()
	dsn, err := pgtest.PgBouncerDSN()
	if err != nil {
		t.Logf("no PgBouncer: not checked across the restart (%v)", err)
		return nil
	}
	conn, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatalf("connect through PgBouncer: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("SELECT 1 through PgBouncer: %v", err)
	}
	return conn
}

// pgBouncerAfterRestart checks that PgBouncer serves again after the
// server restarted, on conn, made before the restart: it drops the server
// connections the restart closed, and its clients stay connected.
func pgBouncerAfterRestart(ctx context.Context, t *testing.T, conn *pgx.Conn) {
	t.Helper()
	if conn == nil {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 1; ; attempt++ {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := conn.Exec(qctx, "SELECT 1")
		cancel()
		if err == nil {
			if err := pgtest.PgBouncerAlive(); err != nil {
				t.Fatal(err)
			}
			t.Logf("PgBouncer served the connection made before the restart on attempt %d", attempt)
			return
		}
		if conn.IsClosed() {
			t.Fatalf("PgBouncer closed a client connection when the server restarted: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("PgBouncer does not serve 30 s after the server restarted: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
