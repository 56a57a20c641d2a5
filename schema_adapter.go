package pglease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Default table names of [DefaultSchemaAdapter].
const (
	DefaultMessagesTable         = "pglease_messages"
	DefaultConsumerSessionsTable = "pglease_consumer_sessions"
	DefaultConsumerOffsetsTable  = "pglease_consumer_offsets"
	DefaultSchemaVersionTable    = "pglease_schema_version"
	DefaultTopicsTable           = "pglease_topics"
	DefaultDelayedTable          = "pglease_delayed"
	DefaultMaintenanceTable      = "pglease_maintenance"
	DefaultRetentionTable        = "pglease_retention"
)

// Query is one SQL statement and its parameters, as built by a [SchemaAdapter].
type Query struct {
	SQL  string
	Args []any
}

// Migration is one step of a versioned schema. Versions start at 1 and grow
// by one; a step runs once, in a transaction, under an advisory lock.
type Migration struct {
	Version     int
	Description string
	SQL         string
}

// InsertMessagesParams are the messages of one or more Publish calls,
// written by one statement. The slices have one element per message, in
// publish order.
type InsertMessagesParams struct {
	Topics   []string
	UUIDs    []string
	Payloads [][]byte
	Metadata []string // JSON objects; "" stores NULL (no metadata)
	// PartitionHashes are the hashes of the messages' partition keys
	// (see [PartitionOf]): a message goes to partition hash mod the
	// topic's partition count, read from the topics table by the
	// statement itself. Nil (no message has a key) spreads the messages
	// over the partitions by a hash of their UUID computed by the server.
	PartitionHashes []uint32
	// NotifyChannel, when not empty, is the channel notified once per
	// distinct topic when the statement's transaction commits.
	NotifyChannel string
	// DueAt, when not nil, holds one time per message: the message is
	// delayed until then (Watermill's delay metadata). Only
	// [MaintenanceAdapter.InsertDelayed] uses it.
	DueAt []time.Time
}

// SelectMessagesParams select the next messages of a topic after a position.
type SelectMessagesParams struct {
	Topic     string
	Partition int32
	After     Position
	Limit     int
	// MaxMessageBytes, when positive, is the size of the largest message
	// returned whole: a larger one is returned without its payload and
	// metadata (see [SchemaAdapter.SelectMessages]).
	MaxMessageBytes int64
}

// VisibleTopicsParams list (topic, partition) rows with a position each;
// the query returns the (1-based) index of every row that has a message
// visible to all readers after its position.
type VisibleTopicsParams struct {
	Topics     []string
	Partitions []int32 // nil: partition 0 of each topic
	Positions  []Position
}

// TopicParams are the settings of one topic.
type TopicParams struct {
	Topic      string
	Partitions int
	// Retention is how long the topic's messages are kept (0: forever),
	// and RetentionClass its class (see [DefaultSchemaAdapter.Migrations],
	// version 6), 0 for no retention.
	Retention      time.Duration
	RetentionClass int
	// NotifyChannel, when not empty, is notified with "p" + topic when the
	// statement creates the topic or raises its partition count.
	NotifyChannel string
}

// TopicsParams name topics whose settings are read together.
type TopicsParams struct {
	Topics []string
}

// SessionParams identify a consumer session.
type SessionParams struct {
	SessionID uuid.UUID
	// NotifyChannel, when not empty, is notified with "g" + consumer group
	// when a session starts or ends or changes its subscriptions, to wake
	// the other members of the group.
	NotifyChannel string
	// SubscriptionHash and SubscriptionSize describe the rows the session
	// subscribes to (see [DefaultSchemaAdapter.GroupMembers]).
	SubscriptionHash int64
	SubscriptionSize int
	// ReplacesSessionID, when not uuid.Nil, is an older session of the same
	// Subscriber that is deleted in the same statement that creates SessionID.
	ReplacesSessionID uuid.UUID
	ConsumerGroup     string
	Owner             string
	TTL               time.Duration
}

// GroupParams select the sessions of a consumer group.
type GroupParams struct {
	ConsumerGroup string
}

// OffsetsParams name many (topic, partition) rows of one consumer group for
// statements that handle them together.
type OffsetsParams struct {
	ConsumerGroup string
	Topics        []string
	Partitions    []int32 // one per topic; nil: partition 0 of each topic
	SessionID     uuid.UUID
	// Limit bounds the rows a claim takes.
	Limit int
	// Latest makes EnsureOffsets create the rows of a topic the group has
	// no row of at all at the end of the topic (every message visible now
	// counts as acknowledged) instead of at the beginning. The rows of a
	// topic the group already has a row of (partitions added after it
	// started on the topic, a row deleted by hand) start at the beginning
	// all the same: their messages were published after the group started.
	Latest bool
}

// OffsetParams identify one (consumer group, topic, partition) row and, for
// fenced statements, the session and epoch that must still own it.
type OffsetParams struct {
	ConsumerGroup string
	Topic         string
	Partition     int32
	SessionID     uuid.UUID
	Epoch         int64
	// Position is the acknowledged position written by commit and release.
	Position Position
	// Version, when not empty, is where CommitOffset last wrote the row:
	// the tuple id (ctid, as text) of the version it returned. The commit
	// tries that version first, which costs one block read however many
	// older versions a held vacuum horizon keeps, and looks the row up by
	// its key only when that version is no longer the row's latest. It is
	// a hint: the statement's conditions decide as without it.
	Version string
	// NotifyChannel, when not empty, is notified with "r" + topic when a
	// release frees the row, to wake waiting Subscribers.
	NotifyChannel string
}

