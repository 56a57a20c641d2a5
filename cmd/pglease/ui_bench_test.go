package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// BenchmarkUIOverview times the console's overview on PGLEASE_BENCH_ROWS
// (group, topic, partition) rows (default 100,000: one group, one live
// session owning every row, 3 messages of lag on each): Page is the
// page as served (the groups' lag from the sampler's latest read, the
// sessions and the horizon read for the page, rendered); Sample is the
// sampler's read of every row's lag, which runs in the background once
// per --sample-every (at least 5 times its own duration apart); Cold is
// the page before any sample, which reads the lag itself.
//
//	go run ./internal/cmd/localpg run -- go test -run '^$' -bench UIOverview -benchtime 5x ./cmd/pglease
func BenchmarkUIOverview(b *testing.B) {
	rows := 100_000
	if v := os.Getenv("PGLEASE_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		rows = n
	}
	const lagPerRow = 3
	f := newFixture(b)
	table := func(name string) string { return pgx.Identifier{f.schema, name}.Sanitize() }
	for _, q := range []string{
		`INSERT INTO ` + table(pglease.DefaultConsumerSessionsTable) + ` (id, consumer_group, owner, expires_at)
VALUES ('00000000-0000-0000-0000-000000000001', 'g', 'bench/1', now() + interval '1 hour')`,
		fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload)
SELECT 'topic-' || lpad(t::text, 6, '0'), t || '-' || k, '\x00'::bytea
FROM generate_series(1, %d) t, generate_series(1, %d) k`, table(pglease.DefaultMessagesTable), rows, lagPerRow),
		fmt.Sprintf(`INSERT INTO %s (consumer_group, topic, partition, session_id, epoch)
SELECT 'g', 'topic-' || lpad(t::text, 6, '0'), 0, '00000000-0000-0000-0000-000000000001', 1
FROM generate_series(1, %d) t`, table(pglease.DefaultConsumerOffsetsTable), rows),
		`VACUUM ANALYZE ` + table(pglease.DefaultMessagesTable),
		`VACUUM ANALYZE ` + table(pglease.DefaultConsumerOffsetsTable),
	} {
		_, err := f.pool.Exec(b.Context(), q)
		require.NoError(b, err)
	}
	insp, err := admin.NewInspector(f.pool, f.tables)
	require.NoError(b, err)
	srv, err := newUIServer(uiConfig{insp: insp, pool: f.pool, tables: f.tables, warnAfter: defaultWarnAfter, log: os.Stderr})
	require.NoError(b, err)
	want := fmt.Sprintf(`<td class="n">%d</td>`, rows)
	page := func(b *testing.B) {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		require.Equal(b, http.StatusOK, rec.Code, rec.Body.String())
		require.True(b, strings.Contains(rec.Body.String(), want), "the group's %d rows", rows)
		require.True(b, strings.Contains(rec.Body.String(), fmt.Sprintf(`class="n lag">%d<`, rows*lagPerRow)), "the group's lag")
	}
	b.Run("Cold", func(b *testing.B) {
		for range b.N {
			page(b)
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/page")
	})
	b.Run("Sample", func(b *testing.B) {
		for range b.N {
			require.NoError(b, srv.sampler.sample(b.Context()))
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/sample")
	})
	b.Run("Page", func(b *testing.B) {
		for range b.N {
			page(b)
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/page")
	})
}
