package pglease_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// conformance holds what every Pub/Sub built by one run of the universal
// suite shares: a pool and a schema.
type conformance struct {
	pool    *pgxpool.Pool
	adapter pglease.Tables
	logger  watermill.LoggerAdapter
	// tweak, when set, changes each Subscriber's config.
	tweak func(*pglease.SubscriberConfig)
	// pubTweak, when set, changes each Publisher's config.
	pubTweak func(*pglease.PublisherConfig)

	mu   sync.Mutex
	pubs []*pglease.Publisher
	subs []*pglease.Subscriber
}

// newConformance returns the shared parts of one suite run. When the run
// ends (after its parallel subtests), every Publisher and Subscriber it
// built is closed, including those some tests of the suite leave open, and
// no goroutine of pglease may be left.
func newConformance(t *testing.T) *conformance {
	return newConformanceOn(t, newPool(t, 60))
}

// newConformanceOn is newConformance on pool.
func newConformanceOn(t *testing.T, pool *pgxpool.Pool) *conformance {
	return newConformanceWith(t, pool, newSchema(t, pool))
}

// newConformanceWith is newConformance on pool and the tables of adapter.
func newConformanceWith(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) *conformance {
	c := &conformance{pool: pool, adapter: adapter, logger: testLogger()}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, pub := range c.pubs {
			require.NoError(t, pub.Close())
		}
		for _, sub := range c.subs {
			require.NoError(t, sub.Close())
		}
		assertNoLeakedGoroutines(t)
	})
	return c
}

func (c *conformance) pubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	pcfg := pglease.PublisherConfig{
		Tables:               c.adapter,
		AutoInitializeSchema: true,
	}
	if c.pubTweak != nil {
		c.pubTweak(&pcfg)
	}
	pub, err := pglease.NewPublisher(c.pool, pcfg, c.logger)
	require.NoError(t, err)
	cfg := pglease.SubscriberConfig{
		ConsumerGroup:    group,
		SessionTTL:       5 * time.Second,
		PollInterval:     20 * time.Millisecond,
		NackResendDelay:  10 * time.Millisecond,
		InitializeSchema: true,
		Tables:           c.adapter,
	}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	sub, err := pglease.NewSubscriber(c.pool, cfg, c.logger)
	require.NoError(t, err)
	c.mu.Lock()
	c.pubs = append(c.pubs, pub)
	c.subs = append(c.subs, sub)
	c.mu.Unlock()
	return pub, sub
}

func (c *conformance) features() tests.Features {
	return tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     true,
		Persistent:          true,
		// Subscribers built for one test share its consumer group, so a new
		// Subscriber continues where the group is; a new group starts at the
		// beginning, which TestNewSubscriberReceivesOldMessages checks below.
		NewSubscriberReceivesOldMessages: false,
		RestartServiceCommand:            pgtest.RestartCommand(),
	}
}

// TestPubSub runs Watermill's universal Pub/Sub test suite. The Subscribers
// one test builds share a consumer group named after the test, the way
// several instances of one service would.
func TestPubSub(t *testing.T) {
	c := newConformance(t)
	features := c.features()
	switch {
	case raceDetector:
		// TestReconnect appends to its list of published messages in one
		// goroutine and reads it in another without synchronization, so the
		// race detector flags the suite itself, whatever the backend. `make
		// test` runs it again without -race (TestReconnect only).
		features.RestartServiceCommand = nil
		t.Log("built with -race: the suite skips TestReconnect, which `make test` runs without -race")
	case len(features.RestartServiceCommand) == 0:
		t.Log("PGLEASE_TEST_RESTART_CMD is not set: the suite skips TestReconnect; `make test` sets it")
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
		c.pubSub,
	)
}

// TestPubSubMaxInFlight runs the suite with MaxInFlight 16: with every
// message a key of its own (handed out in parallel, no order kept), and
// with the suite's messages as they are, without keys (ordered against
// each other: the suite's order checks hold).
func TestPubSubMaxInFlight(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     func(*message.Message) string
		ordered bool
	}{
		{name: "a key per message", key: func(msg *message.Message) string { return msg.UUID }},
		{name: "no keys", ordered: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConformance(t)
			c.tweak = func(cfg *pglease.SubscriberConfig) {
				cfg.MaxInFlight = 16
				cfg.OrderingKey = tc.key
			}
			features := c.features()
			features.GuaranteedOrder = tc.ordered
			features.RestartServiceCommand = nil // TestPubSub covers restarts
			tests.TestPubSub(t, features,
				func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
				c.pubSub,
			)
		})
	}
}

// TestPubSubRetry runs the suite with a failure policy (Retry, without a
// limit, short waits): the suite's Nacks go through the policy's record
// and retry instead of NackResendDelay, and its order checks hold (the
// suite's messages have no keys: a failed one holds the others back).
func TestPubSubRetry(t *testing.T) {
	c := newConformance(t)
	c.tweak = func(cfg *pglease.SubscriberConfig) {
		cfg.Retry = pglease.RetryConfig{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	}
	features := c.features()
	features.RestartServiceCommand = nil // TestPubSub covers restarts
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
		c.pubSub,
	)
}

// TestNewSubscriberReceivesOldMessages runs the suite's test of that name
// with a new consumer group for every Subscriber: a new group starts at the
// beginning of the topic.
func TestNewSubscriberReceivesOldMessages(t *testing.T) {
	c := newConformance(t)
	features := c.features()
	features.NewSubscriberReceivesOldMessages = true
	var mu sync.Mutex
	n := 0
	tests.TestNewSubscriberReceivesOldMessages(t, tests.TestContext{TestID: tests.NewTestID(), Features: features},
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			mu.Lock()
			defer mu.Unlock()
			n++
			return c.pubSub(t, fmt.Sprintf("%s/group-%d", t.Name(), n))
		})
}
