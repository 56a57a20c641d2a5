package pgsql

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of pglease's ImportWatermillSQL. Each is built by an
// unexported function (or method of Tables) and run by the function of the
// same name, exported.
//
// The source side (WM...) reads watermill-sql's tables, named
// "watermill_<topic>" and "watermill_offsets_<topic>" in the source
// connection's search_path, as watermill-sql names them; every name is
// quoted and every value is a parameter. The destination side (Import...)
// writes pglease's tables and the import's own.

// Names of the import's own tables, in the schema of the pglease tables
// (pglease exports them as ImportRunsTable and ImportGroupsTable). The
// import creates them ([ImportCreateTables]); they are not part of the
// migrations.
const (
	ImportRunsTable   = "pglease_import_watermill_sql"
	ImportGroupsTable = "pglease_import_watermill_sql_groups"
)

// importRunsTable is the quoted name of [ImportRunsTable], in the schema
// of t.
func (t *Tables) importRunsTable() string { return t.ident("", ImportRunsTable) }

// importGroupsTable is the quoted name of [ImportGroupsTable], in the
// schema of t.
func (t *Tables) importGroupsTable() string { return t.ident("", ImportGroupsTable) }

// --- the source: watermill-sql's tables

// WMKind is the shape of a watermill-sql messages table.
type WMKind int

// The shapes of a watermill-sql messages table.
const (
	WMKindXID    WMKind = iota // transaction_id xid8, ordered by (transaction_id, offset)
	WMKindOffset               // no transaction_id: ordered by offset
	WMKindQueue                // v4's queue schema (delayed pub/sub): acked column, no groups
)

// String is the kind as the import reports and records it.
func (k WMKind) String() string {
	switch k {
	case WMKindXID:
		return "transaction_id"
	case WMKindOffset:
		return "offset"
	default:
		return "queue"
	}
}

// WMColumn is one column of a source table.
type WMColumn struct {
	Name string
	Type string // format_type, e.g. "bigint", "character varying(36)"
}

