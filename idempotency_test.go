package pglease_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/tcpproxy"
)

// keyedByUUID is the PublisherConfig.IdempotencyKey that makes every retry
// of a Publish safe.
func keyedByUUID(_ string, msg *message.Message) string { return msg.UUID }

// storedCount returns how many rows topic holds in the messages table of
// tables, and how many distinct UUIDs.
func storedCount(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, topic string) (rows, distinct int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT uuid) FROM `+
		pgx.Identifier{tables.Schema, pglease.DefaultMessagesTable}.Sanitize()+` WHERE topic = $1`, topic).Scan(&rows, &distinct))
	return rows, distinct
}

// viaProxy returns a pool on the test database through proxy.
func viaProxy(t *testing.T, proxy *tcpproxy.Proxy, maxConns int32) *pgxpool.Pool {
	t.Helper()
	direct := directConnConfig(t)
	cfg, err := pgxpool.ParseConfig(direct.ConnString())
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestIdempotentPublishCommitReplyLost: the real failure. A proxy lets
// every statement through and, for one in every 7 that publish, drops
// the connection after the server committed, before the reply: Publish
// returns an error and the caller retries. 10,000 messages published
// from 16 goroutines, each retried until it succeeds: with their UUID as
// the idempotency key, each is stored exactly once, and every publish
// that was cut is found stored by its retry. Without keys (the same run,
// 1,000 messages) the cut publishes are stored twice: what the keys fix.
func TestIdempotentPublishCommitReplyLost(t *testing.T) {
	parallel(t)
	for _, c := range []struct {
		name  string
		keyed bool
		n     int
	}{{"with keys", true, 10000}, {"without keys", false, 1000}} {
		t.Run(c.name, func(t *testing.T) {
			proxy, err := tcpproxy.Start(net.JoinHostPort(directConnConfig(t).Host, strconv.Itoa(int(directConnConfig(t).Port))))
			require.NoError(t, err)
			defer proxy.Close()
			var seen, cuts atomic.Int64
			proxy.CutAfter(func(tag string) bool {
				if !strings.HasPrefix(tag, "SELECT") && !strings.HasPrefix(tag, "INSERT") {
					return false
				}
				if seen.Add(1)%7 != 0 {
					return false
				}
				cuts.Add(1)
				return true
			})
			admin := newPool(t, 4)
			tables := newSchema(t, admin)
			require.NoError(t, pglease.Migrate(context.Background(), admin, tables))
			pool := viaProxy(t, proxy, 16)
			config := pglease.PublisherConfig{Tables: tables}
			if c.keyed {
				config.IdempotencyKey = keyedByUUID
			}
			pub, err := pglease.NewPublisher(pool, config, nil)
			require.NoError(t, err)

			const workers = 16
			var failures, found atomic.Int64
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < c.n; i += workers {
						msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
						for attempt := 0; ; attempt++ {
							if attempt == 100 {
								t.Errorf("message %d: 100 attempts failed", i)
								return
							}
							res, err := pub.PublishWithResult("t", msg)
							if err != nil {
								failures.Add(1)
								continue
							}
							found.Add(int64(len(res.AlreadyStored)))
							break
						}
					}
				}()
			}
			wg.Wait()
			require.NoError(t, pub.Close())
			rows, distinct := storedCount(t, admin, tables, "t")
			t.Logf("%d messages, %d publishes cut after their commit, %d failed calls retried, %d retries found their message stored; %d rows stored",
				c.n, cuts.Load(), failures.Load(), found.Load(), rows)
			require.Positive(t, cuts.Load(), "the proxy cut no reply")
			require.Equal(t, c.n, distinct, "no message lost")
			if c.keyed {
				assert.Equal(t, c.n, rows, "no message stored twice")
				assert.GreaterOrEqual(t, found.Load(), cuts.Load(), "every cut publish found stored by its retry")
			} else {
				assert.Greater(t, rows, c.n, "without keys, a retried publish whose commit succeeded stores its message again")
			}
		})
	}
}

// TestIdempotentPublishEveryWay: a message with a key already stored is
// left out, and the call succeeds, on a pool, a pgx.Conn and a pgx.Tx
// (the outbox), and for delayed messages; a batch whose keys are partly
// stored stores the rest; the metadata key and the configured function
// both give keys; messages without keys are always stored. Each on a
// topic without retention and on one with a retention of three days.
func TestIdempotentPublishEveryWay(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 8)
	tables := newSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, tables))
	conn := dedicatedConn(t, pool)

	byMetadata := func(id, key string) *message.Message {
		m := message.NewMessage(id, []byte(id))
		if key != "" {
			m.Metadata.Set(pglease.IdempotencyKeyMetadata, key)
		}
		return m
	}
	// Each way on a topic without retention (day rows) and on one with a
	// retention of three days (the rows of its key class, usable).
	for _, c := range []struct {
		name string
		db   func(t *testing.T) (pglease.DB, func())
	}{
		{"pool", func(*testing.T) (pglease.DB, func()) { return pool, func() {} }},
		{"conn", func(*testing.T) (pglease.DB, func()) { return conn.Conn(), func() {} }},
		{"tx", func(t *testing.T) (pglease.DB, func()) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			return tx, func() { require.NoError(t, tx.Commit(ctx)) }
		}},
	} {
		for _, long := range []bool{false, true} {
			name := c.name
			if long {
				name += " retention"
			}
			t.Run(name, func(t *testing.T) {
				topic := "every-" + c.name
				if long {
					topic += "-long"
					require.NoError(t, pglease.CreateTopic(ctx, pool, topic, pglease.TopicConfig{Retention: 72 * time.Hour, Tables: tables}))
					readyKeyClass(t, pool, tables, 19)
				}
				db, done := c.db(t)
				pub, err := pglease.NewPublisher(db, pglease.PublisherConfig{Tables: tables}, nil)
				require.NoError(t, err)
				res, err := pub.PublishWithResult(topic, byMetadata("a", "k1"), byMetadata("b", ""), byMetadata("c", "k2"), byMetadata("d", "k1"))
				require.NoError(t, err)
				assert.Equal(t, []int{3}, res.AlreadyStored, "d repeats a's key")
				res, err = pub.PublishWithResult(topic, byMetadata("e", "k2"), byMetadata("f", "k3"), byMetadata("g", ""))
				require.NoError(t, err)
				assert.Equal(t, []int{0}, res.AlreadyStored, "k2 stored")
				require.NoError(t, pub.Publish(topic, byMetadata("h", "k3")), "a message already stored: no error")

				later := byMetadata("later", "k4")
				delay.Message(later, delay.For(time.Hour))
				again := byMetadata("again", "k4")
				delay.Message(again, delay.For(time.Hour))
				res, err = pub.PublishWithResult(topic, later, byMetadata("now", "k5"), again)
				require.NoError(t, err)
				assert.Equal(t, []int{2}, res.AlreadyStored, "a delayed message and a message due now in one call, the delayed repeated")
				res, err = pub.PublishWithResult(topic, byMetadata("k4 due now", "k4"), byMetadata("k5 delayed", "k5"))
				require.NoError(t, err)
				assert.Equal(t, []int{0, 1}, res.AlreadyStored, "keys of delayed and due messages are one set")
				require.NoError(t, pub.Close())
				done()

				rows, distinct := storedCount(t, pool, tables, topic)
				assert.Equal(t, 6, rows, "a b c f g now")
				assert.Equal(t, 6, distinct)
				var classRows int
				require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+keysTable(tables)+` WHERE topic = $1 AND gen >= 72`, topic).Scan(&classRows))
				assert.Equal(t, long, classRows > 0, "class rows only for the topic with a retention")
			})
		}
	}

	t.Run("configured function", func(t *testing.T) {
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
		require.NoError(t, err)
		defer pub.Close()
		msgs := []*message.Message{message.NewMessage("u1", nil), message.NewMessage("u2", nil)}
		require.NoError(t, pub.Publish("fn", msgs...))
		res, err := pub.PublishWithResult("fn", message.NewMessage("u2", nil), message.NewMessage("u3", nil), msgs[0])
		require.NoError(t, err)
		assert.Equal(t, []int{0, 2}, res.AlreadyStored)
		_, err = pub.PublishWithResult("fn", message.NewMessage("u\x00", nil))
		require.ErrorIs(t, err, pglease.ErrInvalidMessage, "a key with a NUL byte")
	})
}

// TestIdempotentPublishRace: two publishers of one key. The first holds
// its transaction open (an outbox on a pgx.Tx, from a connection of its
// own); the second, on a pool, waits for it on the keys table's unique
// index, and stores nothing once the first commits (or its message once
// the first rolls back). Neither deadlocks: each statement writes its keys
// in one order. Then many concurrent calls on a pool, group-committed,
// all with the same key: one message stored.
func TestIdempotentPublishRace(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 8)
	tables := newSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, tables))
	config := pglease.PublisherConfig{Tables: tables, IdempotencyKey: func(string, *message.Message) string { return "the key" }}
	second, err := pglease.NewPublisher(pool, config, nil)
	require.NoError(t, err)
	defer second.Close()

	for _, commit := range []bool{true, false} {
		topic := fmt.Sprint("race-", commit)
		holder := dedicatedConn(t, pool)
		tx, err := holder.Begin(ctx)
		require.NoError(t, err)
		first, err := pglease.NewPublisher(tx, config, nil)
		require.NoError(t, err)
		require.NoError(t, first.Publish(topic, message.NewMessage("first", nil)))

		type outcome struct {
			res pglease.PublishResult
			err error
		}
		out := make(chan outcome, 1)
		waiting := make(chan struct{})
		go func() {
			defer close(waiting)
			res, err := second.PublishWithResult(topic, message.NewMessage("second", nil))
			out <- outcome{res, err}
		}()
		// The second publisher's backend waits for a lock: the first's
		// transaction id.
		waitFor(t, 10*time.Second, "the second publisher to wait for the first", func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
				AND wait_event = 'transactionid' AND query LIKE '%keys%' AND datname = current_database()`).Scan(&n))
			return n == 1
		})
		select {
		case o := <-out:
			t.Fatalf("the second publisher returned while the first's transaction was open: %+v", o)
		default:
		}
		require.NoError(t, first.Close())
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		var o outcome
		select {
		case o = <-out:
		case <-time.After(10 * time.Second):
			t.Fatal("the second publisher still waits after the first's transaction ended")
		}
		<-waiting
		require.NoError(t, o.err)
		rows, _ := storedCount(t, pool, tables, topic)
		assert.Equal(t, 1, rows, "one message stored")
		if commit {
			assert.Equal(t, []int{0}, o.res.AlreadyStored, "the first committed: the second stored nothing")
		} else {
			assert.Empty(t, o.res.AlreadyStored, "the first rolled back: the second stored its message")
		}
	}

	const calls = 64
	var wg sync.WaitGroup
	var left atomic.Int64
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := second.PublishWithResult("many", message.NewMessage(fmt.Sprint("m", i), nil))
			assert.NoError(t, err)
			left.Add(int64(len(res.AlreadyStored)))
		}()
	}
	wg.Wait()
	rows, _ := storedCount(t, pool, tables, "many")
	assert.Equal(t, 1, rows, "64 concurrent calls with one key store one message")
	assert.Equal(t, int64(calls-1), left.Load())
}

