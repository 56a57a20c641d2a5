package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// The tests of pglease on Citus run against the coordinator of a Citus
// cluster that `make test-citus` starts (a coordinator and two workers, see
// internal/cmd/localcitus), which sets PGLEASE_TEST_CITUS; without it they
// are skipped.

// citusSchema returns a pool on the coordinator and a schema of the
// test's own with the tables created and distributed (DistributeSQL).
func citusSchema(t testing.TB, maxConns int32) (*pgxpool.Pool, pglease.Tables) {
	t.Helper()
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	pool := newPool(t, maxConns)
	adapter := newSchema(t, pool)
	distribute(t, pool, adapter)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Run again: nothing left to do.
	_, err := pool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_partition p
		JOIN pg_catalog.pg_class c ON c.oid = p.logicalrelid JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = $1 AND p.partmethod = 'h'`, adapter.Schema).Scan(&n))
	require.Equal(t, 8, n, "distributed: the messages table, its partition kept forever, the offsets, the idempotency keys table and its four partitions")
	return pool, adapter
}

// TestCitusPublishThenSubscribe: messages published to 8 topics lie on
// both workers, and a Subscriber of each topic gets them, in order.
func TestCitusPublishThenSubscribe(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for i := range 8 {
		topic := fmt.Sprintf("t%d", i)
		require.NoError(t, pub.Publish(topic, message.NewMessage(topic+"/1", []byte("1")), message.NewMessage(topic+"/2", []byte("2"))))
	}
	var stored, workers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*), pg_catalog.count(DISTINCT s.nodeport)
		FROM `+pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable}.Sanitize()+` m
		JOIN pg_catalog.pg_dist_shard_placement s
			ON s.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, m.topic)`,
		pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable}.Sanitize()).Scan(&stored, &workers))
	require.Equal(t, 16, stored)
	require.Equal(t, 2, workers, "the 8 topics lie on both workers")

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter}, nil)
	require.NoError(t, err)
	defer sub.Close()
	for i := range 8 {
		topic := fmt.Sprintf("t%d", i)
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		for _, want := range []string{topic + "/1", topic + "/2"} {
			select {
			case m := <-ch:
				require.Equal(t, want, m.UUID)
				m.Ack()
			case <-ctx.Done():
				t.Fatalf("topic %s: %s not delivered", topic, want)
			}
		}
	}
}

// TestCitusPubSub runs Watermill's universal Pub/Sub test suite against
// the coordinator of a Citus cluster, the tables distributed.
func TestCitusPubSub(t *testing.T) {
	pool, adapter := citusSchema(t, 60)
	c := newConformanceWith(t, pool, adapter)
	features := c.features()
	features.RestartServiceCommand = nil // one server restarted is the single-node suite's
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
		c.pubSub,
	)
}

