package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// waitCovered waits until the maintainer has partitions ready for every
// retention class in use well beyond retention from now: until then, new
// messages of those topics would go to the partition kept forever.
func waitCovered(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, retention time.Duration) {
	t.Helper()
	waitFor(t, 10*time.Second, "the retention partitions, usable by publishers", func() bool {
		var ready bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT COALESCE(bool_and(usable_until > now() + $1::interval),
			false) FROM `+table(adapter, pglease.DefaultRetentionTable), fmt.Sprintf("%d milliseconds", (retention+time.Second).Milliseconds())).Scan(&ready))
		return ready
	})
}

// TestDelayedMessageArrivesWhenDue publishes a message delayed by two
// seconds and then undelayed ones: those arrive at once, the delayed one
// no earlier than its time and within about a second after it.
func TestDelayedMessageArrivesWhenDue(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{PollInterval: time.Hour})
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the maintainer to be elected", func() bool { return sub.Stats().Maintainer })

	// delay.Until stores whole seconds: take a time that is one.
	due := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(delayed, delay.Until(due))
	require.NoError(t, pub.Publish("t", delayed))
	undelayed := publishN(t, pub, "t", 3)

	for _, id := range undelayed {
		m := receiveOne(t, msgs)
		assert.Equal(t, id, m.UUID, "undelayed messages are not held back by the delayed one")
		assert.True(t, time.Now().Before(due), "undelayed message arrived before the delayed one was due")
		m.Ack()
	}
	m := receiveOne(t, msgs)
	arrived := time.Now()
	require.Equal(t, delayed.UUID, m.UUID)
	m.Ack()
	assert.False(t, arrived.Before(due), "delivered %s before it was due", due.Sub(arrived))
	assert.Less(t, arrived.Sub(due), 1500*time.Millisecond, "delivered too long after it was due")
	// The counter is raised when the move statement's reply is back,
	// which the delivery it made possible may beat.
	waitFor(t, 5*time.Second, "DelayedMoved to count the move", func() bool { return sub.Stats().DelayedMoved >= 1 })
	assert.Equal(t, uint64(1), sub.Stats().DelayedMoved)
}

// TestDelayedMessageCommitsWithTheTransaction publishes delayed messages
// with a pgx.Tx: the rolled-back one is never delivered, the committed one
// is, when due.
func TestDelayedMessageCommitsWithTheTransaction(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	newPublisher(t, pool, adapter) // initializes the schema
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Tables: adapter, InitializeSchema: true}))

	publishInTx := func(commit bool) string {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		pub, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
		require.NoError(t, err)
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(commit)))
		delay.Message(msg, delay.For(time.Second))
		require.NoError(t, pub.Publish("t", msg))
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return msg.UUID
	}
	publishInTx(false)
	committed := publishInTx(true)

	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{})
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	m := receiveOne(t, msgs)
	assert.Equal(t, committed, m.UUID)
	m.Ack()
	select {
	case m := <-msgs:
		t.Fatalf("unexpected message %s", m.UUID)
	case <-time.After(2 * time.Second):
	}
}

// TestRetentionEmptiesTopic keeps a topic's messages for two seconds and
// another's forever: the first is emptied, by partitions dropped whole,
// the second keeps every message, and the group that had not consumed the
// expired messages is told it skips them.
func TestRetentionEmptiesTopic(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "short", pglease.TopicConfig{Retention: 2 * time.Second,
		Tables: adapter, InitializeSchema: true}))
	pub := newPublisher(t, pool, adapter)

	maint := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "maint"})
	_, err := maint.Subscribe(ctx, "keep")
	require.NoError(t, err)
	waitCovered(t, pool, adapter, 2*time.Second)

	// A group that stops after consuming part of the short topic.
	lagging := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "lagging",
		Maintenance: pglease.MaintenanceConfig{Disabled: true}})
	lctx, stop := context.WithCancel(ctx)
	lmsgs, err := lagging.Subscribe(lctx, "short")
	require.NoError(t, err)

	publishN(t, pub, "short", 50)
	publishN(t, pub, "keep", 50)
	count := func(topic string) (lanes, kept int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE retention_class > 0),
			count(*) FILTER (WHERE retention_class = 0) FROM `+table(adapter, pglease.DefaultMessagesTable)+
			` WHERE topic = $1`, topic).Scan(&lanes, &kept))
		return lanes, kept
	}
	lanes, kept := count("short")
	assert.Equal(t, 50, lanes, "messages of a topic with retention go to the partitions of its class")
	assert.Zero(t, kept)
	for range 10 {
		receiveOne(t, lmsgs).Ack()
	}
	stop()

	waitFor(t, 20*time.Second, "the short topic to be emptied", func() bool {
		lanes, kept := count("short")
		return lanes+kept == 0
	})
	lanes, kept = count("keep")
	assert.Equal(t, 0, lanes)
	assert.Equal(t, 50, kept, "a topic without retention keeps every message")
	st := maint.Stats()
	assert.Positive(t, st.RetentionPartitionsDropped)
	assert.Zero(t, st.RetentionRowsDeleted, "nothing was deleted row by row")
	assert.Equal(t, uint64(40), st.RetentionSkipped, "the lagging group skipped the 40 messages it had not acknowledged")
}

