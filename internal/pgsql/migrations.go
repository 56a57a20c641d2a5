package pgsql

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The migrations are the files of migrations/, text with placeholders
// that [Tables.render] fills in:
//
//   - {{messages}}, {{sessions}}, ...: a table's quoted, schema-qualified
//     name (see [Tables.placeholders] for the list); {{..._literal}}: that
//     name as an SQL string constant;
//   - {{include FILE}}: FILE, rendered;
//   - {{do FILE}}: FILE, rendered, as an anonymous code block (DO), in a
//     dollar quote whose tag the names do not contain;
//   - {{dollar FILE}}: FILE, rendered, dollar-quoted the same way;
//   - {{execute FILE}}: the statements of FILE (separated by ";" at the end
//     of a line), rendered, each as a PL/pgSQL EXECUTE of a string constant
//     (a PERFORM stays as it is).
//
// Names are substituted once, never scanned again, so a configured name
// may hold anything. One trailing newline of each file is dropped.
//
//go:embed migrations/*.sql migrations/*.plpgsql
var migrationFiles embed.FS

// Notes on the versions whose files are not self-explanatory.
//
// Version 6 (0006_maintenance.sql):
// it turns the messages table into a table partitioned by
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
//
// 0006_keep_access.plpgsql is the PL/pgSQL, run right after the conversion of
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
//
// Version 7 (0007_functions.sql):
// it creates the functions through which a maintainer whose role
// does not own the tables adds, expires and drops retention partitions.
// They are SECURITY DEFINER functions of the messages table's owner (set so
// even when a superuser runs the migration), with a pinned search_path and
// every name schema-qualified inside: the schema is the messages table's,
// read when the migration runs (with Schema empty, the search_path
// decides where the tables are). EXECUTE is revoked from PUBLIC and from
// every role that may not DELETE from the messages table, and granted to
// every role that may, so that an upgrade needs no new grant for the
// roles that consume, and a role that may only publish gets nothing.
//
// Each function takes a retention class and the slot's start (and end) in
// Unix seconds, builds the partition's name itself, as partitionName does,
// and acts only on tables of that name in the messages table's schema that
// are retention partitions of the messages table (attached, or, for
// drop_detached_partition, detached and shaped like one): no argument
// names a table. The arguments must be one slot of the class (its width
// as retentionSlot computes it, from a multiple of the width);
// expire_retention_partition acts only on a slot that has passed (by the
// database's clock), on a partition whose bounds are exactly that slot's.
//
// Version 9 (0009_functions.sql) runs the script of version 7 again: the
// functions of version 7 of earlier releases accepted any range, expired
// any partition, and were granted to every role that could INSERT into the
// messages table, publishers included.
//
// The lock_timeout of expire_retention_partition (500ms) bounds how long
// it waits for its lock on the messages table: a plain DETACH PARTITION
// takes an ACCESS EXCLUSIVE lock, and while it waits for transactions that
// use the table, publishers and readers queue behind it. See "Detach
// through the owner's function" in benchmarks/measurements.md for what
// it costs them.
//
// Version 8 (0008_hot_tables.sql):
// it makes the hot tables cheap to update while the vacuum horizon
// is held: the sessions table loses its index on expires_at, the one
// column a heartbeat writes that was indexed (so no heartbeat was HOT);
// the statements that used it stay cheap without it (see
// DeleteExpiredSessions), and both tables get the fillfactor (10). ALTER TABLE
// SET keeps owner and grants, takes a lock that blocks neither reads nor
// writes, and affects only pages written from now on: existing rows move
// to such pages as they are updated, and VACUUM FULL rewrites a table at
// once (see docs/operations.md). The DROP comes last, so that its lock is
// held the shortest; its lock timeout is put back after it.
//
// The fillfactor (10) is the fillfactor of the sessions and offsets tables from
// schema version 8 on. While a transaction holds the vacuum horizon (a
// pg_dump, a long report), every heartbeat and offset commit leaves a
// version of its row that nothing can remove; an update is HOT (no index
// entry) only while the row's page has room for the new version. Rows are
// inserted, and moved by updates that do not fit, into pages filled up to
// the fillfactor, so 10 leaves nine tenths of each page to the versions of
// its six or seven rows. Measured (benchmarks/measurements.md, "Hot tables
// under a held vacuum horizon"), one connection committing 100 rows in turn:
// 91 % of the commits were HOT with 10, 77 % with 25, 57 % with 50 and
// none with 100. A commit that is not HOT checks the primary key's
// uniqueness against every index entry of its row (one per such commit),
// so the share that is not HOT counts twice: more such commits, each
// checking more entries.
//
// Its lock_timeout (2s) bounds how long migration 8 waits for its lock on the
// sessions table. DROP INDEX takes an ACCESS EXCLUSIVE lock, which waits
// for every transaction that read the table, a pg_dump's included, and
// heartbeats queue behind it meanwhile: the migration gives up instead,
// and is retried by the next set-up.

