package pgrepl_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// start starts a cluster and closes it at the end of the test.
func start(t *testing.T, opts pgrepl.Options) *pgrepl.Cluster {
	t.Helper()
	pgtest.SkipShort(t) // runs PostgreSQL's programs
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgrepl.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func connect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func exec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// ids returns the ids of table t, in order.
func ids(ctx context.Context, t *testing.T, dsn string) []int {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", dsn, err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id FROM t ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// serverPort returns the port of the server a connection reached.
func serverPort(ctx context.Context, t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var port int
	if err := conn.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port); err != nil {
		t.Fatal(err)
	}
	return port
}

// assertGone checks that no process of either server is left and that the
// cluster's directory is removed.
func assertGone(t *testing.T, c *pgrepl.Cluster) {
	t.Helper()
	for _, n := range []*pgrepl.Node{c.Primary, c.Standby} {
		pids, err := n.Processes()
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) > 0 {
			t.Errorf("%s: processes %v still running", n.Name(), pids)
		}
		if n.Running() {
			t.Errorf("%s: still running", n.Name())
		}
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there (stat: %v)", c.Dir(), err)
	}
}

// TestAsynchronousFailoverLosesWhatTheStandbyDidNotReceive walks through
// what the failover tests do: a paused replay hides writes from the
// standby's readers but a promotion applies them; a paused stream loses
// them; after the promotion, clients of MultiHostDSN write on the standby.
func TestAsynchronousFailoverLosesWhatTheStandbyDidNotReceive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := start(t, pgrepl.Options{})

	multi := connect(ctx, t, c.MultiHostDSN())
	if got := serverPort(ctx, t, multi); got != c.Primary.Port() {
		t.Fatalf("MultiHostDSN reached port %d, want the primary's %d", got, c.Primary.Port())
	}
	primary := connect(ctx, t, c.Primary.DSN())
	exec(ctx, t, primary, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(ctx, t, primary, "INSERT INTO t VALUES (1)")
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ids(ctx, t, c.Standby.DSN()); !equal(got, []int{1}) {
		t.Fatalf("standby sees %v, want [1]", got)
	}

	// Replay paused: the standby receives row 2 but its readers do not
	// see it.
	if err := c.Standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	exec(ctx, t, primary, "INSERT INTO t VALUES (2)")
	lsn2, err := c.Primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the standby to receive row 2", func() bool {
		got, err := c.Standby.ReceiveLSN(ctx)
		return err == nil && got >= lsn2
	})
	if got := ids(ctx, t, c.Standby.DSN()); !equal(got, []int{1}) {
		t.Fatalf("standby with replay paused sees %v, want [1]", got)
	}

	// Streaming paused: row 3 never reaches the standby.
	if err := c.Standby.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	received, err := c.Standby.ReceiveLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(ctx, t, primary, "INSERT INTO t VALUES (3)")
	lsn3, err := c.Primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if received >= lsn3 {
		t.Fatalf("standby received up to %s, past row 3 at %s", received, lsn3)
	}

	began := time.Now()
	if err := c.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("primary killed in %s", time.Since(began).Round(time.Millisecond))
	if pids, err := c.Primary.Processes(); err != nil || len(pids) > 0 {
		t.Fatalf("primary's processes after Kill: %v, %v", pids, err)
	}
	if err := c.Primary.Kill(); err != nil {
		t.Fatalf("Kill again: %v", err)
	}
	// As after a crash of the machine, the server said nothing more: no
	// "terminating connection due to unexpected postmaster exit".
	_, err = primary.Exec(ctx, "SELECT 1")
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		t.Fatalf("a query on a connection to the killed primary: %v, want a network error", err)
	}
	t.Logf("a query on a connection to the killed primary: %v", err)

	if err := c.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// The promotion replayed row 2, received while replay was paused;
	// row 3 is lost.
	if got := ids(ctx, t, c.Standby.DSN()); !equal(got, []int{1, 2}) {
		t.Fatalf("promoted standby has %v, want [1 2]", got)
	}

	// A client of MultiHostDSN finds the promoted standby.
	multi2 := connect(ctx, t, c.MultiHostDSN())
	if got := serverPort(ctx, t, multi2); got != c.Standby.Port() {
		t.Fatalf("MultiHostDSN reached port %d after the failover, want the promoted standby's %d", got, c.Standby.Port())
	}
	exec(ctx, t, multi2, "INSERT INTO t VALUES (4)")
	if got := ids(ctx, t, c.MultiHostDSN()); !equal(got, []int{1, 2, 4}) {
		t.Fatalf("after the failover: %v, want [1 2 4]", got)
	}

	began = time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed in %s", time.Since(began).Round(time.Millisecond))
	assertGone(t, c)
	if err := c.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
}

