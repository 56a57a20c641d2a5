package pgsql_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// TestPipelinedStatementsTakeTheirOwnSnapshots checks what a read below a
// new bound in one round trip relies on (singleNode.selectBelowNewBound,
// decision 0008): two statements sent together, as a pipeline or, under
// the simple protocol, as one multi-statement query, run in one implicit
// transaction, and the second still takes its snapshot after the first
// ended. Forced: the first statement waits on an advisory lock while
// another transaction commits a row; the second must see that row.
func TestPipelinedStatementsTakeTheirOwnSnapshots(t *testing.T) {
	pgtest.SkipShort(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testDSN)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 4
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			schema := pgtest.NewSchema(t, pool, "pglease_pipeline_")
			table := pgx.Identifier{schema, "rows"}.Sanitize()
			if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+"; CREATE TABLE "+table+" (id int)"); err != nil {
				t.Fatal(err)
			}
			holder := pgtest.DedicatedConn(t, pool)
			if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(7340033)"); err != nil {
				t.Fatal(err)
			}
			reader := pgtest.DedicatedConn(t, pool)
			var pid uint32
			if err := reader.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			type result struct {
				first, second int
				err           error
			}
			done := make(chan result, 1)
			go func() {
				b := &pgx.Batch{}
				b.Queue("SELECT (SELECT count(*) FROM " + table + ")::int + 0 * (SELECT 1 FROM pg_advisory_xact_lock_shared(7340033))::int")
				b.Queue("SELECT count(*)::int FROM " + table)
				var r result
				br := reader.SendBatch(ctx, b)
				if r.err = br.QueryRow().Scan(&r.first); r.err == nil {
					r.err = br.QueryRow().Scan(&r.second)
				}
				if err := br.Close(); r.err == nil {
					r.err = err
				}
				done <- r
			}()
			finished := make(chan struct{})
			if !pgtest.WaitBlockedOnLock(t, pool, pid, finished) {
				t.Fatal("the first statement did not wait")
			}
			// Committed while the first statement runs: after its snapshot.
			if _, err := pool.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(7340033)"); err != nil {
				t.Fatal(err)
			}
			r := <-done
			close(finished)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.first != 0 || r.second != 1 {
				t.Fatalf("first statement saw %d rows, second %d: want 0 and 1 (a snapshot of its own)", r.first, r.second)
			}
		})
	}
}
