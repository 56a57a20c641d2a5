package pglease_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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

// TestStuckPrefetchesHoldOnlyWhatTheyRead: eight topics whose handler
// nacks every message, each with a full batch out and the next one read
// ahead, hold only the bytes of the messages they read and have not handed
// out (a reservation is an eighth of the budget: eight prefetches holding
// theirs would hold all of it), and a message on another topic is
// delivered meanwhile.
func TestStuckPrefetchesHoldOnlyWhatTheyRead(t *testing.T) {
	const (
		stuck     = 8
		batch     = 5
		perTopic  = 2*batch + 2 // a full batch, a full prefetch, more
		budget    = 800_000
		payloadSz = 1000
	)
	ctx := context.Background()
	pool := newPool(t, 10) // prefetching takes a pool of 4 connections or more
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	for i := range stuck {
		for range perTopic {
			require.NoError(t, pub.Publish(fmt.Sprintf("stuck-%d", i),
				message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("s"), payloadSz))))
		}
	}
	var size int64 // what each of them counts against the budget
	require.NoError(t, pool.QueryRow(ctx, `SELECT DISTINCT octet_length(payload) + COALESCE(pg_column_size(metadata), 0) FROM `+
		table(adapter, pglease.DefaultMessagesTable)).Scan(&size))

	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", BatchSize: batch,
		MaxBufferedBytes: budget, NackResendDelay: 5 * time.Millisecond})
	var handlers sync.WaitGroup
	// One topic at a time, so that each reads its first batch and the
	// next one with the budget's room for a whole reservation: two reads
	// (the read ahead counts as it starts), the first message handed out.
	for i := range stuck {
		msgs, err := sub.Subscribe(ctx, fmt.Sprintf("stuck-%d", i))
		require.NoError(t, err)
		var nacks atomic.Int64
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			for msg := range msgs {
				nacks.Add(1)
				msg.Nack()
			}
		}()
		waitFor(t, 10*time.Second, fmt.Sprintf("stuck-%d to nack its first message and read ahead", i), func() bool {
			return nacks.Load() > 0 && pglease.Reads(sub) >= uint64(2*(i+1))
		})
	}
	healthy, err := sub.Subscribe(ctx, "healthy")
	require.NoError(t, err)
	// Each stuck topic holds the rest of its batch and the batch read
	// ahead: the first message is out (nacked, handed out again and again).
	want := int64(stuck*(2*batch-1)) * size
	var held int64
	defer func() {
		if t.Failed() {
			t.Logf("the stuck topics held %d bytes of a %d-byte budget", held, budget)
		}
	}()
	waitFor(t, 10*time.Second, fmt.Sprintf("the stuck topics to hold %d bytes, what they read", want), func() bool {
		held = sub.Stats().BufferedBytes
		return held == want
	})
	t.Logf("%d stuck topics hold %d bytes of a %d-byte budget (%d bytes each message)", stuck, held, budget, size)

	publishN(t, pub, "healthy", 1)
	receiveWithin(t, healthy, 5*time.Second, "a message on a healthy topic").Ack()
	// Its bytes go back right after the hand-out.
	waitFor(t, 10*time.Second, "the healthy topic to hold nothing", func() bool {
		held = sub.Stats().BufferedBytes
		return held == want
	})

	require.NoError(t, sub.Close())
	handlers.Wait()
	assert.Zero(t, sub.Stats().BufferedBytes, "bytes held after Close")
	assertNoLeakedGoroutines(t)
}