// TestIdempotentPublishThroughPgBouncer: keys work through PgBouncer in
// transaction mode, in both of pgx's query modes that work there.
func TestIdempotentPublishThroughPgBouncer(t *testing.T) {
	ctx := context.Background()
	admin := newPool(t, 4)
	tables := newSchema(t, admin)
	require.NoError(t, pglease.Migrate(ctx, admin, tables))
	for _, mode := range []string{"exec", "simple_protocol"} {
		pool := newPoolOn(t, bouncerDSN(t, mode), 8)
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
		require.NoError(t, err)
		topic := "bouncer-" + mode
		msgs := []*message.Message{message.NewMessage("a", nil), message.NewMessage("b", nil)}
		require.NoError(t, pub.Publish(topic, msgs...))
		res, err := pub.PublishWithResult(topic, message.NewMessage("c", nil), msgs[1], msgs[0])
		require.NoError(t, err)
		assert.Equal(t, []int{1, 2}, res.AlreadyStored, mode)
		require.NoError(t, pub.Close())
		rows, _ := storedCount(t, admin, tables, topic)
		assert.Equal(t, 3, rows, mode)
	}
	requireBouncerHealthy(t)
}

// TestCitusIdempotentPublish: on Citus, keyed messages of several topics
// (half of them with a retention of three days, whose keys take the
// rows of their retention class) published by concurrent calls
// (group-committed into statements that write to several workers) are
// stored once each, and published again are all left out; the keys lie
// with their topics' messages.
func TestCitusIdempotentPublish(t *testing.T) {
	pool, tables := citusSchema(t, 10)
	// Half the topics keep their keys for their retention (class rows),
	// the class's partitions made as the maintainer makes them.
	for i := 0; i < 8; i += 2 {
		require.NoError(t, pglease.CreateTopic(context.Background(), pool, fmt.Sprint("citus-keys-", i),
			pglease.TopicConfig{Retention: 72 * time.Hour, Tables: tables}))
	}
	readyKeyClass(t, pool, tables, 19)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
	require.NoError(t, err)
	defer pub.Close()
	const topics, perTopic = 8, 20
	msgs := map[string][]*message.Message{}
	for i := range topics {
		topic := fmt.Sprint("citus-keys-", i)
		for j := range perTopic {
			msgs[topic] = append(msgs[topic], message.NewMessage(fmt.Sprint(topic, "-", j), nil))
		}
	}
	for round := range 2 {
		var wg sync.WaitGroup
		var left atomic.Int64
		for topic, ms := range msgs {
			for _, m := range ms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := pub.PublishWithResult(topic, m)
					assert.NoError(t, err)
					left.Add(int64(len(res.AlreadyStored)))
				}()
			}
		}
		wg.Wait()
		assert.Equal(t, int64(round*topics*perTopic), left.Load(), "round %d: left out", round)
	}
	for topic := range msgs {
		rows, distinct := storedCount(t, pool, tables, topic)
		assert.Equal(t, perTopic, rows, topic)
		assert.Equal(t, perTopic, distinct, topic)
	}
	var colocated bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT k.colocationid = m.colocationid
		FROM pg_dist_partition k, pg_dist_partition m
		WHERE k.logicalrelid = $1::regclass AND m.logicalrelid = $2::regclass`,
		pgx.Identifier{tables.Schema, pglease.DefaultMessagesTable + "_keys"}.Sanitize(),
		pgx.Identifier{tables.Schema, pglease.DefaultMessagesTable}.Sanitize()).Scan(&colocated))
	assert.True(t, colocated, "the keys table is co-located with the messages")
	var classRows, dayRows int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE gen >= 72), count(*) FILTER (WHERE gen < 4)
		FROM `+keysTable(tables)).Scan(&classRows, &dayRows))
	assert.Equal(t, 2*topics/2*perTopic, classRows, "the keys of the topics with a retention of three days: two class rows each")
	assert.Equal(t, 2*topics/2*perTopic, dayRows, "the others': two day rows each")
}

