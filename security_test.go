package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// poolAsOn is poolAs with the connections' search_path set to path.
func poolAsOn(t *testing.T, role, path string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testkit.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	cfg.ConnConfig.RuntimeParams["search_path"] = path
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(context.Background()))
	return pool
}

// plantTraps creates schema trap, which every role may use and create in
// (as public is on PostgreSQL 14 and before), and in it, as role
// attacker, functions and operators that shadow those of pg_catalog for
// argument types that pg_catalog matches only through a cast: each
// records the role it runs as in trap.ran (which every role may insert
// into) and returns what pg_catalog's would. It returns a function that
// reports the rows of trap.ran.
func plantTraps(t *testing.T, pool *pgxpool.Pool, attacker string) (schema string, ran func() []string) {
	t.Helper()
	ctx := context.Background()
	schema = "trap_" + randomHex(4)
	trap := pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+trap+" CASCADE") })
	execAll(t, pool,
		"CREATE SCHEMA "+trap,
		"GRANT USAGE, CREATE ON SCHEMA "+trap+" TO PUBLIC",
		"CREATE TABLE "+trap+".ran (fn text, role text)",
		"GRANT INSERT, SELECT ON "+trap+".ran TO PUBLIC")
	attackerPool := poolAs(t, attacker, 1)
	fn := func(name, args, returns, body string) string {
		return "CREATE FUNCTION " + trap + "." + name + "(" + args + ") RETURNS " + returns + " LANGUAGE plpgsql AS $f$BEGIN " +
			"INSERT INTO " + trap + ".ran VALUES (" + quoteLit(name+"("+args+")") + ", current_user); RETURN " + body + "; END$f$"
	}
	execAll(t, attackerPool,
		fn("quote_ident", "name", "text", "pg_catalog.quote_ident($1::text)"),
		fn("regexp_match", "name, text", "text[]", "pg_catalog.regexp_match($1::text, $2)"),
		fn("format", "text, regclass, name", "text", "pg_catalog.format($1, $2, $3)"),
		fn("format", "text, regclass, text", "text", "pg_catalog.format($1, $2, $3)"),
		fn("to_regclass", "name", "regclass", "pg_catalog.to_regclass($1::text)"),
		fn("pg_get_userbyid", "integer", "name", "pg_catalog.pg_get_userbyid($1::oid)"),
		fn("convert_to", "text, text", "bytea", "pg_catalog.convert_to($1, $2::name)"),
		fn("octet_length", "name", "integer", "pg_catalog.octet_length($1::text)"),
		fn("pg_column_size", "jsonb", "integer", "pg_catalog.pg_column_size($1)"),
		fn("hashtextextended", "text, integer", "bigint", "pg_catalog.hashtextextended($1, $2)"),
		fn("unnest", "text[]", "SETOF text", "QUERY SELECT pg_catalog.unnest($1)"),
		fn("now", "", "timestamptz", "pg_catalog.now()"),
		fn("mul", "bigint, interval", "interval", "$1::float8 * $2"),
		fn("nmul", "numeric, integer", "numeric", "$1 * $2::numeric"),
		fn("cat", "text, integer", "text", "pg_catalog.textcat($1, $2::text)"),
		fn("catb", "text, bigint", "text", "pg_catalog.textcat($1, $2::text)"),
		fn("mod", "bigint, integer", "bigint", "$1 % $2::bigint"),
		fn("oideq", "oid, regclass", "boolean", "$1 = $2::oid"),
		"CREATE OPERATOR "+trap+".% (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = "+trap+".mod)",
		"CREATE OPERATOR "+trap+".= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = "+trap+".oideq)",
		"CREATE OPERATOR "+trap+".* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = "+trap+".mul)",
		"CREATE OPERATOR "+trap+".* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = "+trap+".nmul)",
		"CREATE OPERATOR "+trap+".|| (LEFTARG = text, RIGHTARG = integer, FUNCTION = "+trap+".cat)",
		"CREATE OPERATOR "+trap+".|| (LEFTARG = text, RIGHTARG = bigint, FUNCTION = "+trap+".catb)",
	)
	return schema, func() []string {
		rows, err := pool.Query(ctx, "SELECT DISTINCT fn || ' as ' || role FROM "+trap+".ran ORDER BY 1")
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return got
	}
}

