// The failover and restore tests, on real streaming replication and real
// copies (internal/pgrepl): a primary and a standby of their own, started
// by each test, next to the shared test database of PGLEASE_TEST_DSN
// (which they do not use). `make test` runs them once; `make stress`
// repeats them (TestStressFailover).
package pglease_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// startCluster starts a primary and a standby for the test, closed at its
// end.
func startCluster(t *testing.T, opts pgrepl.Options) *pgrepl.Cluster {
	t.Helper()
	return startServers(t, pgrepl.Start, opts)
}

// startSingle starts a single server of the test's own, closed at its end.
func startSingle(t *testing.T, opts pgrepl.Options) *pgrepl.Cluster {
	t.Helper()
	return startServers(t, pgrepl.StartSingle, opts)
}

// startServers starts the servers of start (pgrepl.Start or StartSingle)
// with the test's log, closed at its end.
func startServers(t *testing.T, start func(context.Context, pgrepl.Options) (*pgrepl.Cluster, error),
	opts pgrepl.Options) *pgrepl.Cluster {
	pgtest.SkipShort(t) // runs PostgreSQL's programs
	t.Helper()
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// newFailoverSubscriber returns a Subscriber on pool (a pool of the
// cluster's MultiHostDSN, whose LISTEN connection follows the primary too),
// closed at the end of the test.
func newFailoverSubscriber(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, cfg pglease.SubscriberConfig) *pglease.Subscriber {
	t.Helper()
	cfg.Tables = adapter
	cfg.InitializeSchema = true
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	sub, err := pglease.NewSubscriber(pool, cfg, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// publishTimeout bounds each Publish call of these tests (through its
// message's context).
const publishTimeout = 10 * time.Second

// publishUntilStored publishes msg until a call returns nil (a call across
// the failover fails while no server accepts writes), and returns how many
// calls failed. A failed call may have stored the message: it may be
// delivered twice.
func publishUntilStored(t *testing.T, pub *pglease.Publisher, topic string, msg *message.Message, deadline time.Time) int {
	t.Helper()
	failed := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		msg.SetContext(ctx)
		err := pub.Publish(topic, msg)
		cancel()
		if err == nil {
			return failed
		}
		failed++
		if time.Now().After(deadline) {
			t.Fatalf("publish %s: still failing after %d attempts: %v", msg.UUID, failed, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deliveries records what Subscribers hand out, in the order they do.
type deliveries struct {
	mu   sync.Mutex
	log  []delivery
	seen map[string]int // UUID -> times delivered
}

type delivery struct {
	uuid       string
	key        string
	seq        int
	subscriber int
}

func newDeliveries() *deliveries { return &deliveries{seen: map[string]int{}} }

// consume acks every message of msgs and records it, until msgs closes.
func (d *deliveries) consume(subscriber int, msgs <-chan *message.Message, done *sync.WaitGroup) {
	done.Add(1)
	go func() {
		defer done.Done()
		for msg := range msgs {
			seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
			d.mu.Lock()
			d.log = append(d.log, delivery{uuid: msg.UUID, key: msg.Metadata.Get(pglease.PartitionKeyMetadata),
				seq: seq, subscriber: subscriber})
			d.seen[msg.UUID]++
			d.mu.Unlock()
			msg.Ack()
		}
	}()
}

// missing returns the uuids not delivered yet.
func (d *deliveries) missing(uuids []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, u := range uuids {
		if d.seen[u] == 0 {
			out = append(out, u)
		}
	}
	return out
}

// redelivered returns how many of uuids were delivered more than once.
func (d *deliveries) redelivered(uuids []string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, u := range uuids {
		if d.seen[u] > 1 {
			n++
		}
	}
	return n
}

// firstOrder returns uuids in the order of their first deliveries (those
// delivered at all).
func (d *deliveries) firstOrder(uuids []string) []string {
	want := make(map[string]bool, len(uuids))
	for _, u := range uuids {
		want[u] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, e := range d.log {
		if want[e.uuid] {
			out = append(out, e.uuid)
			delete(want, e.uuid)
		}
	}
	return out
}

// requireDeliveredInOrder fails the test unless every one of uuids
// (published in that order by one publisher) was delivered within timeout
// and their first deliveries came in that order.
func (d *deliveries) requireDeliveredInOrder(t *testing.T, uuids []string, timeout time.Duration) {
	t.Helper()
	missing := d.waitDelivered(uuids, timeout)
	require.Empty(t, missing, "%d of the %d messages published after the switch were not delivered within %s",
		len(missing), len(uuids), timeout)
	require.Equal(t, uuids, d.firstOrder(uuids), "the messages published after the switch were delivered out of order")
}

// waitCommitted waits until the default group's acknowledged position of
// topic is at its last stored message.
func waitCommitted(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, topic string) {
	t.Helper()
	waitFor(t, 30*time.Second, "the acknowledged position of "+topic+" to be committed", func() bool {
		var behind int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table(adapter, pglease.DefaultMessagesTable)+` m
			JOIN `+table(adapter, pglease.DefaultConsumerOffsetsTable)+` o ON o.consumer_group = '' AND o.topic = m.topic
				AND o.partition = m.partition
			WHERE m.topic = $1 AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)`, topic).Scan(&behind)
		return err == nil && behind == 0
	})
}

// waitHeartbeat waits until sub's session has had one more successful
// heartbeat.
func waitHeartbeat(t *testing.T, sub *pglease.Subscriber) {
	t.Helper()
	before := sub.Stats().Heartbeats.Count
	waitFor(t, 30*time.Second, "a heartbeat", func() bool { return sub.Stats().Heartbeats.Count > before })
}

// waitDelivered waits until every one of uuids was delivered, and returns
// those that were not by the deadline.
func (d *deliveries) waitDelivered(uuids []string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		missing := d.missing(uuids)
		if len(missing) == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFailoverToALaggingStandbyDeliversWhatIsPublishedAfter: an
// asynchronous standby stops receiving WAL while a Subscriber (default
// SessionTTL) handles 50 messages on the primary; the primary crashes and
// the standby, which never saw them, is promoted. The Subscriber's
// in-memory position lies above the promoted standby's transaction
// counter, which hands those transaction ids out again to the 100
// messages published after the failover. Every one of them must be
// delivered, in order; some of the 50 may come again.
//
// The first statements after the promotion run before the Subscriber's
// next heartbeat: each read, claim and commit carries the identity of the
// server the session was made on and finds itself on a new timeline.
func TestFailoverToALaggingStandbyDeliversWhatIsPublishedAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, pgrepl.Options{})
	pool := newPoolOn(t, c.MultiHostDSN(), 8)
	adapter := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	sub := newFailoverSubscriber(t, pool, adapter, pglease.SubscriberConfig{})
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	msgs, err := sub.Subscribe(subCtx, "t")
	require.NoError(t, err)
	got := newDeliveries()
	var consumers sync.WaitGroup
	got.consume(0, msgs, &consumers)

	// The session, the claim and a first position reach the standby.
	warmup := publishN(t, pub, "t", 10)
	require.Empty(t, got.waitDelivered(warmup, 30*time.Second), "warm-up messages not delivered")
	waitCommitted(t, pool, adapter, "t")
	require.NoError(t, c.WaitCaughtUp(ctx))

	// The standby lags from here on. (Pausing its replay alone would not
	// do: a promotion replays all the WAL the standby received.)
	require.NoError(t, c.Standby.PauseStreaming(ctx))
	handled := publishN(t, pub, "t", 50)
	require.Empty(t, got.waitDelivered(handled, 30*time.Second), "the 50 messages before the failover not delivered")
	waitCommitted(t, pool, adapter, "t") // a commit lost with the primary

	require.NoError(t, c.Primary.Kill())
	require.NoError(t, c.Standby.Promote(ctx))
	promoted, err := pgx.Connect(ctx, c.Standby.DSN())
	require.NoError(t, err)
	var lost int
	require.NoError(t, promoted.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE uuid = ANY($1)",
		table(adapter, pglease.DefaultMessagesTable)), handled).Scan(&lost))
	require.NoError(t, promoted.Close(ctx))
	require.Zero(t, lost, "the standby was to lag: it has messages published after PauseStreaming")

	after, failedCalls := publishAfterSwitch(t, pub, "t", 100)
	t.Logf("100 messages published on the promoted standby (%d calls failed and were retried)", failedCalls)
	got.requireDeliveredInOrder(t, after, time.Minute)
	stats := sub.Stats()
	t.Logf("%d of the 50 before the failover came again; Subscriber: %d delivered, %d acked, %d claims, "+
		"%d sessions lost, %d resyncs, %d fenced writes", got.redelivered(handled), stats.Delivered, stats.Acked,
		stats.Claims, stats.SessionsLost, stats.Resyncs, stats.FencedWrites)
	require.Positive(t, stats.Resyncs, "the Subscriber did not notice the failover")

	stopSub()
	require.NoError(t, sub.Close())
	consumers.Wait()
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}

// publishAfterSwitch publishes n messages to topic one after the other,
// each until a call returns nil, and returns their UUIDs in publish order
// and how many calls failed (while the new server was not reachable yet).
func publishAfterSwitch(t *testing.T, pub *pglease.Publisher, topic string, n int) ([]string, int) {
	t.Helper()
	var (
		after  []string
		failed int
	)
	deadline := time.Now().Add(time.Minute)
	for i := range n {
		msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		failed += publishUntilStored(t, pub, topic, msg, deadline)
		after = append(after, msg.UUID)
	}
	return after, failed
}

// TestCopyStartedAsItIsDeliversWhatIsPublishedAfter: a copy of the primary
// (a base backup without recovery settings: what a disk or VM snapshot
// restored in place looks like) is started on the primary's address after
// the primary dies. It is on the same timeline, with the same system
// identifier; the Subscriber handled messages on the primary after the
// copy was taken, so it holds positions above the copy's transaction
// counter. Every message published on the copy must be delivered, in
// order.
//
// Taken after the last heartbeat, the copy's WAL and counter are ahead of
// what that heartbeat read: only the identity of the server (a postmaster
// started since) tells. Taken before it, the next heartbeat would tell,
// but the messages published on the copy in the meantime pass the
// Subscriber's position and are committed over those below it. A long
// SessionTTL (a heartbeat every 10 s) keeps both windows open for the
// whole switch.
func TestCopyStartedAsItIsDeliversWhatIsPublishedAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		// copyAfterHeartbeat: the copy is taken right after a heartbeat,
		// then handledAfter messages are handled; otherwise the messages
		// are handled after the copy, then a heartbeat passes.
		copyAfterHeartbeat bool
		handledAfter       int
	}{
		{name: "taken within one heartbeat of the last ack", copyAfterHeartbeat: true, handledAfter: 150},
		{name: "taken before the last heartbeat", copyAfterHeartbeat: false, handledAfter: 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			c := startCluster(t, pgrepl.Options{})
			require.NoError(t, c.Standby.Stop()) // not used
			pool := newPoolOn(t, c.Primary.DSN(), 8)
			adapter := newSchema(t, pool)
			pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, testLogger())
			require.NoError(t, err)
			t.Cleanup(func() { _ = pub.Close() })
			sub := newFailoverSubscriber(t, pool, adapter, pglease.SubscriberConfig{SessionTTL: 30 * time.Second})
			subCtx, stopSub := context.WithCancel(ctx)
			defer stopSub()
			msgs, err := sub.Subscribe(subCtx, "t")
			require.NoError(t, err)
			got := newDeliveries()
			var consumers sync.WaitGroup
			got.consume(0, msgs, &consumers)

			warmup := publishN(t, pub, "t", 10)
			require.Empty(t, got.waitDelivered(warmup, 30*time.Second), "warm-up messages not delivered")
			waitCommitted(t, pool, adapter, "t")

			handle := func() []string {
				handled := publishN(t, pub, "t", tc.handledAfter)
				require.Empty(t, got.waitDelivered(handled, 30*time.Second), "the messages before the switch not delivered")
				waitCommitted(t, pool, adapter, "t")
				return handled
			}
			var handled []string
			if tc.copyAfterHeartbeat {
				waitHeartbeat(t, sub)
			}
			began := time.Now()
			cp, err := c.Primary.Copy(ctx, "copy")
			require.NoError(t, err)
			handled = handle()
			if !tc.copyAfterHeartbeat {
				waitHeartbeat(t, sub)
			}
			require.NoError(t, c.Primary.Kill())
			require.NoError(t, cp.StartOn(ctx, c.Primary.Port()))
			t.Logf("copy taken, %d messages handled, copy started on the primary's port: %s after the copy began",
				len(handled), time.Since(began).Round(time.Millisecond))

			after, failedCalls := publishAfterSwitch(t, pub, "t", 100)
			t.Logf("100 messages published on the copy (%d calls failed and were retried)", failedCalls)
			got.requireDeliveredInOrder(t, after, time.Minute)
			stats := sub.Stats()
			t.Logf("%d of the %d handled after the copy came again; Subscriber: %d delivered, %d claims, %d sessions lost, "+
				"%d resyncs", got.redelivered(handled), len(handled), stats.Delivered, stats.Claims, stats.SessionsLost, stats.Resyncs)
			require.Positive(t, stats.Resyncs, "the Subscriber did not notice the copy")

			stopSub()
			require.NoError(t, sub.Close())
			consumers.Wait()
			require.NoError(t, pub.Close())
			assertNoLeakedGoroutines(t)
		})
	}
}