func wmTableColumns(table string) Stmt {
	return Stmt{SQL: `SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = pg_catalog.to_regclass($1)::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, Args: []any{pgx.Identifier{table}.Sanitize()}}
}

// WMTableColumns returns the columns of table (an unqualified name found
// through the search_path, as watermill-sql finds it), none when there is
// no such table.
func WMTableColumns(ctx context.Context, q Querier, table string) ([]WMColumn, error) {
	return collect(ctx, q, wmTableColumns(table), pgx.RowToStructByPos[WMColumn])
}

func wmTopicTables() Stmt {
	return Stmt{SQL: `SELECT c.relname::text, pg_catalog.pg_get_userbyid(c.relowner)::text,
	(SELECT pg_catalog.pg_get_userbyid(o.relowner)::text FROM pg_catalog.pg_class o
		WHERE o.oid = pg_catalog.to_regclass(pg_catalog.quote_ident('watermill_offsets_' || pg_catalog.substr(c.relname::text, 11)))),
	current_user::text
FROM pg_catalog.pg_class c
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'watermill\_%' AND pg_catalog.pg_table_is_visible(c.oid)
	AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = c.oid AND a.attname = 'consumer_group' AND NOT a.attisdropped)
ORDER BY c.relname`}
}

// WMTopicTable is a table of the search_path that looks like a
// watermill-sql messages table, with its owner, the owner of its offsets
// table (nil: none) and the role that reads them.
type WMTopicTable struct {
	Name, Owner  string
	OffsetsOwner *string
	CurrentUser  string
}

// WMTopicTables returns the tables in the search_path that look like
// watermill-sql messages tables: named "watermill_" and something,
// without a consumer_group column (those are offsets tables).
func WMTopicTables(ctx context.Context, q Querier) ([]WMTopicTable, error) {
	return collect(ctx, q, wmTopicTables(), pgx.RowToStructByPos[WMTopicTable])
}

// WMGroup is one consumer group's row of a watermill offsets table.
type WMGroup struct {
	ConsumerGroup string
	TransactionID uint64
	Offset        int64
}

func wmGroups(table string, withXID bool) Stmt {
	tx := `'0'`
	if withXID {
		tx = `last_processed_transaction_id`
	}
	return Stmt{SQL: `SELECT consumer_group::text, (` + tx + `)::text::numeric::bigint, COALESCE(offset_acked, 0)::bigint
FROM ` + pgx.Identifier{table}.Sanitize() + `
ORDER BY consumer_group`}
}

// WMGroups reads a watermill offsets table. withXID: the table has
// last_processed_transaction_id (the schema that orders by transaction id).
func WMGroups(ctx context.Context, q Querier, table string, withXID bool) ([]WMGroup, error) {
	return collect(ctx, q, wmGroups(table, withXID), func(row pgx.CollectableRow) (WMGroup, error) {
		var g WMGroup
		var tx int64
		if err := row.Scan(&g.ConsumerGroup, &tx, &g.Offset); err != nil {
			return g, err
		}
		g.TransactionID = uint64(tx)
		return g, nil
	})
}

// WMMessagesParams are the arguments of [WMMessagesAfter].
type WMMessagesParams struct {
	Table string
	// Kind says how the table orders (and for queue tables, that
	// acknowledged rows are left out).
	Kind WMKind
	// PayloadType is the payload column's type: json, jsonb, text or
	// bytea.
	PayloadType string
	// After is the position after which to read (the transaction id 0
	// for tables ordered by offset alone).
	After Position
	Limit int
}

// WMMessage is one message read from a watermill messages table.
type WMMessage struct {
	TransactionID uint64
	Offset        int64
	UUID          string
	Payload       []byte
	Metadata      string    // JSON text, "" for NULL
	CreatedAt     time.Time // the source's created_at, in the source's time zone
	DelayedUntil  *time.Time
}

func wmMessagesAfter(p WMMessagesParams) Stmt {
	payload := `payload`
	if p.PayloadType != "bytea" {
		payload = `pg_catalog.convert_to(payload::text, 'UTF8')`
	}
	// $1 is the transaction id of after, used only by the tables ordered
	// by it.
	tx, where, order := `'0'`, `"offset" > $2 AND $1::text IS NOT NULL`, `"offset"`
	switch p.Kind {
	case WMKindXID:
		tx, where, order = `transaction_id`, `(transaction_id, "offset") > ($1::text::xid8, $2)`, `transaction_id, "offset"`
	case WMKindQueue:
		where += ` AND NOT acked`
	}
	delayed := `NULL::timestamptz`
	if p.Kind == WMKindQueue {
		// As watermill-sql's delayed subscriber reads it.
		delayed = `(metadata->>'_watermill_delayed_until')::timestamptz`
	}
	return Stmt{SQL: `SELECT (` + tx + `)::text::numeric::bigint, "offset"::bigint, uuid::text, ` + payload + `,
	COALESCE(metadata::text, ''), created_at::timestamptz, ` + delayed + `
FROM ` + pgx.Identifier{p.Table}.Sanitize() + `
WHERE ` + where + `
ORDER BY ` + order + `
LIMIT $3`, Args: []any{fmt.Sprint(p.After.TransactionID), p.After.Offset, p.Limit}}
}

// WMMessagesAfter returns up to p.Limit messages of p.Table after
// p.After, in watermill-sql's delivery order.
func WMMessagesAfter(ctx context.Context, q Querier, p WMMessagesParams) ([]WMMessage, error) {
	return collect(ctx, q, wmMessagesAfter(p), func(row pgx.CollectableRow) (WMMessage, error) {
		var m WMMessage
		var tx int64
		err := row.Scan(&tx, &m.Offset, &m.UUID, &m.Payload, &m.Metadata, &m.CreatedAt, &m.DelayedUntil)
		m.TransactionID = uint64(tx)
		return m, err
	})
}

func wmCountBetween(table string, kind WMKind, from, to Position) Stmt {
	where := `"offset" > $2 AND "offset" <= $4 AND $1::text IS NOT NULL AND $3::text IS NOT NULL`
	if kind == WMKindXID {
		where = `(transaction_id, "offset") > ($1::text::xid8, $2) AND (transaction_id, "offset") <= ($3::text::xid8, $4)`
	}
	return Stmt{SQL: `SELECT pg_catalog.count(*) FROM ` + pgx.Identifier{table}.Sanitize() + ` WHERE ` + where,
		Args: []any{fmt.Sprint(from.TransactionID), from.Offset, fmt.Sprint(to.TransactionID), to.Offset}}
}

// WMCountBetween counts the messages of table with a position in
// (from, to], in watermill-sql's order.
func WMCountBetween(ctx context.Context, q Querier, table string, kind WMKind, from, to Position) (int64, error) {
	s := wmCountBetween(table, kind, from, to)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return 0, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
}

// --- the destination: pglease's tables and the import's own

func (t *Tables) importCreateTables() Stmt {
	return Stmt{SQL: `CREATE TABLE IF NOT EXISTS ` + t.importRunsTable() + ` (
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
	imported_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (topic, run)
);
CREATE TABLE IF NOT EXISTS ` + t.importGroupsTable() + ` (
	topic                text COLLATE "C" NOT NULL,
	consumer_group       text NOT NULL,
	-- What the import wrote into the group's offset row.
	acked_transaction_id xid8 NOT NULL,
	acked_offset         bigint NOT NULL,
	-- The group's watermill-sql position it came from.
	source_transaction_id xid8 NOT NULL,
	source_offset        bigint NOT NULL,
	imported_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (topic, consumer_group)
)`}
}

// ImportCreateTables creates the import's own tables.
func ImportCreateTables(ctx context.Context, q Querier, t *Tables) error {
	_, err := exec(ctx, q, t.importCreateTables())
	return err
}

func (t *Tables) importLockTopic(topic string) Stmt {
	return Stmt{SQL: `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1, 0))`,
		Args: []any{"pglease import watermill-sql " + t.Messages + " " + topic}}
}

// ImportLockTopic serializes imports of one topic into one set of pglease
// tables, until the transaction ends.
func ImportLockTopic(ctx context.Context, q Querier, t *Tables, topic string) error {
	_, err := exec(ctx, q, t.importLockTopic(topic))
	return err
}

// ImportRun is one recorded run of the import of a topic.
type ImportRun struct {
	Run           int
	TransactionID uint64
	FirstOffset   int64
	LastOffset    int64
	From          Position // watermill-sql's position the run copied after
	To            Position // and up to
}

func (t *Tables) importRuns(topic string) Stmt {
	return Stmt{SQL: `SELECT run, transaction_id::text, first_offset, last_offset,
	from_transaction_id::text, from_offset, to_transaction_id::text, to_offset