func quoteLit(s string) string { return "'" + s + "'" }

// TestMigrateRunsNothingPlantedOnTheSearchPath migrates, as a superuser and
// as an owner role, with a schema on the search_path where another role
// planted functions that shadow pg_catalog's (quote_ident(name),
// format(text, regclass, name), ...): none of them runs, the roles stay
// as they were, and the tables are where the adapter says.
func TestMigrateRunsNothingPlantedOnTheSearchPath(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	attacker := newRole(t, pool, "pglease_attacker")
	trap, ran := plantTraps(t, pool, attacker)

	// A superuser migrating a fresh schema, the trap first on its path.
	adapter := newSchema(t, pool)
	su := poolAsOn(t, "postgres", pgx.Identifier{trap}.Sanitize()+", public", 2)
	var user string
	require.NoError(t, su.QueryRow(ctx, "SELECT current_user").Scan(&user))
	if user != "postgres" {
		t.Skip("needs the superuser postgres")
	}
	require.NoError(t, migrateTo(ctx, su, adapter, 5))
	require.NoError(t, pglease.Migrate(ctx, su, adapter), "the upgrade from version 5")
	assert.Empty(t, ran(), "planted functions ran during a migration")

	// An owner role whose own schema, where the tables go with Schema
	// empty, comes first on its path, the trap after it.
	owner := newRole(t, pool, "pglease_owner")
	own := newSchema(t, pool)
	execAll(t, pool, "CREATE SCHEMA "+pgx.Identifier{own.Schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{owner}.Sanitize())
	ownerPool := poolAsOn(t, owner, pgx.Identifier{own.Schema}.Sanitize()+", "+pgx.Identifier{trap}.Sanitize(), 2)
	require.NoError(t, pglease.Migrate(ctx, ownerPool, pglease.Tables{}))
	assert.Empty(t, ran(), "planted functions ran during a migration")
	var where string
	require.NoError(t, pool.QueryRow(ctx, "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = $1::regclass",
		pgx.Identifier{own.Schema, pglease.DefaultMessagesTable}.Sanitize()).Scan(&where))
	assert.Equal(t, own.Schema, where)

	// Within a caller's transaction, the caller's search_path comes back.
	tx, err := ownerPool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, pglease.Migrate(ctx, tx, pglease.Tables{}))
	var path string
	require.NoError(t, tx.QueryRow(ctx, "SHOW search_path").Scan(&path))
	assert.Equal(t, pgx.Identifier{own.Schema}.Sanitize()+", "+pgx.Identifier{trap}.Sanitize(), path)
}

