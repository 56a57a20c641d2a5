package wmsqlimport_test

import (
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// The helpers of this file are those of the root package's tests that
// the import's tests use: a pool and a schema of the test's own, and a
// subscriber on it.

// testDSN is the database every test uses; each test works in a schema of
// its own.
var testDSN string

// poolDSN is where newPool's pools connect: testDSN, unless
// PGLEASE_TEST_POOL_DSN names another way to the same database (`make test`
// runs part of the suite through PgBouncer in transaction mode so).
// Subscribers of newTestSubscriber then LISTEN on testDSN.
var poolDSN string

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "wmsqlimport", func(dsn string) {
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

// newSchema returns an adapter on a fresh PostgreSQL schema of its own,
// dropped at the end of the test. The schema itself is created by schema
// initialization.
func newSchema(t testing.TB, pool *pgxpool.Pool) pglease.Tables {
	t.Helper()
	return pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_test_")}
}

// testLogger logs to the test's output when PGLEASE_TEST_LOG is set.
func testLogger() watermill.LoggerAdapter {
	if os.Getenv("PGLEASE_TEST_LOG") != "" {
		return watermill.NewStdLogger(true, os.Getenv("PGLEASE_TEST_LOG") == "trace")
	}
	return nil
}

// directConnConfig is the test database's DSN, direct, for ListenConnConfig.
func directConnConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	pgtest.SkipShort(t)
	cfg, err := pgx.ParseConfig(testDSN)
	require.NoError(t, err)
	return cfg
}

func newTestSubscriber(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, cfg pglease.SubscriberConfig) *pglease.Subscriber {
	t.Helper()
	cfg.SchemaAdapter = adapter
	cfg.InitializeSchema = true
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 2 * time.Second
	}
	if poolDSN != testDSN && cfg.ListenConnConfig == nil && !cfg.PollOnly {
		cfg.ListenConnConfig = directConnConfig(t)
	}
	sub, err := pglease.NewSubscriber(pool, cfg, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return sub
}

func receiveOne(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
		return nil
	}
}

// receive reads n messages, acking each, or fails the test after timeout.
func receive(t *testing.T, msgs <-chan *message.Message, n int, timeout time.Duration) []*message.Message {
	t.Helper()
	var got []*message.Message
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case msg, ok := <-msgs:
			require.True(t, ok, "messages channel closed after %d of %d messages", len(got), n)
			got = append(got, msg)
			msg.Ack()
		case <-deadline:
			t.Fatalf("received %d of %d messages within %s", len(got), n, timeout)
		}
	}
	return got
}

func uuids(msgs []*message.Message) []string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.UUID)
	}
	return ids
}
