package pglease_test

import (
	"context"
	"testing"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// tablesOf returns the statements pglease runs on a's tables, for tests
// that run one themselves.
func tablesOf(a pglease.Tables) *pgsql.Tables {
	return pgsql.NewTables(pgsql.Names(a))
}

// serverHere is the identity of the server q runs on (pgsql.Here): what
// the statements fenced by a session's identity take for a session made
// there.
func serverHere(t testing.TB, q pgsql.Querier) string {
	t.Helper()
	here, err := pgsql.Here(context.Background(), q)
	if err != nil {
		t.Fatalf("read the server's identity: %v", err)
	}
	return here
}

// migrateTo applies a's migrations up to version only: the schema of an
// older release.
func migrateTo(ctx context.Context, db pgsql.Beginner, a pglease.Tables, version int) error {
	t := tablesOf(a)
	return pgsql.Migrate(ctx, db, t, t.Migrations()[:version])
}
