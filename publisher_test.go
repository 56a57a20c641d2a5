package pglease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// assertNothingWithin fails if a message arrives within d.
func assertNothingWithin(t *testing.T, msgs <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		if ok {
			t.Fatalf("unexpected message %s", msg.UUID)
		}
	case <-time.After(d):
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, where string, args ...any) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM " + pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable}.Sanitize() + " WHERE " + where
	require.NoError(t, pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

func TestPublishRejectsBadInput(t *testing.T) {
	parallel(t)
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ok := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish("valid", message.NewMessage(watermill.NewUUID(), nil)))

	cases := []struct {
		name  string
		topic string
		msgs  []*message.Message
		want  error
	}{
		{"empty topic", "", []*message.Message{ok}, pglease.ErrInvalidTopic},
		{"topic too long", strings.Repeat("t", pglease.MaxTopicLength+1), []*message.Message{ok}, pglease.ErrInvalidTopic},
		{"NUL in topic", "a\x00b", []*message.Message{ok}, pglease.ErrInvalidTopic},
		{"topic not UTF-8", "a\xffb", []*message.Message{ok}, pglease.ErrInvalidTopic},
		{"nil message", "t", []*message.Message{ok, nil}, pglease.ErrInvalidMessage},
		{"NUL in UUID", "t", []*message.Message{message.NewMessage("a\x00", nil)}, pglease.ErrInvalidMessage},
		{"empty UUID", "t", []*message.Message{ok, message.NewMessage("", nil)}, pglease.ErrInvalidMessage},
		{"NUL in metadata", "t", []*message.Message{func() *message.Message {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("k", "v\x00")
			return m
		}()}, pglease.ErrInvalidMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := pub.Publish(tc.topic, tc.msgs...)
			require.ErrorIs(t, err, tc.want)
		})
	}
	// Nothing of a rejected call was stored, not even its valid messages.
	assert.Equal(t, 1, countRows(t, pool, adapter, "true"))
	// The longest allowed topic works.
	require.NoError(t, pub.Publish(strings.Repeat("t", pglease.MaxTopicLength), ok))

	require.NoError(t, pub.Close())
	require.NoError(t, pub.Close(), "Close is idempotent")
	require.ErrorIs(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil)), pglease.ErrPublisherClosed)

	_, err := pglease.NewPublisher(nil, pglease.PublisherConfig{}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	var nilPool *pgxpool.Pool
	_, err = pglease.NewPublisher(nilPool, pglease.PublisherConfig{}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	_, err = pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: pglease.Tables{MessagesTable: strings.Repeat("m", 64)}}, nil)
	require.ErrorContains(t, err, "Tables.MessagesTable")
}

func TestPublishKeepsMessagesExactlyAndInOrder(t *testing.T) {
	parallel(t)
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{BatchSize: 7})

	var sent []*message.Message
	for i := 0; i < 50; i++ {
		var payload []byte
		switch i % 3 {
		case 0:
			payload = []byte{0, 1, 2, 255, byte(i)}
		case 1:
			payload = []byte("héllo ✓ " + strings.Repeat("x", i))
		}
		msg := message.NewMessage("custom-id-"+watermill.NewShortUUID(), payload)
		msg.Metadata.Set("n", string(rune('a'+i%26)))
		msg.Metadata.Set("quote\"and\\slash", "<&>\n\t✓")
		sent = append(sent, msg)
	}
	// One call with many messages, then single ones: order is kept.
	require.NoError(t, pub.Publish("exact", sent[:30]...))
	for _, m := range sent[30:] {
		require.NoError(t, pub.Publish("exact", m))
	}

	msgs, err := sub.Subscribe(context.Background(), "exact")
	require.NoError(t, err)
	got := receive(t, msgs, len(sent), 20*time.Second)
	for i := range sent {
		assert.Equal(t, sent[i].UUID, got[i].UUID)
		assert.Equal(t, len(sent[i].Payload), len(got[i].Payload))
		assert.Equal(t, string(sent[i].Payload), string(got[i].Payload))
		// Kept exactly, plus the delivery attempt the Subscriber adds.
		assert.Equal(t, "1", got[i].Metadata.Get(pglease.DeliveryAttemptMetadata))
		delete(got[i].Metadata, pglease.DeliveryAttemptMetadata)
		assert.Equal(t, sent[i].Metadata, got[i].Metadata)
	}
}

func TestPublishInCallersTransaction(t *testing.T) {
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	// Create the tables first: schema set-up inside the caller's transaction
	// would be rolled back with it.
	require.NoError(t, newPublisher(t, pool, adapter).Publish("setup", message.NewMessage(watermill.NewUUID(), nil)))
	ctx := context.Background()

	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		pub, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ { // a pgx.Tx runs one statement at a time: Publish serializes
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, pub.Publish("outbox", message.NewMessage(watermill.NewUUID(), []byte("x"))))
			}()
		}
		wg.Wait()
		require.NoError(t, pub.Close())
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	assert.Equal(t, 8, countRows(t, pool, adapter, "topic = 'outbox'"), "only the committed transaction's messages exist")

	// A *pgx.Conn works the same way.
	conn, err := pgx.Connect(ctx, testkit.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	pub := newPublisher(t, conn, adapter)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, pub.Publish("conn", message.NewMessage(watermill.NewUUID(), []byte("x"))))
		}()
	}
	wg.Wait()
	assert.Equal(t, 8, countRows(t, pool, adapter, "topic = 'conn'"))
}

// TestPublishErrorCountsMessages: the error of a Publish that the
// database refuses says how many messages it was, in good English.
func TestPublishErrorCountsMessages(t *testing.T) {
	parallel(t)
	pool := newPool(t, 2)
	// No tables: the insert fails.
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: newSchema(t, pool)}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, pub.Close()) }()
	err = pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil))
	require.ErrorContains(t, err, `publish 1 message to topic "t": `)
	err = pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil), message.NewMessage(watermill.NewUUID(), nil))
	require.ErrorContains(t, err, `publish 2 messages to topic "t": `)
}
