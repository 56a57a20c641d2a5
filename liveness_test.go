package pglease_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestIdleTopicsCostNoWrites holds 10, 1,000 and 10,000 idle topics with one
// Subscriber over a window that catches every timer of an idle Subscriber:
// the heartbeat (every SessionTTL/3), the clean-up of expired sessions
// (every 10th heartbeat) and the idle poll (every PollInterval, default).
// Holding a claim must write nothing: no claim row changes (their xmin stays
// the same), and the session row is written once per heartbeat interval,
// whatever the number of topics. It reports the writes per second, measured
// from the rows' xmin and, where pg_stat_statements is available, every
// statement the library ran on its tables and the server time they took.
//
// It also reports the Go heap (and stacks) per subscribed idle topic after
// GC. PGLEASE_TEST_TOPICS replaces the sizes (e.g. 100000; the 100,000-topic
// figures in the docs are from that run without -race, where the heap per
// topic is asserted to be at most 8 KiB).
func TestIdleTopicsCostNoWrites(t *testing.T) {
	sizes := []int{10, 1000, 10000}
	if raceDetector {
		// 26 s of make test's race pass for what its run of 100,000
		// topics without -race (scripts/check.sh, step idle) shows; the
		// race detector's check of the many-topic paths is the 1,000's,
		// and the releases in batches are TestCloseReleasesTopicsInBatches'.
		sizes = []int{10, 1000}
	}
	if v := os.Getenv("PGLEASE_TEST_TOPICS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "PGLEASE_TEST_TOPICS")
		sizes = []int{n}
	}
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) { measureIdleTopics(t, n) })
	}
}

// maxHeapPerTopic bounds the Go memory an idle subscribed topic may take,
// measured without the race detector (which adds its own per goroutine).
const maxHeapPerTopic = 8 << 10

// heapAfterGC returns the Go heap and goroutine stacks in use after GC.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

