package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
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
	}
	for _, w := range workloads(cfg) {
		for i := range 3 {
			for b, name := range []string{pgleaseName, watermillSQLName} {
				vals := map[string]float64{}
				for _, m := range w.metrics {
					if v, ok := values[m.key]; ok {
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
	if len(lines) != 2+7 {
		t.Fatalf("got %d lines, want a header, a rule and 7 rows (no row for the unused fallback metric):\n%s", len(lines), b.String())
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
