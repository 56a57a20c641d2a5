package pgsql

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The Inspector's statements where the tables are distributed by Citus
// (see citus.go). A position is a worker's transaction id: the lag of a
// topic is counted against its worker's snapshot, by a statement routed
// to that worker whole, and the horizon that holds a topic back is its
// worker's, read on every worker.

// citusLagTopics is the statement that lists the topics of the offset
// rows that InspectLag selects (a multi-shard SELECT).
func (d citus) citusLagTopics(groups, topics []string) Stmt {
	return Stmt{
		SQL: `SELECT DISTINCT o.topic FROM ` + d.t.Offsets + ` o
WHERE ($1::text[] IS NULL OR o.consumer_group = ANY($1)) AND ($2::text[] IS NULL OR o.topic = ANY($2))
ORDER BY 1`,
		Args: []any{groups, topics},
	}
}

// citusInspectLag is InspectLag for one topic: every distributed table
// filtered on it, so that Citus routes it to the topic's worker whole,
// where the position bound (and now(), which the owner's liveness is
// judged by) is the worker's. The bound is read within the statement,
// after its snapshot: a message committed in between is in neither
// count, which a report can afford.
func (d citus) citusInspectLag(groups []string, topic string) Stmt {
	t := d.t
	return Stmt{
		SQL: `SELECT o.consumer_group, o.topic, o.partition, o.session_id,
	CASE WHEN s.expires_at > pg_catalog.now() THEN s.owner END, o.epoch, o.acked_transaction_id::text, o.acked_offset,
	l.lag, extract(epoch FROM pg_catalog.now() - l.oldest)::float8,
	EXISTS (SELECT 1 FROM ` + t.Messages + ` m
		WHERE m.topic = $2 AND m.partition = o.partition AND m.transaction_id >= x.xmin)
FROM ` + t.Offsets + ` o
CROSS JOIN LATERAL (SELECT (` + t.WorkerBoundFunction() + `($2::text, ARRAY[o.partition]))[1]::text::xid8 AS xmin) x
LEFT JOIN ` + t.Sessions + ` s ON s.id = o.session_id
CROSS JOIN LATERAL (
	SELECT pg_catalog.count(*) AS lag, pg_catalog.min(m.created_at) AS oldest FROM ` + t.Messages + ` m
	WHERE m.topic = $2 AND m.partition = o.partition
		AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)
		AND m.transaction_id < x.xmin
) l
WHERE ($1::text[] IS NULL OR o.consumer_group = ANY($1)) AND o.topic = $2
ORDER BY o.consumer_group, o.topic, o.partition`,
		Args: []any{groups, topic},
	}
}

