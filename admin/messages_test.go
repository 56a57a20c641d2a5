package admin_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// TestPoisonedTopicKeyIsWatermills: replay reads the key that Watermill's
// PoisonQueue writes.
func TestPoisonedTopicKeyIsWatermills(t *testing.T) {
	assert.Equal(t, middleware.PoisonedTopicKey, admin.PoisonedTopicKey)
}

// TestInspectorMessagesPagesNewestFirst: pages of a partitioned topic come
// newest first by position, across partitions or of one, without gaps or
// repeats, and a page's Next starts the next one; payloads are cut at
// PreviewBytes; a UUID is found whole.
func TestInspectorMessagesPagesNewestFirst(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "orders", pglease.TopicConfig{Partitions: 3, Tables: adapter,
		InitializeSchema: true}))
	pub := testkit.NewPublisher(t, pool, adapter)
	const n = 25
	for i := range n {
		msg := message.NewMessage(fmt.Sprintf("m%02d", i), []byte(fmt.Sprintf("payload number %02d", i)))
		msg.Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("k%d", i))
		msg.Metadata.Set("i", fmt.Sprint(i))
		require.NoError(t, pub.Publish("orders", msg)) // one transaction each: positions in publish order
	}
	testkit.PublishN(t, pub, "other", 3)
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)

	var seen []string
	var from *pglease.Position
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "too many pages")
		page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "orders", From: from, Limit: 7, PreviewBytes: 7})
		require.NoError(t, err)
		for _, m := range page.Messages {
			seen = append(seen, m.UUID)
			assert.Equal(t, "orders", m.Topic)
			assert.Equal(t, []byte("payload"), m.Payload)
			assert.True(t, m.PayloadTruncated)
			assert.Equal(t, len("payload number 00"), m.PayloadSize)
			assert.Equal(t, m.UUID[1:], fmt.Sprintf("%02s", m.Metadata["i"]))
			assert.Equal(t, int32(pglease.PartitionOf("k"+m.Metadata["i"], 3)), m.Partition)
		}
		if page.Next == nil {
			assert.Len(t, page.Messages, n%7)
			break
		}
		assert.Len(t, page.Messages, 7)
		from = page.Next
	}
	require.Len(t, seen, n)
	for i, id := range seen {
		assert.Equal(t, fmt.Sprintf("m%02d", n-1-i), id, "newest first")
	}

	// One partition: only its messages, newest first.
	p := int32(pglease.PartitionOf("k3", 3))
	page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "orders", Partition: &p, Limit: admin.MaxMessagesLimit})
	require.NoError(t, err)
	require.NotEmpty(t, page.Messages)
	assert.Nil(t, page.Next)
	for k, m := range page.Messages {
		assert.Equal(t, p, m.Partition)
		assert.False(t, m.PayloadTruncated)
		if k > 0 {
			prev := page.Messages[k-1].Position
			assert.True(t, prev.TransactionID > m.Position.TransactionID ||
				(prev.TransactionID == m.Position.TransactionID && prev.Offset > m.Position.Offset))
		}
	}

	found, err := insp.MessagesByUUID(ctx, "orders", "m03")
	require.NoError(t, err)
	require.Len(t, found, 1)
	assert.Equal(t, "payload number 03", string(found[0].Payload))
	assert.Equal(t, "3", found[0].Metadata["i"])
	found, err = insp.MessagesByUUID(ctx, "", "m03")
	require.NoError(t, err)
	assert.Len(t, found, 1)
	found, err = insp.MessagesByUUID(ctx, "other", "m03")
	require.NoError(t, err)
	assert.Empty(t, found)

	detail, err := insp.TopicDetail(ctx, "orders")
	require.NoError(t, err)
	assert.Equal(t, 3, detail.Partitions)
	assert.Equal(t, int64(n), detail.Messages)
	assert.False(t, detail.MessagesEstimated)
	assert.Zero(t, detail.KeyWindow)
	assert.Equal(t, pglease.KeyWindow, detail.EffectiveKeyWindow, "no retention, no KeyWindow: a day")
	assert.Zero(t, detail.PendingKeyWindow)

	counts, err := insp.TopicMessages(ctx, admin.TopicMessagesParams{ExactUpTo: 10})
	require.NoError(t, err)
	assert.Equal(t, []admin.TopicMessageCount{
		{Topic: "orders", Messages: 25, Estimated: true}, // over the exact bound: at least the bound
		{Topic: "other", Messages: 3},
	}, clampEstimates(counts, 25))
	counts, err = insp.TopicMessages(ctx, admin.TopicMessagesParams{Topics: []string{"other", "never"}})
	require.NoError(t, err)
	assert.Equal(t, []admin.TopicMessageCount{{Topic: "never"}, {Topic: "other", Messages: 3}}, counts)

	_, err = insp.Messages(ctx, admin.MessagesParams{Topic: "orders", Limit: admin.MaxMessagesLimit + 1})
	assert.ErrorIs(t, err, pglease.ErrInvalidConfig)
	_, err = insp.Messages(ctx, admin.MessagesParams{})
	assert.ErrorIs(t, err, pglease.ErrInvalidTopic)
}

