package admin_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// The helpers of this file are those of the root package's tests that
// the Inspector's tests use: a pool and a schema of the test's own, a
// publisher and a subscriber on it, and the statements of the claim
// that the reset races against.

// testDSN is the database every test uses; each test works in a schema of
// its own.
var testDSN string

// poolDSN is where newPool's pools connect: testDSN, unless
// PGLEASE_TEST_POOL_DSN names another way to the same database (`make test`
// runs part of the suite through PgBouncer in transaction mode so).
// Subscribers of newTestSubscriber then LISTEN on testDSN.
var poolDSN string

// benchPoolConns is the pool size of the benchmarks.
const benchPoolConns = 64

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "admin", func(dsn string) {
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

// parallel marks a test that may run beside the other parallel ones (see
// the rule of the root package's parallel helper).
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

type offsetRow struct {
	session *uuid.UUID
	epoch   int64
	offset  int64
}

func readOffset(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group, topic string) offsetRow {
	t.Helper()
	var r offsetRow
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT session_id, epoch, acked_offset FROM "+table(adapter, pglease.DefaultConsumerOffsetsTable)+
			" WHERE consumer_group = $1 AND topic = $2", group, topic).Scan(&r.session, &r.epoch, &r.offset))
	return r
}

func publishN(t *testing.T, pub *pglease.Publisher, topic string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		require.NoError(t, pub.Publish(topic, msg))
		ids = append(ids, msg.UUID)
	}
	return ids
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

func newPublisher(t *testing.T, db pglease.DB, adapter pglease.Tables) *pglease.Publisher {
	t.Helper()
	pub, err := pglease.NewPublisher(db, pglease.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	return pub
}

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

// capturingLogger records every line at Info and above.
type capturingLogger struct {
	mu      *sync.Mutex
	entries *[]logEntry
	fields  watermill.LogFields
}

// logEntry is one line logged through a capturingLogger.
type logEntry struct {
	level  string
	msg    string
	err    error
	fields watermill.LogFields
}

func newCapturingLogger() *capturingLogger {
	return &capturingLogger{mu: &sync.Mutex{}, entries: &[]logEntry{}}
}

func (l *capturingLogger) add(level, msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.entries = append(*l.entries, logEntry{level: level, msg: msg, err: err, fields: l.fields.Add(fields)})
}

func (l *capturingLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.add("error", msg, err, fields)
}

func (l *capturingLogger) Info(msg string, fields watermill.LogFields) {
	l.add("info", msg, nil, fields)
}

func (l *capturingLogger) Debug(string, watermill.LogFields) {}

func (l *capturingLogger) Trace(string, watermill.LogFields) {}

func (l *capturingLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &capturingLogger{mu: l.mu, entries: l.entries, fields: l.fields.Add(fields)}
}

// find returns the first entry for which match holds.
func (l *capturingLogger) find(match func(logEntry) bool) (logEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range *l.entries {
		if match(e) {
			return e, true
		}
	}
	return logEntry{}, false
}

// dedicatedConn returns a connection of pool held for the whole test.
func dedicatedConn(t *testing.T, pool *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	return conn
}

func ackedOffset(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group, topic string) pglease.Position {
	t.Helper()
	var tx string
	var off int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT acked_transaction_id::text, acked_offset FROM `+
		table(adapter, pglease.DefaultConsumerOffsetsTable)+` WHERE consumer_group = $1 AND topic = $2 AND partition = 0`,
		group, topic).Scan(&tx, &off))
	return parsePos(tx, off)
}

// waitBlockedOnLock waits until the backend pid waits for a lock, or fails
// the test; done, when closed first, means the statement finished instead.
func waitBlockedOnLock(t *testing.T, pool *pgxpool.Pool, pid uint32, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			return false
		default:
		}
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT COALESCE(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			return true
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d neither finished nor waited for a lock within 10s", pid)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// claimOutcome is what the adapter's claim statement said of one topic.
type claimOutcome struct {
	claimed  bool
	epoch    *int64
	previous *uuid.UUID
	future   bool
}

// scanClaim reads the rows of a one-topic claim statement.
func scanClaim(rows pgx.Rows) (claimOutcome, error) {
	var o claimOutcome
	for rows.Next() {
		var (
			kind, topic string
			partition   int32
			tx          *string
			offset      *int64
			hasNext     *bool
			owner       *string
		)
		if err := rows.Scan(&kind, &topic, &partition, &o.epoch, &tx, &offset, &hasNext, &o.previous, &owner); err != nil {
			return o, err
		}
		o.claimed = kind == "c"
		o.future = kind == "f"
	}
	return o, rows.Err()
}

func execQuery(t *testing.T, conn *pgxpool.Conn, q pgsql.Stmt) int64 {
	t.Helper()
	tag, err := conn.Exec(context.Background(), q.SQL, q.Args...)
	require.NoError(t, err, q.SQL)
	return tag.RowsAffected()
}

// ensureRow creates the offset row of (group, topic).
func ensureRow(t *testing.T, conn *pgxpool.Conn, adapter pglease.Tables, group, topic string) {
	t.Helper()
	execQuery(t, conn, tablesOf(adapter).EnsureOffsets(pgsql.OffsetsParams{ConsumerGroup: group, Topics: []string{topic}}))
}

// createTables creates the pglease tables in adapter's schema.
func createTables(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) {
	t.Helper()
	_, err := pool.Exec(context.Background(), pglease.SchemaSQL(adapter))
	require.NoError(t, err)
}

// claimQuery is the claim statement for one topic, by a session made on
// the server whose identity is here (serverHere).
func claimQuery(adapter pglease.Tables, group, topic string, session uuid.UUID, here string) pgsql.Stmt {
	return tablesOf(adapter).ClaimOffsets(pgsql.OffsetsParams{ConsumerGroup: group, Topics: []string{topic}, SessionID: session,
		Here: here, Limit: 1})
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

func uuids(msgs []*message.Message) []string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.UUID)
	}
	return ids
}

// benchSetup returns a pool and an adapter on a fresh schema whose tables
// exist, so that no benchmark times DDL.
func benchSetup(b *testing.B, topic string) (*pgxpool.Pool, pglease.Tables) {
	b.Helper()
	pool := newPool(b, benchPoolConns)
	adapter := newSchema(b, pool)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{SchemaAdapter: adapter, InitializeSchema: true}, nil)
	require.NoError(b, err)
	require.NoError(b, sub.SubscribeInitialize(topic))
	require.NoError(b, sub.Close())
	return pool, adapter
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

func table(adapter pglease.Tables, name string) string {
	return pgx.Identifier{adapter.Schema, name}.Sanitize()
}

func parsePos(tx string, off int64) pglease.Position {
	x, err := strconv.ParseUint(tx, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("xid8 %q: %v", tx, err))
	}
	return pglease.Position{TransactionID: x, Offset: off}
}

// directConnConfig is the test database's DSN, direct, for ListenConnConfig.
func directConnConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	pgtest.SkipShort(t)
	cfg, err := pgx.ParseConfig(testDSN)
	require.NoError(t, err)
	return cfg
}
