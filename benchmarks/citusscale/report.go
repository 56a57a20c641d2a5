package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// render writes the results as markdown.
func render(o options, rs []result) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# pglease on a simulated Citus cluster\n\n")
	fmt.Fprintf(&b, "Written by `make bench-citus` (benchmarks/citusscale) on %s, %s, %d CPUs, %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(&b, "Each node (the coordinator, each worker; the one server of plain PostgreSQL) and each client process in a control group "+
		"of its own with a quota of %g CPU; a proxy in front of each node delays each direction by %s (the coordinator reaches the workers, "+
		"and the clients the coordinator, through them). %d topics; %d publisher and %d consumer processes per worker (plain: per server), "+
		"each with its share of the topics; phases of %s. Servers with fsync off.\n\n",
		o.cpu, o.delay, o.topics, o.procs, o.procs, o.duration)
	if len(o.citusSettings) > 0 {
		fmt.Fprintf(&b, "Citus nodes with %v.\n\n", o.citusSettings)
	}
	for _, r := range rs {
		if !r.quotas {
			fmt.Fprintf(&b, "**%s ran without quotas**: %s.\n\n", configName(r.workers), r.quotaNote)
		}
	}
	b.WriteString("The quotas cap each node; they do not reserve a core for it. The machine is shared: the load average " +
		"(1 minute) at the end of each phase is next to each figure; a node below its quota while the others wait on it " +
		"means the machine had no room. Compare ratios within one run.\n\n")

	var one *result
	for i := range rs {
		if rs[i].workers == 1 {
			one = &rs[i]
		}
	}
	ratio := func(v, base float64) string {
		if base <= 0 {
			return ""
		}
		return fmt.Sprintf(" (%.2f×)", v/base)
	}
	b.WriteString("## Throughput and latency\n\n")
	b.WriteString("Published: flat out, batches of " + fmt.Sprint(o.batch) + " per call, no consumer. Consumed: that backlog drained by one group. " +
		"Latency: from the Publish call to the delivery, one message per call at a quarter of the lower of the two rates (a publisher that falls behind skips ticks). × is against 1 worker.\n\n")
	if o.publishOnly {
		b.WriteString("Run with -publish-only: the publish phases only (consumed, latency, idle and heartbeats not measured).\n\n")
	}
	if o.route {
		b.WriteString("Published, routed: the same publishers again, with PublisherConfig.RouteToWorkers (each topic's calls sent to its worker); " +
			"in brackets against the same run's published/s. The backlog drained is both phases'.\n\n")
	}
	b.WriteString("| cluster | published/s | published/s, routed | consumed/s | p50 | p99 | latency at msg/s | load: publish / routed / consume / latency |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		pr, rr, cr := "", "–", ""
		if one != nil && r.workers > 1 {
			pr, cr = ratio(r.publishRate, one.publishRate), ratio(r.consumeRate, one.consumeRate)
		}
		if r.routedRate > 0 {
			rr = fmt.Sprintf("%.0f", r.routedRate)
			if one != nil && r.workers > 1 {
				rr += ratio(r.routedRate, one.routedRate)
			}
			rr += fmt.Sprintf(" [%.2f×]", r.routedRate/r.publishRate)
		}
		fmt.Fprintf(&b, "| %s | %.0f%s | %s | %.0f%s | %s | %s | %.0f | %.2f / %.2f / %.2f / %.2f |\n",
			configName(r.workers), r.publishRate, pr, rr, r.consumeRate, cr, ms(r.p50), ms(r.p99), r.latencyRate, r.pub.load, r.rpub.load, r.cons.load, r.lat.load)
	}
	b.WriteString("\n## CPU per node\n\n")
	b.WriteString("Each node's CPU time in the phase as a share of its quota, and its committed transactions per second " +
		"and the connections opened to it per second (pg_stat_database, which the servers update about once a second: approximate). Clients: the client processes' CPU together, in CPUs.\n\n")
	maxNodes := 0
	for _, r := range rs {
		maxNodes = max(maxNodes, len(r.nodes))
	}
	b.WriteString("| cluster | phase |")
	for i := range maxNodes {
		if i == 0 {
			b.WriteString(" coordinator (or server) |")
		} else {
			fmt.Fprintf(&b, " worker %d |", i)
		}
	}
	b.WriteString(" clients |\n|---|---|" + strings.Repeat("---|", maxNodes+1) + "\n")
	for _, r := range rs {
		for _, ph := range []struct {
			name string
			p    phase
		}{{"publish", r.pub}, {"publish, routed", r.rpub}, {"consume", r.cons}, {"latency", r.lat}, {"idle", r.idle}} {
			if ph.p.wall == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s |", configName(r.workers), ph.name)
			for i := range maxNodes {
				if i >= len(r.nodes) {
					b.WriteString(" |")
					continue
				}
				n := r.nodes[i]
				cpu := "–"
				if r.quotas {
					cpu = fmt.Sprintf("%.0f%%", 100*ph.p.cores(n)/o.cpu)
				}
				fmt.Fprintf(&b, " %s, %.0f xact/s, %.1f conn/s |", cpu, float64(ph.p.xacts[n])/ph.p.wall.Seconds(),
					float64(max(0, ph.p.sessions[n]))/ph.p.wall.Seconds())
			}
			fmt.Fprintf(&b, " %.2f |\n", ph.p.client.Seconds()/ph.p.wall.Seconds())
		}
	}
	if !o.publishOnly {
		b.WriteString("\n## Heartbeats\n\n")
		fmt.Fprintf(&b, "%d connections updating one row by primary key of a 100-row table at fillfactor 10 (as a heartbeat of the sessions table), "+
			"a reference table on Citus (a two-phase commit on every node), for %s: beats per second, each node's CPU per beat, "+
			"and what 5,000 Subscribers (a beat each every 3.3 s, the default SessionTTL of 10 s: 1,500 a second) would take of each node's quota.\n\n",
			hbClients, o.duration)
		b.WriteString("| cluster | beats/s | mean ms | CPU per beat, per node (ms) | 5,000 Subscribers, share of the quota per node |\n|---|---|---|---|---|\n")
		for _, r := range rs {
			rate := float64(r.beatCount) / r.beats.wall.Seconds()
			var per, share []string
			for _, n := range r.nodes {
				if !r.quotas || r.beatCount == 0 {
					per, share = append(per, n+" –"), append(share, n+" –")
					continue
				}
				ms := r.beats.cpu[n].Seconds() * 1000 / float64(r.beatCount)
				per = append(per, fmt.Sprintf("%s %.2f", n, ms))
				share = append(share, fmt.Sprintf("%s %.0f%%", n, 100*1500*ms/1000/o.cpu))
			}
			mean := 0.0
			if r.beatCount > 0 {
				mean = float64(hbClients) * r.beats.wall.Seconds() * 1000 / float64(r.beatCount)
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.2f | %s | %s |\n", configName(r.workers), rate, mean, strings.Join(per, ", "), strings.Join(share, ", "))
		}
	}
	b.WriteString("\n## Where the time goes\n\n")
	b.WriteString("The statements that took the most execution time on each node in each phase (pg_stat_statements, " +
		"`track = all`; on the coordinator a statement's time includes waiting for the workers): calls per second, " +
		"mean milliseconds, and the statement.\n")
	for _, r := range rs {
		for _, ph := range []struct {
			name string
			p    phase
		}{{"publish", r.pub}, {"publish, routed", r.rpub}, {"consume", r.cons}, {"latency", r.lat}, {"idle", r.idle}, {"heartbeats", r.beats}} {
			if ph.p.wall == 0 {
				continue
			}
			fmt.Fprintf(&b, "\n%s, %s:\n\n| node | calls/s | mean ms | statement |\n|---|---|---|---|\n", configName(r.workers), ph.name)
			for _, n := range r.nodes {
				for _, st := range ph.p.top[n] {
					mean := 0.0
					if st.calls > 0 {
						mean = st.totalMs / float64(st.calls)
					}
					q := st.query
					if len(q) > 140 {
						q = q[:140] + "…"
					}
					fmt.Fprintf(&b, "| %s | %.1f | %.2f | `%s` |\n", n, float64(st.calls)/ph.p.wall.Seconds(), mean,
						strings.ReplaceAll(q, "|", "\\|"))
				}
			}
		}
	}
	b.WriteString("\nTo reproduce: `make bench-citus` (flags: `cd benchmarks && go run ./citusscale -h`).\n")
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
