package svc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// These tests need no database.

const deadline = 10 * time.Second

// closedWithin reports whether c is closed within d.
func closedWithin(c <-chan struct{}, d time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(d):
		return false
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestStopCancelsAndWaits: Stop cancels the function's context and returns
// only once the function returned, however long it takes after the
// cancellation.
func TestStopCancelsAndWaits(t *testing.T) {
	var s Service
	cancelled := make(chan struct{})
	release := make(chan struct{})
	var returned atomic.Bool
	if !s.Start(context.Background(), func(ctx context.Context) {
		<-ctx.Done()
		close(cancelled)
		<-release // the function goes on after its context ended
		returned.Store(true)
	}) {
		t.Fatal("Start on a new Service returned false")
	}
	if !s.Started() {
		t.Fatal("Started() = false after Start")
	}
	stopped := make(chan struct{})
	go func() {
		s.Stop()
		close(stopped)
	}()
	if !closedWithin(cancelled, deadline) {
		t.Fatal("Stop did not cancel the function's context")
	}
	if isClosed(stopped) || isClosed(s.Done()) {
		t.Fatal("Stop returned (or Done closed) while the function still ran")
	}
	close(release)
	if !closedWithin(stopped, deadline) {
		t.Fatal("Stop did not return after the function returned")
	}
	if !returned.Load() {
		t.Fatal("Stop returned before the function did")
	}
	if !isClosed(s.Done()) {
		t.Fatal("Done not closed after Stop")
	}
}

// TestStopBeforeStart: Stop on a Service never started returns at once,
// closes Done, and the function of a later Start never runs.
func TestStopBeforeStart(t *testing.T) {
	var s Service
	done := s.Done() // taken before Stop: the same channel is closed
	s.Stop()
	if !isClosed(done) {
		t.Fatal("Done not closed by Stop before Start")
	}
	var ran atomic.Bool
	if s.Start(context.Background(), func(context.Context) { ran.Store(true) }) {
		t.Fatal("Start after Stop returned true")
	}
	s.Stop() // again: still fine
	if ran.Load() || s.Started() {
		t.Fatal("the function ran after Stop")
	}
}

// TestStartOnce: a second Start does not run its function.
func TestStartOnce(t *testing.T) {
	var s Service
	var runs atomic.Int32
	fn := func(ctx context.Context) {
		runs.Add(1)
		<-ctx.Done()
	}
	if !s.Start(context.Background(), fn) {
		t.Fatal("first Start returned false")
	}
	if s.Start(context.Background(), fn) {
		t.Fatal("second Start returned true")
	}
	s.Stop()
	if n := runs.Load(); n != 1 {
		t.Fatalf("the function ran %d times, want 1", n)
	}
}

// TestStopAfterReturn: a function that returned by itself closes Done;
// Stop then returns at once, and again on a second call.
func TestStopAfterReturn(t *testing.T) {
	var s Service
	s.Start(context.Background(), func(context.Context) {})
	if !closedWithin(s.Done(), deadline) {
		t.Fatal("Done not closed after the function returned")
	}
	for range 2 {
		stopped := make(chan struct{})
		go func() {
			s.Stop()
			close(stopped)
		}()
		if !closedWithin(stopped, deadline) {
			t.Fatal("Stop after the function returned did not return")
		}
	}
}

// TestParentEndsFunction: the function's context ends with the parent's;
// Done closes without Stop.
func TestParentEndsFunction(t *testing.T) {
	var s Service
	parent, cancel := context.WithCancel(context.Background())
	s.Start(parent, func(ctx context.Context) { <-ctx.Done() })
	if isClosed(s.Done()) {
		t.Fatal("Done closed while the function waits")
	}
	cancel()
	if !closedWithin(s.Done(), deadline) {
		t.Fatal("the function did not end with its parent context")
	}
	s.Stop()
}

// TestConcurrentStops: Stops called together all wait for the function,
// and all return once it returned.
func TestConcurrentStops(t *testing.T) {
	var s Service
	cancelled := make(chan struct{})
	release := make(chan struct{})
	s.Start(context.Background(), func(ctx context.Context) {
		<-ctx.Done()
		close(cancelled)
		<-release
	})
	const n = 8
	var wg sync.WaitGroup
	var returned atomic.Int32
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Stop()
			returned.Add(1)
		}()
	}
	if !closedWithin(cancelled, deadline) {
		t.Fatal("the function's context was not cancelled")
	}
	if r := returned.Load(); r != 0 {
		t.Fatalf("%d Stops returned while the function ran", r)
	}
	close(release)
	wg.Wait()
	if !isClosed(s.Done()) {
		t.Fatal("Done not closed after every Stop returned")
	}
}