// TestIdempotentPublishFromTxHandler: the messages a TxHandler returns
// carry keys too (its PublisherConfig's IdempotencyKey): an invoice
// already published by another publisher with the same key is left out
// of the handler's transaction, which still commits its effect and
// acknowledgement.
func TestIdempotentPublishFromTxHandler(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, tables))
	createEffects(t, pool, tables)
	byPayload := func(_ string, msg *message.Message) string { return "invoice of " + string(msg.Payload) }
	keyed, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: byPayload}, nil)
	require.NoError(t, err)
	defer keyed.Close()
	orders := newPublisher(t, pool, tables)
	var ids []string
	for i := range 5 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint("order ", i)))
		ids = append(ids, msg.UUID)
		require.NoError(t, orders.Publish("orders", msg))
	}
	require.NoError(t, keyed.Publish("invoices", message.NewMessage("early", []byte("order 2"))))

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: tables}, nil)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	router.AddConsumerHandler("orders", "orders", sub, pglease.TxHandler(pool,
		pglease.TxHandlerConfig{PublishTopic: "invoices", Publisher: pglease.PublisherConfig{Tables: tables, IdempotencyKey: byPayload}},
		func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if err := insertEffect(ctx, tx, tables.Schema, msg.UUID, "router"); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage("invoice-"+msg.UUID, msg.Payload)}, nil
		}))
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	waitFor(t, time.Minute, "an effect for every order", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+table(tables, effectsTable)).Scan(&n)
		return n >= len(ids)
	})
	require.NoError(t, router.Close())
	require.NoError(t, sub.Close())
	rows, distinct := storedCount(t, pool, tables, "invoices")
	assert.Equal(t, len(ids), rows, "one invoice per order: the handler's for order 2 left out")
	assert.Equal(t, len(ids), distinct)
	var early int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table(tables, pglease.DefaultMessagesTable)+
		` WHERE topic = 'invoices' AND uuid = 'early'`).Scan(&early))
	assert.Equal(t, 1, early, "the invoice published first is the one kept")
	assertNoLeakedGoroutines(t)
}

