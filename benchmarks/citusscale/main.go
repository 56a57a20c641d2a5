// Command citusscale measures how pglease on Citus scales with its
// workers, on a cluster simulated on this machine (internal/simcluster):
// each node in a control group with the same CPU quota, a delaying proxy
// in front of each node, and the benchmark's clients in processes with a
// group and quota of their own. For one plain PostgreSQL (the reference)
// and for Citus with each number of workers of -workers, it runs three
// phases over -topics topics:
//
//   - publish: -procs publisher processes per node publish to their
//     topics, a goroutine per topic and -batch messages per call, for
//     -duration, with no consumer;
//   - publish, routed (Citus, with -route): the same with
//     PublisherConfig.RouteToWorkers, each topic's calls sent to its
//     worker rather than to the coordinator;
//   - consume: as many consumer processes (one Subscriber each, one
//     group) drain that backlog (both publish phases'), each its
//     publisher's topics;
//   - latency: the publishers publish at a quarter of the lower of the two
//     rates for -duration, one message per call, and the consumers
//     record each message's time from its Publish call to its delivery
//     (p50, p99);
//   - idle: nothing is published for -duration; the consumers' claims,
//     heartbeats and idle polls go on.
//
// Each phase reads each node's CPU time (its group's usage), and its
// committed transactions (pg_stat_database). The table goes to -out
// (benchmarks/citus-scale.md from `make bench-citus`), with the machine's
// load average next to each run: the quotas cap each node, they do not
// reserve a core for it, so a node gets its quota only while the machine
// has room.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/simcluster"
)

const (
	childEnv = "PGLEASE_CITUSSCALE_CHILD"
	schema   = "bench"
	group    = "bench"
	// phaseLimit bounds a drain and the wait for the last delivery of
	// the latency phase.
	phaseLimit = 2 * time.Minute
)

// interrupted is cancelled by SIGINT or SIGTERM: the benchmark stops
// waiting and removes what it started.
var interrupted context.Context

func main() {
	if cfg := os.Getenv(childEnv); cfg != "" {
		os.Exit(runChild(cfg))
	}
	var stop context.CancelFunc
	interrupted, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run()
	stop()
	os.Exit(code)
}

type options struct {
	workers  []int
	plain    bool
	cpu      float64
	delay    time.Duration
	topics   int
	procs    int
	batch    int
	duration time.Duration
	out      string
	verbose  bool
	// route adds the routed publish phase on Citus.
	route bool
	// publishOnly stops after the publish phases.
	publishOnly bool
	// citusSettings are more settings for the Citus nodes.
	citusSettings map[string]string
}

func run() int {
	var (
		o       options
		workers string
	)
	flag.StringVar(&workers, "workers", "1,2,4", "the numbers of Citus workers to measure, comma-separated")
	flag.BoolVar(&o.plain, "plain", true, "measure one plain PostgreSQL first, at the same quota")
	flag.Float64Var(&o.cpu, "cpu", 0.1, "each node's and each client process's CPU quota, in CPUs")
	flag.DurationVar(&o.delay, "delay", 500*time.Microsecond, "the latency each node's proxy adds to each direction")
	flag.IntVar(&o.topics, "topics", 32, "the number of topics")
	flag.IntVar(&o.procs, "procs", 2, "publisher processes, and as many consumer processes, per node that holds data (plain PostgreSQL: 1 node)")
	flag.IntVar(&o.batch, "batch", 10, "messages per Publish call in the publish phase")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "the length of the publish, latency and idle phases")
	flag.StringVar(&o.out, "out", "citus-scale.md", "the results file (markdown); empty: standard output only")
	flag.BoolVar(&o.verbose, "v", false, "log each step")
	flag.BoolVar(&o.publishOnly, "publish-only", false, "run the publish phases only (no consume, latency, idle and heartbeat phases)")
	flag.BoolVar(&o.route, "route", true, "on Citus, publish a second time with PublisherConfig.RouteToWorkers (the publish, routed phase)")
	var citusSettings string
	flag.StringVar(&citusSettings, "citus-settings", "", "more settings for the Citus nodes, name=value,name=value (e.g. citus.max_adaptive_executor_pool_size=1)")
	flag.Parse()
	o.citusSettings = map[string]string{}
	for _, kv := range strings.Split(citusSettings, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			fmt.Fprintf(os.Stderr, "citusscale: -citus-settings %q: name=value pairs, comma-separated\n", citusSettings)
			return 2
		}
		o.citusSettings[k] = v
	}
	for _, f := range strings.Split(workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 16 {
			fmt.Fprintf(os.Stderr, "citusscale: -workers %q: numbers of workers from 1 to 16, comma-separated\n", workers)
			return 2
		}
		o.workers = append(o.workers, n)
	}
	if o.cpu <= 0 || o.topics < 1 || o.procs < 1 || o.batch < 1 || o.duration <= 0 || o.delay < 0 {
		fmt.Fprintln(os.Stderr, "citusscale: -cpu, -topics, -procs, -batch and -duration must be positive, -delay not negative")
		return 2
	}
	configs := slices.Clone(o.workers)
	if o.plain {
		configs = append([]int{0}, configs...)
	}
	var results []result
	for _, w := range configs {
		r, err := measure(o, w)
		if err != nil {
			fmt.Fprintf(os.Stderr, "citusscale: %s: %v\n", configName(w), err)
			return 1
		}
		fmt.Fprintln(os.Stderr, r.line())
		results = append(results, r)
	}
	report := render(o, results)
	fmt.Print(report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "citusscale:", err)
			return 1
		}
	}
	return 0
}