// TestSynchronousFailoverLosesNoPublishedMessage: publishers publish keyed
// messages continuously on a topic of 4 partitions while two Subscribers of
// a group consume it; the primary is killed mid-load and its synchronous
// standby promoted; publishing goes on through the multi-host DSN. Every
// message whose Publish returned nil must be delivered, and the messages of
// a key in the order they were published (duplicates allowed: a message may
// come again after the ones that followed it, never for the first time
// after them).
func TestSynchronousFailoverLosesNoPublishedMessage(t *testing.T) {
	const (
		publishers    = 4
		keysPerPub    = 2
		partitions    = 4
		publishPause  = 10 * time.Millisecond
		loadBefore    = 2 * time.Second
		loadAfter     = 2 * time.Second
		deliveryLimit = time.Minute
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, pgrepl.Options{Synchronous: true})
	pool := newPoolOn(t, c.MultiHostDSN(), 12)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "orders", pglease.TopicConfig{Partitions: partitions,
		Tables: adapter, InitializeSchema: true}))

	got := newDeliveries()
	var consumers sync.WaitGroup
	subCtx, stopSubs := context.WithCancel(ctx)
	defer stopSubs()
	var subs []*pglease.Subscriber
	for i := range 2 {
		sub := newFailoverSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g",
			SessionTTL: 10 * time.Second})
		msgs, err := sub.Subscribe(subCtx, "orders")
		require.NoError(t, err)
		got.consume(i, msgs, &consumers)
		subs = append(subs, sub)
	}

	// Each publisher owns its keys and publishes their messages in turn,
	// each until a call returns nil.
	var (
		mu        sync.Mutex
		published = map[string][]string{} // key -> UUIDs whose Publish returned nil, in order
		failed    atomic.Int64
		stop      atomic.Bool
		pubs      sync.WaitGroup
	)
	for p := range publishers {
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			seqs := make([]int, keysPerPub)
			for i := 0; !stop.Load(); i++ {
				k := i % keysPerPub
				key := fmt.Sprintf("key-%d-%d", p, k)
				msg := message.NewMessage(fmt.Sprintf("%s-%d", key, seqs[k]), nil)
				msg.Metadata.Set(pglease.PartitionKeyMetadata, key)
				msg.Metadata.Set("seq", strconv.Itoa(seqs[k]))
				for !stop.Load() {
					pctx, pcancel := context.WithTimeout(ctx, publishTimeout)
					msg.SetContext(pctx)
					err := pub.Publish("orders", msg)
					pcancel()
					if err == nil {
						mu.Lock()
						published[key] = append(published[key], msg.UUID)
						mu.Unlock()
						seqs[k]++
						break
					}
					// Across the failover: the call may or may not have
					// stored the message; it is published again.
					failed.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(publishPause)
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, u := range published {
			n += len(u)
		}
		return n
	}

	time.Sleep(loadBefore)
	before := count()
	killedAt := time.Now()
	require.NoError(t, c.Primary.Kill())
	require.NoError(t, c.Standby.Promote(ctx))
	promotedAt := count()
	t.Logf("%d messages published before the kill; primary killed and standby promoted in %s",
		before, time.Since(killedAt).Round(time.Millisecond))
	waitFor(t, time.Minute, "a Publish to succeed on the promoted standby", func() bool { return count() > promotedAt })
	t.Logf("publishing again %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(loadAfter)
	stop.Store(true)
	pubs.Wait()

	var all []string
	mu.Lock()
	for _, u := range published {
		all = append(all, u...)
	}
	mu.Unlock()
	missing := got.waitDelivered(all, deliveryLimit)
	sort.Strings(missing)
	t.Logf("%d messages published (%d calls failed and were retried), %d delivered, %d not delivered within %s",
		len(all), failed.Load(), len(all)-len(missing), len(missing), deliveryLimit)
	for i, s := range subs {
		st := s.Stats()
		t.Logf("Subscriber %d: %d delivered, %d acked, %d claims (%d takeovers), %d sessions lost, %d fenced writes",
			i, st.Delivered, st.Acked, st.Claims, st.Takeovers, st.SessionsLost, st.FencedWrites)
	}
	if len(missing) > 0 {
		t.Errorf("%d messages whose Publish returned nil were not delivered, e.g. %s",
			len(missing), strings.Join(missing[:min(len(missing), 10)], ", "))
	}

	// Per key, a message is delivered for the first time only after every
	// message published before it.
	got.mu.Lock()
	firstSeen := map[string]int{} // key -> messages of it delivered so far
	var disorder []string
	duplicates := 0
	for _, d := range got.log {
		if got.seen[d.uuid] > 1 {
			duplicates++
		}
		n := firstSeen[d.key]
		switch {
		case d.seq < n:
			// Again.
		case d.seq == n:
			firstSeen[d.key] = n + 1
		default:
			disorder = append(disorder, fmt.Sprintf("%s delivered (by Subscriber %d) before %s-%d", d.uuid, d.subscriber, d.key, n))
			firstSeen[d.key] = d.seq + 1
		}
	}
	got.mu.Unlock()
	t.Logf("%d deliveries of messages delivered more than once", duplicates)
	if len(disorder) > 0 {
		t.Errorf("%d messages delivered out of their key's order, e.g.:\n%s", len(disorder),
			strings.Join(disorder[:min(len(disorder), 10)], "\n"))
	}

	stopSubs()
	for _, s := range subs {
		require.NoError(t, s.Close())
	}
	consumers.Wait()
	assertNoLeakedGoroutines(t)
}
