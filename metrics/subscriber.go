package metrics

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pglease "github.com/pglease/watermill-pglease"
)

// SubscriberCollectorConfig configures a [SubscriberCollector]. The zero
// value is valid.
type SubscriberCollectorConfig struct {
	// ConstLabels are added to every metric of the Subscriber, next to
	// consumergroup. A registry refuses two collectors with the same
	// labels, so Subscribers of one group in one process need a label
	// that tells them apart, e.g. {"subscriber": "orders-worker"}. The
	// label name consumergroup is taken.
	ConstLabels prometheus.Labels
}

func (c SubscriberCollectorConfig) validate() error {
	if _, ok := c.ConstLabels["consumergroup"]; ok {
		return errors.New("SubscriberCollectorConfig.ConstLabels must not hold consumergroup, which is the Subscriber's")
	}
	return nil
}

// SubscriberCollector is a [prometheus.Collector] of the counters of one
// [pglease.Subscriber] ([pglease.Subscriber.Stats]): what this process's
// Subscriber claimed, released and delivered, and how long its heartbeats
// take. Every metric has the label consumergroup. Collecting reads memory
// only, no database. It is safe for concurrent use.
type SubscriberCollector struct {
	sub *pglease.Subscriber

	claims, takeovers, releases, fencedWrites, sessionsLost *prometheus.Desc
	delivered, acked, nacked                                *prometheus.Desc
	ownedRows, heartbeat                                    *prometheus.Desc
	resyncs, bufferedBytes                                  *prometheus.Desc
	inFlight, headOfLineWait                                *prometheus.Desc
	// The maintainer's (see pglease.MaintenanceConfig).
	maintainer, maintainerTerms, delayedMoved, retentionSkipped *prometheus.Desc
	partitionsCreated, partitionsDropped, rowsDeleted           *prometheus.Desc
	sessionsDeleted, groupsRemoved                              *prometheus.Desc
}

// NewSubscriberCollector returns a SubscriberCollector of sub. The error
// wraps [pglease.ErrInvalidConfig].
func NewSubscriberCollector(sub *pglease.Subscriber, config SubscriberCollectorConfig) (*SubscriberCollector, error) {
	if sub == nil {
		return nil, fmt.Errorf("%w: NewSubscriberCollector needs a *pglease.Subscriber, got nil", pglease.ErrInvalidConfig)
	}
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", pglease.ErrInvalidConfig, err)
	}
	labels := maps.Clone(config.ConstLabels)
	if labels == nil {
		labels = prometheus.Labels{}
	}
	labels["consumergroup"] = sub.Stats().ConsumerGroup
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, nil, labels)
	}
	return &SubscriberCollector{
		sub: sub,
		claims: desc("pglease_subscriber_claims_total",
			"(topic, partition) rows the Subscriber claimed, takeovers included."),
		takeovers: desc("pglease_subscriber_takeovers_total",
			"Rows the Subscriber claimed from another Subscriber's expired session (a crashed or paused owner)."),
		releases: desc("pglease_subscriber_releases_total",
			"Rows the Subscriber gave back: subscription ended, Close, a rebalance or an offsets reset."),
		fencedWrites: desc("pglease_subscriber_fenced_writes_total",
			"Offset commits and releases refused because another session or an offsets reset had taken the row (ErrOwnershipLost); the messages since the last commit are delivered again."),
		sessionsLost: desc("pglease_subscriber_sessions_lost_total",
			"Sessions of the Subscriber found expired or deleted, or self-fenced after heartbeats failed for the trust window; its rows are claimed again with a new session."),
		resyncs: desc("pglease_subscriber_resyncs_total",
			"Times the Subscriber found that the database went back in time (a failover to a standby that lagged, a restore) and claimed its rows again from the database's positions; what was acknowledged after them is delivered again."),
		bufferedBytes: desc("pglease_subscriber_buffered_bytes",
			"Bytes of messages the Subscriber read ahead and has not handed out yet (bounded by MaxBufferedBytes, plus one message)."),
		delivered: desc("pglease_subscriber_messages_delivered_total",
			"Messages handed out to handlers, redeliveries included."),
		acked: desc("pglease_subscriber_messages_acked_total",
			"Messages acked by handlers."),
		nacked: desc("pglease_subscriber_messages_nacked_total",
			"Messages nacked by handlers (delivered again after NackResendDelay)."),
		inFlight: desc("pglease_subscriber_messages_in_flight",
			"Messages handed out and not acked or nacked yet (at most MaxInFlight per owned partition)."),
		headOfLineWait: desc("pglease_subscriber_head_of_line_wait_seconds_total",
			"Time messages ready to go waited for an earlier message of their ordering key (MaxInFlight above 1)."),
		ownedRows: desc("pglease_subscriber_owned_rows",
			"(topic, partition) rows the Subscriber owns now."),
		heartbeat: desc("pglease_subscriber_heartbeat_duration_seconds",
			"Latency of the Subscriber's successful session heartbeats."),
		maintainer: desc("pglease_subscriber_maintainer",
			"1 while the Subscriber is the elected maintainer of its tables, else 0; one Subscriber of a database's tables has 1."),
		maintainerTerms: desc("pglease_subscriber_maintainer_terms_total",
			"Times the Subscriber was elected the maintainer."),
		delayedMoved: desc("pglease_maintenance_delayed_moved_total",
			"Delayed messages the maintainer moved into their topics when due."),
		retentionSkipped: desc("pglease_maintenance_retention_skipped_total",
			"Messages removed by retention before a consumer group acknowledged them, per group (the groups skip them)."),
		partitionsCreated: desc("pglease_maintenance_retention_partitions_created_total",
			"Partitions of retention classes the maintainer added."),
		partitionsDropped: desc("pglease_maintenance_retention_partitions_dropped_total",
			"Expired partitions of retention classes the maintainer dropped whole."),
		rowsDeleted: desc("pglease_maintenance_retention_rows_deleted_total",
			"Expired messages the maintainer deleted row by row from the partition of messages kept forever."),
		sessionsDeleted: desc("pglease_maintenance_sessions_deleted_total",
			"Expired consumer sessions the maintainer deleted."),
		groupsRemoved: desc("pglease_maintenance_groups_removed_total",
			"Idle consumer groups whose offsets the maintainer removed."),
	}, nil
}

