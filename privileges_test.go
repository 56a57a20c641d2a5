package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
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

// newRole creates a login role with a random name, without any privilege
// beyond PostgreSQL's defaults (no CREATE on the database), dropped with
// everything it owns and every grant it holds at the end of the test.
func newRole(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	role := prefix + "_" + randomHex(4)
	ident := pgx.Identifier{role}.Sanitize()
	_, err := pool.Exec(context.Background(), "CREATE ROLE "+ident+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP OWNED BY "+ident+" CASCADE")
		_, _ = pool.Exec(ctx, "DROP ROLE IF EXISTS "+ident)
	})
	return role
}

// poolAs returns a pool on the test database logged in as role (the test
// server trusts local connections), closed at the end of the test. It
// skips the test when the server asks that role for a password.
func poolAs(t *testing.T, role string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testkit.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	cfg.MaxConns = maxConns
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			t.Skipf("the test server does not let role %s log in without a password: %v", role, err)
		}
		require.NoError(t, err)
	}
	return pool
}

// grantLines returns the GRANT statements of a script of GrantSQL or
// GrantPublisherSQL, one a line: what a single server runs (the block
// after them grants only where the tables are distributed by Citus, see
// TestCitusLeastPrivilegeRoles).
func grantLines(script string) string {
	var out []string
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "GRANT ") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestSchemaSetUpWithoutCreateOnDatabase sets up schemas that exist
// already, owned by a role without the CREATE privilege on the database:
// the script of SchemaSQL and the automatic set-up both succeed (CREATE
// SCHEMA IF NOT EXISTS alone is refused even when the schema exists).
func TestSchemaSetUpWithoutCreateOnDatabase(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	byScript, byInit := newSchema(t, pool), newSchema(t, pool)
	owner := newRole(t, pool, "pglease_owner")
	for _, a := range []pglease.Tables{byScript, byInit} {
		_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{a.Schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{owner}.Sanitize())
		require.NoError(t, err)
	}
	var mayCreate bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT has_database_privilege($1, current_database(), 'CREATE')", owner).Scan(&mayCreate))
	require.False(t, mayCreate, "the owner role has no CREATE on the database")

	ownerPool := poolAs(t, owner, 2)
	_, err := ownerPool.Exec(ctx, pglease.SchemaSQL(byScript))
	require.NoError(t, err, "SchemaSQL as the schema's owner")
	require.NoError(t, pglease.Migrate(ctx, ownerPool, byInit), "Migrate as the schema's owner")
	for _, a := range []pglease.Tables{byScript, byInit} {
		require.Equal(t, len(tablesOf(a).Migrations()), schemaVersion(t, pool, pgx.Identifier{a.Schema, pglease.DefaultSchemaVersionTable}.Sanitize()))
	}
}

// execAll runs statements on db, failing the test at the first error.
func execAll(t *testing.T, db pglease.DB, stmts ...string) {
	t.Helper()
	for _, stmt := range stmts {
		_, err := db.Exec(context.Background(), stmt)
		require.NoError(t, err, stmt)
	}
}

