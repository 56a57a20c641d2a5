// The failover tests of issue 21, on real streaming replication
// (internal/pgrepl): a primary and a standby of their own, started by each
// test, next to the shared test database of PGLEASE_TEST_DSN (which they
// do not use). `make test` runs them once; `make stress` repeats them
// (TestStressFailover).
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
	pgtest.SkipShort(t) // runs PostgreSQL's programs
	t.Helper()
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgrepl.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// newFailoverSubscriber returns a Subscriber on pool (a pool of the
// cluster's MultiHostDSN, whose LISTEN connection follows the primary too),
// closed at the end of the test.
func newFailoverSubscriber(t *testing.T, pool *pgxpool.Pool, adapter pglease.DefaultSchemaAdapter, cfg pglease.SubscriberConfig) *pglease.Subscriber {
	t.Helper()
	cfg.SchemaAdapter = adapter
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
// asynchronous standby stops receiving WAL while the primary runs 2,000
// transactions and a Subscriber handles 50 messages; the primary
// crashes and the standby, which never saw any of that, is promoted. The
// Subscriber (whose session, 30 s, outlives the failover) must deliver the
// 100 messages published on the new primary. Some of the 50 may come again.
//
// Fails today: the Subscriber keeps its in-memory position from the old
// primary's timeline, whose transaction ids the new primary hands out
// again, and skips everything published after the failover.
func TestFailoverToALaggingStandbyDeliversWhatIsPublishedAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, pgrepl.Options{})
	pool := newPoolOn(t, c.MultiHostDSN(), 8)
	adapter := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, testLogger())
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

	// The session, the claim and a first position reach the standby.
	warmup := publishN(t, pub, "t", 10)
	require.Empty(t, got.waitDelivered(warmup, 30*time.Second), "warm-up messages not delivered")
	waitFor(t, 10*time.Second, "the warm-up acks to be committed", func() bool {
		return sub.Stats().Acked >= uint64(len(warmup))
	})
	time.Sleep(300 * time.Millisecond) // CommitInterval is 100ms
	require.NoError(t, c.WaitCaughtUp(ctx))

	// The standby lags from here on. (Pausing its replay alone would not
	// do: a promotion replays all the WAL the standby received.)
	require.NoError(t, c.Standby.PauseStreaming(ctx))

	// The primary's transaction counter moves far ahead of the standby's,
	// then the Subscriber handles 50 messages: their positions lie above
	// every transaction id the promoted standby will hand out for a while.
	// (With the 50 messages first, the messages published after the
	// failover with ids above theirs are delivered: 45 of 100 when tried.)
	primary, err := pgx.Connect(ctx, c.Primary.DSN())
	require.NoError(t, err)
	var xidBefore, xidAfter uint64
	require.NoError(t, primary.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xidBefore))
	for range 2000 {
		_, err := primary.Exec(ctx, "SELECT pg_current_xact_id()")
		require.NoError(t, err)
	}
	require.NoError(t, primary.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xidAfter))
	require.NoError(t, primary.Close(ctx))
	handled := publishN(t, pub, "t", 50)
	require.Empty(t, got.waitDelivered(handled, 30*time.Second), "the 50 messages before the failover not delivered")
	waitFor(t, 10*time.Second, "the 50 acks", func() bool {
		return sub.Stats().Acked >= uint64(len(warmup)+len(handled))
	})
	time.Sleep(300 * time.Millisecond) // their commit, lost with the primary

	require.NoError(t, c.Primary.Kill())
	require.NoError(t, c.Standby.Promote(ctx))
	promoted, err := pgx.Connect(ctx, c.Standby.DSN())
	require.NoError(t, err)
	var xidPromoted uint64
	require.NoError(t, promoted.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xidPromoted))
	var lost int
	require.NoError(t, promoted.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE uuid = ANY($1)",
		table(adapter, pglease.DefaultMessagesTable)), handled).Scan(&lost))
	require.NoError(t, promoted.Close(ctx))
	t.Logf("transaction counter: %d before the 2,000 transactions, %d after (then the 50 messages), %d on the promoted standby; "+
		"%d of the 50 messages are on the promoted standby", xidBefore, xidAfter, xidPromoted, lost)
	require.Zero(t, lost, "the standby was to lag: it has messages published after PauseStreaming")
	require.LessOrEqual(t, xidPromoted, xidBefore, "the promoted standby's counter is behind the old primary's")

	// Published on the new primary, through the same pool.
	var after []string
	var failedCalls int
	deadline := time.Now().Add(time.Minute)
	for i := range 100 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		failedCalls += publishUntilStored(t, pub, "t", msg, deadline)
		after = append(after, msg.UUID)
	}
	t.Logf("100 messages published on the promoted standby (%d calls failed and were retried)", failedCalls)

	missing := got.waitDelivered(after, time.Minute)
	stats := sub.Stats()
	t.Logf("delivered %d of the 100 messages published after the failover; %d of the 50 before it came again; "+
		"Subscriber: %d delivered, %d acked, %d claims, %d sessions lost, %d fenced writes",
		len(after)-len(missing), got.redelivered(handled), stats.Delivered, stats.Acked, stats.Claims,
		stats.SessionsLost, stats.FencedWrites)
	if len(missing) > 0 {
		t.Errorf("%d of the 100 messages published after the failover were not delivered within a minute", len(missing))
	}

	stopSub()
	require.NoError(t, sub.Close())
	consumers.Wait()
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
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
		SchemaAdapter: adapter, InitializeSchema: true}))

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
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, testLogger())
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