// TestMigrateRefusesSchemasAndTablesOfOtherRoles: Migrate refuses a schema
// in which a role other than its owner and the migrating role may create
// objects, and tables of pglease's names that another role created
// beforehand (one with a trigger, a version table that records every
// version), naming the role and the tables; nothing of the other role's
// runs.
func TestMigrateRefusesSchemasAndTablesOfOtherRoles(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	owner, attacker := newRole(t, pool, "pglease_owner"), newRole(t, pool, "pglease_attacker")
	adapter := newSchema(t, pool)
	schema := pgx.Identifier{adapter.Schema}.Sanitize()
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	execAll(t, pool,
		"CREATE SCHEMA "+schema+" AUTHORIZATION "+pgx.Identifier{owner}.Sanitize(),
		"GRANT USAGE, CREATE ON SCHEMA "+schema+" TO "+pgx.Identifier{attacker}.Sanitize())
	attackerPool := poolAs(t, attacker, 1)
	execAll(t, attackerPool,
		"CREATE TABLE "+qualified("fired")+" (role text)",
		"GRANT INSERT ON "+qualified("fired")+" TO PUBLIC",
		"CREATE TABLE "+qualified(pglease.DefaultMaintenanceTable)+" (name text PRIMARY KEY, session_id uuid, epoch bigint NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now())",
		"CREATE FUNCTION "+qualified("fire")+"() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN INSERT INTO "+qualified("fired")+" VALUES (current_user); RETURN NEW; END$f$",
		"CREATE TRIGGER fire BEFORE INSERT ON "+qualified(pglease.DefaultMaintenanceTable)+" FOR EACH ROW EXECUTE FUNCTION "+qualified("fire")+"()",
		"CREATE TABLE "+qualified(pglease.DefaultSchemaVersionTable)+" (version integer PRIMARY KEY, description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
		"INSERT INTO "+qualified(pglease.DefaultSchemaVersionTable)+" (version, description) SELECT v, 'planted' FROM generate_series(1, 100) v",
		"GRANT SELECT ON "+qualified(pglease.DefaultSchemaVersionTable)+" TO PUBLIC",
	)
	fired := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+qualified("fired")).Scan(&n))
		return n
	}

	ownerPool := poolAs(t, owner, 2)
	for _, db := range []*pgxpool.Pool{ownerPool, pool} { // the owner, and a superuser
		err := pglease.Migrate(ctx, db, adapter)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v", err)
		assert.Equal(t, "42501", pgErr.Code)
		assert.Contains(t, pgErr.Message, "may create objects in it: "+attacker)
	}
	assert.Zero(t, fired())

	// Without CREATE any more, the tables it left are refused.
	execAll(t, pool, "REVOKE CREATE ON SCHEMA "+schema+" FROM "+pgx.Identifier{attacker}.Sanitize())
	for _, db := range []*pgxpool.Pool{ownerPool, pool} {
		err := pglease.Migrate(ctx, db, adapter)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v", err)
		assert.Equal(t, "42501", pgErr.Code)
		assert.Contains(t, pgErr.Message, adapter.Schema+"."+pglease.DefaultMaintenanceTable+" (owned by "+attacker+")")
		assert.Contains(t, pgErr.Message, adapter.Schema+"."+pglease.DefaultSchemaVersionTable+" (owned by "+attacker+")")
	}
	assert.Zero(t, fired())

	// A version table of another role's that records every version is not
	// taken for a current schema.
	execAll(t, pool, "DROP TABLE "+qualified(pglease.DefaultMaintenanceTable))
	err := pglease.Migrate(ctx, ownerPool, adapter)
	require.Error(t, err)
	assert.Contains(t, err.Error(), adapter.Schema+"."+pglease.DefaultSchemaVersionTable+" (owned by "+attacker+")")

	// Once it is gone, the migration runs.
	execAll(t, pool, "DROP TABLE "+qualified(pglease.DefaultSchemaVersionTable))
	require.NoError(t, pglease.Migrate(ctx, ownerPool, adapter))
}

