package pglease_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/google/uuid"
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
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
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
// in calls of 1,000, with one Subscriber that acks each message: in the
// default configuration (MaxInFlight 1) and with MaxInFlight 8. Only the
// drain is timed: from Subscribe to the last Ack.
func BenchmarkConsume(b *testing.B) {
	b.Run("default", func(b *testing.B) { benchConsume(b, 0) })
	b.Run("inflight8", func(b *testing.B) { benchConsume(b, 8) })
}

func benchConsume(b *testing.B, maxInFlight int) {
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

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, MaxInFlight: maxInFlight}, nil)
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
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, nil)
		require.NoError(b, err)
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true}, nil)
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

// BenchmarkWaitingKey measures what one key waiting behind its first
// message costs the other keys with MaxInFlight 8: each op drains 5,000
// messages of 16 keys from one partition, once alone (free) and once
// behind a message of another key that is nacked again and again
// (waiting), each with a new Subscriber that acks at once. It reports both
// rates and waiting/free (ratio); 5,000 stays below the cap of
// acknowledged positions a window keeps above a waiting message (6,400
// with the default BatchSize).
func BenchmarkWaitingKey(b *testing.B) {
	const n, keys = 5000, 16
	pool, adapter := benchSetup(b, "bench")
	pub := benchPublisher(b, pool, adapter)
	drain := func(topic string, stuck bool) time.Duration {
		if stuck {
			a := message.NewMessage(watermill.NewUUID(), benchPayload)
			a.Metadata.Set(pglease.PartitionKeyMetadata, "a")
			require.NoError(b, pub.Publish(topic, a))
		}
		msgs := benchMessages(n)
		for i, m := range msgs {
			m.Metadata.Set(pglease.PartitionKeyMetadata, "k"+strconv.Itoa(i%keys))
		}
		require.NoError(b, pub.Publish(topic, msgs...))
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, MaxInFlight: 8,
			NackResendDelay: time.Millisecond, DrainTimeout: -1}, nil) // a1 may be out at Close
		require.NoError(b, err)
		defer func() { _ = sub.Close() }()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		began := time.Now()
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(b, err)
		timeout := time.After(time.Minute)
		for got := 0; got < n; {
			select {
			case msg := <-ch:
				if msg.Metadata.Get(pglease.PartitionKeyMetadata) == "a" {
					msg.Nack()
					continue
				}
				msg.Ack()
				got++
			case <-timeout:
				b.Fatalf("received %d of %d messages in 1m", got, n)
			}
		}
		return time.Since(began)
	}
	var free, waiting time.Duration
	b.ResetTimer()
	for i := range b.N {
		free += drain("free"+strconv.Itoa(i), false)
		waiting += drain("waiting"+strconv.Itoa(i), true)
	}
	b.StopTimer()
	freeRate := float64(n*b.N) / free.Seconds()
	waitingRate := float64(n*b.N) / waiting.Seconds()
	b.ReportMetric(freeRate, "free-msgs/s")
	b.ReportMetric(waitingRate, "waiting-msgs/s")
	b.ReportMetric(waitingRate/freeRate, "ratio")
}

// BenchmarkIdempotentPublish publishes the same workloads with and without
// idempotency keys (each message's UUID, PublisherConfig.IdempotencyKey)
// side by side: rounds of 20,000 messages, alternating, so that both
// meet the same state of the server; it reports each one's msgs/s over
// all rounds and the keyed rate as a percentage of the plain one. The
// workloads: one message per call from 64 goroutines (parallel64,
// group-committed), 100 messages per call from one (batch100), the same
// on a topic with a retention of three days, whose keys take the rows of
// its key class (batch100retention), and the same with time-ordered
// UUIDs (version 7) as the messages' UUIDs, and so keys, instead of
// random ones (batch100uuidv7). Run it
// with `make bench-keys` (PostgreSQL with fsync on); b.N is ignored.
func BenchmarkIdempotentPublish(b *testing.B) {
	const topic, perRound, rounds = "bench", 20000, 5
	workloads := []struct {
		name string
		// long: the topic has a retention of three days, its keys the
		// rows of its key class (ready, past its two days of day rows).
		long bool
		run  func(b *testing.B, pub *pglease.Publisher)
	}{
		{"parallel64", false, func(b *testing.B, pub *pglease.Publisher) {
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < perRound; i += 64 {
						if err := pub.Publish(topic, benchMessages(1)...); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		}},
		{"batch100", false, func(b *testing.B, pub *pglease.Publisher) {
			for i := 0; i < perRound; i += 100 {
				if err := pub.Publish(topic, benchMessages(100)...); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"batch100retention", true, func(b *testing.B, pub *pglease.Publisher) {
			for i := 0; i < perRound; i += 100 {
				if err := pub.Publish(topic, benchMessages(100)...); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"batch100uuidv7", false, func(b *testing.B, pub *pglease.Publisher) {
			for i := 0; i < perRound; i += 100 {
				msgs := make([]*message.Message, 100)
				for j := range msgs {
					msgs[j] = message.NewMessage(uuid.Must(uuid.NewV7()).String(), benchPayload)
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					b.Fatal(err)
				}
			}
		}},
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			pool, tables := benchSetup(b, topic)
			if w.long {
				require.NoError(b, pglease.CreateTopic(context.Background(), pool, topic, pglease.TopicConfig{Retention: 72 * time.Hour, Tables: tables}))
				readyKeyClass(b, pool, tables, 19)
			}
			plain := benchPublisher(b, pool, tables)
			keyed, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
			require.NoError(b, err)
			b.Cleanup(func() { _ = keyed.Close() })
			w.run(b, plain) // warm up both
			w.run(b, keyed)
			var spent [2]time.Duration
			b.ResetTimer()
			for round := range rounds {
				for i, pub := range []*pglease.Publisher{plain, keyed} {
					if round%2 == 1 { // alternate which goes first
						i, pub = 1-i, []*pglease.Publisher{plain, keyed}[1-i]
					}
					start := time.Now()
					w.run(b, pub)
					spent[i] += time.Since(start)
				}
			}
			b.StopTimer()
			plainRate := float64(rounds*perRound) / spent[0].Seconds()
			keyedRate := float64(rounds*perRound) / spent[1].Seconds()
			b.ReportMetric(plainRate, "plain_msgs/s")
			b.ReportMetric(keyedRate, "keyed_msgs/s")
			b.ReportMetric(100*keyedRate/plainRate, "keyed_%")
		})
	}
}