// Describe implements [prometheus.Collector].
func (c *SubscriberCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.claims, c.takeovers, c.releases, c.fencedWrites, c.sessionsLost,
		c.resyncs, c.bufferedBytes, c.delivered, c.acked, c.nacked, c.inFlight, c.headOfLineWait, c.ownedRows, c.heartbeat,
		c.maintainer, c.maintainerTerms, c.delayedMoved, c.retentionSkipped, c.partitionsCreated,
		c.partitionsDropped, c.rowsDeleted, c.sessionsDeleted, c.groupsRemoved} {
		ch <- d
	}
}

// Collect implements [prometheus.Collector].
func (c *SubscriberCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.sub.Stats()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.claims, st.Claims)
	counter(c.takeovers, st.Takeovers)
	counter(c.releases, st.Releases)
	counter(c.fencedWrites, st.FencedWrites)
	counter(c.sessionsLost, st.SessionsLost)
	counter(c.resyncs, st.Resyncs)
	ch <- prometheus.MustNewConstMetric(c.bufferedBytes, prometheus.GaugeValue, float64(st.BufferedBytes))
	counter(c.delivered, st.Delivered)
	counter(c.acked, st.Acked)
	counter(c.nacked, st.Nacked)
	ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(st.InFlight))
	ch <- prometheus.MustNewConstMetric(c.headOfLineWait, prometheus.CounterValue, st.HeadOfLineWait.Seconds())
	ch <- prometheus.MustNewConstMetric(c.ownedRows, prometheus.GaugeValue, float64(st.OwnedRows))
	ch <- latencyHistogram(c.heartbeat, st.Heartbeats, st.Heartbeats.Bounds)
	maintainer := 0.0
	if st.Maintainer {
		maintainer = 1
	}
	ch <- prometheus.MustNewConstMetric(c.maintainer, prometheus.GaugeValue, maintainer)
	counter(c.maintainerTerms, st.MaintainerTerms)
	counter(c.delayedMoved, st.DelayedMoved)
	counter(c.retentionSkipped, st.RetentionSkipped)
	counter(c.partitionsCreated, st.RetentionPartitionsCreated)
	counter(c.partitionsDropped, st.RetentionPartitionsDropped)
	counter(c.rowsDeleted, st.RetentionRowsDeleted)
	counter(c.sessionsDeleted, st.SessionsDeleted)
	counter(c.groupsRemoved, st.GroupsRemoved)
}

// latencyHistogram converts h, whose Buckets[i] counts the observations at
// or below bounds[i], to a Prometheus histogram.
func latencyHistogram(d *prometheus.Desc, h pglease.LatencyHistogram, bounds []time.Duration) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Buckets))
	for i := range min(len(h.Buckets), len(bounds)) {
		buckets[bounds[i].Seconds()] = h.Buckets[i]
	}
	m, err := prometheus.NewConstHistogram(d, h.Count, h.Sum.Seconds(), buckets)
	if err != nil {
		return prometheus.NewInvalidMetric(d, err)
	}
	return m
}