func configName(workers int) string {
	if workers == 0 {
		return "PostgreSQL"
	}
	return fmt.Sprintf("Citus, %d worker(s)", workers)
}

// phase is what one phase measured.
type phase struct {
	wall  time.Duration
	load  float64                  // the 1-minute load average at its end
	cpu   map[string]time.Duration // per node
	xacts map[string]int64         // committed transactions per node
	// sessions are the sessions (connections) each node started.
	sessions map[string]int64
	// client is the CPU time of the client processes together.
	client time.Duration
	// top are the statements that took the most time on each node.
	top map[string][]statement
}

// statement is a row of pg_stat_statements.
type statement struct {
	query   string
	calls   int64
	totalMs float64
}

// cores returns the node's CPU time as a fraction of the phase's wall
// time: the CPUs it used on average.
func (p phase) cores(node string) float64 { return p.cpu[node].Seconds() / p.wall.Seconds() }

type result struct {
	workers     int
	nodes       []string
	quotas      bool
	quotaNote   string
	publishRate float64
	// routedRate and rpub: the publish phase with RouteToWorkers (Citus
	// with -route; zero otherwise).
	routedRate     float64
	rpub           phase
	consumeRate    float64
	latencyRate    float64
	p50, p99       time.Duration
	latencyN       int
	pub, cons, lat phase
	idle           phase
	// beats: heartbeat-shaped UPDATEs of a reference table (Citus) or a
	// plain table, hbClients at a time.
	beats     phase
	beatCount int64
}

// hbClients is the number of connections that send heartbeats in the
// heartbeat phase.
const hbClients = 4

func (r result) line() string {
	return fmt.Sprintf("%s: published %.0f/s (routed %.0f/s), consumed %.0f/s, p50 %s p99 %s at %.0f/s (load %.2f/%.2f/%.2f/%.2f)",
		configName(r.workers), r.publishRate, r.routedRate, r.consumeRate, r.p50, r.p99, r.latencyRate, r.pub.load, r.rpub.load, r.cons.load, r.lat.load)
}

