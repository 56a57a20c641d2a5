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
	parallel(t)
	pool := newPool(t, 70)
	adapter := newSchema(t, pool)
	const n = 64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, nil)
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
	assert.Equal(t, len(tablesOf(adapter).Migrations()), versions, "each migration is recorded once")
}

// TestSchemaSetUpWaitsForTheLockOnlyWhenBehind holds the schema lock from
// another transaction, as a process paused in its own set-up would: a
// set-up that finds the schema current goes on without it; one that finds
// a version missing waits for it, then applies the migration once.
func TestSchemaSetUpWaitsForTheLockOnlyWhenBehind(t *testing.T) {
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	ctx := context.Background()
	setUp := func(ctx context.Context, topic string) error {
		return pglease.CreateTopic(ctx, pool, topic, pglease.TopicConfig{Tables: adapter, InitializeSchema: true})
	}
	require.NoError(t, setUp(ctx, "first"))

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, tablesOf(adapter).LockKey)
	require.NoError(t, err)

	current, cancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, setUp(current, "current"), "a set-up of a current schema waited for the lock")
	cancel()

	versions := pgx.Identifier{adapter.Schema, pglease.DefaultSchemaVersionTable}.Sanitize()
	migrations := tablesOf(adapter).Migrations()
	last := migrations[len(migrations)-1].Version
	_, err = pool.Exec(ctx, `DELETE FROM `+versions+` WHERE version = $1`, last)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- setUp(ctx, "behind") }()
	waitFor(t, 10*time.Second, "the set-up of a schema behind to wait for the lock", func() bool {
		var waiting int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting)
		return err == nil && waiting > 0
	})
	select {
	case err := <-done:
		t.Fatalf("the set-up of a schema behind did not wait for the lock: %v", err)
	default:
	}
	require.NoError(t, holder.Rollback(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the set-up did not finish once the lock was free")
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+versions+` WHERE version = $1`, last).Scan(&n))
	assert.Equal(t, 1, n, "the missing version is recorded again, once")
}

// TestSchemaSQLForMigrationTools applies the exported DDL by hand, with names
// that need quoting, then runs the Pub/Sub with schema set-up off.
func TestSchemaSQLForMigrationTools(t *testing.T) {
	parallel(t)
	pool := newPool(t, 5)
	base := newSchema(t, pool)
	adapter := pglease.Tables{
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

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, PollInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish("t", msg))
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receive(t, msgs, 1, 10*time.Second)
	assert.Equal(t, msg.UUID, got[0].UUID)

	// Automatic set-up finds the versions recorded and changes nothing.
	auto, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	defer auto.Close()
	require.NoError(t, auto.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
}

// TestMissingSchemaIsAClearError checks the error when the tables are
// missing and set-up is off.
func TestMissingSchemaIsAClearError(t *testing.T) {
	parallel(t)
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil))
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "SchemaSQL"), "error should say how to create the tables: %v", err)

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer sub.Close()
	_, err = sub.Subscribe(context.Background(), "t")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SchemaSQL")

	// CreateTopic has no setting that creates the tables by default: it
	// says to run the migration step.
	err = pglease.CreateTopic(context.Background(), pool, "t", pglease.TopicConfig{Tables: adapter})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run pglease.Migrate or `pglease migrate`")
	assert.NotContains(t, err.Error(), "InitializeSchema")
}

// TestMigrate runs the explicit schema step: it creates every version
// once, a second run changes nothing, and then the Pub/Sub runs with
// schema set-up off.
func TestMigrate(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	require.ErrorIs(t, pglease.Migrate(ctx, nil, adapter), pglease.ErrInvalidConfig)
	require.ErrorIs(t, pglease.Migrate(ctx, pool, pglease.Tables{Schema: strings.Repeat("s", 64)}), pglease.ErrInvalidConfig)
	versions := pgx.Identifier{adapter.Schema, pglease.DefaultSchemaVersionTable}.Sanitize()
	for range 2 {
		require.NoError(t, pglease.Migrate(ctx, pool, adapter))
		var n, latest int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), max(version) FROM "+versions).Scan(&n, &latest))
		assert.Equal(t, len(tablesOf(adapter).Migrations()), n, "each version recorded once")
		assert.Equal(t, tablesOf(adapter).Migrations()[len(tablesOf(adapter).Migrations())-1].Version, latest)
	}
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Tables: adapter}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
}

// TestDeprecatedSchemaAdapter: configurations written for the former
// names (the type DefaultSchemaAdapter, the field SchemaAdapter) keep
// working for one release: a Publisher, a Subscriber and CreateTopic
// configured through SchemaAdapter alone use its tables. Both fields set
// to different tables is refused with an error that names both; set to
// the same tables, they are accepted. A bad name set through either field
// is reported under the field that was set.
func TestDeprecatedSchemaAdapter(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 5)
	old := pglease.DefaultSchemaAdapter(newSchema(t, pool))
	require.NoError(t, pglease.Migrate(ctx, pool, old))

	// Through SchemaAdapter alone. The tables of the search_path are not
	// pglease's: were the field ignored, these calls would fail.
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{SchemaAdapter: old, Partitions: 2}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: old}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: old, PollInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish("t", msg))
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	got := receive(t, msgs, 1, 10*time.Second)
	assert.Equal(t, msg.UUID, got[0].UUID)
	var partitions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT partitions FROM "+
		pgx.Identifier{old.Schema, pglease.DefaultTopicsTable}.Sanitize()+" WHERE topic = 't'").Scan(&partitions))
	assert.Equal(t, 2, partitions, "CreateTopic wrote to SchemaAdapter's tables")

	// Both fields: the same tables are fine, different ones are refused.
	other := pglease.Tables{Schema: old.Schema + "_other"}
	_, err = pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: old, SchemaAdapter: old}, nil)
	require.NoError(t, err)
	_, err = pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: old, SchemaAdapter: old}, nil)
	require.NoError(t, err)
	_, err = pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: old, SchemaAdapter: other}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "PublisherConfig.Tables and PublisherConfig.SchemaAdapter")
	_, err = pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: old, SchemaAdapter: other}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "SubscriberConfig.Tables and SubscriberConfig.SchemaAdapter")
	err = pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Tables: old, SchemaAdapter: other, Partitions: 2})
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "TopicConfig.Tables and TopicConfig.SchemaAdapter")

	// A bad name is reported under the field that set it.
	long := pglease.Tables{MessagesTable: strings.Repeat("m", 64)}
	_, err = pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: long}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "PublisherConfig.SchemaAdapter: pglease.Tables.MessagesTable")
	_, err = pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: long}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "PublisherConfig.Tables: pglease.Tables.MessagesTable")
}
