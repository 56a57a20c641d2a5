package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// TestSubscriberStats: the counters follow what the Subscriber did: claims,
// deliveries, acks and nacks, heartbeats, a lost session (its row deleted
// by hand), a takeover of the rows the lost session held, and releases.
func TestSubscriberStats(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "t", 3)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		InitializeSchema: true, SessionTTL: time.Second, NackResendDelay: time.Millisecond}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	msgs, err := sub.Subscribe(sctx, "t")
	require.NoError(t, err)
	receiveOne(t, msgs).Nack()
	for range 3 {
		receiveOne(t, msgs).Ack()
	}
	waitFor(t, 10*time.Second, "the last ack to be seen", func() bool { return sub.Stats().Acked == 3 })
	st := sub.Stats()
	assert.Equal(t, "g", st.ConsumerGroup)
	assert.Equal(t, uint64(1), st.Claims)
	assert.Zero(t, st.Takeovers)
	assert.Equal(t, uint64(4), st.Delivered)
	assert.Equal(t, uint64(3), st.Acked)
	assert.Equal(t, uint64(1), st.Nacked)
	assert.Equal(t, 1, st.OwnedRows)
	waitFor(t, 10*time.Second, "a heartbeat", func() bool { return sub.Stats().Heartbeats.Count > 0 })
	hb := sub.Stats().Heartbeats
	assert.Positive(t, hb.Sum)
	assert.Len(t, hb.Buckets, len(pglease.HeartbeatBuckets))
	assert.Equal(t, hb.Count, hb.Buckets[len(hb.Buckets)-1], "every heartbeat took less than 10 s")

	// The session row expired by hand: the next heartbeat finds it gone;
	// the new session claims the rows of the old one again once it
	// expired. They were the Subscriber's own: a claim, not a takeover.
	_, err = pool.Exec(ctx, `UPDATE `+table(adapter, pglease.DefaultConsumerSessionsTable)+` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the session to be lost", func() bool { return sub.Stats().SessionsLost == 1 })
	waitFor(t, 10*time.Second, "the row claimed again", func() bool { return sub.Stats().Claims == 2 })
	assert.Zero(t, sub.Stats().Takeovers)

	cancel()
	waitFor(t, 10*time.Second, "the release", func() bool { return sub.Stats().Releases == 1 })
	assert.Zero(t, sub.Stats().OwnedRows)
}

// TestStartFromLatest: a new group with StartFromLatest skips what the
// topic holds and gets what is published afterwards; a group whose row
// exists is not moved by it.
func TestStartFromLatest(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	old := publishN(t, pub, "t", 3)
	newSub := func(group string, from pglease.StartFrom) *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
			InitializeSchema: true, StartFrom: from}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	early := newSub("early", pglease.StartFromEarliest)
	earlyMsgs, err := early.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, old[0], receiveOne(t, earlyMsgs).UUID)

	late := newSub("late", pglease.StartFromLatest)
	lateMsgs, err := late.Subscribe(ctx, "t")
	require.NoError(t, err)
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the late group's row", func() bool {
		lag, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"late"}})
		require.NoError(t, err)
		return len(lag) == 1 && lag[0].Lag == 0
	})
	fresh := publishN(t, pub, "t", 1)
	require.Equal(t, fresh[0], receiveOne(t, lateMsgs).UUID, "only what was published after the row was made")

	_, err = pglease.NewSubscriber(pool, pglease.SubscriberConfig{StartFrom: 7}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
}

// TestDeliveryAttemptMetadata: a Nack delivers the message again with the
// next attempt number; a Subscriber that takes the topic over after a claim
// that did not commit past the message counts that claim too.
func TestDeliveryAttemptMetadata(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ids := publishN(t, pub, "t", 2)
	newSub := func() *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
			InitializeSchema: true, NackResendDelay: time.Millisecond}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	a := newSub()
	actx, cancelA := context.WithCancel(ctx)
	msgs, err := a.Subscribe(actx, "t")
	require.NoError(t, err)
	m := receiveOne(t, msgs)
	require.Equal(t, ids[0], m.UUID)
	require.Equal(t, "1", m.Metadata.Get(pglease.DeliveryAttemptMetadata))
	m.Nack()
	m = receiveOne(t, msgs)
	require.Equal(t, "2", m.Metadata.Get(pglease.DeliveryAttemptMetadata), "after a Nack")
	cancelA() // released without an Ack: the position stays before the message
	for range msgs {
	}

	b := newSub()
	msgs, err = b.Subscribe(ctx, "t")
	require.NoError(t, err)
	m = receiveOne(t, msgs)
	require.Equal(t, ids[0], m.UUID)
	require.Equal(t, "2", m.Metadata.Get(pglease.DeliveryAttemptMetadata), "the second claim to hand it out")
	m.Ack()
	m = receiveOne(t, msgs)
	require.Equal(t, ids[1], m.UUID)
	require.Equal(t, "1", m.Metadata.Get(pglease.DeliveryAttemptMetadata))
	m.Ack()
}

// TestDeliveryAttemptCountsAHeldMessageAcrossATakeover: a Subscriber acks
// two messages and holds the third longer than CommitInterval (a handler
// that hangs, then its process dies). The commit made meanwhile records
// that the message after the committed position is handed out, so the
// Subscriber that takes the topic over after the session is gone hands it
// out as attempt 2, though it was not the first message of the dead
// Subscriber's claim.
func TestDeliveryAttemptCountsAHeldMessageAcrossATakeover(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ids := publishN(t, pub, "t", 3)
	newSub := func() *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
			InitializeSchema: true, CommitInterval: 20 * time.Millisecond}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	a := newSub()
	msgs, err := a.Subscribe(ctx, "t")
	require.NoError(t, err)
	for _, id := range ids[:2] {
		m := receiveOne(t, msgs)
		require.Equal(t, id, m.UUID)
		m.Ack()
	}
	held := receiveOne(t, msgs)
	require.Equal(t, ids[2], held.UUID)
	require.Equal(t, "1", held.Metadata.Get(pglease.DeliveryAttemptMetadata))

	// The acks before the held message are committed while it is held.
	var second pglease.Position
	require.NoError(t, pool.QueryRow(ctx, `SELECT transaction_id::text::bigint, "offset" FROM `+
		table(adapter, pglease.DefaultMessagesTable)+` WHERE uuid = $1`, ids[1]).Scan(&second.TransactionID, &second.Offset))
	var heads int
	waitFor(t, 10*time.Second, "the acks before the held message to be committed", func() bool {
		var pos pglease.Position
		err := pool.QueryRow(ctx, `SELECT acked_transaction_id::text::bigint, acked_offset, head_deliveries FROM `+
			table(adapter, pglease.DefaultConsumerOffsetsTable)+` WHERE consumer_group = 'g' AND topic = 't'`).
			Scan(&pos.TransactionID, &pos.Offset, &heads)
		return err == nil && pos == second
	})
	t.Logf("committed at the second message with head_deliveries %d while the third is held", heads)

	// The holder dies: its session row is gone, as after its expiry.
	_, err = pool.Exec(ctx, `DELETE FROM `+table(adapter, pglease.DefaultConsumerSessionsTable)+` WHERE consumer_group = 'g'`)
	require.NoError(t, err)
	b := newSub()
	msgs, err = b.Subscribe(ctx, "t")
	require.NoError(t, err)
	m := receiveOne(t, msgs)
	require.Equal(t, ids[2], m.UUID)
	require.Equal(t, "2", m.Metadata.Get(pglease.DeliveryAttemptMetadata), "the second claim to hand it out")
	m.Ack()
}
