package pglease_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// publishKeyed publishes one message per key, in order, with the key as
// its PartitionKeyMetadata, and returns their UUIDs.
func publishKeyed(t *testing.T, pub *pglease.Publisher, topic string, keys ...string) []string {
	t.Helper()
	var ids []string
	for _, k := range keys {
		msg := message.NewMessage(watermill.NewUUID(), []byte(k))
		msg.Metadata.Set(pglease.PartitionKeyMetadata, k)
		require.NoError(t, pub.Publish(topic, msg))
		ids = append(ids, msg.UUID)
	}
	return ids
}

// TestAckInTxWithMaxInFlight: with MaxInFlight above 1, a message
// acknowledged in its transaction above an earlier message that is not
// acknowledged yet does not move the group's position past that message
// (which the next owner then delivers again, not lost), and the next owner
// does not deliver it again (its effects stay exactly once).
func TestAckInTxWithMaxInFlight(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ids := publishKeyed(t, pub, "in", "a", "b", "a")
	createEffects(t, pool, adapter)
	newSub := func(drain time.Duration) *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true,
			MaxInFlight: 4, CommitBatch: 1, DrainTimeout: drain}, testLogger())
		require.NoError(t, err)
		return sub
	}
	ackInTx := func(msg *message.Message, proc string) error {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		require.NoError(t, insertEffect(ctx, tx, adapter.Schema, msg.UUID, proc))
		if err := pglease.AckInTx(ctx, tx, msg); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	// Close waits for no message out: b1 is never acked by its Subscriber.
	sub := newSub(-1)
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	a1, b1 := receiveOne(t, msgs), receiveOne(t, msgs)
	require.Equal(t, []string{ids[0], ids[1]}, []string{a1.UUID, b1.UUID}, "a1 and b1 at once; a2 waits for a1")
	require.NoError(t, ackInTx(b1, "first"))
	require.Equal(t, pglease.Position{}, ackedOffset(t, pool, adapter, "", "in"),
		"b1's transaction moved the position past a1, which is not acknowledged")
	// The process ends before b1's Ack, and a1 is not acknowledged.
	a1.Nack()
	require.NoError(t, sub.Close())

	sub = newSub(0)
	defer func() { require.NoError(t, sub.Close()) }()
	msgs, err = sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	a1 = receiveOne(t, msgs)
	require.Equal(t, ids[0], a1.UUID, "a1 delivered again")
	require.NoError(t, ackInTx(a1, "second"))
	a1.Ack()
	a2 := receiveOne(t, msgs)
	require.Equal(t, ids[2], a2.UUID, "a2 after a1; b1, acknowledged in its transaction, not again")
	require.NoError(t, ackInTx(a2, "second"))
	a2.Ack()
	pos, ok := pglease.MessagePositionFromCtx(a2.Context())
	require.True(t, ok)
	require.Eventually(t, func() bool { return ackedOffset(t, pool, adapter, "", "in") == pos }, 5*time.Second, 5*time.Millisecond,
		"the position reaches a2 once the prefix is acknowledged")
	effects := effectsOf(t, pool, adapter)
	require.Equal(t, map[string][]string{ids[0]: {"second"}, ids[1]: {"first"}, ids[2]: {"second"}}, effects)

	// The records the position has passed are dropped by the next AckInTx.
	more := publishKeyed(t, pub, "in", "b")
	b2 := receiveOne(t, msgs)
	require.Equal(t, more[0], b2.UUID)
	require.NoError(t, ackInTx(b2, "second"))
	b2.Ack()
	pos, ok = pglease.MessagePositionFromCtx(b2.Context())
	require.True(t, ok)
	var above []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT acked_above FROM `+table(adapter, pglease.DefaultConsumerOffsetsTable)+
		` WHERE consumer_group = '' AND topic = 'in'`).Scan(&above))
	require.Equal(t, []string{fmt.Sprintf("%d:%d", pos.TransactionID, pos.Offset)}, above)
}

// keyedRecord is one processing of a message of a keyed test topic, as a
// helper process recorded it.
type keyedRecord struct {
	proc, uuid, key    string
	pos                pglease.Position
	received, recorded time.Time
}

// loadKeyed returns what the helpers recorded processing of topic, with
// each message's key and position, ordered by proc, key and reception.
func loadKeyed(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, topic string) []keyedRecord {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT p.proc, p.uuid, m.metadata->>$2, m.transaction_id::text, m."offset",
	p.received_at, p.recorded_at
FROM `+table(adapter, processedTable)+` p JOIN `+table(adapter, pglease.DefaultMessagesTable)+` m
	ON m.uuid = p.uuid AND m.topic = $1
ORDER BY p.proc, 3, p.received_at`, topic, pglease.PartitionKeyMetadata)
	require.NoError(t, err)
	defer rows.Close()
	var out []keyedRecord
	for rows.Next() {
		var r keyedRecord
		var tx string
		require.NoError(t, rows.Scan(&r.proc, &r.uuid, &r.key, &tx, &r.pos.Offset, &r.received, &r.recorded))
		r.pos = parsePos(tx, r.pos.Offset)
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// checkKeyOrder counts, per process, the messages of a key handled out of
// publish order or while an earlier one of the key was still being handled.
func checkKeyOrder(recs []keyedRecord) (outOfOrder int) {
	for i := 1; i < len(recs); i++ {
		prev, r := recs[i-1], recs[i]
		if prev.proc != r.proc || prev.key != r.key {
			continue
		}
		if !posLess(prev.pos, r.pos) || r.received.Before(prev.recorded) {
			outOfOrder++
		}
	}
	return outOfOrder
}

// throughput is how many of recs proc processed per second, from the
// first reception to the last record.
func throughput(recs []keyedRecord, proc string) (n int, span time.Duration, perSecond float64) {
	var first, last time.Time
	for _, r := range recs {
		if r.proc != proc {
			continue
		}
		n++
		if first.IsZero() || r.received.Before(first) {
			first = r.received
		}
		if r.recorded.After(last) {
			last = r.recorded
		}
	}
	span = last.Sub(first)
	return n, span, float64(n) / span.Seconds()
}

// TestMaxInFlightAcrossProcesses: one topic of one partition, 64 keys, a
// handler of 20 ms behind a Watermill Router in a process of its own.
// MaxInFlight 32 handles at least 15 times the messages per second that
// MaxInFlight 1 does (both measured here), each key in publish order and
// one at a time; after a SIGKILL mid-run, the next process loses nothing,
// and delivers again only messages above the committed position: at
// most a commit batch and a window.
func TestMaxInFlightAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs helper processes for several seconds")
	}
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	instrument(t, pool, adapter)
	pub := newPublisher(t, pool, adapter)
	const keys, work, maxInFlight = 64, 20 * time.Millisecond, 32
	publish := func(topic string, n int) {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
			msgs[i].Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("k%02d", i%keys))
		}
		require.NoError(t, pub.Publish(topic, msgs...))
	}
	cfg := helperConfig{Schema: adapter.Schema, Group: "g", Mode: modeRouter, Work: work,
		SessionTTL: 2 * time.Second, PollInterval: 100 * time.Millisecond}

	// MaxInFlight 1: one message at a time.
	const serialN = 100
	publish("serial", serialN)
	serial := cfg.named("serial")
	serial.Topics = []string{"serial"}
	s := startHelper(t, serial)
	waitProcessed(t, pool, adapter, []string{"serial"}, time.Minute)
	s.close(t)
	serialRecs := loadKeyed(t, pool, adapter, "serial")
	n1, span1, rate1 := throughput(serialRecs, "serial")
	require.Equal(t, serialN, n1)

	// MaxInFlight 32, killed mid-run, then another process finishes.
	const parallelN, killAfter = 4096, 2000
	publish("parallel", parallelN)
	parallel := cfg.named("A")
	parallel.Topics, parallel.MaxInFlight = []string{"parallel"}, maxInFlight
	a := startHelper(t, parallel)
	waitProgress(t, pool, adapter, "A", time.Time{}, killAfter, time.Minute)
	a.signal(t, syscall.SIGKILL)
	<-a.exited
	b := startHelper(t, parallel.named("B"))
	waitProcessed(t, pool, adapter, []string{"parallel"}, time.Minute)
	b.close(t)

	recs := loadKeyed(t, pool, adapter, "parallel")
	n32, span32, rate32 := throughput(recs, "A")
	ratio := rate32 / rate1
	t.Logf("MaxInFlight 1: %d messages in %s = %.0f/s; MaxInFlight %d: %d messages in %s = %.0f/s (until the kill); %.1fx",
		n1, span1.Round(time.Millisecond), rate1, maxInFlight, n32, span32.Round(time.Millisecond), rate32, ratio)
	// 64 keys and a 20 ms handler allow 32x; 15x leaves room for the
	// commits, the records and a shared machine.
	require.GreaterOrEqual(t, ratio, 15.0, "MaxInFlight %d over MaxInFlight 1", maxInFlight)

	require.Zero(t, checkKeyOrder(serialRecs), "MaxInFlight 1 handled a key out of order")
	require.Zero(t, checkKeyOrder(recs), "MaxInFlight %d handled a key out of order or two of a key at once", maxInFlight)
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.uuid]++
	}
	require.Len(t, seen, parallelN, "messages lost after the kill")
	dups := len(recs) - parallelN
	// What B delivers again is what A handled above the position A had
	// committed: the Acks of a commit batch not written yet, and the window.
	bound := pglease.DefaultCommitBatch + max(pglease.DefaultBatchSize, 4*maxInFlight)
	t.Logf("after the SIGKILL: %d messages delivered twice (bound %d)", dups, bound)
	require.LessOrEqual(t, dups, bound)
	for u, n := range seen {
		require.LessOrEqual(t, n, 2, "message %s handled %d times", u, n)
	}
}

