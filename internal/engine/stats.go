package engine

import (
	"sync/atomic"
	"time"
)

// Stats are a Subscriber's counters: the root package's SubscriberStats,
// which documents each.
type Stats struct {
	ConsumerGroup                                    string
	Claims, Takeovers, Releases, FencedWrites        uint64
	SessionsLost, Resyncs                            uint64
	Delivered, Acked, Nacked                         uint64
	Retried, DeadLettered                            uint64
	InFlight                                         int64
	HeadOfLineWait                                   time.Duration
	OwnedRows                                        int
	BufferedBytes                                    int64
	Heartbeats                                       Histogram
	Maintainer                                       bool
	MaintainerTerms, DelayedMoved                    uint64
	RetentionSkipped, RetentionPartitionsCreated     uint64
	RetentionPartitionsDropped, RetentionRowsDeleted uint64
	SessionsDeleted, GroupsRemoved                   uint64
}

// Histogram is a cumulative histogram: Buckets[i] counts the
// observations at or below Bounds[i].
type Histogram struct {
	Count   uint64
	Sum     time.Duration
	Bounds  []time.Duration
	Buckets []uint64
}

// subscriberStats are the live counters behind SubscriberStats.
type subscriberStats struct {
	claims, takeovers, releases, fenced, sessionsLost atomic.Uint64
	resyncs                                           atomic.Uint64
	delivered, acked, nacked                          atomic.Uint64
	retried, deadLettered                             atomic.Uint64
	maintainerTerms, delayedMoved, retentionSkipped   atomic.Uint64
	partitionsCreated, partitionsDropped, rowsDeleted atomic.Uint64
	sessionsDeleted, groupsRemoved                    atomic.Uint64
	hbCount, hbSumNanos                               atomic.Uint64
	inFlight, holWaitNanos                            atomic.Int64
	// reads counts the consumers' reads of messages; stalls the times a
	// consumer found rows held back for longer than pendingFastFor and
	// slowed its re-polls to PollInterval (tests only).
	reads  atomic.Uint64
	stalls atomic.Uint64
	// evicted counts the messages in-flight windows evicted, rereads the
	// reads of evicted messages (tests only).
	evicted   atomic.Uint64
	rereads   atomic.Uint64
	hbBounds  []time.Duration
	hbBuckets []atomic.Uint64
}

func newSubscriberStats(buckets []time.Duration) *subscriberStats {
	bounds := append([]time.Duration(nil), buckets...)
	return &subscriberStats{hbBounds: bounds, hbBuckets: make([]atomic.Uint64, len(bounds))}
}

func (s *subscriberStats) heartbeat(d time.Duration) {
	s.hbCount.Add(1)
	s.hbSumNanos.Add(uint64(max(d, 0)))
	for i, b := range s.hbBounds {
		if d <= b {
			s.hbBuckets[i].Add(1)
		}
	}
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	st := s.stats
	out := Stats{
		ConsumerGroup:  s.settings.Group,
		Claims:         st.claims.Load(),
		Takeovers:      st.takeovers.Load(),
		Releases:       st.releases.Load(),
		FencedWrites:   st.fenced.Load(),
		SessionsLost:   st.sessionsLost.Load(),
		Resyncs:        st.resyncs.Load(),
		Delivered:      st.delivered.Load(),
		Acked:          st.acked.Load(),
		Nacked:         st.nacked.Load(),
		Retried:        st.retried.Load(),
		DeadLettered:   st.deadLettered.Load(),
		InFlight:       st.inFlight.Load(),
		HeadOfLineWait: time.Duration(st.holWaitNanos.Load()),
		OwnedRows:      s.member.ownedRows(),
		BufferedBytes:  s.budget.buffered(),

		Maintainer:                 s.maint != nil && s.maint.active.Load(),
		MaintainerTerms:            st.maintainerTerms.Load(),
		DelayedMoved:               st.delayedMoved.Load(),
		RetentionSkipped:           st.retentionSkipped.Load(),
		RetentionPartitionsCreated: st.partitionsCreated.Load(),
		RetentionPartitionsDropped: st.partitionsDropped.Load(),
		RetentionRowsDeleted:       st.rowsDeleted.Load(),
		SessionsDeleted:            st.sessionsDeleted.Load(),
		GroupsRemoved:              st.groupsRemoved.Load(),
		Heartbeats: Histogram{
			Count:   st.hbCount.Load(),
			Sum:     time.Duration(st.hbSumNanos.Load()),
			Bounds:  append([]time.Duration(nil), st.hbBounds...),
			Buckets: make([]uint64, len(st.hbBounds)),
		},
	}
	for i := range st.hbBuckets {
		out.Heartbeats.Buckets[i] = st.hbBuckets[i].Load()
	}
	return out
}
