package main

// The inflight workload: how a slow handler (5 ms, an HTTP call's worth)
// scales with the messages a consumer lets out at once. One topic of one
// partition per level gets its messages beforehand, spread over
// inflightKeys ordering keys; a Router consumes them with a handler that
// sleeps inflightWork. The levels are pglease's MaxInFlight; NATS
// JetStream runs the same levels as MaxAckPending with as many subscriber
// goroutines (watermill-nats hands out one message per goroutine, and
// keeps no order between them). The backends without such a setting
// (watermill-sql hands out one message at a time) run their default
// Subscriber once, shown on every row.

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	pglease "github.com/pglease/watermill-pglease"
)

const (
	inflightWork = 5 * time.Millisecond
	// inflightKeys is more than the highest level, so that the keys do
	// not bound pglease's parallelism below MaxInFlight.
	inflightKeys = 1024
)

// inflightLevels are the messages let out at once.
var inflightLevels = []int{1, 8, 32, 128}

// parallelHandle is a handle whose Subscribers can let n messages out at
// once.
type parallelHandle interface {
	parallelSubscriber(n int) (message.Subscriber, error)
}

func inflightKey(n int) string { return fmt.Sprintf("inflight-%d", n) }

func inflightWorkload() workload {
	w := workload{id: "inflight", run: runInflight, peers: true}
	for _, n := range inflightLevels {
		w.metrics = append(w.metrics, metric{
			key: inflightKey(n),
			label: fmt.Sprintf("Router, %s handler, 1 partition, %d keys: %d in flight (pglease MaxInFlight, NATS MaxAckPending; "+
				"others: their default Subscriber, measured once)", inflightWork, inflightKeys, n),
			short:  fmt.Sprintf("%s handler, %d in flight", inflightWork, n),
			unit:   "msg/s",
			better: higherIsBetter,
		})
	}
	return w
}

// runInflight measures each level on a topic of its own, with as many
// messages as the level handles in about cfg.inflightFor at its ideal
// rate (n / inflightWork).
func runInflight(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	out := map[string]float64{}
	ph, parallel := h.(parallelHandle)
	for _, n := range inflightLevels {
		if !parallel && n > 1 {
			out[inflightKey(n)] = out[inflightKey(1)]
			continue
		}
		topic := fmt.Sprintf("bench_inflight_%d", n)
		if err := h.initTopic(ctx, topic); err != nil {
			return nil, err
		}
		count := max(100, int(float64(n)*e.cfg.inflightFor.Seconds()/inflightWork.Seconds()))
		if err := prefillKeyed(ctx, h, topic, count); err != nil {
			return nil, err
		}
		var sub message.Subscriber
		var err error
		if parallel {
			sub, err = ph.parallelSubscriber(n)
		} else {
			sub, err = h.subscriber()
		}
		if err != nil {
			return nil, err
		}
		rate, err := routerRate(ctx, sub, topic, count, inflightWork)
		_ = sub.Close()
		if err != nil {
			return nil, fmt.Errorf("%d in flight: %w", n, err)
		}
		e.log("inflight: %d in flight: %d messages, %.0f msg/s", n, count, rate)
		out[inflightKey(n)] = rate
	}
	return out, nil
}

// prefillKeyed publishes n messages to topic, spread over inflightKeys
// keys in turn (pglease.PartitionKeyMetadata).
func prefillKeyed(ctx context.Context, h handle, topic string, n int) error {
	pub, err := h.publisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	const chunk = 1000
	for i := 0; i < n; i += chunk {
		msgs := newMessages(min(chunk, n-i))
		for j, m := range msgs {
			m.Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("k%d", (i+j)%inflightKeys))
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// routerRate consumes n messages of topic through a Router whose handler
// sleeps work, and returns the messages handled per second, timed from
// Run to the last one handled.
func routerRate(ctx context.Context, sub message.Subscriber, topic string, n int, work time.Duration) (float64, error) {
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	var (
		count atomic.Int64
		end   time.Time // written before done is closed
		done  = make(chan struct{})
	)
	router.AddConsumerHandler("bench", topic, sub, func(*message.Message) error {
		time.Sleep(work)
		if count.Add(1) == int64(n) {
			end = time.Now()
			close(done)
		}
		return nil
	})
	go func() {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
		case <-ctx.Done():
		}
		_ = router.Close()
	}()
	t0 := time.Now()
	if err := router.Run(ctx); err != nil {
		return 0, err
	}
	select {
	case <-done:
		return float64(n) / end.Sub(t0).Seconds(), nil
	default:
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("the Router stopped after %d of %d messages", count.Load(), n)
	}
}

// parallelSubscriber: the default configuration with MaxInFlight n.
func (h *pgleaseHandle) parallelSubscriber(n int) (message.Subscriber, error) {
	return pglease.NewSubscriber(h.pool, pglease.SubscriberConfig{
		ConsumerGroup:    consumerGroup,
		Tables:           pglease.Tables{Schema: h.ns},
		ListenConnConfig: h.listen,
		MaxInFlight:      n,
	}, h.e.logger)
}

// parallelSubscriber: newSubscriber's configuration with n subscriber
// goroutines and a consumer that lets at most n messages go unacknowledged.
func (h *natsHandle) parallelSubscriber(n int) (message.Subscriber, error) {
	return wnats.NewSubscriber(wnats.SubscriberConfig{
		URL:              h.srv.ClientURL(),
		QueueGroupPrefix: consumerGroup,
		SubscribersCount: n,
		JetStream: wnats.JetStreamConfig{
			AutoProvision:    true,
			DurablePrefix:    consumerGroup,
			SubscribeOptions: []nats.SubOpt{nats.MaxAckPending(n)},
		},
	}, h.e.logger)
}
