package main

import (
	"context"
	"sync"
	"time"
)

// latencyLog pairs the send time of each of total messages with its
// arrival, for the latency workload and the limits' latency floor.
type latencyLog struct {
	total int
	allIn chan struct{} // closed when total messages arrived

	mu     sync.Mutex
	sentAt map[string]time.Time
	lat    []time.Duration
}

func newLatencyLog(total int) *latencyLog {
	return &latencyLog{total: total, allIn: make(chan struct{}), sentAt: map[string]time.Time{},
		lat: make([]time.Duration, 0, total)}
}

// sent notes that the message id is sent now.
func (l *latencyLog) sent(id string) {
	l.mu.Lock()
	l.sentAt[id] = time.Now()
	l.mu.Unlock()
}

// arrived notes that the message id arrived now; one that was not noted as
// sent (a warm-up message) or arrived before is not counted.
func (l *latencyLog) arrived(id string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.sentAt[id]
	if !ok {
		return
	}
	delete(l.sentAt, id)
	l.lat = append(l.lat, now.Sub(t))
	if len(l.lat) == l.total {
		close(l.allIn)
	}
}

// arrivals is how many messages arrived so far.
func (l *latencyLog) arrivals() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lat)
}

// percentile of the latencies so far.
func (l *latencyLog) percentile(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return percentile(l.lat, p)
}

// paced calls send(i) for i from 0 to n-1 at rate calls per second, each
// at its time from the first call on (a late call does not move the later
// ones), and returns the first error or the context's.
func paced(ctx context.Context, rate, n int, send func(i int) error) error {
	interval := time.Second / time.Duration(rate)
	t0 := time.Now()
	for i := range n {
		if !sleepCtx(ctx, time.Until(t0.Add(time.Duration(i)*interval))) {
			return ctx.Err()
		}
		if err := send(i); err != nil {
			return err
		}
	}
	return nil
}