// clampEstimates replaces an estimated count (the planner's, which depends
// on statistics) by want when it is at least the exact bound.
func clampEstimates(counts []admin.TopicMessageCount, want int64) []admin.TopicMessageCount {
	for i := range counts {
		if counts[i].Estimated && counts[i].Messages >= 10 {
			counts[i].Messages = want
		}
	}
	return counts
}

// poison publishes messages to the poison topic as Watermill's PoisonQueue
// does: with the original topic in their metadata.
func poison(t *testing.T, pub *pglease.Publisher, original string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		msg := message.NewMessage(id, []byte("body of "+id))
		msg.Metadata.Set(middleware.PoisonedTopicKey, original)
		msg.Metadata.Set(middleware.ReasonForPoisonedKey, "handler failed")
		msg.Metadata.Set("tenant", "acme")
		require.NoError(t, pub.Publish("poison", msg))
	}
}

// TestReplayToOriginalOnce: a replay moves the poisoned messages to the
// topic each names, in order, with their metadata, and a Subscriber of
// that topic receives them; run again it moves nothing; a dry run changes
// nothing.
func TestReplayToOriginalOnce(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	pub := testkit.NewPublisher(t, pool, adapter)
	poison(t, pub, "orders", "p1", "p2")
	poison(t, pub, "payments", "p3")
	msg := message.NewMessage("no-origin", nil) // no metadata at all
	require.NoError(t, pub.Publish("poison", msg))
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)

	dry, err := insp.Replay(ctx, admin.ReplayParams{From: "poison", ToOriginal: true, DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry, 3)
	page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "poison"})
	require.NoError(t, err)
	assert.Len(t, page.Messages, 4, "a dry run changes nothing")

	done, err := insp.Replay(ctx, admin.ReplayParams{From: "poison", ToOriginal: true})
	require.NoError(t, err)
	var got []string
	for _, r := range done {
		got = append(got, r.UUID+"->"+r.To)
	}
	assert.Equal(t, []string{"p1->orders", "p2->orders", "p3->payments"}, got)
	again, err := insp.Replay(ctx, admin.ReplayParams{From: "poison", ToOriginal: true})
	require.NoError(t, err)
	assert.Empty(t, again, "a second replay moves nothing")

	page, err = insp.Messages(ctx, admin.MessagesParams{Topic: "poison"})
	require.NoError(t, err)
	require.Len(t, page.Messages, 1, "the message without an original topic stays")
	assert.Equal(t, "no-origin", page.Messages[0].UUID)

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter}, testkit.Logger())
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	for _, want := range []string{"p1", "p2"} {
		m := testkit.ReceiveOne(t, msgs)
		assert.Equal(t, want, m.UUID)
		assert.Equal(t, "body of "+want, string(m.Payload))
		assert.Equal(t, "orders", m.Metadata.Get(middleware.PoisonedTopicKey))
		assert.Equal(t, "acme", m.Metadata.Get("tenant"))
		m.Ack()
	}
	page, err = insp.Messages(ctx, admin.MessagesParams{Topic: "orders"})
	require.NoError(t, err)
	assert.Len(t, page.Messages, 2, "published once")
}

