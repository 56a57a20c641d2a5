package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// tableCounters are what pg_stat_user_tables and pg_statio_user_tables
// count for a table.
type tableCounters struct {
	updates, hot, blocks int64
}

func (c tableCounters) minus(o tableCounters) tableCounters {
	return tableCounters{updates: c.updates - o.updates, hot: c.hot - o.hot, blocks: c.blocks - o.blocks}
}

// readTableCounters reads the counters of a table of adapter's schema,
// from a fresh statistics snapshot.
func readTableCounters(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, name string) tableCounters {
	t.Helper()
	var c tableCounters
	require.NoError(t, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `SELECT pg_stat_clear_snapshot()`); err != nil {
			return err
		}
		return tx.QueryRow(context.Background(), `SELECT s.n_tup_upd, s.n_tup_hot_upd,
				io.heap_blks_read + io.heap_blks_hit + COALESCE(io.idx_blks_read + io.idx_blks_hit, 0)
			FROM pg_stat_user_tables s JOIN pg_statio_user_tables io USING (relid)
			WHERE s.schemaname = $1 AND s.relname = $2`, adapter.Schema, name).Scan(&c.updates, &c.hot, &c.blocks)
	}))
	return c
}

// TestHotTablesStayCheapUnderHeldHorizon holds a read-only REPEATABLE READ
// transaction open, as pg_dump does, so that no version of a row that an
// update leaves behind can be removed, and runs two Subscribers one after
// the other that commit every Ack (CommitBatch 1) and heartbeat every
// third of a second. Heartbeats must be HOT updates (no index entry for
// each), and an offset commit must cost about as many block reads when
// thousands of versions of its row lie behind it as when few do: the
// commit goes to the row's latest version by its tuple id instead of
// walking the versions through the primary key.
func TestHotTablesStayCheapUnderHeldHorizon(t *testing.T) {
	ctx := context.Background()
	admin := newPool(t, 4)
	adapter := newSchema(t, admin)
	require.NoError(t, pglease.Migrate(ctx, admin, adapter))
	const (
		topics   = 10
		perPhase = 300 // messages per topic and phase
	)
	pub := newPublisher(t, admin, adapter)
	names := make([]string, topics)
	for i := range names {
		names[i] = fmt.Sprintf("hot-%02d", i)
		msgs := make([]*message.Message, 2*perPhase)
		for j := range msgs {
			msgs[j] = message.NewMessage(watermill.NewUUID(), []byte("x"))
		}
		require.NoError(t, pub.Publish(names[i], msgs...))
	}

	// The held transaction: it has read a table, so it holds a snapshot.
	holder, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, pglease.DefaultMessagesTable)).Scan(&n))
	require.Equal(t, topics*2*perPhase, n)

	// phase consumes perPhase messages of every topic with a Subscriber of
	// its own pool, closes both and waits until the pool's backends have
	// ended, so that their statistics have reached the tables' counters.
	phase := func() (offsets, sessions tableCounters) {
		t.Helper()
		offsets0 := readTableCounters(t, admin, adapter, pglease.DefaultConsumerOffsetsTable)
		sessions0 := readTableCounters(t, admin, adapter, pglease.DefaultConsumerSessionsTable)
		app := "pglease_hot_" + randomHex(4)
		cfg, err := pgxpool.ParseConfig(testkit.PoolDSN)
		require.NoError(t, err)
		cfg.MaxConns = 2 * topics
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
			ConsumerGroup:    "g",
			Tables:           adapter,
			SessionTTL:       pglease.MinSessionTTL,
			CommitBatch:      1,
			ListenConnConfig: directConnConfig(t),
			Maintenance:      pglease.MaintenanceConfig{Disabled: true},
		}, testLogger())
		require.NoError(t, err)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		started := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, topics)
		for _, topic := range names {
			msgs, err := sub.Subscribe(sctx, topic)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				timeout := time.After(time.Minute)
				for i := 0; i < perPhase; i++ {
					select {
					case msg := <-msgs:
						msg.Ack()
					case <-timeout:
						errs <- fmt.Errorf("topic %s: %d of %d messages within a minute", topic, i, perPhase)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// About a dozen heartbeats (every third of the TTL).
		time.Sleep(max(0, 4*pglease.MinSessionTTL-time.Since(started)))
		require.NoError(t, sub.Close())
		pool.Close()
		waitFor(t, 10*time.Second, "the Subscriber's backends to end", func() bool {
			var left int
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left))
			return left == 0
		})
		return readTableCounters(t, admin, adapter, pglease.DefaultConsumerOffsetsTable).minus(offsets0),
			readTableCounters(t, admin, adapter, pglease.DefaultConsumerSessionsTable).minus(sessions0)
	}
	offsets1, sessions1 := phase()
	offsets2, sessions2 := phase()
	for i, c := range []tableCounters{offsets1, offsets2} {
		t.Logf("phase %d: offsets: %d updates, %d HOT, %.1f blocks read per update", i+1, c.updates, c.hot, float64(c.blocks)/float64(c.updates))
	}
	for i, c := range []tableCounters{sessions1, sessions2} {
		t.Logf("phase %d: sessions: %d updates, %d HOT", i+1, c.updates, c.hot)
	}
	require.NoError(t, tx.Commit(ctx))

	for i, c := range []tableCounters{sessions1, sessions2} {
		require.GreaterOrEqual(t, c.updates, int64(5), "phase %d: heartbeats", i+1)
		require.GreaterOrEqual(t, float64(c.hot), 0.9*float64(c.updates), "phase %d: sessions updates (heartbeats) must be HOT", i+1)
	}
	for i, c := range []tableCounters{offsets1, offsets2} {
		// One per Ack, and the claims, first deliveries and releases.
		require.GreaterOrEqual(t, c.updates, int64(topics*perPhase), "phase %d: commits", i+1)
	}
	// The second phase commits with 300 to 600 versions of each row behind
	// it, the first with none to 300.
	perUpdate := func(c tableCounters) float64 { return float64(c.blocks) / float64(c.updates) }
	require.Less(t, perUpdate(offsets2), 8.0, "blocks read per offsets update with hundreds of versions of each row behind it")
	require.Less(t, perUpdate(offsets2), 1.5*perUpdate(offsets1), "blocks read per offsets update, second phase ÷ first")
}

