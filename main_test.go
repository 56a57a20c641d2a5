package pglease_test

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelperProcess()) // with the default DrainTimeout
	}
	// Many tests end subscriptions while they hold a message on purpose:
	// it goes to the next owner at once. The tests of the wait set
	// DrainTimeout.
	pglease.SetZeroDrainTimeout(-1)
	os.Exit(testkit.Main(m, "pglease"))
}

// The helpers that this package's tests share with those of admin and
// wmsqlimport live in internal/testkit and internal/pgtest; these are the
// names the tests of this package call them by. The test database's DSNs
// are testkit.DSN and testkit.PoolDSN.
var (
	newPool            = testkit.NewPool
	newSchema          = testkit.NewSchema
	directConnConfig   = testkit.DirectConnConfig
	testLogger         = testkit.Logger
	waitFor            = pgtest.WaitFor
	newPublisher       = testkit.NewPublisher
	newTestSubscriber  = testkit.NewSubscriber
	publishN           = testkit.PublishN
	receiveOne         = testkit.ReceiveOne
	receive            = testkit.Receive
	uuids              = testkit.UUIDs
	benchSetup         = testkit.BenchSetup
	table              = testkit.Table
	readOffset         = testkit.ReadOffset
	ackedOffset        = testkit.AckedOffset
	parsePos           = testkit.ParsePos
	tablesOf           = testkit.TablesOf
	driverOf           = testkit.DriverOf
	serverHere         = testkit.ServerHere
	createTables       = testkit.CreateTables
	execQuery          = testkit.ExecQuery
	ensureRow          = testkit.EnsureRow
	claimQuery         = testkit.ClaimQuery
	scanClaim          = testkit.ScanClaim
	dedicatedConn      = pgtest.DedicatedConn
	waitBlockedOnLock  = pgtest.WaitBlockedOnLock
	newCapturingLogger = testkit.NewCapturingLogger
)

type (
	claimOutcome    = testkit.ClaimOutcome
	capturingLogger = testkit.CapturingLogger
	logEntry        = testkit.LogEntry
)

// newPoolOn returns a pool on dsn, closed at the end of the test.
func newPoolOn(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, dsn, maxConns)
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

// ownGoroutine matches stack frames of goroutines that pglease starts.
// The engine (internal/engine) runs the consumers, fetches, batchers and
// watchers; internal/svc the services (session keeper, maintainer,
// listener).
var ownGoroutine = regexp.MustCompile(`watermill-pglease\.\(\*(consumer|subscription|groupMember|sessionKeeper|maintainer|Subscriber|Publisher|batcher\[\.\.\.\]|wakeHub|sharedListener)\)|watermill-pglease/internal/(svc|engine)\.`)

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