// TestMaintainerIsOneSubscriber runs three Subscribers: one of them is
// the maintainer; when it closes, another takes over at once.
func TestMaintainerIsOneSubscriber(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	var subs []*pglease.Subscriber
	for i := range 3 {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true,
			ConsumerGroup: fmt.Sprint("g", i), SessionTTL: 10 * time.Second}, testLogger())
		require.NoError(t, err)
		_, err = sub.Subscribe(ctx, "t")
		require.NoError(t, err)
		subs = append(subs, sub)
	}
	maintainers := func() []int {
		var out []int
		for i, s := range subs {
			if s != nil && s.Stats().Maintainer {
				out = append(out, i)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "a maintainer", func() bool { return len(maintainers()) == 1 })
	first := maintainers()[0]
	closed := time.Now()
	require.NoError(t, subs[first].Close())
	subs[first] = nil
	waitFor(t, 5*time.Second, "another maintainer", func() bool { return len(maintainers()) == 1 })
	assert.Less(t, time.Since(closed), 2*time.Second, "a released row is taken over at once, not after the TTL")
	for _, s := range subs {
		if s != nil {
			require.NoError(t, s.Close())
		}
	}
	assertNoLeakedGoroutines(t)
}

// TestRetentionSetLaterDeletesKeptMessages gives a topic whose messages
// were kept forever a retention: the expired ones are deleted row by row,
// and the group that had not consumed them is told it skips them.
func TestRetentionSetLaterDeletesKeptMessages(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "t", 20)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g",
		Maintenance: pglease.MaintenanceConfig{Interval: 200 * time.Millisecond}})
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	for range 5 {
		receiveOne(t, msgs).Ack()
	}
	// Wait for the commit of the five.
	waitFor(t, 10*time.Second, "the position to be committed", func() bool {
		return readOffset(t, pool, adapter, "g", "t").Offset > 0
	})
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Retention: time.Second, Tables: adapter}))
	waitFor(t, 20*time.Second, "the kept messages to be deleted", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table(adapter, pglease.DefaultMessagesTable)+
			" WHERE topic = 't'").Scan(&n))
		return n == 0
	})
	// The maintainer counts after its statement returned, which may be
	// after the rows were seen gone: wait for the count.
	waitFor(t, 10*time.Second, "the deleted rows to be counted", func() bool { return sub.Stats().RetentionRowsDeleted >= 20 })
	st := sub.Stats()
	assert.Equal(t, uint64(20), st.RetentionRowsDeleted)
	// The consumer may have read a few more before they were deleted.
	assert.LessOrEqual(t, st.RetentionSkipped, uint64(15))
	assert.Positive(t, st.RetentionSkipped)
}

