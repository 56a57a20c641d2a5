package pgsql

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// The message browser's, replay's and the console's statements where the
// tables are distributed by Citus (see citus.go). Citus refuses a
// statement that reads a distributed table once per row of a list
// (LATERAL over unnest, a recursive CTE), a multi-shard SELECT ... FOR
// UPDATE, and a DELETE joined on tableoid and ctid; each of those runs
// here as one statement per topic, routed to the topic's worker whole.
// MessagesNewestFirst, MessagesByUUID of one topic, TopicDetail,
// GroupLiveOwners and DeleteGroupOffsets run there unchanged:
// MessagesNewestFirst and MessagesByUUID read one topic (Citus routes
// them whole, generate_series included), TopicDetail reads reference
// tables, and DeleteGroupOffsets' multi-shard DELETE is planned with the
// group's other rows read first (a subplan), so its guarantee holds.

// citusCountBatch is how many routed counts CountTopicMessages sends in
// one pipelined batch.
const citusCountBatch = 1000

// citusCountTopic is the count of [CountTopicMessages] for one topic,
// routed to its worker.
func (d citus) citusCountTopic(topic string, capPerTopic int64) Stmt {
	return Stmt{SQL: `SELECT $2::text, LEAST(c.n, $1::bigint), c.n > $1::bigint
FROM (SELECT pg_catalog.count(*) AS n FROM (SELECT 1 FROM ` + d.t.Messages + ` m WHERE m.topic = $2 LIMIT $1::bigint + 1) x) c`,
		Args: []any{capPerTopic, topic}}
}

