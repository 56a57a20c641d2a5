package pgsql_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgsql/pgsqltest"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// testDSN is the database of the single-server tests (pgtest.Main).
var testDSN string

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "internal/pgsql", func(dsn string) { testDSN = dsn }))
}

// TestDriverSingleNode runs the conformance suite of the statements
// (internal/pgsql/pgsqltest) on a single PostgreSQL server, each case in a
// schema of its own.
func TestDriverSingleNode(t *testing.T) {
	pool := pgtest.NewPool(t, testDSN, 0)
	pgsqltest.Exercise(t, func(t *testing.T) pgsqltest.Env {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tables := pgsql.NewTables(pgsql.Names{Schema: pgtest.NewSchema(t, pool, "pglease_suite_")})
		if err := pgsql.Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		driver := pgsql.NewSingleNode(tables)
		if opened, err := pgsql.OpenDriver(ctx, pool, tables); err != nil || opened != driver {
			t.Fatalf("OpenDriver = %T, %v; want the single-node driver", opened, err)
		}
		return pgsqltest.Env{Pool: pool, Tables: tables, Driver: driver}
	})
}

// TestCitusDriver runs the conformance suite on the Citus cluster of
// `make test-citus` (coordinator and workers, internal/cmd/localcitus),
// each case in a schema of its own, migrated and distributed; without
// PGLEASE_TEST_CITUS it is skipped.
func TestCitusDriver(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	pool := pgtest.NewPool(t, testDSN, 0)
	pgsqltest.Exercise(t, func(t *testing.T) pgsqltest.Env {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		names := pgsql.Names{Schema: pgtest.NewSchema(t, pool, "pglease_citus_")}
		tables := pgsql.NewTables(names)
		if err := pgsql.Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if _, err := pool.Exec(ctx, tables.DistributeScript()); err != nil {
			t.Fatalf("distribute: %v", err)
		}
		driver := pgsql.NewCitus(tables)
		if opened, err := pgsql.OpenDriver(ctx, pool, tables); err != nil || opened != driver {
			t.Fatalf("OpenDriver = %T, %v; want the Citus driver", opened, err)
		}
		return pgsqltest.Env{Pool: pool, Tables: tables, Driver: driver, Citus: true}
	})
}
