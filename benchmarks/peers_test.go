package main

import (
	"encoding/xml"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

func TestParsePeers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{in: "nats,nats-sync,redis", want: []string{"nats", "nats-sync", "redis"}},
		{in: "redis, nats", want: []string{"nats", "redis"}}, // the order of the report
		{in: "nats,nats", want: []string{"nats"}},
		{in: "", want: nil},
		{in: "kafka", err: true},
	} {
		got, err := parsePeers(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("parsePeers(%q): err = %v", tc.in, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("parsePeers(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestPeersFlag(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "x"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.peers, peerIDs()) {
		t.Errorf("default -peers = %v, want every peer %v", cfg.peers, peerIDs())
	}
	if cfg, err = parseFlags([]string{"-dsn", "x", "-peers="}); err != nil || len(cfg.peers) != 0 {
		t.Errorf("-peers= : peers %v, err %v", cfg.peers, err)
	}
	if _, err := parseFlags([]string{"-dsn", "x", "-peers", "nats,rabbit"}); err == nil || !strings.Contains(err.Error(), "rabbit") {
		t.Errorf("-peers nats,rabbit: err = %v", err)
	}
}

func names(bs []backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.name())
	}
	return out
}

func TestRoundOrder(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "x", "-peers", "nats,redis", "-pgbouncer", "postgres://b@127.0.0.1:2/db"})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]workload{}
	for _, w := range workloads(cfg) {
		byID[w.id] = w
	}
	for _, tc := range []struct {
		id    string
		round int
		want  []string
	}{
		{"publish-concurrent", 1, []string{pgleaseName, pgbouncerName, watermillSQLName, natsName, redisName}},
		{"publish-concurrent", 2, []string{redisName, natsName, watermillSQLName, pgbouncerName, pgleaseName}},
		{"latency", 1, []string{pgleaseName, watermillSQLName, natsName, redisName}},
		{"router", 3, []string{pgleaseName, watermillSQLName, natsName, redisName}},
		{"idle", 1, []string{pgleaseName, watermillSQLName}},
		{"group-balance", 2, []string{pgleaseName}},
		{"limits", 2, []string{limitsName}},
	} {
		if got := names(roundOrder(byID[tc.id], cfg, tc.round)); !slices.Equal(got, tc.want) {
			t.Errorf("%s, round %d: %v, want %v", tc.id, tc.round, got, tc.want)
		}
	}
	cfg.peers, cfg.pgbouncerDSN = nil, ""
	if got := names(roundOrder(byID["drain"], cfg, 1)); !slices.Equal(got, []string{pgleaseName, watermillSQLName}) {
		t.Errorf("drain without peers and PgBouncer: %v", got)
	}
}

func TestPostgresDurability(t *testing.T) {
	for _, tc := range []struct {
		fsync, sync string
		short       string
		durable     bool
	}{
		{"on", "on", "fsync per commit", true},
		{"on", "remote_apply", "fsync per commit", true},
		{"on", "off", "WAL flushed in the background", false},
		{"off", "off", "no fsync", false},
		{"off", "on", "no fsync", false},
		{"", "", "unknown", false},
	} {
		long, short := postgresDurability(tc.fsync, tc.sync)
		if short != tc.short || long == "" {
			t.Errorf("postgresDurability(%q, %q) = %q, %q; want short %q", tc.fsync, tc.sync, long, short, tc.short)
		}
		if got := durable(tc.fsync, tc.sync); got != tc.durable {
			t.Errorf("durable(%q, %q) = %v", tc.fsync, tc.sync, got)
		}
	}
}

func TestPeerDurabilityLabels(t *testing.T) {
	want := map[string]string{
		natsName:         "fsync every 2 min",
		natsSyncName:     "fsync per write",
		redisName:        "fsync once per second",
		pgleaseAsyncName: "WAL flushed within 0.6 s",
	}
	for _, p := range peers {
		if p.short != want[p.backend.name()] {
			t.Errorf("%s: short durability %q, want %q", p.backend.name(), p.short, want[p.backend.name()])
		}
		if !strings.Contains(p.durability, p.short) {
			t.Errorf("%s: the durability %q does not say %q", p.backend.name(), p.durability, p.short)
		}
	}
}

func TestRedisServerSettings(t *testing.T) {
	args := strings.Join(redisArgs(6399, "/tmp/x"), " ")
	for _, want := range []string{"--bind 127.0.0.1 ", "--port 6399 ", "--dir /tmp/x ", "--appendonly yes ", "--appendfsync everysec ", "--save  ", "--daemonize no "} {
		if !strings.Contains(args+" ", want) {
			t.Errorf("redis-server arguments %q lack %q", args, want)
		}
	}
	if got := parseRedisVersion("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n"); got != "7.0.15" {
		t.Errorf("parseRedisVersion = %q", got)
	}
	if got := parseRedisVersion("something else"); got != "unknown" {
		t.Errorf("parseRedisVersion of garbage = %q", got)
	}
	if _, err := findRedisServer(filepath.Join(t.TempDir(), "no-such-redis-server")); err == nil {
		t.Error("findRedisServer found a program that does not exist")
	}
}

