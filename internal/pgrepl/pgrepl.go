// Package pgrepl starts throwaway PostgreSQL servers: a primary and a
// streaming-replication standby for tests of what happens across a
// failover, or a single server ([StartSingle]) for the local test database
// of internal/cmd/localpg.
//
// It is meant for tests and development tools only. [Start] runs initdb for a primary, starts
// it, copies it with pg_basebackup (-R -X stream, through a physical
// replication slot so that the standby never misses WAL), starts the copy
// as a hot standby and waits until the primary shows it streaming (and,
// with [Options.Synchronous], as its synchronous standby). A test then
// writes, makes the standby lag ([Node.PauseStreaming]), crashes the
// primary ([Node.Kill]), promotes the standby ([Node.Promote]) and checks
// what its clients, connected through [Cluster.MultiHostDSN], see.
// [Cluster.Close] stops both servers and removes their files.
//
// [StartSingle] runs initdb and starts the primary only: a cluster of one
// server, [Cluster.Standby] nil, which [Node.Restart] restarts on the same
// port (what a test of reconnection wants) and [Options.Settings] tunes.
//
// Both servers listen on 127.0.0.1 only, on free ports, with trust
// authentication for the user postgres; their files live in a temporary
// directory of their own. The server programs are those of
// $PGLEASE_PG_BINDIR when set (the Makefile's PG=17 sets it), else of
// `pg_config --bindir`, else of the newest /usr/lib/postgresql/*/bin
// (Debian's layout), else of initdb on PATH. PostgreSQL refuses to run as root: when
// the test process is root, every server program runs as the system user
// postgres (the process's credentials are set as `runuser -u postgres`
// would). The postmasters are children of the test process, killed by the
// kernel if it dies (a test binary that panics leaves no server behind,
// though its temporary directory stays).
//
// How a standby lags, and what a promotion keeps: a standby receives WAL
// (walreceiver) and replays it (startup process). [Node.PauseReplay] stops
// the replay only: the standby's readers stop seeing new commits, but WAL
// keeps arriving, and a promotion replays everything received before it
// ends recovery, so nothing is lost. [Node.PauseStreaming] stops the
// receiving: what the primary commits from then on never reaches the
// standby, and is lost when the standby is promoted after the primary
// crashed. That is how an asynchronous standby that lagged behind looks
// after a failover.
package pgrepl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoServer is returned by [Start], [StartSingle] and [FindBindir] when
// no PostgreSQL server programs (initdb, pg_ctl, postgres, pg_basebackup)
// are found.
var ErrNoServer = errors.New("pgrepl: no PostgreSQL server programs found (initdb, pg_ctl, postgres, pg_basebackup): " +
	"install PostgreSQL (scripts/install-deps.sh postgresql does, on Debian and Ubuntu; `make test` runs it when needed)")

// errNoStandby is what the methods about replication return in a cluster
// of [StartSingle].
var errNoStandby = errors.New("pgrepl: the cluster has no standby (StartSingle)")

const (
	// DefaultStandbyName is the standby's application_name when
	// [Options.StandbyName] is empty.
	DefaultStandbyName = "standby"
	// DefaultTimeout bounds each step when [Options.Timeout] is 0.
	DefaultTimeout = time.Minute

	// slotName is the physical replication slot the standby streams from.
	slotName = "pgrepl_standby"
	// superuser is the database superuser initdb creates, and the system
	// user the servers run as when the test runs as root.
	superuser = "postgres"

	// pollInterval is how often a wait checks its condition.
	pollInterval = 20 * time.Millisecond
	// connectTimeout bounds each connection of the helpers.
	connectTimeout = 5 * time.Second
	// portAttempts is how many ports a server is tried on before Start
	// gives up (another process may take a free port first).
	portAttempts = 5
	// fastStopWait and immediateStopWait bound the shutdown modes of Stop
	// before it tries the next one.
	fastStopWait      = 30 * time.Second
	immediateStopWait = 10 * time.Second
	// killWait bounds how long Kill and Stop wait for the processes of a
	// server to go after SIGKILL.
	killWait = 10 * time.Second
	// walReceiverGoneFor is how long PauseStreaming sees no walreceiver
	// before it returns: five times wal_retrieve_retry_interval.
	walReceiverGoneFor = time.Second
	// logTailLines is how much of a server's log an error quotes.
	logTailLines = 25
)

// Options configures [Start]. The zero value is an asynchronous standby.
type Options struct {
	// Synchronous makes the standby the primary's synchronous standby:
	// synchronous_standby_names is its application_name and
	// synchronous_commit is on, so a commit returns once the standby has
	// flushed its WAL. Only the primary has the setting: a promoted
	// standby commits without waiting (it has no standby of its own).
	// Default false (asynchronous).
	Synchronous bool

	// StandbyName is the standby's application_name, in its
	// primary_conninfo and in the primary's pg_stat_replication. Default
	// [DefaultStandbyName].
	StandbyName string

	// Timeout bounds each step of Start and each wait of the methods that
	// take a context (the context may end them sooner). Default
	// [DefaultTimeout].
	Timeout time.Duration

	// Settings are more server settings, appended to the postgresql.conf
	// of both servers (the standby's is a copy of the primary's), e.g.
	// {"wal_sender_timeout": "5s"}, after pgrepl's own, which they
	// override (the last setting of a name wins). Values are quoted.
	Settings map[string]string

	// Bindir is the directory of the server programs. Default
	// [FindBindir]'s.
	Bindir string

	// Logf, when set, receives a line for each step with how long it took
	// (pass t.Logf).
	Logf func(format string, args ...any)
}

