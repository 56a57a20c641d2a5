//go:build stress

package pglease_test

import (
	"testing"
	"time"
)

// TestStressFrozenChurn is the long run of runFrozenChurn: more processes,
// Subscribers, subscriptions and topics, and three minutes of publishing
// and freezing, with the server jitter. Run it with `make stress`.
func TestStressFrozenChurn(t *testing.T) {
	runFrozenChurn(t, frozenChurn{
		procs: 5, subs: 3, slots: 3, topics: 24,
		run:          3 * time.Minute,
		publishEvery: 40 * time.Millisecond,
		freezers:     3,
		freezeGapMax: 800 * time.Millisecond,
		renewMax:     5 * time.Second,
		drainStall:   time.Minute,
		drainLimit:   15 * time.Minute,
		minClaims:    3000,
		jitter:       0.3,
		jitterMax:    50 * time.Millisecond,
	})
}
