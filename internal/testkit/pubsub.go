package testkit

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// NewPublisher returns a publisher on db that initializes tables's
// schema, closed at the end of the test.
func NewPublisher(t *testing.T, db pglease.DB, tables pglease.Tables) *pglease.Publisher {
	t.Helper()
	pub, err := pglease.NewPublisher(db, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, Logger())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	return pub
}

// NewSubscriber returns a subscriber of cfg on pool and tables that
// initializes the schema, closed at the end of the test: unless cfg says
// otherwise, it polls every 10 ms, its session lives 2 s, and when the
// pool goes through [PoolDSN] it LISTENs on [DSN] directly.
func NewSubscriber(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, cfg pglease.SubscriberConfig) *pglease.Subscriber {
	t.Helper()
	cfg.Tables = tables
	cfg.InitializeSchema = true
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 2 * time.Second
	}
	if PoolDSN != DSN && cfg.ListenConnConfig == nil && !cfg.PollOnly {
		cfg.ListenConnConfig = DirectConnConfig(t)
	}
	sub, err := pglease.NewSubscriber(pool, cfg, Logger())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return sub
}

// PublishN publishes n messages to topic, one by one, and returns their
// UUIDs in order.
func PublishN(t *testing.T, pub *pglease.Publisher, topic string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		require.NoError(t, pub.Publish(topic, msg))
		ids = append(ids, msg.UUID)
	}
	return ids
}

// ReceiveOne reads one message, or fails the test after 30 s or when
// the channel is closed.
func ReceiveOne(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
		return nil
	}
}

// Receive reads n messages, acking each, or fails the test after timeout.
func Receive(t *testing.T, msgs <-chan *message.Message, n int, timeout time.Duration) []*message.Message {
	t.Helper()
	var got []*message.Message
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case msg, ok := <-msgs:
			require.True(t, ok, "messages channel closed after %d of %d messages", len(got), n)
			got = append(got, msg)
			msg.Ack()
		case <-deadline:
			t.Fatalf("received %d of %d messages within %s", len(got), n, timeout)
		}
	}
	return got
}

// UUIDs returns the UUIDs of msgs, in order.
func UUIDs(msgs []*message.Message) []string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.UUID)
	}
	return ids
}

// BenchPoolConns is the pool size of the benchmarks.
const BenchPoolConns = 64

// BenchSetup returns a pool and a Tables on a fresh schema whose tables
// exist, so that no benchmark times DDL.
func BenchSetup(b *testing.B, topic string) (*pgxpool.Pool, pglease.Tables) {
	b.Helper()
	pool := NewPool(b, BenchPoolConns)
	tables := NewSchema(b, pool)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: tables, InitializeSchema: true}, nil)
	require.NoError(b, err)
	require.NoError(b, sub.SubscribeInitialize(topic))
	require.NoError(b, sub.Close())
	return pool, tables
}
