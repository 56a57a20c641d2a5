package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// TestUndecodableMetadataIsSkippedAndLoggedOnce: a row whose metadata is
// not a JSON object of strings (inserted by hand) does not stall its
// partition: the messages after it are delivered, the row is skipped with
// one Error log naming its position, the group's offset moves past it, and
// the Inspector shows the row with its metadata raw (a replay refuses it).
func TestUndecodableMetadataIsSkippedAndLoggedOnce(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ctx := context.Background()
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	_, err := pool.Exec(ctx, "INSERT INTO "+table(adapter, pglease.DefaultMessagesTable)+
		` (topic, uuid, payload, metadata) VALUES ('t', 'bad', 'x', '{"n": 1, "nested": {"a": "b"}}')`)
	require.NoError(t, err)
	var good []string
	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), []byte("good"))
		good = append(good, msg.UUID)
		require.NoError(t, pub.Publish("t", msg))
	}
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	found, err := insp.FindMessages(ctx, admin.FindMessagesParams{Topic: "t", UUID: "bad"})
	require.NoError(t, err)
	require.Len(t, found, 1)
	bad := found[0]
	assert.Equal(t, `{"n": 1, "nested": {"a": "b"}}`, bad.RawMetadata)
	assert.Empty(t, bad.Metadata)

	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		PollInterval: 10 * time.Millisecond, SessionTTL: 2 * time.Second, CommitBatch: 1}, logger)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receive(t, msgs, 3, 10*time.Second)
	assert.Equal(t, good, uuids(got))
	waitFor(t, 10*time.Second, "the group's offset past every message", func() bool {
		lag, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"g"}})
		return err == nil && len(lag) == 1 && lag[0].Lag == 0
	})
	require.NoError(t, sub.Close())

	var skipped []logEntry
	for _, e := range logger.Entries() {
		if e.Msg == "Cannot decode message, skipped" {
			skipped = append(skipped, e)
		}
	}
	require.Len(t, skipped, 1, "logged once")
	assert.ErrorIs(t, skipped[0].Err, pglease.ErrUndecodableMetadata)
	assert.Equal(t, "bad", skipped[0].Fields["uuid"])
	assert.Equal(t, "t", skipped[0].Fields["topic"])
	assert.Equal(t, fmt.Sprintf("%d:%d", bad.Position.TransactionID, bad.Position.Offset), skipped[0].Fields["position"])

	page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "t"})
	require.NoError(t, err, "one undecodable row does not fail the page")
	require.Len(t, page.Messages, 4)
	assert.Equal(t, "bad", page.Messages[3].UUID)
	assert.Equal(t, bad.RawMetadata, page.Messages[3].RawMetadata)
	_, err = insp.Replay(ctx, admin.ReplayParams{From: "t", To: "elsewhere"})
	assert.ErrorIs(t, err, pglease.ErrUndecodableMetadata)
}