// TestCommitOffsetVersionHint: the tuple id CommitOffset returns is only a
// hint for the next commit. A commit whose hint no longer names the row's
// latest version decides as a lookup by the key does: whether another
// transaction replaced that version before the commit, or while the
// commit waited for the row, and whether it kept the owner or not.
func TestCommitOffsetVersionHint(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	me, other := uuid.New(), uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, session_id, epoch)
		VALUES ('g', 't', $1, 1), ('g', 'u', $1, 1)`, me)
	require.NoError(t, err)

	commit := func(epoch, offset int64, version string) (string, bool, error) {
		q := tablesOf(adapter).CommitOffset(pgsql.OffsetParams{ConsumerGroup: "g", Topic: "t", SessionID: me, Epoch: epoch,
			Position: pgsql.Position{TransactionID: 1, Offset: offset}, Version: version, Here: serverHere(t, pool)})
		rows, err := pool.Query(ctx, q.SQL, q.Args...)
		if err != nil {
			return "", false, err
		}
		type commitRow struct {
			Version  *string
			WentBack bool
		}
		out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[commitRow])
		if err != nil || len(out) == 0 {
			return "", false, err
		}
		var written []string
		for _, r := range out {
			if r.WentBack || r.Version == nil {
				return "", false, fmt.Errorf("commit refused: the server is not where the session was made")
			}
			written = append(written, *r.Version)
		}
		if len(written) > 1 {
			return "", false, fmt.Errorf("%d rows written", len(written))
		}
		return written[0], true, nil
	}
	mustCommit := func(epoch, offset int64, version string) (string, bool) {
		t.Helper()
		v, ok, err := commit(epoch, offset, version)
		require.NoError(t, err)
		return v, ok
	}
	// latest reads row t: its version, acknowledged offset and epoch.
	latest := func(topic string) (version string, offset, epoch int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT ctid::text, acked_offset, epoch FROM `+offsets+`
			WHERE consumer_group = 'g' AND topic = $1`, topic).Scan(&version, &offset, &epoch))
		return version, offset, epoch
	}
	check := func(version string, ok bool, wantOK bool, wantOffset int64) {
		t.Helper()
		require.Equal(t, wantOK, ok)
		v, offset, _ := latest("t")
		require.Equal(t, wantOffset, offset)
		if ok {
			require.Equal(t, v, version, "the version returned is the row's latest")
		}
	}

	v, ok := mustCommit(1, 1, "")
	check(v, ok, true, 1)
	v, ok = mustCommit(1, 2, v)
	check(v, ok, true, 2)

	// Replaced before the commit, owner kept (a delivery count, AckInTx).
	_, err = pool.Exec(ctx, `UPDATE `+offsets+` SET head_deliveries = head_deliveries + 1 WHERE topic = 't'`)
	require.NoError(t, err)
	v, ok = mustCommit(1, 3, v)
	check(v, ok, true, 3)

	// A hint that names another row's version (after VACUUM FULL moved the
	// rows, say): row t is written, row u is not.
	vu, _, _ := latest("u")
	v, ok = mustCommit(1, 4, vu)
	check(v, ok, true, 4)
	_, offsetU, _ := latest("u")
	require.Zero(t, offsetU)

	// waitedFor replaces the row's version (change, with args) in a
	// transaction that holds it while a commit with the hint v waits for
	// the row, then commits.
	waitedFor := func(v string, epoch, offset int64, change string, args ...any) (string, bool) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `UPDATE `+offsets+` SET `+change+` WHERE topic = 't'`, args...)
		require.NoError(t, err)
		type result struct {
			v   string
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			v, ok, err := commit(epoch, offset, v)
			done <- result{v, ok, err}
		}()
		waitFor(t, 10*time.Second, "the commit to wait for the row", func() bool {
			var waiting bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%hinted%')`).Scan(&waiting))
			return waiting
		})
		require.NoError(t, tx.Commit(ctx))
		r := <-done
		require.NoError(t, r.err)
		return r.v, r.ok
	}

	// Replaced while the commit waited, owner kept.
	v, ok = waitedFor(v, 1, 5, `head_deliveries = head_deliveries + 1`)
	check(v, ok, true, 5)

	// Taken over while the commit waited: nothing written.
	v, ok = waitedFor(v, 1, 6, `session_id = $1, epoch = epoch + 1`, other)
	check(v, ok, false, 5)

	// Taken over before the commit: nothing written.
	v, _, epoch := latest("t")
	require.Equal(t, int64(2), epoch)
	v, ok = mustCommit(1, 7, v)
	check(v, ok, false, 5)
}