// TestMultiByteTableNames migrates tables whose names are long and made
// of multi-byte characters, so that the names derived from them (index
// names, retention partitions, the maintainer's functions) are cut: at a
// character boundary, the same in Go and in SQL, so that the owner's
// functions and the maintainer's statements agree on every name.
func TestMultiByteTableNames(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	adapter.MessagesTable = "m" + strings.Repeat("é", 30)         // 61 bytes: cut at 30 would split a character
	adapter.ConsumerSessionsTable = "s" + strings.Repeat("ü", 28) // its index names are cut at 63 bytes
	require.True(t, utf8.ValidString(adapter.MessagesTable))
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	app := newRole(t, pool, "pglease_app")
	execAll(t, pool, pglease.GrantSQL(adapter, app))
	appPool := poolAs(t, app, 2)
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }

	// A topic of class 3 (1 s slots): the add function adds only slots of
	// a class some topic has, from now to its longest retention ahead.
	execAll(t, pool, "INSERT INTO "+qualified(pglease.DefaultTopicsTable)+
		" (topic, retention, retention_class, classes_from, classes_to) VALUES ('r3', '2 seconds', 3, 3, 3)")
	start := time.Now().Unix() + 1
	p := pgsql.RetentionPartition{Class: 3, Start: time.Unix(start, 0), End: time.Unix(start+1, 0)}
	add := tablesOf(adapter).CallAddRetentionPartition(p)
	var done bool
	require.NoError(t, appPool.QueryRow(ctx, add.SQL, add.Args...).Scan(&done))
	require.True(t, done)
	name := pglease.PartitionName(adapter, fmt.Sprintf("r3_%d", start))
	require.True(t, utf8.ValidString(name), "%q", name)
	var found bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qualified(name)).Scan(&found))
	assert.True(t, found, "the function named the partition %q, as Go does", name)

	execAll(t, pool, "ALTER TABLE "+qualified(adapter.MessagesTable)+" DETACH PARTITION "+qualified(name))
	detached := tablesOf(adapter).DetachedRetentionPartitions()
	rows, err := appPool.Query(ctx, detached.SQL, detached.Args...)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var class int32
		var start int64
		err := row.Scan(&class, &start)
		return fmt.Sprintf("r%d_%d", class, start), err
	})
	require.NoError(t, err)
	assert.Equal(t, []string{fmt.Sprintf("r3_%d", start)}, got)
	drop := tablesOf(adapter).CallDropDetachedPartition(p)
	require.NoError(t, appPool.QueryRow(ctx, drop.SQL, drop.Args...).Scan(&done))
	assert.True(t, done)
}