func measureIdleTopics(t *testing.T, topics int) {
	const (
		ttl       = 3 * time.Second
		heartbeat = ttl / 3
		// 11 heartbeats: the clean-up runs on every 10th, and the idle
		// poll every second.
		window = 11 * heartbeat
	)
	pool := newPool(t, 20)
	adapter := newSchema(t, pool)
	ctx := context.Background()
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	// The Subscriber runs as a role of its own, by which its statements
	// are told from the test's and other tests' in pg_stat_statements
	// (PostgreSQL 18 counts a statement on same-named tables of other
	// schemas as one: their schema cannot tell them apart).
	role := newRole(t, pool, "pglease_idle")
	execAll(t, pool, pglease.GrantSQL(adapter, role))
	stats := newStatements(t, pool, adapter, role)

	sub, err := pglease.NewSubscriber(poolAsOn(t, role, "public", 20), pglease.SubscriberConfig{
		ConsumerGroup: "g",
		SessionTTL:    ttl,
		Tables:        adapter,
		// Close releases every topic, in batches of 1,000: with 100,000
		// topics on a loaded 2-core machine that can take longer than the
		// default 5 s (the time is reported below).
		CloseTimeout: time.Minute,
	}, testLogger())
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = sub.Close()
		}
	})
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	claimedByCurrentSession := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+offsets+" o JOIN "+sessions+
			" s ON s.id = o.session_id WHERE s.expires_at > now()").Scan(&n))
		return n
	}
	require.NoError(t, sub.SubscribeInitialize("warm-up"))
	heapBefore := heapAfterGC()
	began := time.Now()
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := 0; i < topics; i++ {
		_, err := sub.Subscribe(subCtx, fmt.Sprintf("idle-%05d", i))
		require.NoError(t, err)
	}
	waitFor(t, 3*time.Minute, fmt.Sprintf("%d topics to be claimed", topics), func() bool {
		return claimedByCurrentSession() == topics
	})
	claimed := time.Since(began)
	perTopic := float64(int64(heapAfterGC())-int64(heapBefore)) / float64(topics)
	if !raceDetector && topics >= 1000 {
		assert.LessOrEqual(t, perTopic, float64(maxHeapPerTopic), "Go memory per idle subscribed topic")
	}

	claimXmins := func() map[string]string {
		rows, err := pool.Query(ctx, testQuery+"SELECT topic, xmin::text || '/' || session_id::text FROM "+offsets)
		require.NoError(t, err)
		m := map[string]string{}
		for rows.Next() {
			var topic, v string
			require.NoError(t, rows.Scan(&topic, &v))
			m[topic] = v
		}
		require.NoError(t, rows.Err())
		return m
	}
	sessionXmin := func() (uuid.UUID, string) {
		var (
			id   uuid.UUID
			xmin string
		)
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT id, xmin::text FROM "+sessions).Scan(&id, &xmin))
		return id, xmin
	}

	claimsBefore := claimXmins()
	require.Len(t, claimsBefore, topics)
	sessionID, xmin := sessionXmin()
	// Start the window once the start-up is over: two idle polls have run
	// since every topic was claimed (the member's last claims, reads of the
	// group and the first reads of the topics come before).
	if stats != nil {
		polls := stats.idlePolls(t)
		waitFor(t, 30*time.Second, "two idle polls", func() bool { return stats.idlePolls(t) >= polls+2 })
	}
	statsBefore := stats.snapshot(t)
	start := time.Now()
	sessionWrites := 0
	for time.Since(start) < window {
		time.Sleep(10 * time.Millisecond)
		id, x := sessionXmin()
		require.Equal(t, sessionID, id, "the session was replaced during the window")
		if x != xmin {
			sessionWrites++
			xmin = x
		}
	}
	elapsed := time.Since(start)
	statsAfter := stats.snapshot(t)
	claimsAfter := claimXmins()

	changed := 0
	for topic, v := range claimsBefore {
		if claimsAfter[topic] != v {
			changed++
		}
	}
	assert.Zero(t, changed, "claim rows written while idle")
	maxBeats := int(window/heartbeat) + 1
	assert.LessOrEqual(t, sessionWrites, maxBeats, "the session row is written at most once per heartbeat interval")
	assert.GreaterOrEqual(t, sessionWrites, 1, "no heartbeat seen: the measurement is broken")
	perSecond := float64(sessionWrites+changed) / elapsed.Seconds()

	report := fmt.Sprintf("%d idle topics: claimed in %s, %.0f bytes of Go heap and stack per topic; over %s (11 heartbeat intervals of %s): "+
		"%d session row writes, %d claim row writes (xmin) = %.2f writes/s",
		topics, claimed.Round(time.Millisecond), perTopic, elapsed.Round(time.Millisecond), heartbeat,
		sessionWrites, changed, perSecond)
	if statsBefore != nil {
		d := statsAfter.minus(statsBefore)
		assert.Zero(t, d.offsetRows, "statements wrote claim rows while idle")
		assert.LessOrEqual(t, d.sessionRows, int64(maxBeats), "statements wrote the session row more than once per interval")
		// A heartbeat and an idle poll per second; the maintainer's
		// housekeeping and retention look every 30 s.
		rate := float64(d.calls) / elapsed.Seconds()
		assert.LessOrEqual(t, rate, 2.5, "idle statements per second grow beyond the timers' (%d in %s)", d.calls, elapsed)
		report += fmt.Sprintf("; pg_stat_statements: %d rows written to the sessions table, %d to the offsets table, "+
			"%d statements on the pglease tables (%.2f/s) taking %.2f ms of server time per second",
			d.sessionRows, d.offsetRows, d.calls, rate, d.execMs/elapsed.Seconds())
	}
	t.Log(report)

	closeStart := time.Now()
	require.NoError(t, sub.Close())
	closed = true
	// Every topic is free after Close: released, or its owner session is
	// deleted (a release that could not run in CloseTimeout leaves that).
	var owned, notReleased int
	require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FILTER (WHERE s.id IS NOT NULL), count(o.session_id) FROM "+
		offsets+" o LEFT JOIN "+sessions+" s ON s.id = o.session_id").Scan(&owned, &notReleased))
	assert.Zero(t, owned, "topics still owned after Close")
	assert.Zero(t, notReleased, "topics left for the deletion of the session instead of released (releases are batched)")
	t.Logf("%d idle topics: Close took %s; %d topics released, %d freed by the deletion of the session",
		topics, time.Since(closeStart).Round(time.Millisecond), topics-notReleased, notReleased)
	assertNoLeakedGoroutines(t)
}

// testQuery marks the test's own queries, which statements leaves out: a
// common table expression named for it, which pg_stat_statements keeps in
// the text it records (PostgreSQL 18 drops a leading comment) and which
// holds no constant to normalize.
const testQuery = "WITH pglease_test AS (SELECT) "

// statements reads pg_stat_statements for the library's statements on one
// test schema's tables, run by one role; it is nil-safe when the extension
// is not available.
type statements struct {
	pool     *pgxpool.Pool
	schema   string
	role     string
	sessions string // quoted table names as they appear in the statements
	offsets  string
}

type statementTotals struct {
	calls       int64
	execMs      float64 // total execution time on the server
	sessionRows int64   // rows written to the sessions table
	offsetRows  int64   // rows written to the offsets table
}

func (a *statementTotals) minus(b *statementTotals) statementTotals {
	return statementTotals{calls: a.calls - b.calls, execMs: a.execMs - b.execMs,
		sessionRows: a.sessionRows - b.sessionRows, offsetRows: a.offsetRows - b.offsetRows}
}

