package pglease_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// reads returns how many reads of messages (SelectMessages,
// SelectMessagesAt: the statements with a went_back column) of topic
// the pool sent; of every topic when topic is "".
func (s *stmtTrace) reads(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.stmts {
		if strings.Contains(st.sql, "went_back") && (topic == "" || st.arg0 == topic) {
			n++
		}
	}
	return n
}

func (rc *routedCluster) workerReads(addr, topic string) int {
	rc.mu.Lock()
	tr := rc.workers[addr]
	rc.mu.Unlock()
	if tr == nil {
		return 0
	}
	return tr.reads(topic)
}

// workerBackends counts, on each worker, the backends of the
// client's own pools (routedAppName).
func workerBackends(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT result FROM pg_catalog.run_command_on_workers(
		$$SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = '`+routedAppName+`'$$)`)
	require.NoError(t, err)
	counts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return counts
}

// TestCitusRoutedReadsRunOnTheWorker: with the Subscriber's
// RouteToWorkers, each topic's reads of messages are sent to the worker
// that holds its shard, none to the coordinator, where the claims and the
// offset commits still go; the workers serve the Subscriber's own
// connections; every message is delivered once, in order; and Close
// leaves no pool behind.
func TestCitusRoutedReadsRunOnTheWorker(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := newRoutedCluster(t, pool)
	before := poolGoroutines()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, testLogger())
	require.NoError(t, err)
	defer pub.Close()
	topics := numberedTopics("rr", 0, 8)
	for _, topic := range topics {
		for i := range 3 {
			require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("%s/%d", topic, i), nil)))
		}
	}

	sub, err := pglease.NewSubscriber(rc.coordinator, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		StartFrom: pglease.StartFromEarliest, PollInterval: 100 * time.Millisecond, CommitBatch: 1,
		RouteToWorkers: true, ConnectWorker: rc.connect}, testLogger())
	require.NoError(t, err)
	require.True(t, pglease.ReadRouting(sub))
	nodes := map[string]bool{}
	for _, topic := range topics {
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		require.Equal(t, []string{topic + "/0", topic + "/1", topic + "/2"}, receiveUUIDs(t, ch, 3))
		addr, _ := topicNode(t, pool, adapter, topic)
		nodes[addr] = true
		require.NotZero(t, rc.workerReads(addr, topic), "%s was read on its worker %s", topic, addr)
	}
	require.Len(t, nodes, 2, "the topics lie on both workers")
	for _, c := range workerBackends(t, ctx, pool) {
		require.NotEqual(t, "0", c, "each worker serves the Subscriber's connections")
	}
	require.Zero(t, rc.coordTrace.reads(""), "no read of messages went to the coordinator")
	require.NotZero(t, pglease.RoutedReads(sub))
	require.Equal(t, pglease.Reads(sub), pglease.RoutedReads(sub), "every read was answered by a worker")

	// The offsets were committed through the coordinator: a Subscriber
	// of the group that does not route starts after them.
	require.NoError(t, sub.Close())
	rc.requireClosed(t)
	require.NoError(t, sub.Close(), "a second Close")
	requireNoNewPools(t, before)
	require.NoError(t, pub.Publish(topics[0], message.NewMessage(topics[0]+"/3", nil)))
	plain, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		PollInterval: 100 * time.Millisecond}, testLogger())
	require.NoError(t, err)
	defer plain.Close()
	ch, err := plain.Subscribe(ctx, topics[0])
	require.NoError(t, err)
	require.Equal(t, []string{topics[0] + "/3"}, receiveUUIDs(t, ch, 1))
}

// TestCitusRoutedReadsAfterShardMove: a topic's shard moved to the other
// worker (citus_move_shard_placement) while a routing Subscriber reads
// it, its routes kept (RouteRefreshInterval an hour): its next read goes
// to the former worker, which forwards it to the new one, where the
// worker's identity is not the claim's; the read is made again through
// the coordinator, which reports the move; the Subscriber claims the
// topic again, and the messages published after the move are delivered
// once, in order, read on the new worker.
func TestCitusRoutedReadsAfterShardMove(t *testing.T) {
	const topic = "routed-reads-moving"
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := newRoutedCluster(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, testLogger())
	require.NoError(t, err)
	defer pub.Close()
	logs := newCapturingLogger()
	sub, err := pglease.NewSubscriber(rc.coordinator, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		StartFrom: pglease.StartFromEarliest, PollInterval: 100 * time.Millisecond, CommitBatch: 1,
		RouteToWorkers: true, ConnectWorker: rc.connect, RouteRefreshInterval: time.Hour}, logs)
	require.NoError(t, err)
	defer sub.Close()

	from, shard := topicNode(t, pool, adapter, topic)
	for i := range 3 {
		require.NoError(t, pub.Publish(topic, message.NewMessage(strconv.Itoa(i), nil)))
	}
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1", "2"}, receiveUUIDs(t, ch, 3))
	require.NotZero(t, rc.workerReads(from, topic))

	host, port, err := net.SplitHostPort(from)
	require.NoError(t, err)
	var dst int
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, port).Scan(&dst))
	srcPort, _ := strconv.Atoi(port)
	_, err = pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(host, srcPort, host, dst, 0))
	require.NoError(t, err)
	movedAt := time.Now()
	_, err = pool.Exec(ctx, `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
		shard, host, srcPort, host, dst)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `CALL pg_catalog.citus_cleanup_orphaned_resources()`) })
	to, _ := topicNode(t, pool, adapter, topic)
	require.NotEqual(t, from, to)

	var uuids []string
	for i := 3; i < 6; i++ {
		require.NoError(t, pub.Publish(topic, message.NewMessage(strconv.Itoa(i), nil)))
		uuids = append(uuids, strconv.Itoa(i))
	}
	require.Equal(t, uuids, receiveUUIDs(t, ch, 3), "delivered once, in order, after the move")
	// The move, logged once at Info as what it is (found by the read
	// made again through the coordinator); nothing at Error.
	var lines []logEntry
	for _, e := range logs.Since("info", movedAt) {
		if strings.HasPrefix(e.Msg, "Shard of topic") {
			lines = append(lines, e)
		}
	}
	require.Len(t, lines, 1, "one line about the move:%s", logSummary(logs))
	require.Equal(t, to, lines[0].Fields["to_worker"])
	require.Empty(t, logs.Since("error", time.Time{}), "nothing at Error:%s", logSummary(logs))
	// Reads go to the new worker once the worker is no longer left out
	// (RouteRetryAfter): it polls every 100 ms.
	waitFor(t, 30*time.Second, "reads on the new worker", func() bool { return rc.workerReads(to, topic) > 0 })
	require.NoError(t, pub.Publish(topic, message.NewMessage("6", nil)))
	require.Equal(t, []string{"6"}, receiveUUIDs(t, ch, 1))
	select {
	case m := <-ch:
		t.Fatalf("delivered again: %s", m.UUID)
	case <-time.After(time.Second):
	}
}

