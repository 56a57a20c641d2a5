package pglease_test

import (
	"context"
	"fmt"
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
)

// Data set of TestMigrationToPartitionedMessagesKeepsEveryPosition.
const (
	migTxs         = 40     // transactions that commit in order
	migRowsPerTx   = 24_750 // rows of each
	migSmallEvery  = 1_650  // one row in this many goes to the topic "small"
	migOldTxRows   = 5_000  // rows the old transaction writes first, and again last
	migOldTxSmall  = 250    // one row in this many of them goes to "small"
	migWorkers     = 3      // transactions running at once
	migTotal       = migTxs*migRowsPerTx + 2*migOldTxRows
	migSmallTopic  = "small"
	migResumeGroup = "g1"
)

var (
	migTopics     = []string{"big-a", "big-b", "big-c", migSmallTopic}
	migPartitions = []int32{1, 4, 8, 1}
)

// TestMigrationToPartitionedMessagesKeepsEveryPosition upgrades a schema of
// version 5 holding a million messages to the latest; version 6 turns the
// messages table into a partitioned one by attaching the old table as its
// partition of messages kept forever. Every message keeps its topic,
// partition, transaction id, offset and contents, so the delivery order
// and every consumer position stay valid: a Subscriber resumes exactly after
// its stored position, and new messages get offsets after the old ones.
func TestMigrationToPartitionedMessagesKeepsEveryPosition(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, migWorkers+3)
	adapter := newSchema(t, pool)
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages := qualified(pglease.DefaultMessagesTable)
	forever := qualified(pglease.DefaultMessagesTable + "_forever")
	offsets := qualified(pglease.DefaultConsumerOffsetsTable)
	sessions := qualified(pglease.DefaultConsumerSessionsTable)
	versions := qualified(pglease.DefaultSchemaVersionTable)
	topicsTable := qualified(pglease.DefaultTopicsTable)

	// Schema version 5: the schema a deployment has before upgrading to
	// the partitioned messages table.
	require.NoError(t, migrateTo(ctx, pool, adapter, 5))
	old, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		Tables:      adapter,
		Maintenance: pglease.MaintenanceConfig{Disabled: true},
	}, nil)
	require.NoError(t, err)
	require.NoError(t, old.SubscribeInitialize(migSmallTopic))
	require.NoError(t, old.Close())
	require.Equal(t, 5, schemaVersion(t, pool, versions))
	require.Equal(t, "r", relkind(t, pool, messages), "version 5 has a plain messages table")
	for i, topic := range migTopics {
		if migPartitions[i] > 1 {
			_, err := pool.Exec(ctx, `INSERT INTO `+topicsTable+` (topic, partitions) VALUES ($1, $2)`, topic, migPartitions[i])
			require.NoError(t, err)
		}
	}

	// A million messages, by 41 transactions. The old transaction writes
	// first, so that its id is the lowest, and again last, after all the
	// others committed: its rows come first in delivery order, the late
	// ones with the highest offsets of all.
	insert := `INSERT INTO ` + messages + ` (topic, partition, uuid, payload, metadata)
SELECT ($4::text[])[k + 1], ((g / 3) % ($5::int[])[k + 1])::integer, gen_random_uuid()::text,
	convert_to($2::text || ':' || g, 'UTF8'),
	CASE WHEN g % 5 = 0 THEN jsonb_build_object('tx', $2::text, 'g', g::text) END
FROM (SELECT g, CASE WHEN g % $3::integer = 0 THEN 3 ELSE g % 3 END AS k FROM generate_series(1, $1::integer) g) s
ORDER BY g`
	populateStart := time.Now()
	oldTx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = oldTx.Rollback(ctx) }()
	_, err = oldTx.Exec(ctx, insert, migOldTxRows, "old-first", migOldTxSmall, migTopics, migPartitions)
	require.NoError(t, err)
	var oldXID string
	require.NoError(t, oldTx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&oldXID))

	jobs := make(chan int)
	errs := make(chan error, migTxs)
	var wg sync.WaitGroup
	for w := 0; w < migWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, insert, migRowsPerTx, fmt.Sprintf("tx%02d", i), migSmallEvery, migTopics, migPartitions)
					return err
				})
			}
		}()
	}
	for i := 0; i < migTxs; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	_, err = oldTx.Exec(ctx, insert, migOldTxRows, "old-last", migOldTxSmall, migTopics, migPartitions)
	require.NoError(t, err)
	require.NoError(t, oldTx.Commit(ctx))
	t.Logf("populated %d messages in %s", migTotal, time.Since(populateStart).Round(time.Millisecond))

	var txCount, maxOldOffset, smallCount int64
	var outOfOrder bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT transaction_id), max("offset"),
	count(*) FILTER (WHERE topic = $2),
	(SELECT max("offset") FROM `+messages+` WHERE transaction_id = $1::text::xid8 AND topic = $2)
		> (SELECT min("offset") FROM `+messages+` WHERE transaction_id > $1::text::xid8 AND topic = $2)
