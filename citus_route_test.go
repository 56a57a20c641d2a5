package pglease_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// stmtTrace records the statements a pool sent: their text and first
// argument (the topics of an insert).
type stmtTrace struct {
	mu    sync.Mutex
	stmts []tracedStmt
}

type tracedStmt struct {
	sql  string
	arg0 any
}

func (s *stmtTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	var a0 any
	if len(d.Args) > 0 {
		a0 = d.Args[0]
	}
	s.mu.Lock()
	s.stmts = append(s.stmts, tracedStmt{d.SQL, a0})
	s.mu.Unlock()
	return ctx
}

func (s *stmtTrace) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The statements of a batch (a routed insert sends one per topic).
func (s *stmtTrace) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (s *stmtTrace) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	var a0 any
	if len(d.Args) > 0 {
		a0 = d.Args[0]
	}
	s.mu.Lock()
	s.stmts = append(s.stmts, tracedStmt{d.SQL, a0})
	s.mu.Unlock()
}

func (s *stmtTrace) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// inserted returns the topics of the inserts into the messages table
// the pool sent (the first argument: the topics of an insert of several,
// the topic of a routed one).
func (s *stmtTrace) inserted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, st := range s.stmts {
		if !strings.Contains(st.sql, "INSERT INTO") || !strings.Contains(st.sql, pglease.DefaultMessagesTable) {
			continue
		}
		if topic, ok := st.arg0.(string); ok && !slices.Contains(out, topic) {
			out = append(out, topic)
		}
		if topics, ok := st.arg0.([]string); ok {
			for _, t := range topics {
				if !slices.Contains(out, t) {
					out = append(out, t)
				}
			}
		}
	}
	return out
}

// routedCluster is a coordinator pool whose statements are traced, and
// the ConnectWorker of a routing Publisher whose workers' pools are.
type routedCluster struct {
	coordinator *pgxpool.Pool
	coordTrace  *stmtTrace
	mu          sync.Mutex
	workers     map[string]*stmtTrace // host:port → its pool's statements
	pools       []*pgxpool.Pool       // the workers' pools, in the order opened
}

const routedAppName = "pglease-routed-test"

func newRoutedCluster(t *testing.T, pool *pgxpool.Pool) *routedCluster {
	t.Helper()
	rc := &routedCluster{coordTrace: &stmtTrace{}, workers: map[string]*stmtTrace{}}
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = rc.coordTrace
	var err error
	rc.coordinator, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(rc.coordinator.Close)
	return rc
}

// connect opens a worker's pool as the default does, traced, with
// routedAppName.
func (rc *routedCluster) connect(ctx context.Context, host string, port int) (*pgxpool.Pool, error) {
	cfg := rc.coordinator.Config()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(port)
	tr := &stmtTrace{}
	cfg.ConnConfig.Tracer = tr
	cfg.ConnConfig.RuntimeParams["application_name"] = routedAppName
	rc.mu.Lock()
	rc.workers[net.JoinHostPort(host, strconv.Itoa(port))] = tr
	rc.mu.Unlock()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		rc.mu.Lock()
		rc.pools = append(rc.pools, p)
		rc.mu.Unlock()
	}
	return p, err
}

// requireClosed fails unless every worker pool opened is closed.
func (rc *routedCluster) requireClosed(t *testing.T) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.NotEmpty(t, rc.pools)
	for _, p := range rc.pools {
		_, err := p.Acquire(context.Background())
		require.Error(t, err, "the worker's pool is closed")
	}
}

func (rc *routedCluster) workerInserted(addr string) []string {
	rc.mu.Lock()
	tr := rc.workers[addr]
	rc.mu.Unlock()
	if tr == nil {
		return nil
	}
	return tr.inserted()
}

