package main

// The report of the peers (peers.go) and the limits of the server
// (limits.go): one row per backend and one column per workload they share,
// with each backend's durability; the limits with pglease's ratio to them;
// the performance goals judged on this run's medians; and the bars of the
// chart that compare pglease with each peer.

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// peerColumn is a column of the peers table: the metrics of one workload
// that runs on the peers.
type peerColumn struct {
	header string
	keys   []string
}

// limitCounterparts pairs each limit with the pglease metric it bounds.
var limitCounterparts = []struct{ limit, pglease string }{
	{limitCopy, "publish-batch"},
	{limitInsertSelect, "publish-batch"},
	{limitCopy100, "publish-batch"},
	{limitCommits, "publish-concurrent"},
	{limitLatencyP50, "latency-p50"},
	{limitLatencyP99, "latency-p99"},
}

// goal is one performance goal: a bound on the ratio of pglease's median
// to another backend's (vs set), or on pglease's median itself.
type goal struct {
	text       string
	backend    string // whose metric key is judged; empty: pglease
	key        string // pglease's metric
	vs, vsKey  string // the other backend and its metric; empty vs: none
	atLeast    float64
	atMost     float64 // 0: no upper bound
	targetText string  // the target as the chart's tick names it
}

// performanceGoals are the project's performance goals against the peers
// (ratios of medians of one `make bench` run), at fsync on.
var performanceGoals = []goal{
	{text: "consume ≥ 1.2× NATS JetStream (default settings)", key: "drain", vs: natsName, vsKey: "drain", atLeast: 1.2, targetText: "≥ 1.2× (goal)"},
	{text: "latency p99 ≤ 1.5 ms at 100 msg/s", key: "latency-p99", atMost: 1.5},
	{text: "latency p50 ≤ 0.6 ms at 100 msg/s", key: "latency-p50", atMost: 0.6},
	{text: "publish from 64 goroutines ≥ 1.2× Redis Streams (AOF everysec)", key: "publish-concurrent", vs: redisName, vsKey: "publish-concurrent", atLeast: 1.2, targetText: "≥ 1.2× (goal)"},
	{text: "same durability as Redis: pglease with synchronous_commit=off, publish from 64 goroutines ≥ 1.2× Redis Streams (AOF everysec)",
		backend: pgleaseAsyncName, key: "publish-concurrent", vs: redisName, vsKey: "publish-concurrent", atLeast: 1.2},
	{text: "publish in batches of 100 ≥ 1.5× watermill-sql v4", key: "publish-batch", vs: watermillSQLName, vsKey: "publish-batch", atLeast: 1.5},
	{text: "publish in batches of 100 ≥ 70 % of COPY rows/s (one statement)", key: "publish-batch", vs: limitsName, vsKey: limitCopy, atLeast: 0.7, targetText: "≥ 0.7× (goal)"},
}

// peerReport is what the report says about the peers and the limits.
type peerReport struct {
	cfg     config
	res     *results
	info    machineInfo
	columns []peerColumn
}

func newPeerReport(cfg config, res *results, info machineInfo) *peerReport {
	pr := &peerReport{cfg: cfg, res: res, info: info}
	for _, w := range selectedWorkloads(cfg) {
		if !w.peers {
			continue
		}
		c := peerColumn{}
		var shorts []string
		for i, m := range w.metrics {
			c.keys = append(c.keys, m.key)
			s := m.short
			if i > 0 {
				// "latency p50 / p99", not "latency p50 / latency p99".
				s = strings.TrimPrefix(s, commonFirstWord(w.metrics[0].short, s))
			}
			shorts = append(shorts, s)
		}
		c.header = fmt.Sprintf("%s (%s)", strings.Join(shorts, " / "), w.metrics[0].unit)
		pr.columns = append(pr.columns, c)
	}
	return pr
}

// commonFirstWord is the first word of a with the space after it, when b
// starts with it too; else "".
func commonFirstWord(a, b string) string {
	w, _, ok := strings.Cut(a, " ")
	if ok && strings.HasPrefix(b, w+" ") {
		return w + " "
	}
	return ""
}

// any reports whether the run measured anything the peers section shows:
// a peer, or the limits.
func (pr *peerReport) any() bool {
	return len(pr.peerNames()) > 0 || pr.hasLimits() || len(pr.info.skipped) > 0
}

