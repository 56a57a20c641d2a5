package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// TestGroupCommitErrorsReachTheRightCallers publishes from many goroutines
// at once, so that calls share statements, while a CHECK constraint rejects
// one message: only the call holding it fails, every other call's messages
// are stored.
func TestGroupCommitErrorsReachTheRightCallers(t *testing.T) {
	parallel(t)
	pool := newPool(t, 8)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pub.Publish("setup", message.NewMessage(watermill.NewUUID(), nil)))
	_, err := pool.Exec(context.Background(), "ALTER TABLE "+table(adapter, pglease.DefaultMessagesTable)+
		" ADD CONSTRAINT no_poison CHECK (uuid NOT LIKE 'poison%')")
	require.NoError(t, err)

	const callers, rounds = 32, 20
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		poisoned int
		stored   int
	)
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				poison := c == 0 && r%5 == 0
				id := watermill.NewUUID()
				if poison {
					id = "poison-" + id
				}
				// Two messages per call: a call is stored whole or not at all.
				msgs := []*message.Message{message.NewMessage(id, []byte("x")), message.NewMessage(watermill.NewUUID(), []byte("y"))}
				err := pub.Publish("group", msgs...)
				mu.Lock()
				if poison {
					var pgErr *pgconn.PgError
					if assert.ErrorAs(t, err, &pgErr, "the poisoned call gets the server's error") {
						assert.Equal(t, "23514", pgErr.Code)
					}
					poisoned++
				} else if assert.NoError(t, err, "a call without poison must succeed") {
					stored += len(msgs)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 4, poisoned)
	assert.Equal(t, stored, countRows(t, pool, adapter, "topic = 'group'"), "exactly the successful calls are stored")
	assert.Equal(t, 0, countRows(t, pool, adapter, "uuid LIKE 'poison%'"))
	// Calls did share statements: some transaction wrote more than one call.
	// Positions are per row (a sequence), so the writing transaction is
	// the rows' xmin.
	assert.Positive(t, countRows(t, pool, adapter, "topic = 'group' AND xmin::text IN (SELECT xmin::text FROM "+
		table(adapter, pglease.DefaultMessagesTable)+" WHERE topic = 'group' GROUP BY xmin::text HAVING count(*) > 2)"))
}

// TestGroupCommitTakesOverFromAnInlineCall: with a single worker slot (a
// pool of 2 connections), a call that finds nothing running writes in its
// own goroutine. Calls arriving while it waits (here on a table lock) queue
// up, and are written once it is done, by a goroutine that takes the slot
// over; none is lost, none hangs, and nothing is left running after Close.
func TestGroupCommitTakesOverFromAnInlineCall(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 2)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pub.Publish("setup", message.NewMessage(watermill.NewUUID(), nil)))

	waiting, unlock := lockMessagesTable(t, adapter)

	const queued = 10
	errs := make(chan error, queued+1)
	go func() { errs <- pub.Publish("takeover", message.NewMessage("first", nil)) }()
	waitFor(t, 10*time.Second, "the first call to wait on the lock", func() bool { return waiting() == 1 })
	// A bounded context: a call left in the queue fails the test instead
	// of hanging it.
	callCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for i := range queued {
		msg := message.NewMessage(fmt.Sprintf("queued-%d", i), nil)
		msg.SetContext(callCtx)
		go func() { errs <- pub.Publish("takeover", msg) }()
	}
	waitFor(t, 10*time.Second, "the other calls to queue behind it", func() bool {
		return pglease.PendingPublishes(pub) == queued
	})
	unlock()

	for range queued + 1 {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("a Publish call did not return")
		}
	}
	assert.Equal(t, queued+1, countRows(t, pool, adapter, "topic = 'takeover'"))
	assert.Equal(t, 1, countRows(t, pool, adapter, "topic = 'takeover' AND uuid = 'first'"))
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}

