package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/tcpproxy"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// bouncerDSN is the test database through a PgBouncer in transaction mode
// (localpg, internal/cmd/localpg, starts one), with pgx's query mode mode.
func bouncerDSN(t testing.TB, mode string) string {
	t.Helper()
	pgtest.SkipShort(t)
	dsn, err := pgtest.PgBouncerDSN()
	require.NoError(t, err)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "default_query_exec_mode=" + mode
}

// requireBouncerHealthy fails the test when PgBouncer is gone or logged
// that a notification reached a server connection no client held (what a
// LISTEN through it causes, before it exits with "server in bad state").
// An error packet "when not linked" is not counted: a server restart by
// another test causes those.
func requireBouncerHealthy(t testing.TB) {
	t.Helper()
	require.NoError(t, pgtest.PgBouncerAlive(), "PgBouncer must survive the test")
	path := os.Getenv("PGLEASE_TEST_PGBOUNCER_LOG")
	if path == "" {
		return
	}
	log, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "got packet 'A' from server when not linked") || strings.Contains(line, "server in bad state") {
			t.Fatalf("PgBouncer's log (%s): %s", path, line)
		}
	}
}

// runSuiteThrough runs Watermill's universal suite with every Publisher
// and Subscriber on pool, their Subscribers configured by tweak.
func runSuiteThrough(t *testing.T, pool *pgxpool.Pool, tweak func(*pglease.SubscriberConfig)) {
	c := newConformanceOn(t, pool)
	c.tweak = tweak
	features := c.features()
	// TestReconnect restarts PostgreSQL, which TestPubSub already covers
	// on a direct pool.
	features.RestartServiceCommand = nil
	// The suite's tests run in parallel: t.Run returns when all are done.
	t.Run("suite", func(t *testing.T) {
		tests.TestPubSub(t, features,
			func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
			c.pubSub,
		)
	})
}

// TestPubSubThroughPgBouncer runs the universal suite with the
// application's pool going through PgBouncer in transaction mode, in pgx's
// query modes that work there, and the LISTEN connection dialled directly
// (ListenConnConfig). PgBouncer must be alive and well at the end.
func TestPubSubThroughPgBouncer(t *testing.T) {
	for _, mode := range []string{"exec", "simple_protocol", "cache_describe"} {
		t.Run(mode, func(t *testing.T) {
			pool := newPoolOn(t, bouncerDSN(t, mode), 60)
			direct := directConnConfig(t)
			runSuiteThrough(t, pool, func(c *pglease.SubscriberConfig) { c.ListenConnConfig = direct })
			requireBouncerHealthy(t)
		})
	}
}

// TestPubSubThroughPgBouncerWithoutListenConnConfig: a user who points the
// pool at PgBouncer and sets nothing else. pglease finds out that the
// connection it would LISTEN on is pooled, does not LISTEN, says what to
// set, and delivers by polling: the suite passes and PgBouncer lives.
func TestPubSubThroughPgBouncerWithoutListenConnConfig(t *testing.T) {
	pool := newPoolOn(t, bouncerDSN(t, "exec"), 60)
	// Polling stands in for every notification here: 50 Subscribers of
	// one group (TestConcurrentSubscribe) that each re-read the group
	// every 20 ms, through one PgBouncer process, starved the owner on a
	// loaded 2-core machine. 100 ms keeps the suite's deadlines with room.
	runSuiteThrough(t, pool, func(c *pglease.SubscriberConfig) { c.PollInterval = 100 * time.Millisecond })
	requireBouncerHealthy(t)
}

