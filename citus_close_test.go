package pglease_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestCitusCloseReleasesEveryTopic: Close of a Subscriber of many topics
// (PGLEASE_CLOSE_TOPICS, 1,000 by default) on Citus, with the default
// CloseTimeout, releases every row it owns: Close returns no error, no
// row names its session any more, the positions acknowledged and not yet
// committed (CommitInterval of an hour) are written by the release, and a
// second Subscriber of the group takes every topic over, though the first
// one's SessionTTL is an hour: nothing waits for its session to expire.
func TestCitusCloseReleasesEveryTopic(t *testing.T) {
	n := 1000
	if v := os.Getenv("PGLEASE_CLOSE_TOPICS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	pool, adapter := citusSchema(t, 16)
	r := closeManyTopics(t, pool, adapter, n)
	require.NoError(t, r.err, "Close of a Subscriber of %d topics", n)
	t.Logf("Close of a Subscriber of %d topics on Citus: %s (%d rows acknowledged)", n, r.took.Round(time.Millisecond), len(r.acked))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)

	// Every row released: no owner, the acknowledged positions written.
	var owned int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+offsets+`
		WHERE consumer_group = 'close' AND session_id IS NOT NULL`).Scan(&owned))
	require.Zero(t, owned, "rows still owned after Close")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+offsets+`
		WHERE consumer_group = 'close'`).Scan(&rows))
	require.Equal(t, n, rows)
	for topic, want := range r.acked {
		got := ackedOffset(t, pool, adapter, "close", topic)
		require.Equal(t, want, got, "topic %s: the position acknowledged before Close", topic)
	}
	var sessions int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+table(adapter, pglease.DefaultConsumerSessionsTable)+`
		WHERE id = $1`, r.session).Scan(&sessions))
	require.Zero(t, sessions, "the session row is left")
	assertNoEngineGoroutines(t)

	// A second member takes every topic, long before the first one's
	// session would have expired.
	second, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "close", Tables: adapter,
		SessionTTL: time.Hour}, testLogger())
	require.NoError(t, err)
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, topic := range numberedTopics("close", 0, n) {
		_, err := second.Subscribe(subCtx, topic)
		require.NoError(t, err)
	}
	waitFor(t, 3*time.Minute, "the second Subscriber to own every topic", func() bool {
		var mine int
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+offsets+` o
			JOIN `+table(adapter, pglease.DefaultConsumerSessionsTable)+` s ON s.id = o.session_id
			WHERE o.consumer_group = 'close' AND s.id <> $1`, r.session).Scan(&mine))
		return mine == n
	})
	require.NotEmpty(t, engineGoroutines(), "the engine's goroutines not recognised while a Subscriber runs")
	require.NoError(t, second.Close())
	stop()
	assertNoEngineGoroutines(t)
}

// engineGoroutine matches the stack frames of the engine's goroutines
// (consumers, the batcher's workers, the loops), which ownGoroutine
// (assertNoLeakedGoroutines) names by the root package's types.
var engineGoroutine = regexp.MustCompile(`watermill-pglease/internal/(engine|svc)\.`)

// engineGoroutines returns the stacks of the engine's goroutines.
func engineGoroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if engineGoroutine.MatchString(g) {
			out = append(out, g)
		}
	}
	return out
}

// assertNoEngineGoroutines waits until no goroutine of the engine is
// left, then asserts assertNoLeakedGoroutines.
func assertNoEngineGoroutines(t testing.TB) {
	t.Helper()
	leaked := engineGoroutines()
	for deadline := time.Now().Add(5 * time.Second); len(leaked) > 0 && time.Now().Before(deadline); leaked = engineGoroutines() {
		time.Sleep(10 * time.Millisecond)
	}
	require.Empty(t, leaked, "goroutines of the engine still running after Close")
	assertNoLeakedGoroutines(t)
}

// closeResult is what closeManyTopics saw.
type closeResult struct {
	took    time.Duration
	err     error // Close's
	session uuid.UUID
	// acked is the position each topic's message was acknowledged at,
	// for the topics that had one.
	acked map[string]pglease.Position
}