// peerNames are the peers with a value or a failure in any column.
func (pr *peerReport) peerNames() []string {
	var names []string
	for _, p := range peers {
		if pr.hasAny(p.backend.name()) {
			names = append(names, p.backend.name())
		}
	}
	return names
}

func (pr *peerReport) hasAny(backend string) bool {
	for _, c := range pr.columns {
		for _, k := range c.keys {
			if len(pr.res.values[k][backend]) > 0 || len(pr.res.failures[k][backend]) > 0 {
				return true
			}
		}
	}
	return false
}

func (pr *peerReport) hasLimits() bool {
	for _, l := range limitCounterparts {
		if len(pr.res.values[l.limit][limitsName]) > 0 || len(pr.res.failures[l.limit][limitsName]) > 0 {
			return true
		}
	}
	return false
}

// med is the median of backend's rounds of metric key; false without any.
func (pr *peerReport) med(key, backend string) (float64, bool) {
	vs := pr.res.values[key][backend]
	if len(vs) == 0 {
		return 0, false
	}
	return median(vs), true
}

// rowBackends are the table's rows: pglease (direct, then through
// PgBouncer), watermill-sql, the peers, each when it has something to
// show, and the peers left out.
func (pr *peerReport) rowBackends() []string {
	var out []string
	for _, b := range []string{pgleaseName, pgbouncerName, watermillSQLName} {
		if pr.hasAny(b) {
			out = append(out, b)
		}
	}
	for _, p := range peers {
		b := p.backend.name()
		if _, skipped := pr.info.skipped[b]; skipped || pr.hasAny(b) {
			out = append(out, b)
		}
	}
	return out
}

