package pglease_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

func TestSubscriberConfigErrorsNameTheField(t *testing.T) {
	parallel(t)
	pool := newPool(t, 2)
	cases := map[string]pglease.SubscriberConfig{
		"SubscriberConfig.SessionTTL":                    {SessionTTL: 500 * time.Millisecond},
		"SubscriberConfig.PollInterval":                  {PollInterval: -time.Second},
		"SubscriberConfig.NackResendDelay":               {NackResendDelay: -time.Second},
		"SubscriberConfig.BatchSize":                     {BatchSize: -1},
		"SubscriberConfig.MaxInFlight":                   {MaxInFlight: -1},
		"SubscriberConfig.ConsumerGroup":                 {ConsumerGroup: "a\x00"},
		"SubscriberConfig.Tables: pglease.Tables.Schema": {Tables: pglease.Tables{Schema: string(make([]byte, 64))}},
		"SubscriberConfig.SchemaAdapter: pglease.Tables.Schema": {
			SchemaAdapter: pglease.Tables{Schema: string(make([]byte, 64))}},
	}
	for field, cfg := range cases {
		_, err := pglease.NewSubscriber(pool, cfg, nil)
		require.ErrorIs(t, err, pglease.ErrInvalidConfig, field)
		assert.Contains(t, err.Error(), field)
	}
	_, err := pglease.NewSubscriber(nil, pglease.SubscriberConfig{}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
}

func TestSubscriberLifecycle(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true}, nil)
	require.NoError(t, err)

	require.ErrorIs(t, sub.SubscribeInitialize(""), pglease.ErrInvalidTopic)
	_, err = sub.Subscribe(context.Background(), "")
	require.ErrorIs(t, err, pglease.ErrInvalidTopic)
	require.NoError(t, sub.SubscribeInitialize("t"))

	a, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	b, err := sub.Subscribe(context.Background(), "u")
	require.NoError(t, err)

	var sessions int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table(adapter, pglease.DefaultConsumerSessionsTable)).Scan(&sessions))
	assert.Equal(t, 1, sessions, "one session row per Subscriber, whatever the number of topics")

	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close(), "Close is idempotent")
	for _, ch := range []<-chan *message.Message{a, b} {
		_, open := <-ch
		assert.False(t, open, "channel closed by Close")
	}
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table(adapter, pglease.DefaultConsumerSessionsTable)).Scan(&sessions))
	assert.Equal(t, 0, sessions, "Close deletes the session row")
	_, err = sub.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, pglease.ErrSubscriberClosed)
	require.ErrorIs(t, sub.SubscribeInitialize("t"), pglease.ErrSubscriberClosed)
	assertNoLeakedGoroutines(t)
}

func TestOneAtATimeAndNackRedelivers(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{NackResendDelay: 50 * time.Millisecond})
	ids := publishN(t, pub, "t", 3)

	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	first := <-msgs
	require.Equal(t, ids[0], first.UUID)
	assertNothingWithin(t, msgs, 200*time.Millisecond) // not before Ack or Nack

	first.Nack()
	select {
	case <-first.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("message context not cancelled after Nack")
	}
	again := <-msgs
	require.Equal(t, ids[0], again.UUID, "Nack redelivers the same message first")
	require.NotSame(t, first, again, "a redelivery is a new message")
	again.Ack()
	select {
	case <-again.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("message context not cancelled after Ack")
	}
	rest := receive(t, msgs, 2, 10*time.Second)
	assert.Equal(t, ids[1:], uuids(rest))
}