// CountTopicMessages is [Driver.CountTopicMessages] on Citus: the topics
// with messages (nil) read on every shard, then one count per topic,
// routed to its worker, sent in pipelined batches when q can.
func (d citus) CountTopicMessages(ctx context.Context, q Querier, topics []string, capPerTopic int64) ([]TopicCountRow, error) {
	if topics == nil {
		var err error
		if topics, _, err = d.citusTopicsOfShards(ctx, q); err != nil {
			return nil, err
		}
	}
	// In the order of the single-node statement: by name, collation "C"
	// (byte order), each once.
	topics = slices.Compact(slices.Sorted(slices.Values(topics)))
	out := make([]TopicCountRow, 0, len(topics))
	b, ok := q.(batcher)
	for len(topics) > 0 {
		chunk := topics[:min(len(topics), citusCountBatch)]
		topics = topics[len(chunk):]
		if !ok {
			for _, topic := range chunk {
				s := d.citusCountTopic(topic, capPerTopic)
				var r TopicCountRow
				if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.Topic, &r.Messages, &r.Capped); err != nil {
					return nil, err
				}
				out = append(out, r)
			}
			continue
		}
		batch := &pgx.Batch{}
		for _, topic := range chunk {
			s := d.citusCountTopic(topic, capPerTopic)
			batch.Queue(s.SQL, s.Args...)
		}
		res := b.SendBatch(ctx, batch)
		for range chunk {
			var r TopicCountRow
			if err := res.QueryRow().Scan(&r.Topic, &r.Messages, &r.Capped); err != nil {
				_ = res.Close()
				return nil, err
			}
			out = append(out, r)
		}
		if err := res.Close(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// citusMessagesByUUID is [MessagesByUUID] of every topic on Citus: a
// multi-shard read. Positions of topics on different workers are
// transaction ids of different counters, which say nothing of which
// message is newer: the messages are ordered by the time they were
// stored (the coordinator's clock), then by topic and position.
func (d citus) citusMessagesByUUID(id string, preview, limit int) Stmt {
	return Stmt{SQL: `SELECT ` + browseColumns("$2::integer") + `, m.topic
FROM ` + d.t.Messages + ` m
WHERE m.uuid = $1
ORDER BY m.created_at DESC, m.topic, m.transaction_id DESC, m."offset" DESC
LIMIT NULLIF($3::bigint, -1)`, Args: []any{id, preview, limit}}
}

// citusDeleteMessagesForReplay is deleteMessagesForReplay on Citus, routed
// to the topic's worker whole: the rows locked by the same sub-select,
// then deleted by primary key (Citus cannot plan the join on tableoid and
// ctid of a distributed table).
func (d citus) citusDeleteMessagesForReplay(p ReplayParams) Stmt {
	t := d.t
	return Stmt{SQL: `WITH sel AS (
	SELECT m.partition, m.transaction_id, m."offset" FROM ` + t.Messages + ` m
	WHERE ` + t.replayCondition(p) + `
	ORDER BY m.transaction_id, m."offset"
	LIMIT $4
	FOR UPDATE
), del AS (
	DELETE FROM ` + t.Messages + ` m USING sel
	WHERE m.topic = $1 AND m.partition = sel.partition AND m.transaction_id = sel.transaction_id AND m."offset" = sel."offset"
	RETURNING m.*
)
SELECT ` + browseColumns("-1") + ` FROM del m
ORDER BY m.transaction_id, m."offset"`, Args: []any{p.Topic, string(p.Filter), p.ToOriginal, p.Limit}}
}

// citusGroupTopics lists the topics of a group's offsets rows (a
// multi-shard SELECT, which takes no lock).
func (d citus) citusGroupTopics(group string) Stmt {
	return Stmt{SQL: `SELECT DISTINCT o.topic FROM ` + d.t.Offsets + ` o WHERE o.consumer_group = $1 ORDER BY 1`, Args: []any{group}}
}

// citusLockGroupTopic is lockGroupOffsets for one topic, routed to its
// worker (Citus refuses FOR UPDATE on several shards).
func (d citus) citusLockGroupTopic(group, topic string) Stmt {
	return Stmt{SQL: `SELECT o.topic, o.partition, NULL::text FROM ` + d.t.Offsets + ` o
WHERE o.consumer_group = $1 AND o.topic = $2 ORDER BY o.partition FOR UPDATE`, Args: []any{group, topic}}
}

// LockGroupOffsets is [Driver.LockGroupOffsets] on Citus: the group's
// topics listed, then each topic's rows locked on its worker, topic by
// topic in name order (two deletes of a group lock in the same order). A
// row created after its topic was listed or locked is not locked: it is
// one of the rows created meanwhile that [DeleteGroupOffsets] finds and
// does not delete, as a row created after the single-node lock.
func (d citus) LockGroupOffsets(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error) {
	topics, err := collect(ctx, q, d.citusGroupTopics(group), pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var out []GroupOffsetRow
	for _, topic := range topics {
		rows, err := collect(ctx, q, d.citusLockGroupTopic(group, topic), pgx.RowToStructByPos[GroupOffsetRow])
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

// citusPlanRows reads the estimate of an EXPLAIN (FORMAT JSON) on Citus:
// the coordinator's plan is a custom scan estimated at 0 rows, the
// estimate is that of each task's plan on its worker (one task for a
// statement routed to a topic's worker), from the shard's statistics. It
// reports false when the plan holds no task's plan.
func citusPlanRows(plan []byte) (int64, bool) {
	type node struct {
		Rows json.Number `json:"Plan Rows"`
	}
	var parsed []struct {
		Plan struct {
			Distributed *struct {
				Job struct {
					Tasks []struct {
						Remote json.RawMessage `json:"Remote Plan"`
					} `json:"Tasks"`
				} `json:"Job"`
			} `json:"Distributed Query"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &parsed); err != nil || len(parsed) == 0 || parsed[0].Plan.Distributed == nil {
		return 0, false
	}
	var (
		sum   float64
		found bool
	)
	for _, task := range parsed[0].Plan.Distributed.Job.Tasks {
		// A task's plan is the worker's EXPLAIN output: an array of
		// plans, in an array of the worker's result rows.
		var nested [][]struct{ Plan node }
		var flat []struct{ Plan node }
		var plans []struct{ Plan node }
		if json.Unmarshal(task.Remote, &nested) == nil {
			for _, n := range nested {
				plans = append(plans, n...)
			}
		} else if json.Unmarshal(task.Remote, &flat) == nil {
			plans = flat
		}
		for _, p := range plans {
			if f, err := strconv.ParseFloat(p.Plan.Rows.String(), 64); err == nil {
				sum, found = sum+f, true
			}
		}
	}
	return int64(sum), found
}
