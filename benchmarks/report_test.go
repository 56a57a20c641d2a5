package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleRows are the rows of a made-up run: some targets met, one missed,
// one row where watermill-sql is better, one row without values.
func sampleRows(t *testing.T) []row {
	t.Helper()
	cfg, err := parseFlags([]string{"-dsn", "postgres://example/db"})
	if err != nil {
		t.Fatal(err)
	}
	res := newResults()
	values := map[string][2][]float64{
		"publish-concurrent": {{30000, 32000, 31000}, {3000, 3100, 2900}},
		"publish-batch":      {{80000, 81000, 79000}, {100000, 101000, 99000}},
		"drain":              {{90000, 95000, 85000}, {20000, 21000, 19000}},
		"latency-p50":        {{1.1, 1.2, 1.0}, {498, 499, 497}},
		"latency-p99":        {{30, 31, 29}, {990, 995, 996}},
		"idle-statements":    {{1.3, 1.4, 1.2}, {2900, 3000, 2950}},
		"router":             {{40000, 41000, 39000}, {20000, 21000, 19000}},
		"group-idle-1":       {{1.4, 1.5, 1.3}, nil},
		"group-idle-3":       {{4.1, 4.3, 4.2}, {700, 710, 690}},
		"group-idle-10":      {{14, 15, 16}, nil},
		"balance-join":       {{0.2, 0.3, 0.25}, nil},
		"balance-kill":       {{9.1, 8.2, 7.3}, nil},
		"many-claim-100000":  {{61, 62, 63}, nil},
		"many-heap-100000":   {{7.1, 7.2, 7.3}, nil},
		"partitions-ratio":   {{0.15, 0.5, 0.14}, nil},
	}
	for _, w := range workloads(cfg) {
		for i := range 3 {
			for b, name := range []string{pgleaseName, watermillSQLName} {
				vals := map[string]float64{}
				for _, m := range w.metrics {
					if v, ok := values[m.key]; ok && v[b] != nil {
						vals[m.key] = v[b][i]
					}
				}
				res.add(w, name, vals)
			}
		}
	}
	return res.rows(cfg)
}

func TestReportTargets(t *testing.T) {
	met := map[string]string{}
	for _, x := range sampleRows(t) {
		met[x.m.key] = x.met
	}
	want := map[string]string{
		"publish-concurrent": "yes", // 10×
		"publish-batch":      "no",  // 0.8×
		"drain":              "yes", // 4.5×
		"latency-p50":        "",
		"latency-p99":        "no", // 30 ms
		"idle-statements":    "yes",
		"router":             "",
		"group-idle-1":       "",
		"group-idle-3":       "yes", // 4.2 ≤ 15, judged on pglease alone
		"balance-kill":       "",
		"many-claim-100000":  "no",  // 62 s, pglease alone
		"many-heap-100000":   "yes", // 7.2 KiB, pglease alone
		"partitions-ratio":   "yes", // 0.15 ≤ 0.4, the median of the rounds
	}
	for k, v := range want {
		if met[k] != v {
			t.Errorf("%s: met = %q, want %q", k, met[k], v)
		}
	}
}

func TestReportSVGIsWellFormed(t *testing.T) {
	var b strings.Builder
	info := machineInfo{date: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), cores: 2, goVersion: "go1.26", postgres: "15.18 (Debian)"}
	writeSVG(&b, sampleRows(t), info)
	d := xml.NewDecoder(strings.NewReader(b.String()))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
	}
	for _, want := range []string{"10×", "0.8×", "pglease 31,000 · watermill-sql 3,000 msg/s", "target pglease ≤ 25 ms"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// BENCH_SVG_OUT=file.svg keeps the sample for a look.
	if out := os.Getenv("BENCH_SVG_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMarkdownTable(t *testing.T) {
	var b strings.Builder
	markdownTable(&b, sampleRows(t))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2+15 {
		t.Fatalf("got %d lines, want a header, a rule and 15 rows (none for metrics without values):\n%s", len(lines), b.String())
	}
	// A pglease-only row shows that watermill-sql was not measured, and its
	// absolute target is judged.
	want := "| 1 Subscriber, 100,000 topics: Go heap and stacks per idle topic, after GC | KiB | 7.20 | — | — | pglease ≤ 8 KiB | yes |"
	if !strings.Contains(b.String(), want+"\n") {
		t.Errorf("table lacks the row\n%s\n%s", want, b.String())
	}
	for _, l := range lines {
		if got := strings.Count(l, " | ") + 2; got != len(tableHeader)+1 && !strings.HasPrefix(l, "|---") {
			t.Errorf("line has %d cells: %s", got-1, l)
		}
	}
}

func TestParseFlagsNeedsDSN(t *testing.T) {
	t.Setenv("PGLEASE_TEST_DSN", "")
	t.Setenv("DATABASE_URL", "")
	if _, err := parseFlags(nil); err == nil || !strings.Contains(err.Error(), "PGLEASE_TEST_DSN") {
		t.Fatalf("parseFlags without a DSN: err = %v", err)
	}
}

func TestQuickKeepsExplicitFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "x", "-quick", "-backlog", "500"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.backlog != 500 || cfg.rounds != 1 || cfg.out != "" {
		t.Fatalf("quick: backlog %d rounds %d out %q", cfg.backlog, cfg.rounds, cfg.out)
	}
}

func TestPayloadSize(t *testing.T) {
	if len(payload) != payloadSize {
		t.Fatalf("payload is %d bytes", len(payload))
	}
}

func TestSplitHolds(t *testing.T) {
	for _, tc := range []struct {
		s      split
		counts []int
		want   bool
	}{
		{fairSplit(3, 1000), []int{333, 333, 334}, true},
		{fairSplit(3, 1000), []int{332, 334, 334}, false},
		{fairSplit(3, 1000), []int{333, 333}, false},
		{fairSplit(4, 200), []int{50, 50, 50, 50}, true},
		{fairSplit(4, 200), []int{50, 50, 50, 49}, false}, // one topic not owned
		{split{members: 5, lo: 39, hi: 41}, []int{39, 40, 40, 40, 41}, true},
		{split{members: 5, lo: 39, hi: 41}, []int{38, 40, 40, 41, 41}, false},
		{split{members: 4, lo: 49, hi: 51}, []int{10, 49, 50, 50, 41}, false}, // the dead member still owns some
	} {
		if got := tc.s.holds(tc.counts); got != tc.want {
			t.Errorf("%v holds %v = %v, want %v", tc.s, tc.counts, got, tc.want)
		}
	}
}

func TestWorkloadIDsFollowManyTopics(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "x", "-many-topics", "500,2_000", "-only", "many-topics-2000,group-idle"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.manyTopics, []int{500, 2000}) {
		t.Fatalf("many-topics = %v", cfg.manyTopics)
	}
	if _, err := parseFlags([]string{"-dsn", "x", "-only", "many-topics-5"}); err == nil {
		t.Fatal("-only accepted a many-topics size that -many-topics does not list")
	}
}
