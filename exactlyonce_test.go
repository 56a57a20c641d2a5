package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
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
)

// effectsTable holds the effects that the exactly-once tests' handlers
// write, deliberately without a unique constraint: a duplicate effect is a
// second row, not an error.
const effectsTable = "test_effects"

func createEffects(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+table(adapter, effectsTable)+` (
	id   bigserial PRIMARY KEY,
	uuid text NOT NULL,
	proc text NOT NULL
)`)
	require.NoError(t, err)
}

func insertEffect(ctx context.Context, tx pgx.Tx, schema, uuid, proc string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+table(pglease.Tables{Schema: schema}, effectsTable)+
		` (uuid, proc) VALUES ($1, $2)`, uuid, proc)
	return err
}

// effectsOf returns the processes that wrote an effect for each uuid.
func effectsOf(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) map[string][]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT uuid, proc FROM `+table(adapter, effectsTable)+` ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var u, p string
		require.NoError(t, rows.Scan(&u, &p))
		out[u] = append(out[u], p)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestAckInTxCommitsWithTheTransaction: a position acknowledged in a
// transaction that commits counts even without Ack, and is never moved
// back by the coalesced commit or the release of an older Ack; one that
// rolls back does not count.
func TestAckInTxCommitsWithTheTransaction(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ids := publishN(t, pub, "in", 4)
	createEffects(t, pool, adapter)

	newSub := func() *pglease.Subscriber {
		// Acks wait for a commit that only the release writes; Close
		// hands the message left unacked over at once.
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true,
			CommitInterval: time.Hour, CommitBatch: 1000, DrainTimeout: -1}, testLogger())
		require.NoError(t, err)
		return sub
	}
	sub := newSub()
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)

	m0 := receiveOne(t, msgs)
	require.Equal(t, ids[0], m0.UUID)
	m0.Ack() // plain Ack: committed later, by the release
	m1 := receiveOne(t, msgs)
	require.Equal(t, ids[1], m1.UUID)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, adapter.Schema, m1.UUID, "a"))
	require.NoError(t, pglease.AckInTx(ctx, tx, m1))
	require.NoError(t, tx.Commit(ctx))
	pos1, ok := pglease.MessagePositionFromCtx(m1.Context())
	require.True(t, ok)
	d1, ok := pglease.MessageDeliveryFromCtx(m1.Context())
	require.True(t, ok)
	require.Equal(t, pos1, d1.Position)
	require.Equal(t, "in", d1.Topic)
	require.Equal(t, "", d1.ConsumerGroup)
	require.NotEqual(t, uuid.Nil, d1.SessionID)
	require.Positive(t, d1.Epoch)
	_, ok = pglease.MessageDeliveryFromCtx(ctx)
	require.False(t, ok, "not a delivered message's context")
	require.Equal(t, pos1, ackedOffset(t, pool, adapter, "", "in"), "committed with the transaction, before any Ack")

	// Not acked: Close releases the older position of m0, which must not
	// move the row back.
	require.NoError(t, sub.Close())
	require.Equal(t, pos1, ackedOffset(t, pool, adapter, "", "in"), "the release must not move the position back")

	// The next Subscriber starts after m1.
	sub = newSub()
	msgs, err = sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	m2 := receiveOne(t, msgs)
	require.Equal(t, ids[2], m2.UUID, "m1 was acknowledged in its transaction")

	// Acknowledged in a transaction that rolls back: delivered again.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, adapter.Schema, m2.UUID, "a"))
	require.NoError(t, pglease.AckInTx(ctx, tx, m2))
	require.NoError(t, tx.Rollback(ctx))
	m2.Nack()
	again := receiveOne(t, msgs)
	require.Equal(t, ids[2], again.UUID)

	// Acknowledged in a committed transaction, then nacked (say the
	// commit's reply was lost): the redelivery is refused as already done.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, pglease.AckInTx(ctx, tx, again))
	require.NoError(t, tx.Commit(ctx))
	again.Nack()
	third := receiveOne(t, msgs)
	require.Equal(t, ids[2], third.UUID)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, pglease.AckInTx(ctx, tx, third), pglease.ErrAlreadyAcknowledged)
	require.NoError(t, tx.Rollback(ctx))
	third.Ack()
	require.Equal(t, ids[3], receiveOne(t, msgs).UUID)

	require.Equal(t, map[string][]string{m1.UUID: {"a"}}, effectsOf(t, pool, adapter))
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

