package pglease_test

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestMaintainerElectionAcrossProcesses runs three processes, one
// Subscriber each (each of its own consumer group, SessionTTL 2s), that
// report their Stats().Maintainer as it changes (ReportMaintainer).
// Exactly one of them is the maintainer, and the maintainer's row names
// its live session. SIGKILLed, it is succeeded by another process within
// the TTL plus a second, not before its session expired; that one, closed
// with SIGTERM, is succeeded by the third at once (well under the TTL,
// before its session could expire), because Close releases the row; the
// third, closed, leaves the row free. The row's epoch grows with every
// election, and no two processes are ever the maintainer at the same time
// by their own reports (the times each one was seen to be the maintainer,
// on the clock of the machine they share, never overlap).
func TestMaintainerElectionAcrossProcesses(t *testing.T) {
	const ttl = 2 * time.Second
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	newPublisher(t, pool, adapter) // initializes the schema and its maintainer's row
	cfg := helperConfig{Schema: adapter.Schema, Topics: []string{"t"}, Mode: modeRouter,
		SessionTTL: ttl, PollInterval: pglease.DefaultPollInterval, ReportMaintainer: true}

	// The watch reads every line of the processes itself (not waitLine,
	// which drops the lines it does not wait for): a "maintainer" line may
	// come before "ready".
	w := &maintainerWatch{t: t, pool: pool, adapter: adapter}
	for _, name := range []string{"A", "B", "C"} {
		c := cfg.named(name)
		c.Group = "g" + name
		w.procs = append(w.procs, &watchedProc{h: launchHelper(t, c)})
	}
	w.pump(time.Minute, "every process to be ready", func() bool {
		for _, p := range w.procs {
			if !p.ready {
				return false
			}
		}
		return true
	})

	// One maintainer, and the database agrees.
	var first *watchedProc
	var row1 maintainerRowState
	w.pump(20*time.Second, "exactly one maintainer, holding the row", func() bool {
		first, row1 = w.agreed()
		return first != nil
	})
	confirmed := time.Now()
	require.Positive(t, row1.epoch)
	t.Logf("maintainer: %s (pid %d), epoch %d", first.name(), first.h.pid(), row1.epoch)

	// SIGKILL: another process takes over once the dead session expires.
	first.h.signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	w.killed(first, confirmed)
	var second *watchedProc
	var row2 maintainerRowState
	w.pump(ttl+10*time.Second, "another maintainer after SIGKILL, holding the row", func() bool {
		second, row2 = w.agreed()
		return second != nil
	})
	takeover := time.Since(killedAt)
	w.pump(10*time.Second, "the killed process to exit", func() bool { return first.exited })
	t.Logf("SIGKILL of %s: %s took over %s after the kill as the test saw it (report sampled %s after the kill, "+
		"row updated %s after the dead session's last known expiry), SessionTTL %s; epoch %d -> %d",
		first.name(), second.name(), takeover.Round(time.Millisecond), second.since.Sub(killedAt).Round(time.Millisecond),
		row2.updated.Sub(*row1.expires).Round(time.Millisecond), ttl, row1.epoch, row2.epoch)
	require.LessOrEqual(t, takeover, ttl+time.Second, "takeover after SIGKILL slower than SessionTTL + 1s")
	require.True(t, second.since.After(killedAt), "%s reported being the maintainer (at %s) before %s was killed (at %s)",
		second.name(), second.since.Format(time.StampMicro), first.name(), killedAt.Format(time.StampMicro))
	require.False(t, row2.updated.Before(*row1.expires),
		"the row was taken (at %s) from a session that had not expired yet (it expired no earlier than %s)",
		row2.updated.Format(time.StampMicro), row1.expires.Format(time.StampMicro))
	require.Greater(t, row2.epoch, row1.epoch, "the epoch did not grow with the takeover")

	// SIGTERM: Close releases the row, and the third process takes over
	// at once, before the closed session could have expired.
	var third *watchedProc
	for _, p := range w.procs {
		if p != first && p != second {
			third = p
		}
	}
	cur, row2 := w.agreed() // just before the signal: the lower bound of the session's expiry
	require.Equal(t, second, cur, "the maintainer changed by itself")
	second.h.signal(t, syscall.SIGTERM)
	termAt := time.Now()
	w.closing(second)
	var row3 maintainerRowState
	w.pump(ttl+10*time.Second, "the third process to take over after SIGTERM, holding the row", func() bool {
		var p *watchedProc
		p, row3 = w.agreed()
		return p == third
	})
	handover := time.Since(termAt)
	w.pump(30*time.Second, "the closed process to exit", func() bool { return second.exited })
	released := second.spans[len(second.spans)-1].to
	t.Logf("SIGTERM of %s (%s): %s took over %s after the signal as the test saw it (report sampled %s after %s "+
		"last reported being the maintainer), %s before the closed session would have expired; epoch %d -> %d",
		second.name(), second.closedLine, third.name(), handover.Round(time.Millisecond),
		third.since.Sub(released).Round(time.Millisecond), second.name(),
		row2.expires.Sub(row3.updated).Round(time.Millisecond), row2.epoch, row3.epoch)
	require.Less(t, handover, time.Second, "takeover after Close is not immediate")
	require.True(t, row3.updated.Before(*row2.expires),
		"the row was taken (at %s) only once the closed session could have expired (at %s): Close did not release it",
		row3.updated.Format(time.StampMicro), row2.expires.Format(time.StampMicro))
	require.Greater(t, row3.epoch, row2.epoch, "the epoch did not grow with the handover")

	// The last one closes: the row is free.
	third.h.signal(t, syscall.SIGTERM)
	w.closing(third)
	w.pump(30*time.Second, "the third process to exit", func() bool { return third.exited })
	row4 := readMaintainerRow(t, pool, adapter)
	require.Nil(t, row4.session, "the last maintainer closed without releasing the row")
	require.Equal(t, row3.epoch, row4.epoch)

	w.checkOverlaps()
	for _, p := range w.procs {
		var spans []string
		for _, s := range p.spans {
			spans = append(spans, fmt.Sprintf("[%s, %s]", s.from.Format("15:04:05.000"), s.to.Format("15:04:05.000")))
		}
		t.Logf("%s (pid %d) was the maintainer: %s", p.name(), p.h.pid(), strings.Join(spans, " "))
	}
	require.Equal(t, []int{1, 1, 1}, []int{len(first.spans), len(second.spans), len(third.spans)},
		"each process is elected once")
}