// describe names backend with its versions, for the table.
func (pr *peerReport) describe(backend string) string {
	i := pr.info
	switch backend {
	case pgleaseName:
		return "pglease"
	case pgbouncerName:
		return "pglease through PgBouncer"
	case pgleaseAsyncName:
		return "pglease, synchronous_commit=off on its pool's connections"
	case watermillSQLName:
		return "watermill-sql " + orUnknown(i.watermillSQL) + " (pgx adapter)"
	case natsName:
		return fmt.Sprintf("NATS JetStream (watermill-nats %s, nats-server %s embedded, file store)", orUnknown(i.watermillNATS), orUnknown(i.natsServer))
	case natsSyncName:
		return fmt.Sprintf("NATS JetStream, sync always (watermill-nats %s, nats-server %s embedded, file store)", orUnknown(i.watermillNATS), orUnknown(i.natsServer))
	case redisName:
		return fmt.Sprintf("Redis Streams (watermill-redisstream %s, redis-server %s, AOF)", orUnknown(i.watermillRedis), orUnknown(i.redisServer))
	case limitsName:
		return "PostgreSQL alone (limits: no Watermill, no Pub/Sub)"
	}
	return backend
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

// durability says what an acknowledged write of backend survives, and
// the chart's short version of it.
func (pr *peerReport) durability(backend string) (long, short string) {
	if p, ok := peerByName(backend); ok {
		return p.durability, p.short
	}
	// pglease, watermill-sql and the limits: the PostgreSQL server's.
	return postgresDurability(pr.info.fsync, pr.info.synchronousCommit)
}

// cell is backend's medians of column c: "—" when none of its metrics
// ran, "failed" for one whose every run failed.
func (pr *peerReport) cell(backend string, c peerColumn) string {
	var parts []string
	ran := false
	for _, k := range c.keys {
		switch v, ok := pr.med(k, backend); {
		case ok:
			parts = append(parts, formatValue(v))
			ran = true
		case len(pr.res.failures[k][backend]) > 0:
			parts = append(parts, "failed")
			ran = true
		default:
			parts = append(parts, notMeasured)
		}
	}
	if !ran {
		return notMeasured
	}
	return strings.Join(parts, " / ")
}

// limitsCell is the limits row's cell of column c: the limits that bound
// its metric.
func (pr *peerReport) limitsCell(c peerColumn) string {
	var parts []string
	for _, l := range limitCounterparts {
		if !slices.Contains(c.keys, l.pglease) {
			continue
		}
		m, ok := pr.metric(l.limit)
		if !ok {
			continue
		}
		v := "n/a"
		if x, ok := pr.med(l.limit, limitsName); ok {
			v = formatValue(x)
		}
		parts = append(parts, fmt.Sprintf("%s: %s %s", m.short, v, m.unit))
	}
	if len(parts) == 0 {
		return notMeasured
	}
	return strings.Join(parts, "; ")
}

// metric finds the metric of key among the workloads of the run.
func (pr *peerReport) metric(key string) (metric, bool) {
	for _, w := range workloads(pr.cfg) {
		for _, m := range w.metrics {
			if m.key == key {
				return m, true
			}
		}
	}
	return metric{}, false
}

// table is the peers table: a header and one line of cells per backend,
// with each backend's durability in full (long) or in a few words.
func (pr *peerReport) table(long bool) [][]string {
	header := []string{"backend", "durability"}
	for _, c := range pr.columns {
		header = append(header, c.header)
	}
	out := [][]string{header}
	durability := func(b string) string {
		l, s := pr.durability(b)
		if long {
			return l
		}
		return s
	}
	for _, b := range pr.rowBackends() {
		line := []string{pr.describe(b), durability(b)}
		if reason, skipped := pr.info.skipped[b]; skipped && !pr.hasAny(b) {
			for range pr.columns {
				line = append(line, "not measured")
			}
			line[1] = "not measured: " + reason
			out = append(out, line)
			continue
		}
		for _, c := range pr.columns {
			line = append(line, pr.cell(b, c))
		}
		out = append(out, line)
	}
	if pr.hasLimits() {
		line := []string{pr.describe(limitsName), durability(limitsName)}
		for _, c := range pr.columns {
			line = append(line, pr.limitsCell(c))
		}
		out = append(out, line)
	}
	return out
}

// limitsTable: each limit, its median, and pglease's ratio to it.
func (pr *peerReport) limitsTable() [][]string {
	out := [][]string{{"limit of the server", "unit", "median", "pglease's counterpart", "pglease ÷ limit"}}
	for _, l := range limitCounterparts {
		m, ok := pr.metric(l.limit)
		if !ok {
			continue
		}
		lim, okL := pr.med(l.limit, limitsName)
		if !okL && len(pr.res.failures[l.limit][limitsName]) == 0 {
			continue
		}
		value, ratio := "n/a", "n/a"
		if okL {
			value = formatValue(lim)
		}
		pm, _ := pr.metric(l.pglease)
		counterpart := pm.label
		if pg, ok := pr.med(l.pglease, pgleaseName); ok {
			counterpart = fmt.Sprintf("%s: %s %s", pm.label, formatValue(pg), pm.unit)
			if okL && lim > 0 {
				ratio = formatRatio(pg / lim)
			}
		}
		out = append(out, []string{m.label, m.unit, value, counterpart, ratio})
	}
	return out
}

// judgeGoal evaluates g on the medians: the value shown (a ratio, or
// pglease's median for an absolute goal) and "yes", "no" or why it was
// not judged.
func (pr *peerReport) judgeGoal(g goal) (pg, other, value, met string) {
	pg, other, value = "n/a", "", "n/a"
	backend := g.backend
	if backend == "" {
		backend = pgleaseName
	}
	pv, ok := pr.med(g.key, backend)
	if ok {
		pg = formatValue(pv)
	}
	x := pv
	if g.vs != "" {
		other = "n/a"
		ov, okO := pr.med(g.vsKey, g.vs)
		if okO {
			other = formatValue(ov)
		}
		if !ok || !okO || ov == 0 {
			return pg, other, value, "not measured"
		}
		x = pv / ov
		value = formatRatio(x)
	} else {
		if !ok {
			return pg, other, value, "not measured"
		}
		value = pg
	}
	if !durable(pr.info.fsync, pr.info.synchronousCommit) {
		return pg, other, value, "not judged: the server does not fsync every commit"
	}
	good := x >= g.atLeast && (g.atMost == 0 || x <= g.atMost)
	if good {
		return pg, other, value, "yes"
	}
	return pg, other, value, "no"
}

// goalsTable: every performance goal with its inputs and verdict.
func (pr *peerReport) goalsTable() [][]string {
	out := [][]string{{"goal", "pglease", "other", "ratio or value", "met"}}
	for _, g := range performanceGoals {
		pg, other, value, met := pr.judgeGoal(g)
		if other != "" {
			m, _ := pr.metric(g.vsKey)
			other = fmt.Sprintf("%s (%s)", other, g.vs)
			if m.unit != "" {
				other = fmt.Sprintf("%s %s", other, m.unit)
			}
		}
		out = append(out, []string{g.text, pg, other, value, met})
	}
	return out
}

// chartRows are the chart's bars for metric key: pglease against each
// peer, and against the limits that bound the metric. A performance goal
// on the pair sets the bar's target.
func (pr *peerReport) chartRows(m metric) []row {
	pg := pr.res.values[m.key][pgleaseName]
	if len(pg) == 0 {
		return nil
	}
	var out []row
	add := func(vs, vsKey, label, vsUnit string, better direction) {
		other := pr.res.values[vsKey][vs]
		if len(other) == 0 {
			return
		}
		x := row{m: m, pg: pg, ws: other, vs: vs, vsUnit: vsUnit, complete: true}
		x.m.better = better
		x.m.target = target{}
		x.m.short = "↳ vs " + label
		x.pgMed, x.wsMed = median(pg), median(other)
		x.ratio = x.pgMed / x.wsMed
		for _, g := range performanceGoals {
			if g.key == m.key && g.vs == vs && g.vsKey == vsKey && g.atLeast > 0 {
				x.m.target = target{kind: ratioAtLeast, value: g.atLeast, text: g.targetText}
				x.met = judge(x.m.target, x.pgMed, x.ratio)
			}
		}
		if x.met != "" && !durable(pr.info.fsync, pr.info.synchronousCommit) {
			x.met = ""
		}
		out = append(out, x)
	}
	for _, p := range peers {
		if p.backend.name() == pgleaseAsyncName {
			continue // pglease itself, at another setting: its goal is in the table
		}
		_, short := pr.durability(p.backend.name())
		add(p.backend.name(), m.key, fmt.Sprintf("%s (%s)", p.backend.name(), short), "", m.better)
	}
	for _, l := range limitCounterparts {
		if l.pglease != m.key {
			continue
		}
		lm, ok := pr.metric(l.limit)
		if !ok {
			continue
		}
		add(limitsName, l.limit, "PostgreSQL "+lm.short, lm.unit, lm.better)
	}
	return out
}

// roundsTable: every round of every backend of the peers table.
func (pr *peerReport) roundsTable() [][]string {
	out := [][]string{{"workload", "backend", "every round"}}
	for _, c := range pr.columns {
		for _, k := range c.keys {
			m, _ := pr.metric(k)
			for _, b := range pr.rowBackends() {
				if b == pgleaseName || b == watermillSQLName || b == pgbouncerName {
					continue // in the rounds of the main table
				}
				if vs := pr.res.values[k][b]; len(vs) > 0 {
					out = append(out, []string{m.label, b, roundList(vs) + " " + m.unit})
				}
			}
		}
	}
	for _, l := range limitCounterparts {
		m, ok := pr.metric(l.limit)
		if vs := pr.res.values[l.limit][limitsName]; ok && len(vs) > 0 {
			out = append(out, []string{m.label, limitsName, roundList(vs) + " " + m.unit})
		}
	}
	return out
}

// failures lists the failed runs of the peers and the limits.
func (pr *peerReport) failures() []string {
	var out []string
	var keys []string
	for _, c := range pr.columns {
		keys = append(keys, c.keys...)
	}
	for _, k := range keys {
		m, _ := pr.metric(k)
		for _, p := range peers {
			for _, f := range pr.res.failures[k][p.backend.name()] {
				out = append(out, fmt.Sprintf("- %s, %s: %s", m.label, p.backend.name(), f))
			}
		}
	}
	for _, l := range limitCounterparts {
		m, _ := pr.metric(l.limit)
		for _, f := range pr.res.failures[l.limit][limitsName] {
			out = append(out, fmt.Sprintf("- %s, %s: %s", m.label, limitsName, f))
		}
	}
	return slices.Compact(out)
}

// print writes the peers, limits and goals tables as text.
func (pr *peerReport) print(w io.Writer) {
	for i, t := range [][][]string{pr.table(false), pr.limitsTable(), pr.goalsTable()} {
		if len(t) < 2 {
			continue
		}
		if i > 0 {
			fmt.Fprintln(w)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, line := range t {
			fmt.Fprintln(tw, strings.Join(line, "\t"))
		}
		_ = tw.Flush()
	}
}

// markdown writes the peers section of results.md.
func (pr *peerReport) markdown(w io.Writer) {
	fmt.Fprintf(w, "## Peers\n\n")
	fmt.Fprintf(w, "The same workloads on the brokers a team choosing a Watermill backend weighs pglease against, in the same rounds as pglease and watermill-sql (medians; the durability column says what an acknowledged Publish survives), and the limits of the PostgreSQL server itself, measured in the same run.\n\n")
	markdownRows(w, pr.table(true))
	if !durable(pr.info.fsync, pr.info.synchronousCommit) {
		fmt.Fprintf(w, "\nThe PostgreSQL server of this run does not fsync every commit (%s): pglease and watermill-sql were measured with less durability than the peers that fsync. `make bench` runs its server with fsync on (`LOCALPG_DURABLE=1`).\n", pr.info.settings)
	}
	if t := pr.limitsTable(); len(t) > 1 {
		fmt.Fprintf(w, "\n### Limits of the server\n\n")
		fmt.Fprintf(w, "Rows of 64-byte payloads written into pglease's messages table (same columns, primary key and partitioning as the Publisher writes to) without pglease, each limit in a topic of its own, after a `CHECKPOINT`.\n\n")
		markdownRows(w, t)
	}
	fmt.Fprintf(w, "\n### Goals\n\n")
	markdownRows(w, pr.goalsTable())
}

// markdownRows writes t (a header and lines of cells) as a Markdown table.
func markdownRows(w io.Writer, t [][]string) {
	for i, line := range t {
		cells := make([]string, len(line))
		for j, c := range line {
			cells[j] = strings.ReplaceAll(c, "|", `\|`)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		if i == 0 {
			fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(line)))
		}
	}
}

// peerMethod are the lines of results.md's Method section on the peers
// and the limits.
func peerMethod(cfg config) []string {
	return []string{
		fmt.Sprintf("Peers (`-peers`, default %s): the publish, drain, latency and Router workloads also run on each peer, in the same rounds, after pglease and watermill-sql (the whole order reversed every other round). Each run of a peer starts a server of its own on 127.0.0.1 and a free port, with its files in a temporary directory, and stops it and removes the directory afterwards; the clock starts only once the server accepts connections and the topic's stream exists.", strings.Join(peerIDs(), ",")),
		"NATS JetStream: watermill-nats's primary package (`pkg/nats`) with JetStream, against a nats-server embedded in the benchmark's process (it shares the process's CPU with the clients). Streams (file storage, one per topic, created by watermill-nats's provisioning) exist before the clock starts, so the Publisher runs with `AutoProvision` off (on, it would ask for the stream on every Publish call); Publish waits for each message's JetStream ack. The Subscriber: `QueueGroupPrefix` and `DurablePrefix` `bench` (a durable consumer per stream, the consumer group), default `AckWaitTimeout`, synchronous acks (`AckAsync` off, the default), one subscription per topic. Two servers: the defaults (`sync_interval` 2 min) and `SyncAlways` (an fsync on every write).",
		"Redis Streams: watermill-redisstream with default configurations and consumer group `bench` (created at the start of the stream when the Subscriber subscribes; one XREADGROUP of one message and one XACK per message, as the library does), go-redis clients with their defaults, against Debian's redis-server as a process of its own with `appendonly yes`, `appendfsync everysec` and `save \"\"` (no RDB snapshots). `make bench` installs redis-server when it is missing (scripts/install-deps.sh redis); without it the peer is left out and the table says so.",
		fmt.Sprintf("Limits (PostgreSQL alone, no Watermill): in each round, into a fresh pglease schema's messages table, each after a `CHECKPOINT`: a binary COPY of %s rows in one statement; INSERT … SELECT of the same rows, read back from the table, in one statement; COPY of %d rows per statement and transaction from one connection for %s; %d connections each inserting one row per transaction (autocommit, prepared) for %s, as pgbench would with a one-INSERT script. Rows: topic, a fresh UUID, the 64-byte payload, no metadata; the other columns take their defaults, as with the Publisher.", thousands(cfg.backlog), cfg.batchSize, cfg.publishFor, cfg.publishers, cfg.publishFor),
		"Durability: pglease, watermill-sql and the limits are as durable as the PostgreSQL server's settings make every commit (see Machine); `make bench` starts its server with fsync, synchronous_commit and full_page_writes on (`LOCALPG_DURABLE=1` for localpg, internal/cmd/localpg), whereas the tests run theirs with all three off. Every store (PostgreSQL's data directory, the NATS store, Redis's AOF) is on the same disk of the same machine; no backend replicates.",
		"Goals: ratios of this run's medians; judged only when the server fsyncs every commit.",
	}
}

// fsyncNote is the chart subtitle's word on the server's durability.
func fsyncNote(info machineInfo) string {
	if info.fsync == "" {
		return ""
	}
	return " (fsync " + info.fsync + ", synchronous_commit " + info.synchronousCommit + ")"
}