// Cluster is a primary and a streaming standby started by [Start]. Its
// methods are safe for concurrent use.
type Cluster struct {
	// Primary is the server that was the primary at Start.
	Primary *Node
	// Standby is the server that was the standby at Start; after
	// [Node.Promote] it is the primary. Nil in a cluster of [StartSingle].
	Standby *Node

	opts   Options
	dir    string
	bindir string
	cred   *syscall.Credential // nil when not root
	uid    int
	gid    int
	env    []string
	id     string // in every process title of the cluster's servers

	// copies are the nodes made by [Node.Copy], stopped by Close.
	copiesMu sync.Mutex
	copies   []*Node

	closeOnce sync.Once
	closeErr  error
}

// Node is one server of a [Cluster]. Its methods are safe for concurrent
// use.
type Node struct {
	c        *Cluster
	name     string // "primary", "standby", a copy's, or a Citus node's ("worker1", "worker1_standby")
	dataDir  string
	logPath  string
	title    string // cluster_name, in the process titles of its processes
	conninfo string // the standby's primary_conninfo

	// upstream is the worker a standby of [Citus.StartStandby] streams
	// from, and synchronous whether it is that worker's synchronous
	// standby; nil for the nodes of [Start].
	upstream    *Node
	synchronous bool

	mu      sync.Mutex
	port    int
	proc    *process // nil before the first start
	logFile *os.File
}

// process is a postmaster started by the test process.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's error; read after exited is closed
}

// running reports whether p is a postmaster that has not exited.
func (p *process) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Start starts a primary and a standby that streams from it, and returns
// once the primary shows the standby streaming (as its synchronous standby
// with opts.Synchronous). On error everything it started is stopped and its
// files removed. Call [Cluster.Close] when done, also when the test fails.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	return start(ctx, opts, true)
}

// StartSingle runs initdb and starts one server, the cluster's Primary,
// with no standby ([Cluster.Standby] is nil; opts.Synchronous must be
// false), and returns once it accepts connections. The server is
// configured as [Start]'s primary, then with opts.Settings. On error
// everything it started is stopped and its files removed. Call
// [Cluster.Close] when done.
func StartSingle(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Synchronous {
		return nil, errors.New("pgrepl: StartSingle: Options.Synchronous needs a standby")
	}
	return start(ctx, opts, false)
}

func start(ctx context.Context, opts Options, withStandby bool) (_ *Cluster, err error) {
	if opts.StandbyName == "" {
		opts.StandbyName = DefaultStandbyName
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("pgrepl: Options.Timeout must not be negative, got %s", opts.Timeout)
	}
	if strings.ContainsAny(opts.StandbyName, "' \\\"") {
		return nil, fmt.Errorf("pgrepl: Options.StandbyName %q must not contain quotes, backslashes or spaces", opts.StandbyName)
	}
	bindir := opts.Bindir
	if bindir == "" {
		if bindir, err = FindBindir(); err != nil {
			return nil, err
		}
	} else if !haveServerBins(bindir) {
		return nil, fmt.Errorf("pgrepl: Options.Bindir %s: %w", bindir, ErrNoServer)
	}

	c := &Cluster{opts: opts, bindir: bindir, uid: -1, gid: -1, id: "pgrepl-" + randomID()}
	if err := c.setUp("pgrepl-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if cerr := c.Close(); cerr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, cerr)
			}
		}
	}()
	if err := os.Chmod(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgrepl: %w", err)
	}
	if err := c.chown(c.dir); err != nil {
		return nil, err
	}

	c.Primary = c.newNode("primary")
	if withStandby {
		c.Standby = c.newNode("standby")
	}

	began := time.Now()
	if err := c.initPrimary(ctx); err != nil {
		return nil, err
	}
	c.logf("pgrepl: initdb %s", since(began))

	step := time.Now()
	if err := c.Primary.start(ctx); err != nil {
		return nil, err
	}
	c.logf("pgrepl: primary started on port %d in %s", c.Primary.Port(), since(step))
	if !withStandby {
		return c, nil
	}

	if err := c.startStandby(ctx, c.Primary, c.Standby, opts.StandbyName, opts.Synchronous); err != nil {
		return nil, err
	}
	c.logf("pgrepl: cluster up in %s (%s)", since(began), c.dir)
	return c, nil
}

