package pgsql

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

func TestNotifyAsText(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT 1`: `SELECT 1`,
		`SELECT pg_catalog.pg_notify($1, 'g' || x) FROM d`:                                               `SELECT pg_catalog.pg_notify($1, 'g' || x)::text FROM d`,
		`SELECT pg_catalog.pg_notify($2, (a || (b)::text)) UNION ALL SELECT pg_catalog.pg_notify($2, c)`: `SELECT pg_catalog.pg_notify($2, (a || (b)::text))::text UNION ALL SELECT pg_catalog.pg_notify($2, c)::text`,
	} {
		if got := notifyAsText(in); got != want {
			t.Errorf("notifyAsText(%q) = %q, want %q", in, got, want)
		}
	}
}

// citusTables returns a pool on the coordinator of the Citus cluster of
// `make test-citus` and tables in a schema of the test's own, migrated and
// distributed; without PGLEASE_TEST_CITUS the test is skipped.
func citusTables(t testing.TB) (*pgxpool.Pool, *Tables) {
	t.Helper()
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, os.Getenv("PGLEASE_TEST_DSN"), 0)
	schema := pgtest.NewSchema(t, pool, "pglease_citus_")
	tables := NewTables(Names{Schema: schema})
	if err := Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenDriver(ctx, pool, tables); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(singleNode); !ok {
		t.Fatalf("OpenDriver before the script = %T; want singleNode", d)
	}
	for range 2 { // the script may run twice
		if _, err := pool.Exec(ctx, tables.DistributeScript()); err != nil {
			t.Fatalf("distribute: %v", err)
		}
	}
	if d, err := OpenDriver(ctx, pool, tables); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(citus); !ok {
		t.Fatalf("OpenDriver = %T; want citus", d)
	}
	return pool, tables
}

// TestCitusGlobalPID: the global process id in the application_name of
// Citus's connections, nothing in another application's.
func TestCitusGlobalPID(t *testing.T) {
	for _, c := range []struct {
		name string
		gpid int64
		ok   bool
	}{
		{"citus_internal gpid=10000023076", 10000023076, true},
		{"citus_internal gpid=", 0, false},
		{"citus_internal gpid=x1", 0, false},
		{"citus_internal gpid=-5", 0, false},
		{"nightly-export", 0, false},
		{"", 0, false},
	} {
		if gpid, ok := citusGlobalPID(c.name); gpid != c.gpid && c.ok || ok != c.ok {
			t.Errorf("citusGlobalPID(%q) = %d, %t; want %d, %t", c.name, gpid, ok, c.gpid, c.ok)
		}
	}
}
