package pglease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/tcpproxy"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// TestCrashRecoveryLosesNothing: a backend of the server is killed with
// SIGKILL, so that the postmaster ends every other one and runs crash
// recovery without restarting itself: its start time and timeline stay
// the same. With synchronous_commit = off the commits still in the WAL
// buffers are lost, and the transaction counter goes back below the
// positions the Subscriber read and holds in memory.
//
// The interleaving that skipped messages is forced: the Subscriber's
// connections (through a proxy) wait while, on the recovered server,
// messages are published (their transaction ids lie below the
// Subscriber's position) and the counter is raised past every id handed
// out before the crash; then the Subscriber reconnects. Every message the
// server holds after the crash, and every one published after it, must be
// delivered.
//
// With synchronous_commit = off the crash is repeated until one lost
// commits (which it is seen to do by the messages missing afterwards);
// with on, nothing committed may be missing.
func TestCrashRecoveryLosesNothing(t *testing.T) {
	for _, sync := range []string{"off", "on"} {
		t.Run("synchronous_commit="+sync, func(t *testing.T) { crashRecoveryLosesNothing(t, sync) })
	}
}

func crashRecoveryLosesNothing(t *testing.T, synchronousCommit string) {
	const (
		maxCrashes = 8
		burst      = 60 // messages published and delivered before a crash
		published  = 10 // messages published on each side of the raise after a crash
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := startSingle(t, pgrepl.Options{Settings: map[string]string{
		"synchronous_commit": synchronousCommit,
		// The WAL writer flushes what async commits left in the WAL
		// buffers every wal_writer_delay; a longer one makes a crash
		// lose them rather than miss them by a few milliseconds.
		"wal_writer_delay": "5s",
	}})
	proxy, err := tcpproxy.Start(fmt.Sprintf("127.0.0.1:%d", c.Primary.Port()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })

	pubPool := newPoolOn(t, c.Primary.DSN(), 4)
	adapter := newSchema(t, pubPool)
	pub, err := pglease.NewPublisher(pubPool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	subPool := newPoolOn(t, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", proxy.Addr()), 8)
	sub := newFailoverSubscriber(t, subPool, adapter, pglease.SubscriberConfig{SessionTTL: 30 * time.Second})
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	msgs, err := sub.Subscribe(subCtx, "t")
	require.NoError(t, err)
	got := newDeliveries()
	var consumers sync.WaitGroup
	got.consume(0, msgs, &consumers)

	warmup := publishN(t, pub, "t", 10)
	require.Empty(t, got.waitDelivered(warmup, 30*time.Second), "warm-up messages not delivered")
	waitCommitted(t, pubPool, adapter, "t")

	messages := table(adapter, pglease.DefaultMessagesTable)
	for crash := 1; ; crash++ {
		before := publishN(t, pub, "t", burst)
		require.Empty(t, got.waitDelivered(before, 30*time.Second), "the messages before crash %d not delivered", crash)

		proxy.Hold()
		top := counter(ctx, t, c.Primary)
		require.NoError(t, c.Primary.CrashBackend(ctx))

		kept := storedOf(ctx, t, c.Primary, messages, before)
		after, _ := publishAfterSwitch(t, pub, "t", published)
		raise(ctx, t, c.Primary, top+1000)
		raised, _ := publishAfterSwitch(t, pub, "t", published)
		after = append(after, raised...)
		proxy.Release()

		lost := len(before) - len(kept)
		t.Logf("crash %d: %d of the %d messages published right before it lost by the server; %d published after",
			crash, lost, len(before), len(after))
		missing := got.waitDelivered(append(kept, after...), time.Minute)
		require.Empty(t, missing, "crash %d: %d of the %d messages the server holds were never delivered",
			crash, len(missing), len(kept)+len(after))
		require.Equal(t, after, got.firstOrder(after), "crash %d: the messages published after it were delivered out of order", crash)

		if synchronousCommit == "on" {
			require.Zero(t, lost, "synchronous_commit = on lost a commit")
			break
		}
		if lost > 0 {
			break
		}
		require.Less(t, crash, maxCrashes, "no crash lost a commit: the test did not test what it should")
	}
	stats := sub.Stats()
	t.Logf("Subscriber: %d delivered, %d claims, %d sessions lost, %d resyncs", stats.Delivered, stats.Claims,
		stats.SessionsLost, stats.Resyncs)
	require.Positive(t, stats.Resyncs, "the Subscriber did not notice the crash recovery")

	stopSub()
	require.NoError(t, sub.Close())
	consumers.Wait()
	require.NoError(t, pub.Close())
	assertNoLeakedGoroutines(t)
}

// onNode runs fn on a new connection to n.
func onNode(ctx context.Context, t *testing.T, n *pgrepl.Node, fn func(*pgx.Conn) error) {
	t.Helper()
	conn, err := pgx.Connect(ctx, n.DSN())
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	require.NoError(t, fn(conn))
}

// counter returns the next transaction id n hands out.
func counter(ctx context.Context, t *testing.T, n *pgrepl.Node) uint64 {
	t.Helper()
	var next uint64
	onNode(ctx, t, n, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&next)
	})
	return next
}

// raise hands out transaction ids on n until its counter reaches to.
func raise(ctx context.Context, t *testing.T, n *pgrepl.Node, to uint64) {
	t.Helper()
	onNode(ctx, t, n, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, fmt.Sprintf(`DO $$
BEGIN
	CREATE TEMPORARY TABLE burn (x integer);
	WHILE pg_snapshot_xmax(pg_current_snapshot())::text::bigint < %d LOOP
		FOR i IN 1..100 LOOP
			BEGIN
				INSERT INTO burn VALUES (1);
				RAISE EXCEPTION 'burnt';
			EXCEPTION WHEN OTHERS THEN NULL;
			END;
		END LOOP;
		COMMIT;
	END LOOP;
END $$`, to))
		return err
	})
}

