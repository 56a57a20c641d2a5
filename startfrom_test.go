package pglease_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// keyPerPartition returns, for each partition of a topic of n partitions, a
// key with prefix that maps to it.
func keyPerPartition(prefix string, n int) []string {
	keys := make([]string, n)
	found := 0
	for i := 0; found < n; i++ {
		key := fmt.Sprintf("%s%d", prefix, i)
		if p := pglease.PartitionOf(key, n); keys[p] == "" {
			keys[p] = key
			found++
		}
	}
	return keys
}

// TestStartFromLatestPartitionsAddedWhileDown: a StartFromLatest group that
// is down while its topic goes from 1 to 4 partitions and 40 keyed messages
// are published gets all 40 when it comes back, each key in order, none
// twice: the group already consumed the topic, so the rows of the new
// partitions start at their beginning, not at the horizon of the restart.
func TestStartFromLatestPartitionsAddedWhileDown(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	topicCfg := pglease.TopicConfig{Partitions: 1, Tables: adapter, InitializeSchema: true}
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", topicCfg))
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "t", 3) // before the group existed: never delivered
	subCfg := pglease.SubscriberConfig{ConsumerGroup: "g", StartFrom: pglease.StartFromLatest}
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	countRows := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+offsets+" WHERE consumer_group = 'g'").Scan(&n))
		return n
	}

	first := newTestSubscriber(t, pool, adapter, subCfg)
	msgs, err := first.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the group's row", func() bool { return countRows() == 1 })
	require.NoError(t, pub.Publish("t", keyedMessage("before", 0)))
	msg := receiveOne(t, msgs)
	key, _ := parseKeyed(t, msg)
	require.Equal(t, "before", key)
	msg.Ack()
	require.NoError(t, first.Close()) // the release commits the position

	topicCfg.Partitions = 4
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", topicCfg))
	const perKey = 5
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	covered := map[int]bool{}
	for seq := range perKey {
		for _, k := range keys {
			require.NoError(t, pub.Publish("t", keyedMessage(k, seq)))
			covered[pglease.PartitionOf(k, 4)] = true
		}
	}
	require.Len(t, covered, 4, "the keys of this test cover every partition")

	second := newTestSubscriber(t, pool, adapter, subCfg)
	msgs, err = second.Subscribe(ctx, "t")
	require.NoError(t, err)
	order := newKeyOrder(t)
	seen := func(msg *message.Message) {
		key, _ := parseKeyed(t, msg)
		require.NotEqual(t, "before", key, "a message acknowledged before the restart came again")
		order.see(msg, false)
	}
	for _, msg := range receive(t, msgs, len(keys)*perKey, 10*time.Second) {
		seen(msg)
	}
	// One more message per partition: each comes next on its partition, so
	// nothing was delivered twice (keyOrder refuses a repeated message).
	ends := keyPerPartition("end", 4)
	for _, k := range ends {
		require.NoError(t, pub.Publish("t", keyedMessage(k, 0)))
	}
	for _, msg := range receive(t, msgs, len(ends), 10*time.Second) {
		seen(msg)
	}
	for _, k := range keys {
		assert.Equal(t, perKey-1, order.last[k], "key %s", k)
	}
	require.NoError(t, second.Close())
	assertNoLeakedGoroutines(t)
}

// TestStartFromLatestNewGroupOnPartitionedTopic: a new StartFromLatest group
// on a topic that already has 4 partitions skips the history of every
// partition (its rows are created together, before any exists) and gets
// what is published afterwards.
func TestStartFromLatestNewGroupOnPartitionedTopic(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Partitions: 4,
		Tables: adapter, InitializeSchema: true}))
	pub := newPublisher(t, pool, adapter)
	for _, k := range keyPerPartition("old", 4) {
		require.NoError(t, pub.Publish("t", keyedMessage(k, 0)))
	}
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g",
		StartFrom: pglease.StartFromLatest})
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	waitFor(t, 10*time.Second, "the group's 4 rows", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+offsets).Scan(&n))
		return n == 4
	})
	var atBeginning int
	require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+offsets+
		" WHERE acked_transaction_id = '0'").Scan(&atBeginning))
	require.Zero(t, atBeginning, "rows of a new StartFromLatest group created at the beginning")
	fresh := keyPerPartition("new", 4)
	for _, k := range fresh {
		require.NoError(t, pub.Publish("t", keyedMessage(k, 0)))
	}
	got := map[string]bool{}
	for _, msg := range receive(t, msgs, len(fresh), 10*time.Second) {
		key, _ := parseKeyed(t, msg)
		got[key] = true
	}
	for _, k := range fresh {
		assert.True(t, got[k], "key %s", k)
	}
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

