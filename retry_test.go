package pglease_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// handout is one delivery a test received.
type handout struct {
	uuid, payload, attempt string
	at                     time.Time
	pos                    pglease.Position
}

// consumeRetrying receives from msgs until done reports true (checked after
// every message and every 10 ms), nacking the messages whose payload
// poison reports (with NackWithReason and reason) and acking the others;
// it returns what it received.
func consumeRetrying(t *testing.T, msgs <-chan *message.Message, poison func(payload string) bool, reason error,
	done func([]handout) bool) []handout {
	t.Helper()
	var got []handout
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !done(got) {
		select {
		case msg := <-msgs:
			pos, _ := pglease.MessagePositionFromCtx(msg.Context())
			got = append(got, handout{uuid: msg.UUID, payload: string(msg.Payload),
				attempt: msg.Metadata.Get(pglease.DeliveryAttemptMetadata), at: time.Now(), pos: pos})
			if poison(string(msg.Payload)) {
				pglease.NackWithReason(msg, reason)
			} else {
				msg.Ack()
			}
		case <-tick.C:
		case <-deadline:
			t.Fatalf("not done within 60s; received %d messages, the first: %+v", len(got), got[:min(len(got), 10)])
		}
	}
	return got
}

// indexOf is the index of the i-th (from 0) delivery of payload in got,
// or -1.
func indexOf(got []handout, payload string, i int) int {
	for j, h := range got {
		if h.payload == payload {
			if i == 0 {
				return j
			}
			i--
		}
	}
	return -1
}

// countOf is how many times payload was delivered in got.
func countOf(got []handout, payload string) int {
	n := 0
	for _, h := range got {
		if h.payload == payload {
			n++
		}
	}
	return n
}

// topicCount is the number of messages of topic in the messages table.
func topicCount(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, topic string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
		table(tables, pglease.DefaultMessagesTable)+` WHERE topic = $1`, topic).Scan(&n))
	return n
}

// receiveDeadLetter subscribes a group of its own to topic and returns its
// one message.
func receiveDeadLetter(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, topic string) *message.Message {
	t.Helper()
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{ConsumerGroup: "dead-letter-reader"})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	msg := receiveOne(t, msgs)
	msg.Ack()
	return msg
}

// publishPayloads publishes one message per payload, with key as its
// PartitionKeyMetadata, and returns their UUIDs.
func publishPayloads(t *testing.T, pub *pglease.Publisher, topic string, keyed map[string]string, payloads ...string) []string {
	t.Helper()
	var ids []string
	for _, p := range payloads {
		msg := message.NewMessage(p+"-"+randomHex(4), []byte(p))
		if k, ok := keyed[p]; ok {
			msg.Metadata.Set(pglease.PartitionKeyMetadata, k)
		}
		require.NoError(t, pub.Publish(topic, msg))
		ids = append(ids, msg.UUID)
	}
	return ids
}