// TestWaitingKeyDoesNotHoldOthers: with MaxInFlight above 1, a message
// waiting behind its key (a1, nacked again and again, or held by a slow
// handler, with a2 read behind it) does not stop the window from reading
// and handing out the messages of other keys published after it; a2 goes
// out after a1's Ack, and the position then passes all of them.
func TestWaitingKeyDoesNotHoldOthers(t *testing.T) {
	for _, mode := range []string{"nacked", "slow"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			pub := newPublisher(t, pool, adapter)
			a := publishKeyed(t, pub, "in", "a", "a")
			// BatchSize 4: the other keys take several reads.
			sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{MaxInFlight: 4, BatchSize: 4,
				NackResendDelay: 5 * time.Millisecond})
			msgs, err := sub.Subscribe(ctx, "in")
			require.NoError(t, err)
			a1 := receiveOne(t, msgs)
			require.Equal(t, a[0], a1.UUID)

			const keys, perKey = 8, 5
			var others []string
			for range perKey {
				for k := range keys {
					others = append(others, publishKeyed(t, pub, "in", fmt.Sprintf("k%d", k))...)
				}
			}
			var (
				release = make(chan struct{})
				got     []string
				a2      string
				a1Nacks int
				last    pglease.Position // of the last message of the other keys
			)
			// One loop hands the messages to handlers: a1 is nacked until
			// release (nacked), or held until release (slow); the others
			// are acked at once, in the order they come, per key.
			done := make(chan struct{})
			go func() {
				defer close(done)
				deadline := time.After(30 * time.Second)
				pending := a1
				for a2 == "" {
					if pending != nil {
						if mode == "nacked" {
							select {
							case <-release:
								pending.Ack()
							default:
								a1Nacks++
								pending.Nack()
							}
							pending = nil
						} else {
							held := pending
							pending = nil
							go func() {
								<-release
								held.Ack()
							}()
						}
					}
					select {
					case msg := <-msgs:
						switch msg.UUID {
						case a[0]:
							pending = msg
						case a[1]:
							a2 = msg.UUID
							msg.Ack()
						default:
							got = append(got, msg.UUID)
							msg.Ack()
							if len(got) == len(others) {
								last, _ = pglease.MessagePositionFromCtx(msg.Context())
								close(release)
							}
						}
					case <-deadline:
						return
					}
				}
			}()
			<-done
			require.Equal(t, others, got, "every message of the other keys, in order, while a1 waited")
			require.Equal(t, a[1], a2, "a2 after a1's Ack")
			if mode == "nacked" {
				require.Positive(t, a1Nacks)
			}
			waitFor(t, 10*time.Second, "the position past every message", func() bool {
				return ackedOffset(t, pool, adapter, "", "in") == last
			})
		})
	}
}

