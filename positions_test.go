package pglease_test

import (
	"context"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
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

// TestMigrationToSequencePositionsUnderTraffic: schema version 14 under
// traffic. A group half-way through a backlog of transaction-id positions
// continues exactly where it was; a transaction that published with the
// old trigger before the migration makes it wait (forced: the migration
// is seen waiting for its lock before the transaction commits), and
// publishers that run through the migration lose nothing: every message
// after the group's position is delivered once, each publisher's in the
// order it published them.
func TestMigrationToSequencePositionsUnderTraffic(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 12)
	adapter := newSchema(t, pool)
	require.NoError(t, migrateTo(ctx, pool, adapter, 13))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	const topic, group = "t", "g"
	backlog := publishN(t, pub, topic, 100)

	// The group acknowledged the 50th message of the backlog.
	var tx string
	var off int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT transaction_id::text, "offset" FROM `+table(adapter, pglease.DefaultMessagesTable)+
		` WHERE uuid = $1`, backlog[49]).Scan(&tx, &off))
	_, err = pool.Exec(ctx, `INSERT INTO `+table(adapter, pglease.DefaultConsumerOffsetsTable)+
		` (consumer_group, topic, partition, acked_transaction_id, acked_offset) VALUES ($1, $2, 0, $3::text::xid8, $4)`, group, topic, tx, off)
	require.NoError(t, err)

	// A transaction publishes with the old trigger and stays open.
	oldTx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = oldTx.Rollback(context.WithoutCancel(ctx)) }()
	outbox, err := pglease.NewPublisher(oldTx, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	inOld := message.NewMessage(watermill.NewUUID(), []byte("old"))
	require.NoError(t, outbox.Publish(topic, inOld))

	// Publishers keep publishing through the migration.
	const publishers = 4
	stop := make(chan struct{})
	published := make([][]string, publishers)
	var count atomic.Int64
	errs := make(chan error, publishers)
	for i := range publishers {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
				if err := pub.Publish(topic, msg); err != nil {
					errs <- err
					return
				}
				published[i] = append(published[i], msg.UUID)
				count.Add(1)
			}
		}()
	}
	waitFor(t, 30*time.Second, "publishers to publish", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, pglease.DefaultMessagesTable)).Scan(&n)
		return n > 150
	})

	migrator, err := pgx.Connect(ctx, testkit.DSN)
	require.NoError(t, err)
	defer migrator.Close(ctx)
	migrated := make(chan error, 1)
	go func() { migrated <- migrateTo(ctx, migrator, adapter, 14) }()
	require.True(t, waitBlockedOnLock(t, pool, migrator.PgConn().PID(), nil), "the migration waits for the open publisher")
	require.NoError(t, oldTx.Commit(ctx))
	require.NoError(t, <-migrated)
	after := count.Load()
	waitFor(t, 30*time.Second, "publishers to publish after the migration", func() bool { return count.Load() >= after+50 })
	close(stop)
	for range publishers {
		require.NoError(t, <-errs)
	}

	want := map[string]bool{inOld.UUID: true}
	for _, id := range backlog[50:] {
		want[id] = true
	}
	total := len(want)
	for _, ids := range published {
		for _, id := range ids {
			want[id] = true
		}
		total += len(ids)
	}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, ConsumerGroup: group}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := testkit.UUIDs(testkit.Receive(t, msgs, total, time.Minute))
	require.Equal(t, backlog[50:], got[:50], "the group continues after the 50th message of the backlog")
	seen := map[string]bool{}
	for _, id := range got {
		require.True(t, want[id], "delivered %s, which lies at or before the group's position", id)
		require.False(t, seen[id], "delivered %s twice", id)
		seen[id] = true
	}
	order := map[string]int{}
	for i, id := range got {
		order[id] = i
	}
	for i, ids := range published {
		for j := 1; j < len(ids); j++ {
			require.Less(t, order[ids[j-1]], order[ids[j]], "publisher %d's messages in the order published", i)
		}
	}
	t.Logf("%d messages delivered after the group's position, %d of them by the publishers that ran through the migration",
		total, total-51)
}

// TestPositionsInTheDefaultSchema: with the tables' schema left to the
// search_path (Tables.Schema empty), the trigger and the bound find the
// sequence in the messages table's schema; a session's own temporary
// sequence of the same name is not used (the functions search pg_temp
// last), so a publisher cannot choose its positions through it.
func TestPositionsInTheDefaultSchema(t *testing.T) {
	pgtest.SkipShort(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testkit.DSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	name := "pglease_default_" + randomHex(6)
	_, err = admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	defer func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
	}()
	u, err := url.Parse(testkit.DSN)
	require.NoError(t, err)
	u.Path = "/" + name
	pool := newPoolOn(t, u.String(), 4)
	cfg, err := pgx.ParseConfig(u.String())
	require.NoError(t, err)
	var adapter pglease.Tables
	require.NoError(t, migrateTo(ctx, pool, adapter, len(tablesOf(adapter).Migrations())))

	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TEMPORARY SEQUENCE pglease_messages_positions`)
	require.NoError(t, err)
	pub, err := pglease.NewPublisher(conn, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish("t", msg))
	var position, temp uint64
	require.NoError(t, conn.QueryRow(ctx, `SELECT transaction_id::text::bigint FROM pglease_messages WHERE uuid = $1`, msg.UUID).Scan(&position))
	require.NoError(t, conn.QueryRow(ctx, `SELECT last_value FROM pg_temp.pglease_messages_positions`).Scan(&temp))
	require.Greater(t, position, uint64(1)<<40, "the position comes from the tables' sequence")
	require.Equal(t, uint64(1), temp, "the session's temporary sequence is untouched")

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receiveOne(t, msgs)
	require.Equal(t, msg.UUID, got.UUID)
	got.Ack()
}
