package pgsql

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// insertSelectReturningStmt is the routed statement before the routed
// insert became an INSERT ... VALUES per topic: the coordinator's
// statement (an INSERT ... SELECT from the unnested arrays, which Citus
// plans on the worker as on the coordinator: the SELECT pulled, its rows
// copied to the shards) returning the notifications' payloads. Kept here
// to be measured against.
func (r Routed) insertSelectReturningStmt(p InsertMessagesParams) Stmt {
	p.NotifyChannel = ""
	s := r.d.insertMessagesStmt(p)
	s.SQL = `WITH inserted AS (
` + s.SQL + `
RETURNING topic, partition
)
SELECT DISTINCT ` + messagesPayload("t.partition", "t.topic") + ` FROM inserted t`
	return s
}

// BenchmarkCitusRoutedInsertCPU measures what a routed insert costs the
// worker it is sent to: the CPU time (user and system, from /proc) of
// the worker's backend that runs it, per call, each call its own
// transaction on one connection, for two shapes, in alternating rounds:
//
//   - insert_select: the former routed statement
//     (insertSelectReturningStmt), one statement;
//   - values: [Routed.InsertKeyed] without keys: the topics' placements,
//     then an INSERT ... VALUES per topic in one batch;
//   - copy: the placements, then one COPY of all the rows into the
//     distributed table (not used: cheaper per row than values, dearer
//     per call, and far dearer for rows of several shards);
//   - placements_only and inserts_only: the two parts of values.
//
// Calls of 1, 10 and 100 messages of one topic, and of 10 messages of
// each of 8 topics (all on the worker). It reports worker-µs/call and
// the wall time per call (ms/call). The workers must run on this machine
// (localcitus), else it is skipped, saying so; PGLEASE_BENCH_SHAPES (a
// comma-separated list) picks shapes:
//
//	PGLEASE_PG_BINDIR= go run ./internal/cmd/localcitus -workers 1 -- go test -run '^$' -bench CitusRoutedInsertCPU -benchtime 1x ./internal/pgsql
//
// b.N is ignored.
func BenchmarkCitusRoutedInsertCPU(b *testing.B) {
	pool, tables := citusTables(b)
	ctx := context.Background()
	r := Routed{d: NewCitus(tables).(citus)}
	topics := make([]string, 8)
	for i := range topics {
		topics[i] = "bench-" + strconv.Itoa(i)
	}
	shards, err := r.TopicShards(ctx, pool, topics)
	if err != nil {
		b.Fatal(err)
	}
	ps, err := r.Placements(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	at := map[int64]ShardPlacement{}
	for _, p := range ps {
		at[p.ShardID] = p
	}
	// The first topic's worker, and the topics it holds.
	w := at[shards[0]]
	var local []string
	for i, t := range topics {
		if at[shards[i]].GroupID == w.GroupID {
			local = append(local, t)
		}
	}
	cfg := pool.Config().ConnConfig.Copy()
	cfg.Host, cfg.Port, cfg.Fallbacks = w.Host, uint16(w.Port), nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	if _, err := backendTicks(stat); err != nil {
		b.Skipf("the worker's backend is not a process of this machine (%v): run the benchmark under localcitus", err)
	}
	b.Logf("worker %s, topics %v", net.JoinHostPort(w.Host, strconv.Itoa(w.Port)), local)
	const ticksPerSecond = 100.0 // USER_HZ on Linux
	shapes := map[string]func(p InsertMessagesParams) error{
		"insert_select": func(p InsertMessagesParams) error {
			s := r.insertSelectReturningStmt(p)
			rows, err := conn.Query(ctx, s.SQL, s.Args...)
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		},
		"values": func(p InsertMessagesParams) error {
			_, _, err := r.InsertKeyed(ctx, conn, p)
			return err
		},
		"copy": func(p InsertMessagesParams) error {
			topics, rowsOf := messagesByTopic(p.Topics)
			pls, err := r.placements(ctx, conn, topics)
			if err != nil {
				return err
			}
			var src [][]any
			for k, t := range topics {
				for _, i := range rowsOf[k] {
					var meta any
					if p.Metadata[i] != "" {
						meta = p.Metadata[i]
					}
					src = append(src, []any{t, routedPartition(p, i, pls[k]), p.UUIDs[i], p.Payloads[i], meta, pls[k].class, pls[k].expires})
				}
			}
			_, err = conn.CopyFrom(ctx, pgx.Identifier{tables.Schema, DefaultMessagesTable},
				[]string{"topic", "partition", "uuid", "payload", "metadata", "retention_class", "expires_at"}, pgx.CopyFromRows(src))
			return err
		},
		"placements_only": func(p InsertMessagesParams) error {
			topics, _ := messagesByTopic(p.Topics)
			_, err := r.placements(ctx, conn, topics)
			return err
		},
		"inserts_only": func(p InsertMessagesParams) error {
			topics, rowsOf := messagesByTopic(p.Topics)
			pl := routedPlacement{partitions: 1, expires: pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}}
			bt := &pgx.Batch{}
			for k, t := range topics {
				s, _ := r.insertValuesStmt(p, t, rowsOf[k], pl)
				bt.Queue(s.SQL, s.Args...)
			}
			return conn.SendBatch(ctx, bt).Close()
		},
	}
	names := []string{"insert_select", "values", "copy", "placements_only", "inserts_only"}
	if os.Getenv("PGLEASE_BENCH_SHAPES") != "" {
		names = strings.Split(os.Getenv("PGLEASE_BENCH_SHAPES"), ",")
	}
	for _, c := range []struct{ topics, rows int }{{1, 1}, {1, 10}, {1, 100}, {len(local), 10}} {
		b.Run(fmt.Sprintf("%d_topics_%d_rows", c.topics, c.rows), func(b *testing.B) {
			p := InsertMessagesParams{}
			for k := range c.topics {
				for i := range c.rows {
					p.Topics = append(p.Topics, local[k])
					p.UUIDs = append(p.UUIDs, "u"+strconv.Itoa(i))
					p.Payloads = append(p.Payloads, []byte("payload"))
					p.Metadata = append(p.Metadata, "")
				}
			}
			calls := max(100, 1000/(c.topics*c.rows))
			spent := map[string][]float64{}
			wall := map[string][]float64{}
			for round := range 3 {
				for _, name := range names {
					run := shapes[name]
					for range 20 { // warm up: the plans cached, the functions compiled
						if err := run(p); err != nil {
							b.Fatal(err)
						}
					}
					before, err := backendTicks(stat)
					if err != nil {
						b.Fatal(err)
					}
					began := time.Now()
					for range calls {
						if err := run(p); err != nil {
							b.Fatal(err)
						}
					}
					elapsed := time.Since(began)
					after, err := backendTicks(stat)
					if err != nil {
						b.Fatal(err)
					}
					us := float64(after-before) / ticksPerSecond * 1e6 / float64(calls)
					ms := float64(elapsed.Microseconds()) / 1e3 / float64(calls)
					spent[name] = append(spent[name], us)
					wall[name] = append(wall[name], ms)
					b.Logf("round %d %s: %.0f µs of worker CPU, %.2f ms, per call of %d topic(s) × %d", round+1, name, us, ms, c.topics, c.rows)
				}
				if _, err := pool.Exec(ctx, `TRUNCATE `+tables.Messages); err != nil {
					b.Fatal(err)
				}
			}
			for _, name := range names {
				b.ReportMetric(median(spent[name]), name+"-worker-µs/call")
				b.ReportMetric(median(wall[name]), name+"-ms/call")
			}
		})
	}
}
