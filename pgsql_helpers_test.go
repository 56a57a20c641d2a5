package pglease_test

import (
	"context"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// tablesOf returns the statements pglease runs on a's tables, for tests
// that run one themselves.
func tablesOf(a pglease.DefaultSchemaAdapter) *pgsql.Tables {
	return pgsql.NewTables(pgsql.Names(a))
}

// migrateTo applies a's migrations up to version only: the schema of an
// older release.
func migrateTo(ctx context.Context, db pgsql.Beginner, a pglease.DefaultSchemaAdapter, version int) error {
	t := tablesOf(a)
	return pgsql.Migrate(ctx, db, t, t.Migrations()[:version])
}
