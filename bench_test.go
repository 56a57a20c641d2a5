package pglease_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// The benchmarks below measure the library alone; benchmarks/ compares it
// with watermill-sql. Every message carries a 64-byte payload, and every
// benchmark reports msgs/s next to ns/op (one op is one message).

var benchPayload = func() []byte {
	head := `{"bench":"pglease","pad":"`
	return []byte(head + strings.Repeat("x", 64-len(head)-2) + `"}`)
}()

func benchMessages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), benchPayload)
	}
	return msgs
}

func benchPublisher(b *testing.B, pool *pgxpool.Pool, adapter pglease.Tables) *pglease.Publisher {
	b.Helper()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = pub.Close() })
	return pub
}

func reportMsgsPerSec(b *testing.B, msgs int) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(msgs)/s, "msgs/s")
	}
}

// BenchmarkPublish publishes to one topic on a pool of 64 connections:
// one message per call from one goroutine (single), 100 messages per call
// (batch100), and one message per call from 64 goroutines (parallel64).
func BenchmarkPublish(b *testing.B) {
	const topic = "bench"
	b.Run("single", func(b *testing.B) {
		pool, adapter := benchSetup(b, topic)
		pub := benchPublisher(b, pool, adapter)
		require.NoError(b, pub.Publish(topic, benchMessages(1)...))
		b.ResetTimer()
		for range b.N {
			if err := pub.Publish(topic, benchMessages(1)...); err != nil {
				b.Fatal(err)
			}
		}
		reportMsgsPerSec(b, b.N)
	})
	b.Run("batch100", func(b *testing.B) {
		pool, adapter := benchSetup(b, topic)
		pub := benchPublisher(b, pool, adapter)
		require.NoError(b, pub.Publish(topic, benchMessages(100)...))
		b.ResetTimer()
		for done := 0; done < b.N; done += 100 {
			if err := pub.Publish(topic, benchMessages(min(100, b.N-done))...); err != nil {
				b.Fatal(err)
			}
		}
		reportMsgsPerSec(b, b.N)
	})
	b.Run("parallel64", func(b *testing.B) {
		pool, adapter := benchSetup(b, topic)
		pub := benchPublisher(b, pool, adapter)
		require.NoError(b, pub.Publish(topic, benchMessages(1)...))
		procs := runtime.GOMAXPROCS(0)
		b.SetParallelism((64 + procs - 1) / procs)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := pub.Publish(topic, benchMessages(1)...); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportMsgsPerSec(b, b.N)
	})
}

// BenchmarkConsume drains a backlog of b.N messages, published beforehand
// in calls of 1,000, with one Subscriber (default configuration) that acks
// each message. Only the drain is timed: from Subscribe to the last Ack.
func BenchmarkConsume(b *testing.B) {
	const topic = "bench"
	pool, adapter := benchSetup(b, topic)
	pub := benchPublisher(b, pool, adapter)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		perr error
	)
	const chunk, workers = 1000, 4
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := w * chunk; from < b.N; from += workers * chunk {
				if err := pub.Publish(topic, benchMessages(min(chunk, b.N-from))...); err != nil {
					mu.Lock()
					perr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(b, perr)

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: adapter}, nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	b.ResetTimer()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(b, err)
	timeout := time.After(5 * time.Minute)
	for i := range b.N {
		select {
		case msg, ok := <-msgs:
			if !ok {
				b.Fatalf("subscription closed after %d of %d messages", i, b.N)
			}
			msg.Ack()
		case <-timeout:
			b.Fatalf("received %d of %d messages in 5m", i, b.N)
		}
	}
	b.StopTimer()
	reportMsgsPerSec(b, b.N)
}

// BenchmarkSubscriber runs Watermill's own subscriber benchmark: b.N
// messages published one per call while one Subscriber (default
// configuration) receives them.
func BenchmarkSubscriber(b *testing.B) {
	const conns = 20
	pool := newPool(b, conns)
	adapter := newSchema(b, pool)
	tests.BenchSubscriber(b, func(_ int) (message.Publisher, message.Subscriber) {
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, nil)
		require.NoError(b, err)
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: adapter, InitializeSchema: true}, nil)
		require.NoError(b, err)
		b.Cleanup(func() {
			_ = pub.Close()
			_ = sub.Close()
		})
		// Create the tables before the benchmark's publisher goroutine
		// starts.
		require.NoError(b, sub.SubscribeInitialize("bench"))
		return pub, sub
	})
	reportMsgsPerSec(b, b.N)
}