func TestAckInTxBadInput(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	err = pglease.AckInTx(ctx, tx, message.NewMessage("made-here", nil))
	require.ErrorIs(t, err, pglease.ErrInvalidMessage)
	require.ErrorContains(t, err, "not delivered by a pglease Subscriber")
	require.ErrorIs(t, pglease.AckInTx(ctx, tx, nil), pglease.ErrInvalidMessage)
	_, ok := pglease.MessagePartitionFromCtx(ctx)
	require.False(t, ok)
}

// TestAckInTxIsFencedInTheDatabase: a message whose partition was released
// and claimed by another Subscriber is refused by the row's epoch, although
// the session that delivered it is alive, and the transaction's effect is
// rolled back.
func TestAckInTxIsFencedInTheDatabase(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	ids := publishN(t, pub, "in", 2)
	createEffects(t, pool, adapter)
	// DrainTimeout -1: A's subscription hands the message it holds over at once.
	cfg := pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true, DrainTimeout: -1}

	a, err := pglease.NewSubscriber(pool, cfg, testLogger())
	require.NoError(t, err)
	defer a.Close()
	actx, cancelA := context.WithCancel(ctx)
	msgsA, err := a.Subscribe(actx, "in")
	require.NoError(t, err)
	stale := receiveOne(t, msgsA)
	require.Equal(t, ids[0], stale.UUID)

	// A's subscription ends (the row is released), B takes the topic and
	// gets the same message.
	cancelA()
	b, err := pglease.NewSubscriber(pool, cfg, testLogger())
	require.NoError(t, err)
	defer b.Close()
	msgsB, err := b.Subscribe(ctx, "in")
	require.NoError(t, err)
	fresh := receiveOne(t, msgsB)
	require.Equal(t, ids[0], fresh.UUID)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, adapter.Schema, stale.UUID, "a"))
	err = pglease.AckInTx(ctx, tx, stale)
	require.ErrorIs(t, err, pglease.ErrOwnershipLost)
	require.NoError(t, tx.Rollback(ctx))

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, adapter.Schema, fresh.UUID, "b"))
	require.NoError(t, pglease.AckInTx(ctx, tx, fresh))
	require.NoError(t, tx.Commit(ctx))
	fresh.Ack()
	require.Equal(t, map[string][]string{ids[0]: {"b"}}, effectsOf(t, pool, adapter))
}

// TestTxHandlerWithTheRouter: consume, transform and produce in one
// transaction through the Router: every input has one effect and one
// derived message, and the group's position is at the last input.
func TestTxHandlerWithTheRouter(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "orders", pglease.TopicConfig{Partitions: 4, Tables: adapter,
		InitializeSchema: true}))
	createEffects(t, pool, adapter)
	var ids []string
	for i := range 200 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
		ids = append(ids, msg.UUID)
		require.NoError(t, pub.Publish("orders", msg))
	}

	routeWithTxHandler(t, pool, adapter, ids)
	assertNoLeakedGoroutines(t)
}