// TestRetryHoldsOnlyItsKey: under a failure policy, with the default
// MaxInFlight (1), a message that always fails is handed out MaxAttempts
// times with the backoff between its attempts, and meanwhile the other
// key of the partition goes on while the later message of its own key
// waits behind it; after its last attempt it lands in the dead-letter
// topic once, with the metadata that says where it comes from and why it
// failed, and the group's position moves past it.
func TestRetryHoldsOnlyItsKey(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	pub := newPublisher(t, pool, tables)
	keys := map[string]string{"p1": "p", "p2": "p", "q1": "q", "q2": "q", "q3": "q"}
	ids := publishPayloads(t, pub, "in", keys, "p1", "q1", "p2", "q2", "q3")
	retry := pglease.RetryConfig{MaxAttempts: 3, MinBackoff: 200 * time.Millisecond, MaxBackoff: 300 * time.Millisecond,
		DeadLetterTopic: "in.dead"}
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	got := consumeRetrying(t, msgs, func(p string) bool { return p == "p1" }, errors.New("boom"),
		func(got []handout) bool { return indexOf(got, "p2", 0) >= 0 })

	require.Equal(t, 3, countOf(got, "p1"), "p1 handed out MaxAttempts times: %+v", got)
	var first []time.Time
	for i := 0; i < 3; i++ {
		h := got[indexOf(got, "p1", i)]
		require.Equal(t, strconv.Itoa(i+1), h.attempt, "attempt of p1's delivery %d", i+1)
		first = append(first, h.at)
	}
	// The backoff (±10% jitter): 200 ms after the first failure, 300 ms
	// (the maximum) after the second.
	require.GreaterOrEqual(t, first[1].Sub(first[0]), 180*time.Millisecond, "second attempt too early")
	require.GreaterOrEqual(t, first[2].Sub(first[1]), 270*time.Millisecond, "third attempt too early")
	for _, q := range []string{"q1", "q2", "q3"} {
		require.Less(t, indexOf(got, q, 0), indexOf(got, "p1", 1), "%s waited for p1's retry: %+v", q, got)
		require.Equal(t, 1, countOf(got, q))
	}
	require.Greater(t, indexOf(got, "p2", 0), indexOf(got, "p1", 2), "p2 went out before p1's last attempt: %+v", got)
	require.Equal(t, 1, countOf(got, "p2"))

	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, ids[0], dead.UUID)
	require.Equal(t, "p1", string(dead.Payload))
	p1 := got[indexOf(got, "p1", 0)].pos
	md := dead.Metadata
	require.Equal(t, "in", md.Get(pglease.DeadLetterSourceTopicMetadata))
	require.Equal(t, "0", md.Get(pglease.DeadLetterSourcePartitionMetadata))
	require.Equal(t, strconv.FormatUint(p1.TransactionID, 10)+":"+strconv.FormatInt(p1.Offset, 10),
		md.Get(pglease.DeadLetterSourcePositionMetadata))
	require.Equal(t, "", md.Get(pglease.DeadLetterGroupMetadata))
	require.Equal(t, "3", md.Get(pglease.DeadLetterAttemptsMetadata))
	require.Equal(t, "boom", md.Get(pglease.DeadLetterReasonMetadata))
	require.Equal(t, "p", md.Get(pglease.PartitionKeyMetadata))
	firstFailure, err := time.Parse(time.RFC3339Nano, md.Get(pglease.DeadLetterFirstFailureMetadata))
	require.NoError(t, err)
	lastFailure, err := time.Parse(time.RFC3339Nano, md.Get(pglease.DeadLetterLastFailureMetadata))
	require.NoError(t, err)
	require.GreaterOrEqual(t, lastFailure.Sub(firstFailure), 450*time.Millisecond,
		"first and last failure %s apart, want at least the two waits", lastFailure.Sub(firstFailure))
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"))

	st := sub.Stats()
	require.Equal(t, uint64(2), st.Retried)
	require.Equal(t, uint64(1), st.DeadLettered)
	last := got[indexOf(got, "p2", 0)].pos
	if q3 := got[indexOf(got, "q3", 0)].pos; last.TransactionID < q3.TransactionID ||
		last.TransactionID == q3.TransactionID && last.Offset < q3.Offset {
		last = q3
	}
	waitFor(t, 10*time.Second, "the group's position past every message", func() bool {
		return ackedOffset(t, pool, tables, "", "in") == last
	})
}