// aclOf returns the table-level privileges of every grantee but the
// owner, one "grantee privilege grantable" line each, in order.
func aclOf(t *testing.T, pool *pgxpool.Pool, table string) string {
	t.Helper()
	var acl string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT COALESCE(string_agg(
		CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END || ' ' || a.privilege_type || ' ' || a.is_grantable,
		E'\n' ORDER BY 1), '')
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
WHERE c.oid = $1::regclass AND a.grantee <> c.relowner`, table).Scan(&acl))
	return acl
}

// TestUpgradeFromVersion5KeepsAccess upgrades a schema of version 5, on
// which the owner gave an application role DML on the tables and set up
// other grants, row-level security and a publication, to the latest
// version as the owner: the partitioned messages table that version 6
// puts in place of the old one keeps all of it, the application role
// publishes and subscribes as before, and may be the maintainer without
// a new grant.
func TestUpgradeFromVersion5KeepsAccess(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	owner := newRole(t, pool, "pglease_owner")
	app := newRole(t, pool, "pglease_app")
	reader := newRole(t, pool, "pglease_reader")
	ident := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages := qualified(pglease.DefaultMessagesTable)
	forever := qualified(pglease.DefaultMessagesTable + "_forever")

	execAll(t, pool, "CREATE SCHEMA "+ident(adapter.Schema)+" AUTHORIZATION "+ident(owner))
	ownerPool := poolAs(t, owner, 2)
	require.NoError(t, migrateTo(ctx, ownerPool, adapter, 5))
	execAll(t, ownerPool,
		"GRANT USAGE ON SCHEMA "+ident(adapter.Schema)+" TO "+ident(app)+", "+ident(reader),
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+ident(adapter.Schema)+" TO "+ident(app),
		"GRANT SELECT ON "+messages+" TO PUBLIC",
		"GRANT SELECT, REFERENCES ON "+messages+" TO "+ident(reader)+" WITH GRANT OPTION",
		"GRANT UPDATE (metadata) ON "+messages+" TO "+ident(reader),
		"ALTER TABLE "+messages+" ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY app_all ON "+messages+" TO "+ident(app)+" USING (true) WITH CHECK (true)",
		"CREATE POLICY no_secrets ON "+messages+" AS RESTRICTIVE FOR SELECT TO PUBLIC USING (topic <> 'secret')",
	)
	publication := "pglease_test_" + randomHex(4)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+ident(publication)) })
	execAll(t, pool, // CREATE PUBLICATION needs CREATE on the database, which the owner lacks
		"CREATE PUBLICATION "+ident(publication)+" FOR TABLE "+messages,
		"ALTER PUBLICATION "+ident(publication)+" OWNER TO "+ident(owner))
	aclBefore := aclOf(t, pool, messages)

	// A message published by the release of version 5.
	appPool := poolAs(t, app, 10)
	before := []string{watermill.NewUUID()}
	execAll(t, appPool, "INSERT INTO "+messages+" (topic, uuid, payload) VALUES ('t', '"+before[0]+"', 'x')")

	require.NoError(t, pglease.Migrate(ctx, ownerPool, adapter), "the upgrade, as the owner")
	require.Equal(t, len(tablesOf(adapter).Migrations()), schemaVersion(t, pool, qualified(pglease.DefaultSchemaVersionTable)))
	require.Equal(t, "p", relkind(t, pool, messages))

	assert.Equal(t, aclBefore, aclOf(t, pool, messages), "the new parent has the old table's grants")
	assert.Equal(t, aclBefore, aclOf(t, pool, forever), "the old table keeps them")
	var ownerOK, columnOK, tableUpdate, rls bool
	var policies string
	var published int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_userbyid(relowner) = $2, has_column_privilege($3, $1::regclass, 'metadata', 'UPDATE'),
	has_table_privilege($3, $1::regclass, 'UPDATE'), relrowsecurity,
	(SELECT string_agg(polname || ' ' || polpermissive, ', ' ORDER BY polname) FROM pg_policy WHERE polrelid = $1::regclass),
	(SELECT count(*) FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid WHERE r.prrelid = $1::regclass AND p.pubname = $4)
FROM pg_class WHERE oid = $1::regclass`, messages, owner, reader, publication).
		Scan(&ownerOK, &columnOK, &tableUpdate, &rls, &policies, &published))
	assert.True(t, ownerOK, "the parent belongs to the owner")
	assert.True(t, columnOK, "column privileges kept")
	assert.False(t, tableUpdate, "a column privilege stays one")
	assert.True(t, rls, "row-level security kept")
	assert.Equal(t, "app_all true, no_secrets false", policies)
	assert.Equal(t, 1, published, "the parent is in the publication")
	for _, tbl := range []string{pglease.DefaultDelayedTable, pglease.DefaultRetentionTable, pglease.DefaultMaintenanceTable} {
		var dml bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, 'SELECT, INSERT, UPDATE, DELETE')`,
			app, qualified(tbl)).Scan(&dml))
		assert.True(t, dml, "the application role may use %s, added by the upgrade", tbl)
	}
	expire := pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable + "_expire_retention_partition"}.Sanitize() + "(integer, bigint)"
	var appMay, readerMay bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT has_function_privilege($1, $3, 'EXECUTE'), has_function_privilege($2, $3, 'EXECUTE')`,
		app, reader, expire).Scan(&appMay, &readerMay))
	assert.True(t, appMay, "the upgrade lets a role that may publish call the maintainer's functions")
	assert.False(t, readerMay, "and no other role")

	// The application role goes on: publishes (a delayed message too),
	// subscribes, and its policies still apply.
	pub, err := pglease.NewPublisher(appPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	after := publishN(t, pub, "t", 1)
	publishN(t, pub, "secret", 1)
	delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(delayed, delay.For(time.Hour))
	require.NoError(t, pub.Publish("t", delayed))
	var secrets int
	require.NoError(t, appPool.QueryRow(ctx, "SELECT count(*) FROM "+messages+" WHERE topic = 'secret'").Scan(&secrets))
	assert.Zero(t, secrets, "the restrictive policy applies to the new parent")
	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(appPool, pglease.SubscriberConfig{Tables: adapter, PollInterval: 50 * time.Millisecond,
		SessionTTL: 2 * time.Second}, logger)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	assert.Equal(t, append(before, after...), uuids(receive(t, msgs, 2, 10*time.Second)))
	waitFor(t, 10*time.Second, "the application role to be elected maintainer", func() bool { return sub.Stats().Maintainer })
	require.NoError(t, sub.Close())
	assert.Empty(t, errorsLogged(logger), "nothing logged at Error level")
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}

// TestUpgradeBySuperuserKeepsOwner upgrades a schema of version 5 owned by
// an owner role as a superuser: the new messages table belongs to the
// owner, not to the superuser, so the owner keeps running pglease.
func TestUpgradeBySuperuserKeepsOwner(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	owner := newRole(t, pool, "pglease_owner")
	execAll(t, pool, "CREATE SCHEMA "+pgx.Identifier{adapter.Schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{owner}.Sanitize())
	ownerPool := poolAs(t, owner, 2)
	require.NoError(t, migrateTo(ctx, ownerPool, adapter, 5))
	require.NoError(t, pglease.Migrate(ctx, pool, adapter), "the upgrade, as a superuser")
	var owners string
	require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(DISTINCT pg_get_userbyid(relowner), ', ') FROM pg_class
WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p')`, pgx.Identifier{adapter.Schema}.Sanitize()).Scan(&owners))
	assert.Equal(t, owner, owners, "every table belongs to the owner")
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "t", pglease.TopicConfig{Tables: adapter, Partitions: 2}))
	pub, err := pglease.NewPublisher(ownerPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	publishN(t, pub, "t", 3)
}

