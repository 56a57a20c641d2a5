package otel_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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
// with a Publish or a delivery on PostgreSQL (BenchmarkOverhead, whose
// rounds make the comparison there).
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

// BenchmarkWrapperConsume: see BenchmarkWrapperPublish. The variants
// "-global" take the global providers of an application that installed
// none, and "-recording" a tracer of the SDK that samples and records
// every span into no exporter.
func BenchmarkWrapperConsume(b *testing.B) {
	recording := []otel.Option{otel.WithTracerProvider(sdktrace.NewTracerProvider()),
		otel.WithMeterProvider(metricnoop.NewMeterProvider()), otel.WithPropagator(propagation.TraceContext{})}
	for _, how := range []string{bare, instrumented, instrumented + "-global", instrumented + "-recording", wrapped, wrapped + "-recording"} {
		b.Run(how, func(b *testing.B) {
			var sub message.Subscriber = ackSubscriber{n: b.N}
			opts := noopOptions()
			switch {
			case strings.HasSuffix(how, "-global"):
				opts = nil
			case strings.HasSuffix(how, "-recording"):
				opts = recording
			}
			switch strings.TrimSuffix(strings.TrimSuffix(how, "-global"), "-recording") {
			case instrumented:
				sub = ackSubscriber{n: b.N, onDelivery: otel.Instrument(pglease.SubscriberConfig{}, opts...).OnDelivery}
			case wrapped:
				sub = otel.WrapSubscriber(sub, opts...)
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

// BenchmarkOverhead measures what the module adds to a delivery and to a
// Publish on PostgreSQL, with no-op providers, as a ratio of rounds run
// back to back: each round consumes overheadRoundMessages stored
// messages of a fresh topic with a bare Subscriber, one made with
// Instrument and one wrapped with WrapSubscriber, and publishes as many
// messages from 8 goroutines with a bare and a wrapped Publisher, in an
// order that changes from round to round. Load on a shared machine
// moves whole runs by ±15 %; within a round both sides see the same
// load, so the median of the rounds' ratios is what the module costs.
// make bench-otel runs it:
//
//	go test -run '^$' -bench Overhead -benchtime 30x ./otel
func BenchmarkOverhead(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewPool(b, testDSN, 0)
	tables := pglease.Tables{Schema: pgtest.NewSchema(b, pool, "pglease_otel_overhead_")}
	raw, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = raw.Close() })
	publishers := map[string]message.Publisher{bare: raw, wrapped: otel.WrapPublisher(raw, noopOptions()...)}
	cfg := pglease.SubscriberConfig{Tables: tables, CommitInterval: 100 * time.Millisecond, CommitBatch: 1000}
	subscribers := map[string]message.Subscriber{}
	for _, how := range []string{bare, instrumented, wrapped} {
		c := cfg
		if how == instrumented {
			c = otel.Instrument(cfg, noopOptions()...)
		}
		s, err := pglease.NewSubscriber(pool, c, nil)
		require.NoError(b, err)
		subscribers[how] = s
		if how == wrapped {
			subscribers[how] = otel.WrapSubscriber(s, noopOptions()...)
		}
		b.Cleanup(func() { _ = subscribers[how].Close() })
	}

	perMessage := map[string][]float64{} // ns per message, by side
	ratios := map[string][]float64{}     // side / bare, by side
	consumeOrders := [][]string{{bare, instrumented, wrapped}, {wrapped, instrumented, bare}, {instrumented, bare, wrapped}}
	publishOrders := [][]string{{bare, wrapped}, {wrapped, bare}}
	b.ResetTimer()
	for round := range b.N {
		b.StopTimer()
		topics := map[string]string{}
		for _, how := range consumeOrders[0] {
			topics[how] = fmt.Sprintf("%s-%d", how, round)
			storeMessages(b, raw, topics[how], overheadRoundMessages)
		}
		b.StartTimer()
		took := map[string]time.Duration{}
		for _, how := range consumeOrders[round%len(consumeOrders)] {
			cpu := cpuTime()
			took["consume "+how] = consumeAll(b, ctx, subscribers[how], topics[how], overheadRoundMessages)
			took["consume-cpu "+how] = cpuTime() - cpu
		}
		for _, how := range publishOrders[round%len(publishOrders)] {
			cpu := cpuTime()
			took["publish "+how] = publishAll(b, publishers[how], fmt.Sprintf("p-%s-%d", how, round), overheadRoundMessages)
			took["publish-cpu "+how] = cpuTime() - cpu
		}
		for side, d := range took {
			perMessage[side] = append(perMessage[side], float64(d.Nanoseconds())/overheadRoundMessages)
			if how := strings.Fields(side); how[1] != bare {
				ratios[side] = append(ratios[side], float64(d)/float64(took[how[0]+" "+bare]))
			}
		}
	}
	b.StopTimer()
	for side, v := range perMessage {
		b.ReportMetric(median(v), "ns/msg:"+strings.ReplaceAll(side, " ", "-"))
	}
	for side, v := range ratios {
		b.ReportMetric(100*(median(v)-1), "%overhead:"+strings.ReplaceAll(side, " ", "-"))
	}
}

// cpuTime is the CPU time this process has used, in user and system
// mode: what the module costs the application, which the database's
// share of the wall time does not dilute.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// overheadRoundMessages is how many messages each side of a round of
// BenchmarkOverhead consumes and publishes.
const overheadRoundMessages = 20000

// storeMessages publishes n messages to topic, 1,000 per call.
func storeMessages(b *testing.B, pub message.Publisher, topic string, n int) {
	msgs := make([]*message.Message, 0, 1000)
	for i := range n {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte("x")))
		if len(msgs) == cap(msgs) || i == n-1 {
			require.NoError(b, pub.Publish(topic, msgs...))
			msgs = msgs[:0]
		}
	}
}

// consumeAll subscribes to topic and acks n messages; it returns the
// time from the first message to the last ack, which leaves out the
// claim of the topic.
func consumeAll(b *testing.B, ctx context.Context, sub message.Subscriber, topic string, n int) time.Duration {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(b, err)
	m := <-ch
	start := time.Now()
	m.Ack()
	for range n - 1 {
		(<-ch).Ack()
	}
	return time.Since(start)
}

// publishAll publishes n messages to topic, one per call, from 8
// goroutines, and returns how long that took.
func publishAll(b *testing.B, pub message.Publisher, topic string, n int) time.Duration {
	const goroutines = 8
	start := time.Now()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < n; i += goroutines {
				if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
