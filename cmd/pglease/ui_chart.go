package main

import (
	"context"
	"fmt"
	"html/template"
	"strings"
	"sync"
	"time"

	"github.com/pglease/watermill-pglease/admin"
)

// lagSample is a group's total lag at one moment.
type lagSample struct {
	At         time.Time
	Lag        int64
	MaxSeconds float64
}

// lagSampler reads every group's lag at an interval and keeps the last
// samples of each, for the charts. It is safe for concurrent use.
type lagSampler struct {
	insp *admin.Inspector
	keep int

	mu     sync.Mutex
	groups map[string][]lagSample
	// The latest sample's rows folded per group (members not counted),
	// when it was read and how long the read took.
	latest   []groupSummary
	latestAt time.Time
	took     time.Duration
}

func newLagSampler(insp *admin.Inspector, keep int) *lagSampler {
	return &lagSampler{insp: insp, keep: keep, groups: map[string][]lagSample{}}
}

// samplerDutyFactor bounds the database time the sampler takes: after a
// read that took d it waits at least samplerDutyFactor * d, so a lag read
// of many rows never takes more than a fifth of one connection's time.
const samplerDutyFactor = 5

// run samples until ctx ends: at once, then every interval (longer when
// a read is slow, see samplerDutyFactor).
func (l *lagSampler) run(ctx context.Context, every time.Duration) {
	for {
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, max(every, time.Minute))
		_ = l.sample(sctx)
		cancel()
		wait := max(every, samplerDutyFactor*time.Since(start))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// sample reads the lag of every group once and records its totals.
func (l *lagSampler) sample(ctx context.Context) error {
	start := time.Now()
	lag, err := l.insp.Lag(ctx, admin.LagFilter{})
	if err != nil {
		return err
	}
	now := time.Now()
	summary := summarize(lag, nil)
	totals := map[string]lagSample{}
	for _, r := range lag {
		s := totals[r.ConsumerGroup]
		s.At = now
		s.Lag += r.Lag
		s.MaxSeconds = max(s.MaxSeconds, r.LagSeconds)
		totals[r.ConsumerGroup] = s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latest, l.latestAt, l.took = summary, now, now.Sub(start)
	for g := range l.groups {
		if _, ok := totals[g]; !ok {
			delete(l.groups, g)
		}
	}
	for g, s := range totals {
		series := l.groups[g]
		series = append(series, s)
		if len(series) > l.keep {
			series = series[len(series)-l.keep:]
		}
		l.groups[g] = series
	}
	return nil
}

// summary returns the latest sample's groups (nil before the first),
// when it was read and how long the read took.
func (l *lagSampler) summary() ([]groupSummary, time.Time, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]groupSummary(nil), l.latest...), l.latestAt, l.took
}

// series returns a copy of a group's samples, oldest first.
func (l *lagSampler) series(group string) []lagSample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lagSample(nil), l.groups[group]...)
}

// lagChart draws a group's lag over time as an SVG line chart.
func lagChart(samples []lagSample) template.HTML {
	const (
		w, h             = 720.0, 180.0
		left, right      = 60.0, 10.0
		top, bottom      = 10.0, 30.0
		plotW, plotH     = w - left - right, h - top - bottom
		fontAttrs        = `font-size="11" fill="#555"`
		noSamplesMessage = "no samples yet: the server samples the lag while it runs"
	)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" id="lag-chart" viewBox="0 0 %g %g" width="%g" height="%g" role="img" aria-label="lag over time">`, w, h, w, h)
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="#fafafa" stroke="#ccc"/>`, left, top, plotW, plotH)
	if len(samples) == 0 {
		fmt.Fprintf(&b, `<text x="%g" y="%g" %s>%s</text></svg>`, left+10, top+plotH/2, fontAttrs, noSamplesMessage)
		return template.HTML(b.String())
	}
	var peak int64 = 1
	for _, s := range samples {
		peak = max(peak, s.Lag)
	}
	t0, t1 := samples[0].At, samples[len(samples)-1].At
	span := t1.Sub(t0).Seconds()
	x := func(t time.Time) float64 {
		if span <= 0 {
			return left + plotW
		}
		return left + plotW*t.Sub(t0).Seconds()/span
	}
	y := func(v int64) float64 { return top + plotH - plotH*float64(v)/float64(peak) }
	var pts []string
	for _, s := range samples {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.At), y(s.Lag)))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#c0392b" stroke-width="2" points="%s"/>`, strings.Join(pts, " "))
	if len(samples) == 1 {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="#c0392b"/>`, x(samples[0].At), y(samples[0].Lag))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="end" %s>%d</text>`, left-4, top+10, fontAttrs, peak)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="end" %s>0</text>`, left-4, top+plotH, fontAttrs)
	fmt.Fprintf(&b, `<text x="%g" y="%g" %s>%s</text>`, left, h-8, fontAttrs, t0.UTC().Format("15:04:05"))
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="end" %s>%s UTC (%d samples, last %d)</text>`, w-right, h-8, fontAttrs,
		t1.UTC().Format("15:04:05"), len(samples), samples[len(samples)-1].Lag)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
