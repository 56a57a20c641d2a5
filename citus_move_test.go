package pglease_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// logSummary counts the entries of logs by level and message (its first
// 70 characters).
func logSummary(logs *capturingLogger) string {
	counts := map[string]int{}
	for _, e := range logs.Entries() {
		msg := e.Msg
		if len(msg) > 70 {
			msg = msg[:70]
		}
		counts[strings.ToUpper(e.Level)+" "+msg]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n\t%4d %s", counts[k], k)
	}
	return b.String()
}

// firstDelivery is a message's first delivery: when it was published and
// when it came.
type firstDelivery struct {
	id        string
	published time.Time
	received  time.Time
}

// moveTraffic publishes to topics without pause, one message per call
// from a goroutine per topic, and consumes them with one Subscriber,
// recording each message's first delivery.
type moveTraffic struct {
	t      *testing.T
	topics []string

	mu        sync.Mutex
	published map[string][]string        // per topic, in order
	sentAt    map[string]time.Time       // per message
	first     map[string][]firstDelivery // per topic, first deliveries in order
	seen      map[string]bool            // per message
	again     int                        // deliveries of a message seen before
	calls     map[string][][2]time.Time  // per topic, each Publish call's start and end
	stop      chan struct{}
	wg        sync.WaitGroup
	consumers sync.WaitGroup
}

func startMoveTraffic(t *testing.T, ctx context.Context, pool *pgxpool.Pool, adapter pglease.Tables, topics []string,
	logger watermill.LoggerAdapter) *moveTraffic {
	mt := &moveTraffic{t: t, topics: topics, published: map[string][]string{}, sentAt: map[string]time.Time{},
		first: map[string][]firstDelivery{}, seen: map[string]bool{}, calls: map[string][][2]time.Time{}, stop: make(chan struct{})}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "movers", Tables: adapter}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()); mt.consumers.Wait() })
	for _, topic := range topics {
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		mt.consumers.Go(func() {
			for m := range ch {
				now := time.Now()
				mt.mu.Lock()
				if mt.seen[m.UUID] {
					mt.again++
				} else {
					mt.seen[m.UUID] = true
					mt.first[topic] = append(mt.first[topic], firstDelivery{id: m.UUID, published: mt.sentAt[m.UUID], received: now})
				}
				mt.mu.Unlock()
				m.Ack()
			}
		})
	}
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	for _, topic := range topics {
		mt.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-mt.stop:
					return
				default:
				}
				id := fmt.Sprintf("%s/%06d", topic, i)
				mt.mu.Lock()
				mt.sentAt[id] = time.Now()
				mt.mu.Unlock()
				if err := pub.Publish(topic, message.NewMessage(id, nil)); err != nil {
					t.Errorf("publish %s: %v", id, err)
					return
				}
				mt.mu.Lock()
				mt.calls[topic] = append(mt.calls[topic], [2]time.Time{mt.sentAt[id], time.Now()})
				mt.published[topic] = append(mt.published[topic], id)
				mt.mu.Unlock()
			}
		})
	}
	return mt
}

// delivered is the number of first deliveries of topic.
func (mt *moveTraffic) delivered(topic string) int {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	return len(mt.first[topic])
}

// end stops publishing and waits until every message published was
// delivered.
func (mt *moveTraffic) end(within time.Duration) {
	close(mt.stop)
	mt.wg.Wait()
	waitFor(mt.t, within, "every message published delivered", func() bool {
		mt.mu.Lock()
		defer mt.mu.Unlock()
		for _, topic := range mt.topics {
			if len(mt.first[topic]) < len(mt.published[topic]) {
				return false
			}
		}
		return true
	})
}

// check asserts that every message published was delivered, each topic
// in order.
func (mt *moveTraffic) check() {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	for _, topic := range mt.topics {
		got := make([]string, len(mt.first[topic]))
		for i, d := range mt.first[topic] {
			got[i] = d.id
		}
		require.Equal(mt.t, mt.published[topic], got, "topic %s: every message, in order", topic)
	}
}

// moveStats is what one topic's deliveries show about a window of time.
type moveStats struct {
	pause         time.Duration // the longest time between two first deliveries
	publish       time.Duration // the longest Publish call
	p50, p99, max time.Duration // latency, publish to first delivery
	n             int
}

func (s moveStats) String() string {
	return fmt.Sprintf("pause %s (longest publish %s), latency p50 %s p99 %s max %s (%d messages)", s.pause.Round(time.Millisecond), s.publish.Round(time.Millisecond),
		s.p50.Round(time.Millisecond), s.p99.Round(time.Millisecond), s.max.Round(time.Millisecond), s.n)
}