// startStandby makes s a streaming standby of p, named name (its
// application_name in p's pg_stat_replication): a physical replication
// slot on p, pg_basebackup -R -X stream through it, s started as a hot
// standby, p told to wait for it when synchronous, and s streaming.
func (c *Cluster) startStandby(ctx context.Context, p, s *Node, name string, synchronous bool) error {
	step := time.Now()
	if err := p.exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slotName); err != nil {
		return fmt.Errorf("pgrepl: %s: create replication slot: %w", p.name, err)
	}
	if err := c.baseBackup(ctx, p, s, name); err != nil {
		return err
	}
	c.logf("pgrepl: pg_basebackup of %s %s", p.name, since(step))

	step = time.Now()
	if err := s.start(ctx); err != nil {
		return err
	}
	if synchronous {
		// Set only now, and only on p: the copy taken above must not
		// wait for a standby of its own once promoted.
		if err := p.exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quote(name)); err != nil {
			return fmt.Errorf("pgrepl: %s: set synchronous_standby_names: %w", p.name, err)
		}
		if err := p.exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("pgrepl: %s: reload: %w", p.name, err)
		}
	}
	if err := c.waitStreaming(ctx, p, name, synchronous, s); err != nil {
		return err
	}
	mode := "asynchronous"
	if synchronous {
		mode = "synchronous"
	}
	c.logf("pgrepl: %s started on port %d, streaming (%s) from %s, in %s", s.name, s.Port(), mode, p.name, since(step))
	return nil
}