func TestNATSServerOptions(t *testing.T) {
	for _, syncAlways := range []bool{false, true} {
		o := natsOptions("/tmp/store", syncAlways)
		if o.Host != "127.0.0.1" || o.Port != server.RANDOM_PORT || !o.JetStream || o.StoreDir != "/tmp/store" || o.SyncAlways != syncAlways || !o.NoSigs {
			t.Errorf("natsOptions(syncAlways %v) = %+v", syncAlways, o)
		}
		if o.SyncInterval != 0 {
			t.Errorf("natsOptions sets a SyncInterval (%s): the default variant must keep the server's", o.SyncInterval)
		}
	}
}

// samplePeerResults are the results of a made-up run of the peer
// workloads and the limits, on a server with the given fsync setting.
func samplePeerResults(t *testing.T, fsync string) (config, *results, machineInfo) {
	t.Helper()
	t.Setenv("PGLEASE_TEST_PGBOUNCER_DSN", "")
	cfg, err := parseFlags([]string{"-dsn", "x", "-only", "publish-concurrent,publish-batch,drain,latency,router,limits"})
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]map[string]float64{
		pgleaseName:      {"publish-concurrent": 60000, "publish-batch": 150000, "drain": 140000, "latency-p50": 1.1, "latency-p99": 3.0, "router": 100000},
		watermillSQLName: {"publish-concurrent": 15000, "publish-batch": 145000, "drain": 18000, "latency-p50": 500, "latency-p99": 994, "router": 30000},
		natsName:         {"publish-concurrent": 20000, "publish-batch": 28000, "drain": 200000, "latency-p50": 0.4, "latency-p99": 0.9, "router": 90000},
		natsSyncName:     {"publish-concurrent": 5000, "publish-batch": 4300, "drain": 240000, "latency-p50": 0.7, "latency-p99": 1.8},
		redisName:        {"publish-concurrent": 70000, "publish-batch": 16000, "drain": 15000, "latency-p50": 0.2, "latency-p99": 0.45, "router": 14000},
		pgleaseAsyncName: {"publish-concurrent": 90000, "publish-batch": 200000, "drain": 140000, "latency-p50": 0.9, "latency-p99": 2.0, "router": 100000},
		limitsName:       {limitCopy: 400000, limitInsertSelect: 300000, limitCopy100: 120000, limitCommits: 19300, limitLatencyP50: 0.9, limitLatencyP99: 1.6},
	}
	res := newResults()
	for _, w := range selectedWorkloads(cfg) {
		for backend, vals := range values {
			if backend == natsSyncName && w.id == "router" {
				res.fail(w, backend, errors.New("timed out"))
				continue
			}
			for i := range 3 {
				round := map[string]float64{}
				for _, m := range w.metrics {
					if v, ok := vals[m.key]; ok {
						round[m.key] = v * (1 + 0.01*float64(i-1))
					}
				}
				if len(round) > 0 {
					res.add(w, backend, round)
				}
			}
		}
	}
	info := machineInfo{fsync: fsync, synchronousCommit: fsync, settings: "fsync=" + fsync,
		watermillSQL: "v4.1.2", watermillNATS: "v2.1.3", natsServer: "v2.15.2", watermillRedis: "v1.4.5", redisServer: "7.0.15"}
	return cfg, res, info
}