// TestSynchronousFailoverKeepsEveryCommit: with a synchronous standby a
// commit returns once the standby has it, so the promoted standby has
// every committed row.
func TestSynchronousFailoverKeepsEveryCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := start(t, pgrepl.Options{Synchronous: true, StandbyName: "sync_one"})

	primary := connect(ctx, t, c.Primary.DSN())
	var names string
	if err := primary.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names); err != nil || names != "sync_one" {
		t.Fatalf("primary's synchronous_standby_names = %q, %v, want sync_one", names, err)
	}
	exec(ctx, t, primary, "CREATE TABLE t (id int PRIMARY KEY)")
	for i := 1; i <= 20; i++ {
		exec(ctx, t, primary, "INSERT INTO t VALUES ($1)", i)
	}
	want := make([]int, 0, 21)
	for i := 1; i <= 20; i++ {
		want = append(want, i)
	}
	// Flushed on the standby at each commit, applied a moment later.
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ids(ctx, t, c.Standby.DSN()); !equal(got, want) {
		t.Fatalf("standby sees %v, want %v", got, want)
	}

	// A transaction id the primary hands out without writing WAL (here
	// to a read-only transaction) never reaches the standby.
	var lastXid, promotedXid int64
	if err := primary.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&lastXid); err != nil {
		t.Fatal(err)
	}

	if err := c.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	multi := connect(ctx, t, c.MultiHostDSN())
	if err := multi.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&promotedXid); err != nil {
		t.Fatal(err)
	}
	t.Logf("last transaction id handed out by the old primary %d, first one by the promoted standby %d", lastXid, promotedXid)
	// The promoted standby has no synchronous standby of its own to wait
	// for: this commit returns.
	exec(ctx, t, multi, "INSERT INTO t VALUES (21)")
	want = append(want, 21)
	if got := ids(ctx, t, c.MultiHostDSN()); !equal(got, want) {
		t.Fatalf("after the failover: %v, want %v", got, want)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, c)
}

// TestStopAndResumeStreaming: a standby whose streaming resumes catches up
// with what the primary wrote meanwhile.
func TestResumeStreamingCatchesUp(t *testing.T) {
	// Covered by a cluster of its own only if the others pass; it is
	// cheap next to them.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := start(t, pgrepl.Options{})
	primary := connect(ctx, t, c.Primary.DSN())
	exec(ctx, t, primary, "CREATE TABLE t (id int PRIMARY KEY)")
	if err := c.Standby.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	exec(ctx, t, primary, "INSERT INTO t VALUES (1)")
	if err := c.Standby.ResumeStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ids(ctx, t, c.Standby.DSN()); !equal(got, []int{1}) {
		t.Fatalf("standby sees %v after resuming, want [1]", got)
	}
	// Stopping a standby and then the whole cluster is fine.
	if err := c.Standby.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Standby.Stop(); err != nil {
		t.Fatalf("Stop again: %v", err)
	}
}

func TestParseLSN(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want pgrepl.LSN
		ok   bool
	}{
		{"0/0", 0, true},
		{"0/3000148", 0x3000148, true},
		{"16/B374D848", 0x16_B374D848, true},
		{"FFFFFFFF/FFFFFFFF", ^pgrepl.LSN(0), true},
		{"", 0, false},
		{"3000148", 0, false},
		{"1/2/3", 0, false},
		{"100000000/0", 0, false},
		{"x/0", 0, false},
	} {
		got, err := pgrepl.ParseLSN(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseLSN(%q) = %v, %v; want %v, ok %t", tc.in, got, err, tc.want, tc.ok)
			continue
		}
		if tc.ok && got.String() != tc.in {
			t.Errorf("ParseLSN(%q).String() = %q", tc.in, got.String())
		}
	}
}