// migrations are the versions of the schema, oldest first: a version's
// file, and its description as recorded in the version table.
var migrations = []struct {
	file        string
	description string
}{
	{"0001_messages_sessions_offsets.sql", "messages, consumer sessions and consumer offsets"},
	// Version 1 claimed a row when COALESCE(lease_expires_at, owner
	// session's expiry) had passed, but nothing ever set the column. From
	// version 2 on, a row's claim lives exactly as long as its owner's
	// session. The column stays, always NULL, so that Subscribers of
	// version 1 keep working during a rolling upgrade; a later migration
	// drops it.
	{"0002_lease_expires_at_unused.sql", "consumer_offsets.lease_expires_at is no longer used"},
	{"0003_group_subscriptions.sql", "consumer groups: the rows each session subscribes to"},
	// A topic without a row has one partition. The count only grows.
	{"0004_topics.sql", "topic settings: partition count"},
	{"0005_head_deliveries.sql", "delivery attempts: claims that handed out the message after the position"},
	{"0006_maintenance.sql", "maintenance: retention partitions, delayed messages, the maintainer's election"},
	{"0007_functions.sql", "least privilege: the maintainer's partition DDL through the owner's SECURITY DEFINER functions"},
	{"0008_hot_tables.sql", "hot tables: heartbeats and offset commits as HOT updates (fillfactor, no index on sessions.expires_at)"},
	{"0009_functions.sql", "least privilege: the maintainer's functions accept only whole slots of a class, expire only passed ones, and are executable only by roles that may delete messages"},
	// acked_above holds the positions that AckInTx acknowledged above
	// an unacknowledged message (MaxInFlight above 1), as "xid:offset",
	// until the position passes them.
	{"0010_acked_above.sql", "parallel delivery: positions acknowledged in a transaction above the committed position"},
	// protocol is the version of the group's rules a session follows.
	// Releases before the column insert sessions without it: the
	// default, 1, is theirs. Adding a column with a constant default
	// rewrites nothing, and no statement of those releases names it.
	{"0011_session_protocol.sql", "consumer groups: the version of the group's rules each session follows"},
	{"0012_guards.sql", "limits in the database: positions set by the database, topic name and partition count checks, retention partitions only where the maintainer adds them"},
	// usable_until lags covered_until until no transaction that had the
	// messages table open when a partition was attached still runs (see
	// the file). Releases before it place by covered_until, as before.
	{"0013_usable_until.sql", "retention: publishers use a new partition only once no transaction that could route without it runs"},
	// Positions from a sequence, read below a bound that only the
	// publishers of the same topic hold back (docs/decisions/0008). A
	// distributed messages table is left as it is.
	{"0014_positions.sql", "positions held back only by the publishers of the same topic: a sequence, the publishers' registration, the readers' bound (single node)"},
	// The keys table is new: nothing before it reads or writes it.
	{"0015_idempotency_keys.sql", "idempotent publish: the idempotency keys of published messages, per topic, forgotten by truncating a day's partition"},
	// waiting is written only while a Subscriber of the group sets Retry
	// (see the file); earlier releases ignore it.
	{"0016_waiting.sql", "failure policy: the messages of a row that failed and wait for their next attempt"},
	// The same function, a new body: a release that calls it gets the same
	// bounds, sooner.
	{"0017_bound_fast.sql", "positions: the readers' bound reads pg_locks only for partitions whose key a transaction holds"},
	// A new column with no default for the rows stored (they read NULL,
	// nothing is rewritten), a new function, the trigger's WHEN clause
	// with a branch for the new column: releases before it do not name
	// the column and keep the trigger as it was.
	{"0018_registered_inserts.sql", "positions: pglease's inserts register their partitions once per statement, and the trigger tests the registration only of inserts that did not"},
	// handed_out is written only while a Subscriber of the group sets
	// Retry; earlier releases ignore it (a stale mark only makes a later
	// owner count one attempt more for the messages below it).
	{"0019_handed_out.sql", "failure policy: how far the row's owner handed messages out, so that a new owner counts their attempts"},
	// The same functions with new bodies, the trigger with a shorter WHEN
	// clause: a row of any release gets the position it got before.
	{"0020_cheaper_positions.sql", "positions: the trigger's WHEN clause tests only the rows pglease's statements registered; the registration runs no query per step"},
	// A new column of the retention table that no earlier release
	// names, a new function, the same function with a new body. Releases
	// before it write class 0 (day) rows only, which this release writes
	// too for two days after a class's partitions became usable.
	{"0021_key_windows.sql", "idempotent publish: a topic with a retention longer than a day recognises keys for its retention, in partitions per retention class that the maintainer makes and empties"},
	// Two new columns of the topics table that no earlier release
	// names: a release before writes a topic's keys by its retention
	// alone (day rows for a topic without one), and leaves the columns
	// as they are when it sets the topic again.
	{"0022_key_window.sql", "idempotent publish: a key window set per topic, for topics without a retention (or a shorter one)"},
}

