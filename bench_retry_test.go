package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// The poison storm's workload: stormKeys ordering keys of one partition,
// their messages published interleaved (key i%stormKeys), one key in ten
// always failing; handlers that take stormHandler, stormInFlight at once;
// the failure policy stormRetry, without jitter so that each wait can be
// compared with the configured one.
const (
	stormKeys     = 100
	stormInFlight = 16
	stormHandler  = 20 * time.Millisecond
	stormSeqMeta  = "bench_seq"
)

var stormRetry = pglease.RetryConfig{MaxAttempts: 4, MinBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second,
	Jitter: -1}

// stormPoison reports whether key (from 0) always fails in the storm.
func stormPoison(key int) bool { return key%10 == 0 }

// stormWait is the configured wait after the failure of attempt n (from
// 1): MinBackoff·2^(n-1), at most MaxBackoff.
func stormWait(n int) time.Duration {
	d := stormRetry.MinBackoff << (n - 1)
	return min(d, stormRetry.MaxBackoff)
}

// stormResult is what one drain measured.
type stormResult struct {
	// all is from Subscribe to the last Ack; healthy to the last Ack of a
	// key that does not fail in the storm (the same in a drain without
	// failures).
	all, healthy time.Duration
	// waitErrs are, for each wait between two attempts of a failing
	// message, (measured - configured) / configured; measured is from the
	// handler's Nack to its next receipt of the message.
	waitErrs []float64
	// deadLettered is how many distinct failing messages were found in
	// the dead-letter topic, each with MaxAttempts attempts and its
	// source topic.
	deadLettered int
}

// BenchmarkPoisonStorm measures what a poison storm costs the keys that
// do not fail: one partition, 100 ordering keys with perKey messages each
// (published interleaved before the drain), MaxInFlight 16, a handler of
// 20 ms, and the failure policy (MaxAttempts 4, backoff 200 ms doubling,
// at most 2 s, no jitter, a dead-letter topic) in both drains. Each round
// drains the same workload twice with a new Subscriber, alternating which
// goes first (3 rounds with 8 messages per key, 2 with 20): once with no failures (free), once with one key in ten
// always nacked with NackWithReason (storm). With 8 messages per key the
// failing keys' messages (80) fit in the in-flight window (100 with the
// default BatchSize); with 20 (200) they do not. It reports
//
//   - free-msgs/s and storm-msgs/s: the messages of the 90 keys that do
//     not fail in the storm over the time from Subscribe to their last
//     Ack, in each drain, and ratio, storm/free; free-all-msgs/s: every
//     message of the free drain over its time, and capacity-ratio,
//     storm-msgs/s over it (the share of the handlers' capacity that the
//     healthy keys keep: the failing attempts take some);
//   - dead-lettered: the failing keys' messages found in the dead-letter
//     topic per round, each once with 4 attempts (it must be all of them:
//     the benchmark fails otherwise, and when a healthy key's message is
//     lost, repeated or out of order, or a failing one is not handed out
//     exactly 4 times);
//   - backoff-worst-err-%, backoff-p90-err-% and backoff-mean-err-%: the
//     relative error of the waits between two attempts (from the
//     handler's Nack to its next receipt of the message, against 200, 400
//     and 800 ms), its worst, 90th percentile and mean.
//
// Run it with `make bench-retry` (PostgreSQL with fsync on); b.N is
// ignored, each count runs the rounds. benchmarks/retry.md has the
// figures.
func BenchmarkPoisonStorm(b *testing.B) {
	for _, w := range []struct{ perKey, rounds int }{{8, 3}, {20, 2}} {
		b.Run("perkey"+strconv.Itoa(w.perKey), func(b *testing.B) { benchPoisonStorm(b, w.perKey, w.rounds) })
	}
}

