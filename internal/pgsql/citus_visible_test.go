package pgsql

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// countingQuerier is a pool that counts the statements sent through it,
// those of a pipelined batch one each.
type countingQuerier struct {
	*pgxpool.Pool
	n atomic.Int64
}

func (c *countingQuerier) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.Pool.Exec(ctx, sql, args...)
}

func (c *countingQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.Pool.Query(ctx, sql, args...)
}

func (c *countingQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

func (c *countingQuerier) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(int64(b.Len()))
	return c.Pool.SendBatch(ctx, b)
}

// citusWorkerOf returns a connection to the worker that holds topic's
// shard, and that worker's address as Citus's node table names it; the
// test is skipped when PGLEASE_TEST_CITUS_WORKERS has no URL of it.
func citusWorkerOf(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tables *Tables, topic string) (*pgx.Conn, string) {
	t.Helper()
	var host string
	var port int
	if err := pool.QueryRow(ctx, `SELECT p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, tables.Messages, topic).Scan(&host, &port); err != nil {
		t.Fatal(err)
	}
	for _, w := range strings.Fields(os.Getenv("PGLEASE_TEST_CITUS_WORKERS")) {
		if c, err := pgx.ParseConfig(w); err == nil && int(c.Port) == port {
			conn, err := pgx.Connect(ctx, w)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return conn, fmt.Sprintf("%s:%d", host, port)
		}
	}
	t.Skipf("no URL of worker %s:%d in PGLEASE_TEST_CITUS_WORKERS", host, port)
	return nil, ""
}

// TestCitusIdlePollAsksEachWorkerOnce: the idle poll of 60 topics spread
// over both workers, some with messages after their position, some
// without, costs the coordinator one statement per worker (the
// workers' function, routed to each), and finds what a probe per row
// finds (the poll of tables distributed by an earlier release, where
// the workers' function is missing), which costs a statement per row.
func TestCitusIdlePollAsksEachWorkerOnce(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opened, err := OpenDriver(ctx, pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := opened.(citus)
	if !ok || !d.pollPerWorker {
		t.Fatalf("OpenDriver = %#v; want citus polling per worker", opened)
	}
	const topics = 60
	p := VisibleTopicsParams{Partitions: make([]int32, topics), Positions: make([]Position, topics)}
	var ins InsertMessagesParams
	for i := range topics {
		topic := fmt.Sprintf("idle-%02d", i)
		p.Topics = append(p.Topics, topic)
		if i%3 != 2 { // every third topic has no message
			ins.Topics = append(ins.Topics, topic, topic)
			ins.UUIDs = append(ins.UUIDs, topic+"/1", topic+"/2")
			ins.Payloads = append(ins.Payloads, nil, nil)
			ins.Metadata = append(ins.Metadata, "", "")
		}
	}
	if err := d.InsertMessages(ctx, pool, ins); err != nil {
		t.Fatal(err)
	}
	var want []int64
	for i, topic := range p.Topics {
		res, err := d.SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: "coordinator"})
		if err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 2:
			if len(res.Messages) != 0 {
				t.Fatalf("topic %s: %d messages, want none", topic, len(res.Messages))
			}
		case 1: // the position of the last message: nothing after it
			p.Positions[i] = res.Messages[len(res.Messages)-1].Position
		default: // the position of the first: the second is after it
			p.Positions[i] = res.Messages[0].Position
			want = append(want, int64(i+1))
		}
	}
	var workers int
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(DISTINCT p.groupid) FROM pg_catalog.unnest($2::text[]) t(topic)
		JOIN pg_catalog.pg_dist_placement p ON p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, t.topic)`,
		tables.Messages, p.Topics).Scan(&workers); err != nil {
		t.Fatal(err)
	}
	if workers < 2 {
		t.Fatalf("the topics lie on %d workers; want them on several", workers)
	}

	poll := func(d citus, p VisibleTopicsParams) ([]int64, int64) {
		t.Helper()
		q := &countingQuerier{Pool: pool}
		got, err := d.VisibleTopics(ctx, q, p)
		if err != nil {
			t.Fatal(err)
		}
		return got, q.n.Load()
	}
	got, stmts := poll(d, p)
	if !slices.Equal(got, want) {
		t.Fatalf("VisibleTopics per worker = %v; want %v", got, want)
	}
	if stmts != int64(workers) {
		t.Errorf("VisibleTopics per worker ran %d statements; want %d, one per worker", stmts, workers)
	}
	// Asked in another order (the first row's worker is asked first).
	r := VisibleTopicsParams{}
	for i := len(p.Topics) - 1; i >= 0; i-- {
		r.Topics, r.Partitions, r.Positions = append(r.Topics, p.Topics[i]), append(r.Partitions, p.Partitions[i]), append(r.Positions, p.Positions[i])
	}
	var rwant []int64
	for _, n := range want {
		rwant = append(rwant, int64(topics)+1-n)
	}
	slices.Sort(rwant)
	if got, stmts := poll(d, r); !slices.Equal(got, rwant) || stmts != int64(workers) {
		t.Errorf("VisibleTopics per worker, rows reversed = %v in %d statements; want %v in %d", got, stmts, rwant, workers)
	}
	// A partition without messages, and one row.
	p1 := VisibleTopicsParams{Topics: p.Topics[:1], Partitions: []int32{1}, Positions: p.Positions[:1]}
	if got, stmts := poll(d, p1); len(got) != 0 || stmts != 1 {
		t.Errorf("VisibleTopics of partition 1 = %v in %d statements; want none in 1", got, stmts)
	}

	perRow := d
	perRow.pollPerWorker = false
	if got, stmts := poll(perRow, p); !slices.Equal(got, want) || stmts != topics {
		t.Errorf("VisibleTopics per row = %v in %d statements; want %v in %d", got, stmts, want, topics)
	}

	// The application role (GrantScript's grants, owning nothing) polls
	// the same: the function reads Citus's catalogs and the shards there.
	role := "pglease_idle_" + pgtest.RandomHex(4)
	if _, err := pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{role}.Sanitize()+` CASCADE`)
		_, _ = pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+pgx.Identifier{role}.Sanitize())
	})
	if _, err := pool.Exec(ctx, tables.GrantScript(role)); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("PGLEASE_TEST_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if got, err := d.VisibleTopics(ctx, app, p); err != nil || !slices.Equal(got, want) {
		t.Errorf("VisibleTopics per worker as the application role = %v, %v; want %v", got, err, want)
	}
	if _, _, err := d.citusVisibleByWorker(ctx, app, p, p.Partitions, []int{0, 1}); err != nil {
		t.Errorf("the workers' function as the application role: %v", err)
	}

	// A worker without the function (added after `pglease migrate
	// --citus` ran): every row probed by its own statement.
	if _, err := pool.Exec(ctx, `SELECT pg_catalog.run_command_on_workers($1)`,
		`DROP FUNCTION `+tables.WorkerVisibleFunction()+workerVisibleArgs); err != nil {
		t.Fatal(err)
	}
	if got, stmts := poll(d, p); !slices.Equal(got, want) || stmts != 1+topics {
		t.Errorf("VisibleTopics without the workers' function = %v in %d statements; want %v in %d", got, stmts, want, 1+topics)
	}
	// Tables distributed by an earlier release: no function on the
	// coordinator either, and the Driver opened polls per row.
	if _, err := pool.Exec(ctx, `SET citus.enable_ddl_propagation = off; DROP FUNCTION `+tables.WorkerVisibleFunction()+workerVisibleArgs+
		`; RESET citus.enable_ddl_propagation`); err != nil {
		t.Fatal(err)
	}
	if opened, err := OpenDriver(ctx, pool, tables); err != nil {
		t.Fatal(err)
	} else if d, ok := opened.(citus); !ok || d.pollPerWorker {
		t.Fatalf("OpenDriver without the workers' function = %#v; want citus polling per row", opened)
	}
	// Distributed again: the function is back, on every node.
	if _, err := pool.Exec(ctx, tables.DistributeScript()); err != nil {
		t.Fatal(err)
	}
	if got, stmts := poll(d, p); !slices.Equal(got, want) || stmts != int64(workers) {
		t.Errorf("VisibleTopics after the script ran again = %v in %d statements; want %v in %d", got, stmts, want, workers)
	}
}