FROM `+messages, oldXID, migSmallTopic).Scan(&txCount, &maxOldOffset, &smallCount, &outOfOrder))
	require.EqualValues(t, migTxs+1, txCount, "every transaction has an id of its own")
	require.True(t, outOfOrder, "offsets of %q are out of delivery order", migSmallTopic)
	require.EqualValues(t, migTxs*migRowsPerTx/migSmallEvery+2*migOldTxRows/migOldTxSmall, smallCount)

	// Consumer positions. Group g1: free rows in the middle of each topic,
	// on "small" just after the old transaction's rows, so that every
	// message left there has a lower offset than the position. Group g2:
	// owned by a live session, a third into each topic. Group g3: free, at
	// the old transaction's last row of each (topic, partition).
	sessionID := watermill.NewUUID()
	_, err = pool.Exec(ctx, `INSERT INTO `+sessions+` (id, consumer_group, owner, expires_at, subscription_hash, subscription_size)
VALUES ($1, 'g2', 'migration test', now() + interval '1 hour', 12345, 14)`, sessionID)
	require.NoError(t, err)
	type topicPartition struct {
		topic     string
		partition int32
		count     int64
	}
	var tps []topicPartition
	rows, err := pool.Query(ctx, `SELECT topic, partition, count(*) FROM `+messages+` GROUP BY 1, 2 ORDER BY 1, 2`)
	require.NoError(t, err)
	for rows.Next() {
		var tp topicPartition
		require.NoError(t, rows.Scan(&tp.topic, &tp.partition, &tp.count))
		tps = append(tps, tp)
	}
	require.NoError(t, rows.Err())
	require.Len(t, tps, 1+4+8+1)
	setOffset := func(group string, tp topicPartition, where string, skip int64, session any, epoch, headDeliveries int) {
		t.Helper()
		tag, err := pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, partition, acked_transaction_id, acked_offset,
	session_id, epoch, head_deliveries, updated_at)
SELECT $1, topic, partition, transaction_id, "offset", $5, $6, $7, now() - interval '1 minute'
FROM `+messages+`
WHERE topic = $2 AND partition = $3 AND `+where+`
ORDER BY transaction_id, "offset" OFFSET $4 LIMIT 1`, group, tp.topic, tp.partition, skip, session, epoch, headDeliveries, oldXID)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected(), "offset row of %s on %s/%d", group, tp.topic, tp.partition)
	}
	for _, tp := range tps {
		if tp.topic == migSmallTopic {
			setOffset("g1", tp, `transaction_id = $8::text::xid8`, 2*migOldTxRows/migOldTxSmall-1, nil, 2, 0)
		} else {
			setOffset("g1", tp, `$8::text <> ''`, tp.count/2, nil, 2, 0)
		}
		setOffset("g2", tp, `$8::text <> ''`, tp.count/3, sessionID, 3, 1)
		setOffset("g3", tp, `transaction_id = $8::text::xid8 AND "offset" = (SELECT max("offset") FROM `+messages+` l
	WHERE l.topic = $2 AND l.partition = $3 AND l.transaction_id = $8::text::xid8)`, 0, nil, 1, 0)
	}

	// What the upgrade must keep.
	printStart := time.Now()
	beforePrint := messagesFingerprint(t, pool, messages)
	require.EqualValues(t, migTotal, beforePrint.count)
	t.Logf("fingerprint of %d messages in %s", beforePrint.count, time.Since(printStart).Round(time.Millisecond))
	// The offsets as version 5 has them: later versions add columns.
	offsetsV5 := `(SELECT consumer_group, topic, partition, acked_transaction_id, acked_offset, session_id,
		lease_expires_at, epoch, updated_at, head_deliveries FROM ` + offsets + `)`
	beforeOffsets := tableText(t, pool, offsetsV5, "true", "consumer_group, topic, partition")
	// The sessions as version 5 has them; later versions add protocol, 1
	// for the sessions of the releases that do not record it.
	sessionsV5 := `(SELECT id, consumer_group, owner, created_at, expires_at, subscription_hash, subscription_size
		FROM ` + sessions + `)`
	beforeSessions := tableText(t, pool, sessionsV5, "true", "id")
	notG1Small := fmt.Sprintf("NOT (consumer_group = '%s' AND topic = '%s')", migResumeGroup, migSmallTopic)
	beforeOthers := tableText(t, pool, offsetsV5, notG1Small, "consumer_group, topic, partition")
	var g1Small struct {
		tx  string
		off int64
	}
	require.NoError(t, pool.QueryRow(ctx, `SELECT acked_transaction_id::text, acked_offset FROM `+offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = 0`, migResumeGroup, migSmallTopic).Scan(&g1Small.tx, &g1Small.off))
	var remaining []string
	rows, err = pool.Query(ctx, `SELECT uuid, "offset" FROM `+messages+`
WHERE topic = $1 AND partition = 0 AND (transaction_id, "offset") > ($2::text::xid8, $3::bigint)
ORDER BY transaction_id, "offset"`, migSmallTopic, g1Small.tx, g1Small.off)
	require.NoError(t, err)
	for rows.Next() {
		var u string
		var off int64
		require.NoError(t, rows.Scan(&u, &off))
		require.Less(t, off, g1Small.off, "a message after g1's position on %q, with a lower offset", migSmallTopic)
		remaining = append(remaining, u)
	}
	require.NoError(t, rows.Err())
	require.Len(t, remaining, migTxs*migRowsPerTx/migSmallEvery, "the messages of %q after g1's position", migSmallTopic)
	var tableNode, indexNode uint32
	var tableBytes int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_relation_filenode($1::regclass), pg_relation_filenode(
	(SELECT indexrelid FROM pg_index WHERE indrelid = $1::regclass AND indisprimary)),
	pg_total_relation_size($1::regclass)`, messages).Scan(&tableNode, &indexNode, &tableBytes))

	// The upgrade, by the default adapter, timed.
	upgrader, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		Tables:           adapter,
		InitializeSchema: true,
		Maintenance:      pglease.MaintenanceConfig{Disabled: true},
	}, nil)
	require.NoError(t, err)
	migrationStart := time.Now()
	require.NoError(t, upgrader.SubscribeInitialize(migSmallTopic))
	took := time.Since(migrationStart)
	require.NoError(t, upgrader.Close())
	latest := len(tablesOf(adapter).Migrations())
	t.Logf("migration from version 5 to %d on %d messages (%d MB with index) took %s", latest, beforePrint.count, tableBytes>>20, took.Round(time.Millisecond))

	// The table is partitioned; its one partition is the old table, not
	// rewritten: same files for the rows and the primary key.
	require.Equal(t, latest, schemaVersion(t, pool, versions))
	require.Equal(t, "p", relkind(t, pool, messages), "messages table partitioned")
	assertForeverPartition := func() {
		t.Helper()
		var parts int
		var isForever bool
		var bound string
		var afterTable, afterIndex uint32
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), bool_and(i.inhrelid = $2::regclass), min(pg_get_expr(c.relpartbound, c.oid)),
	pg_relation_filenode($2::regclass),
	pg_relation_filenode((SELECT indexrelid FROM pg_index WHERE indrelid = $2::regclass AND indisprimary))
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`, messages, forever).
			Scan(&parts, &isForever, &bound, &afterTable, &afterIndex))
		assert.Equal(t, 1, parts, "one partition")
		assert.True(t, isForever, "the partition is the old table, renamed")
		assert.Equal(t, "FOR VALUES FROM ('0', MINVALUE) TO ('1', MINVALUE)", bound)
		assert.Equal(t, tableNode, afterTable, "the old table's rows were not copied")
		assert.Equal(t, indexNode, afterIndex, "the old table's primary key was not rebuilt")
		var inForever, elsewhere int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ONLY `+forever+`),
	(SELECT count(*) FROM `+messages+` WHERE tableoid <> $1::regclass)`, forever).Scan(&inForever, &elsewhere))
		assert.EqualValues(t, migTotal, inForever, "the old rows are in the partition of messages kept forever")
		assert.Zero(t, elsewhere)
	}
	assertForeverPartition()

	// Every position, read through the parent table, in delivery order.
	afterPrint := messagesFingerprint(t, pool, messages)
	assert.Equal(t, beforePrint, afterPrint, "every message keeps its position, contents and delivery order")
	assert.Equal(t, beforeOffsets, tableText(t, pool, offsetsV5, "true", "consumer_group, topic, partition"), "offsets unchanged")
	assert.Equal(t, beforeSessions, tableText(t, pool, sessionsV5, "true", "id"), "sessions unchanged")
	assert.Equal(t, "", tableText(t, pool, sessions, "protocol <> 1", "id"), "the sessions of an earlier release follow protocol 1")
	var classes, infinite int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE retention_class = 0), count(*) FILTER (WHERE expires_at = 'infinity')