// firstAfter is how long after at the first message published after at
// was delivered on topic (0: none yet).
func (mt *moveTraffic) firstAfter(topic string, at time.Time) time.Duration {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	for _, d := range mt.first[topic] {
		if !d.published.Before(at) {
			return d.received.Sub(at)
		}
	}
	return 0
}

// stats measures topic's deliveries received in [from, to].
func (mt *moveTraffic) stats(topic string, from, to time.Time) moveStats {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	var (
		s    moveStats
		lat  []time.Duration
		prev time.Time
	)
	for _, d := range mt.first[topic] {
		if d.received.Before(from) {
			prev = d.received
			continue
		}
		if d.received.After(to) {
			// The gap up to the first delivery after the window counts.
			if !prev.IsZero() {
				s.pause = max(s.pause, d.received.Sub(prev))
			}
			break
		}
		if !prev.IsZero() {
			s.pause = max(s.pause, d.received.Sub(prev))
		}
		prev = d.received
		lat = append(lat, d.received.Sub(d.published))
	}
	for _, c := range mt.calls[topic] {
		if !c[1].Before(from) && !c[0].After(to) {
			s.publish = max(s.publish, c[1].Sub(c[0]))
		}
	}
	s.n = len(lat)
	if s.n > 0 {
		slices.Sort(lat)
		s.p50, s.p99, s.max = lat[s.n/2], lat[s.n*99/100], lat[s.n-1]
	}
	return s
}

// TestCitusPlannedShardMove moves a topic's shard to the other worker and
// back, as `pglease move-shard` does (the target's position sequence
// raised first, then citus_move_shard_placement with block_writes), while
// publishers publish to it and to topics on other shards and one
// Subscriber consumes them all. Every message is delivered, each topic
// in order; the Subscriber logs each move once, at Info, naming the topic
// and both workers, and nothing at Error; firstDelivery resumes on every topic
// after each move. It logs the pause and the latency on the moved topic
// and the others (docs/scaling.md, "Moving shards").
func TestCitusPlannedShardMove(t *testing.T) {
	const topic = "moving"
	pool, adapter := citusSchema(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	messages := table(adapter, pglease.DefaultMessagesTable)
	type placement struct {
		shard int64
		host  string
		port  int
	}
	where := func(topic string) (p placement) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT p.shardid, p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, messages, topic).
			Scan(&p.shard, &p.host, &p.port))
		return p
	}
	src := where(topic)
	var dstPort int
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, src.port).Scan(&dstPort))
	// Topics on other shards, on both workers.
	topics := []string{topic}
	for _, other := range numberedTopics("still", 0, 20) {
		if where(other).shard != src.shard && len(topics) < 5 {
			topics = append(topics, other)
		}
	}

	// PGLEASE_TEST_MOVE_ROWS messages (0 by default) of a topic of the
	// moved shard that nobody consumes make the shard larger (the
	// figures of docs/scaling.md).
	if n, _ := strconv.Atoi(os.Getenv("PGLEASE_TEST_MOVE_ROWS")); n > 0 {
		ballast := ""
		for _, other := range numberedTopics("ballast", 0, 200) {
			if where(other).shard == src.shard {
				ballast = other
				break
			}
		}
		require.NotEmpty(t, ballast, "a topic of the moved shard")
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
		require.NoError(t, err)
		payload := make([]byte, 100)
		for i := 0; i < n; i += 1000 {
			msgs := make([]*message.Message, 0, 1000)
			for range min(1000, n-i) {
				msgs = append(msgs, message.NewMessage(watermill.NewUUID(), payload))
			}
			require.NoError(t, pub.Publish(ballast, msgs...))
		}
		require.NoError(t, pub.Close())
		t.Logf("%d messages of %s in the moved shard", n, ballast)
	}

	logs := newCapturingLogger()
	mt := startMoveTraffic(t, ctx, pool, adapter, topics, logs)
	for _, tp := range topics {
		waitFor(t, 30*time.Second, "deliveries on "+tp, func() bool { return mt.delivered(tp) >= 50 })
	}
	steady := time.Now()
	waitFor(t, 30*time.Second, "steady deliveries", func() bool { return time.Since(steady) > time.Second })

	move := func(from, to placement) {
		t.Helper()
		fromAddr, toAddr := fmt.Sprintf("%s:%d", from.host, from.port), fmt.Sprintf("%s:%d", to.host, to.port)
		before := map[string]int{}
		for _, tp := range topics {
			before[tp] = mt.delivered(tp)
		}
		start := time.Now()
		_, err := pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(from.host, from.port, to.host, to.port, 0))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
			from.shard, from.host, from.port, to.host, to.port)
		require.NoError(t, err)
		moved := time.Now()
		require.Equal(t, to.port, where(topic).port)
		// Delivery resumes on every topic: 50 more messages each.
		for _, tp := range topics {
			waitFor(t, time.Minute, "firstDelivery resumed on "+tp+" after the move", func() bool { return mt.delivered(tp) >= before[tp]+50 })
		}
		resumed := time.Now()
		// The move, logged once at Info as what it is; nothing at Error.
		var lines []logEntry
		for _, e := range logs.Since("info", start) {
			if strings.HasPrefix(e.Msg, "Shard of topic") {
				lines = append(lines, e)
			}
			// The topics claimed again by the Subscriber's next
			// session were its own: no takeover.
			require.NotContains(t, e.Msg, "taken over from an expired session", "after a move:%s", logSummary(logs))
		}
		require.Len(t, lines, 1, "one line about the move:%s", logSummary(logs))
		require.Equal(t, topic, lines[0].Fields["topic"])
		require.Equal(t, fromAddr, lines[0].Fields["from_worker"])
		require.Equal(t, toAddr, lines[0].Fields["to_worker"])
		require.Equal(t, from.shard, lines[0].Fields["shard"])
		require.Empty(t, logs.Since("error", time.Time{}), "nothing at Error:%s", logSummary(logs))
		t.Logf("move %s -> %s: shard moved in %s, every topic delivering again %s after the move began",
			fromAddr, toAddr, moved.Sub(start).Round(time.Millisecond), resumed.Sub(start).Round(time.Millisecond))
		for _, tp := range topics {
			what := "not moved"
			if tp == topic {
				what = "moved"
			}
			t.Logf("  %-8s %-9s (on :%d): during %s; first published after the move delivered %s after it; before %s",
				tp, what, where(tp).port, mt.stats(tp, start, resumed), mt.firstAfter(tp, moved).Round(time.Millisecond),
				mt.stats(tp, steady, start))
		}
		steady = time.Now()
		waitFor(t, 30*time.Second, "steady deliveries", func() bool { return time.Since(steady) > time.Second })
	}
	t.Cleanup(func() {
		// The sources' placements, dropped now rather than later by
		// Citus's background cleaner, while the next test starts.
		_, _ = pool.Exec(context.Background(), `CALL pg_catalog.citus_cleanup_orphaned_resources()`)
	})
	dst := placement{shard: src.shard, host: src.host, port: dstPort}
	move(src, dst)
	move(dst, src)
	mt.end(time.Minute)
	mt.check()
	require.Empty(t, logs.Since("error", time.Time{}), "nothing at Error:%s", logSummary(logs))
	t.Logf("log lines, Info and above:%s", logSummary(logs))
	t.Logf("delivered again: %d", mt.again)
}

