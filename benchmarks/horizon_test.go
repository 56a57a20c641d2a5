package main

import (
	"testing"
	"time"
)

// A delivery counts in the first window, in the last, or in neither; its
// latency goes with it.
func TestWindowCounter(t *testing.T) {
	w := &windowCounter{window: 10 * time.Second}
	w.add(time.Now(), time.Time{}) // before the run: not counted
	w.open(time.Minute)
	at := func(d time.Duration) time.Time { return w.start.Add(d) }
	w.add(at(0), at(-2*time.Millisecond))
	w.add(at(9*time.Second), at(9*time.Second-4*time.Millisecond))
	w.add(at(10*time.Second), time.Time{}) // neither
	w.add(at(49*time.Second), time.Time{}) // neither
	w.add(at(50*time.Second), at(50*time.Second-6*time.Millisecond))
	w.add(at(59*time.Second), time.Time{}) // no publish time: counted, no latency
	w.add(at(time.Minute), time.Time{})    // after the run
	start, end, p99 := w.rates()
	if start != 0.2 || end != 0.2 {
		t.Errorf("rates %v and %v, want 0.2 and 0.2", start, end)
	}
	if p99[0] != 4*time.Millisecond || p99[1] != 6*time.Millisecond {
		t.Errorf("p99 %v, want [4ms 6ms]", p99)
	}
}

func TestHotShare(t *testing.T) {
	before := tableReading{updates: 100, hot: 50}
	if got := hotShare(before, tableReading{updates: 300, hot: 200}); got != 75 {
		t.Errorf("hotShare = %v, want 75", got)
	}
	if got := hotShare(before, before); got != 0 {
		t.Errorf("hotShare without updates = %v, want 0", got)
	}
}

func TestCheckHorizonFlags(t *testing.T) {
	ok := config{horizonFor: 10 * time.Minute, horizonWindow: time.Minute, horizonRate: 1000, horizonMembers: 4}
	if err := checkHorizonFlags(ok); err != nil {
		t.Fatal(err)
	}
	wide := ok
	wide.horizonWindow = 6 * time.Minute
	if checkHorizonFlags(wide) == nil {
		t.Error("a window longer than half the run passed")
	}
}
