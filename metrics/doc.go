// Package metrics exports pglease to Prometheus. It is a module of its own
// (github.com/pglease/watermill-pglease/metrics), so that the core module
// does not depend on the Prometheus client.
//
// Two collectors, each a [prometheus.Collector]:
//
//   - [Collector] reads an [admin.Inspector] on every scrape: what the
//     database says about every consumer group, whichever process
//     consumes. Register one per database, in one process (or a few);
//     every instance that registers it runs the same queries.
//   - [SubscriberCollector] reads [pglease.Subscriber.Stats]: what one
//     Subscriber of this process did. Register one per Subscriber; it
//     reads memory only.
//
// # Metrics
//
// Of [Collector], in the style of kafka_exporter (labels in braces):
//
//	pglease_consumergroup_lag{consumergroup, topic, partition}          messages not yet acked
//	pglease_consumergroup_lag_seconds{consumergroup, topic, partition}  age of the oldest of them, 0 without one
//	pglease_consumergroup_pending{consumergroup, topic, partition}      1: messages wait for an open publisher of the partition (Citus: the xmin horizon)
//	pglease_consumergroup_waiting{consumergroup, topic, partition}      messages that failed under Retry and wait for their next attempt (only when some do)
//	pglease_consumergroup_members{consumergroup}                        live sessions (Subscribers)
//	pglease_consumergroup_owned_rows{consumergroup}                     exported rows a live member owns
//	pglease_xmin_horizon_age_seconds                                    oldest writing transaction, 0 without one, NaN if hidden
//	pglease_xmin_horizon_age_known                                      0: one runs, but this role may not see its age
//	pglease_topic_partitions{topic}
//	pglease_topic_newest_message_timestamp_seconds{topic}
//	pglease_topic_messages{topic}                                       stored messages: exact up to 10,000, then the planner's estimate
//	pglease_up                                                          1: every query of the scrape succeeded
//	pglease_scrape_duration_seconds
//	pglease_scrape_skipped_series                                       series left out: labels that could not be exported
//	pglease_scrape_capped_series                                        series left out: past CollectorConfig.MaxSeries
//
// Of [SubscriberCollector], each with the label consumergroup:
//
//	pglease_subscriber_claims_total, pglease_subscriber_takeovers_total,
//	pglease_subscriber_releases_total, pglease_subscriber_fenced_writes_total,
//	pglease_subscriber_sessions_lost_total, pglease_subscriber_resyncs_total,
//	pglease_subscriber_messages_delivered_total, pglease_subscriber_messages_acked_total,
//	pglease_subscriber_messages_nacked_total,
//	pglease_subscriber_head_of_line_wait_seconds_total (counters),
//	pglease_subscriber_owned_rows, pglease_subscriber_buffered_bytes,
//	pglease_subscriber_messages_in_flight (gauges),
//	pglease_subscriber_heartbeat_duration_seconds (histogram, buckets [pglease.HeartbeatBuckets]).
//
// pglease_topic_messages is the depth of a poison topic to alert on, e.g.
// pglease_topic_messages{topic="orders.poison"} > 0. It counts each
// topic's messages through the primary key, reading at most 10,001
// entries per topic ([admin.Inspector.TopicMessages]); a topic that
// holds more reads as the planner's estimate from the table's
// statistics (at least 10,000). A topic emptied since an earlier scrape
// reads 0 rather than disappearing. With CollectorConfig.Topics only
// those topics are counted (0.25 ms for one); without, every topic's is
// (0.73 to 0.86 s a scrape on 100,000 topics, BenchmarkTopicMessages on a
// shared 2-core machine): name the topics you alert on.
//
// # The horizon's age and the scraping role
//
// PostgreSQL shows another role's backends' transaction start only to
// superusers and members of pg_read_all_stats. Without it the collector
// still finds the transaction that holds the horizon back, but not how
// long it has run ([admin.HorizonHolder].AgeKnown is false): then
// pglease_xmin_horizon_age_seconds is NaN (never 0, which would read as
// "nothing holds delivery back") and pglease_xmin_horizon_age_known is 0.
// A rule such as pglease_xmin_horizon_age_seconds > 300 does not fire on
// NaN, so alert on the known gauge as well, or grant the scraping role
// pg_read_all_stats:
//
//	GRANT pg_read_all_stats TO metrics_role;
//
// # Errors
//
// A failed query does not fail the scrape: its metrics are left out,
// pglease_up is 0 and the error goes to CollectorConfig.Logger. Returning
// an invalid metric instead would make the whole /metrics request fail
// (promhttp answers 500), hiding the Subscribers' counters and the
// process's own metrics exactly when the database is in trouble. Alert on
// pglease_up == 0.
//
// Names are label values, and a label must be UTF-8: a consumer group or
// topic of a SQL_ASCII database that is not is exported with its other
// bytes escaped as \xNN. A series whose labels still cannot be exported
// (two names that escape alike) is left out, logged and counted in
// pglease_scrape_skipped_series: one name never fails the scrape.
//
// # Cost and cardinality
//
// Counting the lag reads the index entries after each group's position,
// so a scrape costs more as the total lag grows; CollectorConfig.ScrapeTimeout
// (5 s) bounds it. Every (group, topic, partition) row is three series:
// with many topics, select the ones that matter with
// CollectorConfig.ConsumerGroups and CollectorConfig.Topics, which the
// database filters on. Sum over partitions in PromQL:
// sum by (consumergroup, topic) (pglease_consumergroup_lag).
//
// CollectorConfig.MaxSeries (10,000 by default) bounds the labelled
// series of one scrape, so that a database with very many topics or
// groups (a role that may write the topics table can create them) cannot
// make a scrape, or Prometheus, hold an unbounded number of series: past
// it the rest are left out, counted in pglease_scrape_capped_series and
// logged once. The bound is on what is exported: the queries still read
// every row of the topics table (topic names are at most 255 bytes,
// checked by the database).
//
// The Inspector runs its lag and topics queries with JIT compilation off
// (SET LOCAL jit = off in their transaction): their row estimates are high
// whatever the data, and compiling them cost about 0.2 s of server CPU per
// scrape. No setting is needed on the pool (and a jit startup parameter
// is refused by PgBouncer).
//
// # Usage
//
//	insp, err := admin.NewInspector(pool, pglease.Tables{})
//	if err != nil {
//		return err
//	}
//	groups, err := metrics.NewCollector(insp, metrics.CollectorConfig{})
//	if err != nil {
//		return err
//	}
//	subs, err := metrics.NewSubscriberCollector(subscriber, metrics.SubscriberCollectorConfig{})
//	if err != nil {
//		return err
//	}
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(groups, subs)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
//
// Two Subscribers of one consumer group in one registry need a label that
// tells them apart (SubscriberCollectorConfig.ConstLabels, e.g.
// {"subscriber": "orders-worker"}): the registry refuses two collectors
// whose metrics have the same labels.
package metrics