// maintainerWatch follows the helper processes of a test through their
// standard output, keeping what each one last reported with
// ReportMaintainer and the times it was seen to be the maintainer.
type maintainerWatch struct {
	t       *testing.T
	pool    *pgxpool.Pool
	adapter pglease.Tables
	procs   []*watchedProc
}

type watchedProc struct {
	h          *helperProc
	ready      bool
	closedLine string // "closed <duration>"
	// stopped is set once the test killed or terminated the process, exited
	// once its standard output ended.
	stopped, killed, exited bool
	is                      bool      // it last reported being the maintainer
	since                   time.Time // when it was first seen to be, if is
	spans                   []maintainerSpan
}

func (p *watchedProc) name() string { return p.h.cfg.Name }

// maintainerSpan is a time the process was seen to be the maintainer,
// from the first to the last sample that said so (or, for a killed
// process, to when the test last saw it hold the row).
type maintainerSpan struct{ from, to time.Time }

// killed records that p was SIGKILLed while reporting it was the
// maintainer, which the test saw, with the database's row, at confirmed.
func (w *maintainerWatch) killed(p *watchedProc, confirmed time.Time) {
	p.stopped, p.killed = true, true
	if p.is {
		p.spans = append(p.spans, maintainerSpan{p.since, confirmed})
		p.is = false
	}
	w.checkOverlaps()
}

func (w *maintainerWatch) closing(p *watchedProc) { p.stopped = true }

// maintainers returns the processes that report being the maintainer and were
// neither killed nor terminated.
func (w *maintainerWatch) maintainers() []*watchedProc {
	var out []*watchedProc
	for _, p := range w.procs {
		if p.is && !p.stopped && !p.exited {
			out = append(out, p)
		}
	}
	return out
}

// agreed returns the maintainer and the maintainer's row when exactly one
// process that is not being stopped reports being the maintainer and the
// row names a live session of that process; nil otherwise.
func (w *maintainerWatch) agreed() (*watchedProc, maintainerRowState) {
	ms := w.maintainers()
	if len(ms) != 1 {
		return nil, maintainerRowState{}
	}
	row := readMaintainerRow(w.t, w.pool, w.adapter)
	if !row.live || pidOfOwner(row.owner) != ms[0].h.pid() {
		return nil, row
	}
	return ms[0], row
}

// pump reads the processes' lines until cond holds, failing after timeout.
// cond is also checked every 5 ms, for the database's side.
func (w *maintainerWatch) pump(timeout time.Duration, what string, cond func() bool) {
	w.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		cases := []reflect.SelectCase{
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(tick.C)},
		}
		var from []*watchedProc
		for _, p := range w.procs {
			if !p.exited {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.h.lines)})
				from = append(from, p)
			}
		}
		chosen, v, ok := reflect.Select(cases)
		switch chosen {
		case 0:
			w.t.Fatalf("timed out after %s waiting for %s; %s", timeout, what, w.state())
		case 1:
			continue
		}
		p := from[chosen-2]
		if !ok {
			w.exited(p)
			continue
		}
		w.line(p, v.String())
	}
}