// measure runs the phases on a cluster of workers workers (0: plain
// PostgreSQL).
func measure(o options, workers int) (_ result, err error) {
	ctx := interrupted
	logf := func(string, ...any) {}
	if o.verbose {
		logf = func(format string, a ...any) { fmt.Fprintf(os.Stderr, "citusscale: "+format+"\n", a...) }
	}
	cluster, err := simcluster.Start(ctx, simcluster.Options{
		Workers: workers, CPU: o.cpu, Delay: o.delay, Logf: logf,
		Settings: settings(workers, o.citusSettings),
	})
	if err != nil {
		return result{}, err
	}
	defer func() {
		if cerr := cluster.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	r := result{workers: workers, quotas: cluster.Quotas, quotaNote: cluster.QuotaNote}
	for _, n := range cluster.Nodes {
		r.nodes = append(r.nodes, n.Name)
	}
	if err := setUp(ctx, cluster.DSN, workers > 0); err != nil {
		return r, err
	}
	// On the coordinator (or the server): Citus creates it on the workers.
	if err := execOn(ctx, cluster.DSN, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public"); err != nil {
		return r, err
	}

	nProcs := o.procs * max(1, workers)
	procTopics := make([][]string, nProcs)
	for i := range o.topics {
		procTopics[i%nProcs] = append(procTopics[i%nProcs], fmt.Sprintf("topic-%03d", i))
	}
	var pubs, subs []*child
	defer func() {
		for _, c := range append(pubs, subs...) {
			c.stop()
		}
	}()
	for i := range nProcs {
		for _, role := range []string{"pub", "sub"} {
			if len(procTopics[i]) == 0 {
				continue
			}
			c, err := startChild(cluster, childConfig{Role: role, DSN: cluster.DSN, Topics: procTopics[i], Verbose: o.verbose,
				Route: role == "pub" && workers > 0 && o.route},
				fmt.Sprintf("%s%d", role, i))
			if err != nil {
				return r, err
			}
			if role == "pub" {
				pubs = append(pubs, c)
			} else {
				subs = append(subs, c)
			}
		}
	}
	for _, c := range append(slices.Clone(pubs), subs...) {
		if _, err := c.expect("ready"); err != nil {
			return r, err
		}
	}
	clients := append(slices.Clone(pubs), subs...)

	// Warm up, unmeasured: each Publisher's first call per topic reads
	// the catalog and opens connections (the routed one a pool per
	// worker).
	warm, err := all(pubs, "warm 0 0", "done")
	if err != nil {
		return r, err
	}

	// Publish.
	m := startPhase(ctx, cluster, clients)
	counts, err := all(pubs, fmt.Sprintf("flat %d %d", o.duration, o.batch), "done")
	if err != nil {
		return r, err
	}
	for i, n := range warm {
		counts[i] += n // drained with the rest (not in the rates)
	}
	if r.pub, err = m.end(ctx); err != nil {
		return r, err
	}
	var published int64
	for i, n := range counts {
		published += n - warm[i]
	}
	r.publishRate = float64(published) / r.pub.wall.Seconds()
	logf("%s: published %d in %s", configName(workers), published, r.pub.wall)

	// Publish, routed to the workers.
	if workers > 0 && o.route {
		m = startPhase(ctx, cluster, clients)
		routed, err := all(pubs, fmt.Sprintf("rflat %d %d", o.duration, o.batch), "done")
		if err != nil {
			return r, err
		}
		if r.rpub, err = m.end(ctx); err != nil {
			return r, err
		}
		var n int64
		for i, c := range routed {
			n += c
			counts[i] += c
		}
		published += n
		r.routedRate = float64(n) / r.rpub.wall.Seconds()
		logf("%s: published %d routed in %s", configName(workers), n, r.rpub.wall)
	}

	if o.publishOnly {
		return r, nil
	}

	// Consume the backlog.
	m = startPhase(ctx, cluster, clients)
	for i, c := range subs {
		if err := c.send(fmt.Sprintf("drain %d", counts[i])); err != nil {
			return r, err
		}
	}
	if _, err := collect(subs, "drained"); err != nil {
		return r, err
	}
	if r.cons, err = m.end(ctx); err != nil {
		return r, err
	}
	r.consumeRate = float64(published) / r.cons.wall.Seconds()

	// Latency at a quarter of the lower rate, one message per call (a
	// call costs more than a tenth of a call of 10).
	r.latencyRate = min(r.publishRate, r.consumeRate) / 4
	perProc := r.latencyRate / float64(len(pubs))
	for _, c := range subs {
		if err := c.send("lat"); err != nil {
			return r, err
		}
		if _, err := c.expect("lat"); err != nil {
			return r, err
		}
	}
	m = startPhase(ctx, cluster, clients)
	sent, err := all(pubs, fmt.Sprintf("rate %f %d", perProc, o.duration), "done")
	if err != nil {
		return r, err
	}
	for i, c := range subs {
		if err := c.send(fmt.Sprintf("wait %d", sent[i])); err != nil {
			return r, err
		}
	}
	if _, err := collect(subs, "waited"); err != nil {
		return r, err
	}
	if r.lat, err = m.end(ctx); err != nil {
		return r, err
	}
	var lat []time.Duration
	for _, c := range subs {
		if err := c.send("report"); err != nil {
			return r, err
		}
		line, err := c.expect("latencies")
		if err != nil {
			return r, err
		}
		for _, f := range strings.Fields(line)[1:] {
			ns, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return r, fmt.Errorf("%s: %q: %w", c.name, line, err)
			}
			lat = append(lat, time.Duration(ns))
		}
	}
	slices.Sort(lat)
	r.latencyN = len(lat)
	if len(lat) > 0 {
		r.p50 = lat[len(lat)/2].Round(10 * time.Microsecond)
		r.p99 = lat[len(lat)*99/100].Round(10 * time.Microsecond)
	}

	// Idle.
	m = startPhase(ctx, cluster, clients)
	select {
	case <-time.After(o.duration):
	case <-interrupted.Done():
		return r, errors.New("interrupted")
	}
	if r.idle, err = m.end(ctx); err != nil {
		return r, err
	}
	for _, c := range clients {
		c.stop()
	}

	// Heartbeats: what a beat costs each node.
	if r.beats, r.beatCount, err = heartbeats(ctx, cluster, workers > 0, o.duration); err != nil {
		return r, fmt.Errorf("heartbeats: %w", err)
	}
	return r, nil
}