// TestCancelledSubscriptionHandsOverAtOnce cancels the owner's Subscribe
// context while another Subscriber of the group waits: the waiting one
// continues after the last acked message, long before the session TTL.
func TestCancelledSubscriptionHandsOverAtOnce(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	cfg := pglease.SubscriberConfig{ConsumerGroup: "g", SessionTTL: 30 * time.Second}
	owner := newTestSubscriber(t, pool, adapter, cfg)
	standby := newTestSubscriber(t, pool, adapter, cfg)
	ids := publishN(t, pub, "t", 10)

	ctx, cancel := context.WithCancel(context.Background())
	ownerMsgs, err := owner.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receive(t, ownerMsgs, 4, 10*time.Second)
	assert.Equal(t, ids[:4], uuids(got))
	unacked := <-ownerMsgs // delivered, never acked: goes to the next owner

	standbyMsgs, err := standby.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	assertNothingWithin(t, standbyMsgs, 200*time.Millisecond)

	cancel()
	select {
	case <-unacked.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("message context not cancelled when the subscription ended")
	}
	waitFor(t, 5*time.Second, "owner channel to close", func() bool {
		select {
		case _, open := <-ownerMsgs:
			return !open
		default:
			return false
		}
	})
	start := time.Now()
	rest := receive(t, standbyMsgs, 6, 5*time.Second)
	t.Logf("handover after cancel: %s", time.Since(start))
	assert.Equal(t, ids[4:], uuids(rest))
}

// TestLostSessionIsReplaced deletes the Subscriber's session row behind its
// back: it notices on the next heartbeat, opens a new session, claims its
// topic again and delivers everything.
func TestLostSessionIsReplaced(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", SessionTTL: time.Second})
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	ids := publishN(t, pub, "t", 3)
	receive(t, msgs, 3, 10*time.Second)
	before := readOffset(t, pool, adapter, "g", "t")
	require.NotNil(t, before.Session)

	_, err = pool.Exec(context.Background(), "DELETE FROM "+table(adapter, pglease.DefaultConsumerSessionsTable))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "a new session to claim the topic", func() bool {
		r := readOffset(t, pool, adapter, "g", "t")
		return r.Session != nil && *r.Session != *before.Session
	})
	after := readOffset(t, pool, adapter, "g", "t")
	assert.Greater(t, after.Epoch, before.Epoch, "a new claim bumps the epoch")
	more := publishN(t, pub, "t", 3)
	got := receive(t, msgs, 3, 10*time.Second)
	assert.Equal(t, more, uuids(got), "delivery goes on after the last acked message: %v", ids)
}

// TestFencedCommitStopsDelivery lets another session take the claim while a
// message is being handled: the owner's commit is rejected, it delivers
// nothing more, and the offset stays where the new owner put it.
//
// The protocol itself only lets a claim go once the owner's session has
// expired, and the owner stops delivering before that (self-fencing); this
// test forces the take-over while the owner's session lives, so it commits
// every Ack (CommitBatch 1) to check the fence before each delivery.
func TestFencedCommitStopsDelivery(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", SessionTTL: 30 * time.Second, CommitBatch: 1})
	publishN(t, pub, "t", 5)
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	receive(t, msgs, 1, 10*time.Second)
	inFlight := <-msgs
	before := readOffset(t, pool, adapter, "g", "t")

	// Another live session takes over (as after an expiry it would).
	thief := uuid.New()
	ctx := context.Background()
	_, err = pool.Exec(ctx, "INSERT INTO "+table(adapter, pglease.DefaultConsumerSessionsTable)+
		" (id, consumer_group, owner, expires_at) VALUES ($1, 'g', 'test', now() + interval '1 hour')", thief)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+table(adapter, pglease.DefaultConsumerOffsetsTable)+
		" SET session_id = $1, epoch = epoch + 1 WHERE consumer_group = 'g' AND topic = 't'", thief)
	require.NoError(t, err)

	inFlight.Ack()
	assertNothingWithin(t, msgs, 500*time.Millisecond)
	r := readOffset(t, pool, adapter, "g", "t")
	assert.Equal(t, before.Offset, r.Offset, "the fenced commit did not move the offset")
	assert.Equal(t, thief, *r.Session)

	// When the other session releases, the Subscriber claims again and
	// redelivers the message whose commit was rejected.
	_, err = pool.Exec(ctx, "UPDATE "+table(adapter, pglease.DefaultConsumerOffsetsTable)+
		" SET session_id = NULL WHERE consumer_group = 'g' AND topic = 't'")
	require.NoError(t, err)
	got := receive(t, msgs, 1, 10*time.Second)
	assert.Equal(t, inFlight.UUID, got[0].UUID)
}

