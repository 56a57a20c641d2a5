package main

import (
	"testing"
	"time"
)

// Each round runs both cases, the retention case first in odd rounds and
// last in even ones.
func TestRetentionOrderAlternates(t *testing.T) {
	for run := 1; run <= 4; run++ {
		order := retentionOrder(5*time.Second, run)
		if len(order) != 2 || order[0].name == order[1].name {
			t.Fatalf("run %d: %v", run, order)
		}
		first := map[bool]string{true: "ttl", false: "none"}[run%2 == 1]
		if order[0].name != first {
			t.Errorf("run %d starts with %s, want %s", run, order[0].name, first)
		}
		for _, c := range order {
			if (c.name == "ttl") != (c.retention == 5*time.Second) || (c.name == "none") != (c.retention == 0) {
				t.Errorf("run %d: case %s has retention %s", run, c.name, c.retention)
			}
		}
	}
}

func TestRetentionSampleEvery(t *testing.T) {
	for _, tc := range []struct{ window, want time.Duration }{
		{20 * time.Second, time.Second},
		{3 * time.Minute, 4500 * time.Millisecond},
		{4 * time.Minute, 5 * time.Second},
		{time.Second, time.Second},
	} {
		if got := retentionSampleEvery(tc.window); got != tc.want {
			t.Errorf("retentionSampleEvery(%s) = %s, want %s", tc.window, got, tc.want)
		}
	}
}

// steadySamples are the samples of a made-up window of n seconds, one a
// second, publishing rate(i) messages in second i, 100 bytes each; the
// table holds the messages of the last keep seconds (all of them when
// keep is 0).
func steadySamples(n int, keep int, rate func(i int) int64) []sizeSample {
	perSecond := make([]int64, n+1)
	var published int64
	samples := []sizeSample{{}}
	for i := 1; i <= n; i++ {
		perSecond[i] = rate(i)
		published += perSecond[i]
		var held int64
		for j := i; j >= 1 && (keep == 0 || j > i-keep); j-- {
			held += perSecond[j]
		}
		samples = append(samples, sizeSample{at: time.Duration(i) * time.Second, bytes: 100 * held, published: published})
	}
	return samples
}

func TestSizeGrowth(t *testing.T) {
	const n = 60
	window, every, ttl := n*time.Second, time.Second, 5*time.Second
	steady := func(int) int64 { return 1000 }
	// The rate rises by half at the middle of the window.
	rising := func(i int) int64 {
		if i > n/2 {
			return 1500
		}
		return 1000
	}
	for _, tc := range []struct {
		name      string
		samples   []sizeSample
		normLo    float64 // sizeGrowth within [lo, hi]
		normHi    float64
		rawLo     float64 // halvesGrowth within [lo, hi]
		rawHi     float64
		isBounded bool
	}{
		{"bounded, steady rate", steadySamples(n, 6, steady), 0.99, 1.01, 0.99, 1.01, true},
		{"bounded, rate up by half", steadySamples(n, 6, rising), 0.95, 1.1, 1.45, 1.55, true},
		{"unbounded, steady rate", steadySamples(n, 0, steady), 1.9, 2.1, 1.9, 2.1, false},
		{"unbounded, rate up by half", steadySamples(n, 0, rising), 1.6, 1.7, 2.4, 2.6, false},
	} {
		got := sizeGrowth(tc.samples, window, ttl, every)
		if got < tc.normLo || got > tc.normHi {
			t.Errorf("%s: sizeGrowth = %.3f, want within [%.2f, %.2f]", tc.name, got, tc.normLo, tc.normHi)
		}
		if bounded := got <= retentionBoundedMargin; bounded != tc.isBounded {
			t.Errorf("%s: sizeGrowth %.3f counts as bounded: %v, want %v", tc.name, got, bounded, tc.isBounded)
		}
		raw := halvesGrowth(tc.samples, window)
		if raw < tc.rawLo || raw > tc.rawHi {
			t.Errorf("%s: halvesGrowth = %.3f, want within [%.2f, %.2f]", tc.name, raw, tc.rawLo, tc.rawHi)
		}
	}
}

func TestSizeGrowthEdges(t *testing.T) {
	if g := halvesGrowth(nil, time.Minute); g != 0 {
		t.Errorf("no samples: %v", g)
	}
	only := []sizeSample{{at: 10 * time.Second, bytes: 5}}
	if g := halvesGrowth(only, time.Minute); g != 0 {
		t.Errorf("first half only: %v", g)
	}
	// No messages published over a span: the sample is left out, not
	// divided by zero.
	idle := []sizeSample{{}, {at: time.Second, bytes: 100}, {at: 2 * time.Second, bytes: 100}}
	if got := rateNormalized(idle, 5*time.Second); len(got) != 0 {
		t.Errorf("rateNormalized without publishing: %v", got)
	}
	for _, p := range rateNormalized(steadySamples(10, 3, func(int) int64 { return 10 }), 3*time.Second) {
		if p.bytes <= 0 {
			t.Errorf("rateNormalized: %v", p)
		}
	}
	if got := retentionLookback(5*time.Second, time.Second); got != 6250*time.Millisecond {
		t.Errorf("retentionLookback(5s, 1s) = %s", got)
	}
	if got := retentionLookback(time.Second, 5*time.Second); got != 10*time.Second {
		t.Errorf("retentionLookback(1s, 5s) = %s", got)
	}
}

func TestRetentionFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "x"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.retentionFor != 3*time.Minute || cfg.retentionTTL != 5*time.Second || cfg.retentionPublishers != 4 || cfg.retentionMaxLag != 50_000 {
		t.Errorf("defaults: for %s, retention %s, publishers %d, max lag %d", cfg.retentionFor, cfg.retentionTTL, cfg.retentionPublishers, cfg.retentionMaxLag)
	}
	cfg, err = parseFlags([]string{"-dsn", "x", "-quick"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.retentionFor != 20*time.Second {
		t.Errorf("quick: retention-for %s, want 20s", cfg.retentionFor)
	}
	cfg, err = parseFlags([]string{"-dsn", "x", "-quick", "-retention-for", "1m", "-only", "retention"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.retentionFor != time.Minute {
		t.Errorf("quick with -retention-for 1m: %s", cfg.retentionFor)
	}
	for _, args := range [][]string{
		{"-retention-for", "0s"},
		{"-retention-for", "5m"},
		{"-retention", "500ms"},
		{"-retention-publishers", "0"},
		{"-retention-max-lag", "-1"},
	} {
		if _, err := parseFlags(append([]string{"-dsn", "x"}, args...)); err == nil {
			t.Errorf("%v was accepted", args)
		}
	}
}