// Migrations returns every schema version, oldest first, for these tables.
func (t *Tables) Migrations() []Migration {
	out := make([]Migration, len(migrations))
	for i, m := range migrations {
		out[i] = Migration{Version: i + 1, Description: m.description, SQL: t.render(m.file)}
	}
	return out
}

var placeholder = regexp.MustCompile(`\{\{([a-z][a-z0-9_]*)(?: ([0-9a-z_]+\.[a-z]+))?\}\}`)

// render returns the file of migrations/ with its placeholders filled in.
func (t *Tables) render(file string) string {
	b, err := migrationFiles.ReadFile("migrations/" + file)
	if err != nil {
		panic(fmt.Sprintf("pgsql: migration file %s: %v", file, err)) // embedded: a build error
	}
	values := t.placeholders()
	return placeholder.ReplaceAllStringFunc(strings.TrimSuffix(string(b), "\n"), func(m string) string {
		p := placeholder.FindStringSubmatch(m)
		switch key, arg := p[1], p[2]; {
		case arg == "":
			v, ok := values[key]
			if !ok {
				panic(fmt.Sprintf("pgsql: migration file %s: unknown placeholder %s", file, m))
			}
			return v
		case key == "include":
			return t.render(arg)
		case key == "do":
			return doBlock(t.render(arg))
		case key == "dollar":
			return dollarQuote(t.render(arg))
		case key == "execute":
			return doStatements(t.render(arg))
		default:
			panic(fmt.Sprintf("pgsql: migration file %s: unknown directive %s", file, m))
		}
	})
}

