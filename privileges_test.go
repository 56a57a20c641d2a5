package pglease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