func TestExpiredSessionsAreCleanedUp(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	// The tables first: with a SessionTTL of 1 s, a schema set-up slower
	// than that (a loaded machine) goes on in the background after
	// Subscribe returns, and the insert below would find no table.
	createTables(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{SessionTTL: time.Second,
		Maintenance: pglease.MaintenanceConfig{Interval: 200 * time.Millisecond}})
	_, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	dead := uuid.New()
	_, err = pool.Exec(context.Background(), "INSERT INTO "+table(adapter, pglease.DefaultConsumerSessionsTable)+
		" (id, consumer_group, owner, expires_at) VALUES ($1, 'g', 'crashed', now() - interval '1 hour')", dead)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the expired session row to be deleted", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
			table(adapter, pglease.DefaultConsumerSessionsTable)+" WHERE id = $1", dead).Scan(&n))
		return n == 0
	})
}

// TestDeliveryOrderIsNumeric stores messages whose transaction ids have
// different numbers of digits (as on a young cluster, where xids are short):
// they are delivered in numeric (transaction_id, offset) order, not in the
// order of their text.
func TestDeliveryOrderIsNumeric(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, newPublisher(t, pool, adapter).Publish("setup", message.NewMessage(watermill.NewUUID(), nil)))
	// The positions below must lie behind the server's transaction counter
	// (a position ahead of it is refused): a fresh cluster starts below 1000.
	for i := 0; ; i++ {
		var xid int64
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT pg_current_xact_id()::text::bigint").Scan(&xid))
		if xid > 1000 {
			break
		}
		require.Less(t, i, 2000, "the transaction counter does not move")
	}
	// Inserted in this order, so offsets grow along it; the transaction ids
	// say the delivery order is 9, 10, 100, 100 (by offset), 1000.
	rows := []struct {
		uuid string
		txID int
	}{{"tx-1000", 1000}, {"tx-100-a", 100}, {"tx-9", 9}, {"tx-100-b", 100}, {"tx-10", 10}}
	for _, r := range rows {
		execKeepingPositions(t, pool, "INSERT INTO "+table(adapter, pglease.DefaultMessagesTable)+
			" (topic, uuid, transaction_id, metadata) VALUES ('ordered', $1, $2::text::xid8, '{}')", r.uuid, fmt.Sprint(r.txID))
	}
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{BatchSize: 2})
	msgs, err := sub.Subscribe(context.Background(), "ordered")
	require.NoError(t, err)
	got := receive(t, msgs, len(rows), 10*time.Second)
	assert.Equal(t, []string{"tx-9", "tx-10", "tx-100-a", "tx-100-b", "tx-1000"}, uuids(got))
}

