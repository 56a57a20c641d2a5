package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

const (
	pgleaseName      = "pglease"
	watermillSQLName = "watermill-sql"
)

// results collects every round's value of every metric, per backend.
type results struct {
	values   map[string]map[string][]float64 // metric key → backend → rounds
	failures map[string]map[string][]string  // metric key → backend → errors
}

func newResults() *results {
	return &results{values: map[string]map[string][]float64{}, failures: map[string]map[string][]string{}}
}

func (r *results) add(w workload, backend string, vals map[string]float64) {
	for _, m := range w.metrics {
		v, ok := vals[m.key]
		if !ok {
			continue
		}
		if r.values[m.key] == nil {
			r.values[m.key] = map[string][]float64{}
		}
		r.values[m.key][backend] = append(r.values[m.key][backend], v)
	}
}

func (r *results) fail(w workload, backend string, err error) {
	for _, m := range w.metrics {
		if r.failures[m.key] == nil {
			r.failures[m.key] = map[string][]string{}
		}
		r.failures[m.key][backend] = append(r.failures[m.key][backend], err.Error())
	}
}

// row is one line of the table.
type row struct {
	m        metric
	pg, ws   []float64 // every round
	pgMed    float64
	wsMed    float64
	complete bool // both backends have values
	ratio    float64
	met      string // "yes", "no" or "" (no target)
	// via names the backend in the pglease column when it is not pglease
	// direct (pgbouncerName); directMed is then pglease's direct median.
	via       string
	directMed float64
	// vs names the backend of the ws values when it is not watermill-sql
	// (a bar of the chart that compares pglease with a peer or a limit,
	// report_peers.go); vsUnit is their unit when it is not the metric's.
	vs, vsUnit string
}

func (r *results) rows(cfg config) []row {
	var rows []row
	for _, w := range selectedWorkloads(cfg) {
		if w.alone != nil {
			continue // the limits: in the peers section
		}
		for _, m := range w.metrics {
			x, ok := r.row(m)
			if ok {
				rows = append(rows, x)
			}
			if w.pgbouncer {
				if y, ok := r.pgbouncerRow(m, x); ok {
					rows = append(rows, y)
				}
			}
		}
	}
	return rows
}

// row is metric m's row of pglease direct and watermill-sql; false when
// neither ran (a fallback metric that was not needed).
func (r *results) row(m metric) (row, bool) {
	x := row{m: m, pg: r.values[m.key][pgleaseName], ws: r.values[m.key][watermillSQLName]}
	if len(x.pg) > 0 {
		x.pgMed = median(x.pg)
	}
	if len(x.ws) > 0 {
		x.wsMed = median(x.ws)
	}
	if len(x.pg) == 0 && len(x.ws) == 0 && len(r.failures[m.key][pgleaseName]) == 0 && len(r.failures[m.key][watermillSQLName]) == 0 {
		return x, false
	}
	if len(x.pg) > 0 && len(x.ws) > 0 {
		x.complete = true
		x.ratio = x.pgMed / x.wsMed
		x.met = judge(m.target, x.pgMed, x.ratio)
	} else if len(x.pg) > 0 && (m.target.kind == pgleaseAtMost || m.target.kind == pgleaseAtLeast) {
		// An absolute target needs no watermill-sql value.
		x.met = judge(m.target, x.pgMed, 0)
	}
	return x, true
}

// pgbouncerRow is metric m's row of pglease through PgBouncer, to go under
// direct, the row of pglease direct; false when it did not run. It has no
// target and no watermill-sql value: its ratio is to pglease direct.
func (r *results) pgbouncerRow(m metric, direct row) (row, bool) {
	y := row{m: m, pg: r.values[m.key][pgbouncerName], via: pgbouncerName, directMed: direct.pgMed}
	if len(y.pg) == 0 && len(r.failures[m.key][pgbouncerName]) == 0 {
		return y, false
	}
	y.m.label = m.label + ", pglease through PgBouncer"
	y.m.short = m.short + ", through PgBouncer"
	y.m.target = target{}
	y.m.pgleaseOnly = true
	if len(y.pg) > 0 {
		y.pgMed = median(y.pg)
	}
	return y, true
}

