package pglease_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// citusOwnedSchema is ownedSchema on the Citus cluster of `make test-citus`:
// a schema of a new owner role, migrated and distributed by that owner
// (DistributeSQL, as `pglease migrate --citus`), and a pool logged in as
// the owner; before the distribution the owner runs before (grants given
// before `pglease migrate --citus`). Citus propagates the role and the
// schema to the workers.
func citusOwnedSchema(t *testing.T, pool *pgxpool.Pool, before func(owner *pgxpool.Pool, adapter pglease.Tables)) (pglease.Tables, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adapter := newSchema(t, pool)
	owner := newRole(t, pool, "pglease_owner")
	ident := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	execAll(t, pool, "CREATE SCHEMA "+ident(adapter.Schema)+" AUTHORIZATION "+ident(owner))
	ownerPool := poolAs(t, owner, 2)
	require.NoError(t, pglease.Migrate(ctx, ownerPool, adapter))
	before(ownerPool, adapter)
	_, err := ownerPool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err, "distributed by the owner")
	return adapter, ownerPool
}

// identityPrivileges returns, for role on the node of db, the privileges
// it holds on the sequences of the identity columns of the messages and
// delayed tables (the node's own copies): "USAGE" for each that it may
// take values from, "+SELECT" or "+UPDATE" for more.
func identityPrivileges(t *testing.T, db *pgxpool.Pool, adapter pglease.Tables, role string) []string {
	t.Helper()
	var out []string
	for _, col := range [][2]string{{pglease.DefaultMessagesTable, "offset"}, {pglease.DefaultDelayedTable, "id"}} {
		var seq string
		var usage, sel, upd bool
		require.NoError(t, db.QueryRow(context.Background(), `SELECT s, has_sequence_privilege($1, s, 'USAGE'),
			has_sequence_privilege($1, s, 'SELECT'), has_sequence_privilege($1, s, 'UPDATE')
			FROM pg_get_serial_sequence($2, $3) s`,
			role, pgx.Identifier{adapter.Schema, col[0]}.Sanitize(), col[1]).Scan(&seq, &usage, &sel, &upd))
		p := col[0] + "." + col[1] + ":"
		if usage {
			p += " USAGE"
		}
		if sel {
			p += " +SELECT"
		}
		if upd {
			p += " +UPDATE"
		}
		out = append(out, p)
	}
	return out
}

