package metrics

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// DefaultScrapeTimeout bounds the queries of one scrape of a [Collector].
const DefaultScrapeTimeout = 5 * time.Second

// DefaultMaxSeries is the default of [CollectorConfig.MaxSeries].
const DefaultMaxSeries = 10000

// CollectorConfig configures a [Collector]. The zero value is valid.
type CollectorConfig struct {
	// ConsumerGroups selects the consumer groups whose lag, members and
	// owned rows are exported; nil: every group. They are passed to
	// [admin.Inspector.Lag], so the database reads only their rows.
	ConsumerGroups []string
	// Topics selects the topics whose lag and topic metrics are exported;
	// nil: every topic. Passed to [admin.Inspector.Lag] and
	// [admin.Inspector.TopicMessages] (which then count only these);
	// the other topic metrics are filtered after
	// [admin.Inspector.Topics], which reads every topic.
	Topics []string
	// ScrapeTimeout bounds the queries of one scrape. Default:
	// [DefaultScrapeTimeout]. Keep it below Prometheus's scrape_timeout.
	ScrapeTimeout time.Duration
	// ConstLabels are added to every metric, e.g. {"database": "orders"}
	// to export several databases from one process.
	ConstLabels prometheus.Labels
	// MaxSeries bounds the series of groups, topics and partitions one
	// scrape exports (the series without labels, such as pglease_up,
	// are always exported). Past it, the rest of the scrape's series are
	// left out, counted in pglease_scrape_capped_series, and logged once
	// (again only after a scrape that left none out). Series are
	// exported in this order: the lag of each group's partitions, the
	// members and owned rows of each group, then the topics. Default:
	// [DefaultMaxSeries]. Every topic costs at least three series, every
	// partition of a consumed topic three per group: raise it, or narrow
	// ConsumerGroups and Topics, for a deployment that has more.
	MaxSeries int
	// Logger receives the errors of failed scrapes (also exported as
	// pglease_up 0). Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *CollectorConfig) setDefaults() {
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = DefaultScrapeTimeout
	}
	if c.MaxSeries == 0 {
		c.MaxSeries = DefaultMaxSeries
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

func (c CollectorConfig) validate() error {
	if c.ScrapeTimeout < 0 {
		return fmt.Errorf("CollectorConfig.ScrapeTimeout must not be negative, got %s", c.ScrapeTimeout)
	}
	if c.MaxSeries < 0 {
		return fmt.Errorf("CollectorConfig.MaxSeries must not be negative, got %d", c.MaxSeries)
	}
	return nil
}

// Collector is a [prometheus.Collector] of what an [admin.Inspector]
// reads: the lag of every consumer group on every partition, the live
// members of each group, the xmin horizon and the topics. Every scrape
// runs the queries of the Inspector (Sessions, Lag, Horizon, Topics) on
// the database, one scrape at a time. A query that fails leaves its
// metrics out of that scrape and sets pglease_up to 0; the scrape itself
// does not fail, so the other collectors of the registry are still
// exported. It is safe for concurrent use.
type Collector struct {
	insp   *admin.Inspector
	config CollectorConfig
	groups map[string]bool // nil: every group
	topics map[string]bool // nil: every topic
	logger watermill.LoggerAdapter
	mu     sync.Mutex // one scrape at a time
	// counted are the topics pglease_topic_messages was exported for:
	// they keep being exported, 0 once their messages are gone (a
	// drained poison topic reads 0, not absent). Guarded by mu.
	counted map[string]bool
	// capping: the last scrape left series out (MaxSeries); logged when
	// it starts. Guarded by mu.
	capping bool

	up, scrapeDuration, skippedSeries, capped  *prometheus.Desc
	lag, lagSeconds, pending, waiting          *prometheus.Desc
	members, ownedRows                         *prometheus.Desc
	horizonAge, horizonAgeKnown                *prometheus.Desc
	topicPartitions, topicNewestMessageSeconds *prometheus.Desc
	topicMessages                              *prometheus.Desc
}

// NewCollector returns a Collector of insp's tables. Register it with
// [prometheus.Registry.Register]. The error wraps
// [pglease.ErrInvalidConfig].
func NewCollector(insp *admin.Inspector, config CollectorConfig) (*Collector, error) {
	if insp == nil {
		return nil, fmt.Errorf("%w: NewCollector needs a *admin.Inspector, got nil", pglease.ErrInvalidConfig)
	}
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", pglease.ErrInvalidConfig, err)
	}
	config.ConsumerGroups = slices.Clone(config.ConsumerGroups)
	config.Topics = slices.Clone(config.Topics)
	partition := []string{"consumergroup", "topic", "partition"}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, config.ConstLabels)
	}
	return &Collector{
		insp:   insp,
		config: config,
		groups: set(config.ConsumerGroups),
		topics: set(config.Topics),
		logger: config.Logger.With(watermill.LogFields{"component": "pglease_metrics"}),

		up: desc("pglease_up",
			"1 if the last scrape read every pglease metric from the database, 0 if a query failed (its metrics are missing)."),
		scrapeDuration: desc("pglease_scrape_duration_seconds",
			"How long the last scrape of the pglease tables took."),
		skippedSeries: desc("pglease_scrape_skipped_series",
			"Series the last scrape left out because their labels could not be exported (logged); names that are not UTF-8 are exported with their other bytes escaped as \\xNN."),
		capped: desc("pglease_scrape_capped_series",
			"Series the last scrape left out because it had exported CollectorConfig.MaxSeries series already (logged when it starts)."),
		lag: desc("pglease_consumergroup_lag",
			"Messages after the consumer group's acknowledged position on the partition that every reader can see (not yet acked).",
			partition...),
		lagSeconds: desc("pglease_consumergroup_lag_seconds",
			"Age of the oldest message not yet acked by the consumer group on the partition; 0 when it has none.",
			partition...),
		pending: desc("pglease_consumergroup_pending",
			"1 if committed messages of the partition wait for an open transaction that published to it before them (on Citus: behind the worker's xmin horizon, see pglease_xmin_horizon_age_seconds), else 0.",
			partition...),
		waiting: desc("pglease_consumergroup_waiting",
			"Messages of the partition that failed under the consumer group's failure policy (SubscriberConfig.Retry) and wait for their next attempt or their move to the dead-letter topic; exported only for partitions with some.",
			partition...),
		members: desc("pglease_consumergroup_members",
			"Live sessions (Subscribers) of the consumer group.",
			"consumergroup"),
		ownedRows: desc("pglease_consumergroup_owned_rows",
			"Exported (topic, partition) rows of the consumer group that a live member owns; fewer than the group's pglease_consumergroup_lag series means rows wait for an owner.",
			"consumergroup"),
		horizonAge: desc("pglease_xmin_horizon_age_seconds",
			"Age of the oldest running writing transaction, which holds back vacuum, and on Citus delivery on every topic of its worker (on a single server delivery waits only for open publishers of the same partition: pglease_consumergroup_pending); 0 when none runs; NaN when this role may not see its age (see pglease_xmin_horizon_age_known)."),
		horizonAgeKnown: desc("pglease_xmin_horizon_age_known",
			"1 if pglease_xmin_horizon_age_seconds is known; 0 if a writing transaction holds the horizon back but this role may not see its start (grant it pg_read_all_stats): it may be old."),
		topicPartitions: desc("pglease_topic_partitions",
			"Partitions of the topic.",
			"topic"),
		topicNewestMessageSeconds: desc("pglease_topic_newest_message_timestamp_seconds",
			"When the newest message of the topic was stored, in seconds since the Unix epoch (absent for a topic without messages).",
			"topic"),
		topicMessages: desc("pglease_topic_messages",
			"Stored messages of the topic (delivered or not, until retention removes them; 0 for a topic emptied since an earlier scrape): exact up to "+
				strconv.Itoa(admin.DefaultExactCountUpTo)+", above that the planner's estimate from the table's statistics. Alert on a poison topic's depth with it.",
			"topic"),
	}, nil
}

