package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// TestHeartbeatsSurviveASaturatedPool gives three Subscribers (three
// consumer groups, each owning a topic) and a Publisher one pool of 2
// connections, then takes every connection of that pool away and holds
// them. The sessions must stay alive meanwhile: their heartbeats run on the
// session connection, not on the pool. When the pool is free again, each
// topic's message is delivered by the owner it had before.
func TestHeartbeatsSurviveASaturatedPool(t *testing.T) {
	const (
		maxConns = 2
		ttl      = pglease.MinSessionTTL
		moves    = 3 // heartbeats seen per session while the pool is held
	)
	ctx := context.Background()
	pool := newPool(t, maxConns)
	adapter := newSchema(t, pool)
	instrument(t, pool, adapter)
	watcher := newPool(t, 2)
	pub := newPublisher(t, pool, adapter)
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)

	type member struct {
		group, topic string
		msgs         <-chan *message.Message
		session      uuid.UUID
		epoch        int64
	}
	members := make([]*member, 3)
	for i := range members {
		m := &member{group: fmt.Sprintf("g%d", i), topic: fmt.Sprintf("t%d", i)}
		sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: m.group, SessionTTL: ttl})
		var err error
		m.msgs, err = sub.Subscribe(ctx, m.topic)
		require.NoError(t, err)
		members[i] = m
	}
	// owner returns the live session owning m's topic and its epoch.
	owner := func(m *member) (id uuid.UUID, epoch int64, ok bool) {
		err := watcher.QueryRow(ctx, "SELECT s.id, o.epoch FROM "+offsets+" o JOIN "+sessions+
			" s ON s.id = o.session_id AND s.expires_at > now() WHERE o.consumer_group = $1 AND o.topic = $2",
			m.group, m.topic).Scan(&id, &epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return uuid.Nil, 0, false
		}
		require.NoError(t, err)
		return id, epoch, true
	}
	for _, m := range members {
		waitFor(t, 10*time.Second, m.group+" to own "+m.topic, func() bool {
			var ok bool
			m.session, m.epoch, ok = owner(m)
			return ok
		})
	}

	// Take every connection of the pool. The Subscribers' idle pollers
	// compete for them, so this may take a few tries of theirs.
	held := make([]*pgxpool.Conn, 0, maxConns)
	releaseAll := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	t.Cleanup(releaseAll)
	for len(held) < maxConns {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := pool.Acquire(actx)
		cancel()
		require.NoError(t, err, "acquire every connection of the pool")
		held = append(held, c)
	}
	saturated := time.Now()

	type seen struct {
		expires time.Time
		moves   int
	}
	progress := map[uuid.UUID]*seen{}
	waitFor(t, 15*time.Second, fmt.Sprintf("%d heartbeats of every session while the pool is held", moves), func() bool {
		type row struct {
			ID      uuid.UUID
			Expires time.Time
			Expired bool
		}
		rows, _ := watcher.Query(ctx, "SELECT id, expires_at, expires_at <= now() FROM "+sessions)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		ids := map[uuid.UUID]bool{}
		for _, r := range got {
			ids[r.ID] = true
			require.False(t, r.Expired, "session %s expired %s after the pool was saturated: its heartbeats did not get through",
				r.ID, time.Since(saturated).Round(time.Millisecond))
			s := progress[r.ID]
			switch {
			case s == nil:
				progress[r.ID] = &seen{expires: r.Expires}
			case r.Expires.After(s.expires):
				s.expires = r.Expires
				s.moves++
			}
		}
		for _, m := range members {
			require.True(t, ids[m.session], "session %s of %s is gone after %s of saturation",
				m.session, m.group, time.Since(saturated).Round(time.Millisecond))
		}
		require.Len(t, ids, len(members), "a session was added while the pool was saturated")
		for _, s := range progress {
			if s.moves < moves {
				return false
			}
		}
		return true
	})
	heldFor := time.Since(saturated)
	require.Len(t, held, maxConns)
	assert.Equal(t, int32(maxConns), pool.Stat().AcquiredConns())
	releaseAll()

	var inserted int
	require.NoError(t, watcher.QueryRow(ctx, "SELECT count(*) FROM "+table(adapter, sessionsLogTable)+
		" WHERE op = 'INSERT'").Scan(&inserted))
	assert.Equal(t, len(members), inserted, "sessions were replaced")

	for _, m := range members {
		sent := message.NewMessage(watermill.NewUUID(), []byte(m.topic))
		require.NoError(t, pub.Publish(m.topic, sent))
		got := receive(t, m.msgs, 1, 10*time.Second)
		assert.Equal(t, sent.UUID, got[0].UUID)
		id, epoch, ok := owner(m)
		require.True(t, ok, "%s has no live owner", m.topic)
		assert.Equal(t, m.session, id, "%s changed owner", m.topic)
		assert.Equal(t, m.epoch, epoch, "%s was claimed again", m.topic)
	}
	t.Logf("pool of %d held for %s: every session's expiry moved >= %d times; %d sessions opened in all",
		maxConns, heldFor.Round(time.Millisecond), moves, inserted)
}