// SchemaAdapter owns every SQL statement pglease runs and the names of the
// tables it runs them on. [DefaultSchemaAdapter] is the implementation for
// PostgreSQL; a custom adapter may change names, types or indexes, as long as
// each query returns the columns its method documents.
//
// Implementations must be safe for concurrent use.
type SchemaAdapter interface {
	// Migrations returns every schema step, oldest first.
	Migrations() []Migration
	// SchemaLockKey is the key of the transaction-level advisory lock taken
	// while migrations run, so that concurrent set-ups serialize.
	SchemaLockKey() string
	// VersionTable is the quoted, possibly schema-qualified, name of the table
	// that records applied migration versions (columns: version int primary
	// key, description text, applied_at timestamptz).
	VersionTable() string
	// Prepare returns statements run before the version table is read (for
	// example CREATE SCHEMA and the version table itself); they must be
	// idempotent.
	Prepare() []string

	// NotifyChannel is the LISTEN/NOTIFY channel of this messages table.
	// Payloads are "m" + topic (new messages in partition 0), "n" +
	// partition + ":" + topic (new messages in another partition), "r" +
	// topic (released), "g" + consumer group (members changed), "p" +
	// topic (partition count raised), "o" + the consumer group's length
	// in bytes (decimal) + ":" + consumer group + topic (the group's
	// offsets reset; the length tells where the group ends, whatever text
	// it and the topic hold), "t" + topic (retention changed), "d" + Unix
	// milliseconds (delayed messages stored, the earliest due then) and
	// "e" (the maintainer's row released). "x" + topic, the reset
	// notification of earlier versions (and of a group too long for the
	// "o" payload), names no group: every group's Subscribers of the
	// topic act on it.
	NotifyChannel() string

	// UpsertTopic creates the topic's settings row, or raises its partition
	// count to p.Partitions (never lowering it: then nothing is written)
	// and sets its retention, and notifies. Returns one row:
	// old_partitions integer (NULL when the statement's snapshot had no
	// row), new_partitions integer (NULL when nothing was written) and the
	// number of notifications.
	UpsertTopic(p TopicParams) Query
	// TopicPartitions returns one row per topic of p: topic text,
	// partitions integer (1 for a topic with no settings row).
	TopicPartitions(p TopicsParams) Query

	// InsertMessages inserts messages in one statement, in order, and
	// notifies p.NotifyChannel once for each distinct (topic, partition).
	// A message of a topic with a retention goes to the partition of its
	// retention class that covers its expiry, or, when none does yet, to
	// the partition of messages kept forever.
	InsertMessages(p InsertMessagesParams) Query
	// SelectMessages returns at most p.Limit messages after p.After that
	// every transaction can see, in delivery order, and one more row with
	// pending = true when committed messages after p.After are not visible
	// yet (an older transaction is still running). A message's size is
	// the length of its payload plus the stored size of its metadata
	// (pg_column_size); with p.MaxMessageBytes, a message larger than that
	// is returned with a NULL payload, so that the caller learns its size
	// without receiving it. Columns: offset bigint,
	// transaction_id xid8 (as text), uuid text, payload bytea, metadata
	// jsonb (as text), pending bool, future bool: on the pending row, true
	// when a stored message's transaction id lies ahead of the database's
	// transaction counter (rows copied from another cluster), size integer
	// (NULL on the pending row).
	SelectMessages(p SelectMessagesParams) Query
	// VisibleTopics returns one row (index bigint, 1-based) per topic of p
	// that has a visible message after its position.
	VisibleTopics(p VisibleTopicsParams) Query

	// CreateSession inserts a session row expiring at now() + TTL (and
	// deletes p.ReplacesSessionID). Returns no rows.
	CreateSession(p SessionParams) Query
	// HeartbeatSession moves the session's expiry to now() + TTL only if it
	// has not expired yet. Returns one row: the rows updated bigint (0: the
	// session is lost), and where the database is: the transaction counter
	// (pg_snapshot_xmax of the current snapshot, xid8 as text), the WAL
	// position in bytes (numeric as text) and the timeline (8 hex digits),
	// so that a failover to a standby that lagged, or a restore, is seen.
	HeartbeatSession(p SessionParams) Query
	// DeleteSession deletes the session row.
	DeleteSession(p SessionParams) Query
	// DeleteExpiredSessions deletes sessions expired for longer than p.TTL.
	DeleteExpiredSessions(p SessionParams) Query
	// SetSubscriptions records, in the session row, the hash and number of
	// the rows the session subscribes to, and notifies p.NotifyChannel.
	// Zero rows affected means the session is gone.
	SetSubscriptions(p SessionParams) Query
	// GroupMembers returns the live sessions of a group: id uuid,
	// created_at timestamptz, expires_in_ms bigint (how long until the
	// session expires, by the server's clock), subscription_hash bigint,
	// subscription_size integer.
	GroupMembers(p GroupParams) Query

	// EnsureOffsets creates the missing offset rows of p's (topic,
	// partition) rows at the beginning of each, or, with p.Latest and for
	// a topic the group has no row of yet, just below the xmin horizon
	// (after every message visible now). Returns one row per row created:
	// topic text, partition integer, acked_transaction_id (xid8 as text;
	// '0' at the beginning).
	EnsureOffsets(p OffsetsParams) Query
	// ClaimOffsets claims, for p.SessionID, up to p.Limit of p's (topic,
	// partition) rows that are free, bumping their epochs; taking a row
	// from an expired session must conflict with that session's heartbeat
	// on a row lock (see [DefaultSchemaAdapter.ClaimOffsets]). Returns one
	// row per claimed row: kind text 'c', topic text, partition integer,
	// epoch bigint,
	// acked_transaction_id (xid8 as text), acked_offset bigint, has_next
	// bool (a message lies after the position), previous_session uuid and
	// previous_owner text (the session the row was taken from, NULL when it
	// was free or already p.SessionID's; the owner string is NULL when that
	// session's row was gone); and one row of kind 'm' (no offset row),
	// 'f' (position ahead of the database's transaction counter, not
	// claimed) or 'l' (free in the statement's snapshot, but changed by
	// another transaction before this one could claim it) per such row
	// among those looked at, its columns after partition NULL.
	ClaimOffsets(p OffsetsParams) Query
	// CommitOffset moves the acknowledged position forward (never back: a
	// position committed by AckInTx may lie ahead), fenced by session and
	// epoch, starting from p.Version when it is set. Returns one row per
	// row written: the tuple id (ctid as text) of the version written,
	// which the next commit of the claim passes as p.Version. No row
	// means ownership was lost. (A statement that returns no rows is
	// taken by its command tag: zero rows affected means ownership lost.)
	CommitOffset(p OffsetParams) Query
	// ReleaseOffset writes the acknowledged position (never moving it back)
	// and frees the claim in one statement, fenced by session and epoch.
	ReleaseOffset(p OffsetParams) Query
	// CountHeadDelivery adds one to the row's head_deliveries, fenced by
	// session and epoch and only while its acknowledged position is still
	// p.Position, and returns the new count (no row: ownership lost).
	// Commits that move the position set it back to 0.
	CountHeadDelivery(p OffsetParams) Query
	// AckOffset is what AckInTx runs in the caller's transaction: it locks
	// the row (SELECT ... FOR UPDATE, which waits for a concurrent claim
	// and reads its outcome) and moves the acknowledged position to
	// p.Position if the row is still p.SessionID's at p.Epoch and the
	// position lies ahead. Returns one row (none when the row does not
	// exist): session_id uuid, epoch bigint, acked_transaction_id (xid8
	// as text) and acked_offset bigint as they were before, and advanced
	// bool.
	AckOffset(p OffsetParams) Query
}

// DefaultSchemaAdapter is the PostgreSQL [SchemaAdapter]: one messages table
// for all topics, one row per live Subscriber in the sessions table, and one
// row per (consumer group, topic, partition) in the offsets table.
//
// The zero value uses the default table names in the connection's
// search_path. Names are quoted, so they are used exactly as given.
// A DefaultSchemaAdapter is safe for concurrent use.
type DefaultSchemaAdapter struct {
	// Schema is the PostgreSQL schema of the tables. Empty means the
	// connection's search_path (usually "public"). When set, it is created
	// by schema initialization if missing.
	Schema string
	// MessagesTable defaults to DefaultMessagesTable.
	MessagesTable string
	// ConsumerSessionsTable defaults to DefaultConsumerSessionsTable.
	ConsumerSessionsTable string
	// ConsumerOffsetsTable defaults to DefaultConsumerOffsetsTable.
	ConsumerOffsetsTable string
	// SchemaVersionTable defaults to DefaultSchemaVersionTable.
	SchemaVersionTable string
	// TopicsTable defaults to DefaultTopicsTable.
	TopicsTable string
	// DelayedTable defaults to DefaultDelayedTable.
	DelayedTable string
	// MaintenanceTable defaults to DefaultMaintenanceTable.
	MaintenanceTable string
	// RetentionTable defaults to DefaultRetentionTable.
	RetentionTable string
}

func (a DefaultSchemaAdapter) ident(name, def string) string {
	if name == "" {
		name = def
	}
	if a.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{a.Schema, name}.Sanitize()
}

func (a DefaultSchemaAdapter) messages() string {
	return a.ident(a.MessagesTable, DefaultMessagesTable)
}

func (a DefaultSchemaAdapter) sessions() string {
	return a.ident(a.ConsumerSessionsTable, DefaultConsumerSessionsTable)
}

func (a DefaultSchemaAdapter) offsets() string {
	return a.ident(a.ConsumerOffsetsTable, DefaultConsumerOffsetsTable)
}

func (a DefaultSchemaAdapter) topics() string {
	return a.ident(a.TopicsTable, DefaultTopicsTable)
}

func (a DefaultSchemaAdapter) delayed() string {
	return a.ident(a.DelayedTable, DefaultDelayedTable)
}

func (a DefaultSchemaAdapter) maintenance() string {
	return a.ident(a.MaintenanceTable, DefaultMaintenanceTable)
}

func (a DefaultSchemaAdapter) retention() string {
	return a.ident(a.RetentionTable, DefaultRetentionTable)
}

// partitionName returns the bare (unquoted, unqualified) name of a
// partition of the messages table: its name, "_" and suffix, with the
// table's name shortened and a hash of it added when that would exceed
// PostgreSQL's 63 bytes.
func (a DefaultSchemaAdapter) partitionName(suffix string) string {
	base := a.MessagesTable
	if base == "" {
		base = DefaultMessagesTable
	}
	name := base + "_" + suffix
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(base))
	return base[:63-len(suffix)-10] + "_" + hex.EncodeToString(sum[:4]) + "_" + suffix
}

// partition returns the quoted, schema-qualified name of a partition.
func (a DefaultSchemaAdapter) partition(suffix string) string {
	if a.Schema == "" {
		return pgx.Identifier{a.partitionName(suffix)}.Sanitize()
	}
	return pgx.Identifier{a.Schema, a.partitionName(suffix)}.Sanitize()
}

// indexName builds a quoted index name from a table name; indexes live in
// the table's schema, so the name is not schema-qualified.
func (a DefaultSchemaAdapter) indexName(table, def, suffix string) string {
	return pgx.Identifier{a.indexBareName(table, def, suffix)}.Sanitize()
}

// indexBareName is indexName unquoted.
func (a DefaultSchemaAdapter) indexBareName(table, def, suffix string) string {
	if table == "" {
		table = def
	}
	name := table + "_" + suffix
	if len(name) > 63 { // PostgreSQL truncates identifiers at 63 bytes
		name = name[:63]
	}
	return name
}

// validate checks the configured names.
func (a DefaultSchemaAdapter) validate() error {
	for _, n := range []struct{ field, value string }{
		{"Schema", a.Schema},
		{"MessagesTable", a.MessagesTable},
		{"ConsumerSessionsTable", a.ConsumerSessionsTable},
		{"ConsumerOffsetsTable", a.ConsumerOffsetsTable},
		{"SchemaVersionTable", a.SchemaVersionTable},
		{"TopicsTable", a.TopicsTable},
		{"DelayedTable", a.DelayedTable},
		{"MaintenanceTable", a.MaintenanceTable},
		{"RetentionTable", a.RetentionTable},
	} {
		if len(n.value) > 63 {
			return fmt.Errorf("DefaultSchemaAdapter.%s must be at most 63 bytes, got %d", n.field, len(n.value))
		}
		if strings.ContainsRune(n.value, 0) {
			return fmt.Errorf("DefaultSchemaAdapter.%s must not contain a NUL byte", n.field)
		}
	}
	return nil
}

