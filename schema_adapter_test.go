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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestSchemaSetUpIsConcurrencySafe starts 64 Publishers at once on a schema
// that does not exist yet; each publishes the first message of a new topic.
func TestSchemaSetUpIsConcurrencySafe(t *testing.T) {
	pool := newPool(t, 70)
	adapter := newSchema(t, pool)
	const n = 64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, nil)
			if !assert.NoError(t, err) {
				return
			}
			defer pub.Close()
			<-start
			assert.NoError(t, pub.Publish("brand-new-topic", message.NewMessage(watermill.NewUUID(), []byte("x"))))
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, n, countRows(t, pool, adapter, "topic = 'brand-new-topic'"))

	var versions int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{adapter.Schema, pglease.DefaultSchemaVersionTable}.Sanitize()).Scan(&versions))
	assert.Equal(t, len(adapter.Migrations()), versions, "each migration is recorded once")
}

// TestSchemaSQLForMigrationTools applies the exported DDL by hand, with names
// that need quoting, then runs the Pub/Sub with schema set-up off.
func TestSchemaSQLForMigrationTools(t *testing.T) {
	pool := newPool(t, 5)
	base := newSchema(t, pool)
	adapter := pglease.DefaultSchemaAdapter{
		Schema:                base.Schema,
		MessagesTable:         `Messages "quoted"; DROP TABLE x`,
		ConsumerSessionsTable: "sessions.with.dots",
		ConsumerOffsetsTable:  "Offsets",
		SchemaVersionTable:    "version",
	}
	ddl := pglease.SchemaSQL(adapter)
	assert.Contains(t, ddl, `"Messages ""quoted""; DROP TABLE x"`)
	ctx := context.Background()
	for i := 0; i < 2; i++ { // idempotent
		_, err := pool.Exec(ctx, ddl)
		require.NoError(t, err, "applying the DDL, round %d", i+1)
	}

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: adapter, PollInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish("t", msg))
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receive(t, msgs, 1, 10*time.Second)
	assert.Equal(t, msg.UUID, got[0].UUID)

	// Automatic set-up finds the versions recorded and changes nothing.
	auto, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	defer auto.Close()
	require.NoError(t, auto.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
}

// TestMissingSchemaIsAClearError checks the error when the tables are
// missing and set-up is off.
func TestMissingSchemaIsAClearError(t *testing.T) {
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil))
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "SchemaSQL"), "error should say how to create the tables: %v", err)

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: adapter}, nil)
	require.NoError(t, err)
	defer sub.Close()
	_, err = sub.Subscribe(context.Background(), "t")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SchemaSQL")
}