// TestCitusRoutedReadsWorkerUnreachable: the workers' pools cannot
// connect (a port nothing listens on): every read goes through the
// coordinator, every message is delivered once, in order, and the
// outage is logged once per worker at Error.
func TestCitusRoutedReadsWorkerUnreachable(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	var (
		mu       sync.Mutex
		connects = map[string]bool{}
	)
	logs := newCapturingLogger()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	// Three topics on each worker.
	var topics []string
	perNode := map[string]int{}
	for i := 0; len(topics) < 6 && i < 64; i++ {
		topic := fmt.Sprintf("ru%03d", i)
		if addr, _ := topicNode(t, pool, adapter, topic); perNode[addr] < 3 {
			perNode[addr]++
			topics = append(topics, topic)
		}
	}
	require.Len(t, topics, 6)
	for i := range 5 {
		for _, topic := range topics {
			require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("%s/%d", topic, i), nil)))
		}
	}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		StartFrom: pglease.StartFromEarliest, PollInterval: 100 * time.Millisecond, RouteToWorkers: true,
		ConnectWorker: func(ctx context.Context, host string, port int) (*pgxpool.Pool, error) {
			mu.Lock()
			connects[net.JoinHostPort(host, strconv.Itoa(port))] = true
			mu.Unlock()
			cfg := pool.Config()
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(dead)
			return pgxpool.NewWithConfig(ctx, cfg)
		}}, logs)
	require.NoError(t, err)
	defer sub.Close()
	for _, topic := range topics {
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		var want []string
		for i := range 5 {
			want = append(want, fmt.Sprintf("%s/%d", topic, i))
		}
		require.Equal(t, want, receiveUUIDs(t, ch, 5))
	}
	require.Zero(t, pglease.RoutedReads(sub))
	mu.Lock()
	require.Len(t, connects, 2, "a pool per worker was asked for")
	mu.Unlock()
	var errs []string
	for _, e := range logs.Since("error", time.Time{}) {
		errs = append(errs, e.Msg)
	}
	require.Len(t, errs, 2, "one Error per worker: %v", errs)
	require.NoError(t, sub.Close())
}

// TestCitusPubSubRoutedReads runs Watermill's universal test suite with
// RouteToWorkers on every Subscriber.
func TestCitusPubSubRoutedReads(t *testing.T) {
	pool, adapter := citusSchema(t, 60)
	c := newConformanceWith(t, pool, adapter)
	c.tweak = func(cfg *pglease.SubscriberConfig) { cfg.RouteToWorkers = true }
	features := c.features()
	features.RestartServiceCommand = nil
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
		c.pubSub,
	)
}
