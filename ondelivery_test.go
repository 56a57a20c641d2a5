package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// hookDelivery is what TestOnDeliveryHook's hook records of one call.
type hookDelivery struct {
	uuid, attempt string
	fromDelivery  bool // the context was the delivery's (MessageDeliveryFromCtx)
	settled       chan error
	settledCalls  int // under hookLog.mu
}

type hookLog struct {
	mu         sync.Mutex
	deliveries []*hookDelivery
}

type hookKey struct{}

// hook is an OnDelivery hook that records each call and puts its record
// into the message's context.
func (l *hookLog) hook(msg *message.Message) func(error) {
	_, fromDelivery := pglease.MessageDeliveryFromCtx(msg.Context())
	d := &hookDelivery{uuid: msg.UUID, attempt: msg.Metadata.Get(pglease.DeliveryAttemptMetadata),
		fromDelivery: fromDelivery, settled: make(chan error, 1)}
	l.mu.Lock()
	l.deliveries = append(l.deliveries, d)
	l.mu.Unlock()
	msg.SetContext(context.WithValue(msg.Context(), hookKey{}, d))
	return func(err error) {
		l.mu.Lock()
		d.settledCalls++
		l.mu.Unlock()
		select {
		case d.settled <- err:
		default: // a second call: settledCalls says so
		}
	}
}

func (l *hookLog) calls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deliveries)
}

// settledWithin waits for d's settled func and returns its error.
func settledWithin(t *testing.T, d *hookDelivery, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-d.settled:
		return err
	case <-time.After(timeout):
		t.Fatalf("settled not called within %s for attempt %s of %s", timeout, d.attempt, d.uuid)
		return nil
	}
}

// TestOnDeliveryHook: the hook is called once per delivery, redeliveries
// after a Nack included, with the delivery's context, and the context it
// sets is the one the handler receives; settled is called once, with nil
// after an Ack, ErrNacked after a Nack, and an error wrapping
// ErrDeliveryEnded for a message still out at Close, before Close returns;
// nothing is called after Close.
func TestOnDeliveryHook(t *testing.T) {
	// MaxInFlight 2 hands out through the in-flight window; the messages
	// have no key, so they go out one at a time there too.
	for _, maxInFlight := range []int{1, 2} {
		t.Run(fmt.Sprintf("MaxInFlight %d", maxInFlight), func(t *testing.T) {
			testOnDeliveryHook(t, maxInFlight)
		})
	}
}

func testOnDeliveryHook(t *testing.T, maxInFlight int) {
	pool := newPool(t, 0)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	first := message.NewMessage(watermill.NewUUID(), []byte("first"))
	second := message.NewMessage(watermill.NewUUID(), []byte("second"))
	require.NoError(t, pub.Publish("hooked", first, second))

	var log hookLog
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{OnDelivery: log.hook,
		NackResendDelay: time.Millisecond, CommitBatch: 1, MaxInFlight: maxInFlight})
	msgs, err := sub.Subscribe(context.Background(), "hooked")
	require.NoError(t, err)

	// received returns the hook's record of msg's delivery, from the
	// context the handler got.
	received := func(msg *message.Message, uuid, attempt string) *hookDelivery {
		t.Helper()
		require.Equal(t, uuid, msg.UUID)
		require.Equal(t, attempt, msg.Metadata.Get(pglease.DeliveryAttemptMetadata))
		d, ok := msg.Context().Value(hookKey{}).(*hookDelivery)
		require.True(t, ok, "the handler receives the context the hook set")
		assert.Equal(t, uuid, d.uuid)
		assert.Equal(t, attempt, d.attempt, "the hook sees the attempt it is called for")
		assert.True(t, d.fromDelivery, "the hook is called with the delivery's context")
		_, ok = pglease.MessageDeliveryFromCtx(msg.Context())
		assert.True(t, ok, "the hook's context derives from the delivery's")
		return d
	}

	m := receiveWithin(t, msgs, 30*time.Second, "first delivery")
	nacked := received(m, first.UUID, "1")
	m.Nack()
	assert.ErrorIs(t, settledWithin(t, nacked, 10*time.Second), pglease.ErrNacked)

	m = receiveWithin(t, msgs, 30*time.Second, "redelivery after the Nack")
	acked := received(m, first.UUID, "2")
	assert.NotSame(t, nacked, acked, "the redelivery calls the hook again")
	m.Ack()
	assert.NoError(t, settledWithin(t, acked, 10*time.Second))

	m = receiveWithin(t, msgs, 30*time.Second, "second message")
	out := received(m, second.UUID, "1")
	require.NoError(t, sub.Close())
	// Close returned: the delivery still out was settled before.
	select {
	case err := <-out.settled:
		assert.ErrorIs(t, err, pglease.ErrDeliveryEnded)
		assert.NotErrorIs(t, err, pglease.ErrOwnershipLost)
		assert.NotErrorIs(t, err, pglease.ErrNacked)
	default:
		t.Fatal("Close returned before the settled func of the delivery still out was called")
	}
	calls := log.calls()
	m.Ack() // too late: the delivery ended
	assertNoLeakedGoroutines(t)
	assert.Equal(t, calls, log.calls(), "no hook call after Close")
	assert.Equal(t, 3, calls, "one call per delivery")
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, d := range log.deliveries {
		assert.Equal(t, 1, d.settledCalls, "settled called once for attempt %s of %s", d.attempt, d.uuid)
	}
}