// closeManyTopics starts a Subscriber of n topics of adapter (group "close",
// SessionTTL and CommitInterval of an hour, the default CloseTimeout),
// publishes a message to every tenth topic, acknowledges each, waits
// until every topic is claimed, and closes the Subscriber. It returns
// how long Close took and its error.
func closeManyTopics(t testing.TB, pool *pgxpool.Pool, adapter pglease.Tables, n int) closeResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	topics := numberedTopics("close", 0, n)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	want := map[string]string{} // topic: UUID
	for i := 0; i < n; i += 10 {
		msg := message.NewMessage(uuid.NewString(), []byte("x"))
		require.NoError(t, pub.Publish(topics[i], msg))
		want[topics[i]] = msg.UUID
	}

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "close", Tables: adapter,
		SessionTTL: time.Hour, CommitInterval: time.Hour, CommitBatch: 1 << 20}, nil)
	require.NoError(t, err)
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		mu    sync.Mutex
		acked = map[string]pglease.Position{}
		wg    sync.WaitGroup
	)
	for _, topic := range topics {
		msgs, err := sub.Subscribe(subCtx, topic)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for msg := range msgs {
				pos, ok := pglease.MessagePositionFromCtx(msg.Context())
				if ok && msg.UUID == want[topic] {
					mu.Lock()
					acked[topic] = pos
					mu.Unlock()
				}
				msg.Ack()
			}
		}()
	}
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	var session uuid.UUID
	waitFor(t, 5*time.Minute, "every topic claimed and every message acknowledged", func() bool {
		var claimed, sessions int
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*), pg_catalog.count(DISTINCT session_id),
				COALESCE(pg_catalog.min(session_id::text), '00000000-0000-0000-0000-000000000000')::uuid
			FROM `+offsets+` WHERE consumer_group = 'close' AND session_id IS NOT NULL`).Scan(&claimed, &sessions, &session))
		mu.Lock()
		done := len(acked) == len(want)
		mu.Unlock()
		return claimed == n && sessions == 1 && done
	})
	began := time.Now()
	err = sub.Close()
	took := time.Since(began)
	stop()
	wg.Wait()
	return closeResult{took: took, err: err, session: session, acked: acked}
}

// BenchmarkCitusClose measures Close of a Subscriber of 100 and of 1,000
// topics on the Citus cluster of `make test-citus` (see benchClose), as
// the metrics close-ms-100 and close-ms-1000:
//
//	go run ./internal/cmd/localcitus -- go test -run '^$' -bench CitusClose -benchtime 3x .
func BenchmarkCitusClose(b *testing.B) {
	benchClose(b, func() (*pgxpool.Pool, pglease.Tables) { return citusSchema(b, 16) })
}

// BenchmarkCloseManyTopics is BenchmarkCitusClose on a single server:
//
//	.tmp/bin/localpg run -- go test -run '^$' -bench CloseManyTopics -benchtime 3x .
func BenchmarkCloseManyTopics(b *testing.B) {
	benchClose(b, func() (*pgxpool.Pool, pglease.Tables) {
		pool := newPool(b, 16)
		adapter := newSchema(b, pool)
		_, err := pool.Exec(context.Background(), pglease.SchemaSQL(adapter))
		require.NoError(b, err)
		return pool, adapter
	})
}

// benchClose measures Close of a Subscriber of 100 and of 1,000 topics
// (closeManyTopics: each topic claimed, one in ten with a message
// acknowledged and not committed, so that the release writes its
// position), each size in a schema of its own that open returns, and
// reports the median of each size as close-ms-100 and close-ms-1000.
func benchClose(b *testing.B, open func() (*pgxpool.Pool, pglease.Tables)) {
	sizes := []int{100, 1000}
	took := map[int][]time.Duration{}
	for range b.N {
		for _, n := range sizes {
			pool, adapter := open()
			r := closeManyTopics(b, pool, adapter, n)
			took[n] = append(took[n], r.took)
			b.Logf("Close of %d topics: %s, error: %v", n, r.took.Round(time.Millisecond), firstLineOf(r.err))
		}
	}
	for _, n := range sizes {
		var ms []float64
		for _, d := range took[n] {
			ms = append(ms, float64(d.Microseconds())/1000)
		}
		b.ReportMetric(median(ms), fmt.Sprintf("close-ms-%d", n))
	}
}

// firstLineOf returns the first line of err's message, or nil.
func firstLineOf(err error) any {
	if err == nil {
		return nil
	}
	line, _, _ := strings.Cut(err.Error(), "\n")
	return line
}
