package pglease_test

import (
	"context"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// Failure tests: real helper processes (process_test.go), real signals, a
// real PostgreSQL restart and real backend terminations. Each run is
// judged by history.verify (history_test.go) and by the checks of its
// scenario.

const failureGroup = "g"

// failureSetup is a schema with the harness installed, a publisher and the
// base configuration of the helper processes.
type failureSetup struct {
	pool    *pgxpool.Pool
	adapter pglease.Tables
	pub     *pglease.Publisher
	cfg     helperConfig
}

func newFailureSetup(t *testing.T, ttl time.Duration, topics ...string) failureSetup {
	t.Helper()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	instrument(t, pool, adapter)
	return failureSetup{
		pool:    pool,
		adapter: adapter,
		pub:     newPublisher(t, pool, adapter),
		cfg: helperConfig{
			Schema:       adapter.Schema,
			Group:        failureGroup,
			Topics:       topics,
			Mode:         modeRouter,
			SessionTTL:   ttl,
			PollInterval: pglease.DefaultPollInterval,
			Work:         time.Millisecond,
		},
	}
}

// startOwnerAndStandby starts helper A, waits until it owns every topic,
// then starts helper B, the hot standby.
func (s failureSetup) startOwnerAndStandby(t *testing.T) (a, b *helperProc) {
	t.Helper()
	a = startHelper(t, s.cfg.named("A"))
	for _, topic := range s.cfg.Topics {
		waitFor(t, 10*time.Second, "A to claim "+topic, func() bool {
			return ownerPID(s.pool, s.adapter, failureGroup, topic) == a.pid()
		})
	}
	b = startHelper(t, s.cfg.named("B"))
	return a, b
}

// TestCrashTakeover kills the owning process with SIGKILL while messages
// stream in. The standby takes over once the dead session expires, within
// SessionTTL plus two heartbeat intervals; nothing is lost or reordered;
// the only messages processed twice are those the dead process processed
// after the last position it committed, which is where the standby starts.
func TestCrashTakeover(t *testing.T) {
	const ttl = 2 * time.Second
	s := newFailureSetup(t, ttl, "t")
	a, b := s.startOwnerAndStandby(t)
	st := startStream(t, s.pub, "t", 2*time.Millisecond)
	waitProgress(t, s.pool, s.adapter, "A", time.Time{}, 150, 30*time.Second)

	a.signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	waitProgress(t, s.pool, s.adapter, "B", killedAt, 150, 30*time.Second)
	st.halt()
	waitProcessed(t, s.pool, s.adapter, s.cfg.Topics, 30*time.Second)
	b.close(t)

	h := loadHistory(t, s.pool, s.adapter, failureGroup)
	sum := h.verify(t, s.cfg.Topics)
	failed, _ := h.verifyPublishes(t, st.results())
	assert.Zero(t, failed, "Publish failed although the database was fine")

	claim := h.firstClaimAfter(t, "t", b.pid(), time.Time{})
	takeover := claim.at.Sub(killedAt)
	bound := ttl + 2*(ttl/3)
	assert.Less(t, takeover, bound, "takeover after SIGKILL must come within SessionTTL + 2 heartbeat intervals")
	recsB := h.recordsOf("B")
	require.NotEmpty(t, recsB)
	for _, r := range recsB {
		require.True(t, r.received.After(killedAt), "B processed %s before A was killed", r.uuid)
	}

	// The duplicates are exactly A's records at or after B's start.
	var want []string
	for _, r := range h.recordsOf("A") {
		if r.idx >= claim.startIdx {
			want = append(want, r.uuid)
		}
	}
	sort.Strings(want)
	got := h.duplicates()
	assert.Equal(t, want, got, "duplicates must be exactly what A processed after its last committed position")
	for id, n := range h.counts() {
		assert.LessOrEqual(t, n, 2, "message %s processed %d times", id, n)
	}
	t.Logf("crash takeover: claim %s after SIGKILL (bound %s, SessionTTL %s), first message processed by B %s after SIGKILL; "+
		"%d messages, %d duplicates (A processed up to message %d, B started at %d)",
		takeover.Round(time.Millisecond), bound, ttl, recsB[0].received.Sub(killedAt).Round(time.Millisecond),
		sum.messages, len(got), h.recordsOf("A")[len(h.recordsOf("A"))-1].idx, claim.startIdx)
}

// TestGracefulHandover ends the owner's subscription cleanly while messages
// stream in, by closing its process (SIGTERM: Router and Subscriber
// closed) and, separately, by cancelling its Subscribe contexts with the
// Subscriber left open. The standby starts within a second, long before the
// session TTL, with no duplicates and no losses.
func TestGracefulHandover(t *testing.T) {
	// stop ends A's subscription and returns how long that took in A (the
	// exit of a -race binary adds a second of its own, not counted).
	cases := []struct {
		name string
		stop func(t *testing.T, a *helperProc) time.Duration
	}{
		{"Close", func(t *testing.T, a *helperProc) time.Duration { return a.close(t) }},
		{"CancelledContext", func(t *testing.T, a *helperProc) time.Duration {
			began := time.Now()
			a.command(t, "cancel")
			a.waitLine(t, "stopped", 30*time.Second)
			return time.Since(began)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const ttl = 10 * time.Second
			s := newFailureSetup(t, ttl, "t")
			// Longer than the bound: the standby must be woken by the
			// release, not find it by polling.
			s.cfg.PollInterval = 5 * time.Second
			a, b := s.startOwnerAndStandby(t)
			st := startStream(t, s.pub, "t", 3*time.Millisecond)
			waitProgress(t, s.pool, s.adapter, "A", time.Time{}, 100, 30*time.Second)

			stopAt := time.Now()
			stopping := tc.stop(t, a)
			waitProgress(t, s.pool, s.adapter, "B", stopAt, 100, 30*time.Second)
			st.halt()
			waitProcessed(t, s.pool, s.adapter, s.cfg.Topics, 30*time.Second)

			h := loadHistory(t, s.pool, s.adapter, failureGroup)
			sum := h.verify(t, s.cfg.Topics)
			assert.Zero(t, sum.duplicates, "a clean handover processes nothing twice")
			recsA, recsB := h.recordsOf("A"), h.recordsOf("B")
			require.NotEmpty(t, recsB)
			assert.Equal(t, recsA[len(recsA)-1].idx+1, recsB[0].idx, "B starts right after A's last message")

			releases := h.releasesBy("t", a.pid())
			require.Len(t, releases, 1, "A released the topic once")
			release := releases[0]
			claim := h.firstClaimAfter(t, "t", b.pid(), time.Time{})
			handover := recsB[0].received.Sub(stopAt)
			assert.Less(t, handover, time.Second, "B must start within 1s of A's close")
			for _, r := range recsB {
				require.True(t, r.received.After(release.at), "B processed %s before A released the topic", r.uuid)
			}
			if tc.name == "CancelledContext" {
				require.True(t, a.alive())
				var n int
				require.NoError(t, s.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
					table(s.adapter, pglease.DefaultConsumerSessionsTable)+" WHERE owner LIKE '%/' || $1",
					strconv.Itoa(a.pid())).Scan(&n))
				assert.Equal(t, 1, n, "A's Subscriber is still open: the handover came from the release, not from Close")
			}
			t.Logf("handover (%s): A stopped in %s; release to B's claim %s; release to B's first message %s; "+
				"stop to B's first message %s (SessionTTL %s); %d messages, 0 duplicates",
				tc.name, stopping.Round(time.Millisecond), claim.at.Sub(release.at).Round(time.Millisecond),
				recsB[0].received.Sub(release.at).Round(time.Millisecond), handover.Round(time.Millisecond), ttl, sum.messages)
			b.close(t)
		})
	}
}