// topicNode is the host:port of the worker that holds topic's shard.
func topicNode(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, topic string) (addr string, shard int64) {
	t.Helper()
	var (
		host string
		port int
	)
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT p.shardid, p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`,
		table(adapter, pglease.DefaultMessagesTable), topic).Scan(&shard, &host, &port))
	return net.JoinHostPort(host, strconv.Itoa(port)), shard
}

// poolGoroutines counts the goroutines of pgxpool pools (one health
// check per pool).
func poolGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "pgxpool.(*Pool).backgroundHealthCheck")
}

// requireNoNewPools waits until no more pools run than before (a
// pool's goroutine ends once it is closed, after a health check under
// way), and logs the goroutines of the pools left when they do not.
func requireNoNewPools(t *testing.T, before int) {
	t.Helper()
	defer func() {
		if t.Failed() {
			buf := make([]byte, 1<<22)
			buf = buf[:runtime.Stack(buf, true)]
			for _, g := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(g, "backgroundHealthCheck") {
					t.Logf("a pool left:\n%s", g)
				}
			}
		}
	}()
	waitFor(t, 30*time.Second, "no pool goroutine left", func() bool { return poolGoroutines() <= before })
}

// TestCitusRoutedPublishRunsOnTheWorker: with RouteToWorkers, each
// topic's inserts (with and without idempotency keys) are sent to the
// worker that holds its shard, none to the coordinator; the worker
// serves the Publisher's own connections; Subscribers on the coordinator
// are notified (their poll is a minute); a repeated key is left out; and
// Close leaves no pool behind.
func TestCitusRoutedPublishRunsOnTheWorker(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := newRoutedCluster(t, pool)
	before := poolGoroutines()
	pub, err := pglease.NewPublisher(rc.coordinator, pglease.PublisherConfig{Tables: adapter, RouteToWorkers: true,
		ConnectWorker: rc.connect}, testLogger())
	require.NoError(t, err)
	require.True(t, pglease.Routing(pub))

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		PollInterval: time.Minute}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	topics := numberedTopics("r", 0, 8)
	chans := map[string]<-chan *message.Message{}
	for _, topic := range topics {
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		chans[topic] = ch
	}
	waitFor(t, 30*time.Second, "the Subscriber listens", func() bool { return pglease.Listening(sub) })

	nodes := map[string]bool{}
	for _, topic := range topics {
		keyed := message.NewMessage(topic+"/2", []byte("2"))
		keyed.Metadata.Set(pglease.IdempotencyKeyMetadata, topic+"-key")
		require.NoError(t, pub.Publish(topic, message.NewMessage(topic+"/1", []byte("1")), keyed))
		again := message.NewMessage(topic+"/3", []byte("3"))
		again.Metadata.Set(pglease.IdempotencyKeyMetadata, topic+"-key")
		res, err := pub.PublishWithResult(topic, again)
		require.NoError(t, err)
		require.Equal(t, []int{0}, res.AlreadyStored, "the repeated key is left out")
		for _, want := range []string{topic + "/1", topic + "/2"} {
			select {
			case m := <-chans[topic]:
				require.Equal(t, want, m.UUID)
				m.Ack()
			case <-time.After(20 * time.Second):
				t.Fatalf("topic %s: %s not delivered within 20s (a poll is a minute: not notified?)", topic, want)
			}
		}
		addr, _ := topicNode(t, pool, adapter, topic)
		nodes[addr] = true
		require.Contains(t, rc.workerInserted(addr), topic, "%s's insert went to its worker %s", topic, addr)
	}
	require.Len(t, nodes, 2, "the topics lie on both workers")
	require.Empty(t, rc.coordTrace.inserted(), "no insert went to the coordinator")

	// On each worker, the Publisher's own connections (not the
	// coordinator's, whose application_name is citus_internal...).
	rows, err := pool.Query(ctx, `SELECT nodeport, result FROM pg_catalog.run_command_on_workers(
		$$SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = '`+routedAppName+`'$$)`)
	require.NoError(t, err)
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var (
			port   int
			result string
		)
		err := r.Scan(&port, &result)
		return result, err
	})
	require.NoError(t, err)
	for _, c := range counts {
		require.NotEqual(t, "0", c, "each worker serves the Publisher's connections: %v", counts)
	}

	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+table(adapter, pglease.DefaultMessagesTable)).Scan(&stored))
	require.Equal(t, 16, stored)
	require.NoError(t, pub.Close())
	rc.requireClosed(t)
	require.NoError(t, pub.Close(), "a second Close")
	requireNoNewPools(t, before)
}

// TestCitusRoutedPublishAfterShardMove: a topic's shard moved to the
// other worker (citus_move_shard_placement) while the Publisher still
// routes to the former one: the publish still succeeds (the former
// worker forwards it); after the refresh, it goes to the new worker;
// a delayed message goes through the coordinator; a Subscriber gets
// every message once, in order.
func TestCitusRoutedPublishAfterShardMove(t *testing.T) {
	const topic = "routed-moving"
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := newRoutedCluster(t, pool)
	pub, err := pglease.NewPublisher(rc.coordinator, pglease.PublisherConfig{Tables: adapter, RouteToWorkers: true,
		ConnectWorker: rc.connect, RouteRefreshInterval: time.Hour}, testLogger())
	require.NoError(t, err)
	defer pub.Close()

	from, shard := topicNode(t, pool, adapter, topic)
	require.NoError(t, pub.Publish(topic, message.NewMessage("1", nil)))
	require.Equal(t, []string{topic}, rc.workerInserted(from))

	host, port, err := net.SplitHostPort(from)
	require.NoError(t, err)
	var dst int
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, port).Scan(&dst))
	srcPort, _ := strconv.Atoi(port)
	_, err = pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(host, srcPort, host, dst, 0))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
		shard, host, srcPort, host, dst)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `CALL pg_catalog.citus_cleanup_orphaned_resources()`) })
	to, _ := topicNode(t, pool, adapter, topic)
	require.NotEqual(t, from, to)

	// Stale: sent to the former worker, which forwards it.
	require.NoError(t, pub.Publish(topic, message.NewMessage("2", nil)))
	require.Empty(t, rc.workerInserted(to), "not routed to the new worker before the refresh")

	pglease.RefreshRoutes(pub)
	require.NoError(t, pub.Publish(topic, message.NewMessage("3", nil)))
	require.Equal(t, []string{topic}, rc.workerInserted(to), "routed to the new worker after the refresh")
	require.Empty(t, rc.coordTrace.inserted(), "no insert went to the coordinator")
	// Delayed: through the coordinator, to the delayed table on every
	// node; the maintainer moves it to the messages once due.
	delayed := message.NewMessage("4", nil)
	delay.Message(delayed, delay.For(500*time.Millisecond))
	require.NoError(t, pub.Publish(topic, delayed))

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		StartFrom: pglease.StartFromEarliest, PollInterval: 100 * time.Millisecond}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, []string{"1", "2", "3", "4"}, receiveUUIDs(t, ch, 4))
	select {
	case m := <-ch:
		t.Fatalf("delivered again: %s", m.UUID)
	case <-time.After(time.Second):
	}
}

// receiveUUIDs acks and returns the UUIDs of the next n messages of ch.
func receiveUUIDs(t *testing.T, ch <-chan *message.Message, n int) []string {
	t.Helper()
	var got []string
	for len(got) < n {
		select {
		case m := <-ch:
			got = append(got, m.UUID)
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("got %v, want %d messages", got, n)
		}
	}
	return got
}

// TestCitusRoutedPublishWorkerUnreachable: the workers' pools cannot
// connect (a port nothing listens on): every Publish goes through the
// coordinator, stored once, the outage logged once per worker at Error.
func TestCitusRoutedPublishWorkerUnreachable(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	var connects sync.Map
	logs := newCapturingLogger()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, RouteToWorkers: true,
		ConnectWorker: func(ctx context.Context, host string, port int) (*pgxpool.Pool, error) {
			connects.Store(net.JoinHostPort(host, strconv.Itoa(port)), true)
			cfg := pool.Config()
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(dead)
			return pgxpool.NewWithConfig(ctx, cfg)
		}}, logs)
	require.NoError(t, err)
	defer pub.Close()
	topics := numberedTopics("u", 0, 6)
	for i := range 5 {
		for _, topic := range topics {
			require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("%s/%d", topic, i), nil)))
		}
	}
	var stored, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*), pg_catalog.count(DISTINCT uuid) FROM `+
		table(adapter, pglease.DefaultMessagesTable)).Scan(&stored, &distinct))
	require.Equal(t, 30, stored)
	require.Equal(t, 30, distinct)
	n := 0
	connects.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 2, n, "a pool per worker was asked for")
	var errs []string
	for _, e := range logs.Since("error", time.Time{}) {
		errs = append(errs, e.Msg)
	}
	require.Len(t, errs, 2, "one Error per worker: %v", errs)

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		StartFrom: pglease.StartFromEarliest, PollInterval: 100 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topics[0])
	require.NoError(t, err)
	require.Equal(t, []string{topics[0] + "/0", topics[0] + "/1", topics[0] + "/2", topics[0] + "/3", topics[0] + "/4"}, receiveUUIDs(t, ch, 5))
}

