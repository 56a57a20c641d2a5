package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// The environment variables localpg reads and sets (see the package
// documentation; internal/pgtest reads them in the tests).
const (
	envDSN            = "PGLEASE_TEST_DSN"
	envDatabaseURL    = "DATABASE_URL"
	envRestartCmd     = "PGLEASE_TEST_RESTART_CMD"
	envBouncerDSN     = "PGLEASE_TEST_PGBOUNCER_DSN"
	envBouncerPidFile = "PGLEASE_TEST_PGBOUNCER_PIDFILE"
	envBouncerLog     = "PGLEASE_TEST_PGBOUNCER_LOG"
	envDurable        = "LOCALPG_DURABLE"
	envGrace          = "LOCALPG_GRACE_SECONDS"
)

// defaultGrace is how long the command gets to exit after a signal passed
// on to it (LOCALPG_GRACE_SECONDS) before it is killed.
const defaultGrace = 20 * time.Second

// runner is one `localpg run`.
type runner struct {
	args []string
	tmp  string   // a temporary directory of localpg's own, or ""
	srv  *server  // the server it started, or nil
	pgb  *bouncer // the PgBouncer it started, or nil

	cancelSetup context.CancelFunc

	mu        sync.Mutex
	child     *exec.Cmd // the command, while it runs
	childPgid int       // its process group, when it has one of its own
	sig       os.Signal // a signal that came before the command ran
	watchdog  *time.Timer
}

// cmdRun is `localpg run [--] CMD [ARGS...]`.
func cmdRun(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &runner{args: args, cancelSetup: cancel}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go r.onSignals(sigs)
	code := r.run(ctx)
	r.cleanup()
	return code
}

func (r *runner) run(ctx context.Context) int {
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		dsn = os.Getenv(envDatabaseURL)
	}
	if dsn != "" {
		// An existing database: used as it is, behind a PgBouncer of
		// localpg's own when one can be started.
		setenv(envDSN, dsn)
		if os.Getenv(envDatabaseURL) == "" {
			setenv(envDatabaseURL, dsn)
		}
		if os.Getenv(envBouncerDSN) != "" {
			logf("using the PgBouncer of %s as given", envBouncerDSN)
			return r.execInPlace()
		}
		if err := r.startBouncerFor(ctx, dsn); err != nil {
			if code, stop := r.interrupted(); stop {
				return code
			}
			logf("warning: no PgBouncer in front of %s: %v; tests that need PgBouncer (%s) will fail", envDSN, err, envBouncerDSN)
			r.cleanup()
			return r.execInPlace() // nothing of localpg's to stop afterwards
		}
		return r.runChild()
	}

	// The PgBouncer of a database given by the caller would stand in
	// front of another server.
	for _, k := range []string{envBouncerDSN, envBouncerPidFile, envBouncerLog} {
		_ = os.Unsetenv(k)
	}
	if err := r.startOwn(ctx); err != nil {
		if code, stop := r.interrupted(); stop {
			return code
		}
		logf("error: %v", err)
		return 1
	}
	return r.runChild()
}

// startOwn starts the throwaway server and a PgBouncer in front of it,
// and sets the environment of the command.
func (r *runner) startOwn(ctx context.Context) error {
	acct, err := serverAccount()
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the path of localpg, for %s: %w", envRestartCmd, err)
	}
	durable := os.Getenv(envDurable) == "1"
	if r.srv, err = startServer(ctx, durable); err != nil {
		return fmt.Errorf("PostgreSQL did not start: %w", err)
	}
	setenv(envDSN, r.srv.dsn())
	setenv(envDatabaseURL, r.srv.dsn())
	// internal/pgtest splits the command on white space.
	restart := exe + " restart " + r.srv.dataDir()
	if strings.ContainsAny(restart, "\t\n") || strings.Count(restart, " ") != 2 {
		logf("warning: the path of localpg or of the data directory has white space: %s will not work", envRestartCmd)
	}
	setenv(envRestartCmd, restart)
	fsync := "off"
	if durable {
		fsync = "on"
	}
	logf("PostgreSQL %s on 127.0.0.1:%d with fsync %s (data dir %s, log %s)",
		r.srv.version(ctx), r.srv.port(), fsync, r.srv.dataDir(), r.srv.logPath())

	bin := findPgBouncer()
	if bin == "" {
		logf("warning: no PgBouncer found (scripts/install-deps.sh pgbouncer installs it; macOS: brew install pgbouncer); "+
			"tests that need PgBouncer (%s) will fail", envBouncerDSN)
		return nil
	}
	t := target{Host: "127.0.0.1", Port: uint16(r.srv.port()), User: "postgres", Database: "postgres", SSLMode: "disable"}
	return r.startBouncer(ctx, bin, filepath.Join(r.srv.cluster.Dir(), "pgbouncer"), t, maxConnections, acct)
}

// startBouncerFor starts a PgBouncer in front of the existing database of
// dsn, its files in a temporary directory of localpg's own.
func (r *runner) startBouncerFor(ctx context.Context, dsn string) error {
	t, err := targetOf(dsn)
	if err != nil {
		return err
	}
	bin := findPgBouncer()
	if bin == "" {
		return errors.New("no PgBouncer found (scripts/install-deps.sh pgbouncer installs it; macOS: brew install pgbouncer)")
	}
	acct, err := serverAccount()
	if err != nil {
		return err
	}
	// The server user must reach the directory: under root, a TMPDIR in
	// /root would not do.
	parent := os.TempDir()
	if acct.cred != nil {
		parent = "/tmp"
	}
	if r.tmp, err = os.MkdirTemp(parent, "localpg-"); err != nil {
		return err
	}
	if err := os.Chmod(r.tmp, 0o755); err != nil {
		return err
	}
	if err := acct.chown(r.tmp); err != nil {
		return err
	}
	return r.startBouncer(ctx, bin, filepath.Join(r.tmp, "pgbouncer"), t, serverMaxConns(ctx, dsn), acct)
}