// TestCitusCrashAcrossWorkers: 8 topics of 10,000 messages each, spread
// over both workers, consumed by one group in 3 processes through a
// Router; one process is killed with SIGKILL half-way. Every message is
// processed, each topic in order (a message is processed for the first
// time only after every message before it in its topic was), and the
// only duplicates are the killed process's unacknowledged messages,
// processed again by the member that took its topics over.
func TestCitusCrashAcrossWorkers(t *testing.T) {
	const (
		nTopics   = 8
		perTopic  = 10000
		ttl       = 2 * time.Second
		processed = "test_processed"
	)
	pool, adapter := citusSchema(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE `+table(adapter, processed)+` (
	id bigserial PRIMARY KEY, proc text NOT NULL, sub int NOT NULL, pid int NOT NULL, topic text NOT NULL,
	uuid text NOT NULL, received_at timestamptz NOT NULL, recorded_at timestamptz NOT NULL,
	owner_session uuid, owner_epoch bigint)`)
	require.NoError(t, err)

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	topics := numberedTopics("c", 0, nTopics)
	published := time.Now()
	for _, topic := range topics {
		for i := 0; i < perTopic; i += 500 {
			msgs := make([]*message.Message, 0, 500)
			for j := i; j < i+500; j++ {
				msgs = append(msgs, message.NewMessage(fmt.Sprintf("%s/%05d", topic, j), nil))
			}
			require.NoError(t, pub.Publish(topic, msgs...))
		}
	}
	t.Logf("published %d messages to %d topics in %s", nTopics*perTopic, nTopics, time.Since(published).Round(time.Millisecond))

	cfg := helperConfig{Schema: adapter.Schema, Group: "crash", Topics: topics, Mode: modeRouter, SessionTTL: ttl,
		PollInterval: pglease.DefaultPollInterval, NoKeepalive: true, DSN: os.Getenv("PGLEASE_TEST_DSN")}
	procs := startHelpers(t, cfg.named("a"), cfg.named("b"), cfg.named("c"))
	count := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(DISTINCT uuid) FROM `+table(adapter, processed)).Scan(&n))
		return n
	}
	// The deadline is a safety net, not a speed target: with -race, three
	// processes and the cluster on 2 cores, half took 100-130 s in runs of
	// 2026-11-29.
	started := time.Now()
	waitFor(t, 4*time.Minute, "half of the messages processed", func() bool { return count() >= nTopics*perTopic/2 })
	t.Logf("half of the messages processed in %s", time.Since(started).Round(time.Millisecond))
	procs[1].signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	waitFor(t, 3*time.Minute, "every message processed", func() bool { return count() == nTopics*perTopic })
	t.Logf("all processed %s after the SIGKILL (SessionTTL %s)", time.Since(killedAt).Round(time.Millisecond), ttl)
	procs[0].close(t)
	procs[2].close(t)

	rows, err := pool.Query(ctx, `SELECT proc, topic, uuid FROM `+table(adapter, processed)+` ORDER BY id`)
	require.NoError(t, err)
	seen := map[string]bool{}
	next := map[string]int{} // per topic: the index of the first message not processed yet
	dups := map[string]int{} // per process
	for rows.Next() {
		var proc, topic, id string
		require.NoError(t, rows.Scan(&proc, &topic, &id))
		var idx int
		_, err := fmt.Sscanf(id[len(topic)+1:], "%d", &idx)
		require.NoError(t, err, id)
		if seen[id] {
			dups[proc]++
			continue
		}
		seen[id] = true
		require.Equal(t, next[topic], idx, "topic %s: message %d processed before message %d", topic, idx, next[topic])
		next[topic]++
	}
	require.NoError(t, rows.Err())
	for _, topic := range topics {
		require.Equal(t, perTopic, next[topic], "topic %s", topic)
	}
	t.Logf("duplicates by process: %v", dups)
	for proc, n := range dups {
		require.Contains(t, []string{"a", "c"}, proc, "only the survivors process a message again")
		require.LessOrEqual(t, n, 2000, "%s processed %d messages again", proc, n)
	}
}

// BenchmarkCitusThroughput publishes 8 topics × 5,000 messages, 100 per
// call from a goroutine per topic, and consumes them with one Subscriber
// of the 8 topics, on the coordinator of the cluster of `make
// test-citus` (workers: localcitus -workers); without a cluster, on the
// single server of PGLEASE_TEST_DSN, for comparison. It reports messages
// per second each way.
//
//	go run ./internal/cmd/localcitus -workers 2 -- go test -run '^$' -bench CitusThroughput -benchtime 3x .
func BenchmarkCitusThroughput(b *testing.B) {
	const (
		nTopics  = 8
		perTopic = 5000
		batch    = 100
	)
	var publishRate, consumeRate []float64
	for range b.N {
		var (
			pool    *pgxpool.Pool
			adapter pglease.Tables
		)
		if os.Getenv("PGLEASE_TEST_CITUS") != "" {
			pool, adapter = citusSchema(b, 40)
		} else {
			pool = newPool(b, 40)
			adapter = newSchema(b, pool)
		}
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, nil)
		require.NoError(b, err)
		topics := numberedTopics("b", 0, nTopics)
		start := time.Now()
		var wg sync.WaitGroup
		for _, topic := range topics {
			wg.Go(func() {
				for i := 0; i < perTopic; i += batch {
					msgs := make([]*message.Message, 0, batch)
					for range batch {
						msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte("x")))
					}
					if err := pub.Publish(topic, msgs...); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		publishRate = append(publishRate, nTopics*perTopic/time.Since(start).Seconds())
		require.NoError(b, pub.Close())

		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "bench", Tables: adapter}, nil)
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		start = time.Now()
		for _, topic := range topics {
			ch, err := sub.Subscribe(ctx, topic)
			require.NoError(b, err)
			wg.Go(func() {
				for range perTopic {
					(<-ch).Ack()
				}
			})
		}
		wg.Wait()
		consumeRate = append(consumeRate, nTopics*perTopic/time.Since(start).Seconds())
		cancel()
		require.NoError(b, sub.Close())
	}
	b.ReportMetric(median(publishRate), "published/s")
	b.ReportMetric(median(consumeRate), "consumed/s")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestCitusShardMove moves a topic's shard to the other worker, whose