// waitingEntry reads the group's waiting entry of the message at pos: the
// attempts counted and the next attempt's time (milliseconds on the
// server's clock); ok is false when there is none.
func waitingEntry(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, group, topic string, pos pglease.Position) (attempts int, next int64, ok bool) {
	t.Helper()
	var a, n *int64
	key := strconv.FormatUint(pos.TransactionID, 10) + ":" + strconv.FormatInt(pos.Offset, 10)
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT (waiting -> $3 ->> 'a')::int8, (waiting -> $3 ->> 'n')::int8
FROM `+table(tables, pglease.DefaultConsumerOffsetsTable)+` WHERE consumer_group = $1 AND topic = $2`, group, topic, key).Scan(&a, &n))
	if a == nil {
		return 0, 0, false
	}
	if n == nil {
		return int(*a), 0, true
	}
	return int(*a), *n, true
}

// serverMillis is the server's clock in milliseconds since the epoch.
func serverMillis(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var ms int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8`).Scan(&ms))
	return ms
}

// TestRetryScheduleMovesWithTheRow: a failure is written into the group's
// row with its next attempt on the server's clock before the message
// waits; a Subscriber that takes the row over resumes the schedule (the
// next attempt not before that time, numbered after the attempts counted)
// and the message is handed out MaxAttempts times in all, across the two.
func TestRetryScheduleMovesWithTheRow(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	pub := newPublisher(t, pool, tables)
	publishPayloads(t, pub, "in", nil, "p1")
	retry := pglease.RetryConfig{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: time.Second, Jitter: -1,
		DeadLetterTopic: "in.dead"}
	sub1, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: tables, InitializeSchema: true,
		PollInterval: 10 * time.Millisecond, Retry: retry}, testLogger())
	require.NoError(t, err)
	msgs, err := sub1.Subscribe(ctx, "in")
	require.NoError(t, err)
	msg := receiveOne(t, msgs)
	require.Equal(t, "1", msg.Metadata.Get(pglease.DeliveryAttemptMetadata))
	pos, _ := pglease.MessagePositionFromCtx(msg.Context())
	msg.Nack()
	var next int64
	waitFor(t, 10*time.Second, "the failure written into the row", func() bool {
		a, n, ok := waitingEntry(t, pool, tables, "", "in", pos)
		next = n
		return ok && a == 1 && n > 0
	})
	// The operator sees it (pglease lag), on the database's clock.
	insp, err := admin.NewInspector(pool, tables)
	require.NoError(t, err)
	lag, err := insp.Lag(ctx, admin.LagFilter{Topics: []string{"in"}})
	require.NoError(t, err)
	require.Len(t, lag, 1)
	require.Equal(t, 1, lag[0].Waiting)
	require.Equal(t, 1, lag[0].Attempts)
	require.NotNil(t, lag[0].NextAttempt)
	require.Equal(t, next, lag[0].NextAttempt.UnixMilli())
	require.NotNil(t, lag[0].WaitingSince)
	require.NoError(t, sub1.Close())

	sub2 := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry})
	msgs, err = sub2.Subscribe(ctx, "in")
	require.NoError(t, err)
	msg = receiveOne(t, msgs)
	now := serverMillis(t, pool)
	require.Equal(t, "2", msg.Metadata.Get(pglease.DeliveryAttemptMetadata), "the attempt after the one counted")
	require.GreaterOrEqual(t, now, next, "handed out %d ms before its next attempt's time", next-now)
	if a, _, _ := waitingEntry(t, pool, tables, "", "in", pos); a != 2 {
		t.Fatalf("attempts counted when attempt 2 went out: %d, want 2", a)
	}
	msg.Nack()
	msg = receiveOne(t, msgs)
	require.Equal(t, "3", msg.Metadata.Get(pglease.DeliveryAttemptMetadata))
	msg.Nack()
	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, "3", dead.Metadata.Get(pglease.DeadLetterAttemptsMetadata))
	select {
	case msg := <-msgs:
		t.Fatalf("handed out again after its last attempt: %s attempt %s", msg.UUID, msg.Metadata.Get(pglease.DeliveryAttemptMetadata))
	default:
	}
	_, _, ok := waitingEntry(t, pool, tables, "", "in", pos)
	require.False(t, ok, "the entry stays after the move")
	lag, err = insp.Lag(ctx, admin.LagFilter{Topics: []string{"in"}})
	require.NoError(t, err)
	require.Equal(t, 0, lag[0].Waiting, "waiting after the move")
}