// TestFrozenOwner freezes the owner with SIGSTOP beyond the session TTL,
// then lets it continue. The standby takes over once the frozen session
// expires; the frozen process, when it continues, delivers nothing and
// moves no offset (its commit is fenced, or it self-fences first), logs
// that it lost ownership, opens a new session and waits as a standby.
//
// Phase 1 freezes A while it holds an unacked message, which B then
// delivers again; A is told to ack it as it continues. Phase 2 freezes the
// new owner B while it idles, and publishes while it is frozen: when B
// continues, its poll timer and its self-fencing timer are both overdue,
// and the messages after its stale position must not be handed out. Phase
// 3 closes A: B, now a standby, claims cleanly.
func TestFrozenOwner(t *testing.T) {
	const ttl = 2 * time.Second
	s := newFailureSetup(t, ttl, "t")
	a, b := s.startOwnerAndStandby(t)

	// Phase 1.
	st := startStream(t, s.pub, "t", 5*time.Millisecond)
	waitProgress(t, s.pool, s.adapter, "A", time.Time{}, 50, 30*time.Second)
	held := publishHeld(t, s.pub, "t", "A")
	a.waitLine(t, "holding "+held, 30*time.Second)
	a.signal(t, syscall.SIGSTOP)
	frozenA := time.Now()
	waitFor(t, 3*ttl, "B to take over from the frozen A", func() bool { return ownerPID(s.pool, s.adapter, failureGroup, "t") == b.pid() })
	waitProgress(t, s.pool, s.adapter, "B", frozenA, 50, 30*time.Second)
	a.command(t, "go") // read as soon as A runs again: it acks the held message at once
	a.signal(t, syscall.SIGCONT)
	resumedA := time.Now()
	waitFor(t, 3*ttl, "A to open a new session", func() bool { return sessionOpenedAfter(s.pool, s.adapter, a.pid(), frozenA) })
	waitProgress(t, s.pool, s.adapter, "B", resumedA, 50, 30*time.Second)
	st.halt()
	waitProcessed(t, s.pool, s.adapter, s.cfg.Topics, 30*time.Second)

	// Phase 2.
	b.signal(t, syscall.SIGSTOP)
	frozenB := time.Now()
	st = startStream(t, s.pub, "t", 5*time.Millisecond)
	waitFor(t, 3*ttl, "A to take over from the frozen B", func() bool { return ownerPID(s.pool, s.adapter, failureGroup, "t") == a.pid() })
	waitProgress(t, s.pool, s.adapter, "A", frozenB, 50, 30*time.Second)
	b.signal(t, syscall.SIGCONT)
	resumedB := time.Now()
	waitFor(t, 3*ttl, "B to open a new session", func() bool { return sessionOpenedAfter(s.pool, s.adapter, b.pid(), frozenB) })
	waitProgress(t, s.pool, s.adapter, "A", resumedB, 50, 30*time.Second)

	// Phase 3.
	closedA := time.Now()
	a.close(t)
	waitProgress(t, s.pool, s.adapter, "B", closedA, 30, 30*time.Second)
	st.halt()
	waitProcessed(t, s.pool, s.adapter, s.cfg.Topics, 30*time.Second)
	b.close(t)

	h := loadHistory(t, s.pool, s.adapter, failureGroup)
	sum := h.verify(t, s.cfg.Topics)

	claimB := h.firstClaimAfter(t, "t", b.pid(), frozenA)
	claimA := h.firstClaimAfter(t, "t", a.pid(), frozenB)
	reclaimB := h.firstClaimAfter(t, "t", b.pid(), closedA)
	require.True(t, claimB.at.Before(claimA.at) && claimA.at.Before(reclaimB.at))

	// Phase 1: A held the message when it froze, so B delivers it again,
	// first; A processes nothing between B's claim and its own next claim.
	// The held message was never committed, so B delivers it again; with
	// coalesced commits B may start before it, at A's last commit.
	heldIdx := h.where[held].idx
	assert.GreaterOrEqual(t, heldIdx, claimB.startIdx, "B starts at or before the message A held unacked")
	assert.Equal(t, 2, h.counts()[held], "the held message is processed by A and again by B")
	assertSilent(t, h, "A", claimB.at, claimA.at)
	// Phase 2: B processes nothing between A's claim and its own re-claim.
	assertSilent(t, h, "B", claimA.at, reclaimB.at)
	// No write by a stale owner: after each takeover, every change of the
	// row is made by the new owner or later ones.
	assertNoStaleWrites(t, h, "t", claimB)
	assertNoStaleWrites(t, h, "t", claimA)
	for _, p := range []*helperProc{a, b} {
		assert.Contains(t, p.logs(), ownershipLostText, "%s logs that it lost ownership", p.cfg.Name)
	}
	t.Logf("frozen owner: B claimed %s after SIGSTOP of A (SessionTTL %s); A claimed %s after SIGSTOP of B; "+
		"A on waking: %s; B on waking: %s; %d messages, %d processed twice (B started %d messages before the held one)",
		claimB.at.Sub(frozenA).Round(time.Millisecond), ttl, claimA.at.Sub(frozenB).Round(time.Millisecond),
		wakeUpPath(a.logs()), wakeUpPath(b.logs()), sum.messages, sum.duplicates, heldIdx-claimB.startIdx)
}