FROM ` + t.importRunsTable() + ` WHERE topic = $1 ORDER BY run`, Args: []any{topic}}
}

// ImportRuns returns the recorded runs of topic, oldest first.
func ImportRuns(ctx context.Context, q Querier, t *Tables, topic string) ([]ImportRun, error) {
	return collect(ctx, q, t.importRuns(topic), func(row pgx.CollectableRow) (ImportRun, error) {
		var r ImportRun
		err := row.Scan(&r.Run, (*xid8)(&r.TransactionID), &r.FirstOffset, &r.LastOffset,
			(*xid8)(&r.From.TransactionID), &r.From.Offset, (*xid8)(&r.To.TransactionID), &r.To.Offset)
		return r, err
	})
}

// ImportRunParams are the arguments of [ImportInsertRun].
type ImportRunParams struct {
	Topic       string
	SourceTable string
	Kind        WMKind
	Run         ImportRun
	Delayed     int64
}

func (t *Tables) importInsertRun(p ImportRunParams) Stmt {
	r := p.Run
	return Stmt{SQL: `INSERT INTO ` + t.importRunsTable() + ` (topic, run, source_table, source_kind,
	transaction_id, first_offset, last_offset, from_transaction_id, from_offset, to_transaction_id, to_offset, delayed)
VALUES ($1, $2, $3, $4, $5::text::xid8, $6, $7, $8::text::xid8, $9, $10::text::xid8, $11, $12)`,
		Args: []any{p.Topic, r.Run, p.SourceTable, p.Kind.String(), formatXID8(r.TransactionID), r.FirstOffset, r.LastOffset,
			formatXID8(r.From.TransactionID), r.From.Offset, formatXID8(r.To.TransactionID), r.To.Offset, p.Delayed}}
}

// ImportInsertRun records a run.
func ImportInsertRun(ctx context.Context, q Querier, t *Tables, p ImportRunParams) error {
	_, err := exec(ctx, q, t.importInsertRun(p))
	return err
}

// ImportTopicState is what pglease holds of a topic before a run: its
// partition count, the first message of partition 0, whether any group
// has an offset row of it, and the transaction id of the import.
type ImportTopicState struct {
	Partitions int
	FirstTx    *uint64 // nil without messages
	HasOffsets bool
	CurrentTx  uint64
}

func (t *Tables) importReadTopic(topic string) Stmt {
	return Stmt{SQL: `SELECT
	COALESCE((SELECT partitions FROM ` + t.Topics + ` WHERE topic = $1), 1),
	(SELECT pg_catalog.min(m.transaction_id)::text FROM ` + t.Messages + ` m WHERE m.topic = $1 AND m.partition = 0),
	EXISTS (SELECT 1 FROM ` + t.Offsets + ` o WHERE o.topic = $1),
	pg_catalog.pg_current_xact_id()::text`, Args: []any{topic}}
}

// ImportReadTopic reads the [ImportTopicState] of topic. Where positions
// come from the sequence (schema version 14, a single node), CurrentTx is
// a position the import's transaction takes as a publisher of the
// topic's partition 0 does: registered first (a write lock on the
// messages table, the sequence's last value and the topic's key locked,
// see migration 14), so that no reader passes it while the import runs.
func ImportReadTopic(ctx context.Context, q Querier, t *Tables, topic string) (ImportTopicState, error) {
	var sequence bool
	if err := q.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1::text) IS NOT NULL`, t.PositionSequence()).Scan(&sequence); err != nil {
		return ImportTopicState{}, err
	}
	var position *uint64
	if sequence {
		p, err := importRegister(ctx, q, t, topic)
		if err != nil {
			return ImportTopicState{}, err
		}
		position = &p
	}
	s := t.importReadTopic(topic)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return ImportTopicState{}, err
	}
	st, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (ImportTopicState, error) {
		var st ImportTopicState
		var first *xid8
		if err := row.Scan(&st.Partitions, &first, &st.HasOffsets, (*xid8)(&st.CurrentTx)); err != nil {
			return st, err
		}
		if first != nil {
			tx := uint64(*first)
			st.FirstTx = &tx
		}
		return st, nil
	})
	if err == nil && position != nil {
		st.CurrentTx = *position
	}
	return st, err
}