// TestGroupCommitAddsWorkersOnlyForOverflow: while one statement runs,
// calls queue for the next one; a second statement runs side by side only
// once more waits than one statement takes (1,000 messages).
func TestGroupCommitAddsWorkersOnlyForOverflow(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 8) // room for 4 workers
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pub.Publish("setup", message.NewMessage(watermill.NewUUID(), nil)))

	waiting, unlock := lockMessagesTable(t, adapter)

	callCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	errs := make(chan error, 16)
	publish := func(n int) {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
			msgs[i].SetContext(callCtx)
		}
		go func() { errs <- pub.Publish("overflow", msgs...) }()
	}
	calls := 0
	publish(1)
	calls++
	waitFor(t, 10*time.Second, "the first statement to wait on the lock", func() bool { return waiting() == 1 })
	// 10 calls of 60 messages: less than one statement takes.
	for range 10 {
		publish(60)
		calls++
	}
	waitFor(t, 10*time.Second, "the calls to queue", func() bool { return pglease.PendingPublishes(pub) == 10 })
	assert.Equal(t, 1, waiting(), "no second statement while one statement takes everything queued")
	// 500 more: 1,100 queued, a second worker takes a statement's worth.
	publish(500)
	calls++
	waitFor(t, 10*time.Second, "a second statement", func() bool { return waiting() == 2 })
	unlock()

	for range calls {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("a Publish call did not return")
		}
	}
	assert.Equal(t, 1+600+500, countRows(t, pool, adapter, "topic = 'overflow'"))
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}

// TestCoalescedCommitsAreFlushedOnRelease acks messages with commits
// coalesced (a long CommitInterval): the offset row does not move while the
// owner works, and ending the subscription writes the last acked position
// in the release. Not parallel: a transaction of another test running
// meanwhile can hold the messages back (not below the snapshot's xmin), and
// an owner that finds nothing more to read commits what it acked before it
// waits, which would move the row early.
func TestCoalescedCommitsAreFlushedOnRelease(t *testing.T) {
	for _, end := range []string{"cancel", "close"} {
		t.Run(end, func(t *testing.T) {
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			pub := newPublisher(t, pool, adapter)
			sub := newCoalescingSubscriber(t, pool, adapter)
			ids := publishN(t, pub, "t", 6)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, "t")
			require.NoError(t, err)
			got := receive(t, msgs, 5, 10*time.Second)
			assert.Equal(t, ids[:5], uuids(got))
			held := <-msgs // handed out, not acked: the owner is busy
			require.Equal(t, ids[5], held.UUID)
			assert.Equal(t, int64(0), readOffset(t, pool, adapter, "g", "t").Offset, "acks are not committed one by one")

			var fifth int64
			require.NoError(t, pool.QueryRow(context.Background(), "SELECT \"offset\" FROM "+
				table(adapter, pglease.DefaultMessagesTable)+" WHERE uuid = $1", ids[4]).Scan(&fifth))
			if end == "cancel" {
				cancel()
				waitFor(t, 5*time.Second, "the channel to close", func() bool {
					select {
					case _, open := <-msgs:
						return !open
					default:
						return false
					}
				})
			} else {
				require.NoError(t, sub.Close())
			}
			r := readOffset(t, pool, adapter, "g", "t")
			assert.Equal(t, fifth, r.Offset, "the release wrote the last acked position")
			assert.Nil(t, r.Session, "the release freed the claim")
		})
	}
}

// TestNotificationWakesSubscriber sets a PollInterval of a minute: a
// published message still arrives at once, woken by LISTEN/NOTIFY.
func TestNotificationWakesSubscriber(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{PollInterval: time.Minute})
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	assertNothingWithin(t, msgs, 300*time.Millisecond) // idle now
	for i := 0; i < 3; i++ {
		id := publishN(t, pub, "t", 1)
		start := time.Now()
		got := receive(t, msgs, 1, 10*time.Second)
		assert.Equal(t, id[0], got[0].UUID)
		t.Logf("publish to delivery: %s", time.Since(start))
	}
}