func set(names []string) map[string]bool {
	if names == nil {
		return nil
	}
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Describe implements [prometheus.Collector].
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.scrapeDuration, c.skippedSeries, c.capped, c.lag, c.lagSeconds, c.pending,
		c.waiting, c.members, c.ownedRows, c.horizonAge, c.horizonAgeKnown, c.topicPartitions, c.topicNewestMessageSeconds, c.topicMessages} {
		ch <- d
	}
}

// Collect implements [prometheus.Collector]: it reads the Inspector,
// within CollectorConfig.ScrapeTimeout.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), c.config.ScrapeTimeout)
	defer cancel()
	s := c.scrape(ctx)
	c.emit(s, ch)
	ch <- prometheus.MustNewConstMetric(c.scrapeDuration, prometheus.GaugeValue, time.Since(start).Seconds())
}

// snapshot is what one scrape read; a nil slice or horizon: its query
// failed.
type snapshot struct {
	sessions []admin.SessionInfo
	lag      []admin.LagInfo
	horizon  *admin.Horizon
	topics   []admin.TopicInfo
	counts   []admin.TopicMessageCount
	failed   bool
}

func (c *Collector) scrape(ctx context.Context) snapshot {
	var s snapshot
	fail := func(query string, err error) {
		s.failed = true
		c.logger.Error("Scrape of the pglease tables failed", err, watermill.LogFields{"query": query})
	}
	var err error
	if s.sessions, err = c.insp.Sessions(ctx); err != nil {
		fail("sessions", err)
		s.sessions = nil
	} else if s.sessions == nil {
		s.sessions = []admin.SessionInfo{}
	}
	lf := admin.LagFilter{ConsumerGroups: c.config.ConsumerGroups, Topics: c.config.Topics}
	if s.lag, err = c.insp.Lag(ctx, lf); err != nil {
		fail("lag", err)
		s.lag = nil
	} else if s.lag == nil {
		s.lag = []admin.LagInfo{}
	}
	if h, err := c.insp.Horizon(ctx); err != nil {
		fail("horizon", err)
	} else {
		s.horizon = &h
	}
	if s.topics, err = c.insp.Topics(ctx); err != nil {
		fail("topics", err)
		s.topics = nil
	} else if s.topics == nil {
		s.topics = []admin.TopicInfo{}
	}
	if s.counts, err = c.insp.TopicMessages(ctx, admin.TopicMessagesParams{Topics: c.config.Topics}); err != nil {
		fail("topic messages", err)
		s.counts = nil
	} else if s.counts == nil {
		s.counts = []admin.TopicMessageCount{}
	}
	return s
}

