package pglease_test

import (
	"context"
	"fmt"
	"os"
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
