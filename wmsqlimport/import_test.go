package wmsqlimport_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
	"github.com/pglease/watermill-pglease/wmsqlimport"
)

// wmSource is a topic in watermill-sql v4's default PostgreSQL schema,
// its tables made by hand in a schema of their own (the library does not
// depend on watermill-sql; benchmarks/importtest runs the real one), and
// a pool whose search_path finds them, as the import's source.
type wmSource struct {
	pool     *pgxpool.Pool
	messages string // quoted, qualified
	offsets  string
}

func newWMSource(t *testing.T, pool *pgxpool.Pool, topic string) *wmSource {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchema(t, pool, "wm_test_")
	s := &wmSource{
		messages: pgx.Identifier{schema, "watermill_" + topic}.Sanitize(),
		offsets:  pgx.Identifier{schema, "watermill_offsets_" + topic}.Sanitize(),
	}
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()+`;
CREATE TABLE `+s.messages+` (
	"offset" BIGSERIAL, "uuid" VARCHAR(36) NOT NULL, "created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	"payload" JSON DEFAULT NULL, "metadata" JSON DEFAULT NULL, "transaction_id" xid8 NOT NULL,
	PRIMARY KEY ("transaction_id", "offset"));
CREATE TABLE `+s.offsets+` (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT,
	last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group))`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(testkit.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 4
	s.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(s.pool.Close)
	return s
}

// publish stores messages "m<from>" to "m<to-1>" in one transaction, as
// watermill-sql's Publisher does.
func (s *wmSource) publish(t *testing.T, from, to int) {
	t.Helper()
	_, err := s.pool.Exec(context.Background(), `INSERT INTO `+s.messages+` (uuid, payload, metadata, transaction_id)
SELECT 'm' || n, json_build_object('n', n), '{}', pg_current_xact_id() FROM generate_series($1::int, $2::int) n`, from, to-1)
	require.NoError(t, err)
}

// ack records that group acknowledged every message up to "m<n-1>", as
// watermill-sql's Subscriber does.
func (s *wmSource) ack(t *testing.T, group string, n int) {
	t.Helper()
	_, err := s.pool.Exec(context.Background(), `INSERT INTO `+s.offsets+` (consumer_group, offset_acked, last_processed_transaction_id)
SELECT $1, "offset", transaction_id FROM `+s.messages+` WHERE uuid = $2
ON CONFLICT (consumer_group) DO UPDATE SET offset_acked = EXCLUDED.offset_acked,
	last_processed_transaction_id = EXCLUDED.last_processed_transaction_id`, group, fmt.Sprintf("m%d", n-1))
	require.NoError(t, err)
}

// TestImportRunThatWaitedDoesNotMoveGroupBack: two runs of the import of
// one topic interleave. The second one to take the topic's lock began
// while group A had acknowledged 200 messages in watermill-sql; before it
// takes the lock, A acknowledges 100 more and another run imports that,
// moving A's offset row (A has not started in pglease). The run that
// waited must not move A back: A's row stays where the other run put it,
// and a pglease Subscriber of A receives exactly the 100 messages A had
// not acknowledged, none of the 100 it acknowledged last.
func TestImportRunThatWaitedDoesNotMoveGroupBack(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 10)
	adapter := testkit.NewSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	const topic = "orders"
	src := newWMSource(t, pool, topic)
	for n := 0; n < 400; n += 100 {
		src.publish(t, n, n+100)
	}
	config := wmsqlimport.Config{Topics: []string{topic}, Tables: adapter}
	src.ack(t, "A", 100)
	first, err := wmsqlimport.Run(ctx, pool, src.pool, config)
	require.NoError(t, err)
	require.Equal(t, int64(300), first.Topics[0].Messages)
	require.Equal(t, wmsqlimport.GroupCreated, first.Topics[0].Groups[0].Action)
	src.ack(t, "A", 200)

	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	positionOfA := func() pglease.Position {
		t.Helper()
		rows, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"A"}, Topics: []string{topic}})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		return rows[0].Position
	}
	var (
		hooked bool
		ahead  pglease.Position
	)
	defer wmsqlimport.SetBeforeLockHook(func(string) {
		if hooked {
			return
		}
		hooked = true
		src.ack(t, "A", 300)
		other, err := wmsqlimport.Run(ctx, pool, src.pool, config)
		require.NoError(t, err)
		require.Equal(t, wmsqlimport.GroupMoved, other.Topics[0].Groups[0].Action)
		ahead = positionOfA()
	})()
	waited, err := wmsqlimport.Run(ctx, pool, src.pool, config)
	require.NoError(t, err)
	require.True(t, hooked)
	assert.Equal(t, ahead, waited.Topics[0].Groups[0].Position, "%+v", waited.Topics[0])
	assert.Equal(t, ahead, positionOfA(), "the run that waited moved A")

	sub := testkit.NewSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "A"})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var want []string
	for n := 300; n < 400; n++ {
		want = append(want, fmt.Sprintf("m%d", n))
	}
	assert.Equal(t, want, testkit.UUIDs(testkit.Receive(t, msgs, len(want), 30*time.Second)))
}

