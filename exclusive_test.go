package pglease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// The tests of this file force, one by one, the interleavings and failures
// under which a (consumer group, topic) could end up with two deliverers or
// with an owner that does not consume it. Each holds a row lock from a
// second connection, or makes a statement fail on purpose, at the moment
// that matters, and waits for the blocked statement to be seen waiting on
// that lock in pg_stat_activity: nothing depends on timing luck.

func runClaim(ctx context.Context, conn *pgxpool.Conn, adapter pglease.Tables, group, topic string, session uuid.UUID) (claimOutcome, error) {
	here, err := pgsql.Here(ctx, conn)
	if err != nil {
		return claimOutcome{}, err
	}
	q := claimQuery(adapter, group, topic, session, here)
	rows, err := conn.Query(ctx, q.SQL, q.Args...)
	if err != nil {
		return claimOutcome{}, err
	}
	return scanClaim(rows)
}

// TestClaimCannotTakeARowFromASessionItCannotSee: a claim statement whose
// snapshot predates a session, and that waits for that session's claim of
// the same row, must find the row taken when it gets the lock. (Deciding
// "owner is gone" with a sub-select on the sessions table, re-checked on the
// old snapshot, took the row from the live session.)
func TestClaimCannotTakeARowFromASessionItCannotSee(t *testing.T) {
	pool := newPool(t, 6)
	adapter := newSchema(t, pool)
	createTables(t, pool, adapter)
	ctx := context.Background()
	const group, topic = "g", "t"
	early, late := uuid.New(), uuid.New()
	setup := dedicatedConn(t, pool)
	execQuery(t, setup, tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: early, ConsumerGroup: group, Owner: "early", TTL: time.Hour}))
	ensureRow(t, setup, adapter, group, topic)

	// The late session is created and claims the free row in one open
	// transaction: the early claimer's snapshot will not see the session.
	lateConn := dedicatedConn(t, pool)
	tx, err := lateConn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	q := tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: late, ConsumerGroup: group, Owner: "late", TTL: time.Hour})
	_, err = tx.Exec(ctx, q.SQL, q.Args...)
	require.NoError(t, err)
	q = claimQuery(adapter, group, topic, late, serverHere(t, pool))
	rows, err := tx.Query(ctx, q.SQL, q.Args...)
	require.NoError(t, err)
	lateClaim, err := scanClaim(rows)
	require.NoError(t, err)
	require.True(t, lateClaim.Claimed)

	earlyConn := dedicatedConn(t, pool)
	done := make(chan struct{})
	var (
		early1 claimOutcome
		errE   error
	)
	go func() {
		defer close(done)
		early1, errE = runClaim(ctx, earlyConn, adapter, group, topic, early)
	}()
	require.True(t, waitBlockedOnLock(t, pool, earlyConn.Conn().PgConn().PID(), done), "the early claim did not wait for the late one")
	require.NoError(t, tx.Commit(ctx))
	<-done
	require.NoError(t, errE)

	assert.False(t, early1.Claimed, "the early claim took the row from the live late session")
	r := readOffset(t, pool, adapter, group, topic)
	require.NotNil(t, r.Session)
	assert.Equal(t, late, *r.Session, "the late session owns the row")
}