// TestMaintainerForgetsOldKeys: the maintainer's housekeeping empties the
// partition of the keys two days old (written here as a publisher whose
// transaction began yesterday writes them: for yesterday and the day
// before), and leaves today's and yesterday's: yesterday's key is still
// recognised today.
func TestMaintainerForgetsOldKeys(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true, IdempotencyKey: keyedByUUID}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("t", message.NewMessage("today", nil)))
	keys := pgx.Identifier{tables.Schema, pglease.DefaultMessagesTable + "_keys"}.Sanitize()
	slots := func() (old, recent int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE slot < d - 1), count(*) FILTER (WHERE slot >= d - 1)
			FROM `+keys+`, (SELECT floor(extract(epoch FROM now()) / 86400)::bigint AS d) x`).Scan(&old, &recent))
		return old, recent
	}
	// "old" as published by a transaction that began yesterday: its
	// rows are for yesterday and the day before.
	_, err = pool.Exec(ctx, `INSERT INTO `+keys+` (topic, key, slot, gen)
		SELECT 't', $1::uuid, s, (s % 4)::smallint FROM (SELECT floor(extract(epoch FROM now()) / 86400)::bigint AS d) x,
		LATERAL (VALUES (x.d - 2), (x.d - 1)) v(s)`, pglease.KeyDigest("old"))
	require.NoError(t, err)
	old, recent := slots()
	require.Equal(t, 1, old)
	require.Equal(t, 3, recent)

	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{ConsumerGroup: "g",
		Maintenance: pglease.MaintenanceConfig{Interval: 100 * time.Millisecond}})
	_, err = sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the keys two days old to be forgotten", func() bool {
		old, _ := slots()
		return old == 0
	})
	_, recent = slots()
	assert.Equal(t, 3, recent, "today's and yesterday's rows kept")
	res, err := pub.PublishWithResult("t", message.NewMessage("today", nil), message.NewMessage("old", nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, res.AlreadyStored, "today's key and yesterday's, through yesterday's row")
}

// TestKeyDigest: a key that is a UUID in canonical form is stored as it
// is; any other key (another spelling of a UUID included) as 16 bytes of
// its SHA-256, the same for the same key.
func TestKeyDigest(t *testing.T) {
	id := "0190a6e2-7c3b-7d2e-9f10-2b3c4d5e6f70"
	assert.Equal(t, id, pglease.KeyDigest(id))
	upper := strings.ToUpper(id)
	assert.NotEqual(t, id, pglease.KeyDigest(upper))
	assert.Len(t, pglease.KeyDigest(upper), 36)
	assert.Equal(t, pglease.KeyDigest("order-1042"), pglease.KeyDigest("order-1042"))
	assert.NotEqual(t, pglease.KeyDigest("order-1042"), pglease.KeyDigest("order-1043"))
}

// readyKeyClass makes the partitions of key class k through the owner's
// function and lets publishers use them, past the two days in which they
// write the day rows too, as the maintainer would have (tests whose
// maintainer does not run).
func readyKeyClass(t testing.TB, pool *pgxpool.Pool, tables pglease.Tables, k int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `SELECT `+pgx.Identifier{tables.Schema, pglease.PartitionName(tables, "add_key_partitions")}.Sanitize()+`($1)`, k)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+pgx.Identifier{tables.Schema, pglease.DefaultRetentionTable}.Sanitize()+
		` SET keys_since = now() - interval '3 days' WHERE retention_class = $1`, k)
	require.NoError(t, err)
}

// keysTable is the quoted name of the keys table of tables.
func keysTable(tables pglease.Tables) string {
	return pgx.Identifier{tables.Schema, pglease.DefaultMessagesTable + "_keys"}.Sanitize()
}

// TestMaintainerForgetsKeysOfTheRetention: a topic with a retention of
// three days keeps its keys in slots of its retention class (2^18 s,
// about three days), in partitions the maintainer makes (and lets
// publishers use) once the topic has that retention. Rows are written here as publishers whose
// transactions began one and two slots before wrote them (the clock is
// the database's: rows of past slots stand for time gone by); the
// maintainer's housekeeping empties the class's partition of the slot
// two slots old and leaves the slot before's: its key is still
// recognised, three days or more after it was published.
func TestMaintainerForgetsKeysOfTheRetention(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{Retention: 72 * time.Hour, Tables: tables, InitializeSchema: true}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
	require.NoError(t, err)
	defer pub.Close()
	const class, width = 19, 1 << 18
	keys := keysTable(tables)
	retention := pgx.Identifier{tables.Schema, pglease.DefaultRetentionTable}.Sanitize()
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{ConsumerGroup: "g",
		Maintenance: pglease.MaintenanceConfig{Interval: 100 * time.Millisecond}})
	_, err = sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the maintainer to make the key class's partitions usable", func() bool {
		var ready bool
		_ = pool.QueryRow(ctx, `SELECT keys_since IS NOT NULL FROM `+retention+` WHERE retention_class = $1`, class).Scan(&ready)
		return ready
	})
	require.NoError(t, pub.Publish("t", message.NewMessage("now", nil)))
	slots := func() (twoBefore, recent int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE slot = s - 2), count(*) FILTER (WHERE slot >= s - 1)
			FROM `+keys+`, (SELECT floor(extract(epoch FROM now()) / $1)::bigint AS s) x WHERE gen BETWEEN $2 AND $2 + 3`,
			width, 4*class).Scan(&twoBefore, &recent))
		return twoBefore, recent
	}
	for _, k := range []struct {
		key  string
		back int // the slot the publisher's transaction began in, before now's
	}{{"slot before", 1}, {"two slots before", 2}} {
		tag, err := pool.Exec(ctx, `INSERT INTO `+keys+` (topic, key, slot, gen)
			SELECT 't', $1::uuid, s, ($3 * 4 + s % 4)::smallint FROM (SELECT floor(extract(epoch FROM now()) / $2)::bigint - $4 AS d) x,
			LATERAL (VALUES (x.d - 1), (x.d)) v(s)`, pglease.KeyDigest(k.key), width, class, k.back)
		require.NoError(t, err)
		require.EqualValues(t, 2, tag.RowsAffected())
	}
	_, recent := slots()
	require.Equal(t, 3, recent, "now's key's two class rows and the slot before's")
	waitFor(t, 20*time.Second, "the class's keys two slots old to be forgotten", func() bool {
		twoBefore, _ := slots()
		return twoBefore == 0
	})
	_, recent = slots()
	assert.Equal(t, 3, recent, "now's rows and the slot before's kept")
	res, err := pub.PublishWithResult("t", message.NewMessage("now", nil), message.NewMessage("slot before", nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, res.AlreadyStored, "now's key and the slot before's, through that slot's row")
}

