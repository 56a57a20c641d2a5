package pglease

import (
	"time"
)

// HeartbeatBuckets are the upper bounds of the heartbeat latency histogram
// of [SubscriberStats] (those of Prometheus's default buckets). A
// Subscriber copies them when it is created; changing the slice later
// does not affect it.
var HeartbeatBuckets = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// SubscriberStats are counters of one Subscriber since it was created, for
// metrics (the metrics package exports them to Prometheus). Counters only
// grow.
type SubscriberStats struct {
	ConsumerGroup string
	// Claims counts the (topic, partition) rows claimed; Takeovers those
	// of them taken from another Subscriber's expired session (a crashed
	// or paused owner). Rows claimed back from the Subscriber's own
	// earlier session (after a restart, a failover, a shard move or its
	// session's loss) are claims, not takeovers.
	Claims    uint64
	Takeovers uint64
	// Releases counts rows given back (subscription ended, Close, a
	// rebalance, an offsets reset).
	Releases uint64
	// FencedWrites counts commits and releases refused because another
	// session or an offsets reset had taken the row (ErrOwnershipLost).
	FencedWrites uint64
	// SessionsLost counts sessions found expired or deleted, or
	// self-fenced after heartbeats failed for the trust window.
	SessionsLost uint64
	// Resyncs counts the times the database was found to have gone back
	// in time (a failover to a standby that lagged, a restore): the
	// Subscriber dropped its positions and claimed its rows again
	// ([ErrDatabaseWentBack]). Each also counts in SessionsLost.
	Resyncs uint64
	// Delivered counts messages handed out (redeliveries included); Acked
	// and Nacked the outcomes.
	Delivered uint64
	Acked     uint64
	Nacked    uint64
	// Retried counts the failures the failure policy (Retry) recorded for
	// a next attempt; DeadLettered the messages it moved to their
	// dead-letter topic after their last attempt.
	Retried      uint64
	DeadLettered uint64
	// InFlight is the number of messages handed out now and not acked or
	// nacked yet, over all partitions (at most MaxInFlight per owned
	// partition).
	InFlight int64
	// HeadOfLineWait is the total time messages read and ready to go
	// waited for an earlier message of their ordering key (of the
	// partition, for one without a key) to be acknowledged, with
	// MaxInFlight above 1: the cost of the order kept. It grows when a few
	// keys take most messages, or when a Nack holds its key.
	HeadOfLineWait time.Duration
	// OwnedRows is the number of rows the Subscriber owns now.
	OwnedRows int
	// BufferedBytes is the part of MaxBufferedBytes in use now: the bytes
	// of messages read and not handed out yet, and of reads under way.
	BufferedBytes int64
	// Heartbeats holds the latency of successful heartbeats.
	Heartbeats LatencyHistogram

	// Maintainer tells whether this Subscriber is the maintainer now (see
	// MaintenanceConfig); MaintainerTerms counts the times it was elected.
	// The counters below grow only while it is.
	Maintainer      bool
	MaintainerTerms uint64
	// DelayedMoved counts delayed messages moved into their topics.
	DelayedMoved uint64
	// RetentionSkipped counts messages removed by retention before a
	// consumer group had acknowledged them (per group: a message two
	// groups had not consumed counts twice). Counted just before removal,
	// so a message acknowledged in that moment may be counted too.
	RetentionSkipped uint64
	// RetentionPartitionsCreated and RetentionPartitionsDropped count the
	// partitions of retention classes added and removed whole;
	// RetentionRowsDeleted the messages deleted one by one from the
	// partition of messages kept forever.
	RetentionPartitionsCreated uint64
	RetentionPartitionsDropped uint64
	RetentionRowsDeleted       uint64
	// SessionsDeleted counts expired sessions of any Subscriber deleted;
	// GroupsRemoved idle consumer groups whose offsets were removed.
	SessionsDeleted uint64
	GroupsRemoved   uint64
}

// LatencyHistogram is a cumulative histogram: Buckets[i] counts the
// observations at or below Bounds[i].
type LatencyHistogram struct {
	Count   uint64
	Sum     time.Duration
	Bounds  []time.Duration
	Buckets []uint64
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() SubscriberStats {
	st := s.engine.Stats()
	return SubscriberStats{
		ConsumerGroup:  st.ConsumerGroup,
		Claims:         st.Claims,
		Takeovers:      st.Takeovers,
		Releases:       st.Releases,
		FencedWrites:   st.FencedWrites,
		SessionsLost:   st.SessionsLost,
		Resyncs:        st.Resyncs,
		Delivered:      st.Delivered,
		Acked:          st.Acked,
		Nacked:         st.Nacked,
		Retried:        st.Retried,
		DeadLettered:   st.DeadLettered,
		InFlight:       st.InFlight,
		HeadOfLineWait: st.HeadOfLineWait,
		OwnedRows:      st.OwnedRows,
		BufferedBytes:  st.BufferedBytes,
		Heartbeats: LatencyHistogram{Count: st.Heartbeats.Count, Sum: st.Heartbeats.Sum,
			Bounds: st.Heartbeats.Bounds, Buckets: st.Heartbeats.Buckets},

		Maintainer:                 st.Maintainer,
		MaintainerTerms:            st.MaintainerTerms,
		DelayedMoved:               st.DelayedMoved,
		RetentionSkipped:           st.RetentionSkipped,
		RetentionPartitionsCreated: st.RetentionPartitionsCreated,
		RetentionPartitionsDropped: st.RetentionPartitionsDropped,
		RetentionRowsDeleted:       st.RetentionRowsDeleted,
		SessionsDeleted:            st.SessionsDeleted,
		GroupsRemoved:              st.GroupsRemoved,
	}
}