// TestDrainedConsumerWaitsWithoutReadingAgain publishes one message at a
// time: the consumer's read returns it alone, and once it is acked the
// consumer commits and waits for the next notification instead of reading
// again to find nothing. Not parallel: another test's transaction could
// hold a message back and cost re-reads.
func TestDrainedConsumerWaitsWithoutReadingAgain(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", PollInterval: time.Minute})
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	assertNothingWithin(t, msgs, 300*time.Millisecond) // idle now
	const n = 20
	before := pglease.Reads(sub)
	prev := readOffset(t, pool, adapter, "g", "t").Offset
	for range n {
		id := publishN(t, pub, "t", 1)
		got := receive(t, msgs, 1, 10*time.Second)
		require.Equal(t, id[0], got[0].UUID)
		// The commit before the wait: the row moves past the message.
		waitFor(t, 10*time.Second, "the ack committed", func() bool {
			o := readOffset(t, pool, adapter, "g", "t").Offset
			if o != prev {
				prev = o
				return true
			}
			return false
		})
	}
	reads := pglease.Reads(sub) - before
	assert.LessOrEqual(t, reads, uint64(n+2), "reads for %d messages published one at a time", n)
}

// TestMessageCommittedWhileOneIsHandedOutArrives: a message published while
// the consumer hands out the one its read returned, alone, comes with a
// notification that the consumer must not lose: once the first is acked
// it is delivered without waiting for the poll (a minute here).
func TestMessageCommittedWhileOneIsHandedOutArrives(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{PollInterval: time.Minute})
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	assertNothingWithin(t, msgs, 300*time.Millisecond) // idle now
	for range 3 {
		first := publishN(t, pub, "t", 1)
		var held *message.Message
		select {
		case held = <-msgs:
		case <-time.After(10 * time.Second):
			t.Fatal("the first message did not arrive")
		}
		require.Equal(t, first[0], held.UUID)
		second := publishN(t, pub, "t", 1) // committed, notified: the consumer is handing out
		held.Ack()
		got := receive(t, msgs, 1, 10*time.Second)
		require.Equal(t, second[0], got[0].UUID)
	}
}

// TestMissedNotificationIsCaughtByPoll inserts a message with plain SQL,
// which sends no notification: the idle poll finds it.
func TestMissedNotificationIsCaughtByPoll(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{PollInterval: 200 * time.Millisecond})
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	assertNothingWithin(t, msgs, 300*time.Millisecond)
	_, err = pool.Exec(context.Background(), "INSERT INTO "+table(adapter, pglease.DefaultMessagesTable)+
		" (topic, uuid, metadata) VALUES ('t', 'silent', '{}')")
	require.NoError(t, err)
	got := receive(t, msgs, 1, 10*time.Second)
	assert.Equal(t, "silent", got[0].UUID)
}

// TestRowsBehindAnOlderTransactionArriveSoon holds an outbox transaction
// open that published to the topic first, while a message commits after
// it: the message is not delivered past the open publisher's position until
// that transaction ends, and then the Subscriber's short re-poll delivers
// both, in order, without waiting for PollInterval.
func TestRowsBehindAnOlderTransactionArriveSoon(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{PollInterval: time.Minute})
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	publishN(t, pub, "t", 1)
	receive(t, msgs, 1, 10*time.Second)

	ctx := context.Background()
	older, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = older.Rollback(ctx) }()
	outbox, err := pglease.NewPublisher(older, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.Publish("t", message.NewMessage("older", nil))) // a position below the next message's

	id := publishN(t, pub, "t", 1)
	assertNothingWithin(t, msgs, 500*time.Millisecond)
	require.NoError(t, older.Commit(ctx))
	start := time.Now()
	got := receive(t, msgs, 2, 10*time.Second)
	assert.Equal(t, "older", got[0].UUID)
	assert.Equal(t, id[0], got[1].UUID)
	t.Logf("delivered %s after the older transaction ended (PollInterval is a minute)", time.Since(start))
}