// TestBehindPgBouncerTheSubscriberSaysWhatToSet: without ListenConnConfig
// behind PgBouncer, a Subscriber logs at Error that it does not listen and
// what to set, and delivers by polling.
func TestBehindPgBouncerTheSubscriberSaysWhatToSet(t *testing.T) {
	pool := newPoolOn(t, bouncerDSN(t, "exec"), 10)
	logger := newCapturingLogger()
	adapter := newSchema(t, pool)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup: "g", Tables: adapter, InitializeSchema: true,
		PollInterval: 20 * time.Millisecond,
	}, logger)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the Subscriber to say it does not listen", func() bool {
		_, ok := logger.Find(func(e logEntry) bool {
			return e.Level == "error" && errors.Is(e.Err, pglease.ErrPooledConnection) &&
				strings.Contains(e.Msg, "ListenConnConfig")
		})
		return ok
	})
	require.False(t, pglease.Listening(sub))
	pub := newPublisher(t, pool, adapter)
	ids := publishN(t, pub, "t", 3)
	for _, id := range ids {
		select {
		case m := <-msgs:
			require.Equal(t, id, m.UUID)
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("message %s not delivered by polling", id)
		}
	}
	require.NoError(t, sub.Close())
	requireBouncerHealthy(t)
	assertNoLeakedGoroutines(t)
}

// TestCheckDirect: a connection to the server itself passes the check, one
// through PgBouncer (in any query mode) does not.
func TestCheckDirect(t *testing.T) {
	parallel(t)
	pgtest.SkipShort(t)
	ctx := context.Background()
	check := func(dsn string) error {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(ctx)
		return pglease.CheckDirect(ctx, conn)
	}
	require.NoError(t, check(testkit.DSN))
	for _, mode := range []string{"exec", "simple_protocol"} {
		err := check(bouncerDSN(t, mode))
		require.ErrorIs(t, err, pglease.ErrPooledConnection, mode)
	}
	requireBouncerHealthy(t)
}