// SchemaLockKey implements [SchemaAdapter].
func (a DefaultSchemaAdapter) SchemaLockKey() string {
	return "pglease schema " + a.messages()
}

// VersionTable implements [SchemaAdapter].
func (a DefaultSchemaAdapter) VersionTable() string {
	return a.ident(a.SchemaVersionTable, DefaultSchemaVersionTable)
}

// Prepare implements [SchemaAdapter]. The schema is created only when
// pg_namespace does not have it: CREATE SCHEMA IF NOT EXISTS checks the
// CREATE privilege on the database even when the schema exists, which an
// owner role given its own schema usually lacks.
func (a DefaultSchemaAdapter) Prepare() []string {
	var stmts []string
	if a.Schema != "" {
		// Not CREATE SCHEMA IF NOT EXISTS: it checks CREATE on the
		// database even when the schema exists (an owner given its own
		// schema usually lacks it), and it looks the name up in the
		// backend's catalog cache, which may still hold "missing" from a
		// read made before the set-up lock was granted (the lock does
		// not refresh it): it then fails on the schema another set-up
		// just created. A query reads the catalog as of now.
		stmts = append(stmts, doBlock(`BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = `+quoteLiteral(a.Schema)+`) THEN
		CREATE SCHEMA `+pgx.Identifier{a.Schema}.Sanitize()+`;
	END IF;
END`))
	}
	stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+a.VersionTable()+` (
	version     integer PRIMARY KEY,
	description text NOT NULL,
	applied_at  timestamptz NOT NULL DEFAULT now()
)`)
	return stmts
}

