package pglease

// The statements of ImportWatermillSQL (import_watermillsql.go): one
// function per statement, each taking a small querier and returning typed
// rows. Source tables are watermill-sql's, named "watermill_<topic>" and
// "watermill_offsets_<topic>" in the source connection's search_path, as
// watermill-sql names them; every name is quoted and every value is a
// parameter.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Names of the import's own tables, in the schema of the pglease tables
// ([DefaultSchemaAdapter.Schema]). The import creates them
// (CREATE TABLE IF NOT EXISTS); they are not part of the migrations.
const (
	// ImportRunsTable records, per topic, each run of the import: which
	// watermill-sql positions it copied and where they are in pglease.
	ImportRunsTable = "pglease_import_watermill_sql"
	// ImportGroupsTable records, per (topic, consumer group), the
	// position the import gave the group's offset row, so that a later
	// run can tell whether the group has consumed in pglease since.
	ImportGroupsTable = "pglease_import_watermill_sql_groups"
)

// importTable is the quoted name of one of the import's own tables, in
// the schema of t.
func importTable(t *pgsql.Tables, name string) string {
	if t.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, name}.Sanitize()
}

// querier runs statements: pgx.Tx, *pgx.Conn and *pgxpool.Pool.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// wmColumn is one column of a source table.
type wmColumn struct {
	Name string
	Type string // format_type, e.g. "bigint", "character varying(36)"
}

// wmTableColumns returns the columns of table (an unqualified name found
// through the search_path, as watermill-sql finds it), none when there is
// no such table.
func wmTableColumns(ctx context.Context, q querier, table string) ([]wmColumn, error) {
	rows, err := q.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, pgx.Identifier{table}.Sanitize())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[wmColumn])
}

// wmTopicTables returns the names of the tables in the search_path that
// look like watermill-sql messages tables: named "watermill_" and
// something, without a consumer_group column (those are offsets tables).
func wmTopicTables(ctx context.Context, q querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT c.relname::text
FROM pg_catalog.pg_class c
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'watermill\_%' AND pg_catalog.pg_table_is_visible(c.oid)
	AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = c.oid AND a.attname = 'consumer_group' AND NOT a.attisdropped)
ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// wmGroup is one consumer group's row of a watermill offsets table.
type wmGroup struct {
	ConsumerGroup string
	TransactionID uint64
	Offset        int64
}

// wmGroups reads a watermill offsets table. withXID: the table has
// last_processed_transaction_id (the schema that orders by transaction id).
func wmGroups(ctx context.Context, q querier, table string, withXID bool) ([]wmGroup, error) {
	tx := `'0'`
	if withXID {
		tx = `last_processed_transaction_id`
	}
	rows, err := q.Query(ctx, `SELECT consumer_group::text, (`+tx+`)::text::numeric::bigint, COALESCE(offset_acked, 0)::bigint
FROM `+pgx.Identifier{table}.Sanitize()+`
ORDER BY consumer_group`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (wmGroup, error) {
		var g wmGroup
		var tx int64
		if err := row.Scan(&g.ConsumerGroup, &tx, &g.Offset); err != nil {
			return g, err
		}
		g.TransactionID = uint64(tx)
		return g, nil
	})
}

// wmMessage is one message read from a watermill messages table.
type wmMessage struct {
	TransactionID uint64
	Offset        int64
	UUID          string
	Payload       []byte
	Metadata      string    // JSON text, "" for NULL
	CreatedAt     time.Time // the source's created_at, in the source's time zone
	DelayedUntil  *time.Time
}

