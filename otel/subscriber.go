package otel

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	pglease "github.com/pglease/watermill-pglease"
)

// Instrument returns cfg with its OnDelivery hook set to trace and
// measure each delivery of the Subscriber made with it: a CONSUMER span
// "process <topic>", linked to the span that published the message (read
// from the message's metadata) and put into the message's context, so
// that the handler's spans (and pgx's, with a traced pool) nest under it.
// The span ends when the message is acked or nacked (an event "ack" or
// "nack"; a Nack sets the status to error), or when the delivery ends
// first (an event "unsettled" whose [UnsettledReasonKey] says why: the
// subscription ended, the topic's ownership was lost or it was handed
// over). It carries the consumer group, the partition, the session
// (messaging.client.id), the position, the epoch and the delivery
// attempt.
//
// The span is started and ended on the Subscriber's own goroutines, as
// the message is handed out and as its Ack or Nack is seen: unlike
// [WrapSubscriber], no goroutine and no channel stand between the
// Subscriber and the handler. A hook cfg has already is kept: it is
// called after this one (the message's context then holds the span), and
// its settled func before the span ends.
//
//	sub, err := pglease.NewSubscriber(pool, pgleaseotel.Instrument(pglease.SubscriberConfig{ConsumerGroup: "billing"}), logger)
func Instrument(cfg pglease.SubscriberConfig, opts ...Option) pglease.SubscriberConfig {
	t := newTelemetry(opts)
	next := cfg.OnDelivery
	cfg.OnDelivery = func(msg *message.Message) func(error) {
		if t.idle(msg) {
			if next != nil {
				return next(msg)
			}
			return nil
		}
		c := t.startProcess(msg, "")
		var nextSettled func(error)
		if next != nil {
			nextSettled = next(msg)
		}
		switch {
		case nextSettled == nil && !c.watched:
			return nil
		case nextSettled == nil:
			return c.settle
		case !c.watched:
			return nextSettled
		}
		return func(err error) {
			nextSettled(err)
			c.settle(err)
		}
	}
	return cfg
}

// errSubscriptionEnded is how a Subscriber made by WrapSubscriber settles
// the span of a message still out when its subscription ends.
var errSubscriptionEnded = fmt.Errorf("%w: the subscription ended", pglease.ErrDeliveryEnded)

// Subscriber is a [message.Subscriber] that traces and measures another
// one. Make it with [WrapSubscriber]. It is safe for concurrent use.
type Subscriber struct {
	sub message.Subscriber
	t   *telemetry

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup // forwarding and settlement goroutines
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// WrapSubscriber returns sub traced and measured, each delivery in a
// CONSUMER span as with [Instrument]. It is for a Subscriber made
// elsewhere: when you make the *pglease.Subscriber, pass its config
// through Instrument instead, which costs less. A wrapper cannot reach
// the Subscriber's hand-out, so it forwards each subscription through a
// goroutine of its own and watches for each message's Ack or Nack: about
// 1 µs more per delivery than Instrument (see "Cost" in the package
// documentation). Messages that already have a span of Instrument's are
// forwarded as they are.
//
// A message whose settlement is still awaited when the next one arrives
// (a Subscriber that hands out several at once) is watched by a goroutine
// of its own until it is settled or its subscription ends.
func WrapSubscriber(sub message.Subscriber, opts ...Option) *Subscriber {
	return &Subscriber{sub: sub, t: newTelemetry(opts), closing: make(chan struct{})}
}

// Subscribe implements [message.Subscriber]: it subscribes the wrapped
// Subscriber to topic and forwards its messages, each in its span. The
// channel is closed when the wrapped one is, or by Close. With a no-op
// tracer, no reader of the consumer metrics and without
// [WithProducerAsParent] there is nothing to record: it returns the
// wrapped Subscriber's channel.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, pglease.ErrSubscriberClosed
	}
	in, err := s.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	if s.t.consumesIdle(ctx) && !s.t.parented {
		// Every delivery would be idle: nothing to forward.
		return in, nil
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go s.forward(ctx, topic, in, out)
	return out, nil
}

// forward hands the messages of in out, each in its span, and settles
// the spans. It watches the last message handed out itself; an earlier
// one still unsettled when the next arrives gets a goroutine.
func (s *Subscriber) forward(ctx context.Context, topic string, in <-chan *message.Message, out chan<- *message.Message) {
	defer s.wg.Done()
	defer close(out)
	var (
		pending *consumption
		msg     *message.Message
	)
	defer func() {
		if pending != nil {
			s.settleLater(ctx, pending, msg)
		}
	}()
	for {
		var acked, nacked <-chan struct{}
		if pending != nil {
			acked, nacked = msg.Acked(), msg.Nacked()
		}
		select {
		case next, ok := <-in:
			if !ok {
				return
			}
			if pending != nil {
				s.settleLater(ctx, pending, msg)
				pending = nil
			}
			if _, instrumented := consumptionOf(next.Context()); !instrumented {
				if c := s.t.startProcess(next, topic); c.watched {
					pending, msg = c, next
				}
			}
			select {
			case out <- next:
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			}
		case <-acked:
			pending.settle(nil)
			pending = nil
		case <-nacked:
			pending.settle(pglease.ErrNacked)
			pending = nil
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
}

// settleLater waits for msg's settlement in a goroutine.
func (s *Subscriber) settleLater(ctx context.Context, c *consumption, msg *message.Message) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-msg.Acked():
			c.settle(nil)
		case <-msg.Nacked():
			c.settle(pglease.ErrNacked)
		case <-ctx.Done():
			c.settle(errSubscriptionEnded)
		case <-s.closing:
			c.settle(errSubscriptionEnded)
		}
	}()
}

// SubscribeInitialize implements [message.SubscribeInitializer]: it
// calls the wrapped Subscriber's, if it has one.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if si, ok := s.sub.(message.SubscribeInitializer); ok {
		return si.SubscribeInitialize(topic)
	}
	return nil
}

// Close closes the wrapped Subscriber, ends the spans of messages not
// settled yet and waits for the wrapper's goroutines. It is idempotent.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	s.mu.Unlock()
	err := s.sub.Close()
	if first {
		close(s.closing)
	}
	s.wg.Wait()
	return err
}

// Unwrap returns the wrapped Subscriber (for its Stats, for example).
func (s *Subscriber) Unwrap() message.Subscriber { return s.sub }