// transaction counter lies far below the source's (the source's raised
// 300,000 above every worker's first, by PrepareCitusMoveSQL), while a Subscriber consumes the topic and a
// Publisher publishes to it. Without PrepareCitusMoveSQL first, a
// message published after the move gets a transaction id below the
// group's position: it would be skipped. With it, the moved rows keep
// their transaction ids, new messages sort after the position, and
// every message published before, during and after the move is
// delivered, in order; the consumer's statements find the topic on
// another worker and resynchronise, which delivers again at most the
// message acknowledged and not yet committed.
func TestCitusShardMove(t *testing.T) {
	for _, level := range []bool{false, true} {
		t.Run(fmt.Sprintf("level=%t", level), func(t *testing.T) { testCitusShardMove(t, level) })
	}
}

func testCitusShardMove(t *testing.T, level bool) {
	const (
		topic, group = "moving", "g"
		ahead        = 300000
	)
	pool, adapter := citusSchema(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	messages := table(adapter, pglease.DefaultMessagesTable)
	var (
		shard          int64
		source, target int
		host           string
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.shardid, p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, messages, topic).Scan(&shard, &host, &source))
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, source).Scan(&target))
	_, err := pool.Exec(ctx, pglease.PrepareCitusMoveSQL(host, source, ahead))
	require.NoError(t, err)

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
		CommitBatch: 1}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var (
		mu       sync.Mutex
		received []string
	)
	go func() {
		for m := range ch {
			mu.Lock()
			received = append(received, m.UUID)
			mu.Unlock()
			m.Ack()
		}
	}()
	receivedN := func() int { mu.Lock(); defer mu.Unlock(); return len(received) }

	// Published before the move, consumed and committed on the source.
	var published []string
	publish := func(n int) {
		for range n {
			id := fmt.Sprintf("m%05d", len(published))
			require.NoError(t, pub.Publish(topic, message.NewMessage(id, nil)))
			published = append(published, id)
		}
	}
	publish(50)
	waitFor(t, 30*time.Second, "the first messages consumed and committed", func() bool {
		return receivedN() == 50 && ackedOffset(t, pool, adapter, group, topic).Offset > 0
	})
	txIDs := func() map[string]string {
		rows, err := pool.Query(ctx, `SELECT uuid, transaction_id::text FROM `+messages+` WHERE topic = $1`, topic)
		require.NoError(t, err)
		m := map[string]string{}
		for rows.Next() {
			var id, tx string
			require.NoError(t, rows.Scan(&id, &tx))
			m[id] = tx
		}
		require.NoError(t, rows.Err())
		return m
	}
	before := txIDs()

	// Publishing goes on while the shard moves.
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			publish(1)
		}
	}()
	if level {
		_, err := pool.Exec(ctx, pglease.PrepareCitusMoveSQL(host, target, 100000))
		require.NoError(t, err)
	}
	moveStart := time.Now()
	_, err = pool.Exec(ctx, `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $2, $4, shard_transfer_mode => 'block_writes')`,
		shard, host, source, target)
	require.NoError(t, err)
	t.Logf("shard moved in %s", time.Since(moveStart).Round(time.Millisecond))
	close(stop)
	<-stopped

	after := txIDs()
	for id, tx := range before {
		require.Equal(t, tx, after[id], "message %s kept its transaction id through the move", id)
	}
	acked := ackedOffset(t, pool, adapter, group, topic)
	publish(1)
	var newTx string
	require.NoError(t, pool.QueryRow(ctx, `SELECT transaction_id::text FROM `+messages+` WHERE topic = $1 AND uuid = $2`,
		topic, published[len(published)-1]).Scan(&newTx))
	newPos := parsePos(newTx, 0)
	if !level {
		require.Less(t, newPos.TransactionID, acked.TransactionID,
			"without leveling, a message published after the move sorts below the group's position")
		return
	}
	require.Greater(t, newPos.TransactionID, acked.TransactionID, "a message published after the move sorts after the position")
	publish(50)
	// The consumer's statements find another worker after the move and
	// resynchronise, as after a failover: a message acknowledged but
	// not committed yet is delivered again (CommitBatch 1: at most the
	// one in hand).
	firsts := func() (first []string, again int) {
		mu.Lock()
		defer mu.Unlock()
		seen := map[string]bool{}
		for _, id := range received {
			if seen[id] {
				again++
				continue
			}
			seen[id] = true
			first = append(first, id)
		}
		return first, again
	}
	waitFor(t, time.Minute, "every message delivered", func() bool { first, _ := firsts(); return len(first) >= len(published) })
	first, again := firsts()
	require.Equal(t, published, first, "every message, in order")
	require.LessOrEqual(t, again, 2, "delivered again after the move")
	t.Logf("%d messages published before, during and after the move, all delivered in order, %d again", len(published), again)
}