// assertSilent fails if proc processed a message in (from, to).
func assertSilent(t *testing.T, h *history, proc string, from, to time.Time) {
	t.Helper()
	for _, r := range h.recordsOf(proc) {
		if r.received.After(from) && r.received.Before(to) {
			assert.Fail(t, "a stale owner delivered",
				"%s processed %s at %s, after it lost the topic at %s (and before it claimed again at %s)",
				proc, r.uuid, r.received.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano))
		}
	}
}

// assertNoStaleWrites fails if, after claim, the row of topic was changed
// by a statement that kept an older epoch.
func assertNoStaleWrites(t *testing.T, h *history, topic string, claim claimInfo) {
	t.Helper()
	for _, c := range h.offsets {
		if c.topic == topic && c.id > claim.id {
			assert.GreaterOrEqual(t, c.newEpoch, claim.newEpoch, "log id %d: a write with epoch %d after the claim of epoch %d",
				c.id, c.newEpoch, claim.newEpoch)
		}
	}
}

// wakeUpPath says from the log how a frozen process found out that it had
// lost ownership.
func wakeUpPath(log string) string {
	var paths []string
	for _, p := range []struct{ needle, name string }{
		{"self-fenced", "self-fenced"},
		{"taken over by another session", "commit fenced"},
		{"Consumer session lost", "heartbeat found the session expired"},
	} {
		if strings.Contains(log, p.needle) {
			paths = append(paths, p.name)
		}
	}
	if len(paths) == 0 {
		return "(no known log line)"
	}
	return strings.Join(paths, " + ")
}

