// Command benchmarks measures pglease side by side with the official
// watermill-sql backend (v4 with its pgx adapter, PostgreSQL schema and
// offsets adapters) on the same PostgreSQL server, and with the brokers a
// team would weigh it against (the peers: NATS JetStream and
// Redis Streams, peers.go), and reports medians and ratios from one run.
//
// Each workload runs for several rounds; in every round each backend runs
// once, each PostgreSQL backend in a fresh, empty PostgreSQL schema and
// each broker on a fresh server of its own, and the order alternates from
// round to round, so that noise from other work on the machine falls on
// all alike. Workloads that watermill-sql has no counterpart for (how a
// consumer group splits its topics, one Subscriber on 100,000 topics) run
// pglease alone; some of them run the benchmark binary again as a child
// process (child.go). The brokers run the publish, drain, latency and
// Router workloads; the limits of the PostgreSQL server itself (COPY,
// INSERT … SELECT, single-row commits; limits.go) are a workload of their
// own. The tables are printed to standard output and, unless told
// otherwise, written to results.md with a bar chart of the ratios in
// results.svg; every backend's durability is stated next to its numbers.
//
// Usage (from the repository root, with a throwaway PostgreSQL):
//
//	make bench
//
// or against a database of your own:
//
//	cd benchmarks && PGLEASE_TEST_DSN=postgres://... go run . [flags]
//
// The database comes from -dsn, else PGLEASE_TEST_DSN, else DATABASE_URL.
// Every schema the program creates is named pglease_bench_* and dropped
// again. -peers chooses the brokers (default: all); NATS runs embedded in
// this process, Redis needs a redis-server program (`make bench` installs
// Debian's with scripts/install-deps.sh redis; without one, Redis is left out
// and the report says so). -quick (or PGLEASE_BENCH_QUICK=1) runs one
// short round of each workload for development; it writes no files unless
// -out is given.
//
// With -pgbouncer (default: PGLEASE_BENCH_PGBOUNCER_DSN, else
// PGLEASE_TEST_PGBOUNCER_DSN, which `make bench` sets to the PgBouncer that
// localpg (internal/cmd/localpg) starts), the publish and drain workloads also run on
// pglease with its pool going through that PgBouncer in transaction mode,
// in the same rounds; the table shows those rows under the direct ones
// (pgbouncer.go). -pgbouncer= turns them off.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// config holds the knobs of one run. Their defaults are the workloads
// the results are published for; -quick shrinks them.
type config struct {
	dsn        string
	rounds     int
	quick      bool
	only       []string
	conns      int
	out        string
	cpuProfile string
	statements bool
	verbose    bool
	// pgbouncerDSN: the publish and drain workloads also run on pglease
	// through this PgBouncer (pgbouncer.go); empty: they do not.
	pgbouncerDSN string
	// peers are the ids of the brokers that run the workloads marked
	// peers (peers.go), in the order of peers.
	peers []string
	// redisServer is -redis-server: the program of the Redis peer; empty:
	// found on PATH or in /usr/bin.
	redisServer string

	publishers     int
	publishFor     time.Duration
	batchSize      int
	backlog        int
	latencyRate    int
	latencyFor     time.Duration
	idleTopics     int
	idleSettle     time.Duration
	idleFor        time.Duration
	routerMessages int
	txMessages     int
	// inflightFor is about how long each level of the inflight
	// workload handles messages (inflight.go).
	inflightFor time.Duration

	// The consumer-group workloads (group.go).
	groupWindow time.Duration
	groupSettle time.Duration
	memberConns int
	manyTopics  []int

	// The retention workload (retention.go).
	retentionFor        time.Duration
	retentionTTL        time.Duration
	retentionPublishers int
	retentionMaxLag     int

	// The held-horizon workload (horizon.go).
	horizonFor     time.Duration
	horizonWindow  time.Duration
	horizonRate    int
	horizonMembers int
	horizonHold    bool
}

// defaultGroupWindow is ten heartbeats at the default SessionTTL: every
// timer of an idle Subscriber (heartbeat every SessionTTL/3, idle poll
// every PollInterval, expired-session clean-up every tenth heartbeat) runs
// a whole number of times in it, whatever its phase.
const defaultGroupWindow = 10 * pglease.DefaultSessionTTL / 3

// defaultManyTopics are the sizes of the many-topics workloads.
var defaultManyTopics = []int{10_000, 100_000}