// TestLateHeartbeatAndClaimAtExpirySerialize: a heartbeat that was sent
// before its session expired but reaches the row after the expiry, and a
// claim made after the expiry, must not both succeed: else the old owner
// trusts its session again while the new one delivers. The test holds the
// session row locked from a third connection so that the heartbeat is
// under way from before the expiry until after the claim.
func TestLateHeartbeatAndClaimAtExpirySerialize(t *testing.T) {
	pool := newPool(t, 8)
	adapter := newSchema(t, pool)
	createTables(t, pool, adapter)
	ctx := context.Background()
	const group, topic = "g", "t"
	const ttl = 2 * time.Second
	owner, claimer := uuid.New(), uuid.New()
	setup := dedicatedConn(t, pool)
	execQuery(t, setup, tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: owner, ConsumerGroup: group, Owner: "owner", TTL: ttl}))
	execQuery(t, setup, tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: claimer, ConsumerGroup: group, Owner: "claimer", TTL: time.Hour}))
	ensureRow(t, setup, adapter, group, topic)
	o, err := runClaim(ctx, setup, adapter, group, topic, owner)
	require.NoError(t, err)
	require.True(t, o.Claimed)

	lockConn := dedicatedConn(t, pool)
	lock, err := lockConn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	var expires time.Time
	require.NoError(t, lock.QueryRow(ctx, `SELECT expires_at FROM `+table(adapter, pglease.DefaultConsumerSessionsTable)+
		` WHERE id = $1 FOR UPDATE`, owner).Scan(&expires))

	// The heartbeat starts before the expiry and waits for the row.
	hbConn := dedicatedConn(t, pool)
	hbDone := make(chan struct{})
	var (
		hbRows int64
		hbErr  error
	)
	go func() {
		defer close(hbDone)
		q := tablesOf(adapter).HeartbeatSession(pgsql.SessionParams{SessionID: owner, TTL: ttl})
		tag, err := hbConn.Exec(ctx, q.SQL, q.Args...)
		hbRows, hbErr = tag.RowsAffected(), err
	}()
	require.True(t, waitBlockedOnLock(t, pool, hbConn.Conn().PgConn().PID(), hbDone))
	var beforeExpiry bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT query_start < $2 FROM pg_stat_activity WHERE pid = $1`,
		hbConn.Conn().PgConn().PID(), expires).Scan(&beforeExpiry))
	require.True(t, beforeExpiry, "the heartbeat must start before the session expires (the machine is too slow for a %s TTL)", ttl)

	// After the expiry, as the server sees it, the claimer tries.
	waitFor(t, 2*ttl, "the owner's session to expire", func() bool {
		var expired bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT $1 < clock_timestamp()`, expires).Scan(&expired))
		return expired
	})
	claimConn := dedicatedConn(t, pool)
	claimDone := make(chan struct{})
	var (
		claim    claimOutcome
		claimErr error
	)
	go func() {
		defer close(claimDone)
		claim, claimErr = runClaim(ctx, claimConn, adapter, group, topic, claimer)
	}()
	waitBlockedOnLock(t, pool, claimConn.Conn().PgConn().PID(), claimDone)
	require.NoError(t, lock.Commit(ctx))
	<-hbDone
	<-claimDone
	require.NoError(t, hbErr)
	require.NoError(t, claimErr)
	t.Logf("heartbeat applied: %v, claim succeeded: %v", hbRows == 1, claim.Claimed)

	assert.False(t, hbRows == 1 && claim.Claimed,
		"the claim took the topic from the expired session and the late heartbeat then extended that session")
	r := readOffset(t, pool, adapter, group, topic)
	if claim.Claimed {
		assert.Equal(t, claimer, *r.Session)
		var sessions int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, pglease.DefaultConsumerSessionsTable)+
			` WHERE id = $1`, owner).Scan(&sessions))
		assert.Zero(t, sessions, "the claimer deleted the expired session, so its owner learns that it is lost")
	} else {
		assert.Equal(t, owner, *r.Session)
	}
}