// Migrations implements [SchemaAdapter].
func (a DefaultSchemaAdapter) Migrations() []Migration {
	return []Migration{{
		Version:     1,
		Description: "messages, consumer sessions and consumer offsets",
		SQL: `CREATE TABLE IF NOT EXISTS ` + a.messages() + ` (
	"offset"       bigint GENERATED ALWAYS AS IDENTITY,
	topic          text COLLATE "C" NOT NULL,
	partition      integer NOT NULL DEFAULT 0,
	transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
	uuid           text NOT NULL,
	payload        bytea,
	metadata       jsonb,
	created_at     timestamptz NOT NULL DEFAULT now(),
	-- The read path's index is the primary key: one index per row written.
	-- Topics compare bytewise ("C"), whatever the database's collation.
	PRIMARY KEY (topic, partition, transaction_id, "offset")
);

CREATE TABLE IF NOT EXISTS ` + a.sessions() + ` (
	id             uuid PRIMARY KEY,
	consumer_group text NOT NULL,
	owner          text NOT NULL,
	created_at     timestamptz NOT NULL DEFAULT now(),
	expires_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + a.indexName(a.ConsumerSessionsTable, DefaultConsumerSessionsTable, "expires_at_idx") + `
	ON ` + a.sessions() + ` (expires_at);

CREATE TABLE IF NOT EXISTS ` + a.offsets() + ` (
	consumer_group       text NOT NULL,
	topic                text NOT NULL,
	partition            integer NOT NULL DEFAULT 0,
	acked_transaction_id xid8 NOT NULL DEFAULT '0',
	acked_offset         bigint NOT NULL DEFAULT 0,
	session_id           uuid,
	lease_expires_at     timestamptz,
	epoch                bigint NOT NULL DEFAULT 0,
	updated_at           timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_group, topic, partition)
);`,
	}, {
		Version:     2,
		Description: "consumer_offsets.lease_expires_at is no longer used",
		// Version 1 claimed a row when COALESCE(lease_expires_at, owner
		// session's expiry) had passed, but nothing ever set the column.
		// From version 2 on, a row's claim lives exactly as long as its
		// owner's session. The column stays, always NULL, so that
		// Subscribers of version 1 keep working during a rolling upgrade;
		// a later migration drops it.
		SQL: `COMMENT ON COLUMN ` + a.offsets() + `.lease_expires_at IS
	'Unused since pglease schema version 2 (always NULL); kept for Subscribers of version 1 during a rolling upgrade.';`,
	}, {
		Version:     3,
		Description: "consumer groups: the rows each session subscribes to",
		SQL: `ALTER TABLE ` + a.sessions() + `
	ADD COLUMN IF NOT EXISTS subscription_hash bigint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS subscription_size integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS ` + a.indexName(a.ConsumerSessionsTable, DefaultConsumerSessionsTable, "group_idx") + `
	ON ` + a.sessions() + ` (consumer_group);`,
	}, {
		Version:     4,
		Description: "topic settings: partition count",
		// A topic without a row has one partition. The count only grows.
		SQL: `CREATE TABLE IF NOT EXISTS ` + a.topics() + ` (
	topic      text COLLATE "C" PRIMARY KEY,
	partitions integer NOT NULL DEFAULT 1 CHECK (partitions >= 1),
	created_at timestamptz NOT NULL DEFAULT now(),
	updated_at timestamptz NOT NULL DEFAULT now()
);`,
	}, {
		Version:     5,
		Description: "delivery attempts: claims that handed out the message after the position",
		SQL: `ALTER TABLE ` + a.offsets() + `
	ADD COLUMN IF NOT EXISTS head_deliveries integer NOT NULL DEFAULT 0;`,
	}, {
		Version:     6,
		Description: "maintenance: retention partitions, delayed messages, the maintainer's election",
		SQL:         a.migration6(),
	}, {
		Version:     7,
		Description: "least privilege: the maintainer's partition DDL through the owner's SECURITY DEFINER functions",
		SQL:         a.migration7(),
	}, {
		Version:     8,
		Description: "hot tables: heartbeats and offset commits as HOT updates (fillfactor, no index on sessions.expires_at)",
		SQL:         a.migration8(),
	}}
}

// hotFillfactor is the fillfactor of the sessions and offsets tables from
// schema version 8 on. While a transaction holds the vacuum horizon (a
// pg_dump, a long report), every heartbeat and offset commit leaves a
// version of its row that nothing can remove; an update is HOT (no index
// entry) only while the row's page has room for the new version. Rows are
// inserted, and moved by updates that do not fit, into pages filled up to
// the fillfactor, so 10 leaves nine tenths of each page to the versions of
// its six or seven rows. Measured (docs/architecture.md, "Hot tables under
// a held vacuum horizon"), one connection committing 100 rows in turn:
// 91 % of the commits were HOT with 10, 77 % with 25, 57 % with 50 and
// none with 100. A commit that is not HOT checks the primary key's
// uniqueness against every index entry of its row (one per such commit),
// so the share that is not HOT counts twice: more such commits, each
// checking more entries.
const hotFillfactor = 10

// hotLockTimeout bounds how long migration 8 waits for its lock on the
// sessions table. DROP INDEX takes an ACCESS EXCLUSIVE lock, which waits
// for every transaction that read the table, a pg_dump's included, and
// heartbeats queue behind it meanwhile: the migration gives up instead,
// and is retried by the next set-up.
const hotLockTimeout = "2s"

// migration8 makes the hot tables cheap to update while the vacuum horizon
// is held: the sessions table loses its index on expires_at, the one
// column a heartbeat writes that was indexed (so no heartbeat was HOT);
// the statements that used it stay cheap without it (see
// DeleteExpiredSessions), and both tables get hotFillfactor. ALTER TABLE
// SET keeps owner and grants, takes a lock that blocks neither reads nor
// writes, and affects only pages written from now on: existing rows move
// to such pages as they are updated, and VACUUM FULL rewrites a table at
// once (see docs/operations.md). The DROP comes last, so that its lock is
// held the shortest; its lock timeout is put back after it.
func (a DefaultSchemaAdapter) migration8() string {
	index := pgx.Identifier{a.indexBareName(a.ConsumerSessionsTable, DefaultConsumerSessionsTable, "expires_at_idx")}
	if a.Schema != "" {
		index = append(pgx.Identifier{a.Schema}, index...)
	}
	return `ALTER TABLE ` + a.offsets() + ` SET (fillfactor = ` + fmt.Sprint(hotFillfactor) + `);
ALTER TABLE ` + a.sessions() + ` SET (fillfactor = ` + fmt.Sprint(hotFillfactor) + `);
` + doBlock(`DECLARE
	prev text := current_setting('lock_timeout');
BEGIN
	PERFORM set_config('lock_timeout', `+quoteLiteral(hotLockTimeout)+`, true);
	DROP INDEX IF EXISTS `+index.Sanitize()+`;
	PERFORM set_config('lock_timeout', prev, true);
END`) + `;`
}

// migration6 turns the messages table into a table partitioned by
// (retention_class, expires_at) without copying a row: the existing table,
// with its rows, index and positions, becomes the partition of the
// messages kept forever (class 0); the maintainer adds a partition per
// time slot of each retention class in use and drops it, whole, once every
// message in it has expired. Offsets continue from the old table's
// sequence. The conversion is skipped when the table is partitioned
// already, so that the script of SchemaSQL can run twice.
//
// The new parent keeps what the roles of the deployment had on the old
// table (see keepAccess), so that an upgrade does not lock out roles that
// own nothing. The tables of this version are created first, so that the
// conversion can give them the old table's grants.
func (a DefaultSchemaAdapter) migration6() string {
	forever := a.partitionName("forever")
	convert := `ALTER TABLE ` + a.messages() + ` RENAME TO ` + pgx.Identifier{forever}.Sanitize() + `;
ALTER TABLE ` + a.partition("forever") + `
	ADD COLUMN retention_class smallint NOT NULL DEFAULT 0,
	ADD COLUMN expires_at timestamptz NOT NULL DEFAULT 'infinity';
CREATE TABLE ` + a.messages() + ` (
	"offset"        bigint GENERATED ALWAYS AS IDENTITY,
	topic           text COLLATE "C" NOT NULL,
	partition       integer NOT NULL DEFAULT 0,
	transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
	uuid            text NOT NULL,
	payload         bytea,
	metadata        jsonb,
	created_at      timestamptz NOT NULL DEFAULT now(),
	retention_class smallint NOT NULL DEFAULT 0,
	expires_at      timestamptz NOT NULL DEFAULT 'infinity'
) PARTITION BY RANGE (retention_class, expires_at);
PERFORM setval(pg_get_serial_sequence(` + quoteLiteral(a.messages()) + `, 'offset'),
	COALESCE(pg_sequence_last_value(pg_get_serial_sequence(` + quoteLiteral(a.partition("forever")) + `, 'offset')::regclass), 0) + 1,
	false);
ALTER TABLE ` + a.partition("forever") + ` ALTER COLUMN "offset" DROP IDENTITY;
ALTER TABLE ` + a.messages() + ` ATTACH PARTITION ` + a.partition("forever") + `
	FOR VALUES FROM (0, MINVALUE) TO (1, MINVALUE);`
	return `ALTER TABLE ` + a.topics() + `
	ADD COLUMN IF NOT EXISTS retention interval NOT NULL DEFAULT '0',
	ADD COLUMN IF NOT EXISTS retention_class smallint NOT NULL DEFAULT 0,
	-- The classes the topic's messages may be stored under: 0, and those
	-- from classes_from to classes_to (every class it ever had lies
	-- there; 0 and 0 when it never had a retention). Readers read only
	-- those partitions.
	ADD COLUMN IF NOT EXISTS classes_from smallint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS classes_to smallint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS ` + a.indexName(a.TopicsTable, DefaultTopicsTable, "retention_idx") + `
	ON ` + a.topics() + ` (retention_class) WHERE retention_class > 0;

-- One row per retention class in use: the partitions of the class cover
-- expiry times up to covered_until, contiguously from the present on.
CREATE TABLE IF NOT EXISTS ` + a.retention() + ` (
	retention_class smallint PRIMARY KEY,
	covered_until   timestamptz NOT NULL DEFAULT '-infinity',
	updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Messages published with a delay wait here until due_at.
CREATE TABLE IF NOT EXISTS ` + a.delayed() + ` (
	id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	due_at         timestamptz NOT NULL,
	topic          text COLLATE "C" NOT NULL,
	partition_hash integer,
	uuid           text NOT NULL,
	payload        bytea,
	metadata       jsonb,
	created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ` + a.indexName(a.DelayedTable, DefaultDelayedTable, "due_idx") + `
	ON ` + a.delayed() + ` (due_at, id);

-- The maintainer: the row is owned through a consumer session, like an
-- offset row.
CREATE TABLE IF NOT EXISTS ` + a.maintenance() + ` (
	name       text PRIMARY KEY,
	session_id uuid,
	epoch      bigint NOT NULL DEFAULT 0,
	updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO ` + a.maintenance() + ` (name) VALUES ('maintainer') ON CONFLICT (name) DO NOTHING;` + `

` + doBlock(`DECLARE
	old_table regclass;
	new_table regclass;
	storage regclass[];
	r record;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(`+quoteLiteral(a.messages())+`)) THEN
`+doStatements(convert)+`
		old_table := to_regclass(`+quoteLiteral(a.partition("forever"))+`);
		new_table := to_regclass(`+quoteLiteral(a.messages())+`);
		storage := ARRAY[to_regclass(`+quoteLiteral(a.delayed())+`), to_regclass(`+quoteLiteral(a.retention())+`),
			to_regclass(`+quoteLiteral(a.maintenance())+`)];
`+keepAccess+`
	END IF;
END`) + ";"
}

// keepAccess is the PL/pgSQL, run right after the conversion of
// migration 6, that gives the new parent table (new_table) what roles had
// on the old messages table (old_table, now the partition of messages kept
// forever, which keeps all of it too): its owner (when the migration runs
// as another role, a superuser for example; the tables of storage get
// that owner too), every table and column
// privilege of every grantee, PUBLIC included, with its grant option, its
// row-level security flags and policies, and its membership of
// publications. The tables this version adds for message storage
// (storage: delayed messages, retention, the maintainer's row) get the old
// table's SELECT, INSERT, UPDATE and DELETE grants: a role that could
// publish and consume before can still do so, delayed messages and the
// maintainer's work included.
//
// A publication that lists the old table with a row filter or a column
// list but does not publish through the partition root cannot list the
// parent with them (PostgreSQL refuses): the parent is then not added, and
// a WARNING says so (the partition kept forever stays published as it
// was; retention partitions are not published).
const keepAccess = `		FOR r IN SELECT c.oid::regclass AS tbl, pg_get_userbyid(o.relowner) AS owner
			FROM pg_class o, pg_class c
			WHERE o.oid = old_table AND c.oid = ANY (new_table || storage) AND c.relowner <> o.relowner
		LOOP
			EXECUTE format('ALTER TABLE %s OWNER TO %I', r.tbl, r.owner);
		END LOOP;
		FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable
			FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
			WHERE c.oid = old_table AND a.grantee <> c.relowner
		LOOP
			EXECUTE format('GRANT %s ON TABLE %s TO %s%s', r.privilege_type, new_table,
				CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
				CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
			IF r.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') THEN
				EXECUTE format('GRANT %s ON TABLE %s TO %s%s', r.privilege_type, array_to_string(storage, ', '),
					CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
					CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
			END IF;
		END LOOP;
		FOR r IN SELECT att.attname, a.grantee, a.privilege_type, a.is_grantable
			FROM pg_attribute att CROSS JOIN LATERAL aclexplode(att.attacl) a
			WHERE att.attrelid = old_table AND att.attnum > 0 AND NOT att.attisdropped
				AND a.grantee <> (SELECT relowner FROM pg_class WHERE oid = old_table)
		LOOP
			EXECUTE format('GRANT %s (%I) ON TABLE %s TO %s%s', r.privilege_type, r.attname, new_table,
				CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
				CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END LOOP;
		IF (SELECT relrowsecurity FROM pg_class WHERE oid = old_table) THEN
			EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', new_table);
		END IF;
		IF (SELECT relforcerowsecurity FROM pg_class WHERE oid = old_table) THEN
			EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', new_table);
		END IF;
		FOR r IN SELECT p.polname, p.polpermissive, p.polcmd, p.polroles,
				pg_get_expr(p.polqual, p.polrelid) AS qual, pg_get_expr(p.polwithcheck, p.polrelid) AS with_check
			FROM pg_policy p WHERE p.polrelid = old_table
		LOOP
			EXECUTE format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s', r.polname, new_table,
				CASE WHEN r.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
				CASE r.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
				(SELECT string_agg(CASE WHEN g = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g)) END, ', ') FROM unnest(r.polroles) g),
				CASE WHEN r.qual IS NULL THEN '' ELSE ' USING (' || r.qual || ')' END,
				CASE WHEN r.with_check IS NULL THEN '' ELSE ' WITH CHECK (' || r.with_check || ')' END);
		END LOOP;
		-- Row filters and column lists of publications exist from PostgreSQL 15 on.
		FOR r IN EXECUTE CASE WHEN current_setting('server_version_num')::integer >= 150000 THEN
				'SELECT p.pubname, p.pubviaroot, pg_get_expr(pr.prqual, pr.prrelid) AS qual,
					(SELECT string_agg(quote_ident(att.attname), '', '' ORDER BY att.attnum) FROM pg_attribute att
						WHERE att.attrelid = pr.prrelid AND att.attnum = ANY (pr.prattrs)) AS cols
				FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = $1'
			ELSE
				'SELECT p.pubname, p.pubviaroot, NULL::text AS qual, NULL::text AS cols
				FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = $1'
			END USING old_table
		LOOP
			IF NOT r.pubviaroot AND (r.qual IS NOT NULL OR r.cols IS NOT NULL) THEN
				RAISE WARNING 'pglease: publication % lists % with a row filter or a column list, which PostgreSQL does not allow for the partitioned table % unless the publication has publish_via_partition_root: add it yourself', r.pubname, old_table, new_table;
			ELSE
				BEGIN
					EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s%s%s', r.pubname, new_table,
						CASE WHEN r.cols IS NULL THEN '' ELSE ' (' || r.cols || ')' END,
						CASE WHEN r.qual IS NULL THEN '' ELSE ' WHERE (' || r.qual || ')' END);
				EXCEPTION WHEN insufficient_privilege THEN
					RAISE EXCEPTION 'pglease: the upgrade must add % to publication %, which role % may not alter', new_table, r.pubname, current_user
						USING HINT = 'Run the migration as the owner of the publication or as a superuser.';
				END;
			END IF;
		END LOOP;`

// doBlock is an anonymous code block (DO) running the PL/pgSQL block body.
func doBlock(body string) string {
	return "DO " + dollarQuote(body)
}

// dollarQuote quotes s as a dollar-quoted string constant, with a tag that
// s does not contain (names from the configuration may contain anything).
func dollarQuote(s string) string {
	tag := "$pglease$"
	for i := 1; strings.Contains(s, tag); i++ {
		tag = fmt.Sprintf("$pglease%d$", i)
	}
	return tag + "\n" + s + "\n" + tag
}

// doStatements turns a script into PL/pgSQL statements run with EXECUTE
// (a PERFORM line stays as it is).
func doStatements(script string) string {
	var b strings.Builder
	for _, stmt := range strings.Split(script, ";\n") {
		stmt = strings.TrimSuffix(strings.TrimSpace(stmt), ";")
		if stmt == "" {
			continue
		}
		if strings.HasPrefix(stmt, "PERFORM ") {
			b.WriteString("\t\t" + stmt + ";\n")
			continue
		}
		b.WriteString("\t\tEXECUTE " + quoteLiteral(stmt) + ";\n")
	}
	return b.String()
}

// NotifyChannel implements [SchemaAdapter]. The name is derived from the
// quoted messages table name, so that each set of tables has its own
// channel, and is short enough for any table name.
func (a DefaultSchemaAdapter) NotifyChannel() string {
	sum := sha256.Sum256([]byte(a.messages()))
	return "pglease_" + hex.EncodeToString(sum[:8])
}

// InsertMessages implements [SchemaAdapter].
//
// When all messages have one topic (a single Publish call), the topic is
// sent once instead of once per message, and its partition count is read
// once; a topic with one partition (any topic never created) skips the
// modulo and sends one notification without looking at the hashes. The
// hashes travel as int4, their bits reinterpreted (h & 0xffffffff gives the
// uint32 back): measured, a fifth of the statement's cost was the wider
// int8 array and the per-row arithmetic.
func (a DefaultSchemaAdapter) InsertMessages(p InsertMessagesParams) Query {
	var hashes []int32 // nil: NULL, no keys
	if p.PartitionHashes != nil {
		hashes = make([]int32, len(p.UUIDs))
		for i := range hashes {
			if i < len(p.PartitionHashes) {
				hashes[i] = int32(p.PartitionHashes[i])
			}
		}
	}
	const partitionOf = `((COALESCE(m.hash, hashtext(m.uuid))::bigint & 4294967295) %% %s)::integer`
	if oneTopic(p.Topics) {
		insert := `INSERT INTO ` + a.messages() + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at)
SELECT $1::text, CASE WHEN p.n = 1 THEN 0 ELSE ` + fmt.Sprintf(partitionOf, "p.n") + ` END,
	m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb, p.rc, p.exp
FROM p, unnest($2::text[], $3::bytea[], $4::text[], $5::int4[]) WITH ORDINALITY AS m(uuid, payload, metadata, hash, n)
ORDER BY m.n`
		count := `p AS (SELECT COALESCE(tp.partitions, 1) AS n, ` + a.placement("tp", "r") + `
	FROM (SELECT 1) one LEFT JOIN ` + a.topics() + ` tp ON tp.topic = $1::text
	CROSS JOIN LATERAL (` + a.placementCheck("tp") + `) r)`
		if p.NotifyChannel == "" {
			return Query{SQL: `WITH ` + count + `
` + insert, Args: []any{p.Topics[0], p.UUIDs, p.Payloads, p.Metadata, hashes}}
		}
		// One notification per distinct partition: "m" + topic for
		// partition 0 (what Subscribers of schema versions before 4
		// listen for), "n" + partition + ":" + topic for the others.
		return Query{
			SQL: `WITH ` + count + `, inserted AS (
` + insert + `
)
SELECT pg_notify($6, 'm' || $1::text) FROM p WHERE p.n = 1
UNION ALL
SELECT pg_notify($6, CASE WHEN t.partition = 0 THEN 'm' || $1::text ELSE 'n' || t.partition || ':' || $1::text END)
FROM (SELECT DISTINCT ` + fmt.Sprintf(partitionOf, "(SELECT n FROM p)") + ` AS partition
	FROM unnest($2::text[], $5::int4[]) AS m(uuid, hash)
	WHERE (SELECT n FROM p) > 1) t`,
			Args: []any{p.Topics[0], p.UUIDs, p.Payloads, p.Metadata, hashes, p.NotifyChannel},
		}
	}
	partitions := `COALESCE((SELECT tp.partitions FROM ` + a.topics() + ` tp WHERE tp.topic = m.topic), 1)`
	insert := `INSERT INTO ` + a.messages() + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at)
SELECT m.topic, ` + fmt.Sprintf(partitionOf, "COALESCE(tp.partitions, 1)") + `, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb,
	` + a.placement("tp", "r") + `
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[]) WITH ORDINALITY AS m(topic, uuid, payload, metadata, hash, n)
LEFT JOIN ` + a.topics() + ` tp ON tp.topic = m.topic
CROSS JOIN LATERAL (` + a.placementCheck("tp") + `) r
ORDER BY m.n`
	if p.NotifyChannel == "" {
		return Query{SQL: insert, Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes}}
	}
	return Query{
		SQL: `WITH inserted AS (
` + insert + `
)
SELECT pg_notify($6, CASE WHEN t.partition = 0 THEN 'm' || t.topic ELSE 'n' || t.partition || ':' || t.topic END)
FROM (SELECT DISTINCT m.topic, ` + fmt.Sprintf(partitionOf, partitions) + ` AS partition
	FROM unnest($1::text[], $2::text[], $5::int4[]) AS m(topic, uuid, hash)) t`,
		Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes, p.NotifyChannel},
	}
}

// classesOf is a condition on m.retention_class that keeps the classes
// whose partitions may hold messages of topic: 0 and the topic's range of
// classes, read by the statement itself. Each bound is a scalar sub-select,
// which PostgreSQL prunes partitions by when the statement starts (an
// array of classes would not prune), so a reader scans only the partition
// kept forever for a topic that never had a retention, and that and its
// class's partitions for one that has. Reading the bounds in the statement
// that reads the messages is safe: a message of a class was written after
// the topics row that gave it the class had committed, so a snapshot that
// sees the message sees the class.
func (a DefaultSchemaAdapter) classesOf(topic string) string {
	bound := func(col string) string {
		return `COALESCE((SELECT tc.` + col + ` FROM ` + a.topics() + ` tc WHERE tc.topic = ` + topic + `), 0)`
	}
	return `(m.retention_class = 0 OR m.retention_class BETWEEN ` + bound("classes_from") + ` AND ` + bound("classes_to") + `)`
}

// placementCheck is a one-row query, lateral to the topics row tp (NULL
// for a topic without settings), that decides where a message published
// now goes: ok is true when the topic has a retention and a partition of
// its class covers now + retention (the maintainer keeps them ahead), ck
// is the time the expiry counts from. Otherwise the message goes to the
// partition of messages kept forever, from which the maintainer deletes
// it, row by row, once its retention has passed. A topic without retention
// pays nothing more than the columns: the covered_until lookup runs only
// for topics with a retention class.
func (a DefaultSchemaAdapter) placementCheck(tp string) string {
	return `SELECT CASE WHEN ` + tp + `.retention_class > 0
		THEN k.ck + ` + tp + `.retention < (SELECT l.covered_until FROM ` + a.retention() + ` l
			WHERE l.retention_class = ` + tp + `.retention_class)
		ELSE false END AS ok, k.ck
	FROM (SELECT clock_timestamp() AS ck) k`
}

// placement is the retention_class and expires_at values of a message,
// from the topics row tp and placementCheck's row r.
func (a DefaultSchemaAdapter) placement(tp, r string) string {
	return `CASE WHEN ` + r + `.ok THEN ` + tp + `.retention_class ELSE 0 END AS rc,
	CASE WHEN ` + r + `.ok THEN ` + r + `.ck + ` + tp + `.retention ELSE 'infinity' END AS exp`
}

// UpsertTopic implements [SchemaAdapter]. Besides the partition count it
// sets the retention (both ways); a change of retention is notified with
// "t" + topic, for the maintainer, and a retention class gets its row in
// the retention table, so that the maintainer adds its partitions.
func (a DefaultSchemaAdapter) UpsertTopic(p TopicParams) Query {
	return Query{
		SQL: `WITH old AS (
	SELECT partitions, retention FROM ` + a.topics() + ` WHERE topic = $1
), up AS (
	INSERT INTO ` + a.topics() + ` AS t (topic, partitions, retention, retention_class, classes_from, classes_to)
	VALUES ($1, $2, $4::bigint * interval '1 microsecond', $5::smallint, $5::smallint, $5::smallint)
	ON CONFLICT (topic) DO UPDATE SET partitions = EXCLUDED.partitions, retention = EXCLUDED.retention,
		retention_class = EXCLUDED.retention_class,
		classes_from = CASE WHEN EXCLUDED.retention_class = 0 THEN t.classes_from
			WHEN t.classes_from = 0 THEN EXCLUDED.retention_class
			ELSE LEAST(t.classes_from, EXCLUDED.retention_class) END,
		classes_to = GREATEST(t.classes_to, EXCLUDED.retention_class),
		updated_at = now()
		WHERE t.partitions <= EXCLUDED.partitions
			AND (t.partitions < EXCLUDED.partitions OR t.retention <> EXCLUDED.retention)
	RETURNING partitions, retention
), lane AS (
	INSERT INTO ` + a.retention() + ` (retention_class) SELECT $5::smallint WHERE $5::smallint > 0
	ON CONFLICT (retention_class) DO NOTHING
), notified AS (
	SELECT pg_notify($3, 'p' || $1) FROM up
	WHERE $3 <> '' AND up.partitions > COALESCE((SELECT partitions FROM old), 0)
	UNION ALL
	SELECT pg_notify($3, 't' || $1) FROM up
	WHERE $3 <> '' AND up.retention IS DISTINCT FROM COALESCE((SELECT retention FROM old), '0')
)
SELECT (SELECT partitions FROM old), (SELECT partitions FROM up), (SELECT count(*) FROM notified)`,
		Args: []any{p.Topic, p.Partitions, p.NotifyChannel, p.Retention.Microseconds(), int16(p.RetentionClass)},
	}
}

// TopicPartitions implements [SchemaAdapter].
func (a DefaultSchemaAdapter) TopicPartitions(p TopicsParams) Query {
	return Query{
		SQL: `SELECT t.topic, COALESCE(tp.partitions, 1)