func (w *maintainerWatch) exited(p *watchedProc) {
	w.t.Helper()
	p.exited = true
	<-p.h.exited
	switch {
	case p.killed:
	case !p.stopped:
		w.t.Fatalf("helper %s exited (%v) by itself; log:\n%s", p.name(), p.h.err, tail(p.h.logs(), 50))
	default:
		require.NoError(w.t, p.h.err, "helper %s exit status", p.name())
		require.NotEmpty(w.t, p.closedLine, "helper %s exited without closing", p.name())
		require.False(w.t, p.is, "helper %s still reported being the maintainer after it closed", p.name())
	}
}

func (w *maintainerWatch) line(p *watchedProc, line string) {
	w.t.Helper()
	switch {
	case line == "ready":
		p.ready = true
	case strings.HasPrefix(line, "closed "):
		p.closedLine = line
	case strings.HasPrefix(line, "maintainer "):
		if p.killed {
			w.t.Fatalf("helper %s reported %q after the test saw it hold the row and killed it", p.name(), line)
		}
		f := strings.Fields(line)
		nanos := func(s string) time.Time {
			n, err := strconv.ParseInt(s, 10, 64)
			require.NoError(w.t, err, "helper %s: %q", p.name(), line)
			return time.Unix(0, n)
		}
		switch {
		case len(f) == 4 && f[1] == "true":
			require.False(w.t, p.is, "helper %s reported being the maintainer twice: %q", p.name(), line)
			p.is, p.since = true, nanos(f[2])
		case len(f) == 5 && f[1] == "false":
			require.True(w.t, p.is, "helper %s reported not being the maintainer twice: %q", p.name(), line)
			p.spans = append(p.spans, maintainerSpan{p.since, nanos(f[3])})
			p.is = false
		default:
			w.t.Fatalf("helper %s: unexpected line %q", p.name(), line)
		}
		w.checkOverlaps()
	}
}

// checkOverlaps fails if two processes were seen to be the maintainer at
// the same time: two of their spans overlap, or one's span holds the first
// sample of another's current term.
func (w *maintainerWatch) checkOverlaps() {
	w.t.Helper()
	type seen struct {
		p *watchedProc
		maintainerSpan
	}
	var all []seen
	for _, p := range w.procs {
		for _, s := range p.spans {
			all = append(all, seen{p, s})
		}
		if p.is {
			all = append(all, seen{p, maintainerSpan{p.since, p.since}})
		}
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.p != b.p && !a.from.After(b.to) && !b.from.After(a.to) {
				w.t.Fatalf("two maintainers at once: %s from %s to %s and %s from %s to %s; %s",
					a.p.name(), a.from.Format(time.StampMicro), a.to.Format(time.StampMicro),
					b.p.name(), b.from.Format(time.StampMicro), b.to.Format(time.StampMicro), w.state())
			}
		}
	}
}

func (w *maintainerWatch) state() string {
	var b strings.Builder
	for _, p := range w.procs {
		fmt.Fprintf(&b, "%s (pid %d): ready=%v stopped=%v exited=%v maintainer=%v", p.name(), p.h.pid(),
			p.ready, p.stopped, p.exited, p.is)
		if p.is {
			fmt.Fprintf(&b, " since %s", p.since.Format(time.StampMicro))
		}
		fmt.Fprintf(&b, " spans %d; ", len(p.spans))
	}
	row := readMaintainerRow(w.t, w.pool, w.adapter)
	fmt.Fprintf(&b, "row: %s", row)
	return b.String()
}

// maintainerRowState is the maintainer's row, with its session if any.
type maintainerRowState struct {
	session *string
	epoch   int64
	updated time.Time
	owner   string     // "" when there is no session row
	expires *time.Time // nil when there is no session row
	live    bool       // the session row exists and has not expired
}

func (r maintainerRowState) String() string {
	if r.session == nil {
		return fmt.Sprintf("free, epoch %d, updated %s", r.epoch, r.updated.Format(time.StampMicro))
	}
	s := fmt.Sprintf("session %s, epoch %d, updated %s, ", *r.session, r.epoch, r.updated.Format(time.StampMicro))
	if r.expires == nil {
		return s + "no session row"
	}
	return s + fmt.Sprintf("owner %s, expires %s, live %v", r.owner, r.expires.Format(time.StampMicro), r.live)
}

func readMaintainerRow(t testing.TB, pool *pgxpool.Pool, adapter pglease.Tables) maintainerRowState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r maintainerRowState
	var owner *string
	var live *bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT m.session_id::text, m.epoch, m.updated_at, s.owner, s.expires_at,
	s.expires_at > now()
FROM `+table(adapter, pglease.DefaultMaintenanceTable)+` m
LEFT JOIN `+table(adapter, pglease.DefaultConsumerSessionsTable)+` s ON s.id = m.session_id
WHERE m.name = 'maintainer'`).Scan(&r.session, &r.epoch, &r.updated, &owner, &r.expires, &live))
	if owner != nil {
		r.owner = *owner
	}
	r.live = live != nil && *live
	return r
}
