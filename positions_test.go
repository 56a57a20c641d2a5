package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// TestUnrelatedTransactionsHoldNoTopic: the two cases of decision 0008
// that held every topic while positions were transaction ids. A
// transaction of another database of the server holding an INSERT open,
// and an outbox transaction that published to topic a and stays open,
// hold back no message of topic b: each is delivered while they run (the
// test waits for each before publishing the next). a's messages published
// after the outbox's come after it, once it commits; nothing is lost. The
// delays measured are logged.
func TestUnrelatedTransactionsHoldNoTopic(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	msgsA, err := sub.Subscribe(ctx, "a")
	require.NoError(t, err)
	msgsB, err := sub.Subscribe(ctx, "b")
	require.NoError(t, err)
	publishN(t, pub, "b", 1)
	receiveOne(t, msgsB).Ack()

	// publishEach publishes n messages to b, each once the one before was
	// delivered, and returns the longest delay from Publish to delivery.
	publishEach := func(n int) time.Duration {
		var worst time.Duration
		for range n {
			msg := message.NewMessage(watermill.NewUUID(), []byte("b"))
			start := time.Now()
			require.NoError(t, pub.Publish("b", msg))
			got := receiveOne(t, msgsB)
			worst = max(worst, time.Since(start))
			require.Equal(t, msg.UUID, got.UUID)
			got.Ack()
		}
		return worst
	}

	t.Run("another database", func(t *testing.T) {
		admin, err := pgx.Connect(ctx, testkit.DSN)
		require.NoError(t, err)
		defer admin.Close(ctx)
		name := "pglease_other_" + randomHex(6)
		_, err = admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
		require.NoError(t, err)
		defer func() {
			_, _ = admin.Exec(context.WithoutCancel(ctx), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
		}()
		cfg, err := pgx.ParseConfig(testkit.DSN)
		require.NoError(t, err)
		cfg.Database = name
		other, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer other.Close(ctx)
		_, err = other.Exec(ctx, `CREATE TABLE report (x integer)`)
		require.NoError(t, err)
		tx, err := other.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		_, err = tx.Exec(ctx, `INSERT INTO report VALUES (1)`)
		require.NoError(t, err)
		worst := publishEach(20)
		t.Logf("b, 20 messages while a transaction of another database holds an INSERT open: latest delivery %v", worst)
	})

	t.Run("outbox on another topic", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
		require.NoError(t, err)
		first := message.NewMessage(watermill.NewUUID(), []byte("outbox"))
		require.NoError(t, outbox.Publish("a", first))
		later := publishN(t, pub, "a", 5)
		worst := publishEach(20)
		t.Logf("b, 20 messages while an outbox transaction that published to a is open: latest delivery %v", worst)

		committed := time.Now()
		require.NoError(t, tx.Commit(ctx))
		var got []string
		for range 1 + len(later) {
			m := receiveOne(t, msgsA)
			if len(got) == 0 {
				t.Logf("a: the outbox's message delivered %v after its commit", time.Since(committed))
			}
			got = append(got, m.UUID)
			m.Ack()
		}
		require.Equal(t, append([]string{first.UUID}, later...), got, "a in position order, the outbox's message first")
	})
}