// TestPartitionRaiseWithoutNotification: a partition count raised by a
// statement that notifies nobody is still picked up, by the periodic
// re-read of the partition counts, while the listener receives
// notifications (so the fallback of a deaf listener does not explain it).
func TestPartitionRaiseWithoutNotification(t *testing.T) {
	defer pglease.SetPartitionRefresh(200 * time.Millisecond)()
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Partitions: 1,
		Tables: adapter, InitializeSchema: true}))
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the listener", func() bool { return pglease.Listening(sub) })
	require.NoError(t, pub.Publish("t", keyedMessage("first", 0)))
	receive(t, msgs, 1, 10*time.Second)

	_, err = pool.Exec(ctx, testQuery+"UPDATE "+table(adapter, pglease.DefaultTopicsTable)+
		" SET partitions = 4 WHERE topic = 't'")
	require.NoError(t, err)
	keys := keyPerPartition("k", 4)
	for _, k := range keys {
		require.NoError(t, pub.Publish("t", keyedMessage(k, 0)))
	}
	partitions := map[int32]bool{}
	for _, msg := range receive(t, msgs, len(keys), 10*time.Second) {
		p, _ := pglease.MessagePartitionFromCtx(msg.Context())
		partitions[p] = true
	}
	assert.Len(t, partitions, 4)
	assert.True(t, pglease.Listening(sub), "the listener received notifications throughout")
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

// TestDeletedOffsetRowsUnderStartFromLatest: under StartFromLatest, a row
// deleted while the group keeps another row of the topic is created again
// at the beginning of its partition (its messages come again, nothing is
// skipped); the rows of a group that has none left (all deleted by hand,
// or by Maintenance.RemoveIdleGroupsAfter) start after every message
// visible then, as a new group's would, every partition of the topic at
// once. Each recreation is logged at Info with where the rows start.
func TestDeletedOffsetRowsUnderStartFromLatest(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Partitions: 2,
		Tables: adapter, InitializeSchema: true}))
	pub := newPublisher(t, pool, adapter)
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	logger := newCapturingLogger()
	cfg := pglease.SubscriberConfig{ConsumerGroup: "g", StartFrom: pglease.StartFromLatest, CommitBatch: 1,
		Tables: adapter, PollInterval: 10 * time.Millisecond, SessionTTL: 2 * time.Second}
	if testkit.PoolDSN != testkit.DSN {
		cfg.ListenConnConfig = directConnConfig(t)
	}
	sub, err := pglease.NewSubscriber(pool, cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the group's rows", func() bool { return countOffsetRows(t, pool, offsets, "true") == 2 })
	keys := keyPerPartition("k", 2)
	publish := func(key string, seq int) {
		t.Helper()
		require.NoError(t, pub.Publish("t", keyedMessage(key, seq)))
	}
	payloads := func(n int) []string {
		t.Helper()
		var got []string
		for _, msg := range receive(t, msgs, n, 10*time.Second) {
			got = append(got, string(msg.Payload))
		}
		return got
	}
	recreated := func(start string, partitions []int32) logEntry {
		t.Helper()
		var e logEntry
		waitFor(t, 10*time.Second, "the recreation logged with start "+start, func() bool {
			var ok bool
			e, ok = logger.Find(func(e logEntry) bool {
				return e.Fields["start"] == start && strings.Contains(e.Msg, "created again")
			})
			return ok
		})
		assert.Equal(t, "info", e.Level)
		assert.Equal(t, "t", e.Fields["topic"])
		assert.Equal(t, partitions, e.Fields["partitions"])
		return e
	}
	publish(keys[0], 0)
	publish(keys[1], 0)
	assert.ElementsMatch(t, []string{keys[0] + "/0", keys[1] + "/0"}, payloads(2))
	waitFor(t, 10*time.Second, "both acks committed", func() bool {
		return countOffsetRows(t, pool, offsets, "acked_offset > 0") == 2
	})

	// Partition 1's row deleted: it comes back at the beginning, since the
	// group still has partition 0's. Either its owner hands out the next
	// message from memory first (its commit finds no row), or a claim
	// found the row missing before that read (the read is two statements
	// since schema version 14, the claim may come first): then the next
	// message comes only once, after k1/0.
	_, err = pool.Exec(ctx, testQuery+"DELETE FROM "+offsets+" WHERE partition = 1")
	require.NoError(t, err)
	publish(keys[1], 1)
	if first := payloads(2); first[0] == keys[1]+"/1" {
		assert.Equal(t, []string{keys[1] + "/1", keys[1] + "/0", keys[1] + "/1"}, append(first, payloads(1)...))
	} else {
		assert.Equal(t, []string{keys[1] + "/0", keys[1] + "/1"}, first)
	}
	recreated("earliest", []int32{1})

	// Every row deleted: both come back after every message visible then.
	_, err = pool.Exec(ctx, testQuery+"DELETE FROM "+offsets)
	require.NoError(t, err)
	publish(keys[0], 1)
	assert.Equal(t, []string{keys[0] + "/1"}, payloads(1), "handed out from memory")
	e := recreated("latest", []int32{0, 1})
	assert.NotZero(t, e.Fields["acked_transaction_id"])
	// Partition 1's owner has nothing to commit: it learns that its row
	// was gone at its next message.
	waitFor(t, 10*time.Second, "partition 0 claimed again", func() bool {
		return countOffsetRows(t, pool, offsets, "partition = 0 AND session_id IS NOT NULL") == 1
	})
	publish(keys[0], 2)
	// Only what was published after the rows came back, and k0/1 if the
	// rows came back (a claim that found them missing) before it was
	// published: the rows start after what was visible then.
	got := payloads(1)
	if got[0] == keys[0]+"/1" {
		got = append(got, payloads(1)...)
	}
	assert.Equal(t, keys[0]+"/2", got[len(got)-1], "only what was published after the rows came back: %v", got)
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}
