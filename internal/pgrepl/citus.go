package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrNoCitus is returned by [StartCitus] when the Citus extension is not
// installed for the server programs found.
var ErrNoCitus = errors.New("pgrepl: the Citus extension is not installed (no citus.so in the server's library directory): " +
	"build and install it, as root, with ../shared/citus/install.sh next to the repository (its source is expected in " +
	"../shared/citus/citus-13.2.2-src.tar.xz), or run the tests through `make test-citus`, which does")

// DefaultCitusWorkers is the number of workers of [StartCitus] when
// [CitusOptions.Workers] is 0.
const DefaultCitusWorkers = 2

// CitusOptions configures [StartCitus].
type CitusOptions struct {
	// Workers is the number of worker nodes. Default [DefaultCitusWorkers].
	Workers int
	// Timeout bounds each step, as [Options.Timeout]. Default
	// [DefaultTimeout].
	Timeout time.Duration
	// Settings are more server settings for every node, as
	// [Options.Settings].
	Settings map[string]string
	// Logf, when set, receives a line for each step (pass t.Logf).
	Logf func(format string, args ...any)
	// Started, when set, is called with each node once its server
	// accepts connections, before anything else is done on it (say, to
	// put its processes into a control group: the processes it forks
	// later follow its postmaster). An error stops StartCitus.
	Started func(n *Node) error
	// Address, when set, returns the address to register for a node in
	// Citus's node table, where the other nodes reach it (say, a proxy in
	// front of it); it is called once per node, after Started. Default:
	// 127.0.0.1 and the node's port.
	Address func(n *Node) (host string, port int, err error)
}

// Citus is a Citus cluster started by [StartCitus]: a coordinator and its
// workers, each a server of its own on 127.0.0.1, in one temporary
// directory. Its methods are safe for concurrent use.
type Citus struct {
	// Coordinator is the node applications connect to: it holds the
	// metadata, and plans and routes every statement on distributed
	// tables.
	Coordinator *Node
	// Workers are the nodes that hold the shards, in the order they were
	// added to the coordinator.
	Workers []*Node

	c *Cluster
}

// StartCitus starts a Citus cluster: initdb for a coordinator and
// opts.Workers workers, each with shared_preload_libraries = 'citus' and
// max_prepared_transactions (reference tables and multi-shard writes
// commit in two phases), CREATE EXTENSION citus in the database postgres
// of each, then citus_set_coordinator_host and citus_add_node of every
// worker on the coordinator. The servers run as [Start]'s do (as the user
// postgres when the test runs as root, killed with the test process). On
// error everything it started is stopped and its files removed. Call
// [Citus.Close] when done.
func StartCitus(ctx context.Context, opts CitusOptions) (_ *Citus, err error) {
	if opts.Workers == 0 {
		opts.Workers = DefaultCitusWorkers
	}
	if opts.Workers < 0 {
		return nil, fmt.Errorf("pgrepl: CitusOptions.Workers must not be negative, got %d", opts.Workers)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("pgrepl: CitusOptions.Timeout must not be negative, got %s", opts.Timeout)
	}
	bindir, err := FindBindir()
	if err != nil {
		return nil, err
	}
	if !CitusInstalled() {
		return nil, ErrNoCitus
	}
	settings := map[string]string{
		"shared_preload_libraries":  "citus",
		"max_prepared_transactions": "100",
		"max_connections":           "200",
		// The statements of one test transaction reach a worker over
		// one connection, and a test leaves no prepared transaction
		// behind for long.
		"citus.max_cached_conns_per_worker": "4",
		// The nodes talk in plain TCP on 127.0.0.1: no certificate
		// to find (libpq would look in the HOME of the test process).
		"citus.node_conninfo": "sslmode=disable",
		// A worker may get a streaming standby (StartStandby), which
		// reports its positions every second and retries streaming
		// after 200 ms, as Start's does.
		"wal_level":                    "replica",
		"max_wal_senders":              "10",
		"max_replication_slots":        "10",
		"hot_standby":                  "on",
		"wal_receiver_status_interval": "1s",
		"wal_retrieve_retry_interval":  "200ms",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	c := &Cluster{opts: Options{Timeout: opts.Timeout, Settings: settings, Logf: opts.Logf},
		bindir: bindir, uid: -1, gid: -1, id: "pgcitus-" + randomID()}
	if err = c.setUp("pgcitus-"); err != nil {
		return nil, err
	}
	x := &Citus{c: c}
	defer func() {
		if err != nil {
			if cerr := x.Close(); cerr != nil {
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
	// HOME is the cluster's directory: the connections between the
	// nodes are made by libpq inside the servers, which reads files under
	// $HOME/.postgresql (a root's HOME is not readable by postgres).
	c.env = append(c.env, "HOME="+c.dir)

	began := time.Now()
	x.Coordinator = c.newNode("coordinator")
	c.Primary = x.Coordinator
	nodes := []*Node{x.Coordinator}
	for i := range opts.Workers {
		w := c.newNode("worker" + strconv.Itoa(i+1))
		x.Workers = append(x.Workers, w)
		nodes = append(nodes, w)
	}
	// Close stops the copies and the primary: the workers are listed as
	// copies, so that they stop before the coordinator.
	c.copiesMu.Lock()
	c.copies = append(c.copies, x.Workers...)
	c.copiesMu.Unlock()
	for _, n := range nodes {
		if err := c.initNode(ctx, n); err != nil {
			return nil, err
		}
		if err := n.start(ctx); err != nil {
			return nil, err
		}
		if opts.Started != nil {
			if err := opts.Started(n); err != nil {
				return nil, fmt.Errorf("pgrepl: %s: %w", n.name, err)
			}
		}
		if err := n.exec(ctx, "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return nil, fmt.Errorf("pgrepl: %s: CREATE EXTENSION citus: %w%s", n.name, err, n.logTail())
		}
	}
	address := opts.Address
	if address == nil {
		address = func(n *Node) (string, int, error) { return "127.0.0.1", n.Port(), nil }
	}
	host, port, err := address(x.Coordinator)
	if err != nil {
		return nil, fmt.Errorf("pgrepl: coordinator: its address: %w", err)
	}
	if err := x.Coordinator.exec(ctx, "SELECT pg_catalog.citus_set_coordinator_host($1, $2::int)", host, port); err != nil {
		return nil, fmt.Errorf("pgrepl: coordinator: citus_set_coordinator_host: %w", err)
	}
	for _, w := range x.Workers {
		host, port, err := address(w)
		if err != nil {
			return nil, fmt.Errorf("pgrepl: %s: its address: %w", w.name, err)
		}
		if err := x.Coordinator.exec(ctx, "SELECT pg_catalog.citus_add_node($1, $2::int)", host, port); err != nil {
			return nil, fmt.Errorf("pgrepl: coordinator: citus_add_node of %s: %w%s", w.name, err, x.Coordinator.logTail())
		}
	}
	ports := make([]string, len(x.Workers))
	for i, w := range x.Workers {
		ports[i] = strconv.Itoa(w.Port())
	}
	c.logf("pgrepl: Citus coordinator on port %d, workers on %s, up in %s (%s)",
		x.Coordinator.Port(), strings.Join(ports, ", "), since(began), c.dir)
	return x, nil
}

// Dir returns the temporary directory of the cluster's files.
func (x *Citus) Dir() string { return x.c.dir }

// Close stops every node (workers first) and removes the temporary
// directory. It may be called more than once.
func (x *Citus) Close() error { return x.c.Close() }

// CitusInstalled reports whether the Citus extension is installed for the
// server programs [StartCitus] would use.
func CitusInstalled() bool {
	bindir, err := FindBindir()
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(filepath.Dir(bindir), "lib", "citus.so"))
	return err == nil
}

// initNode runs initdb for n and writes its settings, as initPrimary
// does for a primary (without the replication settings).
func (c *Cluster) initNode(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	if err := c.run(ctx, "initdb", "-D", n.dataDir, "--auth=trust", "-U", superuser,
		"--encoding=UTF8", "--no-locale", "--no-sync"); err != nil {
		return fmt.Errorf("pgrepl: %s: %w", n.name, err)
	}
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": "",
		"shared_buffers":          "16MB",
		"fsync":                   "off",
		"jit":                     "off",
		"logging_collector":       "off",
		"log_line_prefix":         "%m [%p] %q%a ",
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var conf strings.Builder
	conf.WriteString("\n# --- pgrepl (throwaway Citus test servers) ---\n")
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, quote(settings[k]))
	}
	if err := appendFile(filepath.Join(n.dataDir, "postgresql.conf"), conf.String()); err != nil {
		return fmt.Errorf("pgrepl: %s: %w", n.name, err)
	}
	hba := "# pgrepl: trust on 127.0.0.1 only, for the tests\n" +
		"host all all 127.0.0.1/32 trust\n" +
		"host replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(n.dataDir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("pgrepl: %s: %w", n.name, err)
	}
	return c.chown(filepath.Join(n.dataDir, "pg_hba.conf"))
}