FROM unnest($1::text[]) AS t(topic)
LEFT JOIN ` + a.topics() + ` tp ON tp.topic = t.topic`,
		Args: []any{p.Topics},
	}
}

func oneTopic(topics []string) bool {
	for _, t := range topics[1:] {
		if t != topics[0] {
			return false
		}
	}
	return len(topics) > 0
}

// SelectMessages implements [SchemaAdapter].
//
// Offsets are assigned before commit, so they commit out of order; only rows
// of transactions older than every running one (below pg_snapshot_xmin) are
// returned, ordered by (transaction_id, offset), so a row can never appear
// behind a position already consumed.
//
// The pending check needs no comparison with p.After: xmin never moves
// back, and p.After's transaction was below an earlier xmin, so every row at
// or above the current xmin lies after p.After. (With the comparison, the
// index scan would start at p.After and walk the whole backlog.)
//
// The pending row reads the highest transaction id at or above xmin (one
// step of a backward index scan): at or above the snapshot's xmax, no
// transaction of this cluster can have written it.
func (a DefaultSchemaAdapter) SelectMessages(p SelectMessagesParams) Query {
	maxBytes := p.MaxMessageBytes
	if maxBytes <= 0 {
		maxBytes = math.MaxInt64
	}
	// Neither octet_length of a payload nor pg_column_size of metadata
	// reads a TOASTed value, only its header: a message left out costs
	// its index entry and heap tuple, not its bytes.
	const size = `(COALESCE(octet_length(m.payload), 0) + COALESCE(pg_column_size(m.metadata), 0))`
	return Query{
		// The ORDER BY names the table's columns, qualified: a bare
		// transaction_id would sort by the text output column.
		SQL: `(SELECT m."offset", m.transaction_id::text AS transaction_id_text, m.uuid,
	CASE WHEN ` + size + ` <= $6 THEN m.payload END, m.metadata::text AS metadata_text,
	false AS pending, false AS future, ` + size + ` AS size
FROM ` + a.messages() + ` m
WHERE m.topic = $1 AND m.partition = $2 AND ` + a.classesOf("$1") + `
	AND (m.transaction_id, m."offset") > ($3::text::xid8, $4::bigint)
	AND m.transaction_id < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY m.transaction_id, m."offset"
LIMIT $5)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, true, t.transaction_id >= pg_snapshot_xmax(pg_current_snapshot()), NULL
FROM (SELECT m.transaction_id FROM ` + a.messages() + ` m
	WHERE m.topic = $1 AND m.partition = $2 AND ` + a.classesOf("$1") + `
		AND m.transaction_id >= pg_snapshot_xmin(pg_current_snapshot())
	ORDER BY m.transaction_id DESC
	LIMIT 1) t`,
		Args: []any{p.Topic, p.Partition, formatXID8(p.After.TransactionID), p.After.Offset, p.Limit, maxBytes},
	}
}

// VisibleTopics implements [SchemaAdapter].
//
// Each row looks for its first visible message in a LATERAL sub-select
// ordered as the primary key and limited to one row: a probe of the index
// per row, whatever the size of the table. Written as EXISTS, the planner
// chose a hash semi-join over a sequential scan of the whole messages
// table, from 3 idle topics on (measured: 47 ms per poll on 50,000
// messages, 300 ms on 170,000, each idle poll of each Subscriber).
func (a DefaultSchemaAdapter) VisibleTopics(p VisibleTopicsParams) Query {
	txIDs := make([]string, len(p.Positions))
	offsets := make([]int64, len(p.Positions))
	for i, pos := range p.Positions {
		txIDs[i] = formatXID8(pos.TransactionID)
		offsets[i] = pos.Offset
	}
	return Query{
		SQL: `SELECT t.n