// TestIdleGroupsAreRemoved removes the offsets of a group with no session
// and no write for longer than RemoveIdleGroupsAfter, and keeps the others.
func TestIdleGroupsAreRemoved(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "live",
		Maintenance: pglease.MaintenanceConfig{Interval: 200 * time.Millisecond, RemoveIdleGroupsAfter: time.Minute}})
	_, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	// "old" is idle; "recent" was written a moment ago; "live" is idle
	// too, but has a live session.
	_, err = pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, updated_at) VALUES
		('old', 'a', now() - interval '1 hour'), ('old', 'b', now() - interval '2 hours'),
		('recent', 'a', now()), ('live', 'a', now() - interval '1 hour')`)
	require.NoError(t, err)
	groups := func() map[string]int {
		rows, err := pool.Query(ctx, "SELECT consumer_group, count(*) FROM "+offsets+" GROUP BY 1")
		require.NoError(t, err)
		out := map[string]int{}
		for rows.Next() {
			var g string
			var n int
			require.NoError(t, rows.Scan(&g, &n))
			out[g] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	waitFor(t, 10*time.Second, "the idle group to be removed", func() bool { return groups()["old"] == 0 })
	got := groups()
	assert.Equal(t, 1, got["recent"])
	assert.Equal(t, 2, got["live"], "a group with a live session keeps its rows: %v", got)
	// The maintainer counts the group once its delete committed: after
	// the rows are gone, not with them.
	waitFor(t, 10*time.Second, "the removed group to be counted", func() bool { return sub.Stats().GroupsRemoved >= 1 })
	assert.Equal(t, uint64(1), sub.Stats().GroupsRemoved)
}

func TestMaintenanceBadInput(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Tables: adapter, InitializeSchema: true}))
	for _, r := range []time.Duration{-time.Second, 500 * time.Millisecond, pglease.MaxRetention + time.Hour} {
		err := pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Retention: r, Tables: adapter, InitializeSchema: true})
		require.ErrorIs(t, err, pglease.ErrInvalidConfig, "retention %s", r)
		assert.Contains(t, err.Error(), "TopicConfig.Retention")
	}
	good := message.NewMessage(watermill.NewUUID(), nil)
	bad := message.NewMessage(watermill.NewUUID(), nil)
	bad.Metadata.Set(delay.DelayedUntilKey, "tomorrow")
	err := pub.Publish("t", good, bad)
	require.ErrorIs(t, err, pglease.ErrInvalidMessage)
	assert.Contains(t, err.Error(), delay.DelayedUntilKey)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+table(adapter, pglease.DefaultMessagesTable)+
		") + (SELECT count(*) FROM "+table(adapter, pglease.DefaultDelayedTable)+")").Scan(&n))
	assert.Zero(t, n, "nothing of a failed Publish is stored")
	_, err = pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter,
		Maintenance: pglease.MaintenanceConfig{RemoveIdleGroupsAfter: -time.Second}}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
}

// TestInterruptedDetachIsFinished interrupts the maintainer's DETACH
// PARTITION CONCURRENTLY while it waits for an old transaction, leaving
// the partition "detach pending" (which blocks every other detach of the
// table): the maintainer finishes it on a later round, and the topic is
// emptied.
func TestInterruptedDetachIsFinished(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "short", pglease.TopicConfig{Retention: time.Second,
		Tables: adapter, InitializeSchema: true}))
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{})
	_, err := sub.Subscribe(ctx, "other")
	require.NoError(t, err)
	waitCovered(t, pool, adapter, time.Second)
	publishN(t, pub, "short", 5)

	messages := table(adapter, pglease.DefaultMessagesTable)
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
	require.NoError(t, err)
	var n int
	require.NoError(t, blocker.QueryRow(ctx, "SELECT count(*) FROM "+messages).Scan(&n))

	// The maintainer's detach of the first expired partition waits for
	// the blocker; cancel it there.
	var pid int
	waitFor(t, 20*time.Second, "a detach waiting for the old transaction", func() bool {
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE query LIKE '%DETACH PARTITION%CONCURRENTLY%' AND wait_event_type IS NOT NULL
				AND pid <> pg_backend_pid()`).Scan(&pid)
		return err == nil
	})
	var cancelled bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_cancel_backend($1)", pid).Scan(&cancelled))
	require.True(t, cancelled)
	pending := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits
			WHERE inhparent = to_regclass($1) AND inhdetachpending`, messages).Scan(&n))
		return n
	}
	waitFor(t, 10*time.Second, "the detach to be left pending", func() bool { return pending() == 1 })
	require.NoError(t, blocker.Commit(ctx))

	waitFor(t, 20*time.Second, "the pending detach to be finished and the topic emptied", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+messages+" WHERE topic = 'short'").Scan(&n))
		return pending() == 0 && n == 0
	})
	assert.Zero(t, sub.Stats().RetentionRowsDeleted, "the messages went with their partitions")
}

// TestFarFutureDelay: a delay beyond MaxDelay is refused at publish, and
// nothing of the call is stored; a delayed row due in the year 9999 (stored
// by hand, or by a version that accepted it) does not make the maintainer
// run its statement in a loop: it waits, at most an hour at a time. (The
// wait in milliseconds overflowed: 9,991 transactions per second.)
func TestFarFutureDelay(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	delayedTable := table(adapter, pglease.DefaultDelayedTable)

	far := message.NewMessage(watermill.NewUUID(), []byte("far"))
	far.Metadata.Set(delay.DelayedUntilKey, "9999-12-31T23:59:59Z")
	near := message.NewMessage(watermill.NewUUID(), []byte("near"))
	err := pub.Publish("t", near, far)
	require.ErrorIs(t, err, pglease.ErrInvalidMessage)
	require.ErrorContains(t, err, "MaxDelay")
	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+delayedTable+`) + (SELECT count(*) FROM `+
		table(adapter, pglease.DefaultMessagesTable)+`)`).Scan(&stored))
	require.Zero(t, stored, "nothing of the refused call is stored")

	// Count the mover's statements: a statement-level trigger fires once
	// per DELETE, whatever it deletes.
	_, err = pool.Exec(ctx, `CREATE TABLE `+table(adapter, "mover_calls")+` (n bigint NOT NULL);