// hookedPool returns a pool whose connections are made through hooks that
// count their calls; BeforeConnect names each connection app.
func hookedPool(t *testing.T, maxConns int32, app string) (*pgxpool.Pool, *hookCalls) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testkit.DSN)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	calls := &hookCalls{}
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		calls.beforeConnect.Add(1)
		cc.RuntimeParams["application_name"] = app
		return nil
	}
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error {
		calls.afterConnect.Add(1)
		return nil
	}
	cfg.BeforeClose = func(c *pgx.Conn) {
		calls.beforeClose.Add(1)
		calls.closed.Store(c.PgConn().PID(), true)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, calls
}

type hookCalls struct {
	beforeConnect, afterConnect, beforeClose atomic.Int64
	closed                                   sync.Map // pid of each connection BeforeClose saw
}

// backends counts the server's connections named app: all of them, the
// LISTEN ones, and the session connections (whose last statement is always
// one of the session statements of the keeper: the pool runs none of them).
func backends(t *testing.T, watcher *pgxpool.Pool, app string, adapter pglease.Tables) (all, listen, session int) {
	t.Helper()
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	require.NoError(t, watcher.QueryRow(context.Background(), `SELECT count(*),
	count(*) FILTER (WHERE query LIKE 'LISTEN %'),
	count(*) FILTER (WHERE query LIKE 'WITH replaced AS%' OR query LIKE 'WITH beat AS%' || $2 || '%'
		OR query LIKE 'WITH deleted AS%')
FROM pg_stat_activity WHERE application_name = $1`, app, sessions).Scan(&all, &listen, &session))
	return all, listen, session
}

// ownBackends returns the pids of the LISTEN and session connections named
// app.
func ownBackends(t *testing.T, watcher *pgxpool.Pool, app string, adapter pglease.Tables) []uint32 {
	t.Helper()
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	rows, err := watcher.Query(context.Background(), `SELECT pid FROM pg_stat_activity
WHERE application_name = $1 AND (query LIKE 'LISTEN %' OR query LIKE 'WITH replaced AS%' OR query LIKE 'WITH beat AS%'
	OR query LIKE 'UPDATE ' || $2 || '%' OR query LIKE 'WITH deleted AS%')`, app, sessions)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	require.NoError(t, err)
	return pids
}

// TestSessionAndListenConnectionsUseThePoolHooks checks that the two
// connections a Subscriber opens beside the pool (the LISTEN connection and
// the session connection) are made through the pool config's
// BeforeConnect, AfterConnect and BeforeClose hooks, as the pool's own are.
func TestSessionAndListenConnectionsUseThePoolHooks(t *testing.T) {
	app := "pglease-hooks-" + randomHex(4)
	pool, calls := hookedPool(t, 4, app)
	adapter := newSchema(t, pool)
	watcher := newPool(t, 2)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "g",
		SessionTTL:       pglease.MinSessionTTL,
		PollInterval:     10 * time.Millisecond,
		InitializeSchema: true,
		Tables:           adapter,
	}, testLogger())
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = sub.Close()
		}
	})
	_, err = sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)

	var all, listen, session int
	waitFor(t, 10*time.Second, "the LISTEN and session connections, made by the hooks", func() bool {
		all, listen, session = backends(t, watcher, app, adapter)
		return listen == 1 && session == 1 &&
			all == int(pool.Stat().TotalConns())+2 &&
			calls.beforeConnect.Load() == pool.Stat().NewConnsCount()+2 &&
			calls.afterConnect.Load() == calls.beforeConnect.Load()
	})
	assert.Equal(t, calls.beforeConnect.Load(), calls.afterConnect.Load(), "AfterConnect calls")
	assert.Zero(t, calls.beforeClose.Load(), "BeforeClose calls before Close")
	t.Logf("%d connections named by BeforeConnect: %d of the pool, 1 LISTEN, 1 session; BeforeConnect called %d times",
		all, pool.Stat().TotalConns(), calls.beforeConnect.Load())

	ownPIDs := ownBackends(t, watcher, app, adapter)
	require.Len(t, ownPIDs, 2)
	require.NoError(t, sub.Close())
	closed = true
	// BeforeClose saw both (and maybe a pooled connection whose query
	// Close cut off, an idle poll under way).
	for _, pid := range ownPIDs {
		_, ok := calls.closed.Load(pid)
		assert.True(t, ok, "BeforeClose was not called for backend %d", pid)
	}
	waitFor(t, 10*time.Second, "the LISTEN and session connections to end", func() bool {
		all, listen, session = backends(t, watcher, app, adapter)
		return listen == 0 && session == 0 && all == int(pool.Stat().TotalConns())
	})
	assertNoLeakedGoroutines(t)
}