// TestSingleServerRestartsOnItsPort: StartSingle starts one server with
// the given settings and no standby; Restart brings it back on the same
// port, as a new postmaster, with what was committed; Close leaves nothing.
func TestSingleServerRestartsOnItsPort(t *testing.T) {
	pgtest.SkipShort(t) // runs PostgreSQL's programs
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgrepl.StartSingle(ctx, pgrepl.Options{Logf: t.Logf, Settings: map[string]string{"max_connections": "42"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if c.Standby != nil {
		t.Fatalf("Standby = %v, want nil", c.Standby)
	}
	if err := c.WaitStreaming(ctx); err == nil {
		t.Fatal("WaitStreaming without a standby = nil, want an error")
	}
	conn := connect(ctx, t, c.Primary.DSN())
	var maxConns string
	if err := conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil || maxConns != "42" {
		t.Fatalf("max_connections = %q, %v, want 42 (Options.Settings)", maxConns, err)
	}
	exec(ctx, t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(ctx, t, conn, "INSERT INTO t VALUES (1)")
	var before time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	port := c.Primary.Port()

	if err := c.Primary.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.Primary.Port(); got != port {
		t.Fatalf("port after Restart = %d, want %d", got, port)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection from before the restart still works, want it closed")
	}
	after := connect(ctx, t, c.Primary.DSN())
	var started time.Time
	if err := after.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil {
		t.Fatal(err)
	}
	if !started.After(before) {
		t.Fatalf("postmaster start time %v after Restart, want later than %v", started, before)
	}
	if got := ids(ctx, t, c.Primary.DSN()); !equal(got, []int{1}) {
		t.Fatalf("after Restart: %v, want [1]", got)
	}
	if log := c.Primary.Log(1000); !strings.Contains(log, "received fast shutdown request") {
		t.Errorf("the log after Restart lost what came before it:\n%s", log)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if pids, err := c.Primary.Processes(); err != nil || len(pids) > 0 {
		t.Errorf("processes after Close: %v, %v", pids, err)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there (stat: %v)", c.Dir(), err)
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	for _, opts := range []pgrepl.Options{
		{Timeout: -time.Second},
		{StandbyName: "it's"},
		{Bindir: "/nonexistent"},
	} {
		if c, err := pgrepl.Start(ctx, opts); err == nil {
			_ = c.Close()
			t.Errorf("Start(%+v) = nil error", opts)
		}
	}
	if c, err := pgrepl.StartSingle(ctx, pgrepl.Options{Synchronous: true}); err == nil {
		_ = c.Close()
		t.Error("StartSingle(Synchronous) = nil error")
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFindBindirTakesTheEnvironmentsChoice: $PGLEASE_PG_BINDIR wins over
// pg_config and Debian's directories, is resolved through symbolic links,
// and a directory without the server programs is an error, not a silent
// fallback to another version.
func TestFindBindirTakesTheEnvironmentsChoice(t *testing.T) {
	t.Setenv(pgrepl.EnvBindir, "")
	found, err := pgrepl.FindBindir()
	if err != nil {
		t.Skipf("no PostgreSQL server programs on this machine: %v", err)
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "fake", "bin")
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"initdb", "pg_ctl", "postgres", "pg_basebackup"} {
		if err := os.WriteFile(filepath.Join(fake, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "fake"), link); err != nil {
		t.Fatal(err)
	}
	t.Setenv(pgrepl.EnvBindir, filepath.Join(link, "bin"))
	got, err := pgrepl.FindBindir()
	if err != nil || got != fake {
		t.Errorf("FindBindir with %s=%s = %q, %v; want %q (the link resolved)", pgrepl.EnvBindir, filepath.Join(link, "bin"), got, err, fake)
	}
	if got == found {
		t.Errorf("FindBindir ignored %s and found %s", pgrepl.EnvBindir, found)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(pgrepl.EnvBindir, empty)
	if got, err := pgrepl.FindBindir(); !errors.Is(err, pgrepl.ErrNoServer) || !strings.Contains(err.Error(), empty) {
		t.Errorf("FindBindir with %s=%s (no programs) = %q, %v; want ErrNoServer naming the directory", pgrepl.EnvBindir, empty, got, err)
	}
}