// TestMaintainerFunctionsOnlyForConsumersAndOnlyPassedSlots upgrades a
// schema whose version 7 granted the maintainer's functions to every role
// that could INSERT into the messages table: from version 9 on, a role
// that may only publish cannot execute them (it could drop a partition
// whose window had not passed, or add one covering every time), a role
// that may delete messages still can; and the functions accept only one
// aligned slot of the class, and expire only a partition of a slot that
// has passed and covers nothing more.
func TestMaintainerFunctionsOnlyForConsumersAndOnlyPassedSlots(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages := qualified(pglease.DefaultMessagesTable)
	publisher, app := newRole(t, pool, "pglease_publisher"), newRole(t, pool, "pglease_app")
	require.NoError(t, migrateTo(ctx, pool, adapter, 6))
	execAll(t, pool,
		"GRANT USAGE ON SCHEMA "+pgx.Identifier{adapter.Schema}.Sanitize()+" TO "+publisher+", "+app,
		"GRANT INSERT ON "+messages+" TO "+publisher,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON "+messages+" TO "+app)
	require.NoError(t, migrateTo(ctx, pool, adapter, 8))
	// A topic of class 5 (version 12's add function adds only slots of a
	// class some topic has).
	execAll(t, pool, "INSERT INTO "+qualified(pglease.DefaultTopicsTable)+
		" (topic, retention, retention_class, classes_from, classes_to) VALUES ('r5', '16 seconds', 5, 5, 5)")
	// What version 7 of earlier releases granted every role that could
	// INSERT into the messages table.
	for _, fn := range []string{"add_retention_partition(integer, bigint, bigint)", "expire_retention_partition(integer, bigint)",
		"drop_detached_partition(integer, bigint)"} {
		i := strings.IndexByte(fn, '(')
		execAll(t, pool, "GRANT EXECUTE ON FUNCTION "+qualified(pglease.PartitionName(adapter, fn[:i]))+fn[i:]+" TO "+publisher)
	}
	call := func(db *pgxpool.Pool, s pgsql.Stmt) (bool, error) {
		var done bool
		err := db.QueryRow(ctx, s.SQL, s.Args...).Scan(&done)
		return done, err
	}
	codeOf := func(err error) string {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr.Code
		}
		return fmt.Sprint(err)
	}
	pubPool, appPool := poolAs(t, publisher, 1), poolAs(t, app, 1)
	tables := tablesOf(adapter)
	now := time.Now().Unix()
	// Class 5: 4 s slots. One from now, whose slot has not passed.
	live := pgsql.RetentionPartition{Class: 5, Start: time.Unix(now/4*4+8, 0), End: time.Unix(now/4*4+12, 0)}
	done, err := call(pubPool, tables.CallAddRetentionPartition(live))
	require.NoError(t, err, "version 8: the publisher may add")
	require.True(t, done)

	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	_, err = call(pubPool, tables.CallExpireRetentionPartition(live))
	assert.Equal(t, "42501", codeOf(err), "a role that may only publish may not expire")
	_, err = call(pubPool, tables.CallAddRetentionPartition(live))
	assert.Equal(t, "42501", codeOf(err), "nor add")

	// A consumer may call them, with arguments of one slot of the class.
	everything := pgsql.RetentionPartition{Class: 5, Start: time.Unix(0, 0), End: time.Unix(253402300799, 0)}
	unaligned := pgsql.RetentionPartition{Class: 5, Start: time.Unix(now/4*4+1, 0), End: time.Unix(now/4*4+5, 0)}
	for _, bad := range []pgsql.RetentionPartition{everything, unaligned} {
		_, err = call(appPool, tables.CallAddRetentionPartition(bad))
		assert.Equal(t, "22023", codeOf(err), "add from %d to %d", bad.Start.Unix(), bad.End.Unix())
	}
	_, err = call(appPool, tables.CallExpireRetentionPartition(live))
	assert.Equal(t, "55000", codeOf(err), "its slot has not passed")
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		qualified(pglease.PartitionName(adapter, fmt.Sprintf("r5_%d", live.Start.Unix())))).Scan(&exists))
	assert.True(t, exists, "the live partition is still there")

	// A partition with a passed slot's name that covers more is left to
	// the owner; the partition of a passed slot is expired.
	wide := pgsql.RetentionPartition{Class: 5, Start: time.Unix(1_600_000_000, 0), End: time.Unix(1_600_000_004, 0)}
	execAll(t, pool, "CREATE TABLE "+qualified(pglease.PartitionName(adapter, "r5_1600000000"))+" PARTITION OF "+messages+
		" FOR VALUES FROM (5, '2020-09-13 12:26:40+00') TO (5, '2020-09-13 12:30:00+00')")
	_, err = call(appPool, tables.CallExpireRetentionPartition(wide))
	assert.Equal(t, "55000", codeOf(err), "a partition wider than its slot")
	execAll(t, pool, "DROP TABLE "+qualified(pglease.PartitionName(adapter, "r5_1600000000")))
	_, err = call(appPool, tables.CallAddRetentionPartition(wide))
	assert.Equal(t, "22023", codeOf(err), "a slot long past is not one the maintainer adds now")
	// The owner adds it, as a maintainer that owns the tables does.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	for _, stmt := range tables.CreateRetentionPartition(wide) {
		_, err := tx.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	done, err = call(appPool, tables.CallExpireRetentionPartition(wide))
	require.NoError(t, err)
	assert.True(t, done, "a passed slot is expired")
}