// setUp finds the user the servers run as (postgres, when the test runs
// as root) and makes the cluster's temporary directory, named with
// prefix.
func (c *Cluster) setUp(prefix string) error {
	if os.Geteuid() == 0 {
		u, err := user.Lookup(superuser)
		if err != nil {
			return fmt.Errorf("pgrepl: the test runs as root and PostgreSQL refuses to: no system user %q to run it as "+
				"(create one: useradd --system --user-group postgres): %w", superuser, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.uid, c.gid = uid, gid
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	c.env = serverEnv()
	// The server user must reach the directory: under root, a TMPDIR in
	// /root would not do.
	parent := os.TempDir()
	if c.cred != nil {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return fmt.Errorf("pgrepl: temporary directory: %w", err)
	}
	c.dir = dir
	return nil
}

// Dir returns the temporary directory that holds the servers' data
// directories and logs; Close removes it.
func (c *Cluster) Dir() string { return c.dir }

// Bindir returns the directory of the server programs the cluster runs.
func (c *Cluster) Bindir() string { return c.bindir }

// MultiHostDSN returns a URL with both servers, in Start's order, and
// target_session_attrs=read-write: pgx connects to whichever of them is
// the primary at the time (it tries them in order, and skips the one that
// is down or read-only). Without a standby ([StartSingle]) it names the
// primary only.
func (c *Cluster) MultiHostDSN() string {
	if c.Standby == nil {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			superuser, c.Primary.Port())
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		superuser, c.Primary.Port(), c.Standby.Port())
}

// WaitStreaming waits until the primary's pg_stat_replication shows the
// standby in state 'streaming' and, with [Options.Synchronous], with
// sync_state 'sync'.
func (c *Cluster) WaitStreaming(ctx context.Context) error {
	if c.Standby == nil {
		return errNoStandby
	}
	return c.waitStreaming(ctx, c.Primary, c.opts.StandbyName, c.opts.Synchronous, c.Standby)
}

// waitStreaming waits until standby s streams from its worker w
// ([Citus.StartStandby]).
func waitStreaming(ctx context.Context, w, s *Node) error {
	return s.c.waitStreaming(ctx, w, s.name, s.synchronous, s)
}

func (c *Cluster) waitStreaming(ctx context.Context, primary *Node, name string, synchronous bool, standby *Node) error {
	want := "streaming"
	if synchronous {
		want = "streaming/sync"
	}
	last := "no row in pg_stat_replication"
	err := primary.poll(ctx, "the standby "+want, func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var state, syncState string
		err := conn.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`,
			name).Scan(&state, &syncState)
		if errors.Is(err, pgx.ErrNoRows) {
			last = "no row in pg_stat_replication"
			return false, nil
		}
		if err != nil {
			return false, err
		}
		last = "state " + state + ", sync_state " + syncState
		return state == "streaming" && (!synchronous || syncState == "sync"), nil
	})
	if err != nil {
		return fmt.Errorf("%w (last seen: %s)%s", err, last, standby.logTail())
	}
	return nil
}

// WaitCaughtUp waits until the standby has replayed everything the primary
// has written so far (its current WAL position).
func (c *Cluster) WaitCaughtUp(ctx context.Context) error {
	if c.Standby == nil {
		return errNoStandby
	}
	lsn, err := c.Primary.CurrentLSN(ctx)
	if err != nil {
		return err
	}
	return c.Standby.WaitReplayed(ctx, lsn)
}

// Close stops both servers (see [Node.Stop]) and removes the temporary
// directory. It may be called more than once; later calls return the first
// call's result.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		// The standby first: the primary's fast shutdown would wait for
		// its walsender to send the last WAL to it. Copies before both: a
		// copy may listen on the port of a node killed before it, which
		// Stop waits to see closed.
		c.copiesMu.Lock()
		nodes := append(slices.Clone(c.copies), c.Standby, c.Primary)
		c.copiesMu.Unlock()
		for _, n := range nodes {
			if n != nil {
				if err := n.Stop(); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if c.dir != "" {
			if err := os.RemoveAll(c.dir); err != nil {
				errs = append(errs, fmt.Errorf("pgrepl: remove %s: %w", c.dir, err))
			}
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// Name returns "primary" or "standby", the node's role at Start; a
// copy's name ([Node.Copy]); or a Citus node's: "coordinator", "worker1"...,
// and "worker1_standby" for the standby of worker1 ([Citus.StartStandby]).
func (n *Node) Name() string { return n.name }

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (n *Node) Port() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.port
}

// DSN returns the URL of the server's database postgres as user postgres.
func (n *Node) DSN() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", superuser, n.Port())
}

// DataDir returns the server's data directory.
func (n *Node) DataDir() string { return n.dataDir }

// LogPath returns the file the server logs to.
func (n *Node) LogPath() string { return n.logPath }

// Log returns the last lines of the server's log.
func (n *Node) Log(lines int) string { return tail(n.logPath, lines) }

// Running reports whether the server's postmaster runs.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runningLocked()
}

func (n *Node) runningLocked() bool { return n.proc.running() }

// Processes returns the process ids of the server: its postmaster, and
// every process of it (backends, walsenders, the checkpointer...), also
// those whose postmaster is gone. Zombies do not count.
func (n *Node) Processes() ([]int, error) {
	pids, err := findProcesses("postgres: "+n.title+": ",
		filepath.Join(n.c.bindir, "postgres")+"\x00-D\x00"+n.dataDir+"\x00")
	if err != nil {
		return nil, fmt.Errorf("pgrepl: %s: list processes: %w", n.name, err)
	}
	return pids, nil
}

// Kill crashes the server as a machine that loses power would: every
// process of it gets SIGKILL at once, none sends anything more to its
// clients. (The postmaster is stopped first, so that it forks nothing more
// and its children do not notice; killed alone, its backends would see it
// die, tell their clients, and could finish and commit what they are
// doing.) It returns once no process of the server is left and its port
// refuses connections, or with an error after 10 s. Killing a server that
// does not run returns nil.
func (n *Node) Kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.killLocked()
}

func (n *Node) killLocked() error {
	if n.runningLocked() {
		_ = n.proc.cmd.Process.Signal(syscall.SIGSTOP)
	}
	deadline := time.Now().Add(killWait)
	for {
		pids, err := n.Processes()
		if err != nil {
			return err
		}
		postmaster := 0
		if n.runningLocked() {
			postmaster = n.proc.cmd.Process.Pid
		}
		for _, pid := range pids {
			if pid != postmaster {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if postmaster != 0 {
			_ = n.proc.cmd.Process.Signal(syscall.SIGKILL)
		}
		if postmaster == 0 && len(pids) == 0 && !portOpen(n.port) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgrepl: %s: still there %s after SIGKILL (postmaster running: %t, processes %v, port %d open: %t)%s",
				n.name, killWait, postmaster != 0, pids, n.port, portOpen(n.port), n.logTail())
		}
		time.Sleep(pollInterval)
	}
}

// reinitializing is what the postmaster logs once it has ended every
// process after one of them crashed, before crash recovery.
const reinitializing = "all server processes terminated; reinitializing"

// CrashBackend kills one backend of the server (a connection of its own)
// with SIGKILL, as a crash of a backend would end it: the postmaster ends
// every other process and runs crash recovery, without restarting itself.
// Its start time and timeline stay the same, and so does its port; what
// was committed and not yet flushed (synchronous_commit = off) is lost.
// It returns once the server has reinitialized and accepts connections
// again, or with an error when ctx ends first.
func (n *Node) CrashBackend(ctx context.Context) error {
	crashes := func() int {
		b, _ := os.ReadFile(n.logPath)
		return strings.Count(string(b), reinitializing)
	}
	before := crashes()
	conn, err := n.connect(ctx)
	if err != nil {
		return fmt.Errorf("pgrepl: %s: %w", n.name, err)
	}
	var pid int
	err = conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid)
	if err == nil {
		err = syscall.Kill(pid, syscall.SIGKILL)
	}
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("pgrepl: %s: kill a backend: %w", n.name, err)
	}
	return n.poll(ctx, "crash recovery after SIGKILL of backend "+strconv.Itoa(pid), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		if crashes() == before {
			return false, nil
		}
		return true, conn.Ping(ctx)
	})
}

// Stop shuts the server down: a fast shutdown (SIGINT, what `pg_ctl stop
// -m fast` sends), after 30 s an immediate one (SIGQUIT), after 10 s more
// SIGKILL as in [Node.Kill]. It returns once no process of the server is
// left. Stopping a server that does not run returns nil, so it may be
// called more than once.
func (n *Node) Stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runningLocked() {
		_ = n.proc.cmd.Process.Signal(syscall.SIGINT)
		if !n.waitExitLocked(fastStopWait) {
			n.c.logf("pgrepl: %s: no fast shutdown within %s, trying an immediate one", n.name, fastStopWait)
			_ = n.proc.cmd.Process.Signal(syscall.SIGQUIT)
			if !n.waitExitLocked(immediateStopWait) {
				n.c.logf("pgrepl: %s: no immediate shutdown within %s, killing it", n.name, immediateStopWait)
			}
		}
	}
	err := n.killLocked()
	if n.logFile != nil {
		_ = n.logFile.Close()
		n.logFile = nil
	}
	return err
}

// Restart stops the server as [Node.Stop] does and starts it again on
// the same port, with the same data directory and settings, and returns
// once it accepts connections: what `pg_ctl restart -m fast` does, for a
// postmaster that is a child of this process. Clients lose their
// connections and reconnect to the same address. A server that does not
// run is started.
func (n *Node) Restart(ctx context.Context) error {
	began := time.Now()
	port := n.Port()
	if port == 0 {
		return fmt.Errorf("pgrepl: %s: Restart: never started", n.name)
	}
	if err := n.Stop(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.Timeout)
	defer cancel()
	// The log goes on: what the server said before the restart stays.
	if err := n.startOnLog(ctx, port, os.O_APPEND); err != nil {
		return err
	}
	n.c.logf("pgrepl: %s restarted on port %d in %s", n.name, port, since(began))
	return nil
}

// waitExitLocked waits up to d for the postmaster to exit.
func (n *Node) waitExitLocked(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.proc.exited:
		return true
	case <-t.C:
		return false
	}
}

// Promote promotes a standby: `pg_ctl promote -w`, then waits until
// pg_is_in_recovery() is false. It replays the WAL the standby received
// first, also while replay is paused ([Node.PauseReplay]).
func (n *Node) Promote(ctx context.Context) error {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.Timeout)
	defer cancel()
	secs := strconv.Itoa(max(1, int(n.c.opts.Timeout.Round(time.Second)/time.Second)))
	if err := n.c.run(ctx, "pg_ctl", "promote", "-D", n.dataDir, "-w", "-t", secs); err != nil {
		return fmt.Errorf("pgrepl: %s: %w%s", n.name, err, n.logTail())
	}
	err := n.poll(ctx, "pg_is_in_recovery() false", func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var inRecovery bool
		err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		return err == nil && !inRecovery, err
	})
	if err != nil {
		return err
	}
	n.c.logf("pgrepl: %s promoted in %s", n.name, since(began))
	return nil
}