// routeWithTxHandler consumes the messages ids of topic "orders" through a
// Router's TxHandler that writes an effect row and publishes a derived
// message to "invoices" in the transaction that acknowledges the message,
// failing once after writing the effect of ids[7]; once every message has
// an effect it closes the Router and checks that each has exactly one
// effect and one derived message.
func routeWithTxHandler(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, ids []string) {
	t.Helper()
	ctx := context.Background()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter}, testLogger())
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	var failOnce sync.Map
	failOnce.Store(ids[7], true)
	router.AddConsumerHandler("orders", "orders", sub, pglease.TxHandler(pool,
		pglease.TxHandlerConfig{PublishTopic: "invoices", Publisher: pglease.PublisherConfig{Tables: adapter}},
		func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if err := insertEffect(ctx, tx, adapter.Schema, msg.UUID, "router"); err != nil {
				return nil, err
			}
			if _, first := failOnce.LoadAndDelete(msg.UUID); first {
				return nil, errors.New("failing once, after writing the effect")
			}
			return []*message.Message{message.NewMessage("invoice-"+msg.UUID, msg.Payload)}, nil
		}))
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	waitFor(t, time.Minute, "an effect for every message", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, effectsTable)).Scan(&n)
		return n >= len(ids)
	})
	require.NoError(t, router.Close())
	require.NoError(t, sub.Close())

	effects := effectsOf(t, pool, adapter)
	require.Len(t, effects, len(ids))
	for _, id := range ids {
		require.Len(t, effects[id], 1, "effects of %s", id)
	}
	var invoices, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT uuid) FROM `+
		table(adapter, pglease.DefaultMessagesTable)+` WHERE topic = 'invoices'`).Scan(&invoices, &distinct))
	require.Equal(t, len(ids), invoices)
	require.Equal(t, len(ids), distinct)
}

// runTx is modeTx: a Router with one TxHandler per topic, writing an effect
// row and publishing one derived message to DeriveTopic per message, all
// in one transaction. A message whose holdMetadata names this process is
// held after its effect was written, before AckInTx, until "go"; the
// outcome of its transaction is printed as "result <uuid> <error or ok>".
func (h *helperChild) runTx(term <-chan os.Signal) error {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	adapter := pglease.Tables{Schema: h.cfg.Schema}
	handle := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		time.Sleep(h.cfg.Work)
		if err := insertEffect(ctx, tx, h.cfg.Schema, msg.UUID, h.cfg.Name); err != nil {
			return nil, err
		}
		if msg.Metadata.Get(holdMetadata) == h.cfg.Name {
			h.say("holding " + msg.UUID)
			<-h.goCmd
		}
		return []*message.Message{message.NewMessage("derived-"+msg.UUID, msg.Payload)}, nil
	}
	for i, sub := range h.subs {
		for _, topic := range h.cfg.Topics {
			txh := pglease.TxHandler(h.subPool, pglease.TxHandlerConfig{PublishTopic: h.cfg.DeriveTopic,
				Publisher: pglease.PublisherConfig{Tables: adapter}}, handle)
			router.AddConsumerHandler(fmt.Sprintf("%d/%s", i, topic), topic, sub, func(msg *message.Message) error {
				err := txh(msg)
				if msg.Metadata.Get(holdMetadata) == h.cfg.Name {
					result := "ok"
					if err != nil {
						result = err.Error()
					}
					h.say("result " + msg.UUID + " " + result)
				}
				return err
			})
		}
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return fmt.Errorf("router stopped before running: %w", err)
	}
	h.say("ready")
	select {
	case <-term:
		if err := router.Close(); err != nil {
			return err
		}
		for _, sub := range h.subs {
			if err := sub.Close(); err != nil {
				return err
			}
		}
		h.say("closed")
		return nil
	case err := <-runErr:
		return fmt.Errorf("router stopped by itself: %v", err)
	}
}

// TestExactlyOnceUnderRepeatedKills: two processes of a group consume a
// topic of 4 partitions with TxHandler (an effect row and a derived
// message per message, acknowledged in the same transaction); every 0.7 s
// one of them is SIGKILLed and restarted, 25 times. At the end every
// message has exactly one effect and one derived message.
func TestExactlyOnceUnderRepeatedKills(t *testing.T) {
	parallel(t)
	const (
		messages = 5000
		kills    = 25
		ttl      = time.Second
	)
	ctx := context.Background()
	s := newFailureSetup(t, ttl, "in")
	createEffects(t, s.pool, s.adapter)
	require.NoError(t, pglease.CreateTopic(ctx, s.pool, "in", pglease.TopicConfig{Partitions: 4, Tables: s.adapter}))
	// The messages are published while the kills go on: 10 every 70 ms,
	// about as long as the 25 kills and restarts take.
	published := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < messages && err == nil; i += 10 {
			var batch []*message.Message
			for j := i; j < i+10; j++ {
				batch = append(batch, message.NewMessage(fmt.Sprintf("m%05d", j), nil))
			}
			err = s.pub.Publish("in", batch...)
			time.Sleep(70 * time.Millisecond) // publishing pace
		}
		published <- err
	}()
	cfg := s.cfg
	cfg.Mode = modeTx
	cfg.DeriveTopic = "derived"
	cfg.Work = 0

	procs := startHelpers(t, cfg.named("a"), cfg.named("b"))
	began := time.Now()
	effects := func() int {
		var n int
		_ = s.pool.QueryRow(ctx, `SELECT count(DISTINCT uuid) FROM `+table(s.adapter, effectsTable)).Scan(&n)
		return n
	}
	for k := range kills {
		time.Sleep(700 * time.Millisecond) // the kill pace the test is about, not a wait for a condition
		i := k % 2
		procs[i].signal(t, syscall.SIGKILL)
		procs[i] = startHelper(t, cfg.named(fmt.Sprintf("%c%d", 'a'+i, k)))
	}
	t.Logf("%d kills done in %s; %d of %d messages have an effect", kills, time.Since(began).Round(time.Millisecond),
		effects(), messages)
	require.NoError(t, <-published)
	waitFor(t, 3*time.Minute, "an effect for every message", func() bool { return effects() >= messages })
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
		p.waitLine(t, "closed", time.Minute)
	}

	all := effectsOf(t, s.pool, s.adapter)
	var dups []string
	for id, procs := range all {
		if len(procs) != 1 {
			dups = append(dups, fmt.Sprintf("%s by %v", id, procs))
		}
	}
	assert.Len(t, all, messages, "messages with an effect")
	assert.Empty(t, dups, "messages with more than one effect")
	var derived, distinct int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT uuid) FROM `+
		table(s.adapter, pglease.DefaultMessagesTable)+` WHERE topic = 'derived'`).Scan(&derived, &distinct))
	assert.Equal(t, messages, derived, "derived messages")
	assert.Equal(t, messages, distinct, "distinct derived messages")
	byProc := map[string]int{}
	for _, procs := range all {
		byProc[procs[0]]++
	}
	t.Logf("exactly once under %d kills: %d messages with an effect, %d with more than one; %d derived messages; "+
		"effects by process: %v", kills, len(all), len(dups), derived, byProc)
}

