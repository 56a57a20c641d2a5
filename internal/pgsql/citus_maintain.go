package pgsql

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The maintainer's statements where the tables are distributed by Citus
// (see citus.go): the statements of maintenance.go that Citus refuses,
// written in shapes it plans. Each keeps the single-node statement's
// contract (its columns, its rows); the run functions of
// run_maintenance.go choose between them.

// citusDeleteIdleGroups is DeleteIdleGroups where the offsets table is
// distributed: Citus refuses a HAVING whose sub-select refers to the
// grouped rows, so the groups without a write for idleFor are found
// first (a multi-shard aggregate), those with a live session dropped
// from them on the coordinator, and the rest deleted by a multi-shard
// DELETE, which re-checks updated_at on each row's newest version as the
// single-node statement does.
func (d citus) citusDeleteIdleGroups(idleFor time.Duration) Stmt {
	t := d.t
	return Stmt{
		SQL: `WITH quiet AS MATERIALIZED (
	SELECT o.consumer_group FROM ` + t.Offsets + ` o
	GROUP BY o.consumer_group
	HAVING pg_catalog.max(o.updated_at) < pg_catalog.now() - $1::bigint::float8 * interval '1 microsecond'
), idle AS MATERIALIZED (
	SELECT q.consumer_group FROM quiet q
	WHERE NOT EXISTS (SELECT 1 FROM ` + t.Sessions + ` s
		WHERE s.consumer_group = q.consumer_group AND s.expires_at > pg_catalog.now())
), gone AS (
	DELETE FROM ` + t.Offsets + ` o
	WHERE o.consumer_group IN (SELECT i.consumer_group FROM idle i)
		AND o.updated_at < pg_catalog.now() - $1::bigint::float8 * interval '1 microsecond'
	RETURNING o.consumer_group
)
SELECT consumer_group, pg_catalog.count(*) FROM gone GROUP BY consumer_group ORDER BY consumer_group`,
		Args: []any{idleFor.Microseconds()},
	}
}

// citusRetainedTopics is the statement that lists the topics with a
// retention (a reference table: read on the coordinator), for
// citusDeleteExpiredKept to run once per topic.
func (d citus) citusRetainedTopics() Stmt {
	t := d.t
	return Stmt{SQL: `SELECT t.topic FROM ` + t.Topics + ` t WHERE t.retention_class > 0 ORDER BY t.topic`}
}

// citusDeleteExpiredKept is DeleteExpiredKept for one topic where the
// messages table is distributed: Citus refuses the single-node
// statement's LATERAL from the topics (a reference table) into the
// messages, and routes this one, every table filtered on the topic, to
// the topic's worker whole. Same rows as DeleteExpiredKept's.
func (d citus) citusDeleteExpiredKept(topic string, limit int) Stmt {
	t := d.t
	forever := t.partition("forever")
	return Stmt{
		SQL: `WITH gone AS (
	DELETE FROM ` + forever + ` f
	WHERE f.topic = $1 AND f.ctid = ANY (ARRAY(
		SELECT m.ctid FROM ` + forever + ` m
		WHERE m.topic = $1 AND m.created_at < pg_catalog.now() - (SELECT t.retention FROM ` + t.Topics + ` t
			WHERE t.topic = $1 AND t.retention_class > 0)
		ORDER BY m.topic, m.partition, m.transaction_id, m."offset"
		LIMIT $2))
	RETURNING f.topic, f.partition, f.transaction_id, f."offset"
)
SELECT NULL::text, NULL::text, NULL::integer, pg_catalog.count(*) FROM gone
UNION ALL
(SELECT o.consumer_group, g.topic, g.partition, pg_catalog.count(*)
FROM gone g
JOIN ` + t.Offsets + ` o ON o.topic = g.topic AND o.partition = g.partition
WHERE o.topic = $1 AND (g.transaction_id, g."offset") > (o.acked_transaction_id, o.acked_offset)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3)`,
		Args: []any{topic, limit},
	}
}

// DeleteExpiredKept is [Driver.DeleteExpiredKept] on Citus: it runs
// citusDeleteExpiredKept topic by topic until
// limit rows are deleted, and returns DeleteExpiredKept's rows: the
// total, then the skipped messages per (consumer group, topic,
// partition).
func (d citus) DeleteExpiredKept(ctx context.Context, q Querier, limit int) ([]SkippedRow, error) {
	topics, err := collect(ctx, q, d.citusRetainedTopics(), pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	total := SkippedRow{}
	out := []SkippedRow{{}}
	for _, topic := range topics {
		if total.Messages >= int64(limit) {
			break
		}
		rows, err := collect(ctx, q, d.citusDeleteExpiredKept(topic, limit-int(total.Messages)), pgx.RowToStructByPos[SkippedRow])
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			if r.ConsumerGroup == nil {
				total.Messages += r.Messages
				continue
			}
			out = append(out, r)
		}
	}
	out[0] = total
	return out, nil
}

// citusDetachRetentionPartition is DetachRetentionPartition where the
// messages table is distributed: Citus refuses DETACH ... CONCURRENTLY,
// so the partition is detached in a transaction, which holds the messages
// table (on the coordinator and every worker) for as long as it takes and
// waits at most 5 s for its lock, as the owner's function does; a detach
// that gives up is retried by a later round (lock_not_available).
func (d citus) citusDetachRetentionPartition(p RetentionPartition) string {
	t := d.t
	return doBlock(`BEGIN
	PERFORM pg_catalog.set_config('lock_timeout', '5s', true);
	EXECUTE ` + quoteLiteral(`ALTER TABLE `+t.Messages+` DETACH PARTITION `+t.retentionPartition(p)) + `;
END`)
}