// emit turns a snapshot into metrics. A label value that is not UTF-8
// (a name stored in a SQL_ASCII database) is exported with its other
// bytes escaped as \xNN; a series that still cannot be exported (two
// names that escape alike) is left out, logged, and counted in
// pglease_scrape_skipped_series, so that one name never fails the scrape.
func (c *Collector) emit(s snapshot, ch chan<- prometheus.Metric) {
	seen := map[string]bool{}
	skipped, exported, capped := 0, 0, 0
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		if len(labels) > 0 {
			if exported >= c.config.MaxSeries {
				capped++
				return
			}
			exported++
		}
		for i, l := range labels {
			labels[i] = validLabel(l)
		}
		key := fmt.Sprintf("%p\xff%s", d, strings.Join(labels, "\xff"))
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err == nil && seen[key] {
			err = fmt.Errorf("labels %q are those of another series once escaped", labels)
		}
		if err != nil {
			skipped++
			c.logger.Error("Series of the pglease metrics left out", err, watermill.LogFields{"metric": d.String()})
			return
		}
		seen[key] = true
		ch <- m
	}
	defer func() {
		gauge(c.skippedSeries, float64(skipped))
		gauge(c.capped, float64(capped))
		if capped > 0 && !c.capping {
			c.logger.Error("Series of the pglease metrics left out: more than CollectorConfig.MaxSeries",
				fmt.Errorf("%d series exported, %d left out", exported, capped),
				watermill.LogFields{"max_series": c.config.MaxSeries})
		}
		c.capping = capped > 0
	}()
	gauge(c.up, boolValue(!s.failed))

	for _, l := range s.lag {
		p := strconv.Itoa(int(l.Partition))
		gauge(c.lag, float64(l.Lag), l.ConsumerGroup, l.Topic, p)
		gauge(c.lagSeconds, l.LagSeconds, l.ConsumerGroup, l.Topic, p)
		gauge(c.pending, boolValue(l.Pending), l.ConsumerGroup, l.Topic, p)
		if l.Waiting > 0 {
			gauge(c.waiting, float64(l.Waiting), l.ConsumerGroup, l.Topic, p)
		}
	}

	// A group is known by the filter, its sessions or its rows; each gets
	// members and owned rows, 0 included, so that "no live member" can
	// be alerted on. Members need the sessions; owned rows the lag.
	groups := map[string]bool{}
	for g := range c.groups {
		groups[g] = true
	}
	members, owned := map[string]int{}, map[string]int{}
	for _, ss := range s.sessions {
		if c.groups != nil && !c.groups[ss.ConsumerGroup] {
			continue
		}
		groups[ss.ConsumerGroup] = true
		if ss.Alive {
			members[ss.ConsumerGroup]++
		}
	}
	for _, l := range s.lag {
		groups[l.ConsumerGroup] = true
		if l.OwnerSession != uuid.Nil {
			owned[l.ConsumerGroup]++
		}
	}
	for g := range groups {
		if s.sessions != nil {
			gauge(c.members, float64(members[g]), g)
		}
		if s.lag != nil {
			gauge(c.ownedRows, float64(owned[g]), g)
		}
	}

	if s.horizon != nil {
		age, known := horizonAge(*s.horizon)
		gauge(c.horizonAge, age)
		gauge(c.horizonAgeKnown, boolValue(known))
	}

	for _, t := range s.topics {
		if c.topics != nil && !c.topics[t.Topic] {
			continue
		}
		gauge(c.topicPartitions, float64(t.Partitions), t.Topic)
		if t.NewestAt != nil {
			gauge(c.topicNewestMessageSeconds, float64(t.NewestAt.UnixNano())/1e9, t.Topic)
		}
	}

	// Every topic known to Topics, or counted by an earlier scrape, gets
	// a count, 0 included; TopicMessages lists only topics with messages.
	if s.counts != nil {
		counts := map[string]int64{}
		for topic := range c.counted {
			counts[topic] = 0
		}
		for _, t := range s.topics {
			counts[t.Topic] = 0
		}
		for _, n := range s.counts {
			counts[n.Topic] = n.Messages
		}
		if c.counted == nil {
			c.counted = map[string]bool{}
		}
		for topic, n := range counts {
			if c.topics != nil && !c.topics[topic] {
				continue
			}
			c.counted[topic] = true
			gauge(c.topicMessages, float64(n), topic)
		}
	}
}

// validLabel returns s, with every byte that is not part of a UTF-8
// character escaped as \xNN.
func validLabel(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && size == 1 {
			fmt.Fprintf(&b, `\x%02x`, s[0])
		} else {
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

// horizonAge is the age in seconds of the transaction that holds h back (0
// when none does) and whether it is known: NaN and false when the role
// may not see the holder's start, so that the age never reads as a
// reassuring 0 (an alert on age > X does not fire on NaN; alert on the
// known gauge too).
func horizonAge(h admin.Horizon) (float64, bool) {
	switch {
	case h.Holder == nil:
		return 0, true
	case !h.Holder.AgeKnown:
		return math.NaN(), false
	}
	return max(h.Holder.Age.Seconds(), 0), true
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