// TestRuntimeRunsNothingPlantedOnTheSearchPath runs pglease as an
// application role whose search_path names a schema where another role
// planted functions and operators that shadow pg_catalog's for argument
// types pg_catalog matches only through a cast or a polymorphic type
// (regexp_match(name, text), unnest(text[]), text || integer, bigint *
// interval, ...): publishing, delayed messages, subscribing, the
// maintainer with retention partitions and the Inspector call none of
// them.
func TestRuntimeRunsNothingPlantedOnTheSearchPath(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	attacker, app := newRole(t, pool, "pglease_attacker"), newRole(t, pool, "pglease_app")
	execAll(t, pool, pglease.GrantSQL(adapter, app))
	trap, ran := plantTraps(t, pool, attacker)
	appPool := poolAsOn(t, app, pgx.Identifier{trap}.Sanitize()+", public", 8)

	require.NoError(t, pglease.CreateTopic(ctx, appPool, "kept", pglease.TopicConfig{Tables: adapter, Partitions: 3}))
	require.NoError(t, pglease.CreateTopic(ctx, appPool, "short", pglease.TopicConfig{Tables: adapter, Retention: 5 * time.Second}))
	pub, err := pglease.NewPublisher(appPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub := newTestSubscriber(t, appPool, adapter, pglease.SubscriberConfig{
		ConsumerGroup: "g",
		Maintenance:   pglease.MaintenanceConfig{Interval: 50 * time.Millisecond},
	})
	var kept <-chan *message.Message
	for _, topic := range []string{"kept", "short"} {
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		publishN(t, pub, topic, 5)
		receive(t, msgs, 5, 10*time.Second)
		if topic == "kept" {
			kept = msgs
		}
	}
	waitFor(t, 10*time.Second, "retention partitions", func() bool { return sub.Stats().RetentionPartitionsCreated > 0 })
	delayed := message.NewMessage(watermill.NewUUID(), nil)
	delayed.Metadata.Set("_watermill_delayed_until", time.Now().Add(100*time.Millisecond).UTC().Format(time.RFC3339Nano))
	require.NoError(t, pub.Publish("kept", delayed))
	assert.Equal(t, delayed.UUID, receive(t, kept, 1, 10*time.Second)[0].UUID)

	in, err := admin.NewInspector(appPool, adapter)
	require.NoError(t, err)
	_, err = in.Lag(ctx, admin.LagFilter{})
	require.NoError(t, err)
	_, err = in.Sessions(ctx)
	require.NoError(t, err)
	_, err = in.Topics(ctx)
	require.NoError(t, err)
	_, err = in.Horizon(ctx)
	require.NoError(t, err)
	assert.Empty(t, ran(), "planted functions or operators ran as the application role")
}

// TestForgedNotificationsAreHints: a role granted nothing on pglease's
// tables may still NOTIFY on their channel. While it sends every kind of
// notification (resets of the group, scoped and unscoped, releases,
// membership changes, new messages, partition changes) every 2 ms, a
// Subscriber drains 2,000 messages without giving its row up once: a
// notification only makes it look, and a reset is acted on only when the
// row's owner or epoch moved. The drain is timed beside one without the
// flood (logged, not asserted: speed lives in benchmarks).
func TestForgedNotificationsAreHints(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	const n = 2000
	for range n / 100 {
		publishN(t, pub, "t", 100)
	}
	channel := tablesOf(adapter).NotifyChannel

	drain := func(group string) (time.Duration, pglease.SubscriberStats) {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
			PollInterval: time.Minute}, nil)
		require.NoError(t, err)
		defer func() { require.NoError(t, sub.Close()) }()
		subCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		began := time.Now()
		msgs, err := sub.Subscribe(subCtx, "t")
		require.NoError(t, err)
		for i := range n {
			select {
			case m := <-msgs:
				time.Sleep(500 * time.Microsecond) // a handler's work: the drain lasts a second or so
				m.Ack()
			case <-time.After(30 * time.Second):
				t.Fatalf("group %s: %d of %d messages in 30 s", group, i, n)
			}
		}
		return time.Since(began), sub.Stats()
	}
	quiet, _ := drain("quiet")

	intruder := poolAs(t, newRole(t, pool, "pglease_intruder"), 2)
	payloads := []string{"xt", "o5:floodt", "rt", "gflood", "mt", "pt", "n1:t"}
	floodCtx, stopFlood := context.WithCancel(ctx)
	var sent atomic.Int64
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-floodCtx.Done():
				return
			case <-tick.C:
			}
			if _, err := intruder.Exec(floodCtx, "SELECT pg_notify($1, $2)", channel, payloads[i%len(payloads)]); err == nil {
				sent.Add(1)
			}
		}
	}()
	waitFor(t, 10*time.Second, "the flood to be under way", func() bool { return sent.Load() > 50 })
	took, st := drain("flood")
	stopFlood()
	<-flooded
	t.Logf("2,000 messages: %s without notifications, %s under %d forged ones (%.1fx); %d claims, %d releases",
		quiet.Round(time.Millisecond), took.Round(time.Millisecond), sent.Load(), float64(took)/float64(quiet), st.Claims, st.Releases)
	require.Positive(t, sent.Load(), "the role granted nothing could notify")
	assert.Equal(t, uint64(1), st.Claims, "the row was claimed once and never given up")
	assert.Zero(t, st.Releases, "no row given up during the drain")
	assertNoLeakedGoroutines(t)
}