func parseFlags(args []string) (config, error) {
	var c config
	var only, peerList string
	fs := flag.NewFlagSet("benchmarks", flag.ContinueOnError)
	fs.StringVar(&c.dsn, "dsn", "", "PostgreSQL URL (default: $PGLEASE_TEST_DSN, else $DATABASE_URL)")
	fs.IntVar(&c.rounds, "rounds", 3, "rounds per workload; each round runs both backends once")
	fs.BoolVar(&c.quick, "quick", os.Getenv("PGLEASE_BENCH_QUICK") != "", "one short round of each workload, smaller sizes, no files written unless -out is set (also PGLEASE_BENCH_QUICK=1)")
	fs.StringVar(&only, "only", "", "comma-separated workloads to run: "+strings.Join(workloadIDs(config{manyTopics: defaultManyTopics}), ","))
	fs.IntVar(&c.conns, "conns", 64, "maximum connections of each backend's pool (the same for both)")
	fs.StringVar(&c.out, "out", ".", "directory for results.md and results.svg; empty: write nothing")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "directory for a CPU profile of every measured run (WORKLOAD-BACKEND-rN.pprof)")
	fs.BoolVar(&c.statements, "statements", false, "print the busiest statements (pg_stat_statements) of each backend in the first round of each workload")
	fs.BoolVar(&c.verbose, "v", false, "log the backends' info messages to standard error")
	fs.StringVar(&peerList, "peers", strings.Join(peerIDs(), ","), "comma-separated brokers that run the publish, drain, latency and Router workloads side by side with pglease and watermill-sql: "+strings.Join(peerIDs(), ",")+"; empty: none")
	fs.StringVar(&c.redisServer, "redis-server", "", "the redis-server program of the Redis peer (default: redis-server on PATH, else /usr/bin/redis-server)")
	fs.StringVar(&c.pgbouncerDSN, "pgbouncer", defaultPgBouncerDSN(), "URL of a PgBouncer in transaction mode in front of the server of -dsn, same user: the publish and drain workloads also run on pglease through it (default: $PGLEASE_BENCH_PGBOUNCER_DSN, else $PGLEASE_TEST_PGBOUNCER_DSN, which `make bench` sets); empty: they do not")

	fs.IntVar(&c.publishers, "publishers", 64, "goroutines of the concurrent publish workload")
	fs.DurationVar(&c.publishFor, "publish-for", 5*time.Second, "duration of each publish measurement")
	fs.IntVar(&c.batchSize, "batch", 100, "messages per Publish call of the batch workload")
	fs.IntVar(&c.backlog, "backlog", 100_000, "messages of the drain workload's backlog")
	fs.IntVar(&c.latencyRate, "latency-rate", 100, "messages per second of the latency workload")
	fs.DurationVar(&c.latencyFor, "latency-for", 10*time.Second, "duration of the latency workload")
	fs.IntVar(&c.idleTopics, "idle-topics", 1000, "subscribed topics of the idle workload")
	fs.DurationVar(&c.idleSettle, "idle-settle", 3*time.Second, "wait after the last Subscribe before the idle window opens")
	fs.DurationVar(&c.idleFor, "idle-for", 10*time.Second, "length of the idle window")
	fs.IntVar(&c.routerMessages, "router-messages", 20_000, "messages the Router workload consumes")
	fs.IntVar(&c.txMessages, "tx-messages", 20_000, "messages each handler of the tx-handler workload consumes")
	fs.DurationVar(&c.inflightFor, "inflight-for", 3*time.Second, "about how long each level of the inflight workload handles messages at the ideal rate")
	fs.DurationVar(&c.groupWindow, "group-window", defaultGroupWindow, "length of the idle windows of the consumer-group workloads (default: 10 heartbeats at the default SessionTTL)")
	fs.DurationVar(&c.groupSettle, "group-settle", 11*time.Second, "wait after the load of a consumer-group workload settled before its idle window opens (at least 1.1s); pg_stat_database hears of a backend's transactions up to 10s late")
	fs.IntVar(&c.memberConns, "member-conns", 16, "maximum connections of the pool of each group member (the same for both backends; 10 members of -conns would pass a default max_connections)")
	fs.DurationVar(&c.retentionFor, "retention-for", 3*time.Minute, "how long each case of the retention workload publishes and drains")
	fs.DurationVar(&c.retentionTTL, "retention", 5*time.Second, "the retention of the retention workload's topic")
	fs.IntVar(&c.retentionPublishers, "retention-publishers", 4, "publishing goroutines of the retention workload (batches of -batch)")
	fs.IntVar(&c.retentionMaxLag, "retention-max-lag", 50_000, "the retention workload's publishers pause while more messages than this are unacked, so that the drain keeps up; 0: never")
	fs.DurationVar(&c.horizonFor, "horizon-for", 10*time.Minute, "how long the held-horizon workload consumes with the transaction open")
	fs.DurationVar(&c.horizonWindow, "horizon-window", time.Minute, "the held-horizon workload's throughput windows: its first and its last")
	fs.IntVar(&c.horizonRate, "horizon-rate", 1000, "messages per second the held-horizon workload publishes, over all its topics")
	fs.IntVar(&c.horizonMembers, "horizon-members", 4, "Subscribers of the consumer group of the held-horizon workload")
	fs.BoolVar(&c.horizonHold, "horizon-hold", true, "hold the transaction in the held-horizon workload; false runs the same load without it, as a control")
	manyTopics := intList(defaultManyTopics)
	fs.Var(&manyTopics, "many-topics", "comma-separated topic counts of the many-topics workloads (one Subscriber, one process each)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.quick {
		quick := map[string]func(){
			"rounds":          func() { c.rounds = 1 },
			"out":             func() { c.out = "" },
			"publish-for":     func() { c.publishFor = time.Second },
			"backlog":         func() { c.backlog = 10_000 },
			"latency-for":     func() { c.latencyFor = 3 * time.Second },
			"idle-topics":     func() { c.idleTopics = 100 },
			"idle-settle":     func() { c.idleSettle = 2 * time.Second },
			"idle-for":        func() { c.idleFor = 3 * time.Second },
			"router-messages": func() { c.routerMessages = 2_000 },
			"tx-messages":     func() { c.txMessages = 2_000 },
			"inflight-for":    func() { c.inflightFor = time.Second },
			"group-window":    func() { c.groupWindow = 3 * time.Second },
			"group-settle":    func() { c.groupSettle = 2 * time.Second },
			"many-topics":     func() { manyTopics = intList{1_000, 10_000} },
			"retention-for":   func() { c.retentionFor = 20 * time.Second },
			"horizon-for":     func() { c.horizonFor = time.Minute },
			"horizon-window":  func() { c.horizonWindow = 15 * time.Second },
		}
		for name, apply := range quick {
			if !set[name] {
				apply()
			}
		}
	}
	c.manyTopics = slices.Compact(slices.Sorted(slices.Values(manyTopics)))
	if c.dsn == "" {
		c.dsn = os.Getenv("PGLEASE_TEST_DSN")
	}
	if c.dsn == "" {
		c.dsn = os.Getenv("DATABASE_URL")
	}
	if c.dsn == "" {
		return c, errors.New("no database: set PGLEASE_TEST_DSN or DATABASE_URL, pass -dsn, or run `make bench` from the repository root, which starts a throwaway PostgreSQL")
	}
	var err error
	if c.peers, err = parsePeers(peerList); err != nil {
		return c, err
	}
	if only != "" {
		for _, id := range strings.Split(only, ",") {
			id = strings.TrimSpace(id)
			if !slices.Contains(workloadIDs(c), id) {
				return c, fmt.Errorf("-only: unknown workload %q (known: %s)", id, strings.Join(workloadIDs(c), ", "))
			}
			c.only = append(c.only, id)
		}
	}
	switch {
	case c.rounds < 1:
		return c, errors.New("-rounds must be at least 1")
	case c.conns < 1 || c.memberConns < 1:
		return c, errors.New("-conns and -member-conns must be at least 1")
	case c.publishers < 1 || c.batchSize < 1 || c.backlog < 1 || c.latencyRate < 1 || c.idleTopics < 1 || c.routerMessages < 1 || c.txMessages < 1:
		return c, errors.New("-publishers, -batch, -backlog, -latency-rate, -idle-topics, -router-messages and -tx-messages must be at least 1")
	case c.publishFor <= 0 || c.latencyFor <= 0 || c.idleFor <= 0 || c.idleSettle < 0 || c.inflightFor <= 0:
		return c, errors.New("-publish-for, -latency-for, -idle-for and -inflight-for must be positive, -idle-settle not negative")
	case c.groupWindow <= 0 || c.groupSettle < 0:
		return c, errors.New("-group-window must be positive, -group-settle not negative")
	case len(c.manyTopics) == 0 || c.manyTopics[0] < 1:
		return c, errors.New("-many-topics must list at least one count, each at least 1")
	}
	if err := checkRetentionFlags(c); err != nil {
		return c, err
	}
	if err := checkHorizonFlags(c); err != nil {
		return c, err
	}
	return c, nil
}

