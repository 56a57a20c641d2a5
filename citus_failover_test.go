package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// TestCitusWorkerFailover fails a worker of a Citus cluster over to a
// real streaming standby of it while numbered messages are published to
// six topics through one Publisher, three topics whose shard lies on that
// worker and three on the other, and two Subscribers of a group consume
// them. The worker is
// killed (every process at once, as a machine that loses power), the
// standby promoted (pg_ctl promote) and the coordinator pointed at it as
// docs/operations.md says an operator does: citus_update_node, then
// recover_prepared_transactions. The cluster is the test's own (a
// coordinator, two workers and the standby, started by pgrepl next to the
// cluster of `make test-citus`, which enables it).
//
//   - synchronous: the standby is the worker's synchronous standby. Every
//     message whose Publish returned nil is delivered, each topic in
//     publish order; a message comes again only after a resynchronisation
//     or a takeover, at most CommitBatch+1 behind the furthest delivered
//     (acknowledged and not committed, or handed out and not
//     acknowledged), or right after itself (a Publish retried after a
//     failed call that had stored it).
//   - lagging: the standby is asynchronous and stops receiving WAL before
//     the last messages of the failing worker's topics are published,
//     delivered and their positions committed; PostgreSQL loses them
//     with the worker. Every message published before the lag and after
//     the failover, and every message the cluster holds, is delivered,
//     each topic in publish order; a message comes again only if it was
//     delivered before the failover.
//
// In both, the topics of the other worker are published and delivered
// while the failing worker is down, and the Subscribers find the failover
// (the worker's identity, read when its topics were claimed, changed) and
// claim again from the positions the database holds
// (SubscriberStats.Resyncs, and ErrDatabaseWentBack logged naming a topic
// of that worker).
//
//   - outage longer than SessionTTL: synchronous, the worker down until
//     both Subscribers have lost their sessions (a heartbeat writes a
//     reference table, on every node: it fails while a worker is down);
//     the other worker's topics are published meanwhile. After the
//     failover, the synchronous case's guarantee.
func TestCitusWorkerFailover(t *testing.T) {
	t.Run("synchronous", func(t *testing.T) { testCitusWorkerFailover(t, false, false) })
	t.Run("lagging", func(t *testing.T) { testCitusWorkerFailover(t, true, false) })
	t.Run("outage longer than SessionTTL", func(t *testing.T) { testCitusWorkerFailover(t, false, true) })
}

// failoverTopic is one topic of TestCitusWorkerFailover and what its
// Publisher stored.
type failoverTopic struct {
	name    string
	failing bool // on the worker that fails over

	mu        sync.Mutex
	published []publishedMsg // Publish returned nil, in publish order
	failed    int            // calls that returned an error
	lastErr   error          // of the last call that failed
}

type publishedMsg struct {
	uuid string
	seq  int
	at   time.Time // when Publish returned
}

func (f *failoverTopic) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.published)
}

func (f *failoverTopic) uuids(from, to time.Time) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.published {
		if !p.at.Before(from) && p.at.Before(to) {
			out = append(out, p.uuid)
		}
	}
	return out
}

