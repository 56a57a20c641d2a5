package pglease_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// BenchmarkCitusIdlePoll measures what an idle Subscriber of many topics
// costs each node of the Citus cluster of `make test-citus`: one
// Subscriber of PGLEASE_IDLE_TOPICS topics (1,000 by default), every one
// claimed and nothing published, for PGLEASE_IDLE_WINDOW (20 s), at the
// default PollInterval (1 s). It runs twice, on two schemas: first with
// the workers' idle-poll function dropped from every node (tables
// distributed by an earlier release: a SELECT per topic each poll), then
// as distributed (a statement per worker each poll). For each node it
// logs the statements per second that name the schema (pg_stat_statements
// calls, top level) and their execution time per second, and the
// transactions per second of the database (pg_stat_database); the
// coordinator's statements per second are reported as metrics. Without
// pg_stat_statements loaded on every node, transactions only.
//
//	go run ./internal/cmd/localcitus -set shared_preload_libraries=citus,pg_stat_statements -- \
//		go test -run '^$' -bench CitusIdlePoll -benchtime 1x .
func BenchmarkCitusIdlePoll(b *testing.B) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		b.Skip("needs a Citus cluster: run under internal/cmd/localcitus")
	}
	topics, window := 1000, 20*time.Second
	if v := os.Getenv("PGLEASE_IDLE_TOPICS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		topics = n
	}
	if v := os.Getenv("PGLEASE_IDLE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err)
		window = d
	}
	var perRow, perWorker float64
	for range b.N {
		citusIdleCost(b, 0, window, false) // the cluster alone
		perRow = citusIdleCost(b, topics, window, true)
		perWorker = citusIdleCost(b, topics, window, false)
	}
	b.ReportMetric(perRow, "coordinator-stmts/s-per-topic-poll")
	b.ReportMetric(perWorker, "coordinator-stmts/s-per-worker-poll")
}

// idleNode is one node's counters.
type idleNode struct {
	name       string
	conn       *pgx.Conn
	statements bool    // pg_stat_statements readable
	calls      int64   // statements that name the schema
	execMs     float64 // their execution time
	all        int64   // every statement but the benchmark's own reads
	commits    int64
	byQuery    map[int64]idleQuery
	postmaster int     // the node's postmaster's process id (0: not readable)
	cpu        float64 // seconds of CPU of the node's processes so far
}

// idleQuery is a statement's calls so far, and its text.
type idleQuery struct {
	calls int64
	text  string
}

func (n *idleNode) read(b *testing.B, ctx context.Context, schema string) {
	b.Helper()
	n.cpu = nodeCPU(n.postmaster)
	require.NoError(b, n.conn.QueryRow(ctx, `SELECT xact_commit FROM pg_catalog.pg_stat_database
		WHERE datname = pg_catalog.current_database()`).Scan(&n.commits))
	if !n.statements {
		return
	}
	rows, err := n.conn.Query(ctx, `SELECT queryid, calls, total_exec_time, query LIKE '%' || $1 || '%',
			pg_catalog.left(pg_catalog.regexp_replace(query, '\s+', ' ', 'g'), 90)
		FROM public.pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
			AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_database%'`, schema)
	require.NoError(b, err)
	defer rows.Close()
	n.calls, n.execMs, n.all, n.byQuery = 0, 0, 0, map[int64]idleQuery{}
	for rows.Next() {
		var (
			id, calls int64
			ms        float64
			named     bool
			text      string
		)
		require.NoError(b, rows.Scan(&id, &calls, &ms, &named, &text))
		n.all += calls
		if named {
			n.calls += calls
			n.execMs += ms
		}
		q := n.byQuery[id]
		n.byQuery[id] = idleQuery{calls: q.calls + calls, text: text}
	}
	require.NoError(b, rows.Err())
}

// busiest returns the statements called most between before and n, at
// most k, as "calls/s text" lines.
func (n *idleNode) busiest(before *idleNode, elapsed float64, k int) []string {
	type row struct {
		calls int64
		text  string
	}
	var rows []row
	for id, q := range n.byQuery {
		if d := q.calls - before.byQuery[id].calls; d > 0 {
			rows = append(rows, row{d, q.text})
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.calls - a.calls) })
	var out []string
	for i, r := range rows {
		if i == k {
			break
		}
		out = append(out, fmt.Sprintf("%7.1f/s  %s", float64(r.calls)/elapsed, r.text))
	}
	return out
}

