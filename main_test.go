package pglease_test

import (
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
	os.Exit(pgtest.Main(m, "pglease", func(dsn string) {
		testDSN = dsn
		poolDSN = dsn
		if d := os.Getenv("PGLEASE_TEST_POOL_DSN"); d != "" {
			poolDSN = d
		}
	}))
}

// newPool returns a pool on the test database, closed at the end of the
// test; under -short it skips the test.
func newPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, poolDSN, maxConns)
}

// newPoolOn returns a pool on dsn, closed at the end of the test.
func newPoolOn(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, dsn, maxConns)
}

// directConnConfig is the test database's DSN, direct, for ListenConnConfig.
func directConnConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	pgtest.SkipShort(t)
	cfg, err := pgx.ParseConfig(testDSN)
	require.NoError(t, err)
	return cfg
}

// newSchema returns an adapter on a fresh PostgreSQL schema of its own,
// dropped at the end of the test. The schema itself is created by schema
// initialization.
func newSchema(t testing.TB, pool *pgxpool.Pool) pglease.Tables {
	t.Helper()
	return pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_test_")}
}

func randomHex(n int) string { return pgtest.RandomHex(n) }

// parallel marks a test that may run beside the other parallel ones,
// after every sequential test has finished (go test's rule). Only a test
// that works in a schema of its own qualifies, and that sets no test hook
// or package variable (SetListenerProbe, SetAfterClaimHook, ...) and no
// environment variable, restarts or terminates nothing it does not own,
// holds no transaction open while it waits (an open transaction holds the
// xmin horizon of the whole cluster back, and with it every other test's
// deliveries), asserts no latency and no cluster-wide count (the horizon,
// pg_stat_activity, pg_stat_statements), and does not check for leaked
// goroutines (assertNoLeakedGoroutines sees every running test's).
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
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
	pgtest.WaitFor(t, timeout, what, cond)
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
