// Package pgsql holds every SQL statement pglease runs, with the columns
// each returns and how they are scanned.
//
// The statements the Subscriber, the Publisher, the maintainer and the
// admin tools run go through a [Driver]: one method per operation, taking
// a [Querier] and typed parameters and returning typed rows. There are
// two drivers, one per kind of database: the single node's
// ([NewSingleNode]), whose every operation is one statement, and Citus's
// ([NewCitus]), for tables distributed by [Tables.DistributeScript],
// where some operations are statements of their own or several
// statements. [OpenDriver] reads from the catalog which one applies, once;
// [Lazy] does so on first use, for the components whose constructors must
// not touch the database. The Citus driver does not embed the single-node
// one: each of its methods is written out, its own statements or a
// one-line delegation to the single-node method, so that an operation
// added to [Driver] without its Citus variant does not compile.
//
// The single-node statements are built by methods of [Tables] (the SQL
// text and its arguments, as a [Stmt]); [Tables] holds names only and is
// immutable. The statements that are the same whatever the mode
// (migrations, grants, LISTEN/NOTIFY, the server's identity, the import
// from watermill-sql) are free functions. The schema's migrations are the
// .sql files of migrations/, embedded.
//
// Nothing here is API: the package is internal, so that a statement can
// change without a change of pglease's exported API.
package pgsql

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs statements: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and
// pgx.Tx satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Stmt is one SQL statement and its arguments.
type Stmt struct {
	SQL  string
	Args []any
}

// Queue adds the statement to b.
func (s Stmt) Queue(b *pgx.Batch) *pgx.QueuedQuery { return b.Queue(s.SQL, s.Args...) }

// QueryRow runs the statement on q, for a row scanned later (see [ScanAck]).
func (s Stmt) QueryRow(ctx context.Context, q Querier) pgx.Row {
	return q.QueryRow(ctx, s.SQL, s.Args...)
}

var (
	_ Querier = (*pgxpool.Pool)(nil)
	_ Querier = (*pgxpool.Conn)(nil)
	_ Querier = (*pgx.Conn)(nil)
	_ Querier = pgx.Tx(nil)
)

// Default table names.
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

// Names are the configured names, as users give them (unquoted; empty
// means the default name, or for Schema the connection's search_path).
type Names struct {
	Schema                string
	MessagesTable         string
	ConsumerSessionsTable string
	ConsumerOffsetsTable  string
	SchemaVersionTable    string
	TopicsTable           string
	DelayedTable          string
	MaintenanceTable      string
	RetentionTable        string
}

// Tables are the quoted, schema-qualified names of one set of tables, and
// what derives from them. Build them with [NewTables]; they are read-only
// after that and safe for concurrent use.
type Tables struct {
	Names

	Messages    string
	Sessions    string
	Offsets     string
	Version     string
	Topics      string
	Delayed     string
	Maintenance string
	Retention   string
	// Keys is the table of idempotency keys (schema version 15), named
	// after the messages table as its partitions are.
	Keys string

	// NotifyChannel is the LISTEN/NOTIFY channel of this messages table,
	// derived from its quoted name, so that each set of tables has its
	// own channel, and short enough for any table name. Each payload
	// starts with its kind ([NotifyMessages] and the others).
	NotifyChannel string
	// LockKey is the key of the transaction-level advisory lock taken
	// while migrations run, so that concurrent set-ups serialize.
	LockKey string
}

// NewTables quotes the names of n.
func NewTables(n Names) *Tables {
	t := &Tables{Names: n}
	t.Messages = t.ident(n.MessagesTable, DefaultMessagesTable)
	t.Sessions = t.ident(n.ConsumerSessionsTable, DefaultConsumerSessionsTable)
	t.Offsets = t.ident(n.ConsumerOffsetsTable, DefaultConsumerOffsetsTable)
	t.Version = t.ident(n.SchemaVersionTable, DefaultSchemaVersionTable)
	t.Topics = t.ident(n.TopicsTable, DefaultTopicsTable)
	t.Delayed = t.ident(n.DelayedTable, DefaultDelayedTable)
	t.Maintenance = t.ident(n.MaintenanceTable, DefaultMaintenanceTable)
	t.Retention = t.ident(n.RetentionTable, DefaultRetentionTable)
	t.Keys = t.partition("keys")
	sum := sha256.Sum256([]byte(t.Messages))
	t.NotifyChannel = "pglease_" + hex.EncodeToString(sum[:8])
	t.LockKey = "pglease schema " + t.Messages
	return t
}

func (t *Tables) ident(name, def string) string {
	if name == "" {
		name = def
	}
	if t.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, name}.Sanitize()
}

// PartitionName returns the bare (unquoted, unqualified) name of a
// partition of the messages table (or of one of the maintainer's
// functions): its name, "_" and suffix, with the table's name shortened
// (at a character boundary, see [cutName]) and a hash of it added when
// that would exceed PostgreSQL's 63 bytes.
func (t *Tables) PartitionName(suffix string) string {
	base := t.MessagesTable
	if base == "" {
		base = DefaultMessagesTable
	}
	name := base + "_" + suffix
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(base))
	return cutName(base, 63-len(suffix)-10) + "_" + hex.EncodeToString(sum[:4]) + "_" + suffix
}

