package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// testDSN is the database every test uses; each test works in a schema of
// its own.
var testDSN string

// TestMain finds the database as the core module's tests do
// (internal/pgtest: PGLEASE_TEST_DSN, else a container when a Docker
// engine answers, else the tests fail saying to run `make test`); under
// -short the tests that need it skip.
func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "metrics", func(dsn string) { testDSN = dsn }))
}

// newPool returns a pool on the test database, closed at the end of the
// test; under -short it skips the test.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, testDSN, 0)
}

// newSchema returns an adapter on a fresh PostgreSQL schema, dropped at
// the end of the test. Schema initialization creates it.
func newSchema(t *testing.T, pool *pgxpool.Pool) pglease.Tables {
	t.Helper()
	return pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_metrics_test_")}
}

func newPublisher(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) *pglease.Publisher {
	t.Helper()
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pub.Close()) })
	return pub
}

func publishN(t *testing.T, pub *pglease.Publisher, topic string, n int) {
	t.Helper()
	for range n {
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x"))))
	}
}

// newSubscriber returns a Subscriber of group that commits every Ack at
// once, closed at the end of the test.
func newSubscriber(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group string) *pglease.Subscriber {
	t.Helper()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    group,
		Tables:           adapter,
		InitializeSchema: true,
		CommitBatch:      1,
		SessionTTL:       time.Second,
		PollInterval:     10 * time.Millisecond,
		NackResendDelay:  time.Millisecond,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sub.Close()) })
	return sub
}

func newInspector(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) *admin.Inspector {
	t.Helper()
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	return insp
}

func receiveOne(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
		return nil
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, timeout, what, cond)
}

// only is a collector of the metrics of c with the descriptor d, for
// testutil.ToFloat64 on a metric whose value is not known exactly.
type only struct {
	c prometheus.Collector
	d *prometheus.Desc
}

func (o only) Describe(ch chan<- *prometheus.Desc) { ch <- o.d }

func (o only) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() {
		o.c.Collect(all)
		close(all)
	}()
	for m := range all {
		if m.Desc() == o.d {
			ch <- m
		}
	}
}

// TestCollectorLagAndMembers: N messages published, K acked by the one
// Subscriber of the group: the scrape shows a lag of N-K on the topic's
// partition, one live member owning the row, nothing pending, and the
// topic with its partition and the time of its newest message.
func TestCollectorLagAndMembers(t *testing.T) {
	const n, k = 10, 4
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "orders", n)
	insp := newInspector(t, pool, adapter)
	sub := newSubscriber(t, pool, adapter, "billing")
	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	var last pglease.Position
	for range k {
		msg := receiveOne(t, msgs)
		last, _ = pglease.MessagePositionFromCtx(msg.Context())
		require.True(t, msg.Ack())
	}
	waitFor(t, 10*time.Second, "the last ack to be committed", func() bool {
		lag, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"billing"}})
		require.NoError(t, err)
		return len(lag) == 1 && lag[0].Position == last
	})

	c, err := NewCollector(insp, CollectorConfig{})
	require.NoError(t, err)
	expected := fmt.Sprintf(`
# HELP pglease_consumergroup_lag Messages after the consumer group's acknowledged position on the partition that every reader can see (not yet acked).
# TYPE pglease_consumergroup_lag gauge
pglease_consumergroup_lag{consumergroup="billing",partition="0",topic="orders"} %d
# HELP pglease_consumergroup_members Live sessions (Subscribers) of the consumer group.
# TYPE pglease_consumergroup_members gauge
pglease_consumergroup_members{consumergroup="billing"} 1
# HELP pglease_consumergroup_owned_rows Exported (topic, partition) rows of the consumer group that a live member owns; fewer than the group's pglease_consumergroup_lag series means rows wait for an owner.
# TYPE pglease_consumergroup_owned_rows gauge
pglease_consumergroup_owned_rows{consumergroup="billing"} 1
# HELP pglease_consumergroup_pending 1 if committed messages of the partition wait for an open transaction that published to it before them (on Citus: behind the worker's xmin horizon, see pglease_xmin_horizon_age_seconds), else 0.
# TYPE pglease_consumergroup_pending gauge
pglease_consumergroup_pending{consumergroup="billing",partition="0",topic="orders"} 0
# HELP pglease_topic_partitions Partitions of the topic.
# TYPE pglease_topic_partitions gauge
pglease_topic_partitions{topic="orders"} 1
# HELP pglease_up 1 if the last scrape read every pglease metric from the database, 0 if a query failed (its metrics are missing).
# TYPE pglease_up gauge
pglease_up 1
`, n-k)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(expected),
		"pglease_consumergroup_lag", "pglease_consumergroup_members", "pglease_consumergroup_owned_rows",
		"pglease_consumergroup_pending", "pglease_topic_partitions", "pglease_up"))

	assert.Positive(t, testutil.ToFloat64(only{c, c.lagSeconds}), "the oldest unacked message has an age")
	newest := testutil.ToFloat64(only{c, c.topicNewestMessageSeconds})
	assert.InDelta(t, float64(time.Now().Unix()), newest, 60, "newest message stored just now")
	assert.Equal(t, 1, testutil.CollectAndCount(c, "pglease_xmin_horizon_age_seconds"))
	assert.Equal(t, 1, testutil.CollectAndCount(c, "pglease_scrape_duration_seconds"))
	assert.Zero(t, testutil.CollectAndCount(c, "pglease_consumergroup_waiting"), "nothing waits for a retry")
}