// TestDeadLetterMoveFencedByATakeover: the row is taken over (its owner
// and epoch moved by a second connection that held its lock) between the
// owner's decision to move a message to the dead-letter topic and the
// move: the move waits for the lock, finds the epoch moved and writes
// nothing, so no copy lands; the owner claims the row again (the session
// that took it over does not exist) and moves the message then, from the
// attempts counted in the row, without handing it out again: one copy in
// all, MaxAttempts hand-outs.
func TestDeadLetterMoveFencedByATakeover(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	pub := newPublisher(t, pool, tables)
	publishPayloads(t, pub, "in", nil, "p1")
	retry := pglease.RetryConfig{MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, DeadLetterTopic: "in.dead"}
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	msg := receiveOne(t, msgs)
	msg.Nack()
	msg = receiveOne(t, msgs)
	require.Equal(t, "2", msg.Metadata.Get(pglease.DeliveryAttemptMetadata))

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	offsets := table(tables, pglease.DefaultConsumerOffsetsTable)
	_, err = holder.Exec(ctx, `SELECT 1 FROM `+offsets+` WHERE consumer_group = '' AND topic = 'in' FOR UPDATE`)
	require.NoError(t, err)
	msg.Nack() // the last attempt failed: the move waits for the row
	waitFor(t, 10*time.Second, "the move waiting for the row's lock", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%acked_above = pg_catalog.array_append%'`).Scan(&n))
		return n == 1
	})
	_, err = holder.Exec(ctx, `UPDATE `+offsets+` SET session_id = gen_random_uuid(), epoch = epoch + 1
WHERE consumer_group = '' AND topic = 'in'`)
	require.NoError(t, err)
	require.NoError(t, holder.Commit(ctx))

	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, "2", dead.Metadata.Get(pglease.DeadLetterAttemptsMetadata))
	waitFor(t, 10*time.Second, "the fenced move counted", func() bool { return sub.Stats().FencedWrites >= 1 })
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"), "copies in the dead-letter topic")
	select {
	case msg := <-msgs:
		t.Fatalf("handed out again after its last attempt: attempt %s", msg.Metadata.Get(pglease.DeliveryAttemptMetadata))
	default:
	}
}

// TestRetryConfigValidation: a policy that cannot work is refused with the
// field named.
func TestRetryConfigValidation(t *testing.T) {
	pool := newPool(t, 2)
	for _, tc := range []struct {
		retry pglease.RetryConfig
		want  string
	}{
		{pglease.RetryConfig{MaxAttempts: -1}, "Retry.MaxAttempts must not be negative"},
		{pglease.RetryConfig{MaxAttempts: 3}, "Retry.DeadLetterTopic must be set"},
		{pglease.RetryConfig{DeadLetterTopic: "d"}, "Retry.MaxAttempts must be set"},
		{pglease.RetryConfig{MinBackoff: -time.Second}, "Retry.MinBackoff must not be negative"},
		{pglease.RetryConfig{MinBackoff: time.Minute, MaxBackoff: time.Second}, "Retry.MaxBackoff must be at least MinBackoff"},
		{pglease.RetryConfig{Jitter: 2}, "Retry.Jitter must be at most 1"},
		{pglease.RetryConfig{MaxAttempts: 1, DeadLetterTopic: string([]byte{0})}, "Retry.DeadLetterTopic"},
	} {
		_, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Retry: tc.retry}, nil)
		require.ErrorContains(t, err, tc.want, "%+v", tc.retry)
	}
}