// TestDatabaseRestart restarts PostgreSQL while two publishers per topic
// and two subscriber processes run. Everything recovers by itself; every
// Publish that returned nil is stored, the others returned an error; no
// stored message is lost, and the delivery guarantees hold throughout.
func TestDatabaseRestart(t *testing.T) {
	restart := pgtest.RestartCommand()
	if len(restart) == 0 {
		t.Skip("no way to restart the test PostgreSQL: set PGLEASE_TEST_RESTART_CMD (`make test` does)")
	}
	const ttl = 2 * time.Second
	s := newFailureSetup(t, ttl, "t1", "t2")
	a, b := s.startOwnerAndStandby(t)
	var streams []*stream
	for _, topic := range s.cfg.Topics {
		for i := 0; i < 2; i++ {
			streams = append(streams, startStream(t, s.pub, topic, 4*time.Millisecond))
		}
	}
	waitProgress(t, s.pool, s.adapter, "A", time.Time{}, 100, 30*time.Second)

	began := time.Now()
	out, err := exec.Command(restart[0], restart[1:]...).CombinedOutput()
	require.NoError(t, err, "restart: %s", out)
	restarted := time.Now()
	s.pool.Reset()
	for _, topic := range s.cfg.Topics {
		waitFor(t, 30*time.Second, "delivery to go on after the restart on "+topic, func() bool {
			var n int
			err := s.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table(s.adapter, processedTable)+
				" WHERE topic = $1 AND received_at > $2", topic, restarted).Scan(&n)
			return err == nil && n >= 50
		})
	}
	var attempts []publishAttempt
	for _, st := range streams {
		st.halt()
		attempts = append(attempts, st.results()...)
	}
	waitProcessed(t, s.pool, s.adapter, s.cfg.Topics, time.Minute)
	require.True(t, a.alive() && b.alive(), "the subscriber processes survive the restart")
	a.close(t)
	b.close(t)

	h := loadHistory(t, s.pool, s.adapter, failureGroup)
	sum := h.verify(t, s.cfg.Topics)
	failed, failedButStored := h.verifyPublishes(t, attempts)
	assert.Positive(t, failed, "no Publish failed: the restart did not hit the publishers")
	t.Logf("database restart: took %s; %d Publish calls, %d failed (%d of those had committed); "+
		"%d messages, %d processed twice, %d claims",
		restarted.Sub(began).Round(time.Millisecond), len(attempts), failed, failedButStored, sum.messages, sum.duplicates, sum.claims)
}