// citusIdleCost runs one idle Subscriber of n topics on a schema of its
// own and logs what it costs each node during window; perTopic drops
// the workers' idle-poll function first. It returns the coordinator's
// statements per second.
func citusIdleCost(b *testing.B, n int, window time.Duration, perTopic bool) float64 {
	pool, adapter := citusSchema(b, 8)
	ctx, cancel := context.WithTimeout(context.Background(), window+5*time.Minute)
	defer cancel()
	mode := "a statement per worker each poll"
	switch {
	case n == 0:
		mode = "no Subscriber: the cluster alone"
	case perTopic:
		mode = "a statement per topic each poll (the earlier release)"
		fn := pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable + "_worker_visible"}.Sanitize() + "(text[], integer[], text[], bigint[])"
		_, err := pool.Exec(ctx, `SELECT pg_catalog.run_command_on_workers($1)`, `DROP FUNCTION `+fn)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `SET citus.enable_ddl_propagation = off; DROP FUNCTION `+fn+`; RESET citus.enable_ddl_propagation`)
		require.NoError(b, err)
	}
	nodes := []*idleNode{{name: "coordinator", conn: connectTo(b, ctx, os.Getenv("PGLEASE_TEST_DSN"))}}
	for i, dsn := range strings.Fields(os.Getenv("PGLEASE_TEST_CITUS_WORKERS")) {
		nodes = append(nodes, &idleNode{name: fmt.Sprintf("worker %d", i+1), conn: connectTo(b, ctx, dsn)})
	}
	_, err := nodes[0].conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public`)
	if err != nil {
		b.Logf("no pg_stat_statements (%v): transactions only", err)
	}
	for _, node := range nodes {
		var backend int
		require.NoError(b, node.conn.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&backend))
		if f := procStat(backend); len(f) > 1 {
			node.postmaster, _ = strconv.Atoi(f[1])
		}
		if err == nil {
			_, _ = node.conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public`)
			var ok bool
			node.statements = node.conn.QueryRow(ctx, `SELECT count(*) >= 0 FROM public.pg_stat_statements`).Scan(&ok) == nil
		}
	}

	if n > 0 {
		defer idleSubscriber(b, ctx, pool, adapter, n)()
	}

	before := make([]idleNode, len(nodes))
	for i, node := range nodes {
		node.read(b, ctx, adapter.Schema)
		before[i] = *node
	}
	start := time.Now()
	time.Sleep(window)
	elapsed := time.Since(start).Seconds()
	var out strings.Builder
	fmt.Fprintf(&out, "idle Subscriber of %d topics, %s, %.0f s:\n", n, mode, elapsed)
	var coordinator float64
	for i, node := range nodes {
		node.read(b, ctx, adapter.Schema)
		calls := float64(node.calls-before[i].calls) / elapsed
		if i == 0 {
			coordinator = calls
		}
		fmt.Fprintf(&out, "  %-11s  %8.1f statements/s of the schema (%7.1f ms/s executing), %8.1f in all, %8.1f transactions/s, CPU %5.1f %%\n", node.name,
			calls, (node.execMs-before[i].execMs)/elapsed, float64(node.all-before[i].all)/elapsed,
			float64(node.commits-before[i].commits)/elapsed, 100*(node.cpu-before[i].cpu)/elapsed)
		for _, line := range node.busiest(&before[i], elapsed, 6) {
			fmt.Fprintf(&out, "      %s\n", line)
		}
	}
	b.Log(out.String())
	return coordinator
}

// idleSubscriber starts a Subscriber of n topics of adapter, waits until
// it has claimed them all and its consumers have read once, and returns
// the function that closes it.
func idleSubscriber(b *testing.B, ctx context.Context, pool *pgxpool.Pool, adapter pglease.Tables, n int) func() {
	b.Helper()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "idle", Tables: adapter}, nil)
	require.NoError(b, err)
	subCtx, stop := context.WithCancel(ctx)
	began := time.Now()
	for _, topic := range numberedTopics("idle", 0, n) {
		_, err := sub.Subscribe(subCtx, topic)
		require.NoError(b, err)
	}
	offsets := pgx.Identifier{adapter.Schema, pglease.DefaultConsumerOffsetsTable}.Sanitize()
	for {
		var claimed int
		require.NoError(b, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+offsets+`
			WHERE consumer_group = 'idle' AND session_id IS NOT NULL`).Scan(&claimed))
		if claimed == n {
			break
		}
		require.NoError(b, ctx.Err(), "%d of %d topics claimed", claimed, n)
		time.Sleep(100 * time.Millisecond)
	}
	b.Logf("%d topics claimed in %s", n, time.Since(began).Round(time.Millisecond))
	// Every consumer reads once (a bound on the topic's worker, then the
	// read), then waits: wait for the bounds, where pg_stat_statements
	// counts them, then a few polls.
	for {
		var bounds int64
		if pool.QueryRow(ctx, `SELECT COALESCE(sum(calls), 0)::bigint FROM public.pg_stat_statements
			WHERE query LIKE '%' || $1 || '%' AND query LIKE '%worker_bound%'`, adapter.Schema).Scan(&bounds) != nil || bounds >= int64(n) {
			break
		}
		require.NoError(b, ctx.Err(), "%d of %d topics read", bounds, n)
		time.Sleep(100 * time.Millisecond)
	}
	b.Logf("%d topics read in %s", n, time.Since(began).Round(time.Millisecond))
	time.Sleep(3 * pglease.DefaultPollInterval)
	return func() {
		require.NoError(b, sub.Close())
		stop()
	}
}

func connectTo(b *testing.B, ctx context.Context, dsn string) *pgx.Conn {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// procStat returns the fields of /proc/pid/stat after the command's
// name (the state first), nil when it cannot be read.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// nodeCPU returns the CPU seconds used so far by the postmaster with
// process id pm and its children, living (their own time) and ended
// (the postmaster's children's time), at 100 ticks a second; 0 when pm
// is 0 or /proc cannot be read.
func nodeCPU(pm int) float64 {
	if pm == 0 {
		return 0
	}
	ticks := func(f []string, from, to int) float64 {
		var t float64
		for i := from; i <= to && i < len(f); i++ {
			v, _ := strconv.ParseFloat(f[i], 64)
			t += v
		}
		return t
	}
	// After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
	total := ticks(procStat(pm), 11, 14)
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == pm {
			continue
		}
		if f := procStat(pid); len(f) > 12 && f[1] == strconv.Itoa(pm) {
			total += ticks(f, 11, 12)
		}
	}
	return total / 100
}