// TestSubscriptionEndWaitsForMessagesOut: when a subscription ends while a
// message is out, the Subscriber waits (DrainTimeout) for its Ack, the
// message's context still open, and the release writes it: the next owner
// does not deliver it again. A message still out when DrainTimeout passes
// goes to the next owner, and how many is logged.
func TestSubscriptionEndWaitsForMessagesOut(t *testing.T) {
	for _, maxInFlight := range []int{1, 4} {
		t.Run(fmt.Sprintf("MaxInFlight %d", maxInFlight), func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			pub := newPublisher(t, pool, adapter)
			ids := publishN(t, pub, "t", 2)
			logger := newCapturingLogger()
			// Acks are committed only by the release.
			cfg := pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter, InitializeSchema: true,
				MaxInFlight: maxInFlight, CommitInterval: time.Hour, CommitBatch: 1000, DrainTimeout: time.Minute}
			a, err := pglease.NewSubscriber(pool, cfg, logger)
			require.NoError(t, err)
			actx, cancel := context.WithCancel(ctx)
			msgs, err := a.Subscribe(actx, "t")
			require.NoError(t, err)
			m := receiveOne(t, msgs)
			require.Equal(t, ids[0], m.UUID)
			cancel()
			require.NoError(t, m.Context().Err(), "the context of the message out ended with the subscription")
			m.Ack()
			waitFor(t, 30*time.Second, "the channel to close", func() bool {
				select {
				case _, open := <-msgs:
					return !open
				default:
					return false
				}
			})
			pos, ok := pglease.MessagePositionFromCtx(m.Context())
			require.True(t, ok)
			require.Equal(t, pos, ackedOffset(t, pool, adapter, "g", "t"), "the release wrote the Ack given after the end")
			require.NoError(t, a.Close())

			// The bound: the next message is held past DrainTimeout.
			cfg.DrainTimeout = 50 * time.Millisecond
			b, err := pglease.NewSubscriber(pool, cfg, logger)
			require.NoError(t, err)
			msgs, err = b.Subscribe(ctx, "t")
			require.NoError(t, err)
			held := receiveOne(t, msgs)
			require.Equal(t, ids[1], held.UUID, "the message acked after the end is not delivered again")
			require.NoError(t, b.Close())
			require.Error(t, held.Context().Err(), "the context of the message still out ended with the release")
			e, ok := logger.Find(func(e logEntry) bool { return strings.HasPrefix(e.Msg, "Stopped waiting for messages handed out") })
			require.True(t, ok, "the end of the wait was not logged")
			require.Equal(t, 1, e.Fields["messages"])

			c := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
			msgs, err = c.Subscribe(ctx, "t")
			require.NoError(t, err)
			require.Equal(t, ids[1], receiveOne(t, msgs).UUID, "the message held past DrainTimeout goes to the next owner")
		})
	}
}

// TestSubscriptionEndDuringCommitWaitsForMessagesOut: a subscription with
// MaxInFlight above 1 that ends while a commit is under way (the commit is
// cut off) still waits (DrainTimeout) for the other messages out, and the
// release writes their Acks: the next owner delivers none of them again.
// The commit is held by a lock on the offsets row from a second
// connection until the subscription has ended.
func TestSubscriptionEndDuringCommitWaitsForMessagesOut(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	const maxInFlight = 4
	var ids []string
	for i := range maxInFlight + 1 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("k%d", i))
		require.NoError(t, pub.Publish("t", msg))
		ids = append(ids, msg.UUID)
	}
	// Each Ack at the head of the window is committed at once.
	cfg := pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter, InitializeSchema: true,
		MaxInFlight: maxInFlight, CommitInterval: time.Hour, CommitBatch: 1, DrainTimeout: time.Minute}
	a, err := pglease.NewSubscriber(pool, cfg, testLogger())
	require.NoError(t, err)
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := a.Subscribe(actx, "t")
	require.NoError(t, err)
	out := make([]*message.Message, maxInFlight)
	for i := range out {
		out[i] = receiveOne(t, msgs)
		require.Equal(t, ids[i], out[i].UUID)
	}

	lock := dedicatedConn(t, pool)
	tx, err := lock.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var pid uint32
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+table(adapter, pglease.DefaultConsumerOffsetsTable)+
		" WHERE consumer_group = 'g' AND topic = 't' FOR UPDATE")
	require.NoError(t, err)
	out[0].Ack() // the head: its commit waits for the lock
	waitFor(t, 10*time.Second, "the commit to wait for the row lock", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%hinted%' AND pid <> $1`, pid).Scan(&n))
		return n > 0
	})
	cancel() // cuts the commit off
	for _, m := range out[1:] {
		require.NoError(t, m.Context().Err(), "the context of a message out ended with the subscription")
		m.Ack()
	}
	require.NoError(t, tx.Rollback(ctx))
	waitFor(t, 30*time.Second, "the channel to close", func() bool {
		select {
		case _, open := <-msgs:
			return !open
		default:
			return false
		}
	})
	require.NoError(t, a.Close())
	last, ok := pglease.MessagePositionFromCtx(out[maxInFlight-1].Context())
	require.True(t, ok)
	require.Equal(t, last, ackedOffset(t, pool, adapter, "g", "t"), "the release wrote the Acks given after the end")

	b := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
	msgs, err = b.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, ids[maxInFlight], receiveOne(t, msgs).UUID, "a message acked after the end delivered again")
}
