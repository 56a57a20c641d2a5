package pglease_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// migrateTo applies a's migrations up to version only: the schema of an
// older release.
func migrateTo(ctx context.Context, db pgsql.Beginner, a pglease.Tables, version int) error {
	t := tablesOf(a)
	return pgsql.Migrate(ctx, db, t, t.Migrations()[:version])
}

// execKeepingPositions runs sql, an insert of messages with positions of
// its own, in a transaction that asks the messages table's trigger to
// keep them (pglease.keep_positions, honoured for the owner's role only):
// rows as a restore or an import writes them.
func execKeepingPositions(t *testing.T, db pgsql.Beginner, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_catalog.set_config('pglease.keep_positions', 'on', true)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}