// defaultPgBouncerDSN is the default of -pgbouncer.
func defaultPgBouncerDSN() string {
	if dsn := os.Getenv("PGLEASE_BENCH_PGBOUNCER_DSN"); dsn != "" {
		return dsn
	}
	return os.Getenv("PGLEASE_TEST_PGBOUNCER_DSN")
}

// env is what every workload shares: the configuration and an
// administrative pool for set-up, statistics and clean-up.
type env struct {
	cfg      config
	database string // the run's own database; empty: the one of cfg.dsn
	admin    *pgxpool.Pool
	// server reads pg_stat_database from outside the run's database, so
	// that the reads are not counted among the transactions they measure;
	// it is admin when the run has no database of its own.
	server *pgxpool.Pool
	stats  bool // pg_stat_statements can be read
	logger watermill.LoggerAdapter
	// redisServer is the redis-server program of the Redis peer, when it
	// runs.
	redisServer string
}

func (e *env) log(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func main() {
	if os.Getenv(childEnv) != "" {
		// A member process of a consumer-group workload (child.go).
		os.Exit(runChild())
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	e := &env{cfg: cfg, logger: watermill.NopLogger{}}
	if cfg.verbose {
		e.logger = watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	}
	bootstrap, err := newAdminPool(ctx, e)
	if err != nil {
		return err
	}
	defer bootstrap.Close()
	// A database of its own keeps the statistics of this run apart from
	// anything else on the server, and lets the idle workload clear this
	// database's pg_stat_statements entries (those of dropped schemas would
	// otherwise fill the view and push out live entries mid-measurement).
	// Without the privilege to create one, the run uses the given database.
	name := fmt.Sprintf("pglease_bench_%d_%d", time.Now().Unix(), os.Getpid())
	if _, err := bootstrap.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		e.log("cannot create a database for the run (%v); using the given one", err)
	} else {
		e.database = name
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if _, err := bootstrap.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				e.log("drop database %s: %v", name, err)
			}
		}()
	}
	admin := bootstrap
	if e.database != "" {
		if admin, err = newAdminPool(ctx, e); err != nil {
			return err
		}
		defer admin.Close()
	}
	e.admin = admin
	e.server = bootstrap

	e.stats, err = enableStatements(ctx, admin)
	if err != nil {
		e.log("pg_stat_statements is not available (%v); idle load is counted in transactions (pg_stat_database) instead", err)
	}
	info, err := collectMachineInfo(ctx, e)
	if err != nil {
		return err
	}
	if cfg.pgbouncerDSN != "" {
		if info.pgbouncer, err = checkPgBouncer(ctx, e); err != nil {
			return err
		}
		e.log("the publish and drain workloads also run on pglease through %s at %s", info.pgbouncer, pgbouncerAddr(cfg.pgbouncerDSN))
	}
	if slices.Contains(e.cfg.peers, "redis") {
		if err := e.findRedis(&info); err != nil {
			e.log("Redis Streams left out: %v", err)
			info.skipped = map[string]string{redisName: err.Error()}
			e.cfg.peers = slices.DeleteFunc(slices.Clone(e.cfg.peers), func(id string) bool { return id == "redis" })
		}
	}
	e.log("PostgreSQL %s (%s), Go %s, %d cores; %d round(s)%s", info.postgres, info.settings, info.goVersion, info.cores, cfg.rounds, map[bool]string{true: " (quick mode)"}[cfg.quick])
	if len(e.cfg.peers) > 0 {
		e.log("peers: %s", strings.Join(e.cfg.peers, ", "))
	}

	res := newResults()
	failed := false
	for _, w := range selectedWorkloads(cfg) {
		for round := 1; round <= cfg.rounds; round++ {
			for _, b := range roundOrder(w, e.cfg, round) {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted: %w", context.Cause(ctx))
				}
				vals, err := runOne(ctx, e, w, b, round)
				if err != nil {
					e.log("%s, round %d, %s: FAILED: %v", w.id, round, b.name(), err)
					res.fail(w, b.name(), err)
					failed = true
					continue
				}
				res.add(w, b.name(), vals)
				e.log("%s, round %d, %s: %s", w.id, round, b.name(), w.describe(vals))
			}
		}
	}

	rows := res.rows(cfg)
	fmt.Println()
	printTable(os.Stdout, rows)
	pr := newPeerReport(e.cfg, res, info)
	if pr.any() {
		fmt.Println()
		pr.print(os.Stdout)
	}
	if cfg.out != "" {
		md, svg, err := writeReports(cfg.out, e.cfg, rows, pr, res, info)
		if err != nil {
			return err
		}
		e.log("wrote %s and %s", md, svg)
	}
	if failed {
		return errors.New("some runs failed (see above)")
	}
	return nil
}