func newStatements(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, role string) *statements {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		t.Logf("pg_stat_statements not available (%v): writes are measured from xmin only", err)
		return nil
	}
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT count(*) >= 0 FROM pg_stat_statements").Scan(&ok); err != nil {
		t.Logf("pg_stat_statements not loaded (%v): writes are measured from xmin only", err)
		return nil
	}
	return &statements{
		pool:     pool,
		schema:   adapter.Schema,
		role:     role,
		sessions: table(adapter, pglease.DefaultConsumerSessionsTable),
		offsets:  table(adapter, pglease.DefaultConsumerOffsetsTable),
	}
}

// idlePolls returns how many idle polls (VisibleTopics) ran on the schema.
func (s *statements) idlePolls(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, s.pool.QueryRow(context.Background(), testQuery+`SELECT COALESCE(sum(calls), 0)::bigint
FROM pg_stat_statements WHERE query LIKE 'SELECT t.n%' AND query LIKE '%' || $1 || '%'
	AND userid = (SELECT oid FROM pg_roles WHERE rolname = $2)`, s.schema, s.role).Scan(&n))
	return n
}

// snapshot sums calls of every statement that names the schema, and the
// rows of the writing ones per table: a statement writes the table it
// starts with (UPDATE t, INSERT INTO t, DELETE FROM t) or, for the session
// insert behind a CTE, the sessions table.
func (s *statements) snapshot(t *testing.T) *statementTotals {
	t.Helper()
	if s == nil {
		return nil
	}
	rows, err := s.pool.Query(context.Background(),
		testQuery+`SELECT query, calls, rows, total_exec_time FROM pg_stat_statements WHERE query LIKE '%' || $1 || '%'
	AND userid = (SELECT oid FROM pg_roles WHERE rolname = $2)`, s.schema, s.role)
	require.NoError(t, err)
	defer rows.Close()
	var tot statementTotals
	for rows.Next() {
		var (
			q           string
			calls, nrow int64
			ms          float64
		)
		require.NoError(t, rows.Scan(&q, &calls, &nrow, &ms))
		q = strings.TrimSpace(q)
		if strings.HasPrefix(q, testQuery) {
			continue
		}
		tot.calls += calls
		tot.execMs += ms
		for _, w := range []string{"UPDATE ", "INSERT INTO ", "DELETE FROM "} {
			switch {
			case strings.HasPrefix(q, w+s.sessions):
				tot.sessionRows += nrow
			case strings.HasPrefix(q, w+s.offsets):
				tot.offsetRows += nrow
			}
		}
		if strings.HasPrefix(q, "WITH") && strings.Contains(q, "INSERT INTO "+s.sessions) {
			tot.sessionRows += nrow
		}
	}
	require.NoError(t, rows.Err())
	return &tot
}

// TestHeartbeatSurvivesSubscribeBurst subscribes one Subscriber to 5,000
// topics at once on a pool of 2 connections. The claims queue up for the
// pool's connections; the heartbeat, on its own connection, must still get
// through, or the session self-fences, every claim is dropped and made again
// by a new session (one more burst), and a large Subscriber may never settle.
func TestHeartbeatSurvivesSubscribeBurst(t *testing.T) {
	const topics = 5000
	pool := newPool(t, 2)
	adapter := newSchema(t, pool)
	instrument(t, pool, adapter)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{
		ConsumerGroup: "g",
		SessionTTL:    2 * time.Second,
		PollInterval:  30 * time.Second,
	})
	ctx := context.Background()
	began := time.Now()
	for i := 0; i < topics; i++ {
		_, err := sub.Subscribe(ctx, fmt.Sprintf("burst-%05d", i))
		require.NoError(t, err)
	}
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	var created, claimed int
	// Done when every topic is claimed by the live session, or as soon as
	// a second session was opened (the first was lost).
	waitFor(t, 3*time.Minute, "every topic to be claimed by the live session", func() bool {
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+table(adapter, sessionsLogTable)+
			" WHERE op = 'INSERT'").Scan(&created))
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+offsets+" o JOIN "+sessions+
			" s ON s.id = o.session_id WHERE s.expires_at > now()").Scan(&claimed))
		return claimed == topics || created > 1
	})
	var maxEpoch int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(epoch) FROM "+offsets).Scan(&maxEpoch))
	t.Logf("%d of %d topics claimed after %s on a pool of 2 connections; %d sessions opened; highest epoch %d",
		claimed, topics, time.Since(began).Round(time.Millisecond), created, maxEpoch)
	assert.Equal(t, 1, created, "the session was lost while the claims were under way")
}
