package pglease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgrepl"
)

// TestRefusedReleaseResynchronises: the first statement a Subscriber runs
// after its server restarted is the release of its topic (its
// subscription ends): the release finds another identity and writes
// nothing. That is no loss of ownership: the Subscriber must drop its
// session, which frees the row at once, so that the other member of the
// group takes the topic over and delivers what is published, long before
// the first Subscriber's next heartbeat would have found the restart.
//
// The first Subscriber polls (PollOnly) with a long PollInterval and a
// long SessionTTL, and the restart comes right after its heartbeat, so
// nothing but the release runs on the restarted server before the
// deadline.
func TestRefusedReleaseResynchronises(t *testing.T) {
	const (
		ttl      = time.Minute // a heartbeat every 20 s
		deadline = 10 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startSingle(t, pgrepl.Options{})
	pool := newPoolOn(t, c.Primary.DSN(), 8)
	adapter := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	first := newFailoverSubscriber(t, pool, adapter, pglease.SubscriberConfig{
		ConsumerGroup: "g", SessionTTL: ttl, PollOnly: true, PollInterval: time.Minute})
	// Published first: the claim's first read finds it, where a message
	// published later would wait for the idle poll.
	warmup := publishN(t, pub, "t", 1)
	firstCtx, endFirst := context.WithCancel(ctx)
	defer endFirst()
	msgs, err := first.Subscribe(firstCtx, "t")
	require.NoError(t, err)
	got := newDeliveries()
	var consumers sync.WaitGroup
	got.consume(0, msgs, &consumers)
	require.Empty(t, got.waitDelivered(warmup, 30*time.Second), "the first message not delivered")

	second := newFailoverSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", SessionTTL: ttl})
	secondCtx, endSecond := context.WithCancel(ctx)
	defer endSecond()
	msgs2, err := second.Subscribe(secondCtx, "t")
	require.NoError(t, err)
	got.consume(1, msgs2, &consumers)
	// The second member's session row: its first heartbeat would come a
	// heartbeat interval (20 s) after it.
	waitFor(t, 30*time.Second, "the second member's session", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, pglease.DefaultConsumerSessionsTable)).Scan(&n)
		return n >= 2
	})

	waitHeartbeat(t, first)
	require.NoError(t, c.Primary.Restart(ctx))
	before := first.Stats()
	endFirst()
	waitFor(t, deadline, "the first Subscriber's release to run", func() bool {
		s := first.Stats()
		return s.FencedWrites > before.FencedWrites || s.Resyncs > before.Resyncs || s.Releases > before.Releases
	})
	released := time.Now()

	after, _ := publishAfterSwitch(t, pub, "t", 5)
	missing := got.waitDelivered(after, deadline)
	stats := first.Stats()
	t.Logf("first Subscriber: %d releases, %d fenced writes, %d resyncs, %d sessions lost; %d of 5 delivered %s after its release",
		stats.Releases, stats.FencedWrites, stats.Resyncs, stats.SessionsLost, 5-len(missing), time.Since(released).Round(time.Millisecond))
	require.Empty(t, missing, "the topic stayed with the first Subscriber's session after its refused release")
	require.Zero(t, stats.FencedWrites-before.FencedWrites, "a refused release was taken for a loss of ownership")
	require.Positive(t, stats.Resyncs, "the first Subscriber did not resynchronise")

	endSecond()
	require.NoError(t, first.Close())
	require.NoError(t, second.Close())
	consumers.Wait()
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}