func benchPoisonStorm(b *testing.B, perKey, rounds int) {
	pool, tables := benchSetup(b, "bench")
	pub := benchPublisher(b, pool, tables)
	var free, storm stormResult
	b.ResetTimer()
	for round := range rounds {
		for i := range 2 {
			poisoned := (i+round)%2 == 1 // alternate which goes first
			topic := fmt.Sprintf("storm%d-%t", round, poisoned)
			r := drainStorm(b, pool, tables, pub, topic, perKey, poisoned)
			if poisoned {
				storm.all += r.all
				storm.healthy += r.healthy
				storm.waitErrs = append(storm.waitErrs, r.waitErrs...)
				storm.deadLettered += r.deadLettered
			} else {
				free.all += r.all
				free.healthy += r.healthy
			}
		}
	}
	b.StopTimer()
	healthyMsgs := float64(rounds * perKey * (stormKeys - stormKeys/10))
	freeRate := healthyMsgs / free.healthy.Seconds()
	stormRate := healthyMsgs / storm.healthy.Seconds()
	freeAllRate := float64(rounds*perKey*stormKeys) / free.all.Seconds()
	b.ReportMetric(freeRate, "free-msgs/s")
	b.ReportMetric(stormRate, "storm-msgs/s")
	b.ReportMetric(stormRate/freeRate, "ratio")
	b.ReportMetric(freeAllRate, "free-all-msgs/s")
	b.ReportMetric(stormRate/freeAllRate, "capacity-ratio")
	b.ReportMetric(float64(storm.deadLettered)/float64(rounds), "dead-lettered")
	errs := make([]float64, len(storm.waitErrs))
	sum := 0.0
	for i, e := range storm.waitErrs {
		errs[i] = math.Abs(e)
		sum += errs[i]
	}
	slices.Sort(errs)
	b.ReportMetric(100*errs[len(errs)-1], "backoff-worst-err-%")
	b.ReportMetric(100*errs[len(errs)*9/10], "backoff-p90-err-%")
	b.ReportMetric(100*sum/float64(len(errs)), "backoff-mean-err-%")
}

// stormAttempt is one hand-out of a failing message: when its handler got
// it and when it nacked it.
type stormAttempt struct {
	got, nacked time.Time
	attempt     string
}

// drainStorm publishes the workload to topic and drains it with a new
// Subscriber (poisoned: the failing keys nack), checks what it must, and
// returns what it measured.
func drainStorm(b *testing.B, pool *pgxpool.Pool, tables pglease.Tables, pub *pglease.Publisher, topic string,
	perKey int, poisoned bool) stormResult {
	b.Helper()
	deadTopic := topic + ".dead"
	msgs := make([]*message.Message, 0, stormKeys*perKey)
	for seq := range perKey {
		for k := range stormKeys {
			m := message.NewMessage(watermill.NewUUID(), benchPayload)
			m.Metadata.Set(pglease.PartitionKeyMetadata, strconv.Itoa(k))
			m.Metadata.Set(stormSeqMeta, strconv.Itoa(seq))
			msgs = append(msgs, m)
		}
	}
	require.NoError(b, pub.Publish(topic, msgs...))
	failing, healthy := 0, 0
	for k := range stormKeys {
		if poisoned && stormPoison(k) {
			failing += perKey
		} else {
			healthy += perKey
		}
	}

	retry := stormRetry
	retry.DeadLetterTopic = deadTopic
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: tables, MaxInFlight: stormInFlight,
		Retry: retry}, nil)
	require.NoError(b, err)
	var (
		mu       sync.Mutex
		problems []string
		next     = make(map[string]int, stormKeys) // each key's next sequence number
		acked    int
		last     [2]time.Time // the last Ack of any key, of a key that does not fail in the storm
		attempts = make(map[string][]stormAttempt, failing)
		done     = make(chan struct{})
	)
	poison := errors.New("poison")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := time.Now()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(b, err)
	var workers sync.WaitGroup
	for range stormInFlight {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for msg := range ch {
				got := time.Now()
				time.Sleep(stormHandler)
				key := msg.Metadata.Get(pglease.PartitionKeyMetadata)
				k, _ := strconv.Atoi(key)
				if poisoned && stormPoison(k) {
					mu.Lock()
					attempts[msg.UUID] = append(attempts[msg.UUID], stormAttempt{got: got, nacked: time.Now(),
						attempt: msg.Metadata.Get(pglease.DeliveryAttemptMetadata)})
					mu.Unlock()
					pglease.NackWithReason(msg, poison)
					continue
				}
				seq, _ := strconv.Atoi(msg.Metadata.Get(stormSeqMeta))
				mu.Lock()
				if seq != next[key] {
					problems = append(problems, fmt.Sprintf("key %s: got message %d, want %d", key, seq, next[key]))
				}
				next[key] = seq + 1
				acked++
				now := time.Now()
				last[0] = now
				if !stormPoison(k) {
					last[1] = now
				}
				if acked == healthy {
					close(done)
				}
				mu.Unlock()
				msg.Ack()
			}
		}()
	}
	defer func() {
		cancel()
		_ = sub.Close()
		workers.Wait()
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("%s: %d of %d messages acknowledged in 2m", topic, acked, healthy)
	}
	// Every failing message moves after its 4 attempts, one after the
	// other in its key: perKey × (0.2 + 0.4 + 0.8 s and the handlers).
	deadline := time.Now().Add(time.Duration(perKey)*3*time.Second + time.Minute)
	for sub.Stats().DeadLettered < uint64(failing) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d of %d messages moved to the dead-letter topic in time", topic,
				sub.Stats().DeadLettered, failing)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		b.Fatalf("%s: healthy keys out of order, lost or repeated: %v", topic, problems[:min(len(problems), 10)])
	}
	r := stormResult{all: last[0].Sub(began), healthy: last[1].Sub(began)}
	if !poisoned {
		return r
	}
	if len(attempts) != failing {
		b.Fatalf("%s: %d failing messages handed out, want %d", topic, len(attempts), failing)
	}
	for id, as := range attempts {
		if len(as) != stormRetry.MaxAttempts {
			b.Fatalf("%s: message %s handed out %d times, want %d", topic, id, len(as), stormRetry.MaxAttempts)
		}
		for n := 1; n < len(as); n++ {
			if as[n].attempt != strconv.Itoa(n+1) {
				b.Fatalf("%s: message %s: hand-out %d is attempt %q", topic, id, n+1, as[n].attempt)
			}
			want := stormWait(n)
			r.waitErrs = append(r.waitErrs, float64(as[n].got.Sub(as[n-1].nacked)-want)/float64(want))
		}
	}
	r.deadLettered = readDeadLetters(b, pool, tables, deadTopic, topic, attempts)
	return r
}