// PauseReplay pauses the standby's replay (pg_wal_replay_pause()) and
// waits until pg_get_wal_replay_pause_state() is 'paused': its readers see
// no new commits from then on. WAL still arrives, and a promotion replays
// it (see the package documentation); to lose what the primary writes
// next, use [Node.PauseStreaming].
func (n *Node) PauseReplay(ctx context.Context) error {
	if err := n.exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		return fmt.Errorf("pgrepl: %s: pg_wal_replay_pause: %w", n.name, err)
	}
	return n.waitPauseState(ctx, "paused")
}

// ResumeReplay resumes the standby's replay (pg_wal_replay_resume()) and
// waits until pg_get_wal_replay_pause_state() is 'not paused'.
func (n *Node) ResumeReplay(ctx context.Context) error {
	if err := n.exec(ctx, "SELECT pg_wal_replay_resume()"); err != nil {
		return fmt.Errorf("pgrepl: %s: pg_wal_replay_resume: %w", n.name, err)
	}
	return n.waitPauseState(ctx, "not paused")
}

func (n *Node) waitPauseState(ctx context.Context, want string) error {
	last := ""
	err := n.poll(ctx, "pg_get_wal_replay_pause_state() '"+want+"'", func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		err := conn.QueryRow(ctx, "SELECT pg_get_wal_replay_pause_state()").Scan(&last)
		return err == nil && last == want, err
	})
	if err != nil {
		return fmt.Errorf("%w (last seen: %q)", err, last)
	}
	return nil
}

// PauseStreaming stops the standby from receiving WAL: it empties its
// primary_conninfo (ALTER SYSTEM, reload), so that no walreceiver is
// started any more, and sends the running one SIGTERM (what the standby
// itself does when primary_conninfo changes, except that it waits for a
// replay that is paused to resume first). It returns once no walreceiver
// has run for a second. What the primary writes from then on stays there
// (the replication slot keeps it) until [Node.ResumeStreaming]; a promotion
// before that loses it. With [Options.Synchronous], the primary's commits
// wait until streaming resumes.
func (n *Node) PauseStreaming(ctx context.Context) error {
	if err := n.setPrimaryConninfo(ctx, ""); err != nil {
		return err
	}
	// The startup process may start a walreceiver with the old setting
	// until it has read the new one: stop any that appears, until none
	// has for several times wal_retrieve_retry_interval.
	var goneSince time.Time
	return n.poll(ctx, "the walreceiver to stop", func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var pid int
		err := conn.QueryRow(ctx, "SELECT coalesce(max(pid), 0) FROM pg_stat_wal_receiver").Scan(&pid)
		if err != nil {
			return false, err
		}
		if pid != 0 {
			goneSince = time.Time{}
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
				return false, fmt.Errorf("stop the walreceiver (pid %d): %w", pid, err)
			}
			return false, nil
		}
		if goneSince.IsZero() {
			goneSince = time.Now()
		}
		return time.Since(goneSince) >= walReceiverGoneFor, nil
	})
}