// importRegister registers the import's transaction for topic's partition
// 0 as the position trigger of migration 14 registers a publisher, one
// statement after the other, and returns the position it takes after.
func importRegister(ctx context.Context, q Querier, t *Tables, topic string) (uint64, error) {
	steps := []string{
		`LOCK TABLE ` + t.Messages + ` IN ROW EXCLUSIVE MODE`,
		`SELECT pg_catalog.pg_advisory_xact_lock_shared(8070450532247928832 | CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END)
FROM ` + t.PositionSequence() + ` s`,
		`SELECT pg_catalog.pg_advisory_xact_lock_shared((c.oid::bigint - CASE WHEN c.oid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer,
	pg_catalog.hashtext($1::text || ':0'))
FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass(` + quoteLiteral(t.Messages) + `)`,
	}
	for i, sql := range steps {
		var args []any
		if i == 2 {
			args = []any{topic}
		}
		if _, err := q.Exec(ctx, sql, args...); err != nil {
			return 0, err
		}
	}
	var p uint64
	err := q.QueryRow(ctx, `SELECT pg_catalog.nextval(`+quoteLiteral(t.PositionSequence())+`::regclass)`).Scan(&p)
	return p, err
}

// ImportOffsetRow is a pglease offset row of partition 0 of a topic, and
// what the import recorded of it (nil when it did not create it).
type ImportOffsetRow struct {
	ConsumerGroup string
	Position      Position
	Epoch         int64
	Recorded      *Position
}