// nackKeyLoop consumes msgs until the channel closes: it nacks the
// messages whose PartitionKeyMetadata is key and acks the others, counting
// them in acked. It returns a channel closed when the loop ends.
func nackKeyLoop(msgs <-chan *message.Message, key string, acked *atomic.Int64) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range msgs {
			if msg.Metadata.Get(pglease.PartitionKeyMetadata) == key {
				msg.Nack()
				continue
			}
			msg.Ack()
			acked.Add(1)
		}
	}()
	return done
}

// TestHandOverKeepsAcksAbove: with MaxInFlight above 1, a planned
// hand-over (Close, or a rebalance giving the row up) while a1 is nacked
// again and again and the messages after it are acked delivers none of
// those again to the next owner: the release carries their Acks
// (acked_above), and the next owner, whatever its MaxInFlight, delivers
// a1 and then the messages published after.
func TestHandOverKeepsAcksAbove(t *testing.T) {
	ctx := context.Background()
	config := pglease.SubscriberConfig{MaxInFlight: 4, CommitBatch: 1, NackResendDelay: 5 * time.Millisecond}
	for _, next := range []int{1, 4} {
		t.Run(fmt.Sprintf("Close, next owner MaxInFlight %d", next), func(t *testing.T) {
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			pub := newPublisher(t, pool, adapter)
			a := publishKeyed(t, pub, "in", "a")
			b := publishKeyed(t, pub, "in", "b1", "b2", "b3", "b4", "b5", "b6")
			subA := newTestSubscriber(t, pool, adapter, config)
			msgs, err := subA.Subscribe(ctx, "in")
			require.NoError(t, err)
			var acked atomic.Int64
			loop := nackKeyLoop(msgs, "a", &acked)
			waitFor(t, 10*time.Second, "b1 to b6 acked while a1 is nacked", func() bool { return acked.Load() == int64(len(b)) })
			require.NoError(t, subA.Close())
			<-loop
			require.Equal(t, pglease.Position{}, ackedOffset(t, pool, adapter, "", "in"), "the position passed a1")

			cfg := config
			cfg.MaxInFlight = next
			subB := newTestSubscriber(t, pool, adapter, cfg)
			msgs, err = subB.Subscribe(ctx, "in")
			require.NoError(t, err)
			first := receiveOne(t, msgs)
			require.Equal(t, a[0], first.UUID, "a1 first")
			first.Ack()
			c := publishKeyed(t, pub, "in", "c")
			then := receiveOne(t, msgs)
			require.Equal(t, c[0], then.UUID, "the message published after, not b1 to b6 again")
			then.Ack()
		})
	}
	t.Run("rebalance", func(t *testing.T) {
		pool := newPool(t, 20)
		adapter := newSchema(t, pool)
		pub := newPublisher(t, pool, adapter)
		topics := []string{"t1", "t2"}
		first := map[string]string{}
		bs := map[string]bool{}
		for _, topic := range topics {
			first[topic] = publishKeyed(t, pub, topic, "a")[0]
			for _, id := range publishKeyed(t, pub, topic, "b1", "b2", "b3", "b4", "b5", "b6") {
				bs[id] = true
			}
		}
		subA := newTestSubscriber(t, pool, adapter, config)
		var acked atomic.Int64
		var loops []<-chan struct{}
		for _, topic := range topics {
			msgs, err := subA.Subscribe(ctx, topic)
			require.NoError(t, err)
			loops = append(loops, nackKeyLoop(msgs, "a", &acked))
		}
		waitFor(t, 10*time.Second, "every b acked while a1 is nacked", func() bool { return acked.Load() == int64(len(bs)) })

		// B joins: A gives one topic up (its share is one of two).
		subB := newTestSubscriber(t, pool, adapter, config)
		received := make(chan *message.Message, 100)
		for _, topic := range topics {
			msgs, err := subB.Subscribe(ctx, topic)
			require.NoError(t, err)
			go func() {
				for msg := range msgs {
					msg.Ack()
					received <- msg
				}
			}()
		}
		var moved string
		select {
		case msg := <-received:
			require.False(t, bs[msg.UUID], "B delivered %s, acknowledged by A, again", msg.UUID)
			for topic, id := range first {
				if id == msg.UUID {
					moved = topic
				}
			}
			require.NotEmpty(t, moved, "B's first message %s is not the a1 of a topic", msg.UUID)
		case <-time.After(30 * time.Second):
			t.Fatal("no topic handed over to B within 30s")
		}
		c := publishKeyed(t, pub, moved, "c")
		select {
		case msg := <-received:
			require.Equal(t, c[0], msg.UUID, "the message published after, not a b of A again")
		case <-time.After(10 * time.Second):
			t.Fatal("the message published after the hand-over not delivered within 10s")
		}
		require.NoError(t, subA.Close())
		for _, l := range loops {
			<-l
		}
	})
}