// ownedSchema returns an adapter on a fresh schema that belongs to a new
// owner role, which has applied every migration, and a pool logged in as
// that owner.
func ownedSchema(t *testing.T, pool *pgxpool.Pool) (pglease.Tables, *pgxpool.Pool) {
	t.Helper()
	adapter := newSchema(t, pool)
	owner := newRole(t, pool, "pglease_owner")
	execAll(t, pool, "CREATE SCHEMA "+pgx.Identifier{adapter.Schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{owner}.Sanitize())
	ownerPool := poolAs(t, owner, 2)
	require.NoError(t, pglease.Migrate(context.Background(), ownerPool, adapter))
	return adapter, ownerPool
}

// errorsLogged returns the entries logged at Error level.
func errorsLogged(l *capturingLogger) []logEntry {
	var out []logEntry
	for _, e := range l.Entries() {
		if e.Level == "error" {
			out = append(out, e)
		}
	}
	return out
}

// TestLeastPrivilegeRole runs pglease as a role that owns nothing and has
// only the grants of GrantSQL: it publishes, delays, subscribes, creates
// topics and resets offsets, and, elected maintainer, empties a topic
// with a two-second retention by dropping partitions through the owner's
// functions, without a single error logged. It cannot drop, alter or
// truncate the tables.
func TestLeastPrivilegeRole(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter, ownerPool := ownedSchema(t, pool)
	app := newRole(t, pool, "pglease_app")
	grants := pglease.GrantSQL(adapter, app)
	for _, never := range []string{"TRUNCATE", "REFERENCES", "TRIGGER", "CREATE", "ALL", "SEQUENCE", "OWNER"} {
		assert.NotContains(t, grantLines(grants), never)
	}
	execAll(t, ownerPool, grants)
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages := qualified(pglease.DefaultMessagesTable)
	var seqPriv bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT has_sequence_privilege($1, pg_get_serial_sequence($2, 'offset'), 'USAGE')
	OR has_sequence_privilege($1, pg_get_serial_sequence($3, 'id'), 'USAGE')`, app, messages, qualified(pglease.DefaultDelayedTable)).Scan(&seqPriv))
	require.False(t, seqPriv, "on a single server the identity columns' sequences need no grant: the script's Citus block grants nothing")

	appPool := poolAs(t, app, 10)
	for _, stmt := range []string{
		"DROP TABLE " + messages,
		"ALTER TABLE " + qualified(pglease.DefaultConsumerSessionsTable) + " ADD COLUMN x integer",
		"ALTER TABLE " + messages + " DETACH PARTITION " + qualified(pglease.DefaultMessagesTable+"_forever"),
		"TRUNCATE " + qualified(pglease.DefaultConsumerOffsetsTable),
		"CREATE TABLE " + qualified("x") + " (i integer)",
	} {
		_, err := appPool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, stmt)
		assert.Equal(t, "42501", pgErr.Code, "%s: %v", stmt, err)
	}

	require.NoError(t, pglease.CreateTopic(ctx, appPool, "short", pglease.TopicConfig{Retention: 2 * time.Second, Tables: adapter}))
	require.NoError(t, pglease.CreateTopic(ctx, appPool, "keep", pglease.TopicConfig{Partitions: 2, Tables: adapter}))
	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(appPool, pglease.SubscriberConfig{Tables: adapter, ConsumerGroup: "g",
		PollInterval: 20 * time.Millisecond, SessionTTL: 2 * time.Second}, logger)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "keep")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the application role to be elected maintainer", func() bool { return sub.Stats().Maintainer })
	pub, err := pglease.NewPublisher(appPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	ids := publishN(t, pub, "keep", 5)
	delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(delayed, delay.For(time.Second))
	require.NoError(t, pub.Publish("keep", delayed))
	assert.ElementsMatch(t, append(ids, delayed.UUID), uuids(receive(t, msgs, 6, 15*time.Second)))

	insp, err := admin.NewInspector(appPool, adapter)
	require.NoError(t, err)
	resets, err := insp.ResetOffsets(ctx, admin.ResetOffsetsParams{ConsumerGroup: "other", Topic: "keep", To: admin.ResetToLatest})
	require.NoError(t, err)
	assert.Len(t, resets, 2, "both partitions of the topic reset")

	waitCovered(t, pool, adapter, 2*time.Second)
	publishN(t, pub, "short", 20)
	count := func() (lanes, kept int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE retention_class > 0),
			count(*) FILTER (WHERE retention_class = 0) FROM `+messages+` WHERE topic = 'short'`).Scan(&lanes, &kept))
		return lanes, kept
	}
	lanes, kept := count()
	require.Equal(t, 20, lanes, "the messages went to the partitions the maintainer added through the functions")
	require.Zero(t, kept)
	waitFor(t, 20*time.Second, "the short topic to be emptied", func() bool {
		lanes, kept := count()
		return lanes+kept == 0
	})
	st := sub.Stats()
	assert.Positive(t, st.RetentionPartitionsCreated)
	assert.Positive(t, st.RetentionPartitionsDropped)
	assert.Zero(t, st.RetentionRowsDeleted, "nothing was deleted row by row")
	var owned int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relowner = $1::regrole", app).Scan(&owned))
	assert.Zero(t, owned, "the application role owns nothing, the partitions it had added included")
	require.NoError(t, pub.Close())
	require.NoError(t, sub.Close())
	assert.Empty(t, errorsLogged(logger), "nothing logged at Error level")
	assertNoLeakedGoroutines(t)
}