// TestClaimTakesRowsOfExpiredAndGoneSessions: the ordinary takeovers still
// work: from an expired session (whose row the claim deletes, and which the
// claim reports), from a session whose row is gone, and from a free row;
// a live owner keeps its row.
func TestClaimTakesRowsOfExpiredAndGoneSessions(t *testing.T) {
	parallel(t)
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	createTables(t, pool, adapter)
	ctx := context.Background()
	conn := dedicatedConn(t, pool)
	const group = "g"
	sessions := table(adapter, pglease.DefaultConsumerSessionsTable)
	me, live, expired, gone := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	for _, s := range []uuid.UUID{me, live, expired, gone} {
		execQuery(t, conn, tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: s, ConsumerGroup: group, Owner: s.String(), TTL: time.Hour}))
	}
	for _, owner := range []uuid.UUID{live, expired, gone} {
		topic := owner.String()
		ensureRow(t, conn, adapter, group, topic)
		o, err := runClaim(ctx, conn, adapter, group, topic, owner)
		require.NoError(t, err)
		require.True(t, o.Claimed)
	}
	_, err := pool.Exec(ctx, `UPDATE `+sessions+` SET expires_at = now() - interval '1 second' WHERE id = $1`, expired)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM `+sessions+` WHERE id = $1`, gone)
	require.NoError(t, err)

	o, err := runClaim(ctx, conn, adapter, group, live.String(), me)
	require.NoError(t, err)
	assert.False(t, o.Claimed, "a live owner keeps its row")

	for _, owner := range []uuid.UUID{expired, gone} {
		o, err := runClaim(ctx, conn, adapter, group, owner.String(), me)
		require.NoError(t, err)
		assert.True(t, o.Claimed)
		require.NotNil(t, o.Previous)
		assert.Equal(t, owner, *o.Previous, "the claim names the session it took the row from")
		assert.EqualValues(t, 2, *o.Epoch)
	}
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+sessions+` WHERE id = $1`, expired).Scan(&left))
	assert.Zero(t, left, "the claim deleted the expired session")

	ensureRow(t, conn, adapter, group, "free")
	o, err = runClaim(ctx, conn, adapter, group, "free", me)
	require.NoError(t, err)
	assert.True(t, o.Claimed)
	assert.Nil(t, o.Previous)
}

// lockOffsetRow locks the offset row of (group, topic) from a connection of
// its own until unlock is called (or the test ends).
func lockOffsetRow(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group, topic string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn := dedicatedConn(t, pool)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+table(adapter, pglease.DefaultConsumerOffsetsTable)+
		` WHERE consumer_group = $1 AND topic = $2 FOR UPDATE`, group, topic)
	require.NoError(t, err)
	var once sync.Once
	unlock = func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
	t.Cleanup(unlock)
	return unlock
}

// TestFailedReleaseIsRetried: when the release at the end of a subscription
// fails (here it times out behind a row lock held from another connection),
// the live Subscriber keeps trying until the row is free, instead of
// sitting on a topic that nobody consumes until the process exits.
func TestFailedReleaseIsRetried(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	const group, topic = "g", "t"
	cfg := pglease.SubscriberConfig{ConsumerGroup: group, SessionTTL: 3 * time.Second, CloseTimeout: 200 * time.Millisecond}
	sub := newTestSubscriber(t, pool, adapter, cfg)
	standby := newTestSubscriber(t, pool, adapter, cfg)
	ids := publishN(t, pub, topic, 2)

	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	receive(t, msgs, 1, 10*time.Second)
	waitFor(t, 10*time.Second, "the first ack to be committed", func() bool {
		return readOffset(t, pool, adapter, group, topic).Offset > 0
	})
	standbyMsgs, err := standby.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	owned := readOffset(t, pool, adapter, group, topic)
	require.NotNil(t, owned.Session)

	unlock := lockOffsetRow(t, pool, adapter, group, topic)
	cancel()
	for range msgs { // the channel closes after the first attempt, which times out
	}
	stillOwned := readOffset(t, pool, adapter, group, topic)
	require.NotNil(t, stillOwned.Session, "the release cannot have gone through while the row is locked")

	unlock()
	waitFor(t, 10*time.Second, "the release to be retried", func() bool {
		r := readOffset(t, pool, adapter, group, topic)
		return r.Session == nil || *r.Session != *owned.Session
	})
	got := receive(t, standbyMsgs, 1, 10*time.Second)
	assert.Equal(t, ids[1], got[0].UUID, "the standby starts after the acked message: the retried release wrote it")
}

// TestClaimWithLostReplyIsSettled: a claim that committed while its reply
// was lost, followed by the end of the subscription, must not leave the
// topic owned by the live session: the Subscriber settles it (claims it again
// to learn the epoch, then releases it).
func TestClaimWithLostReplyIsSettled(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	const group, topic = "g", "t"
	cfg := pglease.SubscriberConfig{ConsumerGroup: group, PollInterval: time.Second}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
		InitializeSchema: true, PollInterval: time.Minute}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	// The first claim commits, but its reply is lost.
	lost := make(chan struct{})
	var once sync.Once
	pglease.SetAfterClaimHook(sub, func([]string) error {
		var err error
		once.Do(func() {
			err = errors.New("test: the claim's reply was lost")
			close(lost)
		})
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	<-lost
	r := readOffset(t, pool, adapter, group, topic)
	require.NotNil(t, r.Session, "the claim committed")
	cancel()
	for range msgs {
	}
	waitFor(t, 10*time.Second, "the lost claim to be released", func() bool {
		return readOffset(t, pool, adapter, group, topic).Session == nil
	})

	other := newTestSubscriber(t, pool, adapter, cfg)
	ids := publishN(t, pub, topic, 1)
	otherMsgs, err := other.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	got := receive(t, otherMsgs, 1, 10*time.Second)
	assert.Equal(t, ids, uuids(got))
}

// TestDeletedOffsetRowIsRecreated: deleting a group's offset row (the
// obvious manual reset) starts the group again from the beginning of the
// topic instead of failing every claim.
func TestDeletedOffsetRowIsRecreated(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	const group, topic = "g", "t"
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: group, CommitBatch: 1})
	ids := publishN(t, pub, topic, 3)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	receive(t, msgs, 3, 10*time.Second)
	waitFor(t, 10*time.Second, "the third ack to be committed", func() bool {
		return countOffsetRows(t, pool, table(adapter, pglease.DefaultConsumerOffsetsTable),
			`acked_offset = (SELECT max("offset") FROM `+table(adapter, pglease.DefaultMessagesTable)+`)`) == 1
	})

	_, err = pool.Exec(context.Background(), `DELETE FROM `+table(adapter, pglease.DefaultConsumerOffsetsTable))
	require.NoError(t, err)
	ids = append(ids, publishN(t, pub, topic, 1)...)
	// The owner hands out the new message from memory; its commit then finds
	// no row, and the group starts over from the beginning.
	got := receive(t, msgs, 5, 10*time.Second)
	assert.Equal(t, ids[3], got[0].UUID)
	assert.Equal(t, ids, uuids(got[1:]), "after the reset, the topic is delivered from its first message")
	r := readOffset(t, pool, adapter, group, topic)
	assert.NotNil(t, r.Session, "the row exists again and is owned")
}

// TestPositionsFromAnotherClusterAreRefused: a stored position whose
// transaction id lies ahead of the database's counter (as after a logical
// dump and restore into a new cluster) stops delivery with an error that
// names the problem, instead of skipping new messages silently; after the
// documented repair, delivery goes on. A stored message that lies ahead
// is skipped with one Error naming it, and the messages around it are
// delivered.
func TestPositionsFromAnotherClusterAreRefused(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ctx := context.Background()
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	messages := table(adapter, pglease.DefaultMessagesTable)
	// future is far ahead of anything this test cluster reaches (the
	// position sequence starts 2^40 above the transaction counter).
	const future = "1125899906842624"

	t.Run("position", func(t *testing.T) {
		ids := publishN(t, pub, "positions", 2)
		_, err := pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, acked_transaction_id, acked_offset)
VALUES ('g', 'positions', $1::text::xid8, 1)`, future)
		require.NoError(t, err)
		logger := newCapturingLogger()
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
			PollInterval: 10 * time.Millisecond}, logger)
		require.NoError(t, err)
		defer func() { require.NoError(t, sub.Close()) }()
		msgs, err := sub.Subscribe(ctx, "positions")
		require.NoError(t, err)
		waitFor(t, 10*time.Second, "the refusal to be logged", func() bool {
			_, ok := logger.Find(func(e logEntry) bool { return errors.Is(e.Err, pglease.ErrFuturePosition) })
			return ok
		})
		assert.Nil(t, readOffset(t, pool, adapter, "g", "positions").Session, "the row was not claimed")
		assertNothingWithin(t, msgs, 100*time.Millisecond)

		// The repair of docs/guarantees.md for positions only.
		_, err = pool.Exec(ctx, `UPDATE `+offsets+` SET acked_transaction_id = '1', acked_offset = 0
WHERE acked_transaction_id > (SELECT last_value FROM `+table(adapter, pglease.DefaultMessagesTable+"_positions")+`)::text::xid8`)
		require.NoError(t, err)
		got := receive(t, msgs, 2, 10*time.Second)
		assert.Equal(t, ids, uuids(got))
	})

	t.Run("message", func(t *testing.T) {
		// A row ahead of the counter, written as a restore writes it (the
		// owner, keeping its position): no transaction of this database
		// wrote it. The partition is read as if it were not there, with
		// one Error naming it, however often it is read.
		before := publishN(t, pub, "messages", 2)
		execKeepingPositions(t, pool, `INSERT INTO `+messages+` (topic, transaction_id, uuid, payload)
VALUES ('messages', $1::text::xid8, 'restored', 'x')`, future)
		after := publishN(t, pub, "messages", 1)
		logger := newCapturingLogger()
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
			PollInterval: 10 * time.Millisecond}, logger)
		require.NoError(t, err)
		defer func() { require.NoError(t, sub.Close()) }()
		msgs, err := sub.Subscribe(ctx, "messages")
		require.NoError(t, err)
		got := receive(t, msgs, 3, 10*time.Second)
		for _, m := range got {
			m.Ack()
		}
		assert.Equal(t, append(before, after...), uuids(got), "the messages around the row are delivered")
		later := publishN(t, pub, "messages", 1)
		got = receive(t, msgs, 1, 10*time.Second)
		got[0].Ack()
		assert.Equal(t, later, uuids(got))
		assertNothingWithin(t, msgs, 100*time.Millisecond)
		var logged []logEntry
		for _, e := range errorsLogged(logger) {
			if errors.Is(e.Err, pglease.ErrFuturePosition) {
				logged = append(logged, e)
			}
		}
		require.Len(t, logged, 1, "one Error for the row: %v", logged)
		assert.Equal(t, "restored", logged[0].Fields["uuid"])
		assert.Equal(t, future+":", logged[0].Fields["position"].(string)[:len(future)+1])
		assert.Equal(t, "messages", logged[0].Fields["topic"])
	})
}