// TestCitusIdlePollComparesWithTheWorkersCounter: the idle poll reports
// a message only below the counter of its topic's worker. The topic's
// worker's sequence is set back below the message's position while the
// coordinator's and the other workers' lie far above it: a comparison
// with any counter but the topic's worker's would report the topic.
// Set forward again, the topic is reported, by either poll.
func TestCitusIdlePollComparesWithTheWorkersCounter(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := NewCitus(tables).(citus)
	perRow := d
	perRow.pollPerWorker = false
	const topic = "counter"
	worker, node := citusWorkerOf(t, ctx, pool, tables, topic)
	if err := d.InsertMessages(ctx, pool, InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{"c1"},
		Payloads: [][]byte{nil}, Metadata: []string{""}}); err != nil {
		t.Fatal(err)
	}
	var pos uint64
	if err := pool.QueryRow(ctx, `SELECT transaction_id::text::bigint FROM `+tables.Messages+` WHERE topic = $1`, topic).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	// The other topics of the poll lie on the other worker, so that its
	// statement is routed there first.
	var others []string
	for i := 0; len(others) < 3 && i < 100; i++ {
		o := fmt.Sprintf("other-%d", i)
		var elsewhere bool
		if err := pool.QueryRow(ctx, `SELECT p.nodename || ':' || p.nodeport <> $3 FROM pg_catalog.pg_dist_shard_placement p
			WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, tables.Messages, o, node).Scan(&elsewhere); err != nil {
			t.Fatal(err)
		}
		if elsewhere {
			others = append(others, o)
		}
	}
	if len(others) == 0 {
		t.Fatal("no topic on another worker")
	}
	p := VisibleTopicsParams{Topics: append(slices.Clone(others), topic), Positions: make([]Position, len(others)+1)}
	want := []int64{int64(len(p.Topics))}

	// Every sequence of positions of this schema, on the coordinator and
	// every worker, far above the message's position.
	seq := tables.PositionSequence()
	raise := fmt.Sprintf(`SELECT pg_catalog.setval(%s, %d)`, quoteLiteral(seq), pos+1<<40)
	if _, err := pool.Exec(ctx, `SELECT pg_catalog.setval($1::regclass, $2)`, seq, int64(pos+1<<40)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_catalog.run_command_on_workers($1)`, raise); err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]citus{"per worker": d, "per row": perRow} {
		if got, err := d.VisibleTopics(ctx, pool, p); err != nil || !slices.Equal(got, want) {
			t.Fatalf("VisibleTopics %s, every counter above the message = %v, %v; want %v", name, got, err, want)
		}
	}
	// The topic's worker's alone set back: its counter is the message's
	// position.
	if _, err := worker.Exec(ctx, `SELECT pg_catalog.setval($1::regclass, $2)`, seq, int64(pos-1)); err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]citus{"per worker": d, "per row": perRow} {
		if got, err := d.VisibleTopics(ctx, pool, p); err != nil || len(got) != 0 {
			t.Fatalf("VisibleTopics %s, the topic's worker's counter at the message = %v, %v; want none", name, got, err)
		}
	}
	// One above: the message lies below the counter.
	if _, err := worker.Exec(ctx, `SELECT pg_catalog.setval($1::regclass, $2)`, seq, int64(pos)); err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]citus{"per worker": d, "per row": perRow} {
		if got, err := d.VisibleTopics(ctx, pool, p); err != nil || !slices.Equal(got, want) {
			t.Fatalf("VisibleTopics %s, the topic's worker's counter above the message = %v, %v; want %v", name, got, err, want)
		}
	}
}