// TestMaintainerWithoutGrantsStandsAside runs a Subscriber whose role has
// DML on the tables but may not execute the owner's functions: it says so
// once, at Error level, naming the role, what it lacks and what to run,
// and does not stand; a Subscriber whose role has the grants started
// after it is elected, and when that one closes the first still does not
// take the role.
func TestMaintainerWithoutGrantsStandsAside(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter, ownerPool := ownedSchema(t, pool)
	granted, lacking := newRole(t, pool, "pglease_granted"), newRole(t, pool, "pglease_lacking")
	execAll(t, ownerPool, pglease.GrantSQL(adapter, granted), pglease.GrantSQL(adapter, lacking),
		"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "+pgx.Identifier{adapter.Schema}.Sanitize()+" FROM "+pgx.Identifier{lacking}.Sanitize())
	cfg := pglease.SubscriberConfig{Tables: adapter, PollInterval: 20 * time.Millisecond, SessionTTL: 2 * time.Second}

	lackLog := newCapturingLogger()
	cfg.ConsumerGroup = "a"
	lackSub, err := pglease.NewSubscriber(poolAs(t, lacking, 5), cfg, lackLog)
	require.NoError(t, err)
	defer lackSub.Close()
	lackMsgs, err := lackSub.Subscribe(ctx, "t")
	require.NoError(t, err)
	refusals := func() []logEntry {
		var out []logEntry
		for _, e := range errorsLogged(lackLog) {
			if errors.Is(e.Err, pglease.ErrMaintenanceNotPermitted) {
				out = append(out, e)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "the refusal to be logged", func() bool { return len(refusals()) > 0 })
	refusal := refusals()[0]
	assert.Equal(t, lacking, refusal.Fields["role"])
	assert.Contains(t, refusal.Fields["missing"], "EXECUTE on function")
	assert.Contains(t, refusal.Msg, "pglease.GrantSQL")
	assert.Contains(t, refusal.Msg, "pglease grant --role "+lacking)

	cfg.ConsumerGroup = "b"
	grantedSub, err := pglease.NewSubscriber(poolAs(t, granted, 5), cfg, testLogger())
	require.NoError(t, err)
	defer grantedSub.Close()
	_, err = grantedSub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the Subscriber with the grants to be elected", func() bool { return grantedSub.Stats().Maintainer })
	assert.False(t, lackSub.Stats().Maintainer)

	// Released, the maintainer's row is claimed at once by any candidate:
	// the Subscriber without the grants is none, and says nothing more.
	require.NoError(t, grantedSub.Close())
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	ids := publishN(t, pub, "t", 3)
	assert.Equal(t, ids, uuids(receive(t, lackMsgs, 3, 10*time.Second)), "it delivers as usual")
	assertNothingWithin(t, lackMsgs, time.Second)
	assert.False(t, lackSub.Stats().Maintainer)
	assert.Len(t, refusals(), 1, "the refusal is logged once")
	assert.Len(t, errorsLogged(lackLog), 1, "and nothing else at Error level")
	require.NoError(t, lackSub.Close())
	assertNoLeakedGoroutines(t)
}

// TestMaintainerFunctionsActOnlyOnRetentionPartitions calls the owner's
// functions directly, as an application role, on a messages table whose
// long name makes partition names carry a hash: they are SECURITY DEFINER
// with a pinned search_path and no EXECUTE for PUBLIC; they build the
// partition's name as the maintainer does; they refuse bad arguments and
// leave alone every table that is not a retention partition of that
// messages table, even one with a partition's name; and the detach of
// the expiring one gives up after its lock_timeout, measured with what it
// costs a publisher meanwhile.
func TestMaintainerFunctionsActOnlyOnRetentionPartitions(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 6)
	adapter := newSchema(t, pool)
	adapter.MessagesTable = strings.Repeat("m", 60)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	app, stranger := newRole(t, pool, "pglease_app"), newRole(t, pool, "pglease_stranger")
	execAll(t, pool, pglease.GrantSQL(adapter, app))
	appPool := poolAs(t, app, 4)
	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages := qualified(adapter.MessagesTable)
	partition := func(class int, start int64) string {
		return pglease.PartitionName(adapter, fmt.Sprintf("r%d_%d", class, start))
	}
	exists := func(name string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qualified(name)).Scan(&ok))
		return ok
	}
	call := func(q pgsql.Stmt) (bool, error) {
		var done bool
		err := appPool.QueryRow(ctx, q.SQL, q.Args...).Scan(&done)
		return done, err
	}
	slot := func(class int, start int64, seconds int64) pgsql.RetentionPartition {
		return pgsql.RetentionPartition{Class: class, Start: time.Unix(start, 0), End: time.Unix(start+seconds, 0)}
	}

	for _, fn := range []string{"add_retention_partition(integer, bigint, bigint)", "expire_retention_partition(integer, bigint)",
		"drop_detached_partition(integer, bigint)"} {
		sig := pgx.Identifier{adapter.Schema, pglease.PartitionName(adapter, fn[:strings.IndexByte(fn, '(')])}.Sanitize() + fn[strings.IndexByte(fn, '('):]
		var definer, appMay, strangerMay bool
		var config []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT prosecdef, proconfig, has_function_privilege($2, oid, 'EXECUTE'),
	has_function_privilege($3, oid, 'EXECUTE') FROM pg_proc WHERE oid = $1::regprocedure`, sig, app, stranger).
			Scan(&definer, &config, &appMay, &strangerMay))
		assert.True(t, definer, "%s is SECURITY DEFINER", sig)
		assert.Contains(t, config, "search_path=pg_catalog, pg_temp", sig)
		assert.True(t, appMay, "GrantSQL grants EXECUTE on %s", sig)
		assert.False(t, strangerMay, "PUBLIC may not execute %s", sig)
	}

	// Adds a partition named as the maintainer names it, once: a slot of
	// class 3 (1 s wide) that a topic has, which ended 2 s ago (the
	// function takes slots that ended up to 10 s ago, so that it can
	// also be expired here at once).
	execAll(t, pool, "INSERT INTO "+qualified(pglease.DefaultTopicsTable)+
		" (topic, retention, retention_class, classes_from, classes_to) VALUES ('r3', '3 seconds', 3, 3, 3)")
	var now int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT floor(extract(epoch FROM now()))::bigint").Scan(&now))
	start := now - 3
	p := slot(3, start, 1)
	require.Greater(t, len(adapter.MessagesTable)+len(fmt.Sprintf("_r3_%d", start)), 63, "the name is shortened, with a hash")
	done, err := call(tablesOf(adapter).CallAddRetentionPartition(p))
	require.NoError(t, err)
	assert.True(t, done)
	assert.True(t, exists(partition(3, start)), "partition %s", partition(3, start))
	done, err = call(tablesOf(adapter).CallAddRetentionPartition(p))
	require.NoError(t, err)
	assert.False(t, done, "added once")

	for _, bad := range []pgsql.RetentionPartition{slot(0, start, 1), slot(-1, start, 1), slot(40_000, start, 1),
		slot(3, -5, 1), slot(3, start+10, 0), slot(3, start+10, -1),
		// Slots the maintainer does not add now: long past, beyond the
		// class's longest retention and two slots more, of a class no
		// topic has.
		slot(3, 1_700_000_000, 1), slot(3, now+3600, 1), slot(3, now+10, 1), slot(4, now/2*2, 2)} {
		_, err := call(tablesOf(adapter).CallAddRetentionPartition(bad))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "class %d from %d to %d", bad.Class, bad.Start.Unix(), bad.End.Unix())
		assert.Equal(t, "22023", pgErr.Code, err.Error())
	}

	// Tables with a partition's name that are none of this messages
	// table: a table of another shape, and a partition of another table.
	decoy, foreign := partition(3, start-100), partition(3, start-200)
	execAll(t, pool,
		"CREATE TABLE "+qualified(decoy)+" (id integer)",
		"CREATE TABLE "+qualified("other")+" (LIKE "+messages+") PARTITION BY RANGE (retention_class, expires_at)",
		"CREATE TABLE "+qualified(foreign)+" PARTITION OF "+qualified("other")+" FOR VALUES FROM (3, MINVALUE) TO (3, MAXVALUE)")
	for _, d := range []pgsql.RetentionPartition{slot(3, start-100, 1), slot(3, start-200, 1)} {
		done, err := call(tablesOf(adapter).CallExpireRetentionPartition(d))
		require.NoError(t, err)
		assert.False(t, done, "expire leaves alone what is no partition of the messages table")
		_, err = call(tablesOf(adapter).CallDropDetachedPartition(d))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "42809", pgErr.Code, err.Error())
	}
	assert.True(t, exists(decoy) && exists(foreign), "the decoys are still there")

	// A partition detached without its drop is found, and dropped.
	execAll(t, pool, "ALTER TABLE "+messages+" DETACH PARTITION "+qualified(partition(3, start)))
	detached := tablesOf(adapter).DetachedRetentionPartitions()
	rows, err := appPool.Query(ctx, detached.SQL, detached.Args...)
	require.NoError(t, err)
	found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var class int32
		var start int64
		err := row.Scan(&class, &start)
		return fmt.Sprintf("r%d_%d", class, start), err
	})
	require.NoError(t, err)
	assert.Equal(t, []string{fmt.Sprintf("r3_%d", start)}, found, "the detached partition, not the decoys")
	done, err = call(tablesOf(adapter).CallDropDetachedPartition(p))
	require.NoError(t, err)
	assert.True(t, done)
	assert.False(t, exists(partition(3, start)))

	// Expires an attached one: detached and dropped in one call.
	done, err = call(tablesOf(adapter).CallAddRetentionPartition(p))
	require.NoError(t, err)
	require.True(t, done)
	done, err = call(tablesOf(adapter).CallExpireRetentionPartition(p))
	require.NoError(t, err)
	assert.True(t, done)
	assert.False(t, exists(partition(3, start)))

	// While a transaction holds the messages table, the detach waits at
	// most its lock_timeout, and a publisher that comes meanwhile waits
	// behind it.
	done, err = call(tablesOf(adapter).CallAddRetentionPartition(p))
	require.NoError(t, err)
	require.True(t, done)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "SELECT count(*) FROM "+messages)
	require.NoError(t, err)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	expired := make(chan error, 1)
	began := time.Now()
	go func() {
		_, err := call(tablesOf(adapter).CallExpireRetentionPartition(p))
		expired <- err
	}()
	waitFor(t, 5*time.Second, "the detach to wait for its lock", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
WHERE relation = $1::regclass AND mode = 'AccessExclusiveLock' AND NOT granted`, messages).Scan(&n))
		return n > 0
	})
	publishStart := time.Now()
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
	publishWait := time.Since(publishStart)
	err = <-expired
	detachWait := time.Since(began)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "55P03", pgErr.Code, "lock_not_available: %v", err)
	assert.Less(t, detachWait, 3*time.Second, "the detach gave up after its lock_timeout")
	assert.Less(t, publishWait, detachWait, "the publisher went on once the detach gave up")
	t.Logf("detach gave up after %s; a publisher arriving meanwhile waited %s", detachWait.Round(time.Millisecond), publishWait.Round(time.Millisecond))
	require.NoError(t, holder.Rollback(ctx))
	assert.True(t, exists(partition(3, start)), "nothing was detached")
}