// backends are the backends whose values the row shows.
func (x row) backends() []string {
	if x.via != "" {
		return []string{x.via}
	}
	return []string{pgleaseName, watermillSQLName}
}

func judge(t target, pg, ratio float64) string {
	var ok bool
	switch t.kind {
	case ratioAtLeast:
		ok = ratio >= t.value
	case ratioAtMost:
		ok = ratio <= t.value
	case pgleaseAtMost:
		ok = pg <= t.value
	case pgleaseAtLeast:
		ok = pg >= t.value
	default:
		return ""
	}
	if ok {
		return "yes"
	}
	return "no"
}

// factor is how many times better pglease is than watermill-sql on the
// row's metric: above 1, pglease is better, whichever way the metric goes.
func (x row) factor() float64 {
	if x.m.better == lowerIsBetter {
		return x.wsMed / x.pgMed
	}
	return x.pgMed / x.wsMed
}

// targetFactor is the row's target expressed as a factor, when it is one.
func (x row) targetFactor() (float64, bool) {
	switch x.m.target.kind {
	case ratioAtLeast:
		return x.m.target.value, true
	case ratioAtMost:
		return 1 / x.m.target.value, true
	}
	return 0, false
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 0) || math.IsNaN(v):
		return fmt.Sprint(v)
	case v >= 1000:
		return thousands(int(math.Round(v)))
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func formatRatio(r float64) string {
	switch {
	case r == 0 || math.IsInf(r, 0) || math.IsNaN(r):
		return fmt.Sprint(r)
	case r >= 10:
		return fmt.Sprintf("%.1f×", r)
	case r >= 0.995:
		return fmt.Sprintf("%.2f×", r)
	default:
		return fmt.Sprintf("%.3g× (1/%s)", r, formatValue(1/r))
	}
}

func (x row) cells() []string {
	if x.via != "" {
		// Through PgBouncer: the ratio is to pglease direct.
		pg, ratio := "n/a", notMeasured
		if len(x.pg) > 0 {
			pg = formatValue(x.pgMed)
			if x.directMed > 0 {
				ratio = formatRatio(x.pgMed/x.directMed) + " of direct"
			}
		}
		return []string{x.m.label, x.m.unit, pg, notMeasured, ratio, "", ""}
	}
	target := x.m.target.text
	if x.complete {
		return []string{x.m.label, x.m.unit, formatValue(x.pgMed), formatValue(x.wsMed), formatRatio(x.ratio), target, x.met}
	}
	pg, ws, ratio := "n/a", "n/a", "n/a"
	if len(x.pg) > 0 {
		pg = formatValue(x.pgMed)
	}
	if len(x.ws) > 0 {
		ws = formatValue(x.wsMed)
	}
	if x.m.pgleaseOnly {
		ws, ratio = notMeasured, notMeasured
	}
	return []string{x.m.label, x.m.unit, pg, ws, ratio, target, x.met}
}

// notMeasured fills the watermill-sql cells of a pglease-only row.
const notMeasured = "—"

var tableHeader = []string{"workload", "unit", "pglease", "watermill-sql", "pglease ÷ watermill-sql", "target", "met"}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t"))
	for _, x := range rows {
		fmt.Fprintln(tw, strings.Join(x.cells(), "\t"))
	}
	_ = tw.Flush()
}