// TestStaleOwnerAckInTxIsRefused: an owner frozen (SIGSTOP) past its
// SessionTTL while its handler's transaction has written the effect, then
// resumed, gets ErrOwnershipLost from AckInTx and its effect is rolled
// back; the owner that took over wrote the only effect.
func TestStaleOwnerAckInTxIsRefused(t *testing.T) {
	const ttl = time.Second
	ctx := context.Background()
	s := newFailureSetup(t, ttl, "in")
	createEffects(t, s.pool, s.adapter)
	s.cfg.Mode = modeTx
	s.cfg.DeriveTopic = "derived"
	a, _ := s.startOwnerAndStandby(t)

	held := publishHeld(t, s.pub, "in", "A")
	a.waitLine(t, "holding "+held, 30*time.Second)
	a.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	waitFor(t, 30*time.Second, "B to write the effect of the held message", func() bool {
		return len(effectsOf(t, s.pool, s.adapter)[held]) == 1
	})
	t.Logf("B took over and processed the held message %s after A was stopped", time.Since(stopped).Round(time.Millisecond))
	a.signal(t, syscall.SIGCONT)
	a.command(t, "go")
	line := a.waitLine(t, "result "+held, 30*time.Second)
	assert.Contains(t, line, pglease.ErrOwnershipLost.Error())
	assert.True(t, strings.HasPrefix(line, "result "+held+" "), line)
	require.Equal(t, []string{"B"}, effectsOf(t, s.pool, s.adapter)[held], "only B's effect is committed")
	var derived int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM `+table(s.adapter, pglease.DefaultMessagesTable)+
		` WHERE uuid = $1`, "derived-"+held).Scan(&derived))
	require.Equal(t, 1, derived, "one derived message")
}

// TestAckInTxWaitsForAConcurrentClaim forces the interleaving that the
// one-statement AckInTx must get right: a claim of the row is under way
// (row locked, epoch bumped, not committed) when AckInTx runs. AckInTx
// waits for it and, once it commits, refuses with ErrOwnershipLost; if it
// rolls back instead, AckInTx goes through.
func TestAckInTxWaitsForAConcurrentClaim(t *testing.T) {
	for _, claimCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("claim commits %v", claimCommits), func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			pub := newPublisher(t, pool, adapter)
			publishN(t, pub, "t", 1)
			// The message stays out: Close does not wait for it.
			sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true,
				DrainTimeout: -1}, testLogger())
			require.NoError(t, err)
			defer sub.Close()
			msgs, err := sub.Subscribe(ctx, "t")
			require.NoError(t, err)
			msg := receiveOne(t, msgs)

			claimer, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = claimer.Rollback(ctx) }()
			_, err = claimer.Exec(ctx, `UPDATE `+table(adapter, pglease.DefaultConsumerOffsetsTable)+
				` SET session_id = gen_random_uuid(), epoch = epoch + 1 WHERE topic = 't'`)
			require.NoError(t, err)

			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			pid := conn.Conn().PgConn().PID()
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			done := make(chan error, 1)
			go func() { done <- pglease.AckInTx(ctx, tx, msg) }()
			doneSignal := make(chan struct{})
			require.True(t, waitBlockedOnLock(t, pool, pid, doneSignal), "AckInTx must wait for the claim's row lock")
			if claimCommits {
				require.NoError(t, claimer.Commit(ctx))
				require.ErrorIs(t, <-done, pglease.ErrOwnershipLost)
			} else {
				require.NoError(t, claimer.Rollback(ctx))
				require.NoError(t, <-done)
				require.NoError(t, tx.Commit(ctx))
				pos, _ := pglease.MessagePositionFromCtx(msg.Context())
				require.Equal(t, pos, ackedOffset(t, pool, adapter, "", "t"))
			}
		})
	}
}
