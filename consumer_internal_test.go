package pglease

import (
	"testing"
	"time"
)

// These tests need no database.

// TestPendingPoll: a hold is re-polled within pendingFastCap for
// pendingFastFor, then counts as a stall once and backs off up to the slow
// interval; a reset starts the next hold afresh, so short holds never add
// up to a stall.
func TestPendingPoll(t *testing.T) {
	t.Parallel()
	type step struct {
		at      time.Duration // since the start of the test
		reset   bool          // a read returned messages (or nothing held back) first
		stalled bool
		maxWait time.Duration // the wait returned is at most this
	}
	for _, tc := range []struct {
		name  string
		slow  time.Duration
		steps []step
	}{
		{name: "a long hold stalls once and backs off", slow: 5 * time.Second, steps: []step{
			{at: 0, maxWait: pendingFastFirst},
			{at: 500 * time.Millisecond, maxWait: pendingFastCap},
			{at: 1001 * time.Millisecond, stalled: true, maxWait: 5 * time.Second},
			{at: 1100 * time.Millisecond, maxWait: 5 * time.Second},
		}},
		{name: "short holds each start afresh", slow: 5 * time.Second, steps: []step{
			{at: 0, maxWait: pendingFastFirst},
			{at: 80 * time.Millisecond, maxWait: pendingFastCap},
			{at: 900 * time.Millisecond, reset: true, maxWait: pendingFastFirst},
			{at: 980 * time.Millisecond, maxWait: pendingFastCap},
			{at: 1800 * time.Millisecond, reset: true, maxWait: pendingFastFirst},
			{at: 2700 * time.Millisecond, maxWait: pendingFastCap},
		}},
		{name: "a slow interval no longer than the fast cap never stalls", slow: 10 * time.Millisecond, steps: []step{
			{at: 0, maxWait: pendingFastFirst},
			{at: 2 * time.Second, maxWait: pendingFastCap},
			{at: 3 * time.Second, maxWait: pendingFastCap},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			p := newPendingPoll(tc.slow)
			for i, s := range tc.steps {
				if s.reset {
					p.reset()
				}
				wait, stalled := p.held(start.Add(s.at))
				if stalled != s.stalled || wait > s.maxWait || wait <= 0 {
					t.Fatalf("step %d at %s: wait %s, stalled %v; want at most %s, stalled %v",
						i, s.at, wait, stalled, s.maxWait, s.stalled)
				}
			}
		})
	}
	// Once stalled, the waits grow to the slow interval.
	p := newPendingPoll(5 * time.Second)
	start := time.Now()
	p.held(start)
	p.held(start.Add(2 * time.Second))
	var wait time.Duration
	for range 20 {
		wait, _ = p.held(start.Add(3 * time.Second))
	}
	if wait < 2500*time.Millisecond {
		t.Fatalf("wait %s after a long stall, want half of the slow interval at least", wait)
	}
}
