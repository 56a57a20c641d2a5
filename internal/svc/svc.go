// Package svc gives the background goroutines of pglease one start/stop
// shape: a [Service] runs one function on a goroutine of its own with a
// context, and [Service.Stop] cancels that context and waits for the
// function to return.
//
// Every background loop of a Subscriber (the session keeper's heartbeat,
// the LISTEN connection and its probe, the group member, the maintainer
// and its upkeep, the idle poller) runs as a Service, and Subscriber.Close
// stops them as a list, in order.
package svc

import (
	"context"
	"sync"
)

// Service runs one function on a goroutine of its own until its context
// ends. The zero value is ready to use and must not be copied after first
// use. Its methods are safe for concurrent use and may be called in any
// order, any number of times: Stop before Start makes a later Start do
// nothing; Stop after the function returned, or a second time, only
// waits for what is already done.
type Service struct {
	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when the function returned, or by Stop before Start
}

// doneLocked returns the done channel, made on first use. s.mu must be held.
func (s *Service) doneLocked() chan struct{} {
	if s.done == nil {
		s.done = make(chan struct{})
	}
	return s.done
}

// Start runs fn on a new goroutine with a context derived from parent,
// which ends when parent ends or Stop is called. It reports whether it
// started fn: false when the Service was started or stopped before.
func (s *Service) Start(parent context.Context, fn func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return false
	}
	s.started = true
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	done := s.doneLocked()
	go func() {
		defer close(done)
		defer cancel()
		fn(ctx)
	}()
	return true
}

// Stop cancels the context of the function and waits until it returned.
// Called before Start, it only makes Start do nothing from then on.
func (s *Service) Stop() {
	s.mu.Lock()
	s.stopped = true
	done := s.doneLocked()
	if !s.started {
		// Nothing runs, nothing will: Done is closed at once.
		select {
		case <-done:
		default:
			close(done)
		}
		s.mu.Unlock()
		return
	}
	cancel := s.cancel
	s.mu.Unlock()
	cancel()
	<-done
}

// Done returns a channel that is closed when the function has returned,
// or when Stop was called before Start.
func (s *Service) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doneLocked()
}

// Started reports whether Start ran the function (it may have returned
// since).
func (s *Service) Started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}