// TestCollectorWaiting: a message that failed under a failure policy and
// waits for its next attempt is exported as pglease_consumergroup_waiting
// of its partition, and the series goes once it succeeded.
func TestCollectorWaiting(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "orders", 1)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "billing", Tables: adapter,
		InitializeSchema: true, CommitBatch: 1, PollInterval: 10 * time.Millisecond,
		Retry: pglease.RetryConfig{MaxAttempts: 3, MinBackoff: 500 * time.Millisecond, MaxBackoff: time.Second,
			DeadLetterTopic: "orders.dead"}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sub.Close()) })
	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	c, err := NewCollector(newInspector(t, pool, adapter), CollectorConfig{})
	require.NoError(t, err)

	require.True(t, receiveOne(t, msgs).Nack())
	waitFor(t, 10*time.Second, "the failed message to wait", func() bool {
		return testutil.CollectAndCount(c, "pglease_consumergroup_waiting") == 1
	})
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pglease_consumergroup_waiting Messages of the partition that failed under the consumer group's failure policy (SubscriberConfig.Retry) and wait for their next attempt or their move to the dead-letter topic; exported only for partitions with some.
# TYPE pglease_consumergroup_waiting gauge
pglease_consumergroup_waiting{consumergroup="billing",partition="0",topic="orders"} 1
`), "pglease_consumergroup_waiting"))

	require.True(t, receiveOne(t, msgs).Ack(), "the retry")
	waitFor(t, 10*time.Second, "nothing to wait any more", func() bool {
		return testutil.CollectAndCount(c, "pglease_consumergroup_waiting") == 0
	})
}

// TestCollectorFilters: the groups and topics of the config select the
// series; a listed group without sessions or rows is exported with no
// members, and the topic filter applies to the topic metrics too.
func TestCollectorFilters(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "a", 3)
	publishN(t, pub, "b", 2)
	insp := newInspector(t, pool, adapter)
	// Offsets rows without Subscribers: a reset creates them.
	for _, r := range []struct{ group, topic string }{{"g1", "a"}, {"g1", "b"}, {"g2", "a"}} {
		_, err := insp.ResetOffsets(ctx, admin.ResetOffsetsParams{ConsumerGroup: r.group, Topic: r.topic,
			To: admin.ResetToEarliest})
		require.NoError(t, err)
	}

	all, err := NewCollector(insp, CollectorConfig{})
	require.NoError(t, err)
	assert.Equal(t, 3, testutil.CollectAndCount(all, "pglease_consumergroup_lag"))
	assert.Equal(t, 2, testutil.CollectAndCount(all, "pglease_topic_partitions"))

	c, err := NewCollector(insp, CollectorConfig{ConsumerGroups: []string{"g1", "nobody"}, Topics: []string{"a"}})
	require.NoError(t, err)
	expected := `