// wmMessagesAfter returns up to limit messages of table after position
// after, in watermill-sql's delivery order. kind says how the table
// orders (and for queue tables, that acknowledged rows are left out);
// payloadType is the payload column's type (json, jsonb, text or bytea).
func wmMessagesAfter(ctx context.Context, q querier, table string, kind wmKind, payloadType string, after wmPosition, limit int) ([]wmMessage, error) {
	payload := `payload`
	if payloadType != "bytea" {
		payload = `convert_to(payload::text, 'UTF8')`
	}
	// $1 is the transaction id of after, used only by the tables ordered
	// by it.
	tx, where, order := `'0'`, `"offset" > $2 AND $1::text IS NOT NULL`, `"offset"`
	switch kind {
	case wmKindXID:
		tx, where, order = `transaction_id`, `(transaction_id, "offset") > ($1::text::xid8, $2)`, `transaction_id, "offset"`
	case wmKindQueue:
		where += ` AND NOT acked`
	}
	delayed := `NULL::timestamptz`
	if kind == wmKindQueue {
		// As watermill-sql's delayed subscriber reads it.
		delayed = `(metadata->>'_watermill_delayed_until')::timestamptz`
	}
	rows, err := q.Query(ctx, `SELECT (`+tx+`)::text::numeric::bigint, "offset"::bigint, uuid::text, `+payload+`,
	COALESCE(metadata::text, ''), created_at::timestamptz, `+delayed+`
FROM `+pgx.Identifier{table}.Sanitize()+`
WHERE `+where+`
ORDER BY `+order+`
LIMIT $3`, fmt.Sprint(after.TransactionID), after.Offset, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (wmMessage, error) {
		var m wmMessage
		var tx int64
		err := row.Scan(&tx, &m.Offset, &m.UUID, &m.Payload, &m.Metadata, &m.CreatedAt, &m.DelayedUntil)
		m.TransactionID = uint64(tx)
		return m, err
	})
}