// ResumeStreaming undoes [Node.PauseStreaming] and waits until the primary
// shows the standby streaming again (see [Cluster.WaitStreaming]). A
// standby whose replay is paused starts no walreceiver: resume the replay
// first.
func (n *Node) ResumeStreaming(ctx context.Context) error {
	if err := n.setPrimaryConninfo(ctx, n.conninfo); err != nil {
		return err
	}
	if n.upstream != nil {
		return waitStreaming(ctx, n.upstream, n)
	}
	return n.c.WaitStreaming(ctx)
}

func (n *Node) setPrimaryConninfo(ctx context.Context, conninfo string) error {
	if err := n.exec(ctx, "ALTER SYSTEM SET primary_conninfo = "+quote(conninfo)); err != nil {
		return fmt.Errorf("pgrepl: %s: set primary_conninfo: %w", n.name, err)
	}
	if err := n.exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgrepl: %s: reload: %w", n.name, err)
	}
	return nil
}

// CurrentLSN returns the WAL position the server has written up to
// (pg_current_wal_lsn(); a primary only).
func (n *Node) CurrentLSN(ctx context.Context) (LSN, error) {
	return n.lsn(ctx, "pg_current_wal_lsn()")
}

// ReplayLSN returns the WAL position a standby has replayed up to
// (pg_last_wal_replay_lsn()).
func (n *Node) ReplayLSN(ctx context.Context) (LSN, error) {
	return n.lsn(ctx, "pg_last_wal_replay_lsn()")
}

// ReceiveLSN returns the WAL position a standby has received and flushed
// up to (pg_last_wal_receive_lsn()).
func (n *Node) ReceiveLSN(ctx context.Context) (LSN, error) {
	return n.lsn(ctx, "pg_last_wal_receive_lsn()")
}

func (n *Node) lsn(ctx context.Context, fn string) (LSN, error) {
	var s *string
	err := n.withConn(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT "+fn+"::text").Scan(&s)
	})
	if err != nil {
		return 0, fmt.Errorf("pgrepl: %s: %s: %w", n.name, fn, err)
	}
	if s == nil {
		return 0, fmt.Errorf("pgrepl: %s: %s is null", n.name, fn)
	}
	return ParseLSN(*s)
}

// WaitReplayed waits until a standby has replayed WAL up to lsn.
func (n *Node) WaitReplayed(ctx context.Context, lsn LSN) error {
	var last LSN
	err := n.poll(ctx, "replay up to "+lsn.String(), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var s *string
		if err := conn.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text").Scan(&s); err != nil {
			return false, err
		}
		if s == nil {
			return false, errors.New("pg_last_wal_replay_lsn() is null: not a standby")
		}
		l, err := ParseLSN(*s)
		last = l
		return err == nil && l >= lsn, err
	})
	if err != nil {
		return fmt.Errorf("%w (replayed up to %s)", err, last)
	}
	return nil
}

// LSN is a position in the WAL.
type LSN uint64

// ParseLSN parses PostgreSQL's text form of a pg_lsn, e.g. "0/3000148".
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if ok {
		h, err1 := strconv.ParseUint(hi, 16, 32)
		l, err2 := strconv.ParseUint(lo, 16, 32)
		if err1 == nil && err2 == nil {
			return LSN(h<<32 | l), nil
		}
	}
	return 0, fmt.Errorf("pgrepl: invalid LSN %q", s)
}

// String returns PostgreSQL's text form, e.g. "0/3000148".
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// ---------------------------------------------------------------- setup

func (c *Cluster) newNode(name string) *Node {
	return &Node{
		c:       c,
		name:    name,
		dataDir: filepath.Join(c.dir, name),
		logPath: filepath.Join(c.dir, name+".log"),
		title:   c.id + "-" + name,
	}
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func (c *Cluster) initPrimary(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	p := c.Primary
	if err := c.run(ctx, "initdb", "-D", p.dataDir, "--auth=trust", "-U", superuser,
		"--encoding=UTF8", "--no-locale", "--no-sync"); err != nil {
		return fmt.Errorf("pgrepl: primary: %w", err)
	}
	var conf strings.Builder
	conf.WriteString("\n# --- pgrepl (throwaway test servers) ---\n")
	for _, kv := range [][2]string{
		{"listen_addresses", "127.0.0.1"},
		{"unix_socket_directories", ""},
		{"max_connections", "100"},
		{"shared_buffers", "16MB"},
		{"fsync", "off"},
		{"synchronous_commit", "on"},
		{"wal_level", "replica"},
		{"max_wal_senders", "10"},
		{"max_replication_slots", "10"},
		{"hot_standby", "on"},
		// The standby reports its positions every second, and retries
		// streaming after 200 ms (ResumeStreaming, a lost primary).
		{"wal_receiver_status_interval", "1s"},
		{"wal_retrieve_retry_interval", "200ms"},
		{"jit", "off"},
		{"logging_collector", "off"},
		{"log_line_prefix", "%m [%p] %q%a "},
	} {
		fmt.Fprintf(&conf, "%s = %s\n", kv[0], quote(kv[1]))
	}
	keys := make([]string, 0, len(c.opts.Settings))
	for k := range c.opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, quote(c.opts.Settings[k]))
	}
	if err := appendFile(filepath.Join(p.dataDir, "postgresql.conf"), conf.String()); err != nil {
		return fmt.Errorf("pgrepl: primary: %w", err)
	}
	hba := "# pgrepl: trust on 127.0.0.1 only, for the tests\n" +
		"host all all 127.0.0.1/32 trust\n" +
		"host replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(p.dataDir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("pgrepl: primary: %w", err)
	}
	return c.chown(filepath.Join(p.dataDir, "pg_hba.conf"))
}