func testCitusWorkerFailover(t *testing.T, lagging, outlive bool) {
	const (
		group        = "g"
		commitBatch  = 10
		publishPause = 20 * time.Millisecond
		perPhase     = 20 // messages each topic gets published in each phase, at least
		phaseLimit   = 30 * time.Second
	)
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs Citus: run `make test-citus`")
	}
	pgtest.SkipShort(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	x, err := pgrepl.StartCitus(ctx, pgrepl.CitusOptions{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, x.Close()) })
	worker, other := x.Workers[0], x.Workers[1]
	standby, err := x.StartStandby(ctx, worker, pgrepl.CitusStandbyOptions{Synchronous: !lagging})
	require.NoError(t, err)

	pool := newPoolOn(t, x.Coordinator.DSN(), 24)
	// The cluster is thrown away with its tables.
	adapter := pglease.Tables{Schema: "pglease_failover"}
	distribute(t, pool, adapter)
	messages := table(adapter, pglease.DefaultMessagesTable)

	// Three topics on each worker.
	var topics []*failoverTopic
	var onWorker, onOther int
	for i := 0; i < 64 && (onWorker < 3 || onOther < 3); i++ {
		name := fmt.Sprintf("fo%02d", i)
		var port int
		require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_shard_placement
			WHERE shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, messages, name).Scan(&port))
		switch {
		case port == worker.Port() && onWorker < 3:
			onWorker++
			topics = append(topics, &failoverTopic{name: name, failing: true})
		case port == other.Port() && onOther < 3:
			onOther++
			topics = append(topics, &failoverTopic{name: name})
		}
	}
	require.Len(t, topics, 6, "three topics on each worker among the first 64 names")
	names := make([]string, len(topics))
	for i, f := range topics {
		names[i] = f.name
	}

	// Two Subscribers of a group, each subscribed to every topic.
	logs := newCapturingLogger()
	got := newDeliveries()
	var consumers sync.WaitGroup
	subCtx, stopSubs := context.WithCancel(ctx)
	defer stopSubs()
	var subs []*pglease.Subscriber
	for i := range 2 {
		cfg := pglease.SubscriberConfig{Tables: adapter, ConsumerGroup: group, CommitBatch: commitBatch,
			PollInterval: 100 * time.Millisecond}
		if outlive {
			cfg.SessionTTL = 2 * time.Second
		}
		sub, err := pglease.NewSubscriber(pool, cfg, logs)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		for _, name := range names {
			msgs, err := sub.Subscribe(subCtx, name)
			require.NoError(t, err)
			got.consume(i, msgs, &consumers)
		}
		subs = append(subs, sub)
	}

	// A goroutine per topic publishes its numbered messages one after the
	// other, each until a call returns nil (a call that fails may have
	// stored it), through one Publisher: its group commit writes calls to
	// topics of both workers together, and a statement refused while a
	// worker is down is written again call by call.
	var (
		stop atomic.Bool
		pubs sync.WaitGroup
	)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for _, f := range topics {
		pubs.Go(func() {
			for seq := 0; !stop.Load(); seq++ {
				msg := message.NewMessage(fmt.Sprintf("%s-%05d", f.name, seq), nil)
				// The key of a topic of one partition does not matter;
				// deliveries records it.
				msg.Metadata.Set(pglease.PartitionKeyMetadata, f.name)
				msg.Metadata.Set("seq", strconv.Itoa(seq))
				for !stop.Load() {
					pctx, pcancel := context.WithTimeout(ctx, publishTimeout)
					msg.SetContext(pctx)
					err := pub.Publish(f.name, msg)
					pcancel()
					f.mu.Lock()
					if err == nil {
						f.published = append(f.published, publishedMsg{uuid: msg.UUID, seq: seq, at: time.Now()})
					} else {
						f.failed++
						f.lastErr = err
					}
					f.mu.Unlock()
					if err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(publishPause)
			}
		})
	}
	defer func() {
		stop.Store(true)
		pubs.Wait()
	}()
	// waitPublished waits until every topic of which has n more messages
	// published than in counts.
	counts := func() []int {
		out := make([]int, len(topics))
		for i, f := range topics {
			out[i] = f.count()
		}
		return out
	}
	waitPublished := func(what string, which func(*failoverTopic) bool, from []int, n int) {
		t.Helper()
		deadline := time.Now().Add(phaseLimit)
		for {
			behind := ""
			for i, f := range topics {
				if which(f) && f.count() < from[i]+n {
					f.mu.Lock()
					behind = fmt.Sprintf("topic %s: %d published, %d calls failed, the last with: %v", f.name,
						len(f.published)-from[i], f.failed, f.lastErr)
					f.mu.Unlock()
					break
				}
			}
			if behind == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s: %s", what, phaseLimit, behind)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	all := func(*failoverTopic) bool { return true }
	failing := func(f *failoverTopic) bool { return f.failing }
	healthy := func(f *failoverTopic) bool { return !f.failing }
	// waitDelivered waits until every message of which published up to
	// now is delivered.
	waitDelivered := func(what string, which func(*failoverTopic) bool) {
		t.Helper()
		var want []string
		for _, f := range topics {
			if which(f) {
				want = append(want, f.uuids(time.Time{}, time.Now())...)
			}
		}
		missing := got.waitDelivered(want, phaseLimit)
		require.Empty(t, missing, "%s: %d of %d messages not delivered within %s", what, len(missing), len(want), phaseLimit)
	}

	waitPublished("the first messages published", all, counts(), perPhase)
	waitDelivered("before the failover", all)
	var lagFrom time.Time
	if lagging {
		// The standby has everything published so far, then lags: what
		// is published, delivered and committed from here on is lost
		// with the worker.
		// (A Publish that returned before lagFrom committed below lsn.)
		lagFrom = time.Now()
		lsn, err := worker.CurrentLSN(ctx)
		require.NoError(t, err)
		require.NoError(t, standby.WaitReplayed(ctx, lsn))
		require.NoError(t, standby.PauseStreaming(ctx))
		waitPublished("messages published while the standby lags", failing, counts(), perPhase)
		waitDelivered("the messages published while the standby lags", failing)
		// Their positions committed: the Subscribers hold positions the
		// promoted standby never saw.
		var last []string
		for _, f := range topics {
			if f.failing {
				u := f.uuids(lagFrom, time.Now())
				last = append(last, u[len(u)-1])
			}
		}
		waitFor(t, phaseLimit, "the positions of the messages published during the lag committed", func() bool {
			var behind int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM `+messages+` m
				JOIN `+table(adapter, pglease.DefaultConsumerOffsetsTable)+` o ON o.consumer_group = $1 AND o.topic = m.topic
					AND o.partition = m.partition
				WHERE m.topic = ANY($2) AND m.uuid = ANY($3) AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)`,
				group, names, last).Scan(&behind)
			return err == nil && behind == 0
		})
	}

	// The worker crashes. What commits on it until every process of it is
	// gone is published before the failover (and, when the standby lags,
	// lost with the worker). The other worker's topics go on: published,
	// and delivered while the sessions last.
	killedAt := time.Now()
	require.NoError(t, worker.Kill())
	dead := time.Now()
	got.mu.Lock()
	deadAtDelivery := len(got.log)
	got.mu.Unlock()
	t.Logf("worker killed in %s", dead.Sub(killedAt).Round(time.Millisecond))
	down := counts()
	lostBefore := make([]uint64, len(subs))
	for i, s := range subs {
		lostBefore[i] = s.Stats().SessionsLost
	}
	waitPublished("the other worker's topics published while the worker is down", healthy, down, perPhase)
	if outlive {
		waitFor(t, phaseLimit, "both Subscribers to lose their sessions", func() bool {
			for i, s := range subs {
				if s.Stats().SessionsLost == lostBefore[i] {
					return false
				}
			}
			return true
		})
		waitPublished("the other worker's topics published once the sessions are lost", healthy, counts(), perPhase)
	} else {
		waitDelivered("the other worker's topics while the worker is down", healthy)
	}
	for i, f := range topics {
		if f.failing {
			require.LessOrEqual(t, f.count(), down[i]+1, "topic %s published to while its worker is down", f.name)
		}
	}
	t.Logf("worker down for %s: the other worker's topics published meanwhile (and delivered: %t)",
		time.Since(killedAt).Round(time.Millisecond), !outlive)

	// The operator's failover: promote the standby, point the coordinator
	// at it, finish the two-phase commits the worker had prepared.
	require.NoError(t, standby.Promote(ctx))
	switchCtx, switchCancel := context.WithTimeout(ctx, 30*time.Second)
	defer switchCancel()
	var nodeID int
	require.NoError(t, pool.QueryRow(switchCtx, `SELECT nodeid FROM pg_catalog.pg_dist_node WHERE nodename = '127.0.0.1' AND nodeport = $1`,
		worker.Port()).Scan(&nodeID))
	_, err = pool.Exec(switchCtx, `SELECT pg_catalog.citus_update_node($1, '127.0.0.1', $2)`, nodeID, standby.Port())
	require.NoError(t, err)
	var recovered int
	require.NoError(t, pool.QueryRow(switchCtx, `SELECT pg_catalog.recover_prepared_transactions()`).Scan(&recovered))
	switchedAt := time.Now()
	t.Logf("standby promoted and registered %s after the kill (%d prepared transactions recovered)",
		switchedAt.Sub(killedAt).Round(time.Millisecond), recovered)

	switched := counts()
	waitPublished("every topic published to after the failover", all, switched, perPhase)
	t.Logf("the failing worker's topics published to again %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	stop.Store(true)
	pubs.Wait()
	endAt := time.Now()

	// What must be delivered: every message whose Publish returned nil;
	// when the standby lagged, those of its worker's topics published
	// during the lag only if the cluster still has them.
	rows, err := pool.Query(ctx, `SELECT DISTINCT uuid FROM `+messages+` WHERE topic = ANY($1)`, names)
	require.NoError(t, err)
	storedList, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	stored := make(map[string]bool, len(storedList))
	for _, u := range storedList {
		stored[u] = true
	}
	var want []string
	wanted := map[string]bool{}
	lost, lagged := 0, 0
	for _, f := range topics {
		during := map[string]bool{}
		if lagging && f.failing {
			for _, u := range f.uuids(lagFrom, dead) {
				during[u] = true
			}
		}
		for _, u := range f.uuids(time.Time{}, endAt) {
			if during[u] {
				lagged++
				if !stored[u] {
					lost++
					continue
				}
			}
			want = append(want, u)
			wanted[u] = true
		}
	}
	for _, u := range storedList {
		if !wanted[u] {
			want = append(want, u) // stored by a call that failed
		}
	}
	missing := got.waitDelivered(want, time.Minute)
	if lagging {
		t.Logf("%d messages published while the standby lagged, %d of them lost with the worker", lagged, lost)
		require.Positive(t, lost, "the standby was to lag: it has every message published after PauseStreaming")
	}
	for _, f := range topics {
		f.mu.Lock()
		for _, m := range f.published {
			if wanted[m.uuid] && !stored[m.uuid] {
				t.Errorf("message %s (topic on the failing worker: %t): Publish returned nil %s after the lag began, %s after the kill, "+
					"not in the database after the failover", m.uuid, f.failing, m.at.Sub(lagFrom), m.at.Sub(killedAt))
			}
		}
		f.mu.Unlock()
	}
	if t.Failed() {
		return
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d messages not delivered, e.g. %s", len(missing), len(want),
			strings.Join(missing[:min(len(missing), 10)], ", "))
	}

	// Per topic: first deliveries in publish order (sequence numbers
	// increasing; when the standby lagged, some are missing); a message
	// delivered again either right after itself, or within what the
	// guarantee allows.
	afterFailover := map[string]bool{} // the UUIDs first delivered once the worker was dead
	got.mu.Lock()
	var disorder, beyond []string
	duplicates := 0
	furthest := map[string]int{} // topic -> highest sequence number delivered
	seen := map[string]bool{}
	for i, d := range got.log {
		hi, ok := furthest[d.key]
		if !ok {
			hi = -1
		}
		switch {
		case !seen[d.uuid] && d.seq <= hi:
			disorder = append(disorder, fmt.Sprintf("%s first delivered (by Subscriber %d) after %s-%05d", d.uuid, d.subscriber, d.key, hi))
		case seen[d.uuid]:
			duplicates++
			again := hi - d.seq
			switch {
			case again == 0:
				// Right after itself: stored twice, by a call that
				// failed and the one that retried it.
			case lagging && afterFailover[d.uuid]:
				beyond = append(beyond, fmt.Sprintf("%s: first delivered after the failover, and again (%d behind)", d.uuid, again))
			case !lagging && again > commitBatch+1:
				beyond = append(beyond, fmt.Sprintf("%s delivered again %d messages behind the furthest (delivery %d)", d.uuid, again, i))
			}
		}
		if !seen[d.uuid] && i >= deadAtDelivery {
			afterFailover[d.uuid] = true
		}
		seen[d.uuid] = true
		furthest[d.key] = max(hi, d.seq)
	}
	got.mu.Unlock()
	failedCalls := 0
	for _, f := range topics {
		failedCalls += f.failed
	}
	t.Logf("%d messages to deliver (%d Publish calls failed and were retried), %d deliveries of messages delivered again",
		len(want), failedCalls, duplicates)
	if len(disorder) > 0 {
		t.Errorf("%d messages delivered out of their topic's order, e.g.:\n%s", len(disorder),
			strings.Join(disorder[:min(len(disorder), 10)], "\n"))
	}
	if len(beyond) > 0 {
		t.Errorf("%d messages delivered again beyond what the guarantee allows, e.g.:\n%s", len(beyond),
			strings.Join(beyond[:min(len(beyond), 10)], "\n"))
	}

	// The Subscribers found the failover and claimed again (after an
	// outage longer than SessionTTL, with the sessions they made after
	// theirs expired: nothing of the old worker is left to find).
	var resyncs uint64
	for i, s := range subs {
		st := s.Stats()
		resyncs += st.Resyncs
		t.Logf("Subscriber %d: %d delivered, %d acked, %d claims (%d takeovers), %d sessions lost, %d resyncs, %d fenced writes",
			i, st.Delivered, st.Acked, st.Claims, st.Takeovers, st.SessionsLost, st.Resyncs, st.FencedWrites)
	}
	var detected []string
	workerNamed := false
	for _, e := range logs.Entries() {
		if errors.Is(e.Err, pglease.ErrDatabaseWentBack) {
			by, _ := e.Fields["detected_by"].(string)
			detected = append(detected, by)
			_, named := e.Fields["worker_now"]
			workerNamed = workerNamed || named
		}
	}
	if !outlive {
		require.Positive(t, resyncs, "the Subscribers did not notice the failover")
		require.NotEmpty(t, detected, "ErrDatabaseWentBack logged")
		require.True(t, workerNamed, "the worker that went back named in the log, not only the coordinator's counters")
	}
	t.Logf("detected by: %s", strings.Join(detected, "; "))
	for _, by := range detected {
		require.True(t, slices.ContainsFunc(topics, func(f *failoverTopic) bool {
			return f.failing && strings.Contains(by, strconv.Quote(f.name))
		}), "the failover detected by a statement of a topic of the failed worker: %s", by)
	}

	stopSubs()
	for _, s := range subs {
		require.NoError(t, s.Close())
	}
	consumers.Wait()
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
	t.Logf("test took %s", time.Since(began).Round(time.Millisecond))
}

// distribute creates the tables of adapter on the coordinator of pool
// and distributes them (DistributeSQL).
func distribute(t testing.TB, pool *pgxpool.Pool, adapter pglease.Tables) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	_, err := pool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err)
}