FROM `+messages).Scan(&classes, &infinite))
	assert.EqualValues(t, migTotal, classes)
	assert.EqualValues(t, migTotal, infinite)

	// The script for migration tools runs again on the migrated schema,
	// changing nothing.
	_, err = pool.Exec(ctx, pglease.SchemaSQL(adapter))
	require.NoError(t, err, "SchemaSQL on the migrated schema")
	require.Equal(t, latest, schemaVersion(t, pool, versions))
	var versionRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+versions).Scan(&versionRows))
	require.Equal(t, latest, versionRows)
	assertForeverPartition()
	var count, maxOffset int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max("offset") FROM `+messages).Scan(&count, &maxOffset))
	assert.EqualValues(t, migTotal, count)
	assert.Equal(t, maxOldOffset, maxOffset)
	assert.Equal(t, beforeOffsets, tableText(t, pool, offsetsV5, "true", "consumer_group, topic, partition"), "offsets unchanged")

	// New messages come after every old one.
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	fresh := []*message.Message{
		message.NewMessage(watermill.NewUUID(), []byte("after the upgrade 1")),
		message.NewMessage(watermill.NewUUID(), []byte("after the upgrade 2")),
	}
	require.NoError(t, pub.Publish(migSmallTopic, fresh...))
	for _, msg := range fresh {
		var off int64
		var inForever bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT "offset", tableoid = $2::regclass FROM `+messages+` WHERE uuid = $1`, msg.UUID, forever).
			Scan(&off, &inForever))
		assert.Greater(t, off, maxOldOffset, "offset of a message published after the upgrade")
		assert.True(t, inForever, "a message of a topic without retention goes to the partition kept forever")
		remaining = append(remaining, msg.UUID)
	}
	require.NoError(t, pub.Close())

	// Group g1 resumes on "small" exactly after its position: every
	// message after it (all with lower offsets than the position), then
	// the new ones, in order.
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup: migResumeGroup,
		Tables:        adapter,
		PollInterval:  50 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() { _ = sub.Close() }()
	msgs, err := sub.Subscribe(subCtx, migSmallTopic)
	require.NoError(t, err)
	resumeStart := time.Now()
	got := receive(t, msgs, len(remaining), 60*time.Second)
	t.Logf("group %s received the %d messages after its position in %s", migResumeGroup, len(got), time.Since(resumeStart).Round(time.Millisecond))
	gotUUIDs := make([]string, len(got))
	for i, msg := range got {
		gotUUIDs[i] = msg.UUID
	}
	assert.Equal(t, remaining, gotUUIDs, "g1 resumes after its position, in delivery order")
	assertNothingWithin(t, msgs, 300*time.Millisecond)
	require.NoError(t, sub.Close())

	var ackedOffset int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT acked_offset FROM `+offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = 0`, migResumeGroup, migSmallTopic).Scan(&ackedOffset))
	var lastOffset int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT "offset" FROM `+messages+` WHERE uuid = $1`, fresh[len(fresh)-1].UUID).Scan(&lastOffset))
	assert.Equal(t, lastOffset, ackedOffset, "g1's position after the last message")
	assert.Equal(t, beforeOthers, tableText(t, pool, offsetsV5, notG1Small, "consumer_group, topic, partition"),
		"the other offset rows unchanged")
	assert.Contains(t, tableText(t, pool, sessions, "true", "id"), sessionID, "g2's live session kept")
	assertNoLeakedGoroutines(t)
}