# HELP pglease_consumergroup_lag Messages after the consumer group's acknowledged position on the partition that every reader can see (not yet acked).
# TYPE pglease_consumergroup_lag gauge
pglease_consumergroup_lag{consumergroup="g1",partition="0",topic="a"} 3
# HELP pglease_consumergroup_members Live sessions (Subscribers) of the consumer group.
# TYPE pglease_consumergroup_members gauge
pglease_consumergroup_members{consumergroup="g1"} 0
pglease_consumergroup_members{consumergroup="nobody"} 0
# HELP pglease_consumergroup_owned_rows Exported (topic, partition) rows of the consumer group that a live member owns; fewer than the group's pglease_consumergroup_lag series means rows wait for an owner.
# TYPE pglease_consumergroup_owned_rows gauge
pglease_consumergroup_owned_rows{consumergroup="g1"} 0
pglease_consumergroup_owned_rows{consumergroup="nobody"} 0
# HELP pglease_topic_partitions Partitions of the topic.
# TYPE pglease_topic_partitions gauge
pglease_topic_partitions{topic="a"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(expected),
		"pglease_consumergroup_lag", "pglease_consumergroup_members", "pglease_consumergroup_owned_rows",
		"pglease_topic_partitions"))
}

// TestCollectorTopicMessages: pglease_topic_messages counts the stored
// messages of each topic, so a poison topic's depth can be alerted on; a
// replay drains it to 0 (still exported by a collector that saw it); the
// topic filter applies.
func TestCollectorTopicMessages(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	publishN(t, pub, "orders", 5)
	publishN(t, pub, "orders.poison", 2)
	insp := newInspector(t, pool, adapter)
	c, err := NewCollector(insp, CollectorConfig{})
	require.NoError(t, err)
	const head = `
# HELP pglease_topic_messages Stored messages of the topic (delivered or not, until retention removes them; 0 for a topic emptied since an earlier scrape): exact up to 10000, above that the planner's estimate from the table's statistics. Alert on a poison topic's depth with it.
# TYPE pglease_topic_messages gauge
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(head+`pglease_topic_messages{topic="orders"} 5
pglease_topic_messages{topic="orders.poison"} 2
`), "pglease_topic_messages"))

	done, err := insp.Replay(ctx, admin.ReplayParams{From: "orders.poison", To: "orders"})
	require.NoError(t, err)
	require.Len(t, done, 2)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(head+`pglease_topic_messages{topic="orders"} 7
pglease_topic_messages{topic="orders.poison"} 0
`), "pglease_topic_messages"))

	filtered, err := NewCollector(insp, CollectorConfig{Topics: []string{"orders"}})
	require.NoError(t, err)
	assert.Equal(t, 1, testutil.CollectAndCount(filtered, "pglease_topic_messages"))
}

// TestCollectorHorizonAge: a writing transaction held open on another
// connection makes pglease_xmin_horizon_age_seconds positive; once it
// ends, the metric is 0 again.
func TestCollectorHorizonAge(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	c, err := NewCollector(newInspector(t, pool, adapter), CollectorConfig{})
	require.NoError(t, err)
	age := func() float64 { return testutil.ToFloat64(only{c, c.horizonAge}) }

	blocker, err := pgx.Connect(ctx, testDSN)
	require.NoError(t, err)
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()") // takes a transaction id: a writer
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "a positive horizon age", func() bool { return age() > 0 })

	require.NoError(t, tx.Rollback(ctx))
	waitFor(t, 10*time.Second, "the horizon age back to 0", func() bool { return age() == 0 })
}

// TestCollectorHorizonAgeHiddenFromTheRole: a writing transaction held
// open by another role, scraped by a role without pg_read_all_stats, which
// may not see its start: the age is exported as NaN with
// pglease_xmin_horizon_age_known 0, never as a reassuring 0; once the
// transaction ends, the age is 0 and known again. (The collector exported
// 0 for a holder whose age it could not see.)
func TestCollectorHorizonAgeHiddenFromTheRole(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	publishN(t, newPublisher(t, pool, adapter), "t", 1) // creates the tables

	// A scraping role that owns nothing and lacks pg_read_all_stats.
	role := "pglease_metrics_scraper_" + pgtest.RandomHex(4)
	quoted := pgx.Identifier{role}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE ROLE "+quoted+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { // after the role's pool is closed (cleanups run last first)
		_, err := pool.Exec(context.Background(), "DROP OWNED BY "+quoted+"; DROP ROLE "+quoted)
		assert.NoError(t, err)
	})
	schema := pgx.Identifier{adapter.Schema}.Sanitize()
	_, err = pool.Exec(ctx, "GRANT USAGE ON SCHEMA "+schema+" TO "+quoted+"; GRANT SELECT ON ALL TABLES IN SCHEMA "+schema+" TO "+quoted)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(testDSN)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	scraperPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(scraperPool.Close)
	insp := newInspector(t, scraperPool, adapter)
	c, err := NewCollector(insp, CollectorConfig{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	// gauge returns the value of the metric name, and whether it was exported.
	gauge := func(name string) (float64, bool) {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == name && len(f.GetMetric()) == 1 {
				return f.GetMetric()[0].GetGauge().GetValue(), true
			}
		}
		return 0, false
	}

	// The holder runs as the test's superuser: another role.
	blocker, err := pgx.Connect(ctx, testDSN)
	require.NoError(t, err)
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()") // takes a transaction id: a writer
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the scraping role to see the holder", func() bool {
		h, err := insp.Horizon(ctx)
		require.NoError(t, err)
		return h.Holder != nil
	})
	h, err := insp.Horizon(ctx)
	require.NoError(t, err)
	require.NotNil(t, h.Holder)
	require.False(t, h.Holder.AgeKnown, "the scraping role sees the holder's age: the test proves nothing")

	age, ok := gauge("pglease_xmin_horizon_age_seconds")
	require.True(t, ok, "pglease_xmin_horizon_age_seconds is exported")
	assert.True(t, math.IsNaN(age), "an age the role cannot see is exported as NaN, got %v", age)
	known, ok := gauge("pglease_xmin_horizon_age_known")
	assert.True(t, ok, "pglease_xmin_horizon_age_known is exported")
	assert.Equal(t, 0.0, known)
	up, _ := gauge("pglease_up")
	assert.Equal(t, 1.0, up, "an unknown age is not a failed scrape")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)

	require.NoError(t, tx.Rollback(ctx))
	waitFor(t, 10*time.Second, "the horizon age back to a known 0", func() bool {
		age, _ := gauge("pglease_xmin_horizon_age_seconds")
		known, _ := gauge("pglease_xmin_horizon_age_known")
		return age == 0 && known == 1
	})
}

// TestCollectorScrapeFailure: a query that fails sets pglease_up to 0 and
// leaves its metrics out, the others are still exported; a scrape that
// runs out of time exports only pglease_up, the skipped series and the
// duration. Collecting
// never fails the registry's scrape.
func TestCollectorScrapeFailure(t *testing.T) {
	pool := newPool(t)
	missing := pglease.Tables{Schema: "pglease_metrics_test_missing_" + pgtest.RandomHex(6)}
	c, err := NewCollector(newInspector(t, pool, missing), CollectorConfig{})
	require.NoError(t, err)
	assert.Equal(t, 0.0, testutil.ToFloat64(only{c, c.up}))
	assert.Zero(t, testutil.CollectAndCount(c, "pglease_consumergroup_lag", "pglease_consumergroup_members",
		"pglease_consumergroup_owned_rows", "pglease_topic_partitions"))
	assert.Equal(t, 1, testutil.CollectAndCount(c, "pglease_xmin_horizon_age_seconds"), "the horizon needs no table")

	adapter := newSchema(t, pool)
	publishN(t, newPublisher(t, pool, adapter), "t", 1)
	c, err = NewCollector(newInspector(t, pool, adapter), CollectorConfig{ScrapeTimeout: time.Nanosecond})
	require.NoError(t, err)
	assert.Equal(t, 0.0, testutil.ToFloat64(only{c, c.up}))
	assert.Equal(t, 4, testutil.CollectAndCount(c), "pglease_up, pglease_scrape_skipped_series, pglease_scrape_capped_series and pglease_scrape_duration_seconds")

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	_, err = reg.Gather()
	assert.NoError(t, err)
}

// TestSubscriberCollector: after one Nack and three Acks the counters
// show four deliveries, three acks, one nack, one claim and one owned
// row; heartbeats fill the histogram; ending the subscription counts a
// release.
func TestSubscriberCollector(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	publishN(t, newPublisher(t, pool, adapter), "orders", 3)
	sub := newSubscriber(t, pool, adapter, "billing")
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(sctx, "orders")
	require.NoError(t, err)
	require.True(t, receiveOne(t, msgs).Nack())
	for range 3 {
		require.True(t, receiveOne(t, msgs).Ack())
	}
	waitFor(t, 10*time.Second, "the last ack to be counted", func() bool { return sub.Stats().Acked == 3 })

	c, err := NewSubscriberCollector(sub, SubscriberCollectorConfig{ConstLabels: prometheus.Labels{"subscriber": "a"}})
	require.NoError(t, err)
	const expected = `
# HELP pglease_subscriber_claims_total (topic, partition) rows the Subscriber claimed, takeovers included.
# TYPE pglease_subscriber_claims_total counter
pglease_subscriber_claims_total{consumergroup="billing",subscriber="a"} 1
# HELP pglease_subscriber_takeovers_total Rows the Subscriber claimed from another Subscriber's expired session (a crashed or paused owner).
# TYPE pglease_subscriber_takeovers_total counter
pglease_subscriber_takeovers_total{consumergroup="billing",subscriber="a"} 0
# HELP pglease_subscriber_releases_total Rows the Subscriber gave back: subscription ended, Close, a rebalance or an offsets reset.
# TYPE pglease_subscriber_releases_total counter
pglease_subscriber_releases_total{consumergroup="billing",subscriber="a"} 0
# HELP pglease_subscriber_fenced_writes_total Offset commits and releases refused because another session or an offsets reset had taken the row (ErrOwnershipLost); the messages since the last commit are delivered again.
# TYPE pglease_subscriber_fenced_writes_total counter
pglease_subscriber_fenced_writes_total{consumergroup="billing",subscriber="a"} 0
# HELP pglease_subscriber_sessions_lost_total Sessions of the Subscriber found expired or deleted, or self-fenced after heartbeats failed for the trust window; its rows are claimed again with a new session.
# TYPE pglease_subscriber_sessions_lost_total counter
pglease_subscriber_sessions_lost_total{consumergroup="billing",subscriber="a"} 0
# HELP pglease_subscriber_messages_delivered_total Messages handed out to handlers, redeliveries included.
# TYPE pglease_subscriber_messages_delivered_total counter
pglease_subscriber_messages_delivered_total{consumergroup="billing",subscriber="a"} 4
# HELP pglease_subscriber_messages_acked_total Messages acked by handlers.
# TYPE pglease_subscriber_messages_acked_total counter
pglease_subscriber_messages_acked_total{consumergroup="billing",subscriber="a"} 3
# HELP pglease_subscriber_messages_nacked_total Messages nacked by handlers (delivered again after NackResendDelay).
# TYPE pglease_subscriber_messages_nacked_total counter
pglease_subscriber_messages_nacked_total{consumergroup="billing",subscriber="a"} 1
# HELP pglease_subscriber_messages_in_flight Messages handed out and not acked or nacked yet (at most MaxInFlight per owned partition).
# TYPE pglease_subscriber_messages_in_flight gauge
pglease_subscriber_messages_in_flight{consumergroup="billing",subscriber="a"} 0
# HELP pglease_subscriber_owned_rows (topic, partition) rows the Subscriber owns now.
# TYPE pglease_subscriber_owned_rows gauge
pglease_subscriber_owned_rows{consumergroup="billing",subscriber="a"} 1
# HELP pglease_subscriber_resyncs_total Times the Subscriber found that the database went back in time (a failover to a standby that lagged, a restore) and claimed its rows again from the database's positions; what was acknowledged after them is delivered again.
# TYPE pglease_subscriber_resyncs_total counter
pglease_subscriber_resyncs_total{consumergroup="billing",subscriber="a"} 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(expected),
		"pglease_subscriber_claims_total", "pglease_subscriber_takeovers_total", "pglease_subscriber_releases_total",
		"pglease_subscriber_fenced_writes_total", "pglease_subscriber_sessions_lost_total",
		"pglease_subscriber_messages_delivered_total", "pglease_subscriber_messages_acked_total",
		"pglease_subscriber_messages_nacked_total", "pglease_subscriber_messages_in_flight",
		"pglease_subscriber_owned_rows", "pglease_subscriber_resyncs_total"))
	assert.Equal(t, 1, testutil.CollectAndCount(c, "pglease_subscriber_buffered_bytes"))
	assert.Equal(t, 1, testutil.CollectAndCount(c, "pglease_subscriber_head_of_line_wait_seconds_total"))

	waitFor(t, 10*time.Second, "a heartbeat", func() bool { return sub.Stats().Heartbeats.Count > 0 })
	assert.Equal(t, 1, testutil.CollectAndCount(c, "pglease_subscriber_heartbeat_duration_seconds"))

	// The only Subscriber of its tables is their maintainer.
	waitFor(t, 10*time.Second, "the election", func() bool { return testutil.ToFloat64(only{c, c.maintainer}) == 1 })
	assert.Equal(t, 1.0, testutil.ToFloat64(only{c, c.maintainerTerms}))
	assert.Equal(t, 0.0, testutil.ToFloat64(only{c, c.retentionSkipped}))

	cancel()
	waitFor(t, 10*time.Second, "the release", func() bool { return testutil.ToFloat64(only{c, c.releases}) == 1 })
	assert.Equal(t, 0.0, testutil.ToFloat64(only{c, c.ownedRows}))
}