func (t *Tables) importOffsetRows(topic string) Stmt {
	return Stmt{SQL: `SELECT o.consumer_group, o.acked_transaction_id::text, o.acked_offset, o.epoch,
	g.acked_transaction_id::text, g.acked_offset
FROM ` + t.Offsets + ` o
LEFT JOIN ` + t.importGroupsTable() + ` g ON g.topic = o.topic AND g.consumer_group = o.consumer_group
WHERE o.topic = $1 AND o.partition = 0`, Args: []any{topic}}
}

// ImportOffsetRows returns the offset rows of partition 0 of topic.
func ImportOffsetRows(ctx context.Context, q Querier, t *Tables, topic string) ([]ImportOffsetRow, error) {
	return collect(ctx, q, t.importOffsetRows(topic), func(row pgx.CollectableRow) (ImportOffsetRow, error) {
		var (
			r         ImportOffsetRow
			recTx     *xid8
			recOffset *int64
		)
		if err := row.Scan(&r.ConsumerGroup, (*xid8)(&r.Position.TransactionID), &r.Position.Offset, &r.Epoch,
			&recTx, &recOffset); err != nil {
			return r, err
		}
		if recTx != nil && recOffset != nil {
			r.Recorded = &Position{TransactionID: uint64(*recTx), Offset: *recOffset}
		}
		return r, nil
	})
}

// ImportMessagesParams are the arguments of [ImportInsertMessages]: the
// messages, one per element of each slice.
type ImportMessagesParams struct {
	Topic         string
	TransactionID uint64
	Offsets       []int64
	UUIDs         []string
	Payloads      [][]byte
	Metadata      []string // JSON text, "" for NULL
	CreatedAt     []time.Time
}

func (t *Tables) importInsertMessages(p ImportMessagesParams) Stmt {
	return Stmt{SQL: `INSERT INTO ` + t.Messages + ` (topic, partition, transaction_id, "offset", uuid, payload, metadata, created_at)
OVERRIDING SYSTEM VALUE
SELECT $1, 0, $2::text::xid8, m.off, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb, m.created_at
FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::text[], $7::timestamptz[]) AS m(off, uuid, payload, metadata, created_at)`,
		Args: []any{p.Topic, formatXID8(p.TransactionID), p.Offsets, p.UUIDs, p.Payloads, p.Metadata, p.CreatedAt}}
}

// ImportInsertMessages stores messages in partition 0 of p.Topic at the
// positions (p.TransactionID, p.Offsets[i]), created at p.CreatedAt[i].
//
// The messages table's trigger sets the position of every row inserted
// (see migration 12) unless the transaction asked to keep them
// (pglease.keep_positions) and its role is a member of the table's owner:
// the import asks, for the rest of its transaction; run by another role,
// its rows get the position of its transaction and the time of now.
func ImportInsertMessages(ctx context.Context, q Querier, t *Tables, p ImportMessagesParams) error {
	if _, err := q.Exec(ctx, `SELECT pg_catalog.set_config('pglease.keep_positions', 'on', true)`); err != nil {
		return err
	}
	_, err := exec(ctx, q, t.importInsertMessages(p))
	return err
}

