package pglease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestSharedTopicIsLogged: a second subscription of one consumer group to
// one topic in this process, on the same Subscriber or on another one, is
// logged at Info, saying to give each handler its own ConsumerGroup (the
// mistake that leaves CQRS event handlers without messages). Other groups
// and other topics are not; a subscription stops counting when its
// context ends or its Subscriber closes.
func TestSharedTopicIsLogged(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	ctx := context.Background()
	logger := newCapturingLogger()
	shared := func() []logEntry {
		var found []logEntry
		for _, e := range logger.Entries() {
			if strings.Contains(e.Msg, "give each handler its own ConsumerGroup") {
				found = append(found, e)
			}
		}
		return found
	}
	newSub := func(group string) *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
			InitializeSchema: true, SessionTTL: 2 * time.Second, PollInterval: 10 * time.Millisecond}, logger)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, sub.Close()) })
		return sub
	}
	subscribe := func(ctx context.Context, sub *pglease.Subscriber, topic string) <-chan *message.Message {
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		return msgs
	}
	waitClosed := func(msgs <-chan *message.Message) {
		select {
		case _, ok := <-msgs:
			require.False(t, ok, "no message was published")
		case <-time.After(10 * time.Second):
			t.Fatal("the channel was not closed within 10s")
		}
	}

	a := newSub("g")
	subscribe(ctx, a, "t1")
	subscribe(ctx, a, "t2")
	subscribe(ctx, newSub("other"), "t1")
	require.Empty(t, shared(), "other topics and other groups share nothing")

	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	again := subscribe(ctx2, a, "t1")
	entries := shared()
	require.Len(t, entries, 1, "a second Subscribe of one Subscriber to a topic")
	assert.Equal(t, "info", entries[0].Level)
	assert.Equal(t, "g", entries[0].Fields["consumer_group"])
	assert.Equal(t, "t1", entries[0].Fields["topic"])
	assert.Equal(t, 2, entries[0].Fields["subscriptions"])

	b := newSub("g")
	fromB := subscribe(ctx, b, "t1")
	require.Len(t, shared(), 2, "a second Subscriber of the group in the process")
	assert.Equal(t, 3, shared()[1].Fields["subscriptions"])

	cancel2()
	waitClosed(again)
	require.NoError(t, b.Close())
	waitClosed(fromB)
	require.NoError(t, a.Close())
	subscribe(ctx, newSub("g"), "t1")
	assert.Len(t, shared(), 2, "subscriptions that ended, by their context or by Close, no longer count")
}
