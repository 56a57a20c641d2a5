package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/watermill-pglease/admin"
)

// TestMessagesPages: pglease messages pages a topic newest first, the
// text output ends with the next page's --from-position, a binary payload
// is shown in hex, and --uuid shows one message whole.
func TestMessagesPages(t *testing.T) {
	f := newFixture(t)
	for i := range 3 {
		msg := message.NewMessage(fmt.Sprintf("m%d", i), []byte(fmt.Sprintf(`{"n": %d}`, i)))
		msg.Metadata.Set("k", fmt.Sprint(i))
		require.NoError(t, f.pub.Publish("t", msg))
	}
	require.NoError(t, f.pub.Publish("t", message.NewMessage("bin", []byte{0, 1, 0xfe})))

	var page messagesOutput
	require.NoError(t, json.Unmarshal([]byte(f.ok("messages", "--topic", "t", "--limit", "2", "--json")), &page))
	assert.Equal(t, int64(4), page.Topic.Messages)
	assert.Equal(t, 1, page.Topic.Partitions)
	require.Len(t, page.Messages, 2)
	assert.Equal(t, "bin", page.Messages[0].UUID)
	assert.Equal(t, "m2", page.Messages[1].UUID)
	require.NotNil(t, page.Next)
	from := formatPosition(*page.Next)

	out := f.ok("messages", "--topic", "t", "--limit", "2")
	assert.Contains(t, out, "hex:0001fe")
	assert.Contains(t, out, `{"n": 2}`)
	assert.Contains(t, out, "k=2")
	assert.Contains(t, out, "Older messages: --from-position "+from)

	var older admin.MessagePage
	require.NoError(t, json.Unmarshal([]byte(f.ok("messages", "--topic", "t", "--limit", "2", "--from-position", from, "--json")), &older))
	require.Len(t, older.Messages, 2)
	assert.Equal(t, "m1", older.Messages[0].UUID)
	assert.Equal(t, "m0", older.Messages[1].UUID)
	assert.Nil(t, older.Next)

	out = f.ok("messages", "--topic", "t", "--uuid", "m1")
	assert.Contains(t, out, `{"n": 1}`)
	assert.Regexp(t, `metadata k\s+1`, out)

	for _, args := range [][]string{
		{"--limit", "1"},
		{"--topic", "t", "--from-position", "12"},
		{"--topic", "t", "--limit", "0"},
		{"--topic", "t", "--partition", "-2"},
	} {
		r := f.cli("messages", args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r)
	}
}

// TestReplayCommand: a dry run lists and moves nothing; the replay moves
// the poisoned messages to their original topic once; run again it moves
// nothing.
func TestReplayCommand(t *testing.T) {
	f := newFixture(t)
	for _, id := range []string{"p1", "p2"} {
		msg := message.NewMessage(id, []byte("x"))
		msg.Metadata.Set(middleware.PoisonedTopicKey, "orders")
		msg.Metadata.Set(middleware.ReasonForPoisonedKey, "boom")
		require.NoError(t, f.pub.Publish("poison", msg))
	}
	replay := func(args ...string) replayOutput {
		t.Helper()
		var out replayOutput
		require.NoError(t, json.Unmarshal([]byte(f.ok("replay", append([]string{"--from", "poison", "--to-original", "--json"}, args...)...)), &out))
		return out
	}
	count := func(topic string) int {
		var page admin.MessagePage
		require.NoError(t, json.Unmarshal([]byte(f.ok("messages", "--topic", topic, "--json")), &page))
		return len(page.Messages)
	}
	dry := replay("--dry-run")
	assert.True(t, dry.DryRun)
	require.Len(t, dry.Messages, 2)
	assert.Equal(t, "orders", dry.Messages[0].To)
	assert.Equal(t, 2, count("poison"))
	assert.Equal(t, 0, count("orders"))

	out := f.ok("replay", "--from", "poison", "--to-original")
	assert.Contains(t, out, "Replayed 2 messages from topic poison")
	assert.Contains(t, out, "boom")
	assert.Empty(t, replay().Messages, "run twice, published once")
	assert.Equal(t, 0, count("poison"))
	assert.Equal(t, 2, count("orders"))

	for _, args := range [][]string{
		{"--from", "poison"},
		{"--from", "poison", "--to", "x", "--to-original"},
		{"--from", "poison", "--to", "poison"},
		{"--from", "poison", "--to", "x", "--filter-metadata", "novalue"},
		{"--to", "x"},
	} {
		r := f.cli("replay", args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r)
	}
}