// TestTakeoverIsLoggedWithTheOldSession: taking a topic over from an
// expired session is logged at Info, naming that session and its owner.
func TestTakeoverIsLoggedWithTheOldSession(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	createTables(t, pool, adapter)
	ctx := context.Background()
	conn := dedicatedConn(t, pool)
	crashed := uuid.New()
	execQuery(t, conn, tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: crashed, ConsumerGroup: "g", Owner: "crashed-host/42", TTL: time.Hour}))
	ensureRow(t, conn, adapter, "g", "t")
	_, err := runClaim(ctx, conn, adapter, "g", "t", crashed)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE `+table(adapter, pglease.DefaultConsumerSessionsTable)+
		` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)

	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter}, logger)
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Close()) }()
	_, err = sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the takeover to be logged", func() bool {
		e, ok := logger.Find(func(e logEntry) bool { return strings.Contains(e.Msg, "taken over") })
		return ok && e.Level == "info" && e.Fields["previous_session_id"] == crashed.String() &&
			e.Fields["previous_owner"] == "crashed-host/42" && e.Fields["topic"] == "t"
	})
}

// TestTakeoverOfAGoneSessionIsLoggedWithItsOwner: when another claim
// already deleted an expired session's row (it took another of the
// session's rows), the takeover is logged with the owner the member saw
// while the session was alive.
func TestTakeoverOfAGoneSessionIsLoggedWithItsOwner(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	createTables(t, pool, adapter)
	ctx := context.Background()
	conn := dedicatedConn(t, pool)
	crashed := uuid.New()
	execQuery(t, conn, tablesOf(adapter).CreateSession(pgsql.SessionParams{SessionID: crashed, ConsumerGroup: "g", Owner: "crashed-host/42", TTL: time.Hour}))
	ensureRow(t, conn, adapter, "g", "t")
	_, err := runClaim(ctx, conn, adapter, "g", "t", crashed)
	require.NoError(t, err)

	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter}, logger)
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Close()) }()
	sawCrashed := make(chan struct{})
	var once sync.Once
	pglease.SetAfterMembersReadHook(sub, func(members int) {
		if members == 2 {
			once.Do(func() { close(sawCrashed) })
		}
	})
	_, err = sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	select {
	case <-sawCrashed:
	case <-time.After(10 * time.Second):
		t.Fatal("the Subscriber never read the group with the crashed session in it")
	}
	// The crashed session's row is gone, as when another survivor's claim
	// deleted it; the Subscriber is told the group changed.
	_, err = conn.Exec(ctx, `DELETE FROM `+table(adapter, pglease.DefaultConsumerSessionsTable)+` WHERE id = $1`, crashed)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_notify($1, 'gg')", tablesOf(adapter).NotifyChannel)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the takeover to be logged", func() bool {
		e, ok := logger.Find(func(e logEntry) bool { return strings.Contains(e.Msg, "taken over") })
		return ok && e.Fields["previous_session_id"] == crashed.String() && e.Fields["previous_owner"] == "crashed-host/42"
	})
}

// TestCloseReportsReleasesItCouldNotWrite: Close returns an error naming
// the topic whose release it could not write within CloseTimeout, and
// still stops every goroutine.
func TestCloseReportsReleasesItCouldNotWrite(t *testing.T) {
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: adapter,
		InitializeSchema: true, CloseTimeout: 300 * time.Millisecond}, testLogger())
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), "stuck")
	require.NoError(t, err)
	publishN(t, pub, "stuck", 1)
	receive(t, msgs, 1, 10*time.Second)
	waitFor(t, 10*time.Second, "the ack to be committed", func() bool {
		return readOffset(t, pool, adapter, "g", "stuck").Offset > 0
	})
	lockOffsetRow(t, pool, adapter, "g", "stuck")

	start := time.Now()
	err = sub.Close()
	t.Logf("Close took %s: %v", time.Since(start), err)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `topic "stuck" partition 0 not released`)
	assert.Less(t, time.Since(start), 5*time.Second)
	assertNoLeakedGoroutines(t)
	assert.NoError(t, sub.Close(), "a second Close has nothing to report")
}