// TestCitusAckInTxFindsAMove: a message delivered before a planned move
// of its topic's shard and acknowledged after it with AckInTx: the
// acknowledgement fails (ErrDatabaseWentBack, the transaction's to roll
// back), and the Subscriber logs the move once at Info, as what it is,
// and nothing at Error; the message comes again.
func TestCitusAckInTxFindsAMove(t *testing.T) {
	const topic = "moving-tx"
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	messages := table(adapter, pglease.DefaultMessagesTable)
	var (
		shard     int64
		host      string
		port, dst int
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.shardid, p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, messages, topic).
		Scan(&shard, &host, &port))
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, port).Scan(&dst))
	logs := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		PollInterval: 100 * time.Millisecond}, logs)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("m", nil)))
	var msg *message.Message
	select {
	case msg = <-msgs:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	require.Equal(t, "m", msg.UUID)

	_, err = pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(host, port, host, dst, 0))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
		shard, host, port, host, dst)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `CALL pg_catalog.citus_cleanup_orphaned_resources()`) })

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	err = pglease.AckInTx(ctx, tx, msg)
	require.ErrorIs(t, err, pglease.ErrDatabaseWentBack)
	require.NoError(t, tx.Rollback(ctx))
	msg.Nack()

	select {
	case again := <-msgs:
		require.Equal(t, "m", again.UUID, "delivered again after the move")
		again.Ack()
	case <-ctx.Done():
		t.Fatal("not delivered again after the move")
	}
	var lines []logEntry
	for _, e := range logs.Since("info", time.Time{}) {
		if strings.HasPrefix(e.Msg, "Shard of topic") {
			lines = append(lines, e)
		}
	}
	require.Len(t, lines, 1, "the move logged once:%s", logSummary(logs))
	require.Equal(t, "an AckInTx of topic "+strconv.Quote(topic), lines[0].Fields["detected_by"])
	require.Empty(t, logs.Since("error", time.Time{}), "nothing at Error:%s", logSummary(logs))
}