// TestShortHoldsAreNotAStall: twenty messages, one at a time, each
// committed behind an older outbox transaction of the same topic that ends
// 80 ms later. Each hold is
// a new one: the consumer re-polls every few milliseconds for each and
// never counts one as a stall (rows held back for over pendingFastFor,
// re-polled every PollInterval, logged at Error), however long the claim
// has lasted. Each message arrives well before PollInterval.
func TestShortHoldsAreNotAStall(t *testing.T) {
	const (
		n            = 20
		hold         = 80 * time.Millisecond
		pollInterval = 5 * time.Second
	)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	logs := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true,
		ConsumerGroup: "g", PollInterval: pollInterval}, logs)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	publishN(t, pub, "t", 1)
	receive(t, msgs, 1, 10*time.Second)

	older, err := pgx.Connect(ctx, testkit.DSN)
	require.NoError(t, err)
	defer older.Close(ctx)
	latencies := make([]time.Duration, 0, n)
	for i := range n {
		tx, err := older.Begin(ctx)
		require.NoError(t, err)
		outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
		require.NoError(t, err)
		olderID := fmt.Sprintf("older-%d", i)
		require.NoError(t, outbox.Publish("t", message.NewMessage(olderID, nil))) // a position below the message's
		start := time.Now()
		id := publishN(t, pub, "t", 1)
		time.Sleep(hold) // the hold itself, not a wait for an outcome
		require.NoError(t, tx.Commit(ctx))
		first := receiveWithin(t, msgs, pollInterval*2/5, "message %d, held %s, within well under PollInterval", i, hold)
		require.Equal(t, olderID, first.UUID)
		first.Ack()
		got := receiveWithin(t, msgs, pollInterval*2/5, "message %d after the older one", i)
		latencies = append(latencies, time.Since(start))
		require.Equal(t, id[0], got.UUID)
		got.Ack()
	}
	slices.Sort(latencies)
	t.Logf("publish to delivery, each held %s: p50 %s, max %s (PollInterval %s)", hold,
		latencies[n/2].Round(time.Millisecond), latencies[n-1].Round(time.Millisecond), pollInterval)
	assert.Zero(t, pglease.Stalls(sub), "holds counted as a stall")
	_, logged := logs.Find(func(e logEntry) bool { return errors.Is(e.Err, pglease.ErrDeliveryHeldBack) })
	assert.False(t, logged, "a short hold logged as a stall")
}

