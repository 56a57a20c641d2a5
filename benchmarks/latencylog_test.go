package main

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLatencyLogCountsOnlyWhatWasSent(t *testing.T) {
	l := newLatencyLog(2)
	l.arrived("warm-up") // never noted as sent: not counted
	l.sent("a")
	l.sent("b")
	l.arrived("a")
	l.arrived("a") // twice: counted once
	if got := l.arrivals(); got != 1 {
		t.Fatalf("arrivals = %d, want 1", got)
	}
	select {
	case <-l.allIn:
		t.Fatal("all in after one of two")
	default:
	}
	l.arrived("b")
	select {
	case <-l.allIn:
	default:
		t.Fatal("not all in after both")
	}
	if l.percentile(1) < 0 {
		t.Fatal("negative latency")
	}
}

func TestPacedKeepsTheRateAndStopsAtTheFirstError(t *testing.T) {
	var calls []int
	start := time.Now()
	err := paced(context.Background(), 100, 5, func(i int) error {
		calls = append(calls, i)
		return nil
	})
	if err != nil || len(calls) != 5 {
		t.Fatalf("paced: %v, %d calls", err, len(calls))
	}
	// The fifth call is due 40 ms after the first.
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Fatalf("5 calls at 100/s took %s", d)
	}
	boom := errors.New("boom")
	calls = nil
	err = paced(context.Background(), 1000, 5, func(i int) error {
		calls = append(calls, i)
		if i == 2 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || len(calls) != 3 {
		t.Fatalf("paced: %v after %d calls, want boom after 3", err, len(calls))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := paced(ctx, 1, 3, func(int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
