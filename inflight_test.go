package pglease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// publishKeyed publishes one message per key, in order, with the key as
// its PartitionKeyMetadata, and returns their UUIDs.
func publishKeyed(t *testing.T, pub *pglease.Publisher, topic string, keys ...string) []string {
	t.Helper()
	var ids []string
	for _, k := range keys {
		msg := message.NewMessage(watermill.NewUUID(), []byte(k))
		msg.Metadata.Set(pglease.PartitionKeyMetadata, k)
		require.NoError(t, pub.Publish(topic, msg))
		ids = append(ids, msg.UUID)
	}
	return ids
}

// TestAckInTxWithMaxInFlight: with MaxInFlight above 1, a message
// acknowledged in its transaction above an earlier message that is not
// acknowledged yet does not move the group's position past that message
// (which a restart then delivers again, not lost), and its own delivery
// after the restart finds it acknowledged (its effects stay exactly once).
func TestAckInTxWithMaxInFlight(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ids := publishKeyed(t, pub, "in", "a", "b", "a")
	createEffects(t, pool, adapter)
	newSub := func() *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: adapter, InitializeSchema: true,
			MaxInFlight: 4, CommitBatch: 1}, testLogger())
		require.NoError(t, err)
		return sub
	}
	ackInTx := func(msg *message.Message, proc string) error {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		require.NoError(t, insertEffect(ctx, tx, adapter.Schema, msg.UUID, proc))
		if err := pglease.AckInTx(ctx, tx, msg); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	sub := newSub()
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	a1, b1 := receiveOne(t, msgs), receiveOne(t, msgs)
	require.Equal(t, []string{ids[0], ids[1]}, []string{a1.UUID, b1.UUID}, "a1 and b1 at once; a2 waits for a1")
	require.NoError(t, ackInTx(b1, "first"))
	b1.Ack()
	require.Equal(t, pglease.Position{}, ackedOffset(t, pool, adapter, "", "in"),
		"b1's transaction moved the position past a1, which is not acknowledged")
	require.NoError(t, sub.Close()) // a1 never acked

	sub = newSub()
	defer func() { require.NoError(t, sub.Close()) }()
	msgs, err = sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	a1, b1 = receiveOne(t, msgs), receiveOne(t, msgs)
	require.Equal(t, []string{ids[0], ids[1]}, []string{a1.UUID, b1.UUID}, "a1 delivered again, with b1")
	err = ackInTx(b1, "second")
	require.True(t, errors.Is(err, pglease.ErrAlreadyAcknowledged), "b1 again: %v", err)
	b1.Ack()
	require.NoError(t, ackInTx(a1, "second"))
	a1.Ack()
	a2 := receiveOne(t, msgs)
	require.Equal(t, ids[2], a2.UUID)
	require.NoError(t, ackInTx(a2, "second"))
	a2.Ack()
	pos, ok := pglease.MessagePositionFromCtx(a2.Context())
	require.True(t, ok)
	require.Eventually(t, func() bool { return ackedOffset(t, pool, adapter, "", "in") == pos }, 5*time.Second, 5*time.Millisecond,
		"the position reaches a2 once the prefix is acknowledged")
	effects := effectsOf(t, pool, adapter)
	require.Equal(t, map[string][]string{ids[0]: {"second"}, ids[1]: {"first"}, ids[2]: {"second"}}, effects)
}