FROM unnest($1::text[], $4::integer[], $2::text[], $3::bigint[]) WITH ORDINALITY AS t(topic, partition, tx, off, n)
CROSS JOIN LATERAL (SELECT 1 FROM ` + a.messages() + ` m
	WHERE m.topic = t.topic AND m.partition = t.partition AND ` + a.classesOf("t.topic") + `
		AND (m.transaction_id, m."offset") > (t.tx::xid8, t.off)
		AND m.transaction_id < pg_snapshot_xmin(pg_current_snapshot())
	ORDER BY m.transaction_id, m."offset"
	LIMIT 1) visible`,
		Args: []any{p.Topics, txIDs, offsets, partitionsOf(p.Topics, p.Partitions)},
	}
}

// partitionsOf returns partitions, or partition 0 for each topic when it is
// nil.
func partitionsOf(topics []string, partitions []int32) []int32 {
	if partitions != nil {
		return partitions
	}
	return make([]int32, len(topics))
}

// CreateSession implements [SchemaAdapter].
func (a DefaultSchemaAdapter) CreateSession(p SessionParams) Query {
	return Query{
		SQL: `WITH replaced AS (
	DELETE FROM ` + a.sessions() + ` WHERE id = $5
), inserted AS (
	INSERT INTO ` + a.sessions() + ` (id, consumer_group, owner, expires_at)
	VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond')
	RETURNING consumer_group
)
SELECT pg_notify($6, 'g' || consumer_group) FROM inserted WHERE $6 <> ''`,
		Args: []any{p.SessionID, p.ConsumerGroup, p.Owner, p.TTL.Microseconds(), p.ReplacesSessionID, p.NotifyChannel},
	}
}

// HeartbeatSession implements [SchemaAdapter].
func (a DefaultSchemaAdapter) HeartbeatSession(p SessionParams) Query {
	return Query{
		SQL: `WITH beat AS (
	UPDATE ` + a.sessions() + `
	SET expires_at = now() + $2::bigint * interval '1 microsecond'
	WHERE id = $1 AND expires_at > now()
	RETURNING 1
)
SELECT (SELECT count(*) FROM beat), pg_snapshot_xmax(pg_current_snapshot())::text,
	pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::text, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)`,
		Args: []any{p.SessionID, p.TTL.Microseconds()},
	}
}

// DeleteSession implements [SchemaAdapter].
func (a DefaultSchemaAdapter) DeleteSession(p SessionParams) Query {
	return Query{
		SQL: `WITH deleted AS (
	DELETE FROM ` + a.sessions() + ` WHERE id = $1 RETURNING consumer_group
)
SELECT pg_notify($2, 'g' || consumer_group) FROM deleted WHERE $2 <> ''`,
		Args: []any{p.SessionID, p.NotifyChannel},
	}
}

// SetSubscriptions implements [SchemaAdapter].
func (a DefaultSchemaAdapter) SetSubscriptions(p SessionParams) Query {
	return Query{
		SQL: `WITH updated AS (
	UPDATE ` + a.sessions() + ` SET subscription_hash = $2, subscription_size = $3
	WHERE id = $1
	RETURNING consumer_group
)
SELECT pg_notify($4, 'g' || consumer_group) FROM updated WHERE $4 <> ''`,
		Args: []any{p.SessionID, p.SubscriptionHash, p.SubscriptionSize, p.NotifyChannel},
	}
}

// GroupMembers implements [SchemaAdapter].
func (a DefaultSchemaAdapter) GroupMembers(p GroupParams) Query {
	return Query{
		SQL: `SELECT id, created_at, ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint,
	subscription_hash, subscription_size