// TestSchemaLimitsInTheDatabase: rows of sizes the Go code refuses, stored
// before schema version 12, are handled by its migration (topic settings
// and delayed messages of a name pglease refuses deleted, a partition
// count above MaxPartitions lowered to it, messages no Subscriber reads
// deleted), and from then on the database refuses them from any role but
// the owner's checks too: a topic name over MaxTopicLength bytes or
// empty, a partition count above MaxPartitions, a message in a partition
// above it.
func TestSchemaLimitsInTheDatabase(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages, topics, delayed := qualified(pglease.DefaultMessagesTable), qualified(pglease.DefaultTopicsTable),
		qualified(pglease.DefaultDelayedTable)
	long := strings.Repeat("t", pglease.MaxTopicLength+1)
	require.NoError(t, migrateTo(ctx, pool, adapter, 10))
	execAll(t, pool,
		"INSERT INTO "+topics+" (topic, partitions) VALUES ('ok', 4), ('huge', 2147483647), ('"+long+"', 1), ('', 1)",
		"INSERT INTO "+delayed+" (due_at, topic, uuid) VALUES (now(), 'ok', 'd1'), (now(), '"+long+"', 'd2')",
		"INSERT INTO "+messages+" (topic, partition, uuid) VALUES ('ok', 0, 'm1'), ('"+long+"', 0, 'm2'), ('huge', 5000, 'm3'), ('huge', 1023, 'm4')")

	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	strs := func(sql string) []string {
		var out []string
		require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(array_agg(x ORDER BY x), '{}') FROM ("+sql+") s(x)").Scan(&out))
		return out
	}
	assert.Equal(t, []string{"huge:1024", "ok:4"}, strs("SELECT topic || ':' || partitions FROM "+topics))
	assert.Equal(t, []string{"d1"}, strs("SELECT uuid FROM "+delayed))
	assert.Equal(t, []string{"m1", "m4"}, strs("SELECT uuid FROM "+messages))

	app := newRole(t, pool, "pglease_app")
	execAll(t, pool, pglease.GrantSQL(adapter, app))
	appPool := poolAs(t, app, 1)
	for _, stmt := range []string{
		"INSERT INTO " + topics + " (topic, partitions) VALUES ('" + long + "', 1)",
		"INSERT INTO " + topics + " (topic, partitions) VALUES ('', 1)",
		"INSERT INTO " + topics + " (topic, partitions) VALUES ('x', 1025)",
		"UPDATE " + topics + " SET partitions = 2147483647 WHERE topic = 'ok'",
		"INSERT INTO " + delayed + " (due_at, topic, uuid) VALUES (now(), '" + long + "', 'd')",
		"INSERT INTO " + messages + " (topic, uuid) VALUES ('" + long + "', 'm')",
		"INSERT INTO " + messages + " (topic, partition, uuid) VALUES ('ok', 1024, 'm')",
		"INSERT INTO " + messages + " (topic, partition, uuid) VALUES ('ok', -1, 'm')",
	} {
		_, err := appPool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, stmt[:min(len(stmt), 80)])
		assert.Equal(t, "23514", pgErr.Code, "check_violation: %v", err)
	}
	// At the limits, accepted.
	execAll(t, appPool,
		"INSERT INTO "+topics+" (topic, partitions) VALUES ('"+long[1:]+"', 1024)",
		"INSERT INTO "+messages+" (topic, partition, uuid) VALUES ('"+long[1:]+"', 1023, 'm')")
}