func newAdminPool(ctx context.Context, e *env) (*pgxpool.Pool, error) {
	pc, err := e.poolConfig()
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// poolConfig parses the database URL for a pgxpool, in the run's own
// database when there is one.
func (e *env) poolConfig() (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(e.cfg.dsn)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	if e.database != "" {
		pc.ConnConfig.Database = e.database
	}
	return pc, nil
}

// connConfig is poolConfig for a single connection.
func (e *env) connConfig() (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(e.cfg.dsn)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	if e.database != "" {
		cc.Database = e.database
	}
	return cc, nil
}

// runOne runs workload w once on backend b in a fresh schema of its own,
// which is dropped afterwards.
func runOne(ctx context.Context, e *env, w workload, b backend, round int) (map[string]float64, error) {
	ns := fmt.Sprintf("pglease_bench_%s_%s_r%d", strings.ReplaceAll(w.id, "-", "_"), b.short(), round)
	// A stale schema of an interrupted run would not be an empty start.
	if err := dropSchema(ctx, e.admin, ns); err != nil {
		return nil, err
	}
	h, err := b.open(ctx, e, ns)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		t0 := time.Now()
		if err := h.close(cctx); err != nil {
			e.log("clean-up of schema %s: %v", ns, err)
		}
		// The catalog rows of the dropped tables (thousands for
		// watermill-sql's idle workloads) are vacuumed now: autovacuum
		// would do it during the next run, and its transactions count in
		// pg_stat_database, which the idle-group workload measures. Only
		// in a database of the run's own: it holds nothing else.
		if e.database != "" {
			if _, err := e.admin.Exec(cctx, "VACUUM (ANALYZE)"); err != nil {
				e.log("vacuum after dropping schema %s: %v", ns, err)
			}
		}
		if d := time.Since(t0); d > 2*time.Second {
			e.log("clean-up of schema %s took %s", ns, d.Round(time.Millisecond))
		}
	}()
	// Start each run with no dirty buffers left over from the previous one.
	_, _ = e.admin.Exec(ctx, "CHECKPOINT")

	timeout := w.timeout
	if timeout == 0 {
		timeout = defaultRunTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var before statSnapshot
	profileStatements := e.cfg.statements && e.stats && round == 1
	if profileStatements {
		if before, err = takeStatements(wctx, e.admin); err != nil {
			return nil, err
		}
	}
	stopProfile, err := startCPUProfile(e.cfg.cpuProfile, fmt.Sprintf("%s-%s-r%d", w.id, b.short(), round))
	if err != nil {
		return nil, err
	}
	vals, err := w.run(wctx, e, h)
	stopProfile()
	if err != nil {
		return nil, err
	}
	if ph, ok := h.(*pgleaseHandle); ok && ph.verify != nil {
		if err := ph.verify(); err != nil {
			return nil, err
		}
	}
	if profileStatements {
		after, err := takeStatements(wctx, e.admin)
		if err != nil {
			return nil, err
		}
		printTopStatements(os.Stderr, fmt.Sprintf("%s, %s", w.id, b.name()), before, after, 8)
	}
	return vals, nil
}

// intList is a flag of comma-separated integers.
type intList []int

func (l *intList) String() string {
	var parts []string
	for _, n := range *l {
		parts = append(parts, strconv.Itoa(n))
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	var out intList
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.ReplaceAll(strings.TrimSpace(part), "_", ""))
		if err != nil {
			return fmt.Errorf("not a number: %q", part)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}