// TestDeliveryStallIsLoggedOnce: committed messages held back by an open
// transaction that published to the same topic before them (an outbox
// transaction) are logged once per stall, with the blocking pid; they are
// delivered when it ends. A writer that published nothing holds nothing
// (TestUnrelatedTransactionsHoldNoTopic).
func TestDeliveryStallIsLoggedOnce(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	logs := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true,
		PollInterval: 50 * time.Millisecond}, logs)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	publishN(t, pub, "t", 1)
	receiveOne(t, msgs).Ack()

	blocker, err := pgx.Connect(ctx, testkit.DSN)
	require.NoError(t, err)
	defer blocker.Close(ctx)
	var pid int
	require.NoError(t, blocker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.Publish("t", message.NewMessage(watermill.NewUUID(), []byte("outbox"))))
	held := publishN(t, pub, "t", 1)

	stalls := func() []logEntry {
		var out []logEntry
		for _, e := range logs.Entries() {
			if errors.Is(e.Err, pglease.ErrDeliveryHeldBack) {
				out = append(out, e)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "the stall to be logged", func() bool { return len(stalls()) > 0 })
	e := stalls()[0]
	assert.Equal(t, pid, e.Fields["pid"])
	assert.Equal(t, "t", e.Fields["topic"])
	// The consumer keeps polling every 50 ms while the stall lasts; a
	// second message behind the same transaction must not log again.
	held = append(held, publishN(t, pub, "t", 1)...)
	time.Sleep(10 * 50 * time.Millisecond) // ten polls' worth of chances to log again
	assert.Len(t, stalls(), 1, "logged once per stall")

	require.NoError(t, tx.Rollback(ctx))
	for _, id := range held {
		m := receiveOne(t, msgs)
		assert.Equal(t, id, m.UUID)
		m.Ack()
	}
}