// readDeadLetters reads the dead-letter topic with a consumer group of its
// own and returns how many distinct messages of failing it holds, each
// from source with MaxAttempts attempts; it fails b on any other copy.
func readDeadLetters(b *testing.B, pool *pgxpool.Pool, tables pglease.Tables, deadTopic, source string,
	failing map[string][]stormAttempt) int {
	b.Helper()
	var stored int
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
		table(tables, pglease.DefaultMessagesTable)+` WHERE topic = $1`, deadTopic).Scan(&stored))
	if stored != len(failing) {
		b.Fatalf("%s: %d messages in the dead-letter topic, want %d", deadTopic, stored, len(failing))
	}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: tables, ConsumerGroup: "dead-letter-reader"}, nil)
	require.NoError(b, err)
	defer func() { _ = sub.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, deadTopic)
	require.NoError(b, err)
	seen := make(map[string]bool, len(failing))
	timeout := time.After(time.Minute)
	for len(seen) < stored {
		select {
		case msg := <-ch:
			msg.Ack()
			switch {
			case failing[msg.UUID] == nil:
				b.Fatalf("%s: message %s is not a failing one", deadTopic, msg.UUID)
			case seen[msg.UUID]:
				b.Fatalf("%s: message %s twice", deadTopic, msg.UUID)
			case msg.Metadata.Get(pglease.DeadLetterSourceTopicMetadata) != source,
				msg.Metadata.Get(pglease.DeadLetterAttemptsMetadata) != strconv.Itoa(stormRetry.MaxAttempts):
				b.Fatalf("%s: message %s from %q after %q attempts", deadTopic, msg.UUID,
					msg.Metadata.Get(pglease.DeadLetterSourceTopicMetadata), msg.Metadata.Get(pglease.DeadLetterAttemptsMetadata))
			}
			seen[msg.UUID] = true
		case <-timeout:
			b.Fatalf("%s: read %d of %d messages in 1m", deadTopic, len(seen), stored)
		}
	}
	return len(seen)
}