type fingerprint struct {
	count int64
	md5   string
}

// messagesFingerprint hashes every message, in delivery order: topic,
// partition, transaction id, offset, UUID, payload, metadata and creation
// time. The rows come from a sorted subquery, which PostgreSQL reads along
// the primary key (the read path's index) and aggregates in that order: it
// takes half the time of an ordered aggregate, which sorts the million rows
// itself. Were the order not kept, the hashes would differ.
func messagesFingerprint(t *testing.T, pool *pgxpool.Pool, table string) fingerprint {
	t.Helper()
	var f fingerprint
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), md5(string_agg(
	concat_ws('|', topic, partition, transaction_id, "offset", uuid, payload, metadata, created_at), E'\n'))
FROM (SELECT * FROM `+table+` ORDER BY topic, partition, transaction_id, "offset") m`).Scan(&f.count, &f.md5))
	return f
}

// tableText returns the rows of a table that match where, as text, in the
// given order.
func tableText(t *testing.T, pool *pgxpool.Pool, table, where, orderBy string) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT COALESCE(string_agg(r::text, E'\n' ORDER BY `+orderBy+`), '') FROM `+table+` r WHERE `+where).Scan(&s))
	return s
}

func schemaVersion(t *testing.T, pool *pgxpool.Pool, versionTable string) int {
	t.Helper()
	var v int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT COALESCE(max(version), 0) FROM `+versionTable).Scan(&v))
	return v
}

func relkind(t *testing.T, pool *pgxpool.Pool, table string) string {
	t.Helper()
	var k string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, table).Scan(&k))
	return k
}
