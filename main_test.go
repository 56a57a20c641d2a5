package pglease_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// testDSN is the database every test uses; each test works in a schema of
// its own.
var testDSN string

// poolDSN is where newPool's pools connect: testDSN, unless
// PGLEASE_TEST_POOL_DSN names another way to the same database (`make test`
// runs part of the suite through PgBouncer in transaction mode so).
// Subscribers of newTestSubscriber then LISTEN on testDSN.
var poolDSN string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelperProcess())
	}
	dsn, err := pgtest.DSN()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pglease tests:", err)
		os.Exit(1)
	}
	testDSN = dsn
	poolDSN = dsn
	if d := os.Getenv("PGLEASE_TEST_POOL_DSN"); d != "" {
		poolDSN = d
	}
	code := m.Run()
	pgtest.Terminate()
	os.Exit(code)
}

// newPool returns a pool on the test database, closed at the end of the test.
func newPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(poolDSN)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newPoolOn returns a pool on dsn, closed at the end of the test.
func newPoolOn(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// directConnConfig is the test database's DSN, direct, for ListenConnConfig.
func directConnConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(testDSN)
	require.NoError(t, err)
	return cfg
}

// newSchema returns an adapter on a fresh PostgreSQL schema of its own,
// dropped at the end of the test. The schema itself is created by schema
// initialization.
func newSchema(t testing.TB, pool *pgxpool.Pool) pglease.DefaultSchemaAdapter {
	t.Helper()
	name := "pglease_test_" + randomHex(6)
	t.Cleanup(func() {
		if os.Getenv("PGLEASE_TEST_KEEP_SCHEMA") != "" {
			t.Logf("kept schema %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	return pglease.DefaultSchemaAdapter{Schema: name}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// testLogger logs to the test's output when PGLEASE_TEST_LOG is set.
func testLogger() watermill.LoggerAdapter {
	if os.Getenv("PGLEASE_TEST_LOG") != "" {
		return watermill.NewStdLogger(true, os.Getenv("PGLEASE_TEST_LOG") == "trace")
	}
	return nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ownGoroutine matches stack frames of goroutines that pglease starts.
var ownGoroutine = regexp.MustCompile(`watermill-pglease\.\(\*(consumer|subscription|groupMember|sessionKeeper|maintainer|Subscriber|Publisher|batcher\[\.\.\.\]|wakeHub|sharedListener)\)|watermill-pglease/internal/svc\.`)

// assertNoLeakedGoroutines waits until no goroutine of the library is left.
func assertNoLeakedGoroutines(t testing.TB) {
	t.Helper()
	var leaked []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked = leaked[:0]
		buf := make([]byte, 1<<22)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if ownGoroutine.MatchString(g) {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(leaked) > 0 {
		t.Fatalf("%d goroutines of pglease still running after Close:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
	}
}
