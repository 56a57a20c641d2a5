package pglease_test

import (
	"context"
	"errors"
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
	cfg, err := pgxpool.ParseConfig(testDSN)
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

// TestSchemaSetUpWithoutCreateOnDatabase sets up schemas that exist
// already, owned by a role without the CREATE privilege on the database:
// the script of SchemaSQL and the automatic set-up both succeed (CREATE
// SCHEMA IF NOT EXISTS alone is refused even when the schema exists).
func TestSchemaSetUpWithoutCreateOnDatabase(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	byScript, byInit := newSchema(t, pool), newSchema(t, pool)
	owner := newRole(t, pool, "pglease_owner")
	for _, a := range []pglease.DefaultSchemaAdapter{byScript, byInit} {
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
	for _, a := range []pglease.DefaultSchemaAdapter{byScript, byInit} {
		require.Equal(t, len(a.Migrations()), schemaVersion(t, pool, pgx.Identifier{a.Schema, pglease.DefaultSchemaVersionTable}.Sanitize()))
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
// puts in place of the old one keeps all of it, and the application role
// publishes and subscribes as before.
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
	require.NoError(t, pglease.Migrate(ctx, ownerPool, version5Adapter{adapter}))
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
	require.Equal(t, len(adapter.Migrations()), schemaVersion(t, pool, qualified(pglease.DefaultSchemaVersionTable)))
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

	// The application role goes on: publishes (a delayed message too),
	// subscribes, and its policies still apply.
	pub, err := pglease.NewPublisher(appPool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
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
	sub, err := pglease.NewSubscriber(appPool, pglease.SubscriberConfig{SchemaAdapter: adapter, PollInterval: 50 * time.Millisecond,
		Maintenance: pglease.MaintenanceConfig{Disabled: true}}, testLogger())
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	assert.Equal(t, append(before, after...), uuids(receive(t, msgs, 2, 10*time.Second)))
	require.NoError(t, sub.Close())
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
	require.NoError(t, pglease.Migrate(ctx, ownerPool, version5Adapter{adapter}))
	require.NoError(t, pglease.Migrate(ctx, pool, adapter), "the upgrade, as a superuser")
	var owners string
	require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(DISTINCT pg_get_userbyid(relowner), ', ') FROM pg_class
WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p')`, pgx.Identifier{adapter.Schema}.Sanitize()).Scan(&owners))
	assert.Equal(t, owner, owners, "every table belongs to the owner")
	require.NoError(t, pglease.CreateTopic(ctx, ownerPool, "t", pglease.TopicConfig{SchemaAdapter: adapter, Partitions: 2}))
	pub, err := pglease.NewPublisher(ownerPool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	publishN(t, pub, "t", 3)
}
