package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestPrefetchKeepsOrderAcrossNackAndHandover reads batches of 5, so that
// each full batch starts the read of the next while it is handed out: a
// Nack in the middle of a batch, and a handover while a message is out and
// the next batch is read, still deliver every message in order, from the
// first unacked one, and leave no goroutine behind.
func TestPrefetchKeepsOrderAcrossNackAndHandover(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	cfg := pglease.SubscriberConfig{ConsumerGroup: "g", BatchSize: 5, NackResendDelay: 10 * time.Millisecond,
		SessionTTL: 30 * time.Second}
	owner := newTestSubscriber(t, pool, adapter, cfg)
	standby := newTestSubscriber(t, pool, adapter, cfg)
	msgs := make([]*message.Message, 23)
	var ids []string
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
		ids = append(ids, msgs[i].UUID)
	}
	require.NoError(t, pub.Publish("t", msgs...))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ownerMsgs, err := owner.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receive(t, ownerMsgs, 7, 10*time.Second)
	nacked := receiveOne(t, ownerMsgs)
	require.Equal(t, ids[7], nacked.UUID)
	nacked.Nack()
	again := receive(t, ownerMsgs, 5, 10*time.Second) // the nacked one, then 8 to 11
	got = append(got, again...)
	assert.Equal(t, ids[:12], uuids(got))
	unacked := receiveOne(t, ownerMsgs) // 12, out while 15 to 19 are read
	require.Equal(t, ids[12], unacked.UUID)

	standbyMsgs, err := standby.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	cancel()
	rest := receive(t, standbyMsgs, len(ids)-12, 10*time.Second)
	assert.Equal(t, ids[12:], uuids(rest), "the next owner goes on from the first unacked message")
	assertNothingWithin(t, standbyMsgs, 200*time.Millisecond)

	require.NoError(t, owner.Close())
	require.NoError(t, standby.Close())
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}