// TestCitusLeastPrivilegeRoles is TestLeastPrivilegeRole and
// TestPublisherOnlyRole on Citus: the tables owned, migrated and
// distributed by an owner role, each application role given only the
// grants of GrantSQL or GrantPublisherSQL, run by the owner before the
// distribution (carried by DistributeSQL) or after it. Each role gets
// USAGE on the identity columns' sequences, and nothing more on them, on
// the coordinator and on every worker (the workers' copies of a role
// granted before the distribution once DistributeSQL runs again), which
// an INSERT ... SELECT that Citus evaluates on the coordinator needs: it
// takes the offset with nextval() ("permission denied for sequence
// pglease_messages_offset_seq1" without; pglease's statement of one
// topic had that shape until the Citus insert was rewritten). The roles of
// GrantSQL publish to topics on both workers (one topic per statement,
// several in one, delayed), subscribe and acknowledge, create topics,
// reset offsets and, elected maintainer, move the due messages, with
// nothing logged at Error; they cannot drop, alter or truncate the
// tables. The publisher's role publishes (keys and delays too) and
// cannot read messages, touch offsets or sessions, create topics or
// consume.
func TestCitusLeastPrivilegeRoles(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := newPool(t, 4)
	early := newRole(t, pool, "pglease_early")
	adapter, ownerPool := citusOwnedSchema(t, pool, func(owner *pgxpool.Pool, adapter pglease.Tables) {
		execAll(t, owner, pglease.GrantSQL(adapter, early))
		assert.Equal(t, []string{"pglease_messages.offset:", "pglease_delayed.id:"}, identityPrivileges(t, pool, adapter, early),
			"before the distribution, nothing on the sequences, as on a single server")
	})
	app := newRole(t, pool, "pglease_app")
	publisher := newRole(t, pool, "pglease_publisher")
	execAll(t, ownerPool, pglease.GrantSQL(adapter, app), pglease.GrantPublisherSQL(adapter, publisher))
	// Run again: the grants hold and nothing fails.
	execAll(t, ownerPool, pglease.GrantSQL(adapter, app), pglease.GrantPublisherSQL(adapter, publisher))

	var workers []*pgxpool.Pool
	for _, dsn := range strings.Fields(os.Getenv("PGLEASE_TEST_CITUS_WORKERS")) {
		workers = append(workers, newPoolOn(t, dsn, 1))
	}
	require.Len(t, workers, 2)
	usage := []string{"pglease_messages.offset: USAGE", "pglease_delayed.id: USAGE"}
	for _, role := range []string{app, publisher, early} {
		assert.Equal(t, usage, identityPrivileges(t, pool, adapter, role), "%s on the coordinator", role)
	}
	for i, w := range workers {
		for _, role := range []string{app, publisher} {
			assert.Equal(t, usage, identityPrivileges(t, w, adapter, role), "%s on worker %d", role, i)
		}
		assert.Equal(t, []string{"pglease_messages.offset:", "pglease_delayed.id:"}, identityPrivileges(t, w, adapter, early),
			"the workers' copies of a role granted before the first distribution: not yet (worker %d)", i)
	}
	// The maintainer's functions exist on every node, their EXECUTE
	// carried there by Citus: GrantSQL's roles only.
	expire := pgx.Identifier{adapter.Schema, pglease.DefaultMessagesTable + "_expire_retention_partition"}.Sanitize() + "(integer, bigint)"
	for i, node := range append([]*pgxpool.Pool{pool}, workers...) {
		for role, may := range map[string]bool{app: true, early: true, publisher: false} {
			var ok bool
			require.NoError(t, node.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, role, expire).Scan(&ok))
			assert.Equal(t, may, ok, "EXECUTE of %s on node %d", role, i)
		}
	}
	_, err := ownerPool.Exec(ctx, pglease.DistributeSQL(adapter))
	require.NoError(t, err, "distributed again")
	for i, w := range workers {
		assert.Equal(t, usage, identityPrivileges(t, w, adapter, early), "run again, DistributeSQL carries them to worker %d", i)
	}

	qualified := func(name string) string { return pgx.Identifier{adapter.Schema, name}.Sanitize() }
	messages := qualified(pglease.DefaultMessagesTable)
	refused := func(db *pgxpool.Pool, stmts ...string) {
		t.Helper()
		for _, stmt := range stmts {
			_, err := db.Exec(ctx, stmt)
			var pgErr *pgconn.PgError
			if assert.ErrorAs(t, err, &pgErr, stmt) {
				assert.Equal(t, "42501", pgErr.Code, "%s: %v", stmt, err)
			}
		}
	}

	appPool := poolAs(t, app, 10)
	earlyPool := poolAs(t, early, 2)
	refused(appPool,
		"DROP TABLE "+messages,
		"ALTER TABLE "+qualified(pglease.DefaultConsumerSessionsTable)+" ADD COLUMN x integer",
		"TRUNCATE "+qualified(pglease.DefaultConsumerOffsetsTable),
		"CREATE TABLE "+qualified("x")+" (i integer)",
	)
	require.NoError(t, pglease.CreateTopic(ctx, appPool, "keyed", pglease.TopicConfig{Partitions: 2, Tables: adapter}))

	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(appPool, pglease.SubscriberConfig{Tables: adapter, ConsumerGroup: "g",
		PollInterval: 20 * time.Millisecond, SessionTTL: 2 * time.Second}, logger)
	require.NoError(t, err)
	defer sub.Close()
	topics := append(numberedTopics("p", 0, 8), "keyed") // over both workers
	received := map[string]<-chan *message.Message{}
	for _, topic := range topics {
		received[topic], err = sub.Subscribe(ctx, topic)
		require.NoError(t, err)
	}
	waitFor(t, 10*time.Second, "the application role to be elected maintainer", func() bool { return sub.Stats().Maintainer })

	appPub, err := pglease.NewPublisher(appPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer appPub.Close()
	pubPool := poolAs(t, publisher, 4)
	pubPub, err := pglease.NewPublisher(pubPool, pglease.PublisherConfig{Tables: adapter, AutoInitializeSchema: true,
		IdempotencyKey: func(_ string, msg *message.Message) string { return msg.UUID }}, nil)
	require.NoError(t, err)
	defer pubPub.Close()

	want := map[string][]string{}
	for _, topic := range topics {
		want[topic] = append(want[topic], publishN(t, appPub, topic, 2)...)
		want[topic] = append(want[topic], publishN(t, pubPub, topic, 2)...)
	}
	// Concurrent calls to several topics (the group commit writes them in
	// one statement), from both roles.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, p := range []*pglease.Publisher{appPub, pubPub} {
		for _, topic := range topics {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := message.NewMessage(watermill.NewUUID(), []byte("c"))
				if assert.NoError(t, p.Publish(topic, msg), topic) {
					mu.Lock()
					want[topic] = append(want[topic], msg.UUID)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, p := range []*pglease.Publisher{appPub, pubPub} {
		delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
		delay.Message(delayed, delay.For(500*time.Millisecond))
		require.NoError(t, p.Publish(topics[1], delayed))
		want[topics[1]] = append(want[topics[1]], delayed.UUID)
	}
	earlyPub, err := pglease.NewPublisher(earlyPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer earlyPub.Close()
	want[topics[6]] = append(want[topics[6]], publishN(t, earlyPub, topics[6], 2)...)
	res, err := pubPub.PublishWithResult(topics[2], message.NewMessage(want[topics[2]][2], nil))
	require.NoError(t, err)
	assert.Equal(t, []int{0}, res.AlreadyStored, "the publisher's role writes and reads its keys")

	// The statements without a notification (one topic, several), as
	// the internal driver runs them: the shape that Citus evaluates on
	// the coordinator.
	d := driverOf(adapter)
	for _, p := range []*pgxpool.Pool{appPool, pubPool, earlyPool} {
		for _, topics := range [][]string{{topics[3]}, {topics[4], topics[5]}} {
			params := pgsql.InsertMessagesParams{Topics: topics, Payloads: make([][]byte, len(topics)), Metadata: make([]string, len(topics))}
			for _, topic := range topics {
				params.UUIDs = append(params.UUIDs, watermill.NewUUID())
				want[topic] = append(want[topic], params.UUIDs[len(params.UUIDs)-1])
			}
			require.NoError(t, d.InsertMessages(ctx, p, params), "%v", topics)
		}
	}

	// An INSERT ... SELECT that Citus evaluates on the coordinator (a
	// common table expression before the INSERT, as the statement of one
	// topic was before the Citus insert was rewritten), which takes the
	// offset with nextval(): refused without USAGE on its sequence.
	for _, p := range []*pgxpool.Pool{appPool, pubPool, earlyPool} {
		id := watermill.NewUUID()
		_, err := p.Exec(ctx, `WITH p AS (SELECT tp.partitions, k.ck
	FROM (SELECT 1) one LEFT JOIN `+qualified(pglease.DefaultTopicsTable)+` tp ON tp.topic = $1::text
	CROSS JOIN (SELECT pg_catalog.clock_timestamp() AS ck) k)
INSERT INTO `+messages+` (topic, uuid, payload)
SELECT $1::text, m.uuid, NULL FROM p, unnest(ARRAY[$2::text]) WITH ORDINALITY AS m(uuid, n) ORDER BY m.n`, topics[7], id)
		require.NoError(t, err, "an INSERT ... SELECT evaluated on the coordinator")
		want[topics[7]] = append(want[topics[7]], id)
	}

	var onWorkers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(DISTINCT s.nodeport)
		FROM `+messages+` m JOIN pg_catalog.pg_dist_shard_placement s
			ON s.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, m.topic)`, messages).Scan(&onWorkers))
	require.Equal(t, 2, onWorkers, "the topics lie on both workers")

	for _, topic := range topics {
		assert.ElementsMatch(t, want[topic], uuids(receive(t, received[topic], len(want[topic]), 30*time.Second)), topic)
	}
	var moved int
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_catalog.count(*) FROM "+qualified(pglease.DefaultDelayedTable)).Scan(&moved))
	assert.Zero(t, moved, "the maintainer moved the delayed messages")

	insp, err := admin.NewInspector(appPool, adapter)
	require.NoError(t, err)
	resets, err := insp.ResetOffsets(ctx, admin.ResetOffsetsParams{ConsumerGroup: "other", Topic: "keyed", To: admin.ResetToLatest})
	require.NoError(t, err)
	assert.Len(t, resets, 2, "both partitions of the topic reset")

	// The open publishers (pglease status), read by the application
	// role: a transaction of its own that published to topics on both
	// workers is listed on each, with its session on the coordinator.
	tx, err := appPool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	for _, topic := range topics {
		require.NoError(t, outbox.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)))
	}
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid))
	h, err := insp.Horizon(ctx)
	require.NoError(t, err, "the application role reads every worker's open publishers")
	assert.True(t, h.PerTopic)
	heldOn, held := map[string]bool{}, map[string]bool{}
	for _, p := range h.Publishers {
		if p.Client != nil && p.Client.PID == pid {
			heldOn[p.Node] = true
			for _, tp := range p.Partitions {
				held[tp.Topic] = true
			}
		}
	}
	assert.Len(t, heldOn, 2, "listed on both workers: %+v", h.Publishers)
	for _, topic := range topics {
		assert.True(t, held[topic], "%s held by the open transaction: %+v", topic, h.Publishers)
	}
	require.NoError(t, tx.Rollback(ctx))

	// The publisher's role: nothing of consumers.
	refused(pubPool,
		"SELECT * FROM "+messages,
		"UPDATE "+qualified(pglease.DefaultConsumerOffsetsTable)+" SET acked_offset = 0",
		"DELETE FROM "+qualified(pglease.DefaultConsumerOffsetsTable),
		"DELETE FROM "+qualified(pglease.DefaultConsumerSessionsTable),
		"INSERT INTO "+qualified(pglease.DefaultTopicsTable)+" (topic, partitions) VALUES ('x', 2)",
	)
	pubSub, err := pglease.NewSubscriber(pubPool, pglease.SubscriberConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	_, err = pubSub.Subscribe(ctx, "p0")
	require.Error(t, err, "the publisher's role cannot consume")
	require.NoError(t, pubSub.Close())

	require.NoError(t, earlyPub.Close())
	require.NoError(t, appPub.Close())
	require.NoError(t, pubPub.Close())
	require.NoError(t, sub.Close())
	assert.Empty(t, errorsLogged(logger), "nothing logged at Error level")
}
