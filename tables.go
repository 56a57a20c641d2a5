package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Default table names of [Tables].
const (
	DefaultMessagesTable         = pgsql.DefaultMessagesTable
	DefaultConsumerSessionsTable = pgsql.DefaultConsumerSessionsTable
	DefaultConsumerOffsetsTable  = pgsql.DefaultConsumerOffsetsTable
	DefaultSchemaVersionTable    = pgsql.DefaultSchemaVersionTable
	DefaultTopicsTable           = pgsql.DefaultTopicsTable
	DefaultDelayedTable          = pgsql.DefaultDelayedTable
	DefaultMaintenanceTable      = pgsql.DefaultMaintenanceTable
	DefaultRetentionTable        = pgsql.DefaultRetentionTable
)

// Tables names pglease's tables and their schema: one
// messages table for all topics, one row per live Subscriber in the
// sessions table, and one row per (consumer group, topic, partition) in the
// offsets table, and the tables of topic settings, delayed messages,
// retention and the maintainer. It is what SubscriberConfig,
// PublisherConfig, TopicConfig, [Migrate], [SchemaSQL], [GrantSQL] and the
// admin and import packages (admin.NewInspector, wmsqlimport.Config) take.
//
// The zero value uses the default table names in the connection's
// search_path. Names are quoted, so they are used exactly as given.
// A Tables is safe for concurrent use.
//
// It holds names only: the statements pglease runs on these tables are
// not part of the API. The configuration fields that take it are named
// Tables; their former name, SchemaAdapter, is kept, deprecated, for one
// release.
type Tables struct {
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

// DefaultSchemaAdapter is the former name of [Tables].
//
// Deprecated: use Tables. The alias will be removed in the next minor
// release.
type DefaultSchemaAdapter = Tables

// tables returns the quoted names of a's tables.
func (a Tables) tables() *pgsql.Tables {
	return pgsql.NewTables(pgsql.Names(a))
}

// validate checks the configured names.
func (a Tables) validate() error { return check.TableNames(pgsql.Names(a)) }

// checkTables validates the table names of a configuration, set by its
// Tables field or by SchemaAdapter, the field's deprecated name: one of
// the two, or both to the same names. config names the configuration
// (PublisherConfig) in the errors, which name the field that was set.
func checkTables(config string, tables, schemaAdapter Tables) error {
	if tables != (Tables{}) && schemaAdapter != (Tables{}) && tables != schemaAdapter {
		return fmt.Errorf("%s.Tables and %s.SchemaAdapter (the deprecated name of Tables) are both set, to different tables: set Tables only",
			config, config)
	}
	field, t := "Tables", tables
	if t == (Tables{}) {
		field, t = "SchemaAdapter", schemaAdapter
	}
	if err := t.validate(); err != nil {
		return fmt.Errorf("%s.%s: %w", config, field, err)
	}
	return nil
}

// pickTables returns the tables a configuration names: Tables, or
// SchemaAdapter, the field's deprecated name, when Tables is not set.
func pickTables(tables, schemaAdapter Tables) Tables {
	if tables == (Tables{}) {
		return schemaAdapter
	}
	return tables
}

// SchemaSQL returns the whole DDL of the current schema version of tables
// as one script, for users who run migrations with their own tool and leave
// schema initialization off. The script is idempotent and records the
// versions it creates, so automatic initialization run later is a no-op.
func SchemaSQL(tables Tables) string {
	return tables.tables().Script()
}

// Migrate creates tables (Tables{}: the default names), or upgrades them
// to the latest schema version: the explicit schema step, run as the role
// that is to own the tables (a deploy job, the command `pglease
// migrate`), so that the application itself can run as a role that owns
// nothing (see [GrantSQL]). It is what SubscriberConfig.InitializeSchema,
// PublisherConfig.AutoInitializeSchema and TopicConfig.InitializeSchema
// run.
//
// It is idempotent and safe to run from many processes at once: the
// missing migrations run in one transaction under an advisory lock (on a
// key derived from the messages table's name), and a schema found current
// is left alone without waiting for the lock. db may be a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx (then in a savepoint, and the
// lock is held until the caller's transaction ends).
func Migrate(ctx context.Context, db DB, tables Tables) error {
	if isNilDB(db) {
		return fmt.Errorf("%w: Migrate needs a *pgxpool.Pool, *pgx.Conn or pgx.Tx, got nil", ErrInvalidConfig)
	}
	if err := tables.validate(); err != nil {
		return fmt.Errorf("%w: Migrate: %w", ErrInvalidConfig, err)
	}
	return initializeSchema(ctx, db, tables.tables())
}

// initializeSchema applies the missing migrations of a (see
// pgsql.Migrate). db is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx (then in
// a savepoint).
func initializeSchema(ctx context.Context, db pgsql.Beginner, t *pgsql.Tables) error {
	return wrapSetUpDenied(pgsql.Migrate(ctx, db, t, t.Migrations()), t.Schema)
}

// schemaOnce initializes the schema until it has succeeded once: the
// Publisher's AutoInitializeSchema and the Subscriber's InitializeSchema.
// Calls wait for one under way; a failed one is tried again by the next.
type schemaOnce struct {
	mu   sync.Mutex
	done bool
}

func (o *schemaOnce) run(ctx context.Context, db pgsql.Beginner, t *pgsql.Tables) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return nil
	}
	if err := initializeSchema(ctx, db, t); err != nil {
		return err
	}
	o.done = true
	return nil
}