// heartbeats runs UPDATEs shaped as pglease's heartbeat (one row by
// primary key, its expiry moved) from hbClients connections for d, on a
// table of 100 rows at fillfactor 10 as the sessions table: a reference
// table on Citus (written on every node, in two phases), a plain table
// otherwise.
func heartbeats(ctx context.Context, c *simcluster.Cluster, citus bool, d time.Duration) (phase, int64, error) {
	pool, err := pgxpool.New(ctx, c.DSN)
	if err != nil {
		return phase{}, 0, err
	}
	defer pool.Close()
	setup := `CREATE TABLE bench.beats (id int PRIMARY KEY, expires_at timestamptz NOT NULL) WITH (fillfactor = 10);
		INSERT INTO bench.beats SELECT i, now() FROM generate_series(1, 100) i;`
	if citus {
		setup += `SELECT create_reference_table('bench.beats');`
	}
	if _, err := pool.Exec(ctx, setup); err != nil {
		return phase{}, 0, err
	}
	m := startPhase(ctx, c, nil)
	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)
	errs := make(chan error, hbClients)
	end := time.Now().Add(d)
	for i := range hbClients {
		wg.Go(func() {
			for j := 0; time.Now().Before(end); j++ {
				if _, err := pool.Exec(ctx, `UPDATE bench.beats SET expires_at = now() + interval '10 s' WHERE id = $1`, 1+(i*25+j)%100); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return phase{}, 0, err
	}
	p, err := m.end(ctx)
	return p, n.Load(), err
}

// settings are the servers' settings: pg_stat_statements on every node,
// for the statements each phase ran there.
func settings(workers int, citus map[string]string) map[string]string {
	preload := "pg_stat_statements"
	if workers > 0 {
		preload = "citus,pg_stat_statements" // citus first, as it requires
	}
	s := map[string]string{
		"max_connections":           "400",
		"shared_preload_libraries":  preload,
		"pg_stat_statements.track":  "all", // the statements of functions too
		"pg_stat_statements.max":    "1000",
		"track_activity_query_size": "4096",
	}
	if workers > 0 {
		for k, v := range citus {
			s[k] = v
		}
	}
	return s
}

func setUp(ctx context.Context, dsn string, citus bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables := pglease.Tables{Schema: schema}
	if err := pglease.Migrate(ctx, pool, tables); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if citus {
		if _, err := pool.Exec(ctx, pglease.DistributeSQL(tables)); err != nil {
			return fmt.Errorf("distribute: %w", err)
		}
	}
	return nil
}

// meter measures one phase.
type meter struct {
	cluster *simcluster.Cluster
	clients []*child
	began   time.Time
	cpu0    map[string]time.Duration
	xacts0  map[string]int64
	sess0   map[string]int64
	client0 time.Duration
	err     error
}

func startPhase(ctx context.Context, c *simcluster.Cluster, clients []*child) *meter {
	m := &meter{cluster: c, clients: clients}
	for _, n := range c.Nodes {
		if m.err == nil {
			m.err = execOn(ctx, n.DSN, "SELECT public.pg_stat_statements_reset()")
		}
	}
	if m.err == nil {
		m.xacts0, m.sess0, m.err = xacts(ctx, c)
	}
	if m.err == nil {
		m.cpu0, m.err = c.Usage()
	}
	m.client0 = clientUsage(clients)
	m.began = time.Now()
	return m
}

func (m *meter) end(ctx context.Context) (phase, error) {
	p := phase{wall: time.Since(m.began), load: load()}
	if m.err != nil {
		return p, m.err
	}
	cpu, err := m.cluster.Usage()
	if err != nil {
		return p, err
	}
	p.client = clientUsage(m.clients) - m.client0
	x, sess, err := xacts(ctx, m.cluster)
	if err != nil {
		return p, err
	}
	p.cpu, p.xacts, p.sessions = map[string]time.Duration{}, map[string]int64{}, map[string]int64{}
	for k, v := range sess {
		p.sessions[k] = v - m.sess0[k] - 3 // the benchmark's own: these reads and the statements' reset
	}
	for k, v := range cpu {
		p.cpu[k] = v - m.cpu0[k]
	}
	for k, v := range x {
		p.xacts[k] = v - m.xacts0[k]
	}
	p.top = map[string][]statement{}
	for _, n := range m.cluster.Nodes {
		if p.top[n.Name], err = topStatements(ctx, n.DSN); err != nil {
			return p, fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return p, nil
}

// topStatements returns the statements that took the most time since the
// last reset, the benchmark's own reads left out.
func topStatements(ctx context.Context, dsn string) ([]statement, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pg_catalog.regexp_replace(query, '\s+', ' ', 'g'), calls, total_exec_time
		FROM public.pg_stat_statements
		WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_database%'
		ORDER BY total_exec_time DESC LIMIT 6`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (statement, error) {
		var s statement
		err := r.Scan(&s.query, &s.calls, &s.totalMs)
		return s, err
	})
}

func execOn(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// xacts returns each node's committed transactions and the sessions it
// started so far, its own reads included.
func xacts(ctx context.Context, c *simcluster.Cluster) (map[string]int64, map[string]int64, error) {
	out, sessions := map[string]int64{}, map[string]int64{}
	for _, n := range c.Nodes {
		conn, err := pgx.Connect(ctx, n.DSN)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		var x, sess int64
		// The counters are sent to the statistics collector at the end
		// of each transaction, at most every 500 ms by default (PG 15: at
		// most once a second); pg_stat_force_next_flush is 15's, and the
		// snapshot of this session is cleared first.
		err = conn.QueryRow(ctx, `SELECT pg_catalog.pg_stat_clear_snapshot(), xact_commit, sessions
			FROM pg_catalog.pg_stat_database WHERE datname = current_database()`).Scan(nil, &x, &sess)
		_ = conn.Close(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		out[n.Name], sessions[n.Name] = x, sess
	}
	return out, sessions, nil
}

func clientUsage(clients []*child) time.Duration {
	var d time.Duration
	for _, c := range clients {
		if u, err := c.group.Usage(); err == nil {
			d += u
		}
	}
	return d
}

// load returns the machine's 1-minute load average.
func load() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		return -1
	}
	return f
}

// all sends cmd to every child and collects the number each answers with
// the word want.
func all(cs []*child, cmd, want string) ([]int64, error) {
	for _, c := range cs {
		if err := c.send(cmd); err != nil {
			return nil, err
		}
	}
	return collect(cs, want)
}

func collect(cs []*child, want string) ([]int64, error) {
	out := make([]int64, len(cs))
	for i, c := range cs {
		line, err := c.expect(want)
		if err != nil {
			return nil, err
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s: %q: want %q and a number", c.name, line, want)
		}
		if out[i], err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", c.name, line, err)
		}
	}
	return out, nil
}

// child is a client process.
type child struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	group interface {
		Usage() (time.Duration, error)
	}
	once sync.Once
}

func startChild(cluster *simcluster.Cluster, cfg childConfig, name string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	g, err := cluster.ClientGroup(name)
	if err != nil {
		return nil, err
	}
	c := &child{name: name, group: g, lines: make(chan string, 16)}
	c.cmd = exec.Command(self)
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	c.cmd.Stderr = os.Stderr
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	if err := g.Add(c.cmd.Process.Pid); err != nil {
		c.stop()
		return nil, err
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

func (c *child) send(cmd string) error {
	if _, err := io.WriteString(c.in, cmd+"\n"); err != nil {
		return fmt.Errorf("%s: send %q: %w", c.name, cmd, err)
	}
	return nil
}

// expect waits for the child's next line, which must start with want.
func (c *child) expect(want string) (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("%s: exited while the benchmark waited for %q", c.name, want)
		}
		if line != want && !strings.HasPrefix(line, want+" ") {
			return "", fmt.Errorf("%s: said %q, expected %q", c.name, line, want)
		}
		return line, nil
	case <-time.After(phaseLimit):
		return "", fmt.Errorf("%s: no %q within %s", c.name, want, phaseLimit)
	case <-interrupted.Done():
		return "", fmt.Errorf("%s: interrupted while waiting for %q", c.name, want)
	}
}

// stop closes the child's input (it exits) and waits for it, killing it
// after 30 s.
func (c *child) stop() {
	c.once.Do(func() {
		_ = c.in.Close()
		done := make(chan struct{})
		go func() {
			for range c.lines { //nolint:revive // drain
			}
			close(done)
		}()
		timer := time.AfterFunc(30*time.Second, func() { _ = c.cmd.Process.Kill() })
		<-done
		_ = c.cmd.Wait()
		timer.Stop()
	})
}