// TestTerminatedConnections terminates every connection of the owning
// Subscriber's pool with pg_terminate_backend, again and again, while
// messages stream in. It recovers by itself each time; nothing is lost and
// the delivery guarantees hold; the publisher, whose connections are
// untouched, sees no error.
func TestTerminatedConnections(t *testing.T) {
	const ttl = 2 * time.Second
	s := newFailureSetup(t, ttl, "t")
	a, b := s.startOwnerAndStandby(t)
	st := startStream(t, s.pub, "t", 3*time.Millisecond)
	waitProgress(t, s.pool, s.adapter, "A", time.Time{}, 50, 30*time.Second)

	app := a.cfg.subAppName()
	backends := func() int {
		var n int
		err := s.pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
		require.NoError(t, err)
		return n
	}
	const rounds = 5
	total := 0
	for i := 0; i < rounds; i++ {
		waitFor(t, 10*time.Second, "A's Subscriber to have a connection", func() bool { return backends() > 0 })
		var n int
		require.NoError(t, s.pool.QueryRow(context.Background(),
			"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
			app).Scan(&n))
		require.Positive(t, n)
		total += n
		since := time.Now()
		waitFor(t, 30*time.Second, "delivery to go on after the terminations", func() bool {
			na, errA := countProcessed(s.pool, s.adapter, "A", since)
			nb, errB := countProcessed(s.pool, s.adapter, "B", since)
			return errA == nil && errB == nil && na+nb >= 30
		})
	}
	st.halt()
	waitProcessed(t, s.pool, s.adapter, s.cfg.Topics, 30*time.Second)
	a.close(t)
	b.close(t)

	h := loadHistory(t, s.pool, s.adapter, failureGroup)
	sum := h.verify(t, s.cfg.Topics)
	failed, _ := h.verifyPublishes(t, st.results())
	assert.Zero(t, failed, "the publisher's connections were not touched")
	t.Logf("terminated %d backends of A's Subscriber in %d rounds; %d messages, %d processed twice, %d claims (%d by B)",
		total, rounds, sum.messages, sum.duplicates, sum.claims, len(h.claimsBy("t", b.pid())))
}

// TestConcurrentCloseWaits closes a Subscriber from two goroutines at once,
// as happens under a Router: Router.Close makes each handler close its
// Subscriber while the application closes it too, and then typically
// closes its pool. Every Close call must return only once closing is
// complete (topics released, session row deleted); a call that returns
// early lets the caller close the pool under the first one.
func TestConcurrentCloseWaits(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g"})
	ctx := context.Background()
	_, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the topic to be claimed", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table(adapter, pglease.DefaultConsumerOffsetsTable)+
			" WHERE topic = 't' AND session_id IS NOT NULL").Scan(&n))
		return n == 1
	})

	// Lock the claim row so that the release in Close has to wait.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+table(adapter, pglease.DefaultConsumerOffsetsTable)+" WHERE topic = 't' FOR UPDATE")
	require.NoError(t, err)

	first := make(chan struct{})
	go func() {
		defer close(first)
		assert.NoError(t, sub.Close())
	}()
	waitFor(t, 10*time.Second, "the release to wait for the row lock", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
			adapter.Schema).Scan(&n))
		return n > 0
	})
	second := make(chan struct{})
	go func() {
		defer close(second)
		assert.NoError(t, sub.Close())
	}()
	returnedEarly := false
	select {
	case <-second:
		returnedEarly = true
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Rollback(ctx))
	for _, done := range []chan struct{}{first, second} {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return after the row lock was released")
		}
	}
	assert.False(t, returnedEarly, "the second Close returned while the first was still releasing the topic")
	var sessions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table(adapter, pglease.DefaultConsumerSessionsTable)).Scan(&sessions))
	assert.Zero(t, sessions, "the session row is deleted once Close returned")
	assertNoLeakedGoroutines(t)
}