// TestKeysMigrationUnderTraffic: schema version 21 applied while
// publishers of the release before publish keys (their statement writes
// the day rows: here the keys part of it, on a topic with a retention of
// three days and one without), and while a transaction holds the keys
// table open from before. No publish fails; then the maintainer makes
// the long topic's key class usable; every key stored before the
// migration or during it is recognised by this release's Publisher, and
// this release's keys are recognised by a publisher of the release
// before (the day rows, written for two days after the class became
// usable).
func TestKeysMigrationUnderTraffic(t *testing.T) {
	// Parallel although it holds a transaction open while it waits: a read
	// committed one that has only read, which keeps no snapshot between its
	// statements and so does not hold the xmin horizon back.
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 12)
	tables := newSchema(t, pool)
	require.NoError(t, migrateTo(ctx, pool, tables, 20))
	// The topic as a release of schema version 20 creates it (this
	// release's CreateTopic names version 22's columns).
	_, err := pool.Exec(ctx, `WITH l AS (INSERT INTO `+pgx.Identifier{tables.Schema, pglease.DefaultRetentionTable}.Sanitize()+` (retention_class) VALUES (19))
		INSERT INTO `+pgx.Identifier{tables.Schema, pglease.DefaultTopicsTable}.Sanitize()+` (topic, partitions, retention, retention_class, classes_from, classes_to)
		VALUES ('long', 1, interval '72 hours', 19, 19, 19)`)
	require.NoError(t, err)
	keys := keysTable(tables)
	// What a publisher of schema versions 15 to 20 writes for a key:
	// the day its transaction began and the day before; the key is new
	// when both rows were.
	oldPublish := func(topic, key string) (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `WITH k AS (INSERT INTO `+keys+` (topic, key, slot, gen)
			SELECT $1, $2::uuid, v.s, (v.s % 4)::smallint FROM (SELECT floor(extract(epoch FROM now()) / 86400)::bigint AS d) x,
			LATERAL (VALUES (x.d - 1), (x.d)) v(s) ORDER BY v.s ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) FROM k`,
			topic, pglease.KeyDigest(key)).Scan(&n)
		return n == 2, err
	}
	topics := []string{"long", "short"}
	var before []string
	for i := range 50 {
		key := fmt.Sprint("before-", i)
		fresh, err := oldPublish(topics[i%2], key)
		require.NoError(t, err)
		require.True(t, fresh)
		before = append(before, key)
	}
	// A transaction of the release before that has the keys table open.
	held, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(ctx) }()
	_, err = held.Exec(ctx, `SELECT count(*) FROM `+keys)
	require.NoError(t, err)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	during := map[string]string{} // key: topic
	var published atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				topic, key := topics[(w+i)%2], fmt.Sprint("during-", w, "-", i)
				fresh, err := oldPublish(topic, key)
				if !assert.NoError(t, err) || !assert.True(t, fresh, key) {
					return
				}
				// And again: the key is known.
				again, err := oldPublish(topic, key)
				if !assert.NoError(t, err) || !assert.False(t, again, key) {
					return
				}
				mu.Lock()
				during[key] = topic
				mu.Unlock()
				published.Add(1)
			}
		}()
	}
	waitFor(t, 10*time.Second, "publishes before the migration", func() bool { return published.Load() >= 20 })
	start := published.Load()
	require.NoError(t, pglease.Migrate(ctx, pool, tables))
	waitFor(t, 10*time.Second, "publishes after the migration", func() bool { return published.Load() >= start+20 })
	close(stop)
	wg.Wait()
	require.NoError(t, held.Commit(ctx))
	t.Logf("%d keys published by the release before during the migration", published.Load())
	// The maintainer makes the long topic's key class usable.
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{ConsumerGroup: "g",
		Maintenance: pglease.MaintenanceConfig{Interval: 100 * time.Millisecond}})
	_, err = sub.Subscribe(ctx, "long")
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the key class of the long topic to be usable", func() bool {
		var ready bool
		_ = pool.QueryRow(ctx, `SELECT keys_since IS NOT NULL FROM `+pgx.Identifier{tables.Schema, pglease.DefaultRetentionTable}.Sanitize()+
			` WHERE retention_class = 19`).Scan(&ready)
		return ready
	})

	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for i, key := range before {
		res, err := pub.PublishWithResult(topics[i%2], message.NewMessage(key, nil))
		require.NoError(t, err)
		assert.Equal(t, []int{0}, res.AlreadyStored, "a key stored before the migration: %s", key)
	}
	for key, topic := range during {
		res, err := pub.PublishWithResult(topic, message.NewMessage(key, nil))
		require.NoError(t, err)
		assert.Equal(t, []int{0}, res.AlreadyStored, "a key stored during the migration: %s", key)
	}
	// This release's keys, met by a publisher of the release before.
	for _, topic := range topics {
		key := "after-" + topic
		require.NoError(t, pub.Publish(topic, message.NewMessage(key, nil)))
		fresh, err := oldPublish(topic, key)
		require.NoError(t, err)
		assert.False(t, fresh, "a key of this release, published again by the release before, on %s", topic)
	}
	var classRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+keys+` WHERE topic = 'long' AND gen >= 72`).Scan(&classRows))
	assert.Positive(t, classRows, "the long topic's keys are in its class's partitions too")
}