INSERT INTO `+table(adapter, "mover_calls")+` VALUES (0);
CREATE FUNCTION `+table(adapter, "count_mover")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE `+table(adapter, "mover_calls")+` SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER count_mover AFTER DELETE ON `+delayedTable+` FOR EACH STATEMENT EXECUTE FUNCTION `+table(adapter, "count_mover")+`()`)
	require.NoError(t, err)
	calls := func() int64 {
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT n FROM `+table(adapter, "mover_calls")).Scan(&n))
		return n
	}
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{PollInterval: time.Hour})
	_, err = sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the maintainer to be elected", func() bool { return sub.Stats().Maintainer })
	before := calls()
	_, err = pool.Exec(ctx, `WITH ins AS (INSERT INTO `+delayedTable+` (due_at, topic, uuid) VALUES ('9999-12-31 23:59:59+00', 't', 'far') RETURNING 1)
SELECT pg_notify($1, 'd' || (extract(epoch FROM timestamptz '9999-12-31 23:59:59+00') * 1000)::bigint) FROM ins`, tablesOf(adapter).NotifyChannel)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the maintainer to look at the delayed message", func() bool { return calls() > before })
	seen := calls()
	time.Sleep(time.Second) // a window to count in: the bug ran thousands of statements in it
	assert.LessOrEqual(t, calls()-seen, int64(2), "the maintainer must wait for the far-future message, not loop")
}

// TestPartitionDetachedByHandIsDropped: a retention partition detached
// but not dropped (a drop that failed, a maintainer stopped in between, a
// detach by hand) is dropped by the next retention round, not only at the
// next housekeeping (Interval) or election.
func TestPartitionDetachedByHandIsDropped(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "short", pglease.TopicConfig{Retention: 2 * time.Second,
		Tables: adapter, InitializeSchema: true}))
	maint := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "maint",
		Maintenance: pglease.MaintenanceConfig{Interval: time.Hour}})
	_, err := maint.Subscribe(ctx, "keep")
	require.NoError(t, err)
	waitCovered(t, pool, adapter, 2*time.Second)

	// The newest partition: it expires last.
	var part string
	require.NoError(t, pool.QueryRow(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND c.relname ~ '_r[0-9]+_[0-9]+$' ORDER BY c.relname DESC LIMIT 1`,
		table(adapter, pglease.DefaultMessagesTable)).Scan(&part))
	partTable := pgx.Identifier{adapter.Schema, part}.Sanitize()
	_, err = pool.Exec(ctx, `ALTER TABLE `+table(adapter, pglease.DefaultMessagesTable)+` DETACH PARTITION `+partTable)
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the detached partition to be dropped", func() bool {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, partTable).Scan(&exists))
		return !exists
	})
}

// TestOutboxPublishesAcrossAPartitionAdded: a transaction that published
// to a topic with a retention before the maintainer added the partitions
// of its class publishes to it again after. PostgreSQL reads a table's
// partitions in a transaction when it first locks the table, so that
// transaction still routes by the partitions it saw first: publishers
// use a new partition only once every transaction that had the messages
// table open when it was attached has ended. The second Publish
// succeeds, both messages are delivered, and the partitions become
// usable once the transaction ended.
func TestOutboxPublishesAcrossAPartitionAdded(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "short", pglease.TopicConfig{Retention: 2 * time.Second,
		SchemaAdapter: adapter, InitializeSchema: true}))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	pub, err := pglease.NewPublisher(tx, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
	require.NoError(t, err)
	first := message.NewMessage(watermill.NewUUID(), []byte("before"))
	require.NoError(t, pub.Publish("short", first))

	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
	msgs, err := sub.Subscribe(ctx, "short")
	require.NoError(t, err)
	var covered, usable time.Time
	waitFor(t, 10*time.Second, "the retention partitions", func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT GREATEST(covered_until, 'epoch'), GREATEST(usable_until, 'epoch') FROM `+
			table(adapter, pglease.DefaultRetentionTable)).Scan(&covered, &usable))
		return covered.After(time.Now().Add(3 * time.Second))
	})
	assert.False(t, usable.After(time.Now()), "partitions usable while a transaction that could not route to them runs")

	second := message.NewMessage(watermill.NewUUID(), []byte("after"))
	require.NoError(t, pub.Publish("short", second), "a Publish in the transaction after the partitions were added")
	require.NoError(t, tx.Commit(ctx))
	got := receive(t, msgs, 2, 10*time.Second)
	assert.Equal(t, []string{first.UUID, second.UUID}, []string{got[0].UUID, got[1].UUID})
	waitCovered(t, pool, adapter, 2*time.Second)
}