// TestLatencyHistogram: the cumulative buckets of a LatencyHistogram
// become the histogram's buckets, in seconds, +Inf being the count.
func TestLatencyHistogram(t *testing.T) {
	d := prometheus.NewDesc("pglease_subscriber_heartbeat_duration_seconds", "Latency.", nil, nil)
	h := pglease.LatencyHistogram{Count: 4, Sum: 1100 * time.Millisecond,
		Buckets: []uint64{1, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3}}
	const expected = `
# HELP pglease_subscriber_heartbeat_duration_seconds Latency.
# TYPE pglease_subscriber_heartbeat_duration_seconds histogram
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.005"} 1
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.01"} 2
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.025"} 2
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.05"} 2
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.1"} 2
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.25"} 2
pglease_subscriber_heartbeat_duration_seconds_bucket{le="0.5"} 2
pglease_subscriber_heartbeat_duration_seconds_bucket{le="1"} 3
pglease_subscriber_heartbeat_duration_seconds_bucket{le="2.5"} 3
pglease_subscriber_heartbeat_duration_seconds_bucket{le="5"} 3
pglease_subscriber_heartbeat_duration_seconds_bucket{le="10"} 3
pglease_subscriber_heartbeat_duration_seconds_bucket{le="+Inf"} 4
pglease_subscriber_heartbeat_duration_seconds_sum 1.1
pglease_subscriber_heartbeat_duration_seconds_count 4
`
	require.NoError(t, testutil.CollectAndCompare(metricCollector{d, latencyHistogram(d, h, pglease.HeartbeatBuckets)},
		strings.NewReader(expected)))

	// Fewer counts than bounds (or the reverse) keep the common ones.
	m := latencyHistogram(d, pglease.LatencyHistogram{Count: 1, Buckets: []uint64{1}}, pglease.HeartbeatBuckets)
	assert.Equal(t, 1, testutil.CollectAndCount(metricCollector{d, m}))
}