// Copy takes a base backup of the node (pg_basebackup -X stream, without
// -R: no standby.signal, no primary_conninfo, no replication slot) into a
// new node of the cluster named name, and returns it, not started.
// Started ([Node.StartOn]), the copy runs as a primary on the node's
// timeline, with what the node had committed when the backup ended: what
// a disk or VM snapshot restored in place, or a base backup started as it
// is, looks like. [Cluster.Close] stops it and removes its files.
func (n *Node) Copy(ctx context.Context, name string) (*Node, error) {
	c := n.c
	if strings.ContainsAny(name, "/ ") || name == "" || name == c.Primary.name || name == "standby" {
		return nil, fmt.Errorf("pgrepl: Copy: invalid name %q", name)
	}
	cp := c.newNode(name)
	c.copiesMu.Lock()
	c.copies = append(c.copies, cp)
	c.copiesMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=pgrepl_copy", n.Port(), superuser)
	if err := c.run(ctx, "pg_basebackup", "-d", conninfo, "-D", cp.dataDir, "-X", "stream",
		"--checkpoint=fast", "--no-sync"); err != nil {
		return nil, fmt.Errorf("pgrepl: copy %s of %s: %w%s", name, n.name, err, n.logTail())
	}
	return cp, nil
}

// StartOn starts a node that does not run on port, e.g. the port of a node
// stopped or killed before, so that clients that reconnect to that
// address reach this one; it returns once the server accepts
// connections.
func (n *Node) StartOn(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.Timeout)
	defer cancel()
	return n.startOn(ctx, port)
}

// baseBackup copies p into the data directory of its standby s, with
// standby.signal and the settings to stream from p's slot as name.
func (c *Cluster) baseBackup(ctx context.Context, p, s *Node, name string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	s.conninfo = fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", p.Port(), superuser, name)
	if err := c.run(ctx, "pg_basebackup", "-d", s.conninfo, "-D", s.dataDir, "-R", "-X", "stream",
		"-S", slotName, "--checkpoint=fast", "--no-sync"); err != nil {
		return fmt.Errorf("pgrepl: %s: %w%s", s.name, err, p.logTail())
	}
	// -R wrote a primary_conninfo of its own; this one names the standby
	// for synchronous_standby_names, whatever pg_basebackup passes on.
	auto := filepath.Join(s.dataDir, "postgresql.auto.conf")
	if err := appendFile(auto, "primary_conninfo = "+quote(s.conninfo)+"\n"); err != nil {
		return fmt.Errorf("pgrepl: %s: %w", s.name, err)
	}
	return nil
}

// start starts the server on a free port and waits until it accepts
// connections (a standby: once it reached a consistent state).
func (n *Node) start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.Timeout)
	defer cancel()
	var err error
	for attempt := 1; attempt <= portAttempts; attempt++ {
		var port int
		port, err = freePort()
		if err != nil {
			return fmt.Errorf("pgrepl: %s: %w", n.name, err)
		}
		err = n.startOn(ctx, port)
		if err == nil {
			return nil
		}
		if !n.bindFailed() {
			break
		}
		n.c.logf("pgrepl: %s: port %d was taken meanwhile, trying another (attempt %d)", n.name, port, attempt)
	}
	return err
}

func (n *Node) startOn(ctx context.Context, port int) error {
	return n.startOnLog(ctx, port, os.O_TRUNC)
}

// startOnLog starts the server on port, its log opened with logFlag
// (os.O_TRUNC, or os.O_APPEND to keep what the log has).
func (n *Node) startOnLog(ctx context.Context, port, logFlag int) error {
	n.mu.Lock()
	if n.runningLocked() {
		n.mu.Unlock()
		return fmt.Errorf("pgrepl: %s: already running", n.name)
	}
	if n.logFile != nil {
		_ = n.logFile.Close()
	}
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|logFlag, 0o644)
	if err != nil {
		n.mu.Unlock()
		return fmt.Errorf("pgrepl: %s: %w", n.name, err)
	}
	n.logFile = f
	cmd := exec.Command(filepath.Join(n.c.bindir, "postgres"), "-D", n.dataDir,
		"-c", "port="+strconv.Itoa(port), "-c", "cluster_name="+n.title)
	cmd.Dir = n.c.dir
	cmd.Env = n.c.env
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: n.c.cred,
		// Signals for the test's process group (a Ctrl-C) are not for
		// the server; Stop and Kill signal it.
		Setpgid: true,
		// No server outlives a test binary that dies.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		return fmt.Errorf("pgrepl: %s: start postgres: %w", n.name, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	n.proc, n.port = p, port
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	n.mu.Unlock()

	err = n.poll(ctx, "the server to accept connections", func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		_, err := conn.Exec(ctx, "SELECT 1")
		return err == nil, err
	})
	if err != nil {
		_ = n.Stop()
		return err
	}
	return nil
}