func TestPeerTable(t *testing.T) {
	cfg, res, info := samplePeerResults(t, "on")
	pr := newPeerReport(cfg, res, info)
	tab := pr.table(false)
	header := strings.Join(tab[0], " | ")
	if want := "backend | durability | publish, 64 goroutines × 1 message (msg/s) | publish, batches of 100 (msg/s) | drain 100,000 messages (msg/s) | latency p50 / p99 (ms) | Router, 20,000 messages (msg/s)"; header != want {
		t.Errorf("header\n%s\nwant\n%s", header, want)
	}
	lines := map[string]string{}
	for _, l := range tab[1:] {
		lines[l[0]] = strings.Join(l[1:], " | ")
	}
	for backend, want := range map[string]string{
		"pglease":                            "fsync per commit | 60,000 | 150,000 | 140,000 | 1.10 / 3.00 | 100,000",
		"watermill-sql v4.1.2 (pgx adapter)": "fsync per commit | 15,000 | 145,000 | 18,000 | 500 / 994 | 30,000",
		"NATS JetStream (watermill-nats v2.1.3, nats-server v2.15.2 embedded, file store)":              "fsync every 2 min | 20,000 | 28,000 | 200,000 | 0.40 / 0.90 | 90,000",
		"NATS JetStream, sync always (watermill-nats v2.1.3, nats-server v2.15.2 embedded, file store)": "fsync per write | 5,000 | 4,300 | 240,000 | 0.70 / 1.80 | failed",
		"Redis Streams (watermill-redisstream v1.4.5, redis-server 7.0.15, AOF)":                        "fsync once per second | 70,000 | 16,000 | 15,000 | 0.20 / 0.45 | 14,000",
		"PostgreSQL alone (limits: no Watermill, no Pub/Sub)":                                           "fsync per commit | 64 clients × 1 row per commit: 19,300 commits/s | COPY, one statement: 400,000 rows/s; INSERT … SELECT: 300,000 rows/s; COPY by 100: 120,000 rows/s | — | INSERT+NOTIFY→read p50: 0.90 ms; INSERT+NOTIFY→read p99: 1.60 ms | —",
	} {
		if lines[backend] != want {
			t.Errorf("%s:\n got %s\nwant %s", backend, lines[backend], want)
		}
	}
	if len(tab) != 1+7 {
		t.Errorf("%d lines, want a header and 7 backends (no PgBouncer row: it did not run)", len(tab))
	}
	// The Markdown version gives the durability in full.
	if long := pr.table(true); !strings.HasPrefix(long[3][1], "fsync every 2 min (JetStream's default sync_interval)") {
		t.Errorf("long durability of NATS: %q", long[3][1])
	}
}

func TestPeerGoals(t *testing.T) {
	cfg, res, info := samplePeerResults(t, "on")
	got := map[string][]string{}
	for _, l := range newPeerReport(cfg, res, info).goalsTable()[1:] {
		got[l[0]] = l[1:]
	}
	for text, want := range map[string]string{
		"consume ≥ 1.2× NATS JetStream (default settings)":               "140,000 | 200,000 (NATS JetStream) msg/s | 0.7× (1/1.43) | no",
		"latency p99 ≤ 1.5 ms at 100 msg/s":                              "3.00 |  | 3.00 | no",
		"latency p50 ≤ 0.6 ms at 100 msg/s":                              "1.10 |  | 1.10 | no",
		"publish from 64 goroutines ≥ 1.2× Redis Streams (AOF everysec)": "60,000 | 70,000 (Redis Streams) msg/s | 0.857× (1/1.17) | no",
		"same durability as Redis: pglease with synchronous_commit=off, publish from 64 goroutines ≥ 1.2× Redis Streams (AOF everysec)": "90,000 | 70,000 (Redis Streams) msg/s | 1.29× | yes",
		"publish in batches of 100 ≥ 1.5× watermill-sql v4":                                                                             "150,000 | 145,000 (watermill-sql) msg/s | 1.03× | no",
		"publish in batches of 100 ≥ 70 % of COPY rows/s (one statement)":                                                               "150,000 | 400,000 (PostgreSQL) rows/s | 0.375× (1/2.67) | no",
	} {
		if g := strings.Join(got[text], " | "); g != want {
			t.Errorf("%s:\n got %s\nwant %s", text, g, want)
		}
	}

	// A goal that holds, and none judged on a server without fsync.
	res.values["drain"][pgleaseName] = []float64{300000}
	pr := newPeerReport(cfg, res, info)
	if _, _, _, met := pr.judgeGoal(performanceGoals[0]); met != "yes" {
		t.Errorf("consume at 1.5× NATS: met = %q", met)
	}
	info.fsync = "off"
	pr = newPeerReport(cfg, res, info)
	for _, g := range performanceGoals {
		if _, _, _, met := pr.judgeGoal(g); !strings.HasPrefix(met, "not judged") {
			t.Errorf("%s with fsync off: met = %q", g.text, met)
		}
	}
	// Without the other side's value, a goal is not measured.
	delete(res.values["publish-concurrent"], redisName)
	if _, _, _, met := pr.judgeGoal(performanceGoals[3]); met != "not measured" {
		t.Errorf("without Redis: met = %q", met)
	}
}