// CitusStandbyOptions configures [Citus.StartStandby].
type CitusStandbyOptions struct {
	// Synchronous makes the standby its worker's synchronous standby, as
	// [Options.Synchronous] does for [Start]'s: a commit on the worker
	// (a PREPARE TRANSACTION and COMMIT PREPARED of Citus's two-phase
	// commits included) returns once the standby has flushed its WAL.
	// Default false (asynchronous).
	Synchronous bool
}

// StartStandby starts a streaming standby of worker w, as [Start] starts
// the standby of its primary: pg_basebackup -R -X stream through a
// physical replication slot on w, the copy started as a hot standby on a
// free port of 127.0.0.1, and waits until w shows it streaming (as its
// synchronous standby with opts.Synchronous). The standby is a copy of a
// Citus worker: promoted ([Node.Promote]), it is one, with the worker's
// shards and metadata, at its own address, which the coordinator's node
// table does not know until it is told (citus_update_node). Its
// application_name (in w's pg_stat_replication) is its name, that of w
// with "_standby" appended. [Node.PauseStreaming], [Node.ResumeStreaming]
// and [Node.Promote] work on it as on [Start]'s standby. [Citus.Close]
// stops it (before the workers) and removes its files.
func (x *Citus) StartStandby(ctx context.Context, w *Node, opts CitusStandbyOptions) (*Node, error) {
	c := x.c
	if !slices.Contains(x.Workers, w) {
		return nil, errors.New("pgrepl: StartStandby: not a worker of this cluster")
	}
	s := c.newNode(w.name + "_standby")
	s.upstream, s.synchronous = w, opts.Synchronous
	c.copiesMu.Lock()
	for _, n := range c.copies {
		if n.name == s.name {
			c.copiesMu.Unlock()
			return nil, fmt.Errorf("pgrepl: StartStandby: %s has a standby already", w.name)
		}
	}
	// First in the list: Close stops the standby before its worker, whose
	// fast shutdown would wait for its walsender.
	c.copies = append([]*Node{s}, c.copies...)
	c.copiesMu.Unlock()

	if err := c.startStandby(ctx, w, s, s.name, opts.Synchronous); err != nil {
		return nil, err
	}
	return s, nil
}