// TestCitusPartitionedTopic: CreateTopic sets partitions and a retention
// on Citus (its upsert runs there), raising the partition count later
// too; messages with keys spread over the partitions, all on the topic's
// worker, and one Subscriber gets each key's messages in order.
func TestCitusPartitionedTopic(t *testing.T) {
	pool, adapter := citusSchema(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "parts"
	require.NoError(t, pglease.CreateTopic(ctx, pool, topic, pglease.TopicConfig{Partitions: 2, Retention: time.Hour, Tables: adapter}))
	require.NoError(t, pglease.CreateTopic(ctx, pool, topic, pglease.TopicConfig{Partitions: 4, Retention: time.Hour, Tables: adapter}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter,
		PartitionKey: func(_ string, msg *message.Message) (string, error) { return msg.Metadata.Get("key"), nil }}, nil)
	require.NoError(t, err)
	defer pub.Close()
	const keys, perKey = 8, 20
	for i := range perKey {
		for k := range keys {
			m := message.NewMessage(fmt.Sprintf("k%d/%02d", k, i), nil)
			m.Metadata.Set("key", fmt.Sprintf("k%d", k))
			require.NoError(t, pub.Publish(topic, m))
		}
	}
	var partitions int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(DISTINCT partition) FROM `+
		table(adapter, pglease.DefaultMessagesTable)+` WHERE topic = $1`, topic).Scan(&partitions))
	require.Greater(t, partitions, 1, "the keys spread over the partitions")

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter}, nil)
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	next := map[string]int{}
	for range keys * perKey {
		select {
		case m := <-ch:
			key := m.Metadata.Get("key")
			require.Equal(t, fmt.Sprintf("%s/%02d", key, next[key]), m.UUID, "key %s in order", key)
			next[key]++
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("delivered %v of %d per key", next, perKey)
		}
	}
}

// TestCitusTxHandler: exactly-once on Citus. A Router's TxHandler writes
// an effect row (a reference table, on every node) and publishes a
// derived message in the transaction that acknowledges the message
// (AckInTx, two statements there: see the Citus driver's AckOffset); one attempt fails
// after writing its effect. Every message has one effect and one derived
// message.
func TestCitusTxHandler(t *testing.T) {
	pool, adapter := citusSchema(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createEffects(t, pool, adapter)
	_, err := pool.Exec(ctx, `SELECT pg_catalog.create_reference_table($1)`, table(adapter, effectsTable))
	require.NoError(t, err)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "orders", pglease.TopicConfig{Partitions: 2, Tables: adapter}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	var ids []string
	for i := range 100 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
		ids = append(ids, msg.UUID)
		require.NoError(t, pub.Publish("orders", msg))
	}
	routeWithTxHandler(t, pool, adapter, ids)
}

// TestCitusResetOffsets: the Inspector's reset of a group's positions on
// a topic works on Citus, with a live owner (forced): back to the
// earliest, the owner delivers the topic again from the start; to the
// latest, a new message is the next delivered.
func TestCitusResetOffsets(t *testing.T) {
	pool, adapter := citusSchema(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic, group = "resets", "g"
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for i := range 5 {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("m%d", i), nil)))
	}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter, CommitBatch: 1}, nil)
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	next := func() string {
		select {
		case m := <-ch:
			m.Ack()
			return m.UUID
		case <-ctx.Done():
			t.Fatal("no message")
			return ""
		}
	}
	for i := range 5 {
		require.Equal(t, fmt.Sprintf("m%d", i), next())
	}
	waitFor(t, 30*time.Second, "the last position committed", func() bool {
		return ackedOffset(t, pool, adapter, group, topic).Offset == 5
	})
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	res, err := insp.ResetOffsets(ctx, admin.ResetOffsetsParams{ConsumerGroup: group, Topic: topic, To: admin.ResetToEarliest, Force: true})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NotEqual(t, res[0].PreviousOwner, "", "the live owner, fenced")
	require.Equal(t, "m0", next(), "delivered again from the start")

	res, err = insp.ResetOffsets(ctx, admin.ResetOffsetsParams{ConsumerGroup: group, Topic: topic, To: admin.ResetToLatest, Force: true})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, pub.Publish(topic, message.NewMessage("after", nil)))
	for {
		// Messages already out before the reset took effect may come.
		if id := next(); id == "after" {
			break
		}
	}
}

// TestCitusPrepareShardMoveRaisesOnlyToTheSource: PrepareCitusShardMoveSQL
// sets the target's position sequences to the margin (at least 2^32)
// above the source's last position, and leaves a target that is there
// already where it is; PrepareCitusMoveSQL raises it above every worker.
func TestCitusPrepareShardMoveRaisesOnlyToTheSource(t *testing.T) {
	pool, adapter := citusSchema(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type worker struct {
		host string
		port int
	}
	var workers []worker
	rows, err := pool.Query(ctx, `SELECT nodename, nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' ORDER BY nodeport`)
	require.NoError(t, err)
	for rows.Next() {
		var w worker
		require.NoError(t, rows.Scan(&w.host, &w.port))
		workers = append(workers, w)
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, len(workers), 2, "two workers")
	seq := pglease.PartitionName(adapter, "positions")
	last := func(w worker) uint64 {
		var c uint64
		require.NoError(t, pool.QueryRow(ctx, `SELECT r.result::bigint FROM pg_catalog.master_run_on_worker(ARRAY[$1::text], ARRAY[$2::integer],
			ARRAY[pg_catalog.format('SELECT last_value FROM %I.%I', $3::text, $4::text)], false) r`, w.host, w.port, adapter.Schema, seq).Scan(&c))
		return c
	}
	a, b := workers[0], workers[1]
	const margin = 1 << 32
	_, err = pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(a.host, a.port, b.host, b.port, 1000))
	require.NoError(t, err)
	require.GreaterOrEqual(t, last(b), last(a)+margin, "the target above the source by the margin (at least 2^32)")

	// Again: b is there already and stays.
	before := last(b)
	_, err = pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(a.host, a.port, b.host, b.port, 1000))
	require.NoError(t, err)
	require.Equal(t, before, last(b), "a target ahead of the source is left alone")

	// The other way: a, now behind, is raised above b; and above every
	// worker by PrepareCitusMoveSQL.
	_, err = pool.Exec(ctx, pglease.PrepareCitusShardMoveSQL(b.host, b.port, a.host, a.port, 1000))
	require.NoError(t, err)
	require.GreaterOrEqual(t, last(a), last(b)+margin)
	top := max(last(a), last(b))
	_, err = pool.Exec(ctx, pglease.PrepareCitusMoveSQL(b.host, b.port, 1000))
	require.NoError(t, err)
	require.GreaterOrEqual(t, last(b), top+margin)
}

