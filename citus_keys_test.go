package pglease_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// TestCitusKeyedPublishWithAWorkerDown stops one worker of a Citus
// cluster (pg_ctl stop -m fast) and publishes messages with idempotency
// keys to a topic whose shard lies on the other: through a pool, a
// connection and a transaction (the outbox), each is stored, and
// published again is left out (its key recognised). A keyed Publish
// writes on its topic's worker only; one that opened a transaction on
// every worker failed while any was down. A Publish to a topic of the
// stopped worker fails. The cluster is the test's own (a coordinator and
// two workers, started by pgrepl next to the cluster of `make
// test-citus`, which enables it).
func TestCitusKeyedPublishWithAWorkerDown(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs Citus: run `make test-citus`")
	}
	pgtest.SkipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	x, err := pgrepl.StartCitus(ctx, pgrepl.CitusOptions{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, x.Close()) })
	down, up := x.Workers[0], x.Workers[1]

	pool := newPoolOn(t, x.Coordinator.DSN(), 4)
	adapter := pglease.Tables{Schema: "pglease_keys_down"}
	distribute(t, pool, adapter)
	messages := table(adapter, pglease.DefaultMessagesTable)

	// A topic on each worker, and one more on the worker that stays up
	// with a retention of three days (keys in its retention class's rows
	// once the maintainer has made them; in day rows until then).
	onPort := map[int][]string{}
	for i := 0; i < 64 && (len(onPort[down.Port()]) < 1 || len(onPort[up.Port()]) < 2); i++ {
		name := fmt.Sprintf("kd%02d", i)
		var port int
		require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_shard_placement
			WHERE shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, messages, name).Scan(&port))
		onPort[port] = append(onPort[port], name)
	}
	require.NotEmpty(t, onPort[down.Port()], "a topic on the worker to stop among the first 64 names")
	require.GreaterOrEqual(t, len(onPort[up.Port()]), 2, "two topics on the other worker among the first 64 names")
	downTopic, upTopic, retained := onPort[down.Port()][0], onPort[up.Port()][0], onPort[up.Port()][1]
	require.NoError(t, pglease.CreateTopic(ctx, pool, retained, pglease.TopicConfig{Retention: 72 * time.Hour, Tables: adapter}))

	config := pglease.PublisherConfig{Tables: adapter, IdempotencyKey: keyedByUUID}
	pub, err := pglease.NewPublisher(pool, config, nil)
	require.NoError(t, err)
	defer pub.Close()
	// publish publishes msgs to topic through pub and returns the indexes
	// left out.
	publish := func(pub *pglease.Publisher, topic string, msgs ...*message.Message) []int {
		t.Helper()
		for _, m := range msgs {
			m.SetContext(ctx)
		}
		res, err := pub.PublishWithResult(topic, msgs...)
		require.NoError(t, err, "a keyed Publish to topic %s", topic)
		return res.AlreadyStored
	}
	// Both workers up: published once, left out the second time.
	for _, topic := range []string{downTopic, upTopic, retained} {
		m := message.NewMessage("before-"+topic, nil)
		require.Empty(t, publish(pub, topic, m))
		require.Equal(t, []int{0}, publish(pub, topic, m))
	}

	require.NoError(t, down.Stop())
	t.Logf("worker on port %d stopped; publishing to %s and %s on port %d", down.Port(), upTopic, retained, up.Port())

	for _, topic := range []string{upTopic, retained} {
		// A pool: the call's own transaction.
		a, b := message.NewMessage("pool-a-"+topic, nil), message.NewMessage("pool-b-"+topic, nil)
		require.Empty(t, publish(pub, topic, a, b), "stored while the other worker is down")
		require.Equal(t, []int{0, 1}, publish(pub, topic, a, b), "recognised when published again")
		c := message.NewMessage("pool-c-"+topic, nil)
		require.Equal(t, []int{1, 2}, publish(pub, topic, c, a, c), "one new, one stored and the first repeated in the call: %s", topic)

		// A connection outside a transaction.
		conn, err := pgx.Connect(ctx, x.Coordinator.DSN())
		require.NoError(t, err)
		onConn, err := pglease.NewPublisher(conn, config, nil)
		require.NoError(t, err)
		d := message.NewMessage("conn-"+topic, nil)
		require.Empty(t, publish(onConn, topic, d))
		require.Equal(t, []int{0, 1}, publish(onConn, topic, d, b))
		require.NoError(t, onConn.Close())
		require.NoError(t, conn.Close(ctx))

		// A transaction (the outbox): stored with the transaction.
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		inTx, err := pglease.NewPublisher(tx, config, nil)
		require.NoError(t, err)
		e := message.NewMessage("tx-"+topic, nil)
		require.Equal(t, []int{1}, publish(inTx, topic, e, a))
		require.Equal(t, []int{0}, publish(inTx, topic, e))
		require.NoError(t, inTx.Close())
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, []int{0}, publish(pub, topic, e), "committed with its transaction")

		var rows, distinct int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT uuid) FROM `+messages+` WHERE topic = $1`, topic).Scan(&rows, &distinct))
		require.Equal(t, 6, rows, "%s: before, a, b, c, the connection's and the transaction's, once each", topic)
		require.Equal(t, 6, distinct, topic)
	}

	// The stopped worker's topic cannot be published to.
	m := message.NewMessage("while-down-"+downTopic, nil)
	m.SetContext(ctx)
	_, err = pub.PublishWithResult(downTopic, m)
	require.Error(t, err, "a Publish to a topic of the stopped worker")
	t.Logf("a Publish to %s, on the stopped worker: %v", downTopic, err)
}