func (r *runner) startBouncer(ctx context.Context, bin, dir string, t target, maxConns int, acct *account) error {
	b, err := startBouncer(ctx, bin, dir, t, maxConns, acct)
	if err != nil {
		return err
	}
	r.pgb = b
	setenv(envBouncerDSN, b.dsn(t.User, t.Database))
	setenv(envBouncerPidFile, b.pidFile())
	setenv(envBouncerLog, b.logFile())
	logf("PgBouncer %s on 127.0.0.1:%d in transaction mode, in front of %s (pool size %d, at most %d clients; log %s)",
		pgbouncerVersion(bin), b.port, net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port))), b.poolSize, b.maxClients, b.logFile())
	return nil
}

// interrupted returns the exit status for a signal that came during the
// set-up, and whether one did.
func (r *runner) interrupted() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sig == nil {
		return 0, false
	}
	return 128 + int(r.sig.(syscall.Signal)), true
}

// execInPlace replaces this process with the command: localpg has nothing
// to stop afterwards.
func (r *runner) execInPlace() int {
	if code, stop := r.interrupted(); stop {
		return code
	}
	path, err := exec.LookPath(r.args[0])
	if err != nil {
		logf("%v", err)
		return 127
	}
	signal.Reset()
	err = syscall.Exec(path, r.args, os.Environ())
	logf("exec %s: %v", path, err)
	return 126
}

// runChild runs the command and returns its exit status: its exit code,
// or 128+N when signal N ended it, as a shell reports it.
//
// At a terminal the command stays in localpg's process group, so that it
// keeps the terminal (an interactive shell needs it) and a Ctrl-C reaches
// it directly. Otherwise it gets a session and process group of its own,
// so that a signal passed on reaches all its processes (e.g. the test
// binaries under `go test`), and what it leaves running is stopped at the
// end.
func (r *runner) runChild() int {
	cmd := exec.Command(r.args[0], r.args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	ownGroup := !isTerminal(os.Stdin)
	if ownGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	r.mu.Lock()
	if r.sig != nil {
		r.mu.Unlock()
		code, _ := r.interrupted()
		return code
	}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		logf("%v", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	r.child = cmd
	if ownGroup {
		r.childPgid = cmd.Process.Pid
	}
	r.mu.Unlock()

	_ = cmd.Wait()
	r.mu.Lock()
	r.child = nil
	r.mu.Unlock()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

// onSignals passes SIGINT, SIGTERM and SIGHUP on to the command, and
// makes sure that it ends: unless it is a Ctrl-C at a terminal, which the
// command may rightly ignore (an interactive shell does), the command is
// killed when it still runs LOCALPG_GRACE_SECONDS later. Before the
// command runs, a signal stops the set-up.
func (r *runner) onSignals(sigs <-chan os.Signal) {
	for sig := range sigs {
		r.mu.Lock()
		if r.child == nil {
			if r.sig == nil {
				r.sig = sig
			}
			r.cancelSetup()
			r.mu.Unlock()
			continue
		}
		r.signalChildLocked(sig.(syscall.Signal))
		if sig != syscall.SIGINT || !isTerminal(os.Stdin) {
			r.armWatchdogLocked()
		}
		r.mu.Unlock()
	}
}

// signalChildLocked sends sig to the command's process group when it has
// one of its own, else to the command alone.
func (r *runner) signalChildLocked(sig syscall.Signal) {
	if r.childPgid != 0 && syscall.Kill(-r.childPgid, sig) == nil {
		return
	}
	if r.child != nil {
		_ = r.child.Process.Signal(sig)
	}
}

func (r *runner) armWatchdogLocked() {
	if r.watchdog != nil {
		return
	}
	grace := defaultGrace
	if s, err := strconv.Atoi(os.Getenv(envGrace)); err == nil && s >= 0 {
		grace = time.Duration(s) * time.Second
	}
	pid := r.child.Process.Pid
	r.watchdog = time.AfterFunc(grace, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.child == nil {
			return
		}
		logf("command (pid %d) still running %s after the signal; killing it", pid, grace)
		r.signalChildLocked(syscall.SIGKILL)
	})
}

// cleanup stops what the command left running in its own process group,
// PgBouncer (first: its server connections would only hold up the
// server's shutdown) and the server, and removes their files. It may be
// called more than once.
func (r *runner) cleanup() {
	r.mu.Lock()
	if r.watchdog != nil {
		r.watchdog.Stop()
	}
	pgid := r.childPgid
	r.childPgid = 0
	r.mu.Unlock()
	if pgid != 0 {
		// It would only talk to a database that is about to go away.
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
	}
	if r.pgb != nil {
		r.pgb.reportDeath()
		r.pgb.stop()
		r.pgb = nil
	}
	if r.srv != nil {
		if err := r.srv.close(); err != nil {
			logf("stopping PostgreSQL: %v", err)
		}
		r.srv = nil
	}
	if r.tmp != "" {
		if err := os.RemoveAll(r.tmp); err != nil {
			logf("%v", err)
		}
		r.tmp = ""
	}
}

func setenv(k, v string) {
	if err := os.Setenv(k, v); err != nil {
		logf("setenv %s: %v", k, err)
	}
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}
