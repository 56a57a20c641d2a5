package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/components/requeuer"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// TestRequeueRetriesWhenDue runs Watermill's retry-later flow on pglease.
// A handler fails its first three attempts at each message; DelayOnError
// (inner) gives each failure a delay of 1s, 2s, then 3s (4s capped by
// MaxInterval), and PoisonQueue (outer) publishes it to a requeue topic. A
// requeuer, on a Router and Subscriber of its own, publishes each one back
// to the topic it failed on once pglease hands it out, when it is due.
// Each retry comes no earlier than its due time and soon after it, carries
// the delay and the requeuer's count, every message succeeds exactly once
// and, once both groups have consumed everything, nothing is left over.
func TestRequeueRetriesWhenDue(t *testing.T) {
	const (
		messages = 4
		failures = 3
		// lateBy bounds how long after its due time a retry reaches the
		// handler: moved into the requeue topic, republished by the
		// requeuer, delivered again.
		lateBy = 2 * time.Second
	)
	wantDelays := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}

	ctx := context.Background()
	pool := newPool(t, 20)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	appSub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "app"})
	requeueSub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "requeuer"})
	logger := testLogger()
	if logger == nil {
		logger = watermill.NopLogger{}
	}

	type attempt struct {
		at, ended time.Time // handler called, handler returning
		payload   string
		meta      message.Metadata
	}
	var (
		mu        sync.Mutex
		attempts  = map[string][]attempt{}
		successes = map[string]int{}
	)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	h := router.AddConsumerHandler("orders", "orders", appSub, func(msg *message.Message) error {
		a := attempt{at: time.Now(), payload: string(msg.Payload), meta: maps.Clone(msg.Metadata)}
		mu.Lock()
		defer mu.Unlock()
		n := len(attempts[msg.UUID]) + 1
		a.ended = time.Now()
		attempts[msg.UUID] = append(attempts[msg.UUID], a)
		if n <= failures {
			return fmt.Errorf("attempt %d fails", n)
		}
		successes[msg.UUID]++
		return nil
	})
	poison, err := middleware.PoisonQueue(pub, "requeue")
	require.NoError(t, err)
	retryLater := middleware.DelayOnError{InitialInterval: time.Second, Multiplier: 2, MaxInterval: 3 * time.Second}
	h.AddMiddleware(poison, retryLater.Middleware)

	rq, err := requeuer.NewRequeuer(requeuer.Config{
		Subscriber:     requeueSub,
		SubscribeTopic: "requeue",
		Publisher:      pub,
		GeneratePublishTopic: func(p requeuer.GeneratePublishTopicParams) (string, error) {
			if topic := p.Message.Metadata.Get(middleware.PoisonedTopicKey); topic != "" {
				return topic, nil
			}
			return "", errors.New("no poisoned-topic metadata")
		},
	}, logger)
	require.NoError(t, err)

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	rqCtx, stopRequeuer := context.WithCancel(ctx)
	defer stopRequeuer()
	requeuerDone := make(chan error, 1)
	go func() { requeuerDone <- rq.Run(rqCtx) }()
	<-router.Running()

	start := time.Now()
	ids := map[string]string{} // UUID: payload
	for i := range messages {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint("order ", i)))
		ids[msg.UUID] = string(msg.Payload)
		require.NoError(t, pub.Publish("orders", msg))
	}

	waitFor(t, 60*time.Second, "every message to succeed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(successes) == messages
	})
	took := time.Since(start)
	// Nothing can come any more once no message waits in the delayed
	// table and both groups have committed positions at the end of
	// their topics.
	inspector, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "both groups to consume everything", func() bool {
		var delayed int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, pglease.DefaultDelayedTable)).Scan(&delayed))
		lags, err := inspector.Lag(ctx, admin.LagFilter{})
		require.NoError(t, err)
		groups := map[string]bool{}
		for _, l := range lags {
			if l.Lag > 0 || l.Pending {
				return false
			}
			groups[l.ConsumerGroup+"/"+l.Topic] = true
		}
		return delayed == 0 && groups["app/orders"] && groups["requeuer/requeue"]
	})

	require.NoError(t, router.Close())
	require.NoError(t, <-routerDone)
	stopRequeuer()
	require.NoError(t, <-requeuerDone)

	mu.Lock()
	defer mu.Unlock()
	var late time.Duration // the longest a retry came after its due time
	for id, payload := range ids {
		as := attempts[id]
		require.Len(t, as, failures+1, "message %s: one attempt per failure and one that succeeds", id)
		assert.Equal(t, 1, successes[id], "message %s succeeded once", id)
		assert.Empty(t, as[0].meta.Get(requeuer.RetriesKey), "message %s: the first attempt is no retry", id)
		for n, a := range as {
			assert.Equal(t, payload, a.payload, "message %s, attempt %d", id, n+1)
			assert.Equal(t, "1", a.meta.Get(pglease.DeliveryAttemptMetadata),
				"message %s, attempt %d: every attempt is a new message, none a redelivery after a Nack", id, n+1)
			if n == 0 {
				continue
			}
			// The metadata the requeuer and the two middlewares set
			// after the previous attempt failed.
			prev, want := as[n-1], wantDelays[n-1]
			assert.Equal(t, strconv.Itoa(n), a.meta.Get(requeuer.RetriesKey), "message %s, attempt %d: the requeuer's count", id, n+1)
			assert.Equal(t, want.String(), a.meta.Get(delay.DelayedForKey), "message %s, attempt %d: DelayOnError's delay", id, n+1)
			assert.Equal(t, "orders", a.meta.Get(middleware.PoisonedTopicKey))
			assert.Equal(t, fmt.Sprintf("attempt %d fails", n), a.meta.Get(middleware.ReasonForPoisonedKey))
			due, err := time.Parse(time.RFC3339, a.meta.Get(delay.DelayedUntilKey))
			require.NoError(t, err, "message %s, attempt %d: the due time", id, n+1)
			// DelayOnError took the time after the handler returned, and
			// delay.Message wrote it in whole seconds, rounded down.
			assert.False(t, due.Before(prev.ended.Add(want-time.Second)),
				"message %s, attempt %d: due %s, %s after the failure, delay %s", id, n+1, due, due.Sub(prev.ended), want)
			assert.False(t, a.at.Before(due), "message %s, attempt %d: came %s before it was due", id, n+1, due.Sub(a.at))
			assert.Less(t, a.at.Sub(due), lateBy, "message %s, attempt %d: came too long after it was due", id, n+1)
			late = max(late, a.at.Sub(due))
		}
	}

	var inOrders, inRequeue int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE topic = 'orders'), count(*) FILTER (WHERE topic = 'requeue') FROM `+
		table(adapter, pglease.DefaultMessagesTable)).Scan(&inOrders, &inRequeue))
	assert.Equal(t, messages*(failures+1), inOrders, "each message and each retry stored once in the orders topic")
	assert.Equal(t, messages*failures, inRequeue, "each failure stored once in the requeue topic")
	// The mover counts after its statement returned, which may be after
	// the moved message was delivered: wait for the count.
	moved := func() uint64 { return appSub.Stats().DelayedMoved + requeueSub.Stats().DelayedMoved }
	waitFor(t, 10*time.Second, "the mover to count every moved message", func() bool { return moved() >= uint64(messages*failures) })
	assert.Equal(t, uint64(messages*failures), moved(),
		"each failure was held back as a delayed message and moved when due")

	require.NoError(t, appSub.Close())
	require.NoError(t, requeueSub.Close())
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
	t.Logf("%d messages, %d failures each (delays %v): all succeeded %s after publishing; retries came at most %s after due",
		messages, failures, wantDelays, took.Round(time.Millisecond), late.Round(time.Millisecond))
}