// TestCloseReleasesTopicsInBatches: Close of a Subscriber that holds many
// topics writes their releases in pipelined batches (several topics per
// transaction), each with its last acked position, which coalescing had
// not committed yet. With poison, a trigger rejects the release of one
// topic: the batch holding it is written again release by release, so the
// error stays with that topic, whose claim is then freed by the deletion
// of the session.
func TestCloseReleasesTopicsInBatches(t *testing.T) {
	for _, poison := range []bool{false, true} {
		t.Run(fmt.Sprintf("poison=%v", poison), func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			pub := newPublisher(t, pool, adapter)
			sub := newCoalescingSubscriber(t, pool, adapter)

			const topics = 100
			const poisoned = "t050"
			acked := map[string]string{} // topic -> UUID of the acked message
			for i := range topics {
				topic := fmt.Sprintf("t%03d", i)
				ids := publishN(t, pub, topic, 2)
				msgs, err := sub.Subscribe(ctx, topic)
				require.NoError(t, err)
				receive(t, msgs, 1, 10*time.Second) // acked
				// The second message is handed out only once the first
				// one's ack was taken in; it stays unacked.
				select {
				case m := <-msgs:
					require.Equal(t, ids[1], m.UUID)
				case <-time.After(10 * time.Second):
					t.Fatalf("second message of %s not delivered", topic)
				}
				acked[topic] = ids[0]
			}
			offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
			if poison {
				_, err := pool.Exec(ctx, `CREATE FUNCTION `+pgx.Identifier{adapter.Schema, "refuse_release"}.Sanitize()+`() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'release refused'; END $$`)
				require.NoError(t, err)
				_, err = pool.Exec(ctx, `CREATE TRIGGER refuse_release BEFORE UPDATE ON `+offsets+`
FOR EACH ROW WHEN (NEW.topic = '`+poisoned+`' AND NEW.session_id IS NULL)
EXECUTE FUNCTION `+pgx.Identifier{adapter.Schema, "refuse_release"}.Sanitize()+`()`)
				require.NoError(t, err)
			}
			assert.Equal(t, 0, countOffsetRows(t, pool, offsets, "acked_offset > 0"), "nothing committed before Close")

			err := sub.Close()
			if poison {
				require.Error(t, err, "Close reports the release it could not write")
				assert.Contains(t, err.Error(), `release topic "`+poisoned+`"`)
				assert.Contains(t, err.Error(), "release refused")
			} else {
				require.NoError(t, err)
			}

			released := 0
			xmins := map[string]bool{}
			for topic, id := range acked {
				var free bool
				var ackedOffset, want int64
				var xmin string
				require.NoError(t, pool.QueryRow(ctx, `SELECT o.session_id IS NULL, o.acked_offset, o.xmin::text, m."offset"
FROM `+offsets+` o, `+table(adapter, pglease.DefaultMessagesTable)+` m
WHERE o.consumer_group = 'g' AND o.topic = $1 AND m.topic = $1 AND m.uuid = $2`, topic, id).Scan(&free, &ackedOffset, &xmin, &want))
				if poison && topic == poisoned {
					assert.False(t, free, "the refused release changed nothing")
					assert.Equal(t, int64(0), ackedOffset)
					continue
				}
				assert.True(t, free, "topic %s released", topic)
				assert.Equal(t, want, ackedOffset, "topic %s released with its last acked position", topic)
				released++
				xmins[xmin] = true
			}
			if poison {
				assert.Equal(t, topics-1, released)
				var sessions int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+
					table(adapter, pglease.DefaultConsumerSessionsTable)).Scan(&sessions))
				assert.Zero(t, sessions, "the session row is deleted, which frees the refused topic")
			} else {
				assert.Equal(t, topics, released)
				assert.Less(t, len(xmins), topics, "releases shared transactions")
			}
			assertNoLeakedGoroutines(t)
		})
	}
}

func countOffsetRows(t *testing.T, pool *pgxpool.Pool, offsets, where string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+offsets+" WHERE "+where).Scan(&n))
	return n
}

// newCoalescingSubscriber returns a Subscriber of group "g" whose acks are
// committed only when released (CommitInterval of an hour), closed at the
// end of the test.
func newCoalescingSubscriber(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) *pglease.Subscriber {
	t.Helper()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "g",
		SessionTTL:       10 * time.Second,
		CommitInterval:   time.Hour,
		CommitBatch:      1000,
		InitializeSchema: true,
		Tables:           adapter,
		// The tests hold a message while they end the subscription: it
		// goes to the next owner at once.
		DrainTimeout: -1,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// lockMessagesTable holds a lock on the messages table that makes every
// INSERT wait, until unlock is called (or the test ends). waiting counts the
// INSERTs of the Publisher waiting for it (by the registration their text
// writes: pg_stat_activity keeps only the first 1024 bytes of a statement,
// and the messages table comes after).
func lockMessagesTable(t *testing.T, adapter pglease.Tables) (waiting func() int, unlock func()) {
	t.Helper()
	ctx := context.Background()
	other := newPool(t, 2)
	lock, err := other.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lock.Rollback(ctx) })
	_, err = lock.Exec(ctx, "LOCK TABLE "+table(adapter, pglease.DefaultMessagesTable)+" IN SHARE MODE")
	require.NoError(t, err)
	waiting = func() int {
		var n int
		require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH %pglease.registered%'`).Scan(&n))
		return n
	}
	unlock = func() { require.NoError(t, lock.Commit(ctx)) }
	return waiting, unlock
}
