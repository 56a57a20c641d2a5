package pglease_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// The tests of pglease on Citus run against the coordinator of a Citus
// cluster that `make test-citus` starts (a coordinator and two workers, see
// internal/cmd/localcitus), which sets PGLEASE_TEST_CITUS; without it they
// are skipped.

// citusSchema returns a pool on the coordinator and a schema of the
// test's own with the tables created and distributed (DistributeSQL).
func citusSchema(t *testing.T, maxConns int32) (*pgxpool.Pool, pglease.Tables) {
	t.Helper()
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	pool := newPool(t, maxConns)
	adapter := newSchema(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	_, err := pool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err)
	// Run again: nothing left to do.
	_, err = pool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_partition p
		JOIN pg_catalog.pg_class c ON c.oid = p.logicalrelid JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = $1 AND p.partmethod = 'h'`, adapter.Schema).Scan(&n))
	require.Equal(t, 3, n, "distributed: the messages table, its partition kept forever, the offsets")
	return pool, adapter
}

// TestCitusPublishThenSubscribe: messages published to 8 topics lie on
// both workers, and a Subscriber of each topic gets them, in order.
func TestCitusPublishThenSubscribe(t *testing.T) {
	pool, adapter := citusSchema(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
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

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", SchemaAdapter: adapter}, nil)
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE `+table(adapter, processed)+` (
	id bigserial PRIMARY KEY, proc text NOT NULL, sub int NOT NULL, pid int NOT NULL, topic text NOT NULL,
	uuid text NOT NULL, received_at timestamptz NOT NULL, recorded_at timestamptz NOT NULL,
	owner_session uuid, owner_epoch bigint)`)
	require.NoError(t, err)

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
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
	waitFor(t, 2*time.Minute, "half of the messages processed", func() bool { return count() >= nTopics*perTopic/2 })
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