// TestImportNeverMovesGroupBack: a group that has not started in pglease
// follows its watermill-sql position forward only. Moved back by hand in
// watermill-sql after a run moved it, it stays where that run put it (the
// report says so), and a pglease Subscriber of the group receives only
// what it had not acknowledged.
func TestImportNeverMovesGroupBack(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 10)
	adapter := testkit.NewSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	const topic = "orders"
	src := newWMSource(t, pool, topic)
	for n := 0; n < 400; n += 100 {
		src.publish(t, n, n+100)
	}
	config := wmsqlimport.Config{Topics: []string{topic}, Tables: adapter}
	run := func() wmsqlimport.TopicReport {
		t.Helper()
		report, err := wmsqlimport.Run(ctx, pool, src.pool, config)
		require.NoError(t, err)
		require.Len(t, report.Topics, 1)
		require.Len(t, report.Topics[0].Groups, 1)
		return report.Topics[0]
	}
	src.ack(t, "A", 100)
	require.Equal(t, wmsqlimport.GroupCreated, run().Groups[0].Action)
	src.ack(t, "A", 300)
	moved := run().Groups[0]
	require.Equal(t, wmsqlimport.GroupMoved, moved.Action)

	src.ack(t, "A", 200)
	back := run()
	assert.Equal(t, wmsqlimport.GroupUnchanged, back.Groups[0].Action)
	assert.Equal(t, moved.Position, back.Groups[0].Position)
	if assert.Len(t, back.Warnings, 1) {
		assert.Contains(t, back.Warnings[0], `group "A": acknowledged`)
	}

	sub := testkit.NewSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "A"})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	assert.Equal(t, "m300", testkit.ReceiveOne(t, msgs).UUID)
}

// TestImportAllSkipsTablesOfOtherRoles: with All, a watermill_* table of
// the search_path that another role created (or whose offsets table
// another role created) is not imported but reported as skipped; the
// application's own tables are imported.
func TestImportAllSkipsTablesOfOtherRoles(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 10)
	adapter := testkit.NewSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	src := newWMSource(t, pool, "orders")
	src.publish(t, 0, 10)
	src.ack(t, "A", 5)
	schema, _, ok := strings.Cut(src.messages, ".")
	require.True(t, ok, "the source table %q is schema-qualified", src.messages)
	other := "pglease_import_other_" + pgtest.RandomHex(6)
	_, err := pool.Exec(ctx, "CREATE ROLE "+other+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+other)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+other)
	})
	for _, table := range []string{"planted", "mixed"} {
		_, err = pool.Exec(ctx, `CREATE TABLE `+schema+`.watermill_`+table+` (
	"offset" BIGSERIAL, "uuid" VARCHAR(36) NOT NULL, "created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	"payload" JSON DEFAULT NULL, "metadata" JSON DEFAULT NULL, "transaction_id" xid8 NOT NULL,
	PRIMARY KEY ("transaction_id", "offset"));
CREATE TABLE `+schema+`.watermill_offsets_`+table+` (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT,
	last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group));
INSERT INTO `+schema+`.watermill_`+table+` (uuid, transaction_id) VALUES ('x', pg_current_xact_id())`)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, "ALTER TABLE "+schema+".watermill_planted OWNER TO "+other+
		"; ALTER TABLE "+schema+".watermill_offsets_planted OWNER TO "+other+
		"; ALTER TABLE "+schema+".watermill_offsets_mixed OWNER TO "+other)
	require.NoError(t, err)

	report, err := wmsqlimport.Run(ctx, pool, src.pool, wmsqlimport.Config{All: true, Tables: adapter, DryRun: true})
	require.NoError(t, err)
	var imported []string
	for _, t := range report.Topics {
		imported = append(imported, t.Topic)
	}
	assert.Equal(t, []string{"orders"}, imported)
	require.Len(t, report.Skipped, 2)
	assert.Equal(t, "watermill_mixed", report.Skipped[0].Table)
	assert.Contains(t, report.Skipped[0].Reason, "its offsets table is owned by \""+other+"\"")
	assert.Equal(t, "watermill_planted", report.Skipped[1].Table)
	assert.Equal(t, other, report.Skipped[1].Owner)

	report, err = wmsqlimport.Run(ctx, pool, src.pool, wmsqlimport.Config{All: true, SourceOwner: other,
		Tables: adapter, DryRun: true})
	require.NoError(t, err)
	require.Len(t, report.Topics, 1)
	assert.Equal(t, "planted", report.Topics[0].Topic)
}

// TestImportDeprecatedSchemaAdapter: Config.SchemaAdapter, the former
// name of Config.Tables, still names the pglease tables (the search_path
// has none: were it ignored, the run would fail); both set to different
// tables are refused, naming both fields.
func TestImportDeprecatedSchemaAdapter(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t, 10)
	tables := testkit.NewSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, tables))
	const topic = "orders"
	src := newWMSource(t, pool, topic)
	src.publish(t, 0, 10)

	_, err := wmsqlimport.Run(ctx, pool, src.pool, wmsqlimport.Config{Topics: []string{topic}, Tables: tables,
		SchemaAdapter: pglease.Tables{Schema: tables.Schema + "_other"}})
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "wmsqlimport.Config.Tables and wmsqlimport.Config.SchemaAdapter")
	_, err = wmsqlimport.Run(ctx, pool, src.pool, wmsqlimport.Config{Topics: []string{topic},
		SchemaAdapter: pglease.Tables{Schema: strings.Repeat("s", 64)}})
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "wmsqlimport.Config.SchemaAdapter: pglease.Tables.Schema")

	report, err := wmsqlimport.Run(ctx, pool, src.pool, wmsqlimport.Config{Topics: []string{topic}, SchemaAdapter: tables})
	require.NoError(t, err)
	require.Len(t, report.Topics, 1)
	assert.Equal(t, int64(10), report.Topics[0].Messages)
}