// TestTopicKeyWindow: TopicConfig.KeyWindow gives a topic kept forever a
// key window of its own (3 days: class 19): the maintainer makes the
// class's partitions usable, the topic's keys take its rows, and a retry
// is recognised. A window out of bounds is refused and stores nothing.
func TestTopicKeyWindow(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	for _, w := range []time.Duration{-time.Hour, time.Millisecond, pglease.MaxRetention + time.Hour} {
		err := pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{KeyWindow: w, Tables: tables, InitializeSchema: true})
		require.ErrorIs(t, err, pglease.ErrInvalidConfig, "KeyWindow %s", w)
	}
	require.NoError(t, pglease.CreateTopic(ctx, pool, "t", pglease.TopicConfig{KeyWindow: 72 * time.Hour, Tables: tables, InitializeSchema: true}))
	const class = 19
	keys := keysTable(tables)
	retention := pgx.Identifier{tables.Schema, pglease.DefaultRetentionTable}.Sanitize()
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{ConsumerGroup: "g",
		Maintenance: pglease.MaintenanceConfig{Interval: 100 * time.Millisecond}})
	_, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the maintainer to make the window's key class usable", func() bool {
		var ready bool
		_ = pool.QueryRow(ctx, `SELECT keys_since IS NOT NULL FROM `+retention+` WHERE retention_class = $1`, class).Scan(&ready)
		return ready
	})
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, IdempotencyKey: keyedByUUID}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("t", message.NewMessage("k", nil)))
	var classRows, dayRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE gen BETWEEN $1 AND $1 + 3), count(*) FILTER (WHERE gen < 4)
		FROM `+keys+` WHERE topic = 't'`, 4*class).Scan(&classRows, &dayRows))
	assert.Equal(t, 2, classRows, "the key's rows of the window's class")
	assert.Equal(t, 2, dayRows, "and its day rows, for two days after the class became usable")
	res, err := pub.PublishWithResult("t", message.NewMessage("k", nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0}, res.AlreadyStored)
}