func TestLimitsTable(t *testing.T) {
	cfg, res, info := samplePeerResults(t, "on")
	tab := newPeerReport(cfg, res, info).limitsTable()
	if len(tab) != 1+6 {
		t.Fatalf("%d lines, want a header and 6 limits", len(tab))
	}
	want := "COPY of 100,000 rows into the messages table, one statement | rows/s | 400,000 | publish: batches of 100 per call, 1 goroutine: 150,000 msg/s | 0.375× (1/2.67)"
	if got := strings.Join(tab[1], " | "); got != want {
		t.Errorf("COPY line:\n got %s\nwant %s", got, want)
	}
	if got := tab[4][4]; got != "3.11×" {
		t.Errorf("pglease ÷ single-row commits = %s", got)
	}
	// The latency floor: pglease's p50 (1.10 ms) against the server's 0.90.
	if got := tab[5][4]; got != "1.22×" {
		t.Errorf("pglease ÷ notify latency p50 = %s", got)
	}
}

func TestPeerChartAndMarkdown(t *testing.T) {
	cfg, res, info := samplePeerResults(t, "on")
	pr := newPeerReport(cfg, res, info)
	rows := res.rows(cfg)
	bars := chartBars(rows, pr)
	var labels []string
	for _, b := range bars {
		labels = append(labels, b.m.short)
	}
	// publish-concurrent: watermill-sql, then every peer, then its limit.
	wantFirst := []string{
		"publish, 64 goroutines × 1 message",
		"↳ vs NATS JetStream (fsync every 2 min)",
		"↳ vs NATS JetStream, sync always (fsync per write)",
		"↳ vs Redis Streams (fsync once per second)",
		"↳ vs PostgreSQL 64 clients × 1 row per commit",
	}
	if len(labels) < len(wantFirst) || !slices.Equal(labels[:len(wantFirst)], wantFirst) {
		t.Errorf("first bars %q, want %q", labels, wantFirst)
	}
	for _, b := range bars {
		if b.m.short == "↳ vs Redis Streams (fsync once per second)" && b.m.key == "publish-concurrent" {
			if b.m.target.kind != ratioAtLeast || b.m.target.value != 1.2 || b.met != "no" {
				t.Errorf("publish vs Redis: target %+v, met %q", b.m.target, b.met)
			}
		}
		if b.m.key == "router" && strings.Contains(b.m.short, "sync always") {
			t.Error("a bar for a peer whose every run failed")
		}
	}

	var svg strings.Builder
	writeSVG(&svg, bars, info)
	d := xml.NewDecoder(strings.NewReader(svg.String()))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
	}
	for _, want := range []string{"pglease 140,000 · NATS JetStream 200,000 msg/s", "pglease 150,000 msg/s · PostgreSQL 400,000 rows/s", "0.7×"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}

	var md strings.Builder
	writeMarkdown(&md, cfg, rows, pr, res, info)
	for _, want := range []string{
		"## Peers\n",
		"| Redis Streams (watermill-redisstream v1.4.5, redis-server 7.0.15, AOF) | fsync once per second (AOF, `appendfsync everysec`)",
		"### Limits of the server\n",
		"### Goals\n",
		"| consume ≥ 1.2× NATS JetStream (default settings) | 140,000 | 200,000 (NATS JetStream) msg/s | 0.7× (1/1.43) | no |\n",
		"### Every round of the peers and limits\n",
		"| consume: drain a 100,000-message backlog, 1 subscriber | NATS JetStream | 198,000, 200,000, 202,000 msg/s |\n",
		"- Router: consume 20,000 messages published beforehand, NATS JetStream, sync always: timed out\n",
		"Redis Streams: watermill-redisstream with default configurations",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("results.md lacks\n%s", want)
		}
	}
	if strings.Contains(md.String(), "does not fsync every commit") {
		t.Error("results.md warns about fsync on a server with fsync on")
	}
	info.fsync, info.synchronousCommit = "off", "off"
	md.Reset()
	writeMarkdown(&md, cfg, rows, newPeerReport(cfg, res, info), res, info)
	if !strings.Contains(md.String(), "does not fsync every commit") {
		t.Error("results.md does not warn that the server does not fsync")
	}
}

func TestPeerSkipped(t *testing.T) {
	cfg, res, info := samplePeerResults(t, "on")
	for _, byBackend := range res.values {
		delete(byBackend, redisName)
	}
	info.skipped = map[string]string{redisName: "no redis-server on PATH"}
	tab := newPeerReport(cfg, res, info).table(false)
	var line []string
	for _, l := range tab {
		if strings.HasPrefix(l[0], "Redis Streams") {
			line = l
		}
	}
	if line == nil || line[1] != "not measured: no redis-server on PATH" || line[2] != "not measured" {
		t.Errorf("Redis row when left out: %q", line)
	}
}

func TestCommonFirstWord(t *testing.T) {
	if got := commonFirstWord("latency p50", "latency p99"); got != "latency " {
		t.Errorf("got %q", got)
	}
	if got := commonFirstWord("publish, 64", "drain"); got != "" {
		t.Errorf("got %q", got)
	}
}