// storedOf returns those of uuids that messages (a quoted table name)
// holds on n, in the order of uuids.
func storedOf(ctx context.Context, t *testing.T, n *pgrepl.Node, messages string, uuids []string) []string {
	t.Helper()
	stored := map[string]bool{}
	onNode(ctx, t, n, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT uuid FROM `+messages+` WHERE uuid = ANY($1)`, uuids)
		if err != nil {
			return err
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, u := range found {
			stored[u] = true
		}
		return err
	})
	var out []string
	for _, u := range uuids {
		if stored[u] {
			out = append(out, u)
		}
	}
	return out
}

// TestHeartbeatThatFindsARestartOpensTheNextSessionAtOnce: a Subscriber
// that runs no statement of its own after its server restarted (it
// polls, every minute) finds the restart by its heartbeat, which its
// session connection's loss runs at once. It drops its session and must
// open the next one at once, not a heartbeat interval (20 s here) later:
// until then nothing of it can claim.
func TestHeartbeatThatFindsARestartOpensTheNextSessionAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSingle(t, pgrepl.Options{})
	pool := newPoolOn(t, c.Primary.DSN(), 4)
	adapter := newSchema(t, pool)
	sub := newFailoverSubscriber(t, pool, adapter, pglease.SubscriberConfig{
		SessionTTL: time.Minute, PollOnly: true, PollInterval: time.Minute})
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	msgs, err := sub.Subscribe(subCtx, "t")
	require.NoError(t, err)
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	sessionIDs := func() []string {
		var ids []string
		onNode(ctx, t, c.Primary, func(conn *pgx.Conn) error {
			rows, err := conn.Query(ctx, `SELECT id::text FROM `+sessions)
			if err != nil {
				return err
			}
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		return ids
	}
	var before []string
	waitFor(t, 30*time.Second, "the session", func() bool {
		before = sessionIDs()
		return len(before) == 1
	})

	require.NoError(t, c.Primary.Restart(ctx))
	waitFor(t, 30*time.Second, "the Subscriber to find the restart", func() bool { return sub.Stats().Resyncs > 0 })
	found := time.Now()
	waitFor(t, 5*time.Second, "the next session", func() bool {
		ids := sessionIDs()
		return len(ids) == 1 && ids[0] != before[0]
	})
	t.Logf("next session %s after the restart was found", time.Since(found).Round(time.Millisecond))

	stopSub()
	for range msgs {
	}
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

// TestReclaimAfterRestartIsNotATakeover: after its server restarted, a
// Subscriber opens a new session and claims its topic again from its own
// earlier session. That is not a takeover: no Info line "taken over from
// an expired session", Takeovers stays 0, and Claims counts the claim.
func TestReclaimAfterRestartIsNotATakeover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSingle(t, pgrepl.Options{})
	pool := newPoolOn(t, c.Primary.DSN(), 4)
	adapter := newSchema(t, pool)
	logs := testkit.NewCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		InitializeSchema: true, PollInterval: 100 * time.Millisecond}, logs)
	require.NoError(t, err)
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	msgs, err := sub.Subscribe(subCtx, "t")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the first claim", func() bool { return sub.Stats().Claims == 1 })

	require.NoError(t, c.Primary.Restart(ctx))
	waitFor(t, 60*time.Second, "the claim by the next session", func() bool { return sub.Stats().Claims >= 2 })
	st := sub.Stats()
	assert.Positive(t, st.Resyncs, "the restart was found")
	assert.Zero(t, st.Takeovers, "claiming the topic back from its own earlier session is no takeover")
	_, found := logs.Find(func(e testkit.LogEntry) bool { return strings.Contains(e.Msg, "taken over from an expired session") })
	assert.False(t, found, "no takeover logged")

	stopSub()
	for range msgs {
	}
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}