func markdownTable(w io.Writer, rows []row) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(tableHeader, " | "))
	fmt.Fprintln(w, "|---|---|--:|--:|--:|---|---|")
	for _, x := range rows {
		cells := x.cells()
		for i, c := range cells {
			cells[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// writeReports writes results.md and results.svg into dir.
func writeReports(dir string, cfg config, rows []row, pr *peerReport, res *results, info machineInfo) (string, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	mdPath := filepath.Join(dir, "results.md")
	svgPath := filepath.Join(dir, "results.svg")

	var md strings.Builder
	writeMarkdown(&md, cfg, rows, pr, res, info)
	if err := os.WriteFile(mdPath, []byte(md.String()), 0o644); err != nil {
		return "", "", err
	}
	var svg strings.Builder
	writeSVG(&svg, chartBars(rows, pr), info)
	if err := os.WriteFile(svgPath, []byte(svg.String()), 0o644); err != nil {
		return "", "", err
	}
	return mdPath, svgPath, nil
}

func writeMarkdown(w io.Writer, cfg config, rows []row, pr *peerReport, res *results, info machineInfo) {
	fmt.Fprintf(w, "# pglease vs watermill-sql and the peers\n\n")
	fmt.Fprintf(w, "Medians of %d round(s) per workload, measured %s with `%s`.\n", rounds(rows), info.date.Format("2006-01-02 15:04 MST"), info.command)
	fmt.Fprintf(w, "The file is written by the benchmark program (`benchmarks/`); rerun it rather than editing by hand.\n\n")
	markdownTable(w, rows)
	fmt.Fprintf(w, "\n![pglease vs watermill-sql and the peers: times better, log scale](results.svg)\n\n")
	if pr.any() {
		pr.markdown(w)
		fmt.Fprintln(w)
	}

	fmt.Fprintf(w, "## Machine\n\n")
	cpu := info.cpu
	if cpu == "" {
		cpu = "unknown CPU"
	}
	fmt.Fprintf(w, "- %d cores (%s), %s, %s\n", info.cores, cpu, info.osArch, info.goVersion)
	fmt.Fprintf(w, "- PostgreSQL %s on the same machine, reached over TCP on 127.0.0.1 (%s)\n", info.postgres, info.settings)
	pgl := "the working tree"
	if rev, dirty := strings.CutSuffix(info.pglease, "-dirty"); dirty {
		pgl = "commit " + rev + " with uncommitted changes"
	} else if rev != "" {
		pgl = "commit " + rev
	}
	fmt.Fprintf(w, "- watermill %s, watermill-sql %s, pgx %s; pglease: %s\n", info.watermill, info.watermillSQL, info.pgx, pgl)
	if len(pr.peerNames()) > 0 {
		fmt.Fprintf(w, "- watermill-nats %s with nats-server %s embedded in the benchmark's process; watermill-redisstream %s with go-redis %s and redis-server %s as a process of its own\n",
			orUnknown(info.watermillNATS), orUnknown(info.natsServer), orUnknown(info.watermillRedis), orUnknown(info.goRedis), orUnknown(info.redisServer))
	}
	fmt.Fprintf(w, "- other work may have been running on the machine at the same time\n\n")

	fmt.Fprintf(w, "## Method\n\n")
	database := "The run works in a database of its own, created for it and dropped at the end."
	if !info.ownDatabase {
		database = "The run works in the database it was given (it could not create one of its own)."
	}
	for _, line := range []string{
		database + " Every round runs each workload once on each backend, alternating which goes first; each run starts in a fresh, empty PostgreSQL schema after a `CHECKPOINT`, and the schema is dropped afterwards.",
		"pglease: `NewPublisher`/`NewSubscriber` with default configurations, `Tables{Schema: ...}`, consumer group `bench`.",
		"watermill-sql v4: `DefaultPostgreSQLSchema` and `DefaultPostgreSQLOffsetsAdapter`, default configurations (1 s poll, batches of 100), consumer group `bench`, on a pgxpool through its pgx adapter (`BeginnerFromPgx`), with `search_path` set to the run's schema.",
		"Both pools (pgxpool) open at most the same number of connections (`-conns`, default 64). Tables are created before the clock starts.",
		"Payloads are 64 bytes of JSON (watermill-sql's default payload column is `json`).",
		"Publish workloads count the messages whose Publish call returned within the time; each of the goroutines publishes once before the clock starts.",
		"Drain and Router: the backlog is published beforehand in calls of 1,000 messages from 4 goroutines; the clock runs from Subscribe (Router.Run) until the last message is acked (handled).",
		"Latency: one message per Publish call at a fixed rate; latency is from just before Publish to the subscriber's channel delivering it, on the monotonic clock of one process. Warm-up messages sent until the subscriber delivers are not counted.",
		"Idle load: one Subscriber subscribed to every topic, no messages. Once the subscriptions are set up, this database's `pg_stat_statements` entries are reset; when the per-second rate has settled, the window counts the calls of every top-level statement (BEGIN and COMMIT included) that the server ran in this database. Only without `pg_stat_statements` does it fall back to `pg_stat_database` xact_commit + xact_rollback, which backends report lazily (an idle backend up to 10 s late), so set-up work leaks into the window.",
		fmt.Sprintf("Idle group: 1, 3 and 10 Subscribers of one consumer group, each with a pool of its own and the default configuration (SessionTTL 10 s, PollInterval 1 s), in the benchmark's process, subscribe to the same %s topics, which get no messages; watermill-sql runs the 3-Subscriber case only. Once the group settled (pglease: every topic owned and split evenly), the server's statement rate is steady from one second to the next, and %s more passed (pg_stat_database hears of a backend's transactions up to 10 s late), the window counts the database's xact_commit + xact_rollback in pg_stat_database over %s (ten heartbeats: every timer of an idle Subscriber, the expired-session clean-up every tenth heartbeat included, runs a whole number of times), read from another database so that the reads are not counted.", thousands(cfg.idleTopics), cfg.groupSettle, cfg.groupWindow.Round(100*time.Millisecond)),
		fmt.Sprintf("Group split (pglease only): %d Subscribers of one group on %d idle topics, one of them in a child process (the benchmark binary run again) and the others in the benchmark's process, each with a pool of its own and the default configuration. Once they own %d topics each, a Subscriber joins: the time from its first Subscribe call until every member owns %d±1. Then the child is killed with SIGKILL, so that its session stays until it expires and nothing is released: the time from the kill until the other %d own %d±1 each. Ownership is read from the offsets table every 10 ms.", balanceMembers, balanceTopics, balanceTopics/balanceMembers, balanceTopics/(balanceMembers+1), balanceMembers, balanceTopics/balanceMembers),
		fmt.Sprintf("Partitioned group (pglease only): two topics, created with `CreateTopic` and %d and %d partitions, each get %s messages beforehand, published in calls of 100 from one goroutine, round robin over %d keys (metadata `partition_key`; keys `%s` to `%s`, which fall on the %d partitions %d each) and numbered per key. %d members of one group, each a child process with the default configuration, subscribe without reading their channels; once every member has a live session and the owning members hold the topic's rows evenly (read from the offsets and sessions tables every 10 ms; still so a second later), all are told to start. Each reads its channel and handles every message in a goroutine of its own, as a Watermill Router does: it sleeps %d ms, reports the message to the benchmark's process and acks it. Drain time: from the start until every message was reported once. A message from another partition than its key's, or a key's messages out of publishing order, fails the run. The two topics run one after the other in each round, in alternating order; the ratio is of the same round's times.", partitionCounts[0], partitionCounts[len(partitionCounts)-1], thousands(partitionMessages), partitionKeys, fmt.Sprintf(partitionKeyFormat, 0), fmt.Sprintf(partitionKeyFormat, partitionKeys-1), partitionCounts[len(partitionCounts)-1], partitionKeys/partitionCounts[len(partitionCounts)-1], partitionMembers, partitionHandlerDelay.Milliseconds()),
		fmt.Sprintf("Many topics (pglease only): one Subscriber with the default configuration, in a child process of its own, subscribes to every topic (their offset rows do not exist yet). Claimed: from its first Subscribe call until the offsets table shows every topic owned (polled at most every 50 ms). Idle: once the statement rate is steady and %s more passed, statements (pg_stat_statements, as for idle load) over %s. Memory: `runtime.MemStats` HeapAlloc + StackInuse after two GCs, after the idle window, less the same before the first Subscribe, per topic; the channels are not read (no messages). Close: how long `Subscriber.Close` takes.", cfg.groupSettle, cfg.groupWindow.Round(100*time.Millisecond)),
		fmt.Sprintf("Transactional handler (pglease only): a topic gets %s messages beforehand, as for the Router workload; then three fresh consumer groups consume all of them one after the other (in an order that rotates from round to round), each through a Router with the default configuration and one `AddConsumerHandler` on a Subscriber with the default configuration, sharing the pool (`-conns`) with its handler. Plain: the handler runs `INSERT INTO bench_effects (uuid) VALUES ($1)` on the pool and returns nil (at least once: the effect is not atomic with the position). TxHandler, effect + AckInTx: `pglease.TxHandler` on the pool, whose function runs the same INSERT with the transaction and returns no message (exactly once). TxHandler, effect + derived message + AckInTx: the function also returns one derived message, which `TxHandler` publishes to another topic in the transaction (consume-transform-produce). Each is timed from `Router.Run` until the last message was handled (its handler returned nil); the ratio is of the same round's rates. Server time and statements per message: the calls and `total_exec_time` of every top-level statement (BEGIN and COMMIT included) the server ran in this database over the same span (`pg_stat_statements`), divided by the messages; the work of committing (WAL, queued notifications) happens after COMMIT's execution and is not in the time, nor is the time between statements, which the round trips take. Afterwards the effect table must hold exactly one row per message (and the derived topic one message per message), or the run fails; the table is emptied before the next group.", thousands(cfg.txMessages)),
		fmt.Sprintf("Held horizon (pglease only): %d Subscribers of one group, each with a pool of its own and the default configuration, share %d topics; %d goroutines publish %d messages per second in all, one per Publish call, round robin over the topics, on a fixed schedule (a goroutine behind it catches up). Once every topic has delivered, a connection opens a read-only REPEATABLE READ transaction and reads the offsets table, so that it holds a snapshot, and with it the vacuum horizon, for the next %s (pg_dump does this). Consumed: the messages acked in the first and in the last %s of that time; latency from just before Publish to delivery (one process). Table sizes: `pg_total_relation_size` (heap, indexes, TOAST) when the transaction has just been opened and at the end; HOT: the share of the tables' updates over the same time that were HOT (`pg_stat_user_tables`, which backends report up to a second or so late).", cfg.horizonMembers, horizonTopics, horizonPublishers, cfg.horizonRate, cfg.horizonFor, cfg.horizonWindow),
		"The ratio column is pglease ÷ watermill-sql; the chart shows how many times better pglease is (the inverse for rows where lower is better), against watermill-sql and, on the lines marked ↳, against each peer and limit. Rows marked " + notMeasured + " are pglease alone: watermill-sql has no counterpart.",
	} {
		fmt.Fprintf(w, "- %s\n", line)
	}
	if len(pr.peerNames()) > 0 || pr.hasLimits() {
		for _, line := range peerMethod(cfg) {
			fmt.Fprintf(w, "- %s\n", line)
		}
	}
	if info.pgbouncer != "" {
		fmt.Fprintf(w, "- Through PgBouncer (rows \"pglease through PgBouncer\"): in each round the publish and drain workloads run a third time, on pglease with its pool (`-conns`) going through %s on the same machine (`-pgbouncer`), with pgx's `default_query_exec_mode=exec`, in the order pglease, through PgBouncer, watermill-sql, then the peers (reversed every other round). The Subscriber's LISTEN connection goes directly to PostgreSQL (the pool's BeforeConnect hook points every connection that pgxpool does not dial for the pool at PostgreSQL, until pglease has a setting for it). The ratio of those rows is to pglease direct in the same run; watermill-sql is not measured through PgBouncer.\n", info.pgbouncer)
	}

	fmt.Fprintf(w, "\n## Every round\n\n")
	fmt.Fprintf(w, "| workload | unit | pglease | watermill-sql |\n|---|---|---|---|\n")
	for _, x := range rows {
		ws := roundList(x.ws)
		if x.m.pgleaseOnly {
			ws = notMeasured
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", x.m.label, x.m.unit, roundList(x.pg), ws)
	}
	if t := pr.roundsTable(); len(t) > 1 {
		fmt.Fprintf(w, "\n### Every round of the peers and limits\n\n")
		markdownRows(w, t)
	}
	failures := pr.failures()
	for _, x := range rows {
		for _, b := range x.backends() {
			for _, f := range res.failures[x.m.key][b] {
				if x.via != "" {
					// The label names the backend.
					failures = append(failures, fmt.Sprintf("- %s: %s", x.m.label, f))
					continue
				}
				failures = append(failures, fmt.Sprintf("- %s, %s: %s", x.m.label, b, f))
			}
		}
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "\n## Failed runs\n\n%s\n", strings.Join(slices.Compact(failures), "\n"))
	}
}

func roundList(vs []float64) string {
	if len(vs) == 0 {
		return "n/a"
	}
	var s []string
	for _, v := range vs {
		s = append(s, formatValue(v))
	}
	return strings.Join(s, ", ")
}

// chartBars are the bars of the chart: each complete row of the table,
// followed by the bars that compare pglease with the peers and limits on
// the same metric.
func chartBars(rows []row, pr *peerReport) []row {
	var bars []row
	for _, x := range rows {
		if x.complete {
			bars = append(bars, x)
		}
		if x.via == "" && pr != nil {
			bars = append(bars, pr.chartRows(x.m)...)
		}
	}
	return bars
}

// writeSVG draws one horizontal bar per complete row: how many times better
// pglease is than the other backend, on a log scale, from the 1× line. A
// black tick marks the target where it is a ratio.
func writeSVG(w io.Writer, rows []row, info machineInfo) {
	var bars []row
	for _, x := range rows {
		if x.complete && x.pgMed > 0 && x.wsMed > 0 {
			bars = append(bars, x)
		}
	}
	const (
		width    = 900.0
		labelW   = 400.0
		left     = labelW + 56 // room for a value left of a bar below 1×
		right    = width - 80
		top      = 64.0
		rowH     = 40.0
		barH     = 20.0
		fontSize = 13
	)
	height := top + rowH*float64(max(len(bars), 1)) + 88

	// Decades from below the smallest to above the largest factor or target.
	lo, hi := 1.0, 1.0
	for _, x := range bars {
		f := x.factor()
		lo, hi = math.Min(lo, f), math.Max(hi, f)
		if t, ok := x.targetFactor(); ok {
			hi = math.Max(hi, t)
		}
	}
	loExp := math.Floor(math.Log10(lo))
	hiExp := math.Ceil(math.Log10(hi * 1.05))
	if hiExp <= loExp {
		hiExp = loExp + 1
	}
	xOf := func(f float64) float64 {
		return left + (math.Log10(f)-loExp)/(hiExp-loExp)*(right-left)
	}

	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="%d">`, width, height, width, height, fontSize)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>`)
	p(`<text x="%.0f" y="26" font-size="17" font-weight="bold">pglease vs watermill-sql and the peers: how many times better (log scale)</text>`, 16.0)
	p(`<text x="%.0f" y="46" fill="#555">%s</text>`, 16.0, esc(fmt.Sprintf("medians of %d rounds; %d cores, %s, PostgreSQL %s%s, %s", rounds(bars), info.cores, info.goVersion, strings.Fields(info.postgres + " ?")[0], fsyncNote(info), info.date.Format("2006-01-02"))))

	// Grid: one line per decade, the 1× line darker.
	axisY := top + rowH*float64(len(bars)) + 6
	for e := loExp; e <= hiExp; e++ {
		f := math.Pow(10, e)
		x := xOf(f)
		stroke, sw := "#dddddd", 1.0
		if e == 0 {
			stroke, sw = "#444444", 1.5
		}
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`, x, top-6, x, axisY, stroke, sw)
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#333">%s</text>`, x, axisY+16, esc(decadeLabel(f)))
	}
	p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">← the other better · pglease better →</text>`, xOf(1), axisY+34)

	for i, x := range bars {
		y := top + rowH*float64(i)
		f := x.factor()
		color := "#2e7d32" // better, target met or none
		switch {
		case x.vs == limitsName && x.met == "":
			// A limit of the server: pglease is not expected to beat it.
			color = "#90a4ae"
		case x.vs == limitsName && x.met == "yes":
		case x.met == "no" && (f >= 1 || x.vs == limitsName):
			color = "#ef8f00"
		case f < 1:
			color = "#c62828"
		}
		x0, x1 := xOf(1), xOf(f)
		if x1 < x0 {
			x0, x1 = x1, x0
		}
		p(`<text x="%.0f" y="%.1f" text-anchor="end" fill="#111">%s</text>`, labelW, y+barH/2-1, esc(x.m.short))
		p(`<text x="%.0f" y="%.1f" text-anchor="end" fill="#666" font-size="11">%s</text>`, labelW, y+barH/2+12, esc(x.detail()))
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x0, y, math.Max(x1-x0, 1), barH, color)
		tx, hasTarget := x.targetFactor()
		if hasTarget {
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2.5"><title>target %s</title></line>`, xOf(tx), y-3, xOf(tx), y+barH+3, esc(x.m.target.text))
		}
		valueText := formatFactor(f) + "×"
		if f >= 1 {
			end := x1
			if hasTarget {
				end = math.Max(end, xOf(tx)+2)
			}
			p(`<text x="%.1f" y="%.1f" fill="#111">%s</text>`, end+4, y+barH/2+4, esc(valueText))
		} else {
			p(`<text x="%.1f" y="%.1f" text-anchor="end" fill="#111">%s</text>`, x0-4, y+barH/2+4, esc(valueText))
		}
	}
	p(`<text x="16" y="%.1f" fill="#555">%s</text>`, height-28, esc("green: pglease better, target met or none; orange: target missed; red: the other better;"))
	p(`<text x="16" y="%.1f" fill="#555">%s</text>`, height-10, esc("grey: pglease's share of a limit of the server; black ticks: ratio targets"))
	p(`</svg>`)
}