// TestReplayDeadLettersToTheirTopic: a message that a failure policy moved
// to its dead-letter topic after its last attempt is replayed, with
// ToOriginal, to the topic it came from (its DeadLetterSourceTopicMetadata)
// and delivered there again, from its first attempt.
func TestReplayDeadLettersToTheirTopic(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	pub := testkit.NewPublisher(t, pool, adapter)
	require.NoError(t, pub.Publish("orders", message.NewMessage("o1", []byte("body"))))
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter, CommitBatch: 1,
		Retry: pglease.RetryConfig{MaxAttempts: 1, DeadLetterTopic: "orders.dead"}}, testkit.Logger())
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	m := testkit.ReceiveOne(t, msgs)
	require.Equal(t, "o1", m.UUID)
	m.Nack() // the last attempt: moved to orders.dead
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	pgtest.WaitFor(t, 10*time.Second, "the dead letter", func() bool {
		page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "orders.dead"})
		require.NoError(t, err)
		return len(page.Messages) == 1
	})

	done, err := insp.Replay(ctx, admin.ReplayParams{From: "orders.dead", ToOriginal: true})
	require.NoError(t, err)
	require.Len(t, done, 1)
	assert.Equal(t, "orders", done[0].To)
	again := testkit.ReceiveOne(t, msgs)
	assert.Equal(t, "o1", again.UUID)
	assert.Equal(t, "body", string(again.Payload))
	assert.Equal(t, "orders", again.Metadata.Get(pglease.DeadLetterSourceTopicMetadata), "the move's metadata comes along")
	again.Ack()
}

// TestReplayFilterAndTo: --to sends every selected message to one topic;
// the metadata filter and the limit select them; bad parameters are
// refused.
func TestReplayFilterAndTo(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	pub := testkit.NewPublisher(t, pool, adapter)
	poison(t, pub, "orders", "a1", "a2", "a3")
	other := message.NewMessage("b1", nil)
	other.Metadata.Set("tenant", "globex")
	require.NoError(t, pub.Publish("poison", other))
	require.NoError(t, pub.Publish("poison", message.NewMessage("no-metadata", nil)))
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)

	done, err := insp.Replay(ctx, admin.ReplayParams{From: "poison", To: "retry", Metadata: map[string]string{"tenant": "acme"}, Limit: 2})
	require.NoError(t, err)
	require.Len(t, done, 2)
	assert.Equal(t, "a1", done[0].UUID)
	assert.Equal(t, "a2", done[1].UUID)
	done, err = insp.Replay(ctx, admin.ReplayParams{From: "poison", To: "retry", Metadata: map[string]string{"tenant": "globex"}})
	require.NoError(t, err)
	require.Len(t, done, 1)
	assert.Equal(t, "b1", done[0].UUID)
	done, err = insp.Replay(ctx, admin.ReplayParams{From: "poison", To: "retry"})
	require.NoError(t, err)
	require.Len(t, done, 2, "without a filter: every message, metadata or not")
	assert.Equal(t, "a3", done[0].UUID)
	assert.Equal(t, "no-metadata", done[1].UUID)
	page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "retry"})
	require.NoError(t, err)
	assert.Len(t, page.Messages, 5)

	for _, p := range []admin.ReplayParams{
		{From: "poison"},
		{From: "poison", To: "x", ToOriginal: true},
		{From: "poison", To: "poison"},
		{From: "poison", To: "x", Limit: -1},
	} {
		_, err := insp.Replay(ctx, p)
		assert.ErrorIs(t, err, pglease.ErrInvalidConfig, "%+v", p)
	}
}