// wrapSetUpDenied adds what to do to a permission error of the schema
// set-up: typically an application role, which owns nothing, that
// initializes the schema, or migrates, with Tables.Schema
// empty, and gets "permission denied for schema public" (PostgreSQL 15 and
// later let only public's owner create in it).
func wrapSetUpDenied(err error, schema string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
		return err
	}
	where := "the schema of the search_path (Tables.Schema is empty)"
	if schema != "" {
		where = "schema " + pgx.Identifier{schema}.Sanitize()
	}
	return fmt.Errorf("%w (this role may not create or upgrade the pglease tables in %s: run pglease.Migrate or "+
		"`pglease migrate` as the role that is to own them, and run the application without schema initialization, "+
		"with the grants of pglease.GrantSQL; if the tables are in another schema, set Tables.Schema to it)",
		err, where)
}

// wrapMissingSchema adds what to do to the errors that say that the
// tables are missing or that the role may not use them.
func wrapMissingSchema(err error) error { return check.MissingSchema(err) }

// DistributeSQL returns the script that distributes tables over a Citus cluster: the messages and offsets tables distributed by
// topic and co-located, the others reference tables, and on each worker
// the sequence positions come from, the trigger that takes a message's
// position there and the readers' bound (decision 0008, "Citus, as
// built"). The
// tables' owner runs it on the coordinator after [Migrate] (`pglease
// migrate --citus` runs both), before the applications start; it may be
// run again. It refuses tables that hold messages or consumer group
// positions: distribute them while they are empty (docs/scaling.md,
// "Moving to Citus"). pglease reads whether the messages table is
// distributed when it first uses it, and then runs the statements that
// Citus routes to a topic's worker. See docs/scaling.md for what runs on
// Citus.
func DistributeSQL(tables Tables) string {
	return tables.tables().DistributeScript()
}

// PrepareCitusMoveSQL returns the script to run on the coordinator of a
// Citus cluster right before moving a shard to the worker at host:port
// (citus_move_shard_placement): it raises that worker's position sequence
// to at least margin (at least 2^32) above the highest position any
// worker handed out (a setval: instant). Positions come from the sequence
// of the topic's worker; a topic moved to a worker whose sequence is
// lower would stall (its positions ahead of that worker's), and its new
// messages would sort below the groups' positions and be skipped. The
// margin must exceed the positions the source hands out between the
// script and the move. It refuses a target without the sequence (a worker
// added after `pglease migrate --citus`: run it again). Move shards one at
// a time, each after its script: see "Moving shards" in docs/scaling.md.
func PrepareCitusMoveSQL(host string, port int, margin uint64) string {
	return pgsql.PrepareMoveScript(host, port, margin)
}

// PrepareCitusShardMoveSQL is PrepareCitusMoveSQL for a move from the
// worker at srcHost:srcPort to the one at host:port: it raises the
// target's sequence to margin above the source's only, and leaves it
// alone when it is there already. The moved rows and the groups'
// positions of their topics were taken on the source; no other worker's
// sequence matters to the move. `pglease move-shard` and `pglease
// rebalance` run it.
func PrepareCitusShardMoveSQL(srcHost string, srcPort int, host string, port int, margin uint64) string {
	return pgsql.PrepareShardMoveScript(srcHost, srcPort, host, port, margin)
}
