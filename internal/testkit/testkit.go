// Package testkit holds the helpers that the external tests of more than
// one package of this module share (package pglease_test, admin_test,
// wmsqlimport_test): the test database's DSNs and TestMain, a pool and a
// schema of the test's own, a publisher and a subscriber on them, the
// reads of pglease's tables, the statements of the claim, and a logger
// that records what it is told. Helpers that need nothing of pglease live
// in internal/pgtest.
//
// It imports the root package, so only external test packages may import
// it: an internal test of the root (package pglease) that did would be an
// import cycle, and no non-test code imports it.
package testkit

import (
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// DSN is the database every test uses; each test works in a schema of its
// own. [Main] sets it (under -short it stays empty).
var DSN string

// PoolDSN is where the pools of [NewPool] connect: [DSN], unless
// PGLEASE_TEST_POOL_DSN names another way to the same database (`make
// test` runs part of the suite through PgBouncer in transaction mode so).
// Subscribers of [NewSubscriber] then LISTEN on DSN.
var PoolDSN string

// Main is the TestMain of a package whose tests use this package: it
// returns the exit code for os.Exit, after [pgtest.Main] with name, which
// sets [DSN] and [PoolDSN].
func Main(m *testing.M, name string) int {
	return pgtest.Main(m, name, func(dsn string) {
		DSN = dsn
		PoolDSN = dsn
		if d := os.Getenv("PGLEASE_TEST_POOL_DSN"); d != "" {
			PoolDSN = d
		}
	})
}

// NewPool returns a pool on the test database, closed at the end of the
// test; under -short it skips the test.
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, PoolDSN, maxConns)
}

// NewSchema returns a Tables on a fresh PostgreSQL schema of its own,
// dropped at the end of the test. The schema itself is created by schema
// initialization.
func NewSchema(t testing.TB, pool *pgxpool.Pool) pglease.Tables {
	t.Helper()
	return pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_test_")}
}

// DirectConnConfig is the test database's DSN, direct, for
// ListenConnConfig.
func DirectConnConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	pgtest.SkipShort(t)
	cfg, err := pgx.ParseConfig(DSN)
	require.NoError(t, err)
	return cfg
}

// Logger logs to the test's output when PGLEASE_TEST_LOG is set.
func Logger() watermill.LoggerAdapter {
	if os.Getenv("PGLEASE_TEST_LOG") != "" {
		return watermill.NewStdLogger(true, os.Getenv("PGLEASE_TEST_LOG") == "trace")
	}
	return nil
}
