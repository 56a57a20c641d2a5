package pgsql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// BenchmarkKeyedInsertShapes measures where the time of a keyed publish
// goes, statement by statement, on one connection at a time, batches of
// 100 messages of one topic with new keys (each message's UUID), in
// alternating rounds so that every shape meets the same state of the
// server; it reports each shape's msgs/s and its rate as a percentage of
// the insert without keys (plain). The shapes:
//
//   - plain: the insert without keys (InsertMessages);
//   - heap: plain, and one row per key in a table without an index (what
//     writing a key costs when nothing can find it);
//   - unique: plain, and one row per key in a table whose one column, the
//     key, has a unique index (the least any design can write to find a
//     key again and to make a racing publisher wait);
//   - unique_on_conflict: the same with ON CONFLICT DO NOTHING;
//   - keyed_strict: the keyed insert a pool runs (two day slots per key,
//     no ON CONFLICT; strictFirst);
//   - keyed: the keyed insert a pgx.Tx runs (ON CONFLICT DO NOTHING);
//   - one_slot_strict: keyed_strict writing one day slot per key, not two
//     (a bound for a design with a fence between days; not correct as it
//     is: see decision 0009);
//   - v15_strict: keyed_strict as schema versions 15 to 20 wrote the keys
//     (two day slots, no key class read from the topics and retention
//     rows): what the retention window (schema version 21) costs;
//   - lean_strict: keyed_strict's two slots in a statement for one topic
//     whose keys are distinct within the call (no first message per key,
//     no keys returned and joined back): a bound for what a leaner
//     statement would win.
//
// Sub-benchmarks: random keys (version 4 UUIDs) and time-ordered ones
// (version 7). With fsync on, as `make bench-keys`:
//
//	LOCALPG_DURABLE=1 .tmp/bin/localpg run -- go test -run '^$' -bench KeyedInsertShapes -benchtime 1x ./internal/pgsql
//
// b.N is ignored.
func BenchmarkKeyedInsertShapes(b *testing.B) {
	const perBatch, warmup, rounds, batches = 100, 200, 6, 100
	for _, ordered := range []bool{false, true} {
		name := "random"
		if ordered {
			name = "ordered"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.NewPool(b, testDSN, 4)
			tables := pgsql.NewTables(pgsql.Names{Schema: pgtest.NewSchema(b, pool, "pglease_shapes_")})
			if err := pgsql.Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
				b.Fatal(err)
			}
			scratch := func(n string) string { return pgx.Identifier{tables.Schema, n}.Sanitize() }
			for _, ddl := range []string{
				`CREATE TABLE ` + scratch("heap_keys") + ` (key uuid NOT NULL)`,
				`CREATE TABLE ` + scratch("unique_keys") + ` (key uuid PRIMARY KEY)`,
				`CREATE TABLE ` + scratch("conflict_keys") + ` (key uuid PRIMARY KEY)`,
			} {
				if _, err := pool.Exec(ctx, ddl); err != nil {
					b.Fatal(err)
				}
			}
			d := pgsql.NewSingleNode(tables)
			// beside is plain with the keys written into table by a
			// common table expression (conflict: its clause).
			beside := func(p pgsql.InsertMessagesParams, table, conflict string) pgsql.Stmt {
				keys := p.Keys
				p.Keys = nil
				s := tables.InsertMessages(p)
				s.SQL = `WITH written AS (INSERT INTO ` + table + ` (key) SELECT k::uuid FROM unnest($7::text[]) k` + conflict + `), ` + s.SQL[len("WITH "):]
				s.Args = append(s.Args, keys)
				return s
			}
			// rewrite replaces each old of s with its new, and fails when
			// the statement no longer has old.
			rewrite := func(s pgsql.Stmt, oldNew ...string) pgsql.Stmt {
				for i := 0; i < len(oldNew); i += 2 {
					if !strings.Contains(s.SQL, oldNew[i]) {
						b.Fatalf("the statement has no %q any more:\n%s", oldNew[i], s.SQL)
					}
					s.SQL = strings.Replace(s.SQL, oldNew[i], oldNew[i+1], 1)
				}
				return s
			}
			oneSlot := func(p pgsql.InsertMessagesParams) pgsql.Stmt {
				return rewrite(tables.InsertKeyed(p), "\n\tON CONFLICT DO NOTHING", "",
					"(VALUES (0), (1)) x(back)", "(VALUES (0)) x(back)", "THEN 4 ELSE 2 END", "THEN 2 ELSE 1 END")
			}
			// v15 is keyed_strict with the keys written as schema versions
			// 15 to 20 wrote them: two day slots, no class read from the
			// topics and retention rows.
			v15 := func(p pgsql.InsertMessagesParams) pgsql.Stmt {
				s := rewrite(tables.InsertKeyed(p), "\n\tON CONFLICT DO NOTHING", "")
				from, to := strings.Index(s.SQL, "s AS ("), strings.Index(s.SQL, "\no AS (")
				if from < 0 || to < from {
					b.Fatalf("the statement has no keys part any more:\n%s", s.SQL)
				}
				s.SQL = s.SQL[:from] + `s AS (SELECT pg_catalog.floor(extract(epoch FROM pg_catalog.now()) / 86400)::bigint AS today),
f AS (SELECT DISTINCT ON (m.topic, m.key) m.topic, m.key, m.n FROM m WHERE m.key IS NOT NULL ORDER BY m.topic, m.key, m.n),
k AS (
	INSERT INTO ` + tables.Keys + ` (topic, key, slot, gen)
	SELECT f.topic, f.key, x.slot, (x.slot % 4)::smallint
	FROM f CROSS JOIN s CROSS JOIN LATERAL (VALUES (s.today - 1), (s.today)) x(slot)
	ORDER BY x.slot, f.topic, f.key
	RETURNING topic, key
),
fresh AS (SELECT f.n FROM f JOIN (SELECT k.topic, k.key FROM k GROUP BY k.topic, k.key HAVING pg_catalog.count(*) = 2) w
	ON w.topic = f.topic AND w.key = f.key),` + s.SQL[to:]
				return s
			}
			lean := func(p pgsql.InsertMessagesParams) pgsql.Stmt {
				keys := p.Keys
				p.Keys = nil
				s := rewrite(tables.InsertMessages(p), "), inserted AS (", `), k AS (
	INSERT INTO `+tables.Keys+` (topic, key, slot, gen)
	SELECT $1::text, u.key, s.slot, (s.slot % 4)::smallint
	FROM unnest($7::uuid[]) u(key)
	CROSS JOIN (SELECT pg_catalog.floor(extract(epoch FROM pg_catalog.now()) / 86400)::bigint - 1 + v.d AS slot FROM (VALUES (0), (1)) v(d)) s
	WHERE u.key IS NOT NULL
	ORDER BY s.slot, u.key
	RETURNING 1
), inserted AS (`, "WITH ORDINALITY AS m(uuid, payload, metadata, hash, n)\nORDER BY m.n",
					"WITH ORDINALITY AS m(uuid, payload, metadata, hash, n)\nWHERE (SELECT pg_catalog.count(*) FROM k) >= 0\nORDER BY m.n")
				s.Args = append(s.Args, keys)
				return s
			}
			run := func(s pgsql.Stmt) error {
				rows, err := pool.Query(ctx, s.SQL, s.Args...)
				if err != nil {
					return err
				}
				rows.Close()
				return rows.Err()
			}
			shapes := []struct {
				name string
				do   func(p pgsql.InsertMessagesParams) error
			}{
				{"plain", func(p pgsql.InsertMessagesParams) error { p.Keys = nil; return run(tables.InsertMessages(p)) }},
				{"heap", func(p pgsql.InsertMessagesParams) error { return run(beside(p, scratch("heap_keys"), "")) }},
				{"unique", func(p pgsql.InsertMessagesParams) error { return run(beside(p, scratch("unique_keys"), "")) }},
				{"unique_on_conflict", func(p pgsql.InsertMessagesParams) error {
					return run(beside(p, scratch("conflict_keys"), " ON CONFLICT DO NOTHING"))
				}},
				{"keyed_strict", func(p pgsql.InsertMessagesParams) error { _, err := d.InsertKeyed(ctx, pool, p); return err }},
				{"keyed", func(p pgsql.InsertMessagesParams) error { return run(tables.InsertKeyed(p)) }},
				{"one_slot_strict", func(p pgsql.InsertMessagesParams) error { return run(oneSlot(p)) }},
				{"v15_strict", func(p pgsql.InsertMessagesParams) error { return run(v15(p)) }},
				{"lean_strict", func(p pgsql.InsertMessagesParams) error { return run(lean(p)) }},
			}
			params := func() pgsql.InsertMessagesParams {
				p := pgsql.InsertMessagesParams{NotifyChannel: tables.NotifyChannel}
				for range perBatch {
					id := uuid.New()
					if ordered {
						id = uuid.Must(uuid.NewV7())
					}
					p.Topics = append(p.Topics, "bench")
					p.UUIDs = append(p.UUIDs, id.String())
					p.Payloads = append(p.Payloads, []byte(`{"bench":"pglease","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`))
					p.Metadata = append(p.Metadata, "")
					p.Keys = append(p.Keys, id.String())
				}
				return p
			}
			batchesOf := func(do func(pgsql.InsertMessagesParams) error, n int) {
				for range n {
					if err := do(params()); err != nil {
						b.Fatal(err)
					}
				}
			}
			for _, s := range shapes {
				batchesOf(s.do, warmup)
			}
			spent := make([]time.Duration, len(shapes))
			b.ResetTimer()
			for r := range rounds {
				for i := range shapes {
					i = (i + r) % len(shapes) // each round starts with another shape
					start := time.Now()
					batchesOf(shapes[i].do, batches)
					spent[i] += time.Since(start)
				}
			}
			b.StopTimer()
			for i, s := range shapes {
				rate := float64(rounds*batches*perBatch) / spent[i].Seconds()
				b.ReportMetric(rate, s.name+"_msgs/s")
				if i > 0 {
					b.ReportMetric(100*float64(spent[0])/float64(spent[i]), fmt.Sprintf("%s_%%", s.name))
				}
			}
		})
	}
}