// cutName returns the longest prefix of s of at most n bytes that does
// not end inside a UTF-8 character (a name cut inside one is not valid
// text, which PostgreSQL refuses): PostgreSQL's own truncation of long
// identifiers cuts the same way.
func cutName(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func (t *Tables) partitionName(suffix string) string { return t.PartitionName(suffix) }

// PositionSequence is the quoted, schema-qualified name of the sequence
// that messages take their positions from (schema version 14, a single
// node).
func (t *Tables) PositionSequence() string { return t.partition("positions") }

// PositionBoundFunction is the quoted, schema-qualified name of the
// function that computes the readers' bound (schema version 14).
func (t *Tables) PositionBoundFunction() string { return t.partition("position_bound") }

// CitusPositionFunction is the quoted, schema-qualified name of the
// trigger function that takes a message's position on its worker when the
// messages table is distributed ([Tables.DistributeScript]).
func (t *Tables) CitusPositionFunction() string { return t.partition("citus_take_position") }

// WorkerBoundFunction is the quoted, schema-qualified name of the
// function, on each Citus worker, that computes the readers' bound of
// one topic's partitions ([Tables.WorkerScript]).
func (t *Tables) WorkerBoundFunction() string { return t.partition("worker_bound") }

// WorkerCounterFunction is the quoted, schema-qualified name of the
// function, on each Citus worker, that returns the position the worker's
// sequence hands out next ([Tables.WorkerScript]).
func (t *Tables) WorkerCounterFunction() string { return t.partition("worker_next") }

// WorkerHolderFunction is the quoted, schema-qualified name of the
// function, on each Citus worker, that names the transaction there that
// holds one topic's partition's bound lowest ([Tables.WorkerScript],
// [Driver.BoundHolder]).
func (t *Tables) WorkerHolderFunction() string { return t.partition("worker_holder") }

// WorkerVisibleFunction is the quoted, schema-qualified name of the
// function, on each Citus worker, that runs the idle poll of many
// (topic, partition) rows there at once ([Tables.WorkerScript],
// [Driver.VisibleTopics]).
func (t *Tables) WorkerVisibleFunction() string { return t.partition("worker_visible") }

// workerVisibleSignature is the signature of WorkerVisibleFunction.
const workerVisibleSignature = `(topics text[], partitions integer[], positions text[], offsets bigint[],
	OUT visible integer[], OUT away integer[], OUT away_groups integer[])`

// workerVisibleArgs are the argument types of WorkerVisibleFunction, as
// to_regprocedure takes them.
const workerVisibleArgs = `(text[], integer[], text[], bigint[])`

// workerHolderSignature is the signature of WorkerHolderFunction: the
// columns of the single node's BoundHolder, and the worker's node.
const workerHolderSignature = `(topic text, part integer, OUT v text, OUT pid integer, OUT gid text, OUT application_name text,
	OUT state text, OUT xact_start timestamptz, OUT query_start timestamptz, OUT age_seconds float8, OUT query text,
	OUT datname text, OUT usename text, OUT node text)`

// RegisterFunction is the quoted, schema-qualified name of the function
// with which pglease's insert statements register their topic's
// partitions before their rows take positions (schema version 18).
func (t *Tables) RegisterFunction() string { return t.partition("register") }

// NextPositionFunction is the quoted, schema-qualified name of the
// function that gives pglease's insert statement its one position
// (schema version 20; see [Tables.registered]).
func (t *Tables) NextPositionFunction() string { return t.partition("next_position") }

// partition returns the quoted, schema-qualified name of a partition.
func (t *Tables) partition(suffix string) string {
	if t.Schema == "" {
		return pgx.Identifier{t.partitionName(suffix)}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.partitionName(suffix)}.Sanitize()
}

// indexName builds a quoted index name from a table name; indexes live in
// the table's schema, so the name is not schema-qualified.
func (t *Tables) indexName(table, def, suffix string) string {
	return pgx.Identifier{t.indexBareName(table, def, suffix)}.Sanitize()
}

// indexBareName is indexName unquoted.
func (t *Tables) indexBareName(table, def, suffix string) string {
	if table == "" {
		table = def
	}
	// PostgreSQL truncates identifiers to 63 bytes, at a character
	// boundary.
	return cutName(table+"_"+suffix, 63)
}

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

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Position is a message's position: (transaction_id, offset).
type Position struct {
	TransactionID uint64
	Offset        int64
}

func formatXID8(x uint64) string { return strconv.FormatUint(x, 10) }

// parseXID8 parses an xid8 read as text.
func parseXID8(s string) (uint64, error) {
	x, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse xid8 %q: %w", s, err)
	}
	return x, nil
}

// xid8 is a scan target for an xid8 column read as text (`::text`: pgx has
// no codec for the type), written as a conversion of the uint64 it fills:
// row.Scan((*xid8)(&pos.TransactionID)). A NULL is an error; a nullable
// column scans into a **xid8.
type xid8 uint64

// ScanText implements pgtype.TextScanner.
func (x *xid8) ScanText(v pgtype.Text) error {
	if !v.Valid {
		return errors.New("parse xid8: NULL")
	}
	n, err := parseXID8(v.String)
	if err != nil {
		return err
	}
	*x = xid8(n)
	return nil
}

// parseXID8Bytes is [parseXID8] of a column's raw text. The conversion to
// a string does not escape, so it is not allocated.
func parseXID8Bytes(b []byte) (uint64, error) {
	x, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse xid8 %q: %w", b, err)
	}
	return x, nil
}