// TestCitusUpgradeSetsPositionsOnTheWorkers migrates a distributed schema
// of version 10, whose trigger set only the transaction id, to the latest:
// the trigger's function is replaced on every worker, where it runs, and a
// message inserted with a creation time of its own gets the database's.
func TestCitusUpgradeSetsPositionsOnTheWorkers(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, migrateTo(ctx, pool, adapter, 10))
	_, err := pool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err)
	fn := pgx.Identifier{adapter.Schema, pglease.PartitionName(adapter, "transaction_id")}.Sanitize()
	// The function as schema version 10's DistributeSQL made it.
	_, err = pool.Exec(ctx, `CREATE OR REPLACE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
BEGIN
	NEW.transaction_id := pg_catalog.pg_current_xact_id();
	RETURN NEW;
END$f$`)
	require.NoError(t, err)
	onWorkers := func() []string {
		rows, err := pool.Query(ctx, `SELECT c.result FROM pg_catalog.run_command_on_workers(
	pg_catalog.format('SELECT prosrc LIKE %L FROM pg_catalog.pg_proc WHERE oid = %L::regproc', '%created_at%', $1::text)) c`, fn)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	require.Equal(t, []string{"f", "f"}, onWorkers(), "version 10's function on both workers")

	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	require.Equal(t, []string{"t", "t"}, onWorkers(), "the function sets the time on both workers")
	messages := table(adapter, pglease.DefaultMessagesTable)
	_, err = pool.Exec(ctx, `INSERT INTO `+messages+` (topic, uuid, created_at) VALUES ('a', 'u', '2000-01-01')`)
	require.NoError(t, err)
	var recent bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT created_at > now() - interval '1 hour' FROM `+messages+` WHERE topic = 'a'`).Scan(&recent))
	require.True(t, recent, "the creation time is the database's")
}

// TestCitusMigrateUnderTraffic brings a schema distributed by an earlier
// release (positions from the workers' transaction ids, no sequence on
// the workers) across with DistributeSQL while a Publisher publishes and
// another holds a transaction with a message open across the switch: the
// script waits for that transaction, every new position sorts after every
// stored one, and a group whose position was committed before the switch
// gets every later message, in position order, none lost.
func TestCitusMigrateUnderTraffic(t *testing.T) {
	const topic, group = "switching", "g"
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	messages := table(adapter, pglease.DefaultMessagesTable)
	fn := pgx.Identifier{adapter.Schema, pglease.PartitionName(adapter, "transaction_id")}.Sanitize()
	trigger := pgx.Identifier{pglease.PartitionName(adapter, "transaction_id")}.Sanitize()
	// The earlier release's schema.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	for _, sql := range []string{`SET LOCAL citus.enable_unsafe_triggers TO on`,
		`CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
BEGIN
	NEW.transaction_id := pg_catalog.pg_current_xact_id();
	NEW.created_at := pg_catalog.now();
	RETURN NEW;
END$f$`,
		`DROP TRIGGER ` + trigger + ` ON ` + messages,
		`CREATE TRIGGER ` + trigger + ` BEFORE INSERT ON ` + messages + ` FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	} {
		_, err = tx.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	_, err = pool.Exec(ctx, `SELECT pg_catalog.run_command_on_workers(pg_catalog.format(
	'DO $d$ BEGIN PERFORM pg_catalog.set_config(''citus.enable_ddl_propagation'', ''off'', true); DROP SEQUENCE %I.%I; END $d$',
	$1::text, $2::text))`, adapter.Schema, pglease.PartitionName(adapter, "positions"))
	require.NoError(t, err)

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	n := 0
	publish := func() {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("m%04d", n), nil)))
		n++
	}
	for range 20 {
		publish()
	}
	// The group committed the 10th message before the switch.
	_, err = pool.Exec(ctx, `INSERT INTO `+table(adapter, pglease.DefaultConsumerOffsetsTable)+`
	(consumer_group, topic, partition, acked_transaction_id, acked_offset)
SELECT $1, $2, 0, m.transaction_id, m."offset" FROM `+messages+` m WHERE m.topic = $2
ORDER BY m.transaction_id, m."offset" OFFSET 9 LIMIT 1`, group, topic)
	require.NoError(t, err)
	var oldTop string
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(transaction_id)::text FROM `+messages).Scan(&oldTop))

	held, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(context.WithoutCancel(ctx)) }()
	heldPub, err := pglease.NewPublisher(held, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	require.NoError(t, heldPub.Publish(topic, message.NewMessage("held", nil)))
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			publish()
		}
	}()
	committed := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		committed <- held.Commit(context.WithoutCancel(ctx))
	}()
	start := time.Now()
	_, err = pool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err)
	require.NoError(t, <-committed)
	t.Logf("switched in %s (waited for the open publisher)", time.Since(start).Round(time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "the switch waited for the transaction that inserted with the old trigger")
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-stopped
	for range 20 {
		publish()
	}
	var below int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+messages+` WHERE topic = $1 AND created_at > $2 AND transaction_id <= $3::xid8`,
		topic, start.Add(2*time.Second), oldTop).Scan(&below))
	require.Zero(t, below, "no new position at or below a stored one")

	rows, err := pool.Query(ctx, `SELECT m.uuid FROM `+messages+` m, `+table(adapter, pglease.DefaultConsumerOffsetsTable)+` o