// bindFailed reports whether the server's log says its port was taken.
func (n *Node) bindFailed() bool {
	b, _ := os.ReadFile(n.logPath)
	s := strings.ToLower(string(b))
	return strings.Contains(s, "could not bind") || strings.Contains(s, "address already in use")
}

// ---------------------------------------------------------------- helpers

// poll runs check on a connection to the server every pollInterval until
// it returns true, reconnecting after an error, for at most the cluster's
// Timeout. The error says what was awaited, the last error seen, and ends
// with the tail of the server's log. It fails at once when the postmaster
// exits.
func (n *Node) poll(ctx context.Context, what string, check func(context.Context, *pgx.Conn) (bool, error)) error {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.Timeout)
	defer cancel()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			ccancel()
		}
	}()
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	var lastErr error
	for {
		if p != nil && !p.running() {
			return fmt.Errorf("pgrepl: %s: waiting for %s: the server exited (%v)%s", n.name, what, p.err, n.logTail())
		}
		if conn == nil {
			conn, lastErr = n.connect(ctx)
		}
		if conn != nil {
			done, err := check(ctx, conn)
			if err == nil && done {
				return nil
			}
			if err != nil {
				lastErr = err
				cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
				_ = conn.Close(cctx)
				ccancel()
				conn = nil
			}
		}
		select {
		case <-ctx.Done():
			detail := ""
			if lastErr != nil {
				detail = fmt.Sprintf(" (last error: %v)", lastErr)
			}
			return fmt.Errorf("pgrepl: %s: gave up waiting for %s after %s: %w%s%s",
				n.name, what, since(began), ctx.Err(), detail, n.logTail())
		case <-time.After(pollInterval):
		}
	}
}

// connect opens a connection to the server, bounded by connectTimeout.
func (n *Node) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(n.DSN())
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = connectTimeout
	return pgx.ConnectConfig(ctx, cfg)
}

// withConn runs fn on a new connection, bounded by the cluster's Timeout.
func (n *Node) withConn(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.Timeout)
	defer cancel()
	conn, err := n.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}

// exec runs one statement on a new connection.
func (n *Node) exec(ctx context.Context, sql string, args ...any) error {
	return n.withConn(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	})
}

// logTail returns the end of the server's log, to append to an error.
func (n *Node) logTail() string {
	t := tail(n.logPath, logTailLines)
	if t == "" {
		return ""
	}
	return "\n--- last lines of " + n.logPath + " ---\n" + t
}

// run runs a server program as the server user, and returns an error with
// its output when it fails.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, prog), args...)
	cmd.Dir = c.dir
	cmd.Env = c.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, c.uid, c.gid); err != nil {
		return fmt.Errorf("pgrepl: %w", err)
	}
	return nil
}

// serverEnv is the test's environment without the PG* variables, which
// would point pg_basebackup and the others elsewhere.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return append(env, "LC_ALL=C")
}

func haveServerBins(dir string) bool {
	if dir == "" {
		return false
	}
	for _, p := range []string{"initdb", "pg_ctl", "postgres", "pg_basebackup"} {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// EnvBindir names the environment variable that chooses the server
// programs' directory for [FindBindir], and so for every server started
// without [Options.Bindir]: localpg's, the failover and crash tests', and
// the PgBouncer set-ups in front of localpg's. The Makefile's PG=17 sets
// it to the build of scripts/build-postgresql.sh.
const EnvBindir = "PGLEASE_PG_BINDIR"

// FindBindir returns the directory of the PostgreSQL server programs: that
// of $PGLEASE_PG_BINDIR when it is set (an error when it lacks one of
// them), else that of `pg_config --bindir`, else the newest
// /usr/lib/postgresql/*/bin (Debian's layout), else that of initdb on
// PATH; [ErrNoServer] when none has them all. Symbolic links are resolved,
// so that the server programs run from a path the system user postgres
// can reach.
func FindBindir() (string, error) {
	if d := os.Getenv(EnvBindir); d != "" {
		r, err := filepath.EvalSymlinks(d)
		if err != nil || !haveServerBins(r) {
			return "", fmt.Errorf("pgrepl: %s=%s: %w", EnvBindir, d, ErrNoServer)
		}
		return filepath.Abs(r)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); haveServerBins(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) < versionOf(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if haveServerBins(dirs[i]) {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			if d := filepath.Dir(r); haveServerBins(d) {
				return d, nil
			}
		}
	}
	return "", ErrNoServer
}

// versionOf returns the major version of /usr/lib/postgresql/VERSION/bin.
func versionOf(bindir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bindir)), 64)
	return v
}

// findProcesses returns the live processes whose command line starts with
// one of prefixes.
func findProcesses(prefixes ...string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(string(cmdline), p) {
				if !zombieOrGone(pid) {
					pids = append(pids, pid)
				}
				break
			}
		}
	}
	return pids, nil
}

func zombieOrGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) state ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// portOpen reports whether something accepts connections on 127.0.0.1:port.
func portOpen(port int) bool {
	if port == 0 {
		return false
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("no free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// tail returns the last n lines of a file, or "".
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// quote returns s as a single-quoted SQL or configuration literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