// TestMeasureDetachUnderLoad measures what expiring a retention partition
// costs publishers, by the owner's DDL (DETACH CONCURRENTLY, then DROP)
// and through the owner's function (DETACH in its transaction, waiting at
// most its lock_timeout, then DROP), while publishers write as fast as
// they can and a Subscriber reads: each round adds a partition with 1,000
// messages and expires it; the test logs how long each expiry took and
// the publish latencies meanwhile. Skipped unless PGLEASE_MEASURE is set
// (benchmarks/measurements.md quotes its output).
func TestMeasureDetachUnderLoad(t *testing.T) {
	if os.Getenv("PGLEASE_MEASURE") == "" {
		t.Skip("a measurement: set PGLEASE_MEASURE=1 to run it")
	}
	const (
		publishers = 4
		rounds     = 30
	)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter, ownerPool := ownedSchema(t, pool)
	app := newRole(t, pool, "pglease_app")
	execAll(t, ownerPool, pglease.GrantSQL(adapter, app))
	appPool := poolAs(t, app, publishers+6)
	messages := pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable}.Sanitize()

	sub, err := pglease.NewSubscriber(appPool, pglease.SubscriberConfig{Tables: adapter, ConsumerGroup: "reader",
		Maintenance: pglease.MaintenanceConfig{Disabled: true}}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "load")
	require.NoError(t, err)
	go func() {
		for m := range msgs {
			m.Ack()
		}
	}()
	pub, err := pglease.NewPublisher(appPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()

	percentile := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := append([]time.Duration(nil), d...)
		slices.Sort(s)
		return s[min(len(s)-1, int(float64(len(s))*p))]
	}
	measure := func(name string, expire func(p pgsql.RetentionPartition) error, add func(p pgsql.RetentionPartition) error) {
		var mu sync.Mutex
		var latencies []time.Duration
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range publishers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					began := time.Now()
					if err := pub.Publish("load", message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					latencies = append(latencies, time.Since(began))
					mu.Unlock()
				}
			}()
		}
		var expiries []time.Duration
		began := time.Now()
		for i := range rounds {
			start := time.Now().Add(-time.Hour).Unix() + int64(i)*10
			p := pgsql.RetentionPartition{Class: 2, Start: time.Unix(start, 0), End: time.Unix(start+1, 0)}
			require.NoError(t, add(p))
			execAll(t, pool, fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload, retention_class, expires_at)
SELECT 'expiring', gen_random_uuid()::text, 'x', 2, to_timestamp(%d) FROM generate_series(1, 1000)`, messages, start))
			t0 := time.Now()
			require.NoError(t, expire(p))
			expiries = append(expiries, time.Since(t0))
		}
		elapsed := time.Since(began)
		close(stop)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		t.Logf("%s: %d expiries in %s: each p50 %s, max %s; %d publishes (%.0f/s): p50 %s, p99 %s, max %s",
			name, rounds, elapsed.Round(time.Millisecond), percentile(expiries, 0.5).Round(time.Microsecond),
			percentile(expiries, 1).Round(time.Microsecond), len(latencies), float64(len(latencies))/elapsed.Seconds(),
			percentile(latencies, 0.5).Round(time.Microsecond), percentile(latencies, 0.99).Round(time.Microsecond),
			percentile(latencies, 1).Round(time.Microsecond))
		assert.Less(t, percentile(latencies, 1), 2*time.Second)
	}

	call := func(q pgsql.Stmt) error {
		var done bool
		if err := appPool.QueryRow(ctx, q.SQL, q.Args...).Scan(&done); err != nil {
			return err
		}
		if !done {
			return fmt.Errorf("%s: nothing done", q.SQL)
		}
		return nil
	}
	measure("owner's DDL (DETACH CONCURRENTLY)", func(p pgsql.RetentionPartition) error {
		if _, err := ownerPool.Exec(ctx, tablesOf(adapter).DetachRetentionPartition(p, false)); err != nil {
			return err
		}
		_, err := ownerPool.Exec(ctx, tablesOf(adapter).DropRetentionPartition(p))
		return err
	}, func(p pgsql.RetentionPartition) error {
		return pgx.BeginFunc(ctx, ownerPool, func(tx pgx.Tx) error {
			for _, stmt := range tablesOf(adapter).CreateRetentionPartition(p) {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return err
				}
			}
			return nil
		})
	})
	measure("owner's function (DETACH in a transaction)", func(p pgsql.RetentionPartition) error {
		return call(tablesOf(adapter).CallExpireRetentionPartition(p))
	}, func(p pgsql.RetentionPartition) error {
		return call(tablesOf(adapter).CallAddRetentionPartition(p))
	})
}

// TestGrantSQL checks the statements without a database, and that the
// scripts for what it refuses fail when run.
func TestGrantSQL(t *testing.T) {
	parallel(t)
	sql := pglease.GrantSQL(pglease.Tables{}, `app"; DROP TABLE x; --`)
	assert.Contains(t, sql, `TO "app""; DROP TABLE x; --";`, "the role is quoted")
	assert.Contains(t, sql, `ON TABLE "pglease_messages" TO`, "the zero value is the default names")
	assert.NotContains(t, sql, "ON SCHEMA", "no schema without Schema")
	withSchema := pglease.GrantSQL(pglease.Tables{Schema: "My Schema", MessagesTable: "msgs"}, "app")
	assert.Contains(t, withSchema, `GRANT USAGE ON SCHEMA "My Schema" TO "app";`)
	assert.Contains(t, withSchema, `GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "My Schema"."msgs_forever" TO "app";`)
	assert.Contains(t, withSchema, `GRANT EXECUTE ON FUNCTION "My Schema"."msgs_expire_retention_partition"(integer, bigint) TO "app";`)
	assert.Contains(t, withSchema, `GRANT SELECT ON TABLE "My Schema"."pglease_schema_version" TO "app";`)

	pool := newPool(t, 2)
	for _, refused := range []string{pglease.GrantSQL(pglease.Tables{}, ""),
		pglease.GrantSQL(pglease.Tables{}, "public")} {
		assert.NotContains(t, refused, "GRANT")
		_, err := pool.Exec(context.Background(), refused)
		require.Error(t, err, refused)
		assert.Contains(t, err.Error(), "pglease.GrantSQL: ")
	}
}