FROM ` + a.sessions() + `
WHERE consumer_group = $1 AND expires_at > now()`,
		Args: []any{p.ConsumerGroup},
	}
}

// DeleteExpiredSessions implements [SchemaAdapter].
//
// Since schema version 8 no index covers expires_at (an index on it made
// every heartbeat a non-HOT update), so this is a sequential scan of the
// sessions table: one row per live Subscriber, at fillfactor 10 about
// seven to a page. Measured: 0.6 ms for 1,000 sessions, 3 ms for 10,000.
// The maintainer runs it once per MaintenanceConfig.Interval; only where
// no Subscriber may maintain does every Subscriber run it, every tenth
// heartbeat. The other readers of expires_at find their rows by id (the
// claims' join, the maintainer's election) or by consumer group
// (GroupMembers, the removal of idle groups).
func (a DefaultSchemaAdapter) DeleteExpiredSessions(p SessionParams) Query {
	return Query{
		SQL:  `DELETE FROM ` + a.sessions() + ` WHERE expires_at < now() - $1::bigint * interval '1 microsecond'`,
		Args: []any{p.TTL.Microseconds()},
	}
}

// EnsureOffsets implements [SchemaAdapter].
//
// With p.Latest, whether the group has a row of the topic is decided on
// the statement's snapshot, so the rows of a topic created by one
// statement all start at the same place. Callers pass every partition of
// a topic to the same statement: split over two, a new group's rows of
// the second would start at the beginning, the first's rows existing.
func (a DefaultSchemaAdapter) EnsureOffsets(p OffsetsParams) Query {
	return Query{
		SQL: `INSERT INTO ` + a.offsets() + ` AS o (consumer_group, topic, partition, acked_transaction_id, acked_offset)
SELECT $1, t.topic, t.partition,
	CASE WHEN $4 AND NOT EXISTS (SELECT 1 FROM ` + a.offsets() + ` g WHERE g.consumer_group = $1 AND g.topic = t.topic)
		THEN pg_snapshot_xmin(pg_current_snapshot()) ELSE '0'::xid8 END,
	0
FROM unnest($2::text[], $3::integer[]) AS t(topic, partition)
ORDER BY t.topic, t.partition
ON CONFLICT (consumer_group, topic, partition) DO NOTHING
RETURNING o.topic, o.partition, o.acked_transaction_id::text`,
		Args: []any{p.ConsumerGroup, p.Topics, partitionsOf(p.Topics, p.Partitions), p.Latest},
	}
}

// ClaimOffsets implements [SchemaAdapter].
//
// The statement decides on each row as its snapshot shows it and writes
// only if the row is still in that state when it gets the row lock, a
// compare-and-swap on (session_id, epoch). So a concurrent claim that
// committed first always makes this one fail, whatever the statement's
// snapshot shows of the sessions table. (Re-checking a sub-select on the
// sessions table instead, as an UPDATE's WHERE clause would after waiting
// for a concurrent claim, reads the old snapshot: a session created after
// it is invisible there and would count as gone.)
//
// A row is free when it has no owner, when its owner's session row is gone
// (a session row exists before its first claim commits, so an owner
// missing from the snapshot was deleted), or when the owner's session has
// expired: then the statement deletes that session row and claims only if
// the delete went through. The delete and the owner's heartbeat conflict on
// the session row's lock: either the heartbeat commits first and the
// delete, re-checking the extended expiry, does nothing (no claim), or the
// delete commits first and the heartbeat finds no row (the owner learns
// that its session is lost). A session may also claim a row it already
// owns, bumping the epoch, so that a claim whose outcome was lost in
// transit can be retried.
//
// A row whose acknowledged position lies ahead of the database's
// transaction counter (positions copied from another cluster) is not
// claimed and reported as 'f'.
//
// The statement looks at the rows in (topic, partition) order and stops
// after p.Limit rows that it can claim (or that are missing or ahead of the
// counter), so that the rows it locks are bounded and two claimers lock
// common rows in the same order.
func (a DefaultSchemaAdapter) ClaimOffsets(p OffsetsParams) Query {
	return Query{
		SQL: `WITH cur AS (
	SELECT t.topic, t.partition, o.consumer_group IS NULL AS missing, o.session_id, o.epoch,
		s.id IS NOT NULL AS owner_exists, s.owner,
		COALESCE(o.acked_transaction_id >= pg_snapshot_xmax(pg_current_snapshot()), false) AS future
	FROM unnest($2::text[], $5::integer[]) AS t(topic, partition)
	LEFT JOIN ` + a.offsets() + ` o ON o.consumer_group = $1 AND o.topic = t.topic AND o.partition = t.partition
	LEFT JOIN ` + a.sessions() + ` s ON s.id = o.session_id
	WHERE o.consumer_group IS NULL OR o.session_id IS NULL OR o.session_id = $3 OR s.id IS NULL
		OR s.expires_at < now()
	ORDER BY t.topic, t.partition
	LIMIT $4
),
expired AS (
	DELETE FROM ` + a.sessions() + ` s
	WHERE s.id IN (SELECT cur.session_id FROM cur WHERE NOT cur.future AND cur.session_id <> $3)
		AND s.expires_at < now()
	RETURNING s.id
),
claimed AS (
	UPDATE ` + a.offsets() + ` o
	SET session_id = $3, epoch = o.epoch + 1, updated_at = now()
	FROM cur
	WHERE o.consumer_group = $1 AND o.topic = cur.topic AND o.partition = cur.partition
		AND NOT cur.missing AND NOT cur.future
		AND o.session_id IS NOT DISTINCT FROM cur.session_id AND o.epoch = cur.epoch
		AND (cur.session_id IS NULL OR cur.session_id = $3 OR NOT cur.owner_exists
			OR cur.session_id IN (SELECT id FROM expired))
	RETURNING o.topic, o.partition, o.epoch, o.acked_transaction_id, o.acked_offset
)
SELECT 'c', c.topic, c.partition, c.epoch, c.acked_transaction_id::text, c.acked_offset,
	EXISTS (SELECT 1 FROM ` + a.messages() + ` m
		WHERE m.topic = c.topic AND m.partition = c.partition
			AND (m.transaction_id, m."offset") > (c.acked_transaction_id, c.acked_offset)),
	NULLIF(cur.session_id, $3), cur.owner
FROM claimed c JOIN cur ON cur.topic = c.topic AND cur.partition = c.partition
UNION ALL
SELECT CASE WHEN cur.missing THEN 'm' WHEN cur.future THEN 'f' ELSE 'l' END, cur.topic, cur.partition,
	NULL, NULL, NULL, NULL, NULL, NULL