// TestReplayConcurrentTakesEachMessageOnce: two replays that run at the
// same moment (the second starts while the first holds its row locks)
// publish each message once between them.
func TestReplayConcurrentTakesEachMessageOnce(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	pub := testkit.NewPublisher(t, pool, adapter)
	poison(t, pub, "orders", "c1", "c2", "c3")

	// The first replay runs in a transaction left open, holding the
	// locks of the rows it deleted.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	first, err := admin.NewInspector(tx, adapter)
	require.NoError(t, err)
	done1, err := first.Replay(ctx, admin.ReplayParams{From: "poison", ToOriginal: true})
	require.NoError(t, err)
	require.Len(t, done1, 3)

	second, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		done2 []admin.ReplayedMessage
		err2  error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		done2, err2 = second.Replay(ctx, admin.ReplayParams{From: "poison", ToOriginal: true})
	}()
	// Wait until the second one waits on the first one's locks.
	pgtest.WaitFor(t, 10*time.Second, "the second replay to wait for a lock", func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting))
		return waiting > 0
	})
	require.NoError(t, tx.Commit(ctx))
	wg.Wait()
	require.NoError(t, err2)
	assert.Empty(t, done2)
	page, err := second.Messages(ctx, admin.MessagesParams{Topic: "orders"})
	require.NoError(t, err)
	assert.Len(t, page.Messages, 3)
}

// TestDeleteGroupOffsets: refused while a live Subscriber owns a row of
// the group; once it is closed, the group's rows are deleted and other
// groups keep theirs.
func TestDeleteGroupOffsets(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	pub := testkit.NewPublisher(t, pool, adapter)
	testkit.PublishN(t, pub, "t", 1)
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	subscribe := func(group string) *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter}, testkit.Logger())
		require.NoError(t, err)
		msgs, err := sub.Subscribe(ctx, "t")
		require.NoError(t, err)
		testkit.ReceiveOne(t, msgs).Ack()
		return sub
	}
	subA := subscribe("a")
	subB := subscribe("b")
	defer subB.Close()

	_, err = insp.DeleteGroupOffsets(ctx, "a")
	var inUse *admin.GroupInUseError
	require.True(t, errors.As(err, &inUse), "%v", err)
	assert.ErrorIs(t, err, admin.ErrOwnedByLiveSession)
	assert.Len(t, inUse.Owned, 1)

	require.NoError(t, subA.Close())
	n, err := insp.DeleteGroupOffsets(ctx, "a")
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	lag, err := insp.Lag(ctx, admin.LagFilter{})
	require.NoError(t, err)
	require.Len(t, lag, 1)
	assert.Equal(t, "b", lag[0].ConsumerGroup)
}

// TestDeleteGroupOffsetsRowsCreatedMeanwhile: a row of the group created
// (free) after DeleteGroupOffsets locked the group's rows is not deleted
// by that attempt; the next attempt locks and deletes it with the others.
// When every attempt finds a new row, the delete is refused as the group
// is in use, naming the last one, and deletes nothing.
func TestDeleteGroupOffsetsRowsCreatedMeanwhile(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 5)
	adapter := testkit.NewSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	offsets := testkit.TablesOf(adapter).Offsets
	create := func(t *testing.T, topic string) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, partition, acked_transaction_id, acked_offset)
