package pgsql

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// BenchmarkInsertServerCPU measures what an insert statement costs the
// server: the CPU time (user and system, from /proc) of the backend that
// runs it, per statement and its commit, each statement its own
// transaction on one connection, with the three ways of registering
// (see registering) on the same schema, in alternating rounds:
//
//   - per_statement: the statement registers and takes one position
//     (schema version 20);
//   - per_row: the statement registers, each row takes its position from
//     its default (schema versions 18 and 19);
//   - trigger_registers: the statement does not register; the trigger's
//     function registers and lets each row through (Citus's statement, a
//     TxHandler's, a release before 18).
//
// Sub-benchmarks of 1 and 100 messages per statement. It reports
// server-µs/stmt (the clock of /proc is coarse: each round runs long
// enough for a few dozen ticks). The server must run on this machine
// (localpg), else it is skipped, saying so:
//
//	.tmp/bin/localpg run -- go test -run '^$' -bench InsertServerCPU -benchtime 1x ./internal/pgsql
//
// b.N is ignored.
func BenchmarkInsertServerCPU(b *testing.B) {
	dsn := os.Getenv("PGLEASE_TEST_DSN")
	if dsn == "" {
		b.Skip("needs PostgreSQL on this machine: run it under .tmp/bin/localpg run (make localpg)")
	}
	ctx := context.Background()
	pool := pgtest.NewPool(b, dsn, 2)
	tables := NewTables(Names{Schema: pgtest.NewSchema(b, pool, "pglease_cpu_")})
	if err := Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		b.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	if _, err := backendTicks(stat); err != nil {
		b.Skipf("the server's backend is not a process of this machine (%v): run the benchmark against localpg", err)
	}
	ticksPerSecond := 100.0 // USER_HZ on Linux
	ways := []struct {
		name string
		reg  registering
	}{{"per_statement", registerPerStatement}, {"per_row", registerPerRow}, {"trigger_registers", noRegistration}}
	for _, rows := range []int{1, 100} {
		b.Run(fmt.Sprintf("%d_rows", rows), func(b *testing.B) {
			statements := 8000
			if rows > 1 {
				statements = 800
			}
			p := InsertMessagesParams{}
			for i := range rows {
				p.Topics = append(p.Topics, "t")
				p.UUIDs = append(p.UUIDs, "u"+strconv.Itoa(i))
				p.Payloads = append(p.Payloads, []byte("payload"))
				p.Metadata = append(p.Metadata, "")
			}
			spent := map[string][]float64{}
			for round := range 3 {
				for _, w := range ways {
					s := tables.insertMessages(p, w.reg)
					for range 200 { // warm up: the plan cached, the functions compiled
						if _, err := conn.Exec(ctx, s.SQL, s.Args...); err != nil {
							b.Fatal(err)
						}
					}
					before, err := backendTicks(stat)
					if err != nil {
						b.Fatal(err)
					}
					// One statement per round trip, each its own
					// transaction (a batch would be one): the backend's
					// time waiting for the next is not CPU time.
					for range statements {
						if _, err := conn.Exec(ctx, s.SQL, s.Args...); err != nil {
							b.Fatal(err)
						}
					}
					after, err := backendTicks(stat)
					if err != nil {
						b.Fatal(err)
					}
					us := float64(after-before) / ticksPerSecond * 1e6 / float64(statements)
					spent[w.name] = append(spent[w.name], us)
					b.Logf("round %d %s: %.1f µs of server CPU per statement of %d", round+1, w.name, us, rows)
				}
				if _, err := conn.Exec(ctx, `TRUNCATE `+tables.Messages); err != nil {
					b.Fatal(err)
				}
			}
			for _, w := range ways {
				b.ReportMetric(median(spent[w.name]), w.name+"-server-µs/stmt")
			}
		})
	}
}

// backendTicks is the CPU time, user and system, of the process whose
// /proc stat file is stat, in clock ticks.
func backendTicks(stat string) (int64, error) {
	raw, err := os.ReadFile(stat)
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields
	// after it are counted from its closing parenthesis (utime and stime
	// are the 14th and 15th fields of the whole line).
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields", stat, len(f))
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	sys, err := strconv.ParseInt(f[12], 10, 64)
	return u + sys, err
}

// median of xs (not empty), which it sorts.
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