// wmCountBetween counts the messages of table with a position in
// (from, to], in watermill-sql's order.
func wmCountBetween(ctx context.Context, q querier, table string, kind wmKind, from, to wmPosition) (int64, error) {
	where := `"offset" > $2 AND "offset" <= $4 AND $1::text IS NOT NULL AND $3::text IS NOT NULL`
	if kind == wmKindXID {
		where = `(transaction_id, "offset") > ($1::text::xid8, $2) AND (transaction_id, "offset") <= ($3::text::xid8, $4)`
	}
	rows, err := q.Query(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE `+where,
		fmt.Sprint(from.TransactionID), from.Offset, fmt.Sprint(to.TransactionID), to.Offset)
	if err != nil {
		return 0, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
}

// importCreateTables creates the import's own tables.
func importCreateTables(ctx context.Context, q querier, t *pgsql.Tables) error {
	_, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+importTable(t, ImportRunsTable)+` (
	topic               text COLLATE "C" NOT NULL,
	run                 integer NOT NULL,
	source_table        text NOT NULL,
	source_kind         text NOT NULL,
	-- The pglease position of the messages this run copied: transaction_id
	-- and the offsets first_offset..last_offset (none when first > last).
	transaction_id      xid8 NOT NULL,
	first_offset        bigint NOT NULL,
	last_offset         bigint NOT NULL,
	-- The watermill-sql positions it copied: after (from_...), up to and
	-- including (to_...).
	from_transaction_id xid8 NOT NULL,
	from_offset         bigint NOT NULL,
	to_transaction_id   xid8 NOT NULL,
	to_offset           bigint NOT NULL,
	delayed             bigint NOT NULL DEFAULT 0,
	imported_at         timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (topic, run)
);
CREATE TABLE IF NOT EXISTS `+importTable(t, ImportGroupsTable)+` (
	topic                text COLLATE "C" NOT NULL,
	consumer_group       text NOT NULL,
	-- What the import wrote into the group's offset row.
	acked_transaction_id xid8 NOT NULL,
	acked_offset         bigint NOT NULL,
	-- The group's watermill-sql position it came from.
	source_transaction_id xid8 NOT NULL,
	source_offset        bigint NOT NULL,
	imported_at          timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (topic, consumer_group)
)`)
	return err
}

// importLockTopic serializes imports of one topic into one set of pglease
// tables, until the transaction ends.
func importLockTopic(ctx context.Context, q querier, t *pgsql.Tables, topic string) error {
	_, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
		"pglease import watermill-sql "+t.Messages+" "+topic)
	return err
}

// importRun is one recorded run of the import of a topic.
type importRun struct {
	Run           int
	TransactionID uint64
	FirstOffset   int64
	LastOffset    int64
	From          wmPosition
	To            wmPosition
}

func (r importRun) empty() bool { return r.FirstOffset > r.LastOffset }

// importRuns returns the recorded runs of topic, oldest first.
func importRuns(ctx context.Context, q querier, t *pgsql.Tables, topic string) ([]importRun, error) {
	rows, err := q.Query(ctx, `SELECT run, transaction_id::text, first_offset, last_offset,
	from_transaction_id::text, from_offset, to_transaction_id::text, to_offset
FROM `+importTable(t, ImportRunsTable)+` WHERE topic = $1 ORDER BY run`, topic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (importRun, error) {
		var r importRun
		var tx, fromTx, toTx string
		if err := row.Scan(&r.Run, &tx, &r.FirstOffset, &r.LastOffset, &fromTx, &r.From.Offset, &toTx, &r.To.Offset); err != nil {
			return r, err
		}
		var err error
		if r.TransactionID, err = parseXID8(tx); err != nil {
			return r, err
		}
		if r.From.TransactionID, err = parseXID8(fromTx); err != nil {
			return r, err
		}
		r.To.TransactionID, err = parseXID8(toTx)
		return r, err
	})
}

// importInsertRun records a run.
func importInsertRun(ctx context.Context, q querier, t *pgsql.Tables, topic, sourceTable string, kind wmKind, r importRun, delayed int64) error {
	_, err := q.Exec(ctx, `INSERT INTO `+importTable(t, ImportRunsTable)+` (topic, run, source_table, source_kind,
	transaction_id, first_offset, last_offset, from_transaction_id, from_offset, to_transaction_id, to_offset, delayed)
VALUES ($1, $2, $3, $4, $5::text::xid8, $6, $7, $8::text::xid8, $9, $10::text::xid8, $11, $12)`,
		topic, r.Run, sourceTable, kind.String(), strconv.FormatUint(r.TransactionID, 10), r.FirstOffset, r.LastOffset,
		strconv.FormatUint(r.From.TransactionID, 10), r.From.Offset, strconv.FormatUint(r.To.TransactionID, 10), r.To.Offset, delayed)
	return err
}

// importTopicState is what pglease holds of a topic before a run: its
// partition count, the first message of partition 0, whether any group
// has an offset row of it, and the transaction id of the import.
type importTopicState struct {
	Partitions int
	FirstTx    *string // xid8 as text; nil without messages
	HasOffsets bool
	CurrentTx  string
}

func importReadTopic(ctx context.Context, q querier, t *pgsql.Tables, topic string) (importTopicState, error) {
	rows, err := q.Query(ctx, `SELECT
	COALESCE((SELECT partitions FROM `+t.Topics+` WHERE topic = $1), 1),
	(SELECT min(m.transaction_id)::text FROM `+t.Messages+` m WHERE m.topic = $1 AND m.partition = 0),
	EXISTS (SELECT 1 FROM `+t.Offsets+` o WHERE o.topic = $1),
	pg_current_xact_id()::text`, topic)
	if err != nil {
		return importTopicState{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[importTopicState])
}

// importOffsetRow is a pglease offset row of partition 0 of a topic, and
// what the import recorded of it (nil when it did not create it).
type importOffsetRow struct {
	ConsumerGroup string
	Position      Position
	Epoch         int64
	Recorded      *Position
}

func importOffsetRows(ctx context.Context, q querier, t *pgsql.Tables, topic string) ([]importOffsetRow, error) {
	rows, err := q.Query(ctx, `SELECT o.consumer_group, o.acked_transaction_id::text, o.acked_offset, o.epoch,
	g.acked_transaction_id::text, g.acked_offset
FROM `+t.Offsets+` o
LEFT JOIN `+importTable(t, ImportGroupsTable)+` g ON g.topic = o.topic AND g.consumer_group = o.consumer_group
WHERE o.topic = $1 AND o.partition = 0`, topic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (importOffsetRow, error) {
		var (
			r          importOffsetRow
			tx         string
			recTx      *string
			recOffset  *int64
			err        error
			recordedTx uint64
		)
		if err := row.Scan(&r.ConsumerGroup, &tx, &r.Position.Offset, &r.Epoch, &recTx, &recOffset); err != nil {
			return r, err
		}
		if r.Position.TransactionID, err = parseXID8(tx); err != nil {
			return r, err
		}
		if recTx != nil && recOffset != nil {
			if recordedTx, err = parseXID8(*recTx); err != nil {
				return r, err
			}
			r.Recorded = &Position{TransactionID: recordedTx, Offset: *recOffset}
		}
		return r, nil
	})
}

// importInsertMessages stores messages in partition 0 of topic at the
// positions (tx, offsets[i]), created at createdAt[i].
func importInsertMessages(ctx context.Context, q querier, t *pgsql.Tables, topic string, tx uint64,
	offsets []int64, uuids []string, payloads [][]byte, metadata []string, createdAt []time.Time) error {
	_, err := q.Exec(ctx, `INSERT INTO `+t.Messages+` (topic, partition, transaction_id, "offset", uuid, payload, metadata, created_at)
OVERRIDING SYSTEM VALUE
SELECT $1, 0, $2::text::xid8, m.off, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb, m.created_at
FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::text[], $7::timestamptz[]) AS m(off, uuid, payload, metadata, created_at)`,
		topic, strconv.FormatUint(tx, 10), offsets, uuids, payloads, metadata, createdAt)
	return err
}

// importNotify wakes the Subscribers of partition 0 of topic, when the
// transaction commits.
func importNotify(ctx context.Context, q querier, t *pgsql.Tables, topic string) error {
	_, err := q.Exec(ctx, `SELECT pg_notify($1, 'm' || $2)`, t.NotifyChannel, topic)
	return err
}

// importCreateOffset creates a group's offset row of partition 0 of topic
// at pos. It reports false when the row exists already.
func importCreateOffset(ctx context.Context, q querier, t *pgsql.Tables, group, topic string, pos Position) (bool, error) {
	tag, err := q.Exec(ctx, `INSERT INTO `+t.Offsets+` (consumer_group, topic, partition, acked_transaction_id, acked_offset)
VALUES ($1, $2, 0, $3::text::xid8, $4)
ON CONFLICT DO NOTHING`, group, topic, strconv.FormatUint(pos.TransactionID, 10), pos.Offset)
	return tag.RowsAffected() == 1, err
}

// importMoveOffset moves a group's offset row from old to pos, only while
// it was never claimed (epoch 0) and is still at old. It reports whether
// it moved it.
func importMoveOffset(ctx context.Context, q querier, t *pgsql.Tables, group, topic string, old, pos Position) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE `+t.Offsets+`
SET acked_transaction_id = $5::text::xid8, acked_offset = $6, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = 0 AND epoch = 0 AND session_id IS NULL
	AND acked_transaction_id = $3::text::xid8 AND acked_offset = $4`,
		group, topic, strconv.FormatUint(old.TransactionID, 10), old.Offset, strconv.FormatUint(pos.TransactionID, 10), pos.Offset)
	return tag.RowsAffected() == 1, err
}

// importRecordGroup records the position the import gave a group, and the
// watermill-sql position it came from.
func importRecordGroup(ctx context.Context, q querier, t *pgsql.Tables, topic, group string, pos Position, source wmPosition) error {
	_, err := q.Exec(ctx, `INSERT INTO `+importTable(t, ImportGroupsTable)+` AS g
	(topic, consumer_group, acked_transaction_id, acked_offset, source_transaction_id, source_offset)
VALUES ($1, $2, $3::text::xid8, $4, $5::text::xid8, $6)
ON CONFLICT (topic, consumer_group) DO UPDATE SET acked_transaction_id = EXCLUDED.acked_transaction_id,
	acked_offset = EXCLUDED.acked_offset, source_transaction_id = EXCLUDED.source_transaction_id,
	source_offset = EXCLUDED.source_offset, imported_at = now()`,
		topic, group, strconv.FormatUint(pos.TransactionID, 10), pos.Offset, strconv.FormatUint(source.TransactionID, 10), source.Offset)
	return err
}

// importNow is the destination's clock.
func importNow(ctx context.Context, q querier) (time.Time, error) {
	rows, err := q.Query(ctx, `SELECT now()`)
	if err != nil {
		return time.Time{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[time.Time])
}
