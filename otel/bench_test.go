package otel_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/otel"
)

// noopOptions are the providers of an application that installed none:
// what the wrappers cost by themselves.
func noopOptions() []otel.Option {
	return []otel.Option{otel.WithTracerProvider(tracenoop.NewTracerProvider()),
		otel.WithMeterProvider(metricnoop.NewMeterProvider()), otel.WithPropagator(propagation.TraceContext{})}
}

// How a benchmarked Publisher or Subscriber is traced.
const (
	bare         = "bare"         // not
	wrapped      = "wrapped"      // WrapPublisher, WrapSubscriber
	instrumented = "instrumented" // Instrument
)

// BenchmarkPublish publishes one message per call, from 8 goroutines (so
// that the group commit batches), with and without WrapPublisher on
// no-op providers.
//
//	go test -run '^$' -bench 'Publish|Consume' -benchtime 3s -count 5 ./otel
func BenchmarkPublish(b *testing.B) {
	for _, how := range []string{bare, wrapped} {
		b.Run(how, func(b *testing.B) {
			pool := pgtest.NewPool(b, testDSN, 0)
			tables := pglease.Tables{Schema: pgtest.NewSchema(b, pool, "pglease_otel_bench_")}
			raw, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: tables, AutoInitializeSchema: true}, nil)
			require.NoError(b, err)
			var pub message.Publisher = raw
			if how == wrapped {
				pub = otel.WrapPublisher(raw, noopOptions()...)
			}
			b.Cleanup(func() { _ = pub.Close() })
			require.NoError(b, pub.Publish("t", message.NewMessage(watermill.NewUUID(), []byte("x"))))
			b.SetParallelism(4) // 4 × GOMAXPROCS goroutines
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := pub.Publish("t", message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkConsume consumes b.N stored messages of one topic, acking
// each, without tracing, through Instrument and through WrapSubscriber,
// on no-op providers.
func BenchmarkConsume(b *testing.B) {
	for _, how := range []string{bare, instrumented, wrapped} {
		b.Run(how, func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.NewPool(b, testDSN, 0)
			tables := pglease.Tables{Schema: pgtest.NewSchema(b, pool, "pglease_otel_bench_")}
			pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: tables, AutoInitializeSchema: true}, nil)
			require.NoError(b, err)
			msgs := make([]*message.Message, 0, 1000)
			for i := range b.N {
				msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte("x")))
				if len(msgs) == cap(msgs) || i == b.N-1 {
					require.NoError(b, pub.Publish("t", msgs...))
					msgs = msgs[:0]
				}
			}
			require.NoError(b, pub.Close())
			cfg := pglease.SubscriberConfig{SchemaAdapter: tables, CommitInterval: 100 * time.Millisecond, CommitBatch: 1000}
			if how == instrumented {
				cfg = otel.Instrument(cfg, noopOptions()...)
			}
			raw, err := pglease.NewSubscriber(pool, cfg, nil)
			require.NoError(b, err)
			var sub message.Subscriber = raw
			if how == wrapped {
				sub = otel.WrapSubscriber(raw, noopOptions()...)
			}
			b.Cleanup(func() { _ = sub.Close() })
			b.ResetTimer()
			ch, err := sub.Subscribe(ctx, "t")
			require.NoError(b, err)
			for range b.N {
				m := <-ch
				m.Ack()
			}
		})
	}
}

// nopPublisher stores nothing: BenchmarkWrapperPublish measures the
// wrapper alone, without the database's noise.
type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// ackSubscriber hands out n messages one at a time, each after the
// previous one was acked, as a pglease Subscriber does, calling
// onDelivery, if set, as a pglease Subscriber calls
// SubscriberConfig.OnDelivery.
type ackSubscriber struct {
	n          int
	onDelivery func(*message.Message) func(error)
}

func (s ackSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	ch := make(chan *message.Message)
	go func() {
		defer close(ch)
		for range s.n {
			m := message.NewMessage("id", nil)
			var settled func(error)
			if s.onDelivery != nil {
				settled = s.onDelivery(m)
			}
			err := pglease.ErrDeliveryEnded
			select {
			case ch <- m:
				select {
				case <-m.Acked():
					err = nil
				case <-ctx.Done():
				}
			case <-ctx.Done():
			}
			if settled != nil {
				settled(err)
			}
			if err != nil {
				return
			}
		}
	}()
	return ch, nil
}
func (ackSubscriber) Close() error { return nil }

// BenchmarkWrapperPublish and BenchmarkWrapperConsume measure what the
// wrappers add to a Publish call and to a delivery, on no-op providers,
// around a Publisher and a Subscriber that do no I/O: the difference
// between bare and wrapped (or instrumented: Instrument's hook, called
// as a pglease Subscriber calls it) is the cost per message, to compare
// with a Publish (BenchmarkPublish) or a delivery (BenchmarkConsume) on
// PostgreSQL, which load on a shared machine makes too noisy to compare
// directly.
//
//	go test -run '^$' -bench 'Wrapper' -count 5 ./otel
func BenchmarkWrapperPublish(b *testing.B) {
	for _, how := range []string{bare, wrapped} {
		b.Run(how, func(b *testing.B) {
			var pub message.Publisher = nopPublisher{}
			if how == wrapped {
				pub = otel.WrapPublisher(pub, noopOptions()...)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := pub.Publish("t", message.NewMessage("id", nil)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkWrapperConsume(b *testing.B) {
	for _, how := range []string{bare, instrumented, wrapped} {
		b.Run(how, func(b *testing.B) {
			var sub message.Subscriber = ackSubscriber{n: b.N}
			switch how {
			case instrumented:
				sub = ackSubscriber{n: b.N, onDelivery: otel.Instrument(pglease.SubscriberConfig{}, noopOptions()...).OnDelivery}
			case wrapped:
				sub = otel.WrapSubscriber(sub, noopOptions()...)
			}
			defer func() { _ = sub.Close() }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			ch, err := sub.Subscribe(ctx, "t")
			require.NoError(b, err)
			for range b.N {
				(<-ch).Ack()
			}
		})
	}
}