// TestCitusRoutedPublisherNeedsAPool: RouteToWorkers on a *pgx.Conn is
// refused by NewPublisher; on a pgx.Tx it has no effect (the caller's
// transaction decides), and the messages commit with it.
func TestCitusRoutedPublisherNeedsAPool(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = pglease.NewPublisher(conn.Conn(), pglease.PublisherConfig{Tables: adapter, RouteToWorkers: true}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	require.ErrorContains(t, err, "RouteToWorkers")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	pub, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter, RouteToWorkers: true}, nil)
	require.NoError(t, err)
	require.False(t, pglease.Routing(pub))
	require.NoError(t, pub.Publish("in-tx", message.NewMessage("a", nil)))
	require.NoError(t, tx.Rollback(ctx))
	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+table(adapter, pglease.DefaultMessagesTable)).Scan(&stored))
	require.Zero(t, stored, "rolled back with the caller's transaction")
}

// TestCitusPubSubRouted runs Watermill's universal test suite with
// RouteToWorkers on every Publisher.
func TestCitusPubSubRouted(t *testing.T) {
	pool, adapter := citusSchema(t, 60)
	c := newConformanceWith(t, pool, adapter)
	c.pubTweak = func(cfg *pglease.PublisherConfig) { cfg.RouteToWorkers = true }
	features := c.features()
	features.RestartServiceCommand = nil
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
		c.pubSub,
	)
}
