package admin_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// BenchmarkInspector times each read of the Inspector on a group of
// PGLEASE_BENCH_TOPICS topics (default 100,000), each with one offset row
// owned by a live session and a lag of a few messages: what a health check
// or the metrics collector costs when it runs every few seconds.
//
//	go run ./internal/cmd/localpg run -- go test -run '^$' -bench Inspector -benchtime 5x .
func BenchmarkInspector(b *testing.B) {
	topics := benchTopics(b)
	const lagPerTopic = 3
	ctx := context.Background()
	pool, adapter := testkit.BenchSetup(b, "setup")
	msgs := testkit.Table(adapter, pglease.DefaultMessagesTable)
	offsets := testkit.Table(adapter, pglease.DefaultConsumerOffsetsTable)
	sessions := testkit.Table(adapter, pglease.DefaultConsumerSessionsTable)
	// State written with SQL directly: the Inspector reads tables, not
	// Subscribers. One session owns every row; each topic has lagPerTopic
	// messages after the group's position (0, 0).
	for _, q := range []string{
		`INSERT INTO ` + sessions + ` (id, consumer_group, owner, expires_at)
VALUES ('00000000-0000-0000-0000-000000000001', 'g', 'bench/1', now() + interval '1 hour')`,
		fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload)
SELECT 'topic-' || lpad(t::text, 6, '0'), t || '-' || k, '\x00'::bytea
FROM generate_series(1, %d) t, generate_series(1, %d) k`, msgs, topics, lagPerTopic),
		fmt.Sprintf(`INSERT INTO %s (consumer_group, topic, partition, session_id, epoch)
SELECT 'g', 'topic-' || lpad(t::text, 6, '0'), 0, '00000000-0000-0000-0000-000000000001', 1
FROM generate_series(1, %d) t`, offsets, topics),
		`VACUUM ANALYZE ` + msgs,
		`VACUUM ANALYZE ` + offsets,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(b, err)
	}
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(b, err)

	b.Run("Lag", func(b *testing.B) {
		for range b.N {
			lag, err := insp.Lag(ctx, admin.LagFilter{})
			require.NoError(b, err)
			require.Len(b, lag, topics)
			require.Equal(b, int64(lagPerTopic), lag[0].Lag)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(topics), "µs/row")
	})
	b.Run("Sessions", func(b *testing.B) {
		for range b.N {
			s, err := insp.Sessions(ctx)
			require.NoError(b, err)
			require.Equal(b, int64(topics), s[0].RowsHeld)
		}
	})
	b.Run("Horizon", func(b *testing.B) {
		for range b.N {
			_, err := insp.Horizon(ctx)
			require.NoError(b, err)
		}
	})
	b.Run("Topics", func(b *testing.B) {
		for range b.N {
			ts, err := insp.Topics(ctx)
			require.NoError(b, err)
			require.GreaterOrEqual(b, len(ts), topics)
		}
	})
}

// benchTopics is how many topics a benchmark of the Inspector sets up:
// PGLEASE_BENCH_TOPICS, default 100,000.
func benchTopics(b *testing.B) int {
	v := os.Getenv("PGLEASE_BENCH_TOPICS")
	if v == "" {
		return 100_000
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err)
	return n
}
