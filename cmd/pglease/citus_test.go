package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// TestCitusMigrateAndStatus: on the coordinator of a Citus cluster (`make
// test-citus`), pglease migrate --citus creates the tables and
// distributes them (again: nothing left to do), and pglease status names
// the worker whose horizon a transaction held open there holds back.
func TestCitusMigrateAndStatus(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, testDSN, 0)
	env := map[string]string{"DATABASE_URL": testDSN}
	schema := emptySchema(t, pool)
	for range 2 {
		r := runCLI(t, env, "migrate", "--schema", schema, "--citus", "--json")
		require.Equal(t, 0, r.code, "%s", r)
		var out migrateOutput
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		require.True(t, out.Citus)
	}
	messages := pgx.Identifier{schema, pglease.DefaultMessagesTable}.Sanitize()
	var distributed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_partition
WHERE logicalrelid IN ($1::text::regclass, $2::text::regclass)`,
		messages, pgx.Identifier{schema, pglease.DefaultConsumerOffsetsTable}.Sanitize()).Scan(&distributed))
	require.Equal(t, 2, distributed)

	// A transaction that wrote a message, held open: its worker's
	// horizon is held back.
	var port int
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.nodeport FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::text::regclass, 'held'::text)`, messages).Scan(&port))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+messages+` (topic, uuid) VALUES ('held', 'x')`)
	require.NoError(t, err)
	// Other tests' transactions may be older: wait until this one is
	// the oldest holder on some worker, and it must be its own.
	var out statusOutput
	pgtest.WaitFor(t, 30*time.Second, "status naming the held worker", func() bool {
		r := runCLI(t, env, "status", "--schema", schema, "--json")
		require.Equal(t, 0, r.code, "%s", r)
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		return out.Horizon.Holder != nil && strings.HasSuffix(out.Horizon.Node, ":"+itoa(port))
	})
	require.Len(t, out.Horizon.Workers, 2)
	r := runCLI(t, env, "status", "--schema", schema)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "worker")
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestCitusMoveShard: pglease move-shard --dry-run prints the counter's
// raise and the move and moves nothing; without it the topic's shard
// lands on the target, whose counter then lies at least the margin above
// every worker's counter read before; run again, there is nothing to
// move.
func TestCitusMoveShard(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, testDSN, 0)
	env := map[string]string{"DATABASE_URL": testDSN}
	schema := emptySchema(t, pool)
	r := runCLI(t, env, "migrate", "--schema", schema, "--citus")
	require.Equal(t, 0, r.code, "%s", r)
	messages := pgx.Identifier{schema, pglease.DefaultMessagesTable}.Sanitize()
	placement := func() (host string, port int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::text::regclass, 'orders'::text)`, messages).Scan(&host, &port))
		return host, port
	}
	host, source := placement()
	var target int
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodeport FROM pg_catalog.pg_dist_node
WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, source).Scan(&target))
	to := host + ":" + strconv.Itoa(target)

	r = runCLI(t, env, "move-shard", "--schema", schema, "--topic", "orders", "--to", to, "--dry-run")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "citus_move_shard_placement(")
	require.Contains(t, r.stdout, "master_run_on_worker")
	_, port := placement()
	require.Equal(t, source, port, "--dry-run moves nothing")

	var highest uint64
	rows, err := pool.Query(ctx, `SELECT result::bigint FROM pg_catalog.run_command_on_workers(
		'SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())')`)
	require.NoError(t, err)
	for rows.Next() {
		var c uint64
		require.NoError(t, rows.Scan(&c))
		highest = max(highest, c)
	}
	require.NoError(t, rows.Err())
	const margin = 50000
	r = runCLI(t, env, "move-shard", "--schema", schema, "--topic", "orders", "--to", to, "--margin", strconv.Itoa(margin), "--json")
	require.Equal(t, 0, r.code, "%s", r)
	var out moveShardOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.True(t, out.Moved)
	_, port = placement()
	require.Equal(t, target, port, "the shard is on the target")
	var counter uint64
	require.NoError(t, pool.QueryRow(ctx, `SELECT result::bigint FROM pg_catalog.run_command_on_workers(
		'SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())') WHERE nodeport = $1`, target).Scan(&counter))
	require.GreaterOrEqual(t, counter, highest+margin, "the target's counter was raised first")

	r = runCLI(t, env, "move-shard", "--schema", schema, "--topic", "orders", "--to", to)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "nothing to move")
}

// TestCitusUIPagesRender: the console on a Citus cluster: the overview
// shows a group with its lag (counted on the topic's worker), the group's
// page its partition, the topic page its messages, the message page its
// payload.
func TestCitusUIPagesRender(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	pool := pgtest.NewPool(t, testDSN, 0)
	schema := emptySchema(t, pool)
	r := runCLI(t, map[string]string{"DATABASE_URL": testDSN}, "migrate", "--schema", schema, "--citus")
	require.Equal(t, 0, r.code, "%s", r)
	adapter := pglease.Tables{Schema: schema}
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	f := &fixture{t: t, pool: pool, schema: schema, adapter: adapter, pub: pub}
	ids := f.publish("orders", 3)
	_, msgs := f.subscribe("billing", "orders")
	select { // not acked: lag 3
	case <-msgs:
	case <-time.After(30 * time.Second):
		t.Fatal("no message")
	}
	ts, srv, _ := newUITest(t, f, false)
	require.NoError(t, srv.sampler.sample(context.Background()))
	b := newBrowser(t, ts.URL)

	code, body := b.get("/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `href="/group?name=billing"`)
	require.Regexp(t, `class="n lag">3<`, body)
	code, body = b.get("/group?name=billing")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<td class="n">0</td>`)
	code, body = b.get("/topic?name=orders")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, ids[2])
	code, body = b.get("/message?topic=orders&uuid=" + ids[0])
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, ids[0])
}