// TestRetryWithTxHandler: under a failure policy, a handler whose
// transaction fails counts an attempt, and after the last one the message
// moves to the dead-letter topic with no effect of it committed; a message
// whose transaction committed its effects with AckInTx although its
// handler nacked it (an outcome the handler took for a failure) is
// delivered again, its AckInTx reports it acknowledged, and after its last
// attempt it is not moved: the effects and the move never both happen.
func TestRetryWithTxHandler(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	pub := newPublisher(t, pool, tables)
	ids := publishPayloads(t, pub, "in", nil, "fails", "committed", "fine")
	createEffects(t, pool, tables)
	retry := pglease.RetryConfig{MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, DeadLetterTopic: "in.dead"}
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	txh := pglease.TxHandler(pool, pglease.TxHandlerConfig{Publisher: pglease.PublisherConfig{Tables: tables}},
		func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if err := insertEffect(ctx, tx, tables.Schema, msg.UUID, "h"); err != nil {
				return nil, err
			}
			if string(msg.Payload) == "fails" {
				return nil, errors.New("the transaction fails")
			}
			return nil, nil
		})
	ackErrs := map[string][]error{}
	for done := false; !done; {
		msg := receiveOne(t, msgs)
		switch string(msg.Payload) {
		case "committed":
			// Its effects and acknowledgement commit; the handler nacks
			// all the same.
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			err = insertEffect(ctx, tx, tables.Schema, msg.UUID, "h")
			if err == nil {
				err = pglease.AckInTx(ctx, tx, msg)
			}
			ackErrs[msg.UUID] = append(ackErrs[msg.UUID], err)
			if err == nil {
				require.NoError(t, tx.Commit(ctx))
			} else {
				require.NoError(t, tx.Rollback(ctx))
			}
			pglease.NackWithReason(msg, errors.New("the outcome looked failed"))
		default:
			if err := txh(msg); err != nil {
				pglease.NackWithReason(msg, err)
			} else {
				msg.Ack()
			}
			done = string(msg.Payload) == "fine"
		}
	}
	require.Len(t, ackErrs[ids[1]], 2, "the committed message handed out MaxAttempts times")
	require.NoError(t, ackErrs[ids[1]][0])
	require.ErrorIs(t, ackErrs[ids[1]][1], pglease.ErrAlreadyAcknowledged)

	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, ids[0], dead.UUID, "the message whose transaction failed")
	require.Equal(t, "the transaction fails", dead.Metadata.Get(pglease.DeadLetterReasonMetadata))
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"), "the committed message moved too")
	require.Equal(t, map[string][]string{ids[1]: {"h"}, ids[2]: {"h"}}, effectsOf(t, pool, tables))
	require.Equal(t, uint64(1), sub.Stats().DeadLettered)
}

// TestCitusRetry: the failure policy on Citus, the tables distributed: a
// message that always fails is handed out MaxAttempts times while the
// other key goes on, and lands once in its dead-letter topic (a topic of
// its own shard: the move's transaction spans two shards, on whichever
// workers they lie).
func TestCitusRetry(t *testing.T) {
	pool, tables := citusSchema(t, 10)
	ctx := context.Background()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables}, nil)
	require.NoError(t, err)
	defer pub.Close()
	keys := map[string]string{"p1": "p", "q1": "q", "p2": "p"}
	ids := publishPayloads(t, pub, "in", keys, "p1", "q1", "p2")
	retry := pglease.RetryConfig{MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, DeadLetterTopic: "in.dead"}
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	got := consumeRetrying(t, msgs, func(p string) bool { return p == "p1" }, errors.New("boom"),
		func(got []handout) bool { return indexOf(got, "p2", 0) >= 0 })
	require.Equal(t, 2, countOf(got, "p1"))
	require.Less(t, indexOf(got, "q1", 0), indexOf(got, "p1", 1), "q1 waited for p1's retry")
	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, ids[0], dead.UUID)
	require.Equal(t, "2", dead.Metadata.Get(pglease.DeadLetterAttemptsMetadata))
	require.Equal(t, "boom", dead.Metadata.Get(pglease.DeadLetterReasonMetadata))
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"))
}
