package main

import (
	"errors"
	"strings"
	"testing"
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
	info := machineInfo{pgbouncer: "PgBouncer 1.18.0 (pool_mode=transaction)"}
	writeMarkdown(&b, cfg, res.rows(cfg), newPeerReport(cfg, res, info), res, info)
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
