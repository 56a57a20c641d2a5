package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestPgBouncerFlagDefault(t *testing.T) {
	for _, tc := range []struct {
		name       string
		bench, env string
		args       []string
		want       string
	}{
		{name: "none", want: ""},
		{name: "from make test's PgBouncer", env: "postgres://b@127.0.0.1:2/db", want: "postgres://b@127.0.0.1:2/db"},
		{name: "the benchmark's variable first", bench: "postgres://a@127.0.0.1:1/db", env: "postgres://b@127.0.0.1:2/db", want: "postgres://a@127.0.0.1:1/db"},
		{name: "the flag first", env: "postgres://b@127.0.0.1:2/db", args: []string{"-pgbouncer", "postgres://c@127.0.0.1:3/db"}, want: "postgres://c@127.0.0.1:3/db"},
		{name: "turned off", env: "postgres://b@127.0.0.1:2/db", args: []string{"-pgbouncer="}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PGLEASE_BENCH_PGBOUNCER_DSN", tc.bench)
			t.Setenv("PGLEASE_TEST_PGBOUNCER_DSN", tc.env)
			cfg, err := parseFlags(append([]string{"-dsn", "x"}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.pgbouncerDSN != tc.want {
				t.Fatalf("pgbouncerDSN = %q, want %q", cfg.pgbouncerDSN, tc.want)
			}
		})
	}
}

// TestRouteDials checks, without a database, that the hook lets the
// connections pgxpool dials go to PgBouncer and points the others (as
// pglease's LISTEN connection is dialled) at PostgreSQL.
func TestRouteDials(t *testing.T) {
	direct, err := pgx.ParseConfig("postgres://direct:pw@127.0.0.1:5432/run?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	// PgBouncer's address: a port that refuses connections.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bouncer := l.Addr().String()
	l.Close()

	var pooled atomic.Int64
	hook := routeDials(direct, &pooled)

	// A dial outside the pool, with the pool's config, as pglease's
	// poolDialer does it.
	cc, err := pgx.ParseConfig("postgres://app@" + bouncer + "/run?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if err := hook(context.Background(), cc); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database); got != "direct@127.0.0.1:5432/run" || cc.Password != "pw" {
		t.Fatalf("a dial outside the pool went to %s (password %q), want direct@127.0.0.1:5432/run", got, cc.Password)
	}
	if n := pooled.Load(); n != 0 {
		t.Fatalf("pooled = %d after a dial outside the pool, want 0", n)
	}

	// The pool's own dial keeps PgBouncer's address; it fails (nothing
	// listens), after the hook ran.
	pc, err := pgxpool.ParseConfig("postgres://app@" + bouncer + "/run?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	var addr atomic.Value
	pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		err := hook(ctx, cc)
		addr.Store(fmt.Sprintf("%s:%d", cc.Host, cc.Port))
		return err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = pool.Ping(ctx)
	if err == nil {
		t.Fatal("Ping to a closed port succeeded")
	}
	if n := pooled.Load(); n != 1 {
		t.Fatalf("pooled = %d after the pool's dial, want 1", n)
	}
	if got, _ := addr.Load().(string); got != bouncer {
		t.Fatalf("the pool's dial went to %q, want PgBouncer at %s", got, bouncer)
	}
}

func TestReportPgBouncerRows(t *testing.T) {
	t.Setenv("PGLEASE_TEST_PGBOUNCER_DSN", "")
	cfg, err := parseFlags([]string{"-dsn", "x", "-only", "publish-concurrent,publish-batch,drain,latency", "-pgbouncer", "postgres://b@127.0.0.1:2/db"})
	if err != nil {
		t.Fatal(err)
	}
	res := newResults()
	for _, w := range selectedWorkloads(cfg) {
		for i := range 3 {
			for b, name := range []string{pgleaseName, watermillSQLName, pgbouncerName} {
				vals := map[string]float64{}
				for _, m := range w.metrics {
					vals[m.key] = float64((3-b)*1000 + i)
				}
				if w.id == "publish-batch" && name == pgbouncerName {
					res.fail(w, name, errors.New("prepared statement does not exist"))
					continue
				}
				if !w.pgbouncer && name == pgbouncerName {
					continue
				}
				res.add(w, name, vals)
			}
		}
	}
	var b strings.Builder
	writeMarkdown(&b, cfg, res.rows(cfg), res, machineInfo{pgbouncer: "PgBouncer 1.18.0 (pool_mode=transaction)"})
	md := b.String()
	for _, want := range []string{
		// Under the direct row, its ratio to it.
		"| publish: 64 goroutines, 1 message per call | msg/s | 3,001 | 2,001 | 1.50× | ≥ 5× | no |\n" +
			"| publish: 64 goroutines, 1 message per call, pglease through PgBouncer | msg/s | 1,001 | — | 0.334× (1/3.00) of direct |  |  |\n",
		"| consume: drain a 100,000-message backlog, 1 subscriber, pglease through PgBouncer | msg/s | 1,001 | — | 0.334× (1/3.00) of direct |  |  |\n",
		// A failed run shows as a row without a value, and in the failures.
		"| publish: batches of 100 per call, 1 goroutine, pglease through PgBouncer | msg/s | n/a | — | — |  |  |\n",
		"- publish: batches of 100 per call, 1 goroutine, pglease through PgBouncer: prepared statement does not exist\n",
		"| consume: drain a 100,000-message backlog, 1 subscriber, pglease through PgBouncer | msg/s | 1,000, 1,001, 1,002 | — |\n",
		"on pglease with its pool (`-conns`) going through PgBouncer 1.18.0 (pool_mode=transaction)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks\n%s\n\n%s", want, md)
		}
	}
	if strings.Contains(md, "latency p50: 100 msg/s for 10s, default configs, pglease through PgBouncer") {
		t.Error("the latency workload got a PgBouncer row")
	}
}