// metricCollector collects one metric.
type metricCollector struct {
	d *prometheus.Desc
	m prometheus.Metric
}

func (c metricCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.d }
func (c metricCollector) Collect(ch chan<- prometheus.Metric) { ch <- c.m }

// TestRegistryLint: both collectors, and two Subscribers of one group told
// apart by a label, register with a pedantic registry; what they export
// passes the Prometheus linter; concurrent scrapes are safe; a second
// collector with the same labels is refused by the registry.
func TestRegistryLint(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	adapter := newSchema(t, pool)
	publishN(t, newPublisher(t, pool, adapter), "orders", 2)
	subA := newSubscriber(t, pool, adapter, "billing")
	msgs, err := subA.Subscribe(ctx, "orders")
	require.NoError(t, err)
	require.True(t, receiveOne(t, msgs).Ack())
	subB := newSubscriber(t, pool, adapter, "billing")
	waitFor(t, 10*time.Second, "a heartbeat", func() bool { return subA.Stats().Heartbeats.Count > 0 })

	reg := prometheus.NewPedanticRegistry()
	c, err := NewCollector(newInspector(t, pool, adapter), CollectorConfig{})
	require.NoError(t, err)
	require.NoError(t, reg.Register(c))
	for name, sub := range map[string]*pglease.Subscriber{"a": subA, "b": subB} {
		sc, err := NewSubscriberCollector(sub, SubscriberCollectorConfig{ConstLabels: prometheus.Labels{"subscriber": name}})
		require.NoError(t, err)
		require.NoError(t, reg.Register(sc))
	}
	again, err := NewSubscriberCollector(subA, SubscriberCollectorConfig{ConstLabels: prometheus.Labels{"subscriber": "a"}})
	require.NoError(t, err)
	var already prometheus.AlreadyRegisteredError
	assert.True(t, errors.As(reg.Register(again), &already), "the same labels again")
	_, err = NewSubscriberCollector(subA, SubscriberCollectorConfig{ConstLabels: prometheus.Labels{"consumergroup": "x"}})
	assert.ErrorIs(t, err, pglease.ErrInvalidConfig)

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, err := reg.Gather()
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	n, err := testutil.GatherAndCount(reg, "pglease_consumergroup_lag", "pglease_subscriber_heartbeat_duration_seconds")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "one lag series, one histogram per Subscriber")
}