// TestSetUpByAnApplicationRoleSaysWhatToDo: an application role that
// initializes or migrates the schema where it may not create tables (the
// search_path's schema, as public is on PostgreSQL 15 and later for every
// role but its owner) gets PostgreSQL's "permission denied for schema"
// with what to do: migrate as the owner, or name the schema the tables
// are in.
func TestSetUpByAnApplicationRoleSaysWhatToDo(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	schema := newSchema(t, pool).Schema
	app := newRole(t, pool, "pglease_app")
	ident := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	// Like public: the role may use the schema, not create in it, and it
	// is the first schema of its search_path.
	execAll(t, pool, "CREATE SCHEMA "+ident(schema), "GRANT USAGE ON SCHEMA "+ident(schema)+" TO "+ident(app),
		"ALTER ROLE "+ident(app)+" SET search_path = "+ident(schema))
	appPool := poolAs(t, app, 2)

	const todo = "run pglease.Migrate or `pglease migrate` as the role that is to own them"
	err := pglease.Migrate(ctx, appPool, pglease.Tables{})
	require.Error(t, err)
	assert.ErrorContains(t, err, "permission denied for schema "+schema)
	assert.ErrorContains(t, err, "in the schema of the search_path (Tables.Schema is empty)")
	assert.ErrorContains(t, err, todo)
	assert.ErrorContains(t, err, "if the tables are in another schema, set Tables.Schema to it")

	sub, err := pglease.NewSubscriber(appPool, pglease.SubscriberConfig{InitializeSchema: true}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Close()) }()
	assert.ErrorContains(t, sub.SubscribeInitialize("t"), todo, "schema initialization by a Subscriber")

	err = pglease.Migrate(ctx, appPool, pglease.Tables{Schema: schema})
	assert.ErrorContains(t, err, "in schema "+ident(schema)+":")
	assert.ErrorContains(t, err, todo)
}