FROM cur WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.topic = cur.topic AND c.partition = cur.partition)`,
		Args: []any{p.ConsumerGroup, p.Topics, p.SessionID, p.Limit, partitionsOf(p.Topics, p.Partitions)},
	}
}

// forwardSet is the SET list that moves the acknowledged position to
// ($6, $7) only if that lies ahead: both columns are computed from the old
// row, so they move together or not at all.
const forwardSet = `acked_transaction_id = CASE WHEN (acked_transaction_id, acked_offset) < ($6::text::xid8, $7::bigint)
		THEN $6::text::xid8 ELSE acked_transaction_id END,
	acked_offset = CASE WHEN (acked_transaction_id, acked_offset) < ($6::text::xid8, $7::bigint)
		THEN $7::bigint ELSE acked_offset END,
	head_deliveries = CASE WHEN (acked_transaction_id, acked_offset) < ($6::text::xid8, $7::bigint)
		THEN 0 ELSE head_deliveries END`

// notFuture refuses to write a position ($6) that is not below the
// database's transaction counter. Every position a Subscriber reads lies
// below the xmin horizon of the moment it was read, and the counter only
// grows, so such a position was read from another timeline: the database
// failed over to a standby that lagged, or was restored. Written, it would
// skip what the database hands those transaction ids out to now. Refused,
// the write reports ownership lost and the row is claimed again from the
// position the database has.
const notFuture = `$6::text::xid8 < pg_snapshot_xmax(pg_current_snapshot())`

// CommitOffset implements [SchemaAdapter].
//
// While a transaction holds the vacuum horizon (a pg_dump, a long report),
// every commit leaves a version of the row behind that nothing can
// remove, and a lookup by the primary key visits all of them: the index
// entry of each page they span, and the chain of versions on each page.
// Measured with 100 rows and 3,000 versions of each, commits by the key ran
// at a quarter of their first rate. So the statement first updates the
// version at p.Version (a TID scan: that one tuple) and looks the row up
// by its key only when that updated nothing: no hint, or the version was
// replaced (a claim, AckInTx, a delivery count, a release) or moved
// (VACUUM FULL). The key lookup is gated on the first update returning
// nothing, so it is not even started when the hint held. Both updates
// have the same conditions, so the outcome is the keyed statement's
// either way: if a concurrent transaction changed the row, PostgreSQL
// re-checks the conditions on its latest version (and a hint whose
// version another transaction replaced before this statement's snapshot
// finds nothing visible, and the key lookup decides).
func (a DefaultSchemaAdapter) CommitOffset(p OffsetParams) Query {
	update := `UPDATE ` + a.offsets() + `
	SET ` + forwardSet + `, updated_at = now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND ` + notFuture
	return Query{
		SQL: `WITH hinted AS (
	` + update + ` AND ctid = NULLIF($8, '')::tid
	RETURNING ctid
), keyed AS (
	` + update + ` AND NOT EXISTS (SELECT 1 FROM hinted)
	RETURNING ctid
)
SELECT ctid::text FROM hinted
UNION ALL
SELECT ctid::text FROM keyed`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Position.Offset, p.Version},
	}
}

// ReleaseOffset implements [SchemaAdapter]. The command tag counts the
// rows released (zero when ownership was lost).
func (a DefaultSchemaAdapter) ReleaseOffset(p OffsetParams) Query {
	update := `UPDATE ` + a.offsets() + `
SET ` + forwardSet + `,
	session_id = NULL, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
	AND ` + notFuture
	args := []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		formatXID8(p.Position.TransactionID), p.Position.Offset}
	if p.NotifyChannel == "" {
		return Query{SQL: update, Args: args}
	}
	return Query{
		SQL: `WITH released AS (
` + update + `
RETURNING topic
)
SELECT pg_notify($8, 'r' || topic) FROM released`,
		Args: append(args, p.NotifyChannel),
	}
}

// CountHeadDelivery implements [SchemaAdapter].
func (a DefaultSchemaAdapter) CountHeadDelivery(p OffsetParams) Query {
	return Query{
		SQL: `UPDATE ` + a.offsets() + ` SET head_deliveries = head_deliveries + 1
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
	AND acked_transaction_id = $6::text::xid8 AND acked_offset = $7
RETURNING head_deliveries`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Position.Offset},
	}
}

// AckOffset implements [SchemaAdapter]. The UPDATE finds the row in the
// statement's snapshot; if a claim changed it since, PostgreSQL re-checks
// the WHERE clause on the latest version, which is the one cur locked and
// read, so the decision and the write are made on the same version.
func (a DefaultSchemaAdapter) AckOffset(p OffsetParams) Query {
	return Query{
		SQL: `WITH cur AS (
	SELECT session_id, epoch, acked_transaction_id, acked_offset FROM ` + a.offsets() + `
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3
	FOR UPDATE
), advanced AS (
	UPDATE ` + a.offsets() + ` o
	SET acked_transaction_id = $6::text::xid8, acked_offset = $7, head_deliveries = 0, updated_at = now()
	FROM cur
	WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3
		AND cur.session_id = $4 AND cur.epoch = $5
		AND (cur.acked_transaction_id, cur.acked_offset) < ($6::text::xid8, $7::bigint)
		AND ` + notFuture + `
	RETURNING 1
)
SELECT cur.session_id, cur.epoch, cur.acked_transaction_id::text, cur.acked_offset, EXISTS (SELECT 1 FROM advanced)
FROM cur`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Position.Offset},
	}
}

// SchemaSQL returns the whole DDL of the adapter's current schema version as
// one script, for users who run migrations with their own tool and leave
// schema initialization off. The script is idempotent and records the
// versions it creates, so automatic initialization run later is a no-op.
func SchemaSQL(adapter SchemaAdapter) string {
	if adapter == nil {
		adapter = DefaultSchemaAdapter{}
	}
	var b strings.Builder
	b.WriteString("BEGIN;\n")
	for _, s := range adapter.Prepare() {
		b.WriteString(s)
		b.WriteString(";\n")
	}
	for _, m := range adapter.Migrations() {
		sql := strings.TrimSpace(m.SQL)
		if !strings.HasSuffix(sql, ";") {
			sql += ";"
		}
		fmt.Fprintf(&b, "\n-- version %d: %s\n%s\n", m.Version, m.Description, sql)
		fmt.Fprintf(&b, "INSERT INTO %s (version, description) VALUES (%d, %s) ON CONFLICT (version) DO NOTHING;\n",
			adapter.VersionTable(), m.Version, quoteLiteral(m.Description))
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Migrate creates the tables of adapter (nil: DefaultSchemaAdapter{}), or
// upgrades them to the latest schema version: the explicit schema step,
// run as the role that is to own the tables (a deploy job, the command
// `pglease migrate`), so that the application itself can run as a role
// that owns nothing (see [GrantSQL]). It is what
// SubscriberConfig.InitializeSchema, PublisherConfig.AutoInitializeSchema
// and TopicConfig.InitializeSchema run.
//
// It is idempotent and safe to run from many processes at once: the
// missing migrations run in one transaction under an advisory lock
// ([SchemaAdapter.SchemaLockKey]), and a schema found current is left
// alone without waiting for the lock. db may be a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx (then in a savepoint, and the lock is held until
// the caller's transaction ends).
func Migrate(ctx context.Context, db DB, adapter SchemaAdapter) error {
	if isNilDB(db) {
		return fmt.Errorf("%w: Migrate needs a *pgxpool.Pool, *pgx.Conn or pgx.Tx, got nil", ErrInvalidConfig)
	}
	if adapter == nil {
		adapter = DefaultSchemaAdapter{}
	}
	if a, ok := adapter.(DefaultSchemaAdapter); ok {
		if err := a.validate(); err != nil {
			return fmt.Errorf("%w: Migrate: %w", ErrInvalidConfig, err)
		}
	}
	return initializeSchema(ctx, db, adapter)
}

// beginner is what schema initialization needs: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool all provide it (on a pgx.Tx, Begin opens a savepoint).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// initializeSchema applies the adapter's missing migrations. It is
// idempotent and safe to run from many goroutines and processes at once:
// everything runs in one transaction holding an advisory lock, so set-ups
// serialize and each later one finds the work done.
//
// Most calls find the schema current, where Subscribers come and go: they
// read the recorded version first, without the lock, and stop there. Only
// a schema that is missing or behind waits for the lock (which a paused
// process may hold for as long as it is paused).
func initializeSchema(ctx context.Context, db beginner, adapter SchemaAdapter) error {
	latest := 0
	for _, m := range adapter.Migrations() {
		latest = max(latest, m.Version)
	}
	if schemaIsCurrent(ctx, db, adapter.VersionTable(), latest) {
		return nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("initialize schema: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, adapter.SchemaLockKey()); err != nil {
		return fmt.Errorf("initialize schema: lock: %w", err)
	}
	for _, s := range adapter.Prepare() {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("initialize schema: %w", err)
		}
	}
	var current int
	if err := tx.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM `+adapter.VersionTable()).Scan(&current); err != nil {
		return fmt.Errorf("initialize schema: read version: %w", err)
	}
	for _, m := range adapter.Migrations() {
		if m.Version <= current {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("initialize schema: migration %d (%s): %w", m.Version, m.Description, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+adapter.VersionTable()+` (version, description) VALUES ($1, $2)`,
			m.Version, m.Description); err != nil {
			return fmt.Errorf("initialize schema: record version %d: %w", m.Version, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("initialize schema: commit: %w", err)
	}
	return nil
}

// schemaIsCurrent tells whether the version table records latest: false
// too when it cannot be read (then the locked path creates it or reports
// why not). It reads in a transaction of its own, a savepoint on a pgx.Tx,
// which a missing table aborts.
func schemaIsCurrent(ctx context.Context, db beginner, versionTable string, latest int) bool {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var current int
	err = tx.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM `+versionTable).Scan(&current)
	return err == nil && current >= latest
}

// wrapMissingSchema adds what to do to the errors that say that the
// tables are missing or that the role may not use them.
func wrapMissingSchema(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "42P01": // undefined_table
		return fmt.Errorf("%w (the pglease tables are missing: run pglease.Migrate or `pglease migrate` as the role that is to own them, "+
			"or apply pglease.SchemaSQL with your migration tool)", err)
	case "42501": // insufficient_privilege
		return fmt.Errorf("%w (the role lacks pglease's grants: have the owner of the tables run pglease.GrantSQL "+
			"or `pglease grant --role NAME`)", err)
	}
	return err
}