// InspectLag is [Driver.InspectLag] on Citus: citusInspectLag topic by topic: one statement per
// topic with offset rows, ordered as InspectLag orders its rows.
func (d citus) InspectLag(ctx context.Context, q Querier, groups, topics []string) ([]LagRow, error) {
	names, err := collect(ctx, q, d.citusLagTopics(groups, topics), pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var out []LagRow
	for _, topic := range names {
		rows, err := collect(ctx, q, d.citusInspectLag(groups, topic), scanLagRow)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	slices.SortStableFunc(out, func(a, b LagRow) int {
		if c := strings.Compare(a.ConsumerGroup, b.ConsumerGroup); c != 0 {
			return c
		}
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return out, nil
}

// citusShardTopics is the command citusInspectTopics runs on every shard
// of the messages table (run_command_on_shards puts the shard's name for
// %1$s): the shard's topics, found by skipping through its primary key, one
// probe per (topic, partition), each with the storage time of its newest
// message, as one JSON array ([[topic, newest], ...]).
func citusShardTopics() string {
	return `SELECT COALESCE(pg_catalog.json_agg(pg_catalog.json_build_array(x.topic, x.newest))::text, '[]') FROM (
	WITH RECURSIVE mt AS (
		(SELECT m.topic, m.partition FROM %1$s m ORDER BY m.topic, m.partition LIMIT 1)
		UNION ALL
		SELECT n.topic, n.partition FROM mt, LATERAL (SELECT m.topic, m.partition FROM %1$s m
			WHERE (m.topic, m.partition) > (mt.topic, mt.partition) ORDER BY m.topic, m.partition LIMIT 1) n
	)
	SELECT mt.topic, pg_catalog.max(l.created_at) AS newest
	FROM mt, LATERAL (SELECT m.created_at FROM %1$s m WHERE m.topic = mt.topic AND m.partition = mt.partition
		ORDER BY m.transaction_id DESC, m."offset" DESC LIMIT 1) l
	GROUP BY mt.topic
) x`
}

// citusInspectTopics is InspectTopics, the topics with messages and
// their newest message given as parameters ($1, $2: read on the shards).
func (d citus) citusInspectTopics(schema int, topics []string, newest []time.Time) Stmt {
	return Stmt{SQL: d.citusInspectTopicsSQL(schema, false), Args: []any{topics, newest}}
}

// citusInspectTopicsPage is InspectTopicsPage on Citus.
func (d citus) citusInspectTopicsPage(p TopicsPageParams, topics []string, newest []time.Time) Stmt {
	return Stmt{SQL: d.citusInspectTopicsSQL(p.Schema, true), Args: []any{topics, newest, p.First, p.After, p.Limit}}
}

func (d citus) citusInspectTopicsSQL(schema int, page bool) string {
	t := d.t
	keyColumns, keyJoin := t.topicKeyColumns(schema, "t")
	from, total, pageCTE := "names", "", ""
	if page {
		from, total = "page", `,
	(SELECT pg_catalog.count(*) FROM names)`
		pageCTE = `, page AS (
	SELECT topic FROM names WHERE $3::boolean OR topic > $4::text ORDER BY topic LIMIT $5
)`
	}
	return `WITH mt AS (
	SELECT x.topic COLLATE "C" AS topic, x.newest FROM unnest($1::text[], $2::timestamptz[]) AS x(topic, newest)
), names AS (
	SELECT topic FROM mt
	UNION SELECT topic FROM ` + t.Topics + `
	UNION SELECT topic COLLATE "C" FROM ` + t.Offsets + `
), groups AS (
	SELECT topic COLLATE "C" AS topic, pg_catalog.count(DISTINCT consumer_group) AS n FROM ` + t.Offsets + ` GROUP BY topic
)` + pageCTE + `
SELECT n.topic, COALESCE(t.partitions, 1), COALESCE(g.n, 0), mt.newest,
	COALESCE(pg_catalog.floor(extract(epoch FROM t.retention) * 1000000::numeric)::bigint, 0),
	` + keyColumns + total + `
FROM ` + from + ` n
LEFT JOIN ` + t.Topics + ` t ON t.topic = n.topic` + keyJoin + `
LEFT JOIN groups g ON g.topic = n.topic
LEFT JOIN mt ON mt.topic = n.topic
ORDER BY n.topic`
}

// InspectTopics is [Driver.InspectTopics] on Citus: it reads the topics with messages on every shard, then
// InspectTopics' rows.
func (d citus) InspectTopics(ctx context.Context, q Querier, schema int) ([]TopicRow, error) {
	topics, newest, err := d.citusTopicsOfShards(ctx, q)
	if err != nil {
		return nil, err
	}
	return collect(ctx, q, d.citusInspectTopics(schema, topics, newest), pgx.RowToStructByPos[TopicRow])
}

// InspectTopicsPage is [Driver.InspectTopicsPage] on Citus: it reads the
// topics with messages on every shard, then InspectTopicsPage's rows.
func (d citus) InspectTopicsPage(ctx context.Context, q Querier, p TopicsPageParams) ([]TopicPageRow, error) {
	topics, newest, err := d.citusTopicsOfShards(ctx, q)
	if err != nil {
		return nil, err
	}
	return collect(ctx, q, d.citusInspectTopicsPage(p, topics, newest), pgx.RowToStructByPos[TopicPageRow])
}

// citusTopicsOfShards reads the topics with messages on every shard of
// the messages table (run_command_on_shards: one command per shard, in
// parallel, on connections of their own), with the storage time of each
// topic's newest message, in no order (a topic lies on one shard).
func (d citus) citusTopicsOfShards(ctx context.Context, q Querier) (topics []string, newest []time.Time, err error) {
	results, err := collect(ctx, q, Stmt{SQL: `SELECT r.shardid, r.success, r.result FROM pg_catalog.run_command_on_shards($1::text::regclass, $2) r`,
		Args: []any{d.t.Messages, citusShardTopics()}}, pgx.RowToStructByPos[shardResult])
	if err != nil {
		return nil, nil, err
	}
	for _, r := range results {
		if !r.Success {
			return nil, nil, fmt.Errorf("read the topics of shard %d: %s", r.ShardID, r.Result)
		}
		var pairs [][2]*string
		if err := json.Unmarshal([]byte(r.Result), &pairs); err != nil {
			return nil, nil, fmt.Errorf("read the topics of shard %d: %w", r.ShardID, err)
		}
		for _, p := range pairs {
			if p[0] == nil || p[1] == nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, *p[1])
			if err != nil {
				return nil, nil, fmt.Errorf("read the topics of shard %d: %w", r.ShardID, err)
			}
			topics, newest = append(topics, *p[0]), append(newest, at)
		}
	}
	return topics, newest, nil
}

type shardResult struct {
	ShardID int64
	Success bool
	Result  string
}

// citusWorkerCommand is the command citusInspectWorkers runs on every
// worker (run_command_on_workers): one JSON object with the worker's
// horizon (InspectHorizon's row) and, with publishers, its open
// publishers (citusWorkerPublishers), so that one connection to each
// worker reads both.
func (d citus) citusWorkerCommand(publishers bool) string {
	pubs := `NULL::json`
	if publishers {
		pubs = `(` + d.citusWorkerPublishers() + `)::json`
	}
	return `SELECT pg_catalog.json_build_object('horizon', (SELECT pg_catalog.row_to_json(h) FROM (` + d.t.InspectHorizon().SQL + `) h(xmin, pid, gid, application_name, state,
	xact_start, query_start, age, query, datname, usename)), 'publishers', ` + pubs + `)::text`
}

// NodeHorizonRow is one worker's row of [InspectHorizon] where the tables
// are distributed by Citus: the node's name and port, and its horizon.
type NodeHorizonRow struct {
	Node string
	Port int32
	HorizonRow
	// GlobalPID is the global process id of the session whose
	// distributed transaction the worker's holder runs, where it is one
	// of Citus's connections (nil otherwise), and Client that session's
	// backend on the coordinator (nil where it is not the coordinator's
	// or has ended), as in [PublisherRow].
	GlobalPID *int64
	Client    *HorizonRow
}

// WorkersRow is what [Driver.InspectWorkers] reads of every worker:
// its horizon, and the open publishers of all (PerTopic false, none
// read: the tables take their positions from the workers' transaction
// ids).
type WorkersRow struct {
	Horizons   []NodeHorizonRow
	Publishers []PublisherRow
	PerTopic   bool
}

// citusPositionsStmt is the statement that tells whether the messages
// table takes its positions from the workers' sequences: whether its
// trigger is the position trigger of DistributeScript, not that of an
// earlier release, whose positions are the workers' transaction ids.
func (d citus) citusPositionsStmt() Stmt {
	return Stmt{SQL: `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg
	WHERE tg.tgrelid = pg_catalog.to_regclass($1::text) AND tg.tgfoid = pg_catalog.to_regprocedure($2::text))`,
		Args: []any{d.t.Messages, d.t.CitusPositionFunction() + "()"}}
}

// citusWorkerPublishers is the command citusOpenPublishers runs on every
// worker (run_command_on_workers): the single node's OpenPublishers for
// the shards of the messages table that lie on the worker, as one JSON
// array. A transaction is listed when it holds the key of a partition
// (the position trigger's lock, keyed by the shard's oid) and a write
// lock on that same shard or one of its partitions, as the worker's
// bound counts it (citus_worker_bound); its keys are given by shard id
// (shards) and hash (keys), for the coordinator to name. The command
// reads only catalogs, the shards' metadata and the lock and activity
// views, which every role may read: it needs no object of pglease on
// the worker, and works on a cluster distributed by any release whose
// position trigger registers (citusPositionsStmt).
func (d citus) citusWorkerPublishers() string {
	return `SELECT COALESCE(pg_catalog.json_agg(pg_catalog.json_build_object('v', x.v::text, 'pid', x.pid, 'gid', x.gid,
	'application_name', x.application_name, 'state', x.state, 'xact_start', x.xact_start, 'query_start', x.query_start,
	'age', x.age, 'query', x.query, 'datname', x.datname, 'usename', x.usename, 'shards', x.shards, 'keys', x.keys)
	ORDER BY x.xact_start NULLS FIRST, x.v)::text, '[]')
FROM (
	WITH db AS (
		SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
	), roots AS MATERIALIZED (
		SELECT s.shardid, r.oid
		FROM pg_catalog.pg_dist_shard s,
			LATERAL (SELECT pg_catalog.to_regclass(pg_catalog.shard_name(s.logicalrelid, s.shardid))::oid AS oid) r
		WHERE s.logicalrelid = pg_catalog.to_regclass(` + quoteLiteral(d.t.Messages) + `) AND r.oid IS NOT NULL
	), rels AS MATERIALIZED (
		SELECT roots.oid AS root, roots.oid AS rel FROM roots
		UNION ALL
		SELECT roots.oid, i.inhrelid FROM roots JOIN pg_catalog.pg_inherits i ON i.inhparent = roots.oid
	), l AS MATERIALIZED (
		SELECT l.locktype, l.virtualtransaction AS vx, l.pid, l.classid, l.objid, l.objsubid, l.relation
		FROM pg_catalog.pg_locks l, db
		WHERE l.granted AND l.database = db.oid
			AND (l.locktype = 'advisory' AND (l.objsubid = 2 AND l.classid IN (SELECT roots.oid FROM roots)
					OR l.objsubid = 1 AND l.classid::bigint >> 24 = 112)
				OR l.locktype = 'relation' AND l.mode <> 'AccessShareLock' AND l.relation IN (SELECT rels.rel FROM rels))
	), writes AS (
		SELECT DISTINCT l.vx, rels.root FROM l JOIN rels ON rels.rel = l.relation WHERE l.locktype = 'relation'
	), held AS (
		SELECT w.vx, k.pid, roots.shardid, k.objid::bigint AS k
		FROM writes w
		JOIN l k ON k.vx = w.vx AND k.locktype = 'advisory' AND k.objsubid = 2 AND k.classid = w.root
		JOIN roots ON roots.oid = w.root
	), h AS (
		SELECT held.vx, pg_catalog.max(held.pid) AS pid,
			pg_catalog.array_agg(held.shardid ORDER BY held.shardid, held.k) AS shards,
			pg_catalog.array_agg(held.k ORDER BY held.shardid, held.k) AS keys,
			(SELECT pg_catalog.min(((v.classid::bigint & 16777215) << 32) | v.objid::bigint) FROM l v
				WHERE v.vx = held.vx AND v.locktype = 'advisory' AND v.objsubid = 1) AS v
		FROM held
		GROUP BY held.vx
	)
	SELECT COALESCE(h.v, 0) AS v, h.pid, CASE WHEN h.pid IS NULL THEN p.gid END AS gid, a.application_name, a.state,
		COALESCE(a.xact_start, p.prepared) AS xact_start, a.query_start,
		extract(epoch FROM pg_catalog.now() - COALESCE(a.xact_start, p.prepared))::float8 AS age,
		pg_catalog.left(a.query, 1000) AS query, COALESCE(a.datname::text, p.database::text) AS datname,
		COALESCE(a.usename::text, p.owner::text) AS usename, h.shards, h.keys
	FROM h
	LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid
	LEFT JOIN LATERAL (
		-- A prepared transaction (Citus prepares a transaction that wrote
		-- on several workers before it commits) has no backend.
		SELECT px.gid, px.prepared, px.database, px.owner
		FROM pg_catalog.pg_locks xl JOIN pg_catalog.pg_prepared_xacts px ON px.transaction = xl.transactionid
		WHERE h.pid IS NULL AND xl.virtualtransaction = h.vx AND xl.locktype = 'transactionid' AND xl.granted
		LIMIT 1
	) p ON true
) x`
}

// citusKeyNamesStmt is the statement that names the partitions whose
// keys (the hash of the position trigger's lock) are among keys: the
// partitions with settings or offset rows, as OpenPublishers names them,
// each with the shard of its topic and its key.
func (d citus) citusKeyNamesStmt(keys []int64) Stmt {
	key := func(topic, partition string) string {
		return `(pg_catalog.hashtext(` + topic + ` || ':' || ` + partition + `::text)::bigint & 4294967295)`
	}
	return Stmt{SQL: `SELECT n.topic, n.partition, pg_catalog.get_shard_id_for_distribution_column($2::text::regclass, n.topic),
	` + key("n.topic", "n.partition") + `
FROM (
	SELECT o.topic COLLATE "C" AS topic, o.partition FROM ` + d.t.Offsets + ` o
	WHERE ` + key("o.topic", "o.partition") + ` = ANY($1::bigint[])
	UNION
	SELECT tp.topic, p.p::integer FROM ` + d.t.Topics + ` tp, pg_catalog.generate_series(0, tp.partitions - 1) p(p)
	WHERE ` + key("tp.topic", "p.p") + ` = ANY($1::bigint[])
) n
ORDER BY n.topic, n.partition`, Args: []any{keys, d.t.Messages}}
}

// citusClientsStmt is the statement that reads the backends of this node
// (the coordinator) whose Citus global process ids are among gpids: the
// sessions whose distributed transactions the workers' backends run.
func (d citus) citusClientsStmt(gpids []int64) Stmt {
	return Stmt{SQL: `SELECT g.gpid, a.pid, a.application_name, a.state, a.xact_start, a.query_start,
	extract(epoch FROM pg_catalog.now() - a.xact_start)::float8, pg_catalog.left(a.query, 1000), a.datname::text, a.usename::text
FROM pg_catalog.unnest($1::bigint[]) g(gpid)
JOIN pg_catalog.pg_stat_activity a ON a.pid = pg_catalog.citus_pid_for_gpid(g.gpid)
WHERE pg_catalog.citus_nodeid_for_gpid(g.gpid) = pg_catalog.citus_nodeid_for_gpid(pg_catalog.citus_backend_gpid())`,
		Args: []any{gpids}}
}

// citusGlobalPIDPrefix starts the application_name of the connections
// Citus opens to a worker for a session's distributed transaction; the
// session's global process id follows it.
const citusGlobalPIDPrefix = "citus_internal gpid="

// citusGlobalPID returns the global process id in the application_name
// of one of Citus's connections (false for another application's).
func citusGlobalPID(applicationName string) (int64, bool) {
	rest, ok := strings.CutPrefix(applicationName, citusGlobalPIDPrefix)
	if !ok {
		return 0, false
	}
	gpid, err := strconv.ParseInt(rest, 10, 64)
	return gpid, err == nil && gpid > 0
}

// OpenPublishers implements Driver: the publishers that hold back
// partitions on every worker (run_command_on_workers: a connection to
// each), named by the coordinator's offsets and topics tables, each
// with its worker (Node) and, where the worker's backend is one of
// Citus's connections, the session on the coordinator whose transaction
// it runs (Client). A transaction that published to topics on two
// workers is listed once per worker. Where the messages table takes its
// positions from the workers' transaction ids (distributed by an earlier
// release, until `pglease migrate --citus` runs again), delivery is held
// back by each worker's xmin horizon: nothing listed, ok false.
func (d citus) OpenPublishers(ctx context.Context, q Querier) ([]PublisherRow, bool, error) {
	w, err := d.citusInspectWorkers(ctx, q)
	return w.Publishers, w.PerTopic, err
}

// InspectWorkers implements Driver: every worker's horizon and open
// publishers (see OpenPublishers), read by one command on each worker.
func (d citus) InspectWorkers(ctx context.Context, q Querier) (WorkersRow, bool, error) {
	w, err := d.citusInspectWorkers(ctx, q)
	return w, true, err
}

// citusInspectWorkers runs citusWorkerCommand on every worker
// (run_command_on_workers: one command per worker, on connections of
// their own), then names the partitions the publishers hold by the
// coordinator's tables and the coordinator's sessions whose distributed
// transactions the workers' backends run.
func (d citus) citusInspectWorkers(ctx context.Context, q Querier) (WorkersRow, error) {
	var out WorkersRow
	s := d.citusPositionsStmt()
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&out.PerTopic); err != nil {
		return WorkersRow{}, err
	}
	type result struct {
		Node    string
		Port    int32
		Success bool
		Result  string
	}
	results, err := collect(ctx, q, Stmt{SQL: `SELECT r.nodename, r.nodeport, r.success, r.result
FROM pg_catalog.run_command_on_workers($1) r ORDER BY r.nodename, r.nodeport`,
		Args: []any{d.citusWorkerCommand(out.PerTopic)}}, pgx.RowToStructByPos[result])
	if err != nil {
		return WorkersRow{}, err
	}
	type workerRow struct {
		V string `json:"v"`
		workerBackend
		Shards []int64 `json:"shards"`
		Keys   []int64 `json:"keys"`
	}
	var reply struct {
		Horizon *struct {
			Xmin string `json:"xmin"`
			workerBackend
		} `json:"horizon"`
		Publishers []workerRow `json:"publishers"`
	}
	type shardKey struct{ shard, key int64 }
	var (
		held  [][]shardKey
		keys  []int64
		gpids []int64
	)
	gpidOf := func(applicationName *string) *int64 {
		if applicationName == nil {
			return nil
		}
		gpid, ok := citusGlobalPID(*applicationName)
		if !ok {
			return nil
		}
		gpids = append(gpids, gpid)
		return &gpid
	}
	for _, r := range results {
		node := fmt.Sprintf("%s:%d", r.Node, r.Port)
		if !r.Success {
			return WorkersRow{}, fmt.Errorf("inspect worker %s: %s", node, r.Result)
		}
		reply.Horizon, reply.Publishers = nil, nil
		if err := json.Unmarshal([]byte(r.Result), &reply); err != nil {
			return WorkersRow{}, fmt.Errorf("inspect worker %s: %w", node, err)
		}
		if reply.Horizon == nil {
			return WorkersRow{}, fmt.Errorf("inspect worker %s: no horizon in %q", node, r.Result)
		}
		h := reply.Horizon
		xmin, err := parseXID8(h.Xmin)
		if err != nil {
			return WorkersRow{}, fmt.Errorf("read the horizon of worker %s: %w", node, err)
		}
		out.Horizons = append(out.Horizons, NodeHorizonRow{Node: r.Node, Port: r.Port, HorizonRow: h.row(xmin, nil),
			GlobalPID: gpidOf(h.ApplicationName)})
		for _, w := range reply.Publishers {
			v, err := parseXID8(w.V)
			if err != nil || len(w.Shards) != len(w.Keys) {
				return WorkersRow{}, fmt.Errorf("read the open publishers of worker %s: position %q, %d shards for %d keys: %v",
					node, w.V, len(w.Shards), len(w.Keys), err)
			}
			p := PublisherRow{HorizonRow: w.row(v, &node), Held: len(w.Keys), GlobalPID: gpidOf(w.ApplicationName)}
			var hk []shardKey
			for k := range w.Keys {
				hk = append(hk, shardKey{w.Shards[k], w.Keys[k]})
				keys = append(keys, w.Keys[k])
			}
			out.Publishers, held = append(out.Publishers, p), append(held, hk)
		}
	}
	// The partitions, by shard and key.
	if len(keys) > 0 {
		type name struct {
			Topic     string
			Partition int32
			Shard     int64
			Key       int64
		}
		slices.Sort(keys)
		names, err := collect(ctx, q, d.citusKeyNamesStmt(slices.Compact(keys)), pgx.RowToStructByPos[name])
		if err != nil {
			return WorkersRow{}, err
		}
		named := map[shardKey][]name{}
		for _, n := range names {
			k := shardKey{n.Shard, n.Key}
			named[k] = append(named[k], n)
		}
		for i := range out.Publishers {
			var ns []name
			for _, k := range held[i] {
				ns = append(ns, named[k]...)
			}
			slices.SortFunc(ns, func(a, b name) int {
				if c := strings.Compare(a.Topic, b.Topic); c != 0 {
					return c
				}
				return cmp.Compare(a.Partition, b.Partition)
			})
			for _, n := range ns {
				p := &out.Publishers[i]
				p.Topics, p.Partitions = append(p.Topics, n.Topic), append(p.Partitions, n.Partition)
			}
		}
	}
	// The sessions on the coordinator.
	if len(gpids) > 0 {
		slices.Sort(gpids)
		clients, err := d.citusClients(ctx, q, slices.Compact(gpids))
		if err != nil {
			return WorkersRow{}, err
		}
		for i, p := range out.Publishers {
			if p.GlobalPID != nil {
				out.Publishers[i].Client = clients[*p.GlobalPID]
			}
		}
		for i, h := range out.Horizons {
			if h.GlobalPID != nil {
				out.Horizons[i].Client = clients[*h.GlobalPID]
			}
		}
	}
	// Oldest first, as on a single node (an age that cannot be read
	// first), across the workers.
	slices.SortStableFunc(out.Publishers, func(a, b PublisherRow) int {
		switch {
		case a.XactStart == nil && b.XactStart != nil:
			return -1
		case a.XactStart != nil && b.XactStart == nil:
			return 1
		case a.XactStart != nil && !a.XactStart.Equal(*b.XactStart):
			return a.XactStart.Compare(*b.XactStart)
		}
		return cmp.Compare(a.Xmin, b.Xmin)
	})
	return out, nil
}

// citusClients reads the sessions of citusClientsStmt, by global process
// id.
func (d citus) citusClients(ctx context.Context, q Querier, gpids []int64) (map[int64]*HorizonRow, error) {
	s := d.citusClientsStmt(gpids)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]*HorizonRow{}
	for rows.Next() {
		var (
			gpid int64
			c    HorizonRow
		)
		if err := rows.Scan(&gpid, &c.PID, &c.AppName, &c.State, &c.XactStart, &c.QueryStart, &c.AgeSeconds, &c.Query,
			&c.DB, &c.User); err != nil {
			return nil, err
		}
		out[gpid] = &c
	}
	return out, rows.Err()
}

// workerBackend is the backend of a worker that the JSON of a worker's
// horizon or open publisher describes (pg_stat_activity's columns).
type workerBackend struct {
	PID             *int32     `json:"pid"`
	GID             *string    `json:"gid"`
	ApplicationName *string    `json:"application_name"`
	State           *string    `json:"state"`
	XactStart       *time.Time `json:"xact_start"`
	QueryStart      *time.Time `json:"query_start"`
	Age             *float64   `json:"age"`
	Query           *string    `json:"query"`
	DB              *string    `json:"datname"`
	User            *string    `json:"usename"`
}

// row is the HorizonRow of the backend, at position (or horizon) xmin,
// on node (nil: not named).
func (w workerBackend) row(xmin uint64, node *string) HorizonRow {
	return HorizonRow{Xmin: xmin, PID: w.PID, GID: w.GID, AppName: w.ApplicationName, State: w.State, Query: w.Query,
		DB: w.DB, User: w.User, XactStart: w.XactStart, QueryStart: w.QueryStart, AgeSeconds: w.Age, Node: node}
}