// detail is the chart's second line for x: both medians, and an absolute
// target.
func (x row) detail() string {
	vs := watermillSQLName
	if x.vs != "" {
		vs = x.vs
	}
	d := fmt.Sprintf("pglease %s · %s %s %s", formatValue(x.pgMed), vs, formatValue(x.wsMed), x.m.unit)
	if x.vsUnit != "" && x.vsUnit != x.m.unit {
		d = fmt.Sprintf("pglease %s %s · %s %s %s", formatValue(x.pgMed), x.m.unit, vs, formatValue(x.wsMed), x.vsUnit)
	}
	if x.m.target.kind == pgleaseAtMost || x.m.target.kind == pgleaseAtLeast {
		d += "; target " + x.m.target.text
	}
	return d
}

func rounds(rows []row) int {
	n := 0
	for _, x := range rows {
		n = max(n, len(x.pg), len(x.ws))
	}
	return n
}

func decadeLabel(f float64) string {
	if f < 1 {
		return fmt.Sprintf("%g×", f)
	}
	return thousands(int(f)) + "×"
}

func formatFactor(f float64) string {
	switch {
	case f >= 100:
		return thousands(int(math.Round(f)))
	case f >= 10:
		return fmt.Sprintf("%.0f", f)
	default:
		return fmt.Sprintf("%.2g", f)
	}
}

func esc(s string) string { return html.EscapeString(s) }