WHERE m.topic = $1 AND o.topic = $1 AND o.consumer_group = $2 AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)
ORDER BY m.transaction_id, m."offset"`, topic, group)
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, want, "held")
	require.Len(t, want, n+1-10)

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var got []string
	for len(got) < len(want) {
		select {
		case m := <-ch:
			got = append(got, m.UUID)
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("delivered %d of %d", len(got), len(want))
		}
	}
	require.Equal(t, want, got, "every message after the group's position, in position order")
}

// TestCitusDeliveryStallNamesTheWorker: on Citus, the stall log of a
// topic held by an open outbox transaction names the holder as on a
// single node (TestDeliveryStallIsLoggedOnce): the transaction's backend
// on the topic's worker, and that worker; the messages come once it ends.
func TestCitusDeliveryStallNamesTheWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, adapter := citusSchema(t, 10)
	pub := newPublisher(t, pool, adapter)
	logs := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, PollInterval: 50 * time.Millisecond}, logs)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	publishN(t, pub, "t", 1)
	receiveOne(t, msgs).Ack()

	var worker string
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.nodename || ':' || p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, 't'::text)`,
		pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable}.Sanitize()).Scan(&worker))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var coordinatorPID int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&coordinatorPID))
	outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.Publish("t", message.NewMessage(watermill.NewUUID(), []byte("outbox"))))
	held := publishN(t, pub, "t", 1)

	var stall *logEntry
	waitFor(t, 30*time.Second, "the stall to be logged", func() bool {
		for _, e := range logs.Entries() {
			if errors.Is(e.Err, pglease.ErrDeliveryHeldBack) {
				stall = &e
				return true
			}
		}
		return false
	})
	require.Equal(t, "t", stall.Fields["topic"])
	require.Equal(t, worker, stall.Fields["worker"], "the topic's worker: %v", stall.Fields)
	pid, _ := stall.Fields["pid"].(int)
	require.True(t, pid != 0 && pid != coordinatorPID, "the holder's backend on the worker: %v", stall.Fields)

	require.NoError(t, tx.Rollback(ctx))
	for _, id := range held {
		m := receiveOne(t, msgs)
		require.Equal(t, id, m.UUID)
		m.Ack()
	}
}
