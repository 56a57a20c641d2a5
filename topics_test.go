package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// storedPartitions returns the partition of every stored message of topic,
// by UUID.
func storedPartitions(t *testing.T, db pglease.DB, adapter pglease.Tables, topic string) map[string]int {
	t.Helper()
	rows, err := db.Query(context.Background(),
		fmt.Sprintf(`SELECT uuid, partition FROM %q.%q WHERE topic = $1`, adapter.Schema, pglease.DefaultMessagesTable), topic)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var u string
		var p int
		require.NoError(t, rows.Scan(&u, &p))
		out[u] = p
	}
	require.NoError(t, rows.Err())
	return out
}

func TestCreateTopicSettings(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	cfg := func(n int) pglease.TopicConfig {
		return pglease.TopicConfig{Partitions: n, Tables: adapter, InitializeSchema: true}
	}

	for _, n := range []int{-1, pglease.MaxPartitions + 1} {
		err := pglease.CreateTopic(ctx, pool, "t", cfg(n))
		require.ErrorIs(t, err, pglease.ErrInvalidConfig, "partitions %d", n)
		require.ErrorContains(t, err, "between 1 and 1024")
	}
	require.ErrorIs(t, pglease.CreateTopic(ctx, pool, "", cfg(2)), pglease.ErrInvalidTopic)
	require.ErrorIs(t, pglease.CreateTopic(ctx, nil, "t", cfg(2)), pglease.ErrInvalidConfig)

	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", cfg(4)))
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", cfg(4)), "same settings again")
	err := pglease.CreateTopic(ctx, pool, "t", cfg(2))
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	require.ErrorContains(t, err, "it has 4 partitions")
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", cfg(8)), "raising is allowed")
	require.ErrorContains(t, pglease.CreateTopic(ctx, pool, "t", cfg(0)), "it has 8 partitions")

	// Inside a transaction: the settings roll back with it.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, pglease.CreateTopic(ctx, tx, "rolled-back", cfg(3)))
	require.NoError(t, tx.Rollback(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.%q WHERE topic = 'rolled-back'`,
		adapter.Schema, pglease.DefaultTopicsTable)).Scan(&n))
	require.Equal(t, 0, n)
}

func TestPublishPlacesMessagesByKey(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "keyed", pglease.TopicConfig{Partitions: 8,
		Tables: adapter, InitializeSchema: true}))

	keyOf := func(_ string, msg *message.Message) (string, error) {
		if k := msg.Metadata.Get("customer"); k != "" {
			return k, nil
		}
		return "", errors.New("message has no customer")
	}
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, PartitionKey: keyOf}, nil)
	require.NoError(t, err)
	defer pub.Close()

	want := map[string]int{}
	for i := range 64 {
		msg := message.NewMessage(fmt.Sprintf("m%d", i), nil)
		key := fmt.Sprintf("customer-%d", i%16)
		msg.Metadata.Set("customer", key)
		want[msg.UUID] = pglease.PartitionOf(key, 8)
		require.NoError(t, pub.Publish("keyed", msg))
	}
	require.Equal(t, want, storedPartitions(t, pool, adapter, "keyed"))
	used := map[int]bool{}
	for _, p := range want {
		used[p] = true
	}
	require.Greater(t, len(used), 4, "16 keys spread over most of 8 partitions")

	// A key function that fails: the call fails, nothing of it is stored.
	bad := message.NewMessage("bad", nil)
	ok := message.NewMessage("ok", nil)
	ok.Metadata.Set("customer", "x")
	err = pub.Publish("keyed", ok, bad)
	require.ErrorContains(t, err, "message has no customer")
	require.Len(t, storedPartitions(t, pool, adapter, "keyed"), 64)

	// The hash is pinned: changing it would move every key.
	// FNV-1a 32 of "customer-1" is 307212823 (computed apart from Go).
	require.Equal(t, 307212823%8, pglease.PartitionOf("customer-1", 8))
	require.Equal(t, 0, pglease.PartitionOf("anything", 1))
}

func TestPublishDefaultPartitionKey(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "spread", pglease.TopicConfig{Partitions: 4,
		Tables: adapter, InitializeSchema: true}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()

	keyed := map[string]int{}
	var msgs []*message.Message
	for i := range 40 {
		msg := message.NewMessage(fmt.Sprintf("k%d", i), nil)
		if i%2 == 0 {
			msg.Metadata.Set(pglease.PartitionKeyMetadata, "one-key")
			keyed[msg.UUID] = pglease.PartitionOf("one-key", 4)
		}
		msgs = append(msgs, msg)
	}
	require.NoError(t, pub.Publish("spread", msgs...))
	// A never-created topic has one partition, whatever the key.
	require.NoError(t, pub.Publish("plain", msgs...))

	stored := storedPartitions(t, pool, adapter, "spread")
	unkeyed := map[int]bool{}
	for u, p := range stored {
		if want, ok := keyed[u]; ok {
			require.Equal(t, want, p, "message %s with the metadata key", u)
		} else {
			require.Equal(t, pglease.PartitionOf(u, 4), p, "message %s without key: placed by its UUID", u)
			unkeyed[p] = true
		}
	}
	require.Greater(t, len(unkeyed), 1, "messages without a key spread")

	// A call in which no message has a key: placed by the server's hash of
	// the UUID, spread too.
	var plain []*message.Message
	for i := range 40 {
		plain = append(plain, message.NewMessage(fmt.Sprintf("nokey%d", i), nil))
	}
	require.NoError(t, pub.Publish("spread", plain...))
	used := map[int]bool{}
	for u, p := range storedPartitions(t, pool, adapter, "spread") {
		if strings.HasPrefix(u, "nokey") {
			used[p] = true
		}
	}
	require.Greater(t, len(used), 1, "a call without keys spreads over the partitions")
	for u, p := range storedPartitions(t, pool, adapter, "plain") {
		require.Zero(t, p, "message %s of a topic never created", u)
	}
}

// TestInsertStatementWithManyTopics: the statement that group commit runs
// for calls to several topics places each message by its own topic's
// partition count, and notifies each (topic, partition) once.
func TestInsertStatementWithManyTopics(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "eight", pglease.TopicConfig{Partitions: 8,
		Tables: adapter, InitializeSchema: true}))
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{tablesOf(adapter).NotifyChannel}.Sanitize())
	require.NoError(t, err)

	p := pgsql.InsertMessagesParams{NotifyChannel: tablesOf(adapter).NotifyChannel}
	want := map[string]int{}
	for i := range 12 {
		topic := []string{"eight", "plain"}[i%2]
		key := fmt.Sprintf("key%d", i)
		id := fmt.Sprintf("%s-%d", topic, i)
		p.Topics = append(p.Topics, topic)
		p.UUIDs = append(p.UUIDs, id)
		p.Payloads = append(p.Payloads, nil)
		p.Metadata = append(p.Metadata, "")
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		p.PartitionHashes = append(p.PartitionHashes, h.Sum32())
		if topic == "eight" {
			want[id] = pglease.PartitionOf(key, 8)
		} else {
			want[id] = 0
		}
	}
	q := tablesOf(adapter).InsertMessages(p)
	_, err = pool.Exec(ctx, q.SQL, q.Args...)
	require.NoError(t, err)
	got := storedPartitions(t, pool, adapter, "eight")
	for id, part := range storedPartitions(t, pool, adapter, "plain") {
		got[id] = part
	}
	require.Equal(t, want, got)

	notified := map[string]bool{}
	for {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			break // no more: all were delivered at once at the commit
		}
		require.False(t, notified[n.Payload], "notified twice: %s", n.Payload)
		notified[n.Payload] = true
	}
	wantNotified := map[string]bool{"mplain": true}
	for id, part := range want {
		if strings.HasPrefix(id, "eight") {
			if part == 0 {
				wantNotified["meight"] = true
			} else {
				wantNotified[fmt.Sprintf("n%d:eight", part)] = true
			}
		}
	}
	require.Equal(t, wantNotified, notified)
}