// TestConfigErrors: invalid arguments are refused with ErrInvalidConfig.
func TestConfigErrors(t *testing.T) {
	_, err := NewCollector(nil, CollectorConfig{})
	assert.ErrorIs(t, err, pglease.ErrInvalidConfig)
	insp, err := admin.NewInspector(newPool(t), pglease.Tables{})
	require.NoError(t, err)
	_, err = NewCollector(insp, CollectorConfig{ScrapeTimeout: -time.Second})
	assert.ErrorIs(t, err, pglease.ErrInvalidConfig)
	assert.ErrorContains(t, err, "CollectorConfig.ScrapeTimeout")
	_, err = NewSubscriberCollector(nil, SubscriberCollectorConfig{})
	assert.ErrorIs(t, err, pglease.ErrInvalidConfig)
}

// TestCollectorNamesNotUTF8: in a SQL_ASCII database, consumer groups and
// topics may hold bytes that are not UTF-8, which a Prometheus label
// cannot: the scrape does not fail (nor panic); such names are exported
// with those bytes escaped, and a name that then equals another one's is
// left out and counted.
func TestCollectorNamesNotUTF8(t *testing.T) {
	ctx := context.Background()
	admin := newPool(t)
	db := "pglease_metrics_ascii_" + strings.ReplaceAll(fmt.Sprint(time.Now().UnixNano()), "-", "")
	_, err := admin.Exec(ctx, "CREATE DATABASE "+db+" ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	cfg, err := pgxpool.ParseConfig(testDSN)
	require.NoError(t, err)
	cfg.ConnConfig.Database = db
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	adapter := pglease.Tables{}
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	// 'caf\xe9' (Latin-1), and a topic spelled as the escaped form of
	// 't\xff'.
	_, err = pool.Exec(ctx, `INSERT INTO pglease_consumer_offsets (consumer_group, topic)
		VALUES (convert_from('\x636166e9'::bytea, 'SQL_ASCII'), convert_from('\x74ff'::bytea, 'SQL_ASCII')),
		       ('ok', 't\xff')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pglease_messages (topic, uuid) VALUES (convert_from('\x74ff'::bytea, 'SQL_ASCII'), 'u')`)
	require.NoError(t, err)

	c, err := NewCollector(newInspector(t, pool, adapter), CollectorConfig{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err, "the scrape succeeds")
	values := map[string][]string{}
	gauges := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				values[f.GetName()+" "+l.GetName()] = append(values[f.GetName()+" "+l.GetName()], l.GetValue())
			}
			if len(m.GetLabel()) == 0 && m.GetGauge() != nil {
				gauges[f.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	assert.Equal(t, 1.0, gauges["pglease_up"])
	assert.Contains(t, values["pglease_consumergroup_lag consumergroup"], `caf\xe9`)
	assert.Contains(t, values["pglease_consumergroup_lag consumergroup"], `ok`)
	assert.Contains(t, values["pglease_consumergroup_lag topic"], `t\xff`)
	assert.Equal(t, []string{`t\xff`}, values["pglease_topic_messages topic"], "the two topics escape alike: one is left out")
	assert.Equal(t, 2.0, gauges["pglease_scrape_skipped_series"])
}

// TestCollectorMaxSeries: past CollectorConfig.MaxSeries, a scrape leaves
// the rest of its labelled series out, counts them in
// pglease_scrape_capped_series and logs it once, however many scrapes
// cap; the series without labels are always exported.
func TestCollectorMaxSeries(t *testing.T) {
	pool := newPool(t)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	for i := range 5 {
		publishN(t, pub, fmt.Sprintf("t%d", i), 1)
	}
	insp := newInspector(t, pool, adapter)
	_, err := NewCollector(insp, CollectorConfig{MaxSeries: -1})
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)

	logger := testkit.NewCapturingLogger()
	c, err := NewCollector(insp, CollectorConfig{MaxSeries: 4, Logger: logger})
	require.NoError(t, err)
	labelled := func() int {
		return testutil.CollectAndCount(c, "pglease_topic_partitions", "pglease_topic_newest_message_timestamp_seconds",
			"pglease_topic_messages", "pglease_consumergroup_lag")
	}
	// Five topics: 15 series of topics, 4 exported.
	assert.Equal(t, 4, labelled())
	assert.Equal(t, 11.0, testutil.ToFloat64(only{c, c.capped}))
	assert.Equal(t, 1.0, testutil.ToFloat64(only{c, c.up}))
	var capped int
	for _, e := range logger.Entries() {
		if e.Level == "error" && strings.Contains(e.Msg, "MaxSeries") {
			capped++
		}
	}
	assert.Equal(t, 1, capped, "logged once over several scrapes: %v", logger.Entries())

	all, err := NewCollector(insp, CollectorConfig{})
	require.NoError(t, err)
	assert.Equal(t, 15, testutil.CollectAndCount(all, "pglease_topic_partitions", "pglease_topic_newest_message_timestamp_seconds",
		"pglease_topic_messages"))
	assert.Equal(t, 0.0, testutil.ToFloat64(only{all, all.capped}))
}
