package engine

import (
	"testing"
	"time"
)

// TestFailureBackoff: the wait after the failure of attempt n is
// MinBackoff·2^(n-1), at most MaxBackoff, varied by ±Jitter and kept
// within MaxBackoff.
func TestFailureBackoff(t *testing.T) {
	p := &failurePolicy{RetrySettings: RetrySettings{MinBackoff: time.Second, MaxBackoff: 10 * time.Second}}
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		4: 8 * time.Second, 5: 10 * time.Second, 64: 10 * time.Second, 1 << 20: 10 * time.Second} {
		if got := p.backoff(n); got != want {
			t.Errorf("backoff(%d) = %s, want %s", n, got, want)
		}
	}
	p.Jitter = 0.1
	for _, tc := range []struct {
		random float64
		n      int
		want   time.Duration
	}{
		{0, 1, 900 * time.Millisecond},
		{0.5, 1, time.Second},
		{0.75, 2, 2100 * time.Millisecond},
		{0, 5, 9 * time.Second},
		{0.99, 5, 10 * time.Second}, // 10.98s, kept within MaxBackoff
	} {
		p.random = func() float64 { return tc.random }
		if got := p.backoff(tc.n); got != tc.want {
			t.Errorf("backoff(%d) with random %g = %s, want %s", tc.n, tc.random, got, tc.want)
		}
	}
}

// TestFailureExhausted: MaxAttempts 0 retries for ever; otherwise the
// failure of attempt MaxAttempts (or later) is the last.
func TestFailureExhausted(t *testing.T) {
	for _, tc := range []struct {
		max, n int
		want   bool
	}{{0, 1, false}, {0, 1000, false}, {3, 0, false}, {3, 2, false}, {3, 3, true}, {3, 4, true}, {1, 1, true}} {
		p := &failurePolicy{RetrySettings: RetrySettings{MaxAttempts: tc.max}}
		if got := p.exhausted(tc.n); got != tc.want {
			t.Errorf("MaxAttempts %d: exhausted(%d) = %v, want %v", tc.max, tc.n, got, tc.want)
		}
	}
}
