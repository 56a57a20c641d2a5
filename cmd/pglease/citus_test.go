package main

import (
	"context"
	"encoding/json"
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

// TestCitusRebalance: with a worker marked to hold no shards, pglease
// rebalance moves every shard of the messages table's co-location group
// off it, each target's counter raised first; marked again to hold
// shards, it moves some back; then the plan is empty.
func TestCitusRebalance(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, testDSN, 0)
	env := map[string]string{"DATABASE_URL": testDSN}
	schema := emptySchema(t, pool)
	r := runCLI(t, env, "migrate", "--schema", schema, "--citus")
	require.Equal(t, 0, r.code, "%s", r)
	messages := pgx.Identifier{schema, pglease.DefaultMessagesTable}.Sanitize()
	var host string
	var drained int
	require.NoError(t, pool.QueryRow(ctx, `SELECT nodename, nodeport FROM pg_catalog.pg_dist_node
WHERE groupid > 0 AND noderole = 'primary' ORDER BY nodeport LIMIT 1`).Scan(&host, &drained))
	shardsOn := func(port int) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_shard_placement p
JOIN pg_catalog.pg_dist_shard s ON s.shardid = p.shardid
WHERE s.logicalrelid = $1::text::regclass AND p.nodeport = $2`, messages, port).Scan(&n))
		return n
	}
	require.Positive(t, shardsOn(drained))
	setShards := func(on bool) {
		_, err := pool.Exec(context.Background(), `SELECT pg_catalog.citus_set_node_property($1, $2, 'shouldhaveshards', $3)`, host, drained, on)
		require.NoError(t, err)
	}
	setShards(false)
	t.Cleanup(func() { // leave the cluster balanced for the other tests
		setShards(true)
		runCLI(t, env, "rebalance", "--schema", schema, "--margin", "10000")
	})

	r = runCLI(t, env, "rebalance", "--schema", schema, "--dry-run")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "Would move shard")
	require.Positive(t, shardsOn(drained), "--dry-run moves nothing")

	r = runCLI(t, env, "rebalance", "--schema", schema, "--margin", "10000", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	var out rebalanceOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.NotEmpty(t, out.Moves)
	require.Zero(t, shardsOn(drained), "every shard moved off the drained worker")

	setShards(true)
	r = runCLI(t, env, "rebalance", "--schema", schema, "--margin", "10000", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.NotEmpty(t, out.Moves)
	require.Positive(t, shardsOn(drained), "shards moved back")
	r = runCLI(t, env, "rebalance", "--schema", schema)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "nothing to move")
}