// placeholders are the names the migration files use.
func (t *Tables) placeholders() map[string]string {
	msgs := t.MessagesTable
	if msgs == "" {
		msgs = DefaultMessagesTable
	}
	retention := t.RetentionTable
	if retention == "" {
		retention = DefaultRetentionTable
	}
	topics := t.TopicsTable
	if topics == "" {
		topics = DefaultTopicsTable
	}
	sum := sha256.Sum256([]byte(msgs))
	expiresAtIdx := pgx.Identifier{t.indexBareName(t.ConsumerSessionsTable, DefaultConsumerSessionsTable, "expires_at_idx")}
	if t.Schema != "" {
		expiresAtIdx = append(pgx.Identifier{t.Schema}, expiresAtIdx...)
	}
	var bare []string
	for _, n := range []struct{ name, def string }{
		{t.MessagesTable, DefaultMessagesTable}, {t.ConsumerSessionsTable, DefaultConsumerSessionsTable},
		{t.ConsumerOffsetsTable, DefaultConsumerOffsetsTable}, {t.SchemaVersionTable, DefaultSchemaVersionTable},
		{t.TopicsTable, DefaultTopicsTable}, {t.DelayedTable, DefaultDelayedTable},
		{t.MaintenanceTable, DefaultMaintenanceTable}, {t.RetentionTable, DefaultRetentionTable},
		{t.partitionName("forever"), ""},
	} {
		if n.name == "" {
			n.name = n.def
		}
		bare = append(bare, quoteLiteral(n.name))
	}
	values := map[string]string{
		"schema":         pgx.Identifier{t.Schema}.Sanitize(),
		"schema_literal": quoteLiteral(t.Schema),
		"schema_unset":   fmt.Sprint(t.Schema == ""),
		// The tables' names, unquoted, as SQL string constants.
		"bare_names": strings.Join(bare, ", "),

		"messages":    t.Messages,
		"sessions":    t.Sessions,
		"offsets":     t.Offsets,
		"topics":      t.Topics,
		"delayed":     t.Delayed,
		"maintenance": t.Maintenance,
		"retention":   t.Retention,
		"version":     t.Version,
		// The partition of messages kept forever: qualified, and its
		// name alone (what the messages table is renamed to).
		"forever":      t.partition("forever"),
		"forever_name": pgx.Identifier{t.partitionName("forever")}.Sanitize(),

		"messages_literal":    quoteLiteral(t.Messages),
		"forever_literal":     quoteLiteral(t.partition("forever")),
		"delayed_literal":     quoteLiteral(t.Delayed),
		"retention_literal":   quoteLiteral(t.Retention),
		"maintenance_literal": quoteLiteral(t.Maintenance),
		"topics_literal":      quoteLiteral(t.Topics),

		// Migration 11: the trigger that sets a message's position, and
		// its function (DistributeScript's too).
		"position_fn":              t.partition("transaction_id"),
		"position_trigger":         pgx.Identifier{t.partitionName("transaction_id")}.Sanitize(),
		"position_trigger_literal": quoteLiteral(t.partitionName("transaction_id")),

		// Migration 14: the sequence positions come from, the trigger
		// function that takes them, the readers' bound.
		"position_seq_name_literal":  quoteLiteral(t.partitionName("positions")),
		"position_seq_ident":         pgx.Identifier{t.partitionName("positions")}.Sanitize(),
		"position_seq_ident_literal": quoteLiteral(pgx.Identifier{t.partitionName("positions")}.Sanitize()),
		"messages_ident_literal":     quoteLiteral(pgx.Identifier{msgs}.Sanitize()),
		"topics_ident_literal":       quoteLiteral(pgx.Identifier{topics}.Sanitize()),
		"take_position_fn":           t.partition("take_position"),
		"take_position_fn_literal":   quoteLiteral(t.partition("take_position")),
		"position_bound_fn":          t.PositionBoundFunction(),
		"position_bound_fn_literal":  quoteLiteral(t.PositionBoundFunction()),

		// Migration 18: the registration of pglease's own inserts.
		"register_fn":         t.RegisterFunction(),
		"register_fn_literal": quoteLiteral(t.RegisterFunction()),

		// Migration 20: the one position of a registered statement.
		"next_position_fn_literal": quoteLiteral(t.NextPositionFunction()),

		"sessions_expires_at_idx":           t.indexName(t.ConsumerSessionsTable, DefaultConsumerSessionsTable, "expires_at_idx"),
		"sessions_expires_at_idx_qualified": expiresAtIdx.Sanitize(),
		"sessions_group_idx":                t.indexName(t.ConsumerSessionsTable, DefaultConsumerSessionsTable, "group_idx"),
		"topics_retention_idx":              t.indexName(t.TopicsTable, DefaultTopicsTable, "retention_idx"),
		"delayed_due_idx":                   t.indexName(t.DelayedTable, DefaultDelayedTable, "due_idx"),

		// Migration 7: the bare names the owner's functions build
		// partition names from, as PartitionName does, and the
		// functions' own names.
		"messages_name_literal":  quoteLiteral(msgs),
		"retention_name_literal": quoteLiteral(retention),
		"topics_name_literal":    quoteLiteral(topics),
		"messages_hash_literal":  quoteLiteral(hex.EncodeToString(sum[:4])),
		"fn_add_literal":         quoteLiteral(t.partitionName(fnAddPartition)),
		"fn_expire_literal":      quoteLiteral(t.partitionName(fnExpirePartition)),
		"fn_drop_literal":        quoteLiteral(t.partitionName(fnDropDetached)),

		// Migration 15: the keys table, its partitions, the function
		// that empties one.
		"keys":               t.Keys,
		"keys_literal":       quoteLiteral(t.Keys),
		"fn_forget_literal":  quoteLiteral(t.partitionName(fnForgetKeys)),
		"keys_0":             t.keysPartition(0),
		"keys_0_literal":     quoteLiteral(t.keysPartition(0)),
		"keys_0_name_quoted": quoteLiteral(pgx.Identifier{t.partitionName(keysPartitionSuffix(0))}.Sanitize()),
		"keys_1":             t.keysPartition(1),
		"keys_1_literal":     quoteLiteral(t.keysPartition(1)),
		"keys_1_name_quoted": quoteLiteral(pgx.Identifier{t.partitionName(keysPartitionSuffix(1))}.Sanitize()),
		"keys_2":             t.keysPartition(2),
		"keys_2_literal":     quoteLiteral(t.keysPartition(2)),
		"keys_2_name_quoted": quoteLiteral(pgx.Identifier{t.partitionName(keysPartitionSuffix(2))}.Sanitize()),
		"keys_3":             t.keysPartition(3),
		"keys_3_literal":     quoteLiteral(t.keysPartition(3)),
		"keys_3_name_quoted": quoteLiteral(pgx.Identifier{t.partitionName(keysPartitionSuffix(3))}.Sanitize()),
	}
	// Migration 21: the partitions of the key classes.
	t.keysPlaceholders(values)
	return values
}
