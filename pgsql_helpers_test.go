package pglease_test

import (
	"context"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// migrateTo applies a's migrations up to version only: the schema of an
// older release.
func migrateTo(ctx context.Context, db pgsql.Beginner, a pglease.Tables, version int) error {
	t := tablesOf(a)
	return pgsql.Migrate(ctx, db, t, t.Migrations()[:version])
}