func (t *Tables) importNotify(topic string) Stmt {
	return Stmt{SQL: `SELECT pg_catalog.pg_notify($1, 'm' || $2)`, Args: []any{t.NotifyChannel, topic}}
}

// ImportNotify wakes the Subscribers of partition 0 of topic, when the
// transaction commits.
func ImportNotify(ctx context.Context, q Querier, t *Tables, topic string) error {
	_, err := exec(ctx, q, t.importNotify(topic))
	return err
}

func (t *Tables) importCreateOffset(group, topic string, pos Position) Stmt {
	return Stmt{SQL: `INSERT INTO ` + t.Offsets + ` (consumer_group, topic, partition, acked_transaction_id, acked_offset)
VALUES ($1, $2, 0, $3::text::xid8, $4)
ON CONFLICT DO NOTHING`, Args: []any{group, topic, formatXID8(pos.TransactionID), pos.Offset}}
}

// ImportCreateOffset creates a group's offset row of partition 0 of topic
// at pos. It reports false when the row exists already.
func ImportCreateOffset(ctx context.Context, q Querier, t *Tables, group, topic string, pos Position) (bool, error) {
	n, err := exec(ctx, q, t.importCreateOffset(group, topic, pos))
	return n == 1, err
}

func (t *Tables) importMoveOffset(group, topic string, old, pos Position) Stmt {
	return Stmt{SQL: `UPDATE ` + t.Offsets + `
SET acked_transaction_id = $5::text::xid8, acked_offset = $6, updated_at = pg_catalog.now()
WHERE consumer_group = $1 AND topic = $2 AND partition = 0 AND epoch = 0 AND session_id IS NULL
	AND acked_transaction_id = $3::text::xid8 AND acked_offset = $4
	AND (acked_transaction_id, acked_offset) < ($5::text::xid8, $6::bigint)`,
		Args: []any{group, topic, formatXID8(old.TransactionID), old.Offset, formatXID8(pos.TransactionID), pos.Offset}}
}

// ImportMoveOffset moves a group's offset row from old forward to pos,
// only while it was never claimed (epoch 0) and is still at old. It
// reports whether it moved it: never when pos is not ahead of old.
func ImportMoveOffset(ctx context.Context, q Querier, t *Tables, group, topic string, old, pos Position) (bool, error) {
	n, err := exec(ctx, q, t.importMoveOffset(group, topic, old, pos))
	return n == 1, err
}

func (t *Tables) importRecordGroup(topic, group string, pos, source Position) Stmt {
	return Stmt{SQL: `INSERT INTO ` + t.importGroupsTable() + ` AS g
	(topic, consumer_group, acked_transaction_id, acked_offset, source_transaction_id, source_offset)
VALUES ($1, $2, $3::text::xid8, $4, $5::text::xid8, $6)
ON CONFLICT (topic, consumer_group) DO UPDATE SET acked_transaction_id = EXCLUDED.acked_transaction_id,
	acked_offset = EXCLUDED.acked_offset, source_transaction_id = EXCLUDED.source_transaction_id,
	source_offset = EXCLUDED.source_offset, imported_at = pg_catalog.now()`,
		Args: []any{topic, group, formatXID8(pos.TransactionID), pos.Offset, formatXID8(source.TransactionID), source.Offset}}
}

// ImportRecordGroup records the position pos the import gave a group, and
// the watermill-sql position source it came from.
func ImportRecordGroup(ctx context.Context, q Querier, t *Tables, topic, group string, pos, source Position) error {
	_, err := exec(ctx, q, t.importRecordGroup(topic, group, pos, source))
	return err
}

func importNow() Stmt { return Stmt{SQL: `SELECT pg_catalog.now()`} }

// ImportNow is the destination's clock.
func ImportNow(ctx context.Context, q Querier) (time.Time, error) {
	s := importNow()
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return time.Time{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[time.Time])
}