// TestPollOnly: no LISTEN at all (no backend of the Subscriber's pool runs
// one), and still messages are delivered and a topic is handed over when
// its owner closes, by polling.
func TestPollOnly(t *testing.T) {
	pgtest.SkipShort(t)
	const app = "pglease-test-poll-only"
	cfg, err := pgxpool.ParseConfig(testkit.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)

	newSub := func() *pglease.Subscriber {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
			ConsumerGroup: "g", Tables: adapter, InitializeSchema: true,
			PollOnly: true, PollInterval: 50 * time.Millisecond, SessionTTL: time.Minute,
		}, testLogger())
		require.NoError(t, err)
		return sub
	}
	first, second := newSub(), newSub()
	ctx := context.Background()
	out1, err := first.Subscribe(ctx, "t")
	require.NoError(t, err)
	ids := publishN(t, pub, "t", 2)
	select {
	case m := <-out1:
		require.Equal(t, ids[0], m.UUID)
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("first message not delivered")
	}
	// The second Subscriber stands by: the first holds the topic. Its
	// session lives a minute, so only polling for the release can hand the
	// topic over within the deadline below.
	var settled atomic.Bool
	pglease.SetAfterMembersReadHook(second, func(n int) { settled.Store(settled.Load() || n == 2) })
	out2, err := second.Subscribe(ctx, "t")
	require.NoError(t, err)
	// Once it has read the group with the first Subscriber in it, ranked
	// first, it holds no share: it waits to be woken.
	waitFor(t, 30*time.Second, "the standby to read its group", settled.Load)
	var listens int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND query ILIKE 'LISTEN%'`, app).Scan(&listens))
	require.Zero(t, listens, "a PollOnly Subscriber must not LISTEN")
	require.False(t, pglease.Listening(first))

	require.NoError(t, first.Close())
	select {
	case m := <-out2:
		require.Equal(t, ids[1], m.UUID)
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("the topic was not handed over to the standby")
	}
	require.NoError(t, second.Close())
	assertNoLeakedGoroutines(t)
}

// TestPollOnlyConfig: PollOnly and ListenConnConfig exclude each other, and
// a ListenConnConfig that pgx would refuse is refused up front.
func TestPollOnlyConfig(t *testing.T) {
	parallel(t)
	pool := newPool(t, 2)
	_, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{PollOnly: true, ListenConnConfig: directConnConfig(t)}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	require.ErrorContains(t, err, "SubscriberConfig.ListenConnConfig")
	_, err = pglease.NewSubscriber(pool, pglease.SubscriberConfig{ListenConnConfig: &pgx.ConnConfig{}}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	require.ErrorContains(t, err, "pgx.ParseConfig")
}

// TestListenerProbeFindsAConnectionThatStoppedReceiving: the LISTEN
// connection goes through a TCP proxy that stops forwarding without
// closing anything (a half-open connection, a proxy that dropped it). The
// listener's probe finds out, logs what it found, and reconnects; after
// that, a message is delivered on its notification again (PollInterval is
// an hour, so nothing else would deliver it in time).
func TestListenerProbeFindsAConnectionThatStoppedReceiving(t *testing.T) {
	defer pglease.SetListenerProbe(100*time.Millisecond, 500*time.Millisecond)()
	direct := directConnConfig(t)
	proxy, err := tcpproxy.Start(fmt.Sprintf("%s:%d", direct.Host, direct.Port))
	require.NoError(t, err)
	defer proxy.Close()
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	viaProxy := direct.Copy()
	viaProxy.Host = host
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	viaProxy.Port = uint16(p)
	viaProxy.Fallbacks = nil

	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup: "g", Tables: adapter, InitializeSchema: true,
		ListenConnConfig: viaProxy, PollInterval: time.Hour,
	}, logger)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the listener", func() bool { return pglease.Listening(sub) })
	ids := publishN(t, pub, "t", 1)
	got := receive(t, msgs, 1, 10*time.Second)
	require.Equal(t, ids[0], got[0].UUID)

	proxy.Freeze()
	waitFor(t, 30*time.Second, "the probe to find the listener deaf", func() bool {
		_, ok := logger.Find(func(e logEntry) bool {
			return e.Level == "error" && e.Err != nil && strings.Contains(e.Err.Error(), "has not arrived")
		})
		return ok
	})
	waitFor(t, 30*time.Second, "the listener to listen again", func() bool { return pglease.Listening(sub) })
	ids = publishN(t, pub, "t", 1)
	got = receive(t, msgs, 1, 10*time.Second)
	require.Equal(t, ids[0], got[0].UUID, "delivered on its notification after the reconnect")
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

// TestListenerReconnectsAtOnceWhenItsConnectionDies: when the server ends
// the LISTEN connection, the listener dials again after its short backoff,
// not after its next wake-up probe fails (here never: the probe waits an
// hour), and notifications reach the Subscriber again.
func TestListenerReconnectsAtOnceWhenItsConnectionDies(t *testing.T) {
	// Restored after the Subscriber closed (cleanups run last first).
	t.Cleanup(pglease.SetListenerProbe(time.Hour, time.Hour))
	app := "pglease_listen_" + randomHex(6)
	direct := directConnConfig(t)
	direct.RuntimeParams["application_name"] = app

	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup: "g", Tables: adapter, InitializeSchema: true,
		ListenConnConfig: direct, PollInterval: time.Hour,
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the listener", func() bool { return pglease.Listening(sub) })

	ctx := context.Background()
	backend := func() (pid int32) {
		err := pool.QueryRow(ctx, "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&pid)
		require.NoError(t, err)
		return pid
	}
	first := backend()
	require.NotZero(t, first, "the listener's backend")
	var ended bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", first).Scan(&ended))
	require.True(t, ended)

	var second int32
	waitFor(t, 10*time.Second, "the listener to connect again", func() bool {
		second = backend()
		return second != 0 && second != first && pglease.Listening(sub)
	})
	// The first message after the reconnect, after the consumer idled on
	// it: only a notification wakes it (PollInterval is an hour).
	ids := publishN(t, pub, "t", 1)
	got := receive(t, msgs, 1, 10*time.Second)
	require.Equal(t, ids[0], got[0].UUID)
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}
