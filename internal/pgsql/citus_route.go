package pgsql

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Routing a Publisher's statements to the topic's worker (Citus 11 and
// later, the workers holding Citus's metadata): a worker with the
// metadata plans a statement on a distributed table as the coordinator
// would, and runs the part on its own shards locally, without a
// connection to another node. The coordinator then neither plans nor
// relays the insert, which is where its CPU went while publishing.
//
// Two things differ from the statements sent to the coordinator:
//
//   - The notification. pg_notify in a routed statement would notify
//     on the worker, where no Subscriber listens (they LISTEN on the
//     coordinator). The routed insert returns the payloads instead,
//     computed on the worker from its copy of the topics table, and the
//     Publisher sends them to the coordinator once the insert committed
//     ([Routed.Notify]). A notification is a hint: one lost (the
//     coordinator unreachable after the commit) delays the message until
//     the Subscribers' next poll.
//   - Nothing else: the same insert, placement decided inline, the
//     trigger taking the position on the worker that stores the row
//     (which is the one the statement runs on, or, when the shard moved
//     since the Publisher read the catalog, the one Citus forwards it to).

// Routed runs a Publisher's statements on a Citus worker. Get it from
// the Citus Driver with [RoutedOf]. Safe for concurrent use.
type Routed struct{ d citus }

// RoutedOf returns the routed statements of d, and false when d is not
// the Citus driver (nothing to route: a single server).
func RoutedOf(d Driver) (Routed, bool) {
	c, ok := d.(citus)
	return Routed{d: c}, ok
}

// ShardPlacement is a shard of the messages table and the node that
// holds it (pg_dist_placement, pg_dist_node).
type ShardPlacement struct {
	ShardID int64
	// GroupID is the node's group: 0 is the coordinator.
	GroupID int32
	Host    string
	Port    int
	// Metadata: the node holds Citus's metadata, synced (hasmetadata and
	// metadatasynced): it can plan a statement on the distributed tables.
	Metadata bool
}

// Placements reads where the shards of the messages table are: one row
// per shard and active primary node that holds a placement of it (one
// per shard, the messages table not being replicated).
func (r Routed) Placements(ctx context.Context, q Querier) ([]ShardPlacement, error) {
	rows, err := q.Query(ctx, `SELECT s.shardid, n.groupid, n.nodename, n.nodeport, n.hasmetadata AND n.metadatasynced
FROM pg_catalog.pg_dist_shard s
JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
JOIN pg_catalog.pg_dist_node n ON n.groupid = p.groupid
WHERE s.logicalrelid = pg_catalog.to_regclass($1::text) AND n.noderole = 'primary' AND n.isactive
ORDER BY s.shardid, n.nodeid`, r.d.t.Messages)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ShardPlacement, error) {
		var p ShardPlacement
		err := row.Scan(&p.ShardID, &p.GroupID, &p.Host, &p.Port, &p.Metadata)
		return p, err
	})
}

// TopicShards reads the shard of the messages table that holds each of
// topics (get_shard_id_for_distribution_column), in the order of topics.
func (r Routed) TopicShards(ctx context.Context, q Querier, topics []string) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT pg_catalog.get_shard_id_for_distribution_column($1::text::regclass, t.topic)
FROM unnest($2::text[]) WITH ORDINALITY AS t(topic, n) ORDER BY t.n`, r.d.t.Messages, topics)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// insertReturningStmt is insertMessagesStmt without the notification:
// the payloads it would have sent, one row each, computed where the
// statement runs.
func (r Routed) insertReturningStmt(p InsertMessagesParams) Stmt {
	p.NotifyChannel = ""
	s := r.d.insertMessagesStmt(p)
	s.SQL = `WITH inserted AS (
` + s.SQL + `
RETURNING topic, partition
)
SELECT DISTINCT ` + messagesPayload("t.partition", "t.topic") + ` FROM inserted t`
	return s
}

// InsertKeyed is [Driver.InsertKeyed] run on q, a worker's pool (or a
// connection to it), without notifying: it returns the 0-based indexes
// of the messages left out for their idempotency keys, and the payloads
// of the notifications to send on the coordinator once it returned
// ([Routed.Notify]). A keyed call is the keys' statement and the insert
// of the others in one transaction on the worker, as on the coordinator
// (citusInsertKeyedIn).
func (r Routed) InsertKeyed(ctx context.Context, q interface {
	Querier
	Beginner
}, p InsertMessagesParams) (left []int, payloads []string, err error) {
	if !keyed(p) {
		payloads, err = r.insertReturning(ctx, q, p)
		return nil, payloads, err
	}
	err = pgx.BeginFunc(ctx, q, func(tx pgx.Tx) error {
		out, err := skipped(ctx, tx, r.d.citusKeysStmt(p, false))
		if err != nil {
			return err
		}
		left, payloads = out, nil
		if rest, ok := leftIn(p, out); ok {
			payloads, err = r.insertReturning(ctx, tx, rest)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return left, payloads, nil
}

func (r Routed) insertReturning(ctx context.Context, q Querier, p InsertMessagesParams) ([]string, error) {
	s := r.insertReturningStmt(p)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Notify sends the notifications payloads (from [Routed.InsertKeyed]) on
// channel, one statement on q, the coordinator, which reads no table.
func (r Routed) Notify(ctx context.Context, q Querier, channel string, payloads []string) error {
	if channel == "" || len(payloads) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, `SELECT pg_catalog.pg_notify($1::text, p.payload) FROM unnest($2::text[]) AS p(payload)`, channel, payloads)
	return err
}
