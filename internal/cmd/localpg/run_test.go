package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// These tests run the command: they start servers of their own, whatever
// PGLEASE_TEST_DSN says, and need PostgreSQL's programs and PgBouncer.

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// localpgBin builds the command once per test binary.
func localpgBin(t *testing.T) string {
	t.Helper()
	pgtest.SkipShort(t)
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "localpg-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "localpg")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binPath
}

// cleanEnv is the test's environment without a database or PgBouncer.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case envDSN, envDatabaseURL, envRestartCmd, envBouncerDSN, envBouncerPidFile, envBouncerLog, envDurable:
			continue
		}
		env = append(env, kv)
	}
	return env
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var dirsRE = regexp.MustCompile(`(?:data dir|log) (/\S+?)[,)]`)

// assertGone checks that the directories localpg named in its output are
// removed and that the processes of the pid files found there are gone.
func assertGone(t *testing.T, stderr string) {
	t.Helper()
	m := dirsRE.FindAllStringSubmatch(stderr, -1)
	if len(m) == 0 {
		t.Fatalf("localpg named no directory:\n%s", stderr)
	}
	for _, sub := range m {
		// The server's data dir and log are in pgrepl's directory;
		// PgBouncer's log in a directory of its own inside one.
		dir := filepath.Dir(sub[1])
		if filepath.Base(dir) == "pgbouncer" {
			dir = filepath.Dir(dir)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after localpg ended (stat: %v)", dir, err)
		}
	}
}

func TestRunRestartKeepsPgBouncerAndExitsWithTheCommand(t *testing.T) {
	bin := localpgBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	envFile := filepath.Join(t.TempDir(), "env")
	cmd := exec.Command(bin, "run", "--", "sh", "-c", `env > "$1.tmp" && mv "$1.tmp" "$1"; read line; exit 7`, "sh", envFile)
	cmd.Env = cleanEnv()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()

	var env map[string]string
	pgtest.WaitFor(t, time.Minute, "the command to run", func() bool {
		b, err := os.ReadFile(envFile)
		if err != nil {
			return false
		}
		env = map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok {
				env[k] = v
			}
		}
		return true
	})
	for _, k := range []string{envDSN, envDatabaseURL, envRestartCmd, envBouncerDSN, envBouncerPidFile, envBouncerLog} {
		if env[k] == "" {
			t.Fatalf("%s is not set for the command; localpg said:\n%s", k, stderr.String())
		}
	}
	if env[envDSN] != env[envDatabaseURL] {
		t.Errorf("%s = %q, %s = %q, want the same", envDSN, env[envDSN], envDatabaseURL, env[envDatabaseURL])
	}
	direct, err := pgx.Connect(ctx, env[envDSN])
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	for setting, want := range map[string]string{"fsync": "off", "synchronous_commit": "off", "max_connections": "400"} {
		var got string
		if err := direct.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil || got != want {
			t.Errorf("%s = %q, %v, want %q", setting, got, err, want)
		}
	}
	var before time.Time
	if err := direct.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	bouncer, err := pgx.Connect(ctx, env[envBouncerDSN]+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	defer bouncer.Close(ctx)
	if _, err := bouncer.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	restart := strings.Fields(env[envRestartCmd])
	if out, err := exec.CommandContext(ctx, restart[0], restart[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", env[envRestartCmd], err, out)
	}
	// The restart command returns once the server accepts connections.
	after, err := pgx.Connect(ctx, env[envDSN])
	if err != nil {
		t.Fatalf("connect right after the restart command: %v", err)
	}
	defer after.Close(ctx)
	var started time.Time
	if err := after.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil || !started.After(before) {
		t.Fatalf("pg_postmaster_start_time() = %v, %v after the restart, want later than %v", started, err, before)
	}
	// PgBouncer kept running and its client stays connected.
	pgtest.WaitFor(t, 30*time.Second, "PgBouncer to serve its client again", func() bool {
		_, err := bouncer.Exec(ctx, "SELECT 1")
		return err == nil
	})
	if out, err := exec.Command(bin, "restart", "/nonexistent/data").CombinedOutput(); err == nil {
		t.Errorf("restart of a data directory that is not there succeeded: %s", out)
	}

	_, _ = io.WriteString(stdin, "done\n")
	err = cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 7 {
		t.Fatalf("localpg run: %v, want exit status 7 (the command's)\n%s", err, stderr.String())
	}
	assertGone(t, stderr.String())
	if strings.Contains(stderr.String(), "exited before the command ended") {
		t.Errorf("localpg says PgBouncer died:\n%s", stderr.String())
	}
}

// TestRunOnSIGTERM: the signal reaches the command, and everything is
// stopped and removed.
func TestRunOnSIGTERM(t *testing.T) {
	bin := localpgBin(t)
	cmd := exec.Command(bin, "run", "--", "sleep", "120")
	cmd.Env = cleanEnv()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	pgtest.WaitFor(t, time.Minute, "PgBouncer to start", func() bool { return strings.Contains(stderr.String(), "localpg: PgBouncer ") })
	time.Sleep(200 * time.Millisecond) // the command starts
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Fatalf("localpg run after SIGTERM: %v, want exit status 143\n%s", err, stderr.String())
	}
	assertGone(t, stderr.String())
}

// TestRunInFrontOfAGivenDatabase: with PGLEASE_TEST_DSN set, no server is
// started, a PgBouncer of its own stands in front of that one, and when it
// dies before the command ends, localpg says so with its log.
func TestRunInFrontOfAGivenDatabase(t *testing.T) {
	bin := localpgBin(t)
	// The outer run provides the database; the inner one is the test.
	inner := bin + ` run -- sh -c 'test -z "$PGLEASE_TEST_RESTART_CMD" || test "$PGLEASE_TEST_RESTART_CMD" = "$OUTER_RESTART" || exit 9; ` +
		`test "$PGLEASE_TEST_DSN" = "$OUTER_DSN" || exit 10; test "$PGLEASE_TEST_PGBOUNCER_DSN" != "" || exit 11; ` +
		`kill "$(cat "$PGLEASE_TEST_PGBOUNCER_PIDFILE")"; sleep 1; exit 5'`
	cmd := exec.Command(bin, "run", "--", "sh", "-c",
		`OUTER_DSN="$PGLEASE_TEST_DSN" OUTER_RESTART="$PGLEASE_TEST_RESTART_CMD"; export OUTER_DSN OUTER_RESTART; unset PGLEASE_TEST_PGBOUNCER_DSN; `+inner)
	cmd.Env = cleanEnv()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 5 {
		t.Fatalf("localpg run: %v, want exit status 5\n%s", err, stderr.String())
	}
	out := stderr.String()
	if n := strings.Count(out, "localpg: PostgreSQL "); n != 1 {
		t.Errorf("%d servers started, want 1 (the inner run uses the outer's):\n%s", n, out)
	}
	if n := strings.Count(out, "in transaction mode, in front of"); n != 2 {
		t.Errorf("%d PgBouncers started, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "exited before the command ended; the last lines of its log:") || !strings.Contains(out, "got SIGTERM") {
		t.Errorf("localpg does not say that PgBouncer died, with its log:\n%s", out)
	}
	assertGone(t, out)
}