// TestSessionConnectionIsSharedAndClosedWithTheLastSubscriber runs two
// Subscribers on one pool: their sessions share one connection outside the
// pool (and one LISTEN connection). It stays while either Subscriber runs
// and is closed when the last one closes, with no goroutine left.
func TestSessionConnectionIsSharedAndClosedWithTheLastSubscriber(t *testing.T) {
	app := "pglease-shared-" + randomHex(4)
	pool := newNamedPool(t, app, 4)
	adapter := newSchema(t, pool)
	watcher := newPool(t, 2)
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)

	subs := make([]*pglease.Subscriber, 2)
	for i := range subs {
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
			ConsumerGroup:    fmt.Sprintf("g%d", i),
			SessionTTL:       pglease.MinSessionTTL,
			InitializeSchema: true,
			Tables:           adapter,
		}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		_, err = sub.Subscribe(context.Background(), "t")
		require.NoError(t, err)
		subs[i] = sub
	}
	liveSessions := func() int {
		var n int
		require.NoError(t, watcher.QueryRow(context.Background(),
			"SELECT count(*) FROM "+sessions+" WHERE expires_at > now()").Scan(&n))
		return n
	}
	waitFor(t, 10*time.Second, "both sessions", func() bool { return liveSessions() == 2 })
	check := func(what string, wantListen, wantSession int) {
		t.Helper()
		var all, listen, session int
		waitFor(t, 10*time.Second, what, func() bool {
			all, listen, session = backends(t, watcher, app, adapter)
			return listen == wantListen && session == wantSession &&
				all == int(pool.Stat().TotalConns())+wantListen+wantSession
		})
	}
	check("one session connection for both Subscribers", 1, 1)

	require.NoError(t, subs[0].Close())
	check("the session connection to stay for the second Subscriber", 1, 1)
	// The second session still heartbeats on it: it outlives several TTLs.
	var first time.Time
	require.NoError(t, watcher.QueryRow(context.Background(), "SELECT expires_at FROM "+sessions).Scan(&first))
	waitFor(t, 10*time.Second, "the remaining session to be extended past 2 TTLs", func() bool {
		var expires time.Time
		require.NoError(t, watcher.QueryRow(context.Background(), "SELECT expires_at FROM "+sessions).Scan(&expires))
		return expires.Sub(first) >= 2*pglease.MinSessionTTL
	})

	require.NoError(t, subs[1].Close())
	check("the session connection to close with the last Subscriber", 0, 0)
	assert.Zero(t, liveSessions(), "sessions left after Close")
	assertNoLeakedGoroutines(t)
}

// TestSessionConnectionIsRedialled terminates the session connection's
// backend, again and again: each time the next heartbeat fails, the one
// after it dials a new connection, and the session lives on (it is never
// replaced).
func TestSessionConnectionIsRedialled(t *testing.T) {
	app := "pglease-redial-" + randomHex(4)
	pool := newNamedPool(t, app, 4)
	adapter := newSchema(t, pool)
	instrument(t, pool, adapter)
	watcher := newPool(t, 2)
	ctx := context.Background()
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", SessionTTL: pglease.MinSessionTTL})
	_, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)

	// sessionBackend is the pid of the session connection, 0 if none.
	sessionBackend := func() int {
		var pid int
		err := watcher.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1
	AND (query LIKE 'WITH replaced AS%' OR query LIKE 'WITH beat AS%' || $2 || '%')`, app, sessions).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0
		}
		require.NoError(t, err)
		return pid
	}
	expiry := func() time.Time {
		var e time.Time
		require.NoError(t, watcher.QueryRow(ctx, "SELECT expires_at FROM "+sessions).Scan(&e))
		return e
	}
	const rounds = 3
	for i := 0; i < rounds; i++ {
		var pid int
		waitFor(t, 10*time.Second, "the session connection", func() bool { pid = sessionBackend(); return pid != 0 })
		var terminated bool
		require.NoError(t, watcher.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&terminated))
		require.True(t, terminated)
		before := expiry()
		waitFor(t, 10*time.Second, "a heartbeat on a new session connection", func() bool {
			next := sessionBackend()
			return next != 0 && next != pid && expiry().After(before)
		})
	}
	var inserted int
	require.NoError(t, watcher.QueryRow(ctx, "SELECT count(*) FROM "+table(adapter, sessionsLogTable)+
		" WHERE op = 'INSERT'").Scan(&inserted))
	assert.Equal(t, 1, inserted, "the session was replaced")
}

// newNamedPool returns a pool of maxConns connections whose application_name
// is app, so that tests can find its connections in pg_stat_activity.
func newNamedPool(t *testing.T, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pgtest.SkipShort(t)
	cfg, err := pgxpool.ParseConfig(testkit.DSN)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