// TestPublisherOnlyRole: a role with GrantPublisherSQL's grants publishes
// to a plain topic, a partitioned one with keys, one with a retention, one
// with a retention longer than a day (its keys' class rows) and a delayed
// message, all delivered to a consumer of GrantSQL's role; it
// cannot read messages, subscribe, move or delete any group's offsets,
// touch sessions, create topics or call the maintainer's functions.
func TestPublisherOnlyRole(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter, ownerPool := ownedSchema(t, pool)
	publisher := newRole(t, pool, "pglease_publisher")
	consumer := newRole(t, pool, "pglease_app")
	grants := pglease.GrantPublisherSQL(adapter, publisher)
	for _, never := range []string{"UPDATE", "DELETE", "EXECUTE", "TRUNCATE", "ALL"} {
		assert.NotContains(t, grantLines(grants), never)
	}
	execAll(t, ownerPool, grants, pglease.GrantSQL(adapter, consumer))
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "keyed", pglease.TopicConfig{Partitions: 3, Tables: adapter}))
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "kept", pglease.TopicConfig{Retention: time.Hour, Tables: adapter}))
	// Keys for a retention of three days: its key class's rows.
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "long", pglease.TopicConfig{Retention: 72 * time.Hour, Tables: adapter}))
	readyKeyClass(t, ownerPool, adapter, 19)

	pubPool := poolAs(t, publisher, 4)
	pub, err := pglease.NewPublisher(pubPool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true,
		PartitionKey:   func(_ string, msg *message.Message) (string, error) { return msg.UUID, nil },
		IdempotencyKey: func(_ string, msg *message.Message) string { return msg.UUID }}, nil)
	require.NoError(t, err)
	defer pub.Close()
	want := map[string][]string{}
	for _, topic := range []string{"plain", "keyed", "kept", "long"} {
		want[topic] = publishN(t, pub, topic, 3)
	}
	delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(delayed, delay.For(100*time.Millisecond))
	require.NoError(t, pub.Publish("plain", delayed))
	want["plain"] = append(want["plain"], delayed.UUID)
	// Idempotency keys: published again, the same messages are left out.
	res, err := pub.PublishWithResult("plain", delayed, message.NewMessage(want["plain"][0], nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, res.AlreadyStored, "the publisher's role writes and reads its keys")
	res, err = pub.PublishWithResult("kept", message.NewMessage(want["kept"][1], nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0}, res.AlreadyStored)
	res, err = pub.PublishWithResult("long", message.NewMessage(want["long"][2], nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0}, res.AlreadyStored, "the keys of a topic with a retention of three days")

	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	for _, stmt := range []string{
		"SELECT * FROM " + qualified(pglease.DefaultMessagesTable),
		"UPDATE " + qualified(pglease.DefaultConsumerOffsetsTable) + " SET acked_offset = 0",
		"DELETE FROM " + qualified(pglease.DefaultConsumerOffsetsTable),
		"DELETE FROM " + qualified(pglease.DefaultConsumerSessionsTable),
		"INSERT INTO " + qualified(pglease.DefaultTopicsTable) + " (topic, partitions) VALUES ('x', 2)",
	} {
		_, err := pubPool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, stmt)
		assert.Equal(t, "42501", pgErr.Code, "%s: %v", stmt, err)
	}
	var mayExecute bool
	// No function of the schema but the readers' bound, which reads what
	// every role may read (pg_locks, the sequence's last value) and
	// changes nothing, and the publishers' registration, which takes
	// shared advisory locks that any role may take itself (and that hold
	// a topic back only in a transaction that may write the messages
	// table), and the statement's position, a value of the sequence that
	// every role may take itself.
	require.NoError(t, pool.QueryRow(ctx, `SELECT bool_or(has_function_privilege($1, p.oid, 'EXECUTE'))
		FROM pg_proc p WHERE p.pronamespace = $2::regnamespace AND p.proname NOT LIKE '%\_position\_bound'
			AND p.proname NOT LIKE '%\_register' AND p.proname NOT LIKE '%\_next\_position'`,
		publisher, adapter.Schema).Scan(&mayExecute))
	assert.False(t, mayExecute, "no function of the schema")
	pubSub, err := pglease.NewSubscriber(pubPool, pglease.SubscriberConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	_, err = pubSub.Subscribe(ctx, "plain")
	require.Error(t, err, "the publisher's role cannot consume")
	require.NoError(t, pubSub.Close())

	sub, err := pglease.NewSubscriber(poolAs(t, consumer, 10), pglease.SubscriberConfig{Tables: adapter,
		PollInterval: 20 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer sub.Close()
	for topic, ids := range want {
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		assert.ElementsMatch(t, ids, uuids(receive(t, msgs, len(ids), 15*time.Second)), topic)
	}
}

// TestPublisherCannotForgePositions: a role with only the grants of
// GrantPublisherSQL writes rows with a transaction id far ahead of the
// counter, an offset and a creation time of its own (one per partition
// of every topic, in a transaction and with OVERRIDING SYSTEM VALUE).
// The database gives them the position and time of their transaction:
// no stored row lies ahead of the counter, and two consumer groups
// consume everything, what was published before the forged rows and
// after them, the forged rows as ordinary messages.
func TestPublisherCannotForgePositions(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter, ownerPool := ownedSchema(t, pool)
	publisher := newRole(t, pool, "pglease_publisher")
	consumer := newRole(t, pool, "pglease_app")
	execAll(t, ownerPool, pglease.GrantPublisherSQL(adapter, publisher), pglease.GrantSQL(adapter, consumer))
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "keyed", pglease.TopicConfig{Partitions: 3, Tables: adapter}))
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "kept", pglease.TopicConfig{Retention: time.Hour, Tables: adapter}))

	pubPool := poolAs(t, publisher, 4)
	pub, err := pglease.NewPublisher(pubPool, pglease.PublisherConfig{Tables: adapter,
		PartitionKey: func(_ string, msg *message.Message) (string, error) { return msg.UUID, nil }}, nil)
	require.NoError(t, err)
	defer pub.Close()
	topics := []string{"plain", "keyed", "kept"}
	want := map[string][]string{}
	for _, topic := range topics {
		want[topic] = publishN(t, pub, topic, 4)
	}

	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	const future = "1125899906842624" // far ahead of anything a test cluster reaches (the sequence too)
	forged := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	tx, err := pubPool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, `INSERT INTO `+qualified(pglease.DefaultMessagesTable)+`
	(topic, partition, transaction_id, "offset", created_at, uuid, retention_class, expires_at)
OVERRIDING SYSTEM VALUE
SELECT t.topic, p, $1::text::xid8, 9223372036854775807 - p, $2::timestamptz, 'forged-' || t.topic || '-' || p, 0, 'infinity'
FROM (SELECT topic, partitions FROM `+qualified(pglease.DefaultTopicsTable)+`
	UNION ALL SELECT 'plain', 1) t, generate_series(0, t.partitions - 1) p`, future, forged)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 5, tag.RowsAffected(), "one forged row per partition of every topic")
	want["plain"] = append(want["plain"], "forged-plain-0")
	want["kept"] = append(want["kept"], "forged-kept-0")
	want["keyed"] = append(want["keyed"], "forged-keyed-0", "forged-keyed-1", "forged-keyed-2")
	for _, topic := range topics {
		want[topic] = append(want[topic], publishN(t, pub, topic, 2)...)
	}

	var ahead, backdated int
	require.NoError(t, ownerPool.QueryRow(ctx, `SELECT
	count(*) FILTER (WHERE transaction_id > (SELECT last_value FROM `+qualified(pglease.DefaultMessagesTable+"_positions")+`)::text::xid8),
	count(*) FILTER (WHERE created_at = $1)
FROM `+qualified(pglease.DefaultMessagesTable), forged).Scan(&ahead, &backdated))
	assert.Zero(t, ahead, "no stored row lies ahead of the counter (the position sequence)")
	assert.Zero(t, backdated, "the creation time is the database's")

	for _, group := range []string{"g1", "g2"} {
		sub, err := pglease.NewSubscriber(poolAs(t, consumer, 10), pglease.SubscriberConfig{Tables: adapter,
			ConsumerGroup: group, PollInterval: 20 * time.Millisecond}, nil)
		require.NoError(t, err)
		defer sub.Close()
		for _, topic := range topics {
			msgs, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			assert.ElementsMatch(t, want[topic], uuids(receive(t, msgs, len(want[topic]), 15*time.Second)), "%s %s", group, topic)
		}
	}
}