VALUES ('g', $1, 0, '0', 0)`, topic)
		require.NoError(t, err)
	}
	rowsOfG := func(t *testing.T) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+offsets+` WHERE consumer_group = 'g'`).Scan(&n))
		return n
	}

	for _, tc := range []struct {
		name    string
		creates int // by the first attempts, one row each
	}{
		{"once", 1},
		{"every attempt", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			create(t, "before")
			calls := 0
			admin.SetBeforeDeleteGroupHook(insp, func() {
				if calls++; calls <= tc.creates {
					create(t, fmt.Sprintf("meanwhile%d", calls))
				}
			})
			n, err := insp.DeleteGroupOffsets(ctx, "g")
			if tc.creates < 3 {
				require.NoError(t, err)
				assert.Equal(t, int64(1+tc.creates), n)
				assert.Equal(t, 0, rowsOfG(t))
				return
			}
			var inUse *admin.GroupInUseError
			require.True(t, errors.As(err, &inUse), "deleted %d rows, error %v", n, err)
			assert.ErrorIs(t, err, admin.ErrOwnedByLiveSession)
			assert.Empty(t, inUse.Owned)
			assert.Equal(t, []string{"meanwhile3/0"}, inUse.Created)
			assert.Equal(t, 4, rowsOfG(t))
			_, err = pool.Exec(ctx, `DELETE FROM `+offsets+` WHERE consumer_group = 'g'`)
			require.NoError(t, err)
		})
	}
}

// TestDeleteGroupOffsetsKeepsRowClaimedMeanwhile: after DeleteGroupOffsets
// has checked the owners of group g (one idle row) and before it deletes,
// a Subscriber of g creates and claims the row of another topic and
// acknowledges five messages there. The delete is refused as the group is
// in use, and deletes nothing: the claimed row keeps its owner, epoch and
// position, and the Subscriber goes on from there: a sixth message is the
// next delivered, its acknowledgement is committed under the same claim,
// and none of the five is delivered again.
func TestDeleteGroupOffsetsKeepsRowClaimedMeanwhile(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 10)
	adapter := testkit.NewSchema(t, pool)
	pub := testkit.NewPublisher(t, pool, adapter)
	testkit.PublishN(t, pub, "idle", 1)
	ids := testkit.PublishN(t, pub, "new", 5)
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	lagOf := func(topic string) []admin.LagInfo {
		t.Helper()
		rows, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"g"}, Topics: []string{topic}})
		require.NoError(t, err)
		return rows
	}

	idle := testkit.NewSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
	msgs, err := idle.Subscribe(ctx, "idle")
	require.NoError(t, err)
	testkit.Receive(t, msgs, 1, 30*time.Second)
	require.NoError(t, idle.Close())
	require.Len(t, lagOf("idle"), 1)

	sub := testkit.NewSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
	var (
		newMsgs <-chan *message.Message
		claimed admin.LagInfo
		hooked  bool
	)
	admin.SetBeforeDeleteGroupHook(insp, func() {
		if hooked {
			return
		}
		hooked = true
		var err error
		newMsgs, err = sub.Subscribe(ctx, "new")
		require.NoError(t, err)
		assert.Equal(t, ids, testkit.UUIDs(testkit.Receive(t, newMsgs, len(ids), 30*time.Second)))
		pgtest.WaitFor(t, 10*time.Second, "the acknowledgements to be committed", func() bool {
			rows := lagOf("new")
			if len(rows) != 1 || rows[0].Lag != 0 || rows[0].OwnerSession == uuid.Nil {
				return false
			}
			claimed = rows[0]
			return true
		})
	})

	n, err := insp.DeleteGroupOffsets(ctx, "g")
	require.True(t, hooked)
	var inUse *admin.GroupInUseError
	if assert.True(t, errors.As(err, &inUse), "deleted %d rows, error %v", n, err) {
		assert.Equal(t, []string{"new/0 by " + claimed.Owner}, inUse.Owned)
	}
	assert.Len(t, lagOf("idle"), 1, "the idle row is deleted though the delete was refused")
	if rows := lagOf("new"); assert.Len(t, rows, 1, "the claimed row is deleted") {
		assert.Equal(t, claimed.OwnerSession, rows[0].OwnerSession)
		assert.Equal(t, claimed.Epoch, rows[0].Epoch)
		assert.Equal(t, claimed.Position, rows[0].Position)
	}

	sixth := testkit.PublishN(t, pub, "new", 1)[0]
	next := testkit.ReceiveOne(t, newMsgs)
	require.Equal(t, sixth, next.UUID, "delivered again")
	next.Ack()
	deadline := time.After(10 * time.Second)
	for {
		if rows := lagOf("new"); len(rows) == 1 && rows[0].Position != claimed.Position {
			assert.Equal(t, int64(0), rows[0].Lag)
			assert.Equal(t, claimed.Epoch, rows[0].Epoch, "claimed again")
			break
		}
		select {
		case m := <-newMsgs:
			t.Fatalf("message %s delivered again", m.UUID)
		case <-deadline:
			t.Fatal("the sixth message's acknowledgement is not committed after 10s")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
