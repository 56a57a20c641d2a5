package pgsql

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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
func (d citus) citusInspectTopics(topics []string, newest []time.Time) Stmt {
	return Stmt{SQL: d.citusInspectTopicsSQL(false), Args: []any{topics, newest}}
}

// citusInspectTopicsPage is InspectTopicsPage on Citus.
func (d citus) citusInspectTopicsPage(topics []string, newest []time.Time, first bool, after string, limit int) Stmt {
	return Stmt{SQL: d.citusInspectTopicsSQL(true), Args: []any{topics, newest, first, after, limit}}
}

func (d citus) citusInspectTopicsSQL(page bool) string {
	t := d.t
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
	COALESCE(pg_catalog.floor(extract(epoch FROM t.retention) * 1000000::numeric)::bigint, 0)` + total + `
FROM ` + from + ` n
LEFT JOIN ` + t.Topics + ` t ON t.topic = n.topic
LEFT JOIN groups g ON g.topic = n.topic
LEFT JOIN mt ON mt.topic = n.topic
ORDER BY n.topic`
}

// InspectTopics is [Driver.InspectTopics] on Citus: it reads the topics with messages on every shard, then
// InspectTopics' rows.
func (d citus) InspectTopics(ctx context.Context, q Querier) ([]TopicRow, error) {
	topics, newest, err := d.citusTopicsOfShards(ctx, q)
	if err != nil {
		return nil, err
	}
	return collect(ctx, q, d.citusInspectTopics(topics, newest), pgx.RowToStructByPos[TopicRow])
}

// InspectTopicsPage is [Driver.InspectTopicsPage] on Citus: it reads the
// topics with messages on every shard, then InspectTopicsPage's rows.
func (d citus) InspectTopicsPage(ctx context.Context, q Querier, first bool, after string, limit int) ([]TopicPageRow, error) {
	topics, newest, err := d.citusTopicsOfShards(ctx, q)
	if err != nil {
		return nil, err
	}
	return collect(ctx, q, d.citusInspectTopicsPage(topics, newest, first, after, limit), pgx.RowToStructByPos[TopicPageRow])
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

// citusWorkerHorizon is the command citusInspectHorizon runs on every
// worker: InspectHorizon's row as JSON.
func (d citus) citusWorkerHorizon() string {
	return `SELECT pg_catalog.row_to_json(h)::text FROM (` + d.t.InspectHorizon().SQL + `) h(xmin, pid, gid, application_name, state,
	xact_start, query_start, age, query, datname, usename)`
}

// NodeHorizonRow is one worker's row of [InspectHorizon] where the tables
// are distributed by Citus: the node's name and port, and its horizon.
type NodeHorizonRow struct {
	Node string
	Port int32
	HorizonRow
}

// citusInspectHorizon reads the horizon of every worker
// (run_command_on_workers: one command per worker, on connections of
// their own).
func (d citus) citusInspectHorizon(ctx context.Context, q Querier) ([]NodeHorizonRow, error) {
	type result struct {
		Node    string
		Port    int32
		Success bool
		Result  string
	}
	results, err := collect(ctx, q, Stmt{SQL: `SELECT r.nodename, r.nodeport, r.success, r.result
FROM pg_catalog.run_command_on_workers($1) r ORDER BY r.nodename, r.nodeport`,
		Args: []any{d.citusWorkerHorizon()}}, pgx.RowToStructByPos[result])
	if err != nil {
		return nil, err
	}
	out := make([]NodeHorizonRow, 0, len(results))
	for _, r := range results {
		node := fmt.Sprintf("%s:%d", r.Node, r.Port)
		if !r.Success {
			return nil, fmt.Errorf("read the horizon of worker %s: %s", node, r.Result)
		}
		var h struct {
			Xmin            string     `json:"xmin"`
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
		if err := json.Unmarshal([]byte(r.Result), &h); err != nil {
			return nil, fmt.Errorf("read the horizon of worker %s: %w", node, err)
		}
		xmin, err := parseXID8(h.Xmin)
		if err != nil {
			return nil, fmt.Errorf("read the horizon of worker %s: %w", node, err)
		}
		out = append(out, NodeHorizonRow{Node: r.Node, Port: r.Port, HorizonRow: HorizonRow{Xmin: xmin, PID: h.PID,
			GID: h.GID, AppName: h.ApplicationName, State: h.State, Query: h.Query, DB: h.DB, User: h.User,
			XactStart: h.XactStart, QueryStart: h.QueryStart, AgeSeconds: h.Age}})
	}
	return out, nil
}
