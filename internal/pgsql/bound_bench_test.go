package pgsql_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// BenchmarkPositionBound measures the reader's bound of decision 0008
// (the statement PositionBounds runs: the sequence, then pg_locks) on a
// server of its own (max_connections 700): alone, and with 500 other
// connections each in an open transaction that read the messages table
// (a fast-path lock each) while 64 goroutines publish batches of 10
// messages to 64 topics, each its own transaction (a registration, its
// locks, a position per row). Each case reads the bound of 1 and of 100
// topics per statement; /read is the bound and the read of one topic's
// partition (SelectMessages, its two statements); /select1 and /xmin are
// a statement that does nothing and the read of the xmin horizon (what
// reads compared with before), under the same load.
//
//	go test -run '^$' -bench PositionBound -benchtime 2000x ./internal/pgsql
func BenchmarkPositionBound(b *testing.B) {
	ctx := context.Background()
	cluster, err := pgrepl.StartSingle(ctx, pgrepl.Options{Settings: map[string]string{"max_connections": "700"}})
	if err != nil {
		b.Skipf("no PostgreSQL server to start: %v", err)
	}
	defer func() { _ = cluster.Close() }()
	dsn := cluster.Primary.DSN()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	tables := pgsql.NewTables(pgsql.Names{Schema: "bound_bench"})
	if _, err := pool.Exec(ctx, `CREATE SCHEMA bound_bench`); err != nil {
		b.Fatal(err)
	}
	if err := pgsql.Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		b.Fatal(err)
	}
	d := pgsql.NewSingleNode(tables)
	topics := make([]string, 100)
	for i := range topics {
		topics[i] = fmt.Sprintf("topic-%d", i)
	}
	parts := make([]int32, len(topics))

	run := func(b *testing.B) {
		// Baselines: a statement that does nothing, and the xmin horizon
		// that reads compared with before schema version 14.
		for name, sql := range map[string]string{"select1": `SELECT 1`,
			"xmin": `SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text`} {
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					var v any
					if err := pool.QueryRow(ctx, sql).Scan(&v); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("topics=%d", n), func(b *testing.B) {
				for b.Loop() {
					if _, err := d.PositionBounds(ctx, pool, topics[:n], parts[:n]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run("read", func(b *testing.B) {
			for b.Loop() {
				if _, err := d.SelectMessages(ctx, pool, pgsql.SelectMessagesParams{Topic: topics[0], Limit: 100,
					After: pgsql.Position{TransactionID: 1 << 60}, Here: ""}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("idle", run)

	// 500 connections in open transactions that read the messages table.
	var holders []*pgx.Conn
	defer func() {
		for _, c := range holders {
			_ = c.Close(ctx)
		}
	}()
	for range 500 {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		holders = append(holders, c)
		if _, err := c.Exec(ctx, `BEGIN; SELECT 1 FROM `+tables.Messages+` LIMIT 1`); err != nil {
			b.Fatal(err)
		}
	}
	pubPool, err := pgxpool.New(ctx, dsn+"&pool_max_conns=64")
	if err != nil {
		b.Fatal(err)
	}
	defer pubPool.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var published sync.Map
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pgsql.InsertMessagesParams{}
			for j := range 10 {
				p.Topics = append(p.Topics, topics[i%len(topics)])
				p.UUIDs = append(p.UUIDs, fmt.Sprintf("%d-%d", i, j))
				p.Payloads = append(p.Payloads, []byte("x"))
				p.Metadata = append(p.Metadata, "")
			}
			n := 0
			for {
				select {
				case <-stop:
					published.Store(i, n)
					return
				default:
				}
				if err := d.InsertMessages(ctx, pubPool, p); err != nil {
					b.Error(err)
					return
				}
				n++
			}
		}()
	}
	start := time.Now()
	b.Run("busy", run)
	close(stop)
	wg.Wait()
	total := 0
	published.Range(func(_, v any) bool { total += v.(int); return true })
	b.Logf("64 publishers: %d statements of 10 messages in %s (%.0f messages/s) while the busy cases ran",
		total, time.Since(start).Round(time.Millisecond), float64(total*10)/time.Since(start).Seconds())
}
