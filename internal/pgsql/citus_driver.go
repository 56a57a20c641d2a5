package pgsql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The methods of the Citus driver that are not in the other citus*.go
// files: the statements whose text differs from the single node's (built
// here from the single-node builders), and one line each for the
// operations that run the single-node statement unchanged. Each such
// delegation is a decision that the statement is right on Citus as it
// is: either it reads or writes only reference tables (sessions, topics,
// delayed messages, the maintainer's row, the retention classes), or it
// runs on the coordinator, or Citus routes it to one topic's worker whole
// with nothing in it that the coordinator would evaluate in its stead.

// Tables implements Driver.
func (d citus) Tables() *Tables { return d.t }

// upsertTopicStmt is the statement of UpsertTopic on Citus, which refuses
// a function that is not immutable in DO UPDATE SET: the time there is
// the inserted row's, evaluated once on the coordinator.
func (d citus) upsertTopicStmt(p TopicParams) Stmt {
	return asCitus(d.t.upsertTopic(p, ", updated_at", ", pg_catalog.now()", "EXCLUDED.updated_at"))
}

// UpsertTopic implements Driver.
func (d citus) UpsertTopic(ctx context.Context, q Querier, p TopicParams) (UpsertTopicResult, error) {
	return upsertTopic(ctx, q, d.upsertTopicStmt(p))
}

// selectMessagesStmt is the statement of SelectMessages on Citus, routed
// to the topic's worker whole, reading below p.Bound, a bound computed on
// that worker by an earlier statement (citusBounds), with the worker's
// counter: the identity there is the worker's, which the claim read
// (p.WorkerHere), not the coordinator's (p.Here, only typed).
func (d citus) selectMessagesStmt(p SelectMessagesParams) Stmt {
	onHere, args := citusHereIs(7), append(selectMessagesArgs(p), formatXID8(p.Bound))
	if p.WorkerHere != "" {
		here, _ := splitWorkerHere(p.WorkerHere)
		onHere = `(` + citusHereIs(7) + ` AND ` + hereIs(9) + `)`
		args = append(args, here)
	}
	return d.t.selectMessages(onHere, args, `$8::text::xid8`, d.workerCounter())
}

// workerCounter is the position the topic's worker has not handed out
// yet, read by a statement that Citus routes there whole (xid8).
func (d citus) workerCounter() string {
	return d.t.WorkerCounterFunction() + `()::text::xid8`
}

// citusBoundStmt is the statement of the position bounds of one topic's
// partitions: the worker's function, called by a SELECT that Citus routes
// to the topic's worker whole (an aggregate over the topic's offset rows
// returns one row, whatever the rows).
func (d citus) citusBoundStmt(topic string, partitions []int32) Stmt {
	return Stmt{SQL: `SELECT ` + d.t.WorkerBoundFunction() + `($1::text, $2::integer[]), pg_catalog.count(*)
FROM ` + d.t.Offsets + ` o WHERE o.topic = $1 AND o.consumer_group = ''`, Args: []any{topic, partitions}}
}

// citusBounds computes the position bounds of one topic's partitions on
// its worker (decision 0008): a statement of its own, whose snapshot the
// reads that use them do not share.
func (d citus) citusBounds(ctx context.Context, q Querier, topic string, partitions []int32) ([]uint64, error) {
	s := d.citusBoundStmt(topic, partitions)
	var (
		bounds []int64
		n      int64
	)
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&bounds, &n); err != nil {
		return nil, err
	}
	if len(bounds) != len(partitions) {
		return nil, fmt.Errorf("pgsql: %d position bounds for %d partitions of topic %q", len(bounds), len(partitions), topic)
	}
	out := make([]uint64, len(bounds))
	for i, b := range bounds {
		out[i] = uint64(b)
	}
	return out, nil
}

// PositionBounds implements Driver: one statement per topic, routed to
// its worker.
func (d citus) PositionBounds(ctx context.Context, q Querier, topics []string, partitions []int32) ([]uint64, error) {
	partitions = partitionsOf(topics, partitions)
	out := make([]uint64, len(topics))
	idx := map[string][]int{}
	var order []string
	for i, tp := range topics {
		if _, ok := idx[tp]; !ok {
			order = append(order, tp)
		}
		idx[tp] = append(idx[tp], i)
	}
	for _, tp := range order {
		parts := make([]int32, len(idx[tp]))
		for j, i := range idx[tp] {
			parts[j] = partitions[i]
		}
		b, err := d.citusBounds(ctx, q, tp, parts)
		if err != nil {
			return nil, err
		}
		for j, i := range idx[tp] {
			out[i] = b[j]
		}
	}
	return out, nil
}

// citusBoundHolderStmt is the statement of BoundHolder on Citus: the
// worker's function (WorkerHolderFunction), called by a SELECT that
// Citus routes to the topic's worker whole, as the bound's statement is;
// the function's columns taken apart there.
func (d citus) citusBoundHolderStmt(topic string, partition int32) Stmt {
	cols := ""
	for i, c := range []string{"v", "pid", "gid", "application_name", "state", "xact_start", "query_start", "age_seconds", "query", "datname", "usename", "node"} {
		if i > 0 {
			cols += ", "
		}
		cols += "(h.r)." + c
	}
	return Stmt{SQL: `SELECT ` + cols + `
FROM (SELECT ` + d.t.WorkerHolderFunction() + `($1::text, $2::integer) AS r, pg_catalog.count(*)
	FROM ` + d.t.Offsets + ` o WHERE o.topic = $1 AND o.consumer_group = '') h`, Args: []any{topic, partition}}
}

// BoundHolder implements Driver: the publisher that holds the topic's
// bound lowest on its worker, as on a single node (PID a backend of the
// worker, Node the worker). Where the workers' function does not exist
// yet (tables distributed by an earlier release, until `pglease migrate
// --citus` runs again), only that the topic is held (topicOnly, no PID).
func (d citus) BoundHolder(ctx context.Context, q Querier, topic string, partition int32) (HorizonRow, bool, error) {
	s := d.citusBoundHolderStmt(topic, partition)
	var h HorizonRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan((*xid8)(&h.Xmin), &h.PID, &h.GID, &h.AppName, &h.State,
		&h.XactStart, &h.QueryStart, &h.AgeSeconds, &h.Query, &h.DB, &h.User, &h.Node)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
		return HorizonRow{}, true, nil
	}
	return h, true, err
}

// SelectMessages implements Driver: the bound computed on the topic's
// worker by a statement of its own (unless p.Bound), then the read.
func (d citus) SelectMessages(ctx context.Context, q Querier, p SelectMessagesParams) (SelectResult, error) {
	if p.Bound == 0 {
		b, err := d.citusBounds(ctx, q, p.Topic, []int32{p.Partition})
		if err != nil {
			return SelectResult{}, err
		}
		p.Bound = b[0]
	}
	res, err := selectMessages(ctx, q, d.selectMessagesStmt(p), p.Limit)
	if err == nil && !res.WentBack {
		res.Bound = p.Bound
	}
	if err == nil && res.WentBack && p.WorkerHere != "" {
		// A planned move of the topic's shard says so, and a worker
		// that went back what it was and is.
		err := d.citusWentBack(ctx, q, p.Topic, p.WorkerHere, p.After)
		var moved *ShardMovedError
		if errors.As(err, &moved) {
			return SelectResult{}, err
		}
		if wentBackSays(err) {
			res.Elsewhere = err
		}
	}
	return res, err
}

// wentBackSays reports whether err, of citusWentBack, says more than
// ErrWentBack: a planned move, or what the worker was and is.
func wentBackSays(err error) bool {
	var moved *ShardMovedError
	var back *WorkerWentBackError
	return errors.As(err, &moved) || errors.As(err, &back)
}

// selectMessagesAtStmt is the statement of SelectMessagesAt on Citus,
// routed to the topic's worker whole, as selectMessagesStmt: the
// positions compared with the worker's position sequence (its counter),
// where they were taken, not with the worker's transaction counter.
func (d citus) selectMessagesAtStmt(p SelectMessagesAtParams) Stmt {
	onHere, args := citusHereIs(5), selectMessagesAtArgs(p)
	if p.WorkerHere != "" {
		here, _ := splitWorkerHere(p.WorkerHere)
		onHere = `(` + citusHereIs(5) + ` AND ` + hereIs(7) + `)`
		args = append(args, here)
	}
	return d.t.selectMessagesAt(onHere, args, d.workerCounter())
}

// SelectMessagesAt implements Driver.
func (d citus) SelectMessagesAt(ctx context.Context, q Querier, p SelectMessagesAtParams) (SelectResult, error) {
	res, err := selectMessagesAt(ctx, q, d.selectMessagesAtStmt(p), p.Positions)
	if err == nil && res.WentBack && p.WorkerHere != "" {
		// A planned move of the topic's shard says so, and a worker
		// that went back what it was and is.
		var last Position
		for _, pos := range p.Positions {
			if positionBefore(last, pos) {
				last = pos
			}
		}
		err := d.citusWentBack(ctx, q, p.Topic, p.WorkerHere, last)
		var moved *ShardMovedError
		if errors.As(err, &moved) {
			return SelectResult{}, err
		}
		if wentBackSays(err) {
			res.Elsewhere = err
		}
	}
	return res, err
}

// The statements of the sessions and of the delayed messages' move: the
// single-node ones, their notifications cast to text (asCitus).
func (d citus) createSessionStmt(p SessionParams) Stmt    { return asCitus(d.t.CreateSession(p)) }
func (d citus) deleteSessionStmt(p SessionParams) Stmt    { return asCitus(d.t.DeleteSession(p)) }
func (d citus) setSubscriptionsStmt(p SessionParams) Stmt { return asCitus(d.t.SetSubscriptions(p)) }
func (d citus) moveDueMessagesStmt(p MoveDueParams) Stmt {
	return asCitus(d.t.moveDueMessages(p, noRegistration))
}

// CreateSession implements Driver.
func (d citus) CreateSession(ctx context.Context, q Querier, p SessionParams) (ClusterMark, error) {
	return createSession(ctx, q, d.createSessionStmt(p))
}

// DeleteSession implements Driver.
func (d citus) DeleteSession(ctx context.Context, q Querier, p SessionParams) error {
	_, err := exec(ctx, q, d.deleteSessionStmt(p))
	return err
}

// SetSubscriptions implements Driver.
func (d citus) SetSubscriptions(ctx context.Context, q Querier, p SessionParams) (bool, error) {
	return setSubscriptions(ctx, q, d.setSubscriptionsStmt(p))
}

// MoveDueMessages implements Driver: the moved messages take their
// transaction ids on their workers (the trigger of DistributeScript), as
// published ones do.
func (d citus) MoveDueMessages(ctx context.Context, q Querier, p MoveDueParams) (moved int64, nextMs *int64, err error) {
	return moveDueMessages(ctx, q, d.moveDueMessagesStmt(p))
}

// DeleteIdleGroups implements Driver with citusDeleteIdleGroups.
func (d citus) DeleteIdleGroups(ctx context.Context, q Querier, idleFor time.Duration) ([]IdleGroupRow, error) {
	return collect(ctx, q, d.citusDeleteIdleGroups(idleFor), pgx.RowToStructByPos[IdleGroupRow])
}

// DetachRetentionPartition implements Driver with
// citusDetachRetentionPartition (finalize does not apply: no detach is
// left pending there).
func (d citus) DetachRetentionPartition(ctx context.Context, q Querier, p RetentionPartition, _ bool) error {
	_, err := q.Exec(ctx, d.citusDetachRetentionPartition(p))
	return err
}

// MessagesByUUID implements Driver: for all topics, the messages of every
// topic ordered by the time they were stored (citusMessagesByUUID).
func (d citus) MessagesByUUID(ctx context.Context, q Querier, topic, id string, preview, limit int) ([]BrowseRow, error) {
	if topic == "" {
		return messagesByUUID(ctx, q, d.citusMessagesByUUID(id, preview, limit))
	}
	return d.one.MessagesByUUID(ctx, q, topic, id, preview, limit)
}

// DeleteMessagesForReplay implements Driver: the statement is routed to
// the topic's worker whole and deletes the rows by primary key.
func (d citus) DeleteMessagesForReplay(ctx context.Context, q Querier, p ReplayParams) ([]BrowseRow, error) {
	return collect(ctx, q, d.citusDeleteMessagesForReplay(p), scanBrowseRow)
}

// EstimateTopicMessages implements Driver: the estimate of the plan on
// the topic's worker, from the shard's statistics; 0 when the plan holds
// none.
func (d citus) EstimateTopicMessages(ctx context.Context, q Querier, topic string) (int64, error) {
	plan, err := explain(ctx, q, d.t.estimateTopicMessages(topic))
	if err != nil {
		return 0, err
	}
	n, _ := citusPlanRows(plan)
	return n, nil
}

// QueueAck implements Driver: the acknowledgement is several statements
// (see AckOffset), run after the batch.
func (d citus) QueueAck(_ *pgx.Batch, p OffsetParams) QueuedAck {
	return QueuedAck{d: d, p: p}
}

// insertMessagesStmt is the statement of InsertMessages on Citus: the
// single-node statement of several topics (for one topic too), with the
// retention row joined to the topics row instead of read by a correlated
// sub-select, which Citus refuses there (SQLSTATE 0A000), the placement
// decided inline (citusPlacement) and pg_notify cast to text (asCitus).
// Citus evaluates the statement's SELECT on the coordinator, sorts its rows
// by their place in the arrays and sends them to the topics' shards, where
// the trigger of DistributeScript gives each row its worker's position; a
// statement that writes to several workers commits on all of them or none.
//
// The statement holds no sub-query Citus plans apart (a sub-plan): Citus
// sends a sub-plan's result to every node that holds a placement of a
// table the statement reads, and the topics and retention tables are
// reference tables, on every node. The single-node statements have two
// (the one-topic statement's p, the clock read once by placementCheck):
// each Publish would open a transaction on every worker, commit in two
// phases on all of them, and fail while any one is down, whatever worker
// its topic lies on.
func (d citus) insertMessagesStmt(p InsertMessagesParams) Stmt {
	return asCitus(d.t.insertManyTopics(p, hashesOf(p), `LEFT JOIN `+d.t.Retention+` l ON l.retention_class = tp.retention_class`,
		citusPlacement("tp", "l"), noRegistration))
}

// citusPlacement is [Tables.placement] for Citus, decided from the topics
// row tp and the retention row l joined to it (placementJoined's
// decision) without a sub-query: the expiry counts from the statement's
// start (statement_timestamp(), which Citus evaluates once, on the
// coordinator), not from a read of the clock during the statement (a
// volatile function in a sub-query, which Citus would plan apart). The
// difference is the time the statement ran before the rows were made: a
// message's expiry lies that much earlier, and still within the
// partitions the maintainer keeps (it detaches a partition only once
// its whole range has passed, a retention after the statement began).
func citusPlacement(tp, l string) string {
	exp := `pg_catalog.statement_timestamp() + ` + tp + `.retention`
	ok := tp + `.retention_class > 0 AND ` + exp + ` < ` + l + `.usable_until`
	return `CASE WHEN ` + ok + ` THEN ` + tp + `.retention_class ELSE 0 END AS rc,
	CASE WHEN ` + ok + ` THEN ` + exp + ` ELSE 'infinity' END AS exp`
}

// InsertMessages implements Driver with the statements of
// insertThroughCoordinator (insertMessagesStmt on a Querier that is not
// a pool, a connection or a transaction), or, when a message has an
// idempotency key, with the keys' statement and then insertMessagesStmt,
// in one transaction (citusInsertKeyed). The keys
// table is distributed by topic, co-located with the messages table
// (migration 15), so that a topic's keys live on its messages' worker,
// and a keyed Publish to one topic writes on that worker only.
func (d citus) InsertMessages(ctx context.Context, q Querier, p InsertMessagesParams) error {
	_, err := d.InsertKeyed(ctx, q, p)
	return err
}

// InsertKeyed implements Driver (see InsertMessages).
func (d citus) InsertKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	if keyed(p) {
		return d.citusInsertKeyed(ctx, q, p)
	}
	if ok, err := d.insertThroughCoordinator(ctx, q, p); ok {
		return nil, err
	}
	_, err := exec(ctx, q, d.insertMessagesStmt(p))
	return nil, err
}

// InsertDelayed implements Driver: the delayed table is a reference
// table, written on every node; with keys, the keyed statement of both
// drivers, which writes the keys on their topics' workers besides.
func (d citus) InsertDelayed(ctx context.Context, q Querier, p InsertMessagesParams) error {
	_, err := d.InsertDelayedKeyed(ctx, q, p)
	return err
}

// InsertDelayedKeyed implements Driver (see InsertDelayed).
func (d citus) InsertDelayedKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	if keyed(p) {
		return skipped(ctx, q, d.t.insertDelayedKeyed(p, false))
	}
	return nil, d.one.InsertDelayed(ctx, q, p)
}

// ForgetKeys implements Driver: the owner's function truncates the
// partitions, which Citus propagates to its shards.
func (d citus) ForgetKeys(ctx context.Context, q Querier) (int, error) {
	return d.one.ForgetKeys(ctx, q)
}

// KeyLanes implements Driver: the coordinator's tables.
func (d citus) KeyLanes(ctx context.Context, q Querier) ([]KeyLane, error) {
	return d.one.KeyLanes(ctx, q)
}

// AddKeyPartitions implements Driver: the owner's function makes the
// partitions of the distributed keys table, which Citus distributes.
func (d citus) AddKeyPartitions(ctx context.Context, q Querier, class int) (bool, error) {
	return d.one.AddKeyPartitions(ctx, q, class)
}

// KeysLockHolders implements Driver: the coordinator's locks, where
// every statement on the keys table is planned (and routed).
func (d citus) KeysLockHolders(ctx context.Context, q Querier) ([]string, error) {
	return d.one.KeysLockHolders(ctx, q)
}

// SetKeysSince implements Driver.
func (d citus) SetKeysSince(ctx context.Context, q Querier, class int) (bool, error) {
	return d.one.SetKeysSince(ctx, q, class)
}

// The operations whose single-node statement runs unchanged on Citus.

func (d citus) TopicPartitions(ctx context.Context, q Querier, topics []string) (map[string]int, error) {
	return d.one.TopicPartitions(ctx, q, topics)
}

func (d citus) HeartbeatSession(ctx context.Context, q Querier, p SessionParams) (HeartbeatRow, error) {
	return d.one.HeartbeatSession(ctx, q, p)
}

func (d citus) DeleteExpiredSessions(ctx context.Context, q Querier, ttl time.Duration) (int64, error) {
	return d.one.DeleteExpiredSessions(ctx, q, ttl)
}

func (d citus) GroupMembers(ctx context.Context, q Querier, group string) ([]MemberRow, error) {
	return d.one.GroupMembers(ctx, q, group)
}

func (d citus) OffsetOwners(ctx context.Context, q Querier, group string, topics []string) ([]OwnerRow, error) {
	return d.one.OffsetOwners(ctx, q, group, topics)
}

func (d citus) InspectSessions(ctx context.Context, q Querier) ([]SessionRow, error) {
	return d.one.InspectSessions(ctx, q)
}

func (d citus) InspectHorizon(ctx context.Context, q Querier) (HorizonRow, error) {
	return d.one.InspectHorizon(ctx, q)
}

func (d citus) MaintainerAccess(ctx context.Context, q Querier) (AccessRow, error) {
	return d.one.MaintainerAccess(ctx, q)
}

func (d citus) MaintainerHolder(ctx context.Context, q Querier) (HolderRow, error) {
	return d.one.MaintainerHolder(ctx, q)
}

// ClaimMaintainer is [Driver.ClaimMaintainer] behind a gate: one
// candidate at a time runs the claim, the others return at once, not
// claimed and the holder unknown, and read the row again later. On Citus
// the claim writes two reference tables (the expired holder's session is
// deleted in the same statement): each run, whether it claims or not,
// takes Citus's lock on both tables' shards, on every node, until its
// two-phase commit ends. Candidates that all find the row free at once
// (the maintainer closed, a group of Subscribers started) would queue on
// those locks one after the other, and every heartbeat, session and
// Close of the cluster behind them: 50 Subscribers closed one by one
// made Close's session delete miss its CloseTimeout. The gate is a
// transaction-level advisory lock on the node the client is connected
// to, tried, never waited for (maintainerGateStmt); the claim runs in the
// same transaction. q without transactions (none in pglease) claims
// ungated.
func (d citus) ClaimMaintainer(ctx context.Context, q Querier, p MaintainerParams) (HolderRow, error) {
	b, ok := q.(Beginner)
	if !ok {
		return d.one.ClaimMaintainer(ctx, q, p)
	}
	var r HolderRow
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		var open bool
		g := d.maintainerGateStmt()
		if err := tx.QueryRow(ctx, g.SQL, g.Args...).Scan(&open); err != nil || !open {
			return err
		}
		var err error
		r, err = d.one.ClaimMaintainer(ctx, tx, p)
		return err
	})
	return r, err
}

// maintainerGateStmt tries the gate of ClaimMaintainer: true when this
// transaction holds it now. The key is the schema's (Tables.LockKey), so
// that the schemas of one database have gates of their own.
func (d citus) maintainerGateStmt() Stmt {
	return Stmt{SQL: `SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1::text, 0::bigint))`,
		Args: []any{d.t.LockKey + " maintainer claim"}}
}

func (d citus) ReleaseMaintainer(ctx context.Context, q Querier, p MaintainerParams) error {
	return d.one.ReleaseMaintainer(ctx, q, p)
}

func (d citus) RetentionLanes(ctx context.Context, q Querier) ([]LaneRow, error) {
	return d.one.RetentionLanes(ctx, q)
}

// MessagesLockHolders reads the coordinator's locks: a transaction
// through the coordinator holds the distributed table there, and its
// statements on the workers' shards end with it.
func (d citus) MessagesLockHolders(ctx context.Context, q Querier) ([]string, error) {
	return d.one.MessagesLockHolders(ctx, q)
}

func (d citus) SetUsableUntil(ctx context.Context, q Querier, class int, until time.Time) (bool, error) {
	return d.one.SetUsableUntil(ctx, q, class, until)
}

func (d citus) RetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error) {
	return d.one.RetentionPartitions(ctx, q)
}

func (d citus) DetachedRetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error) {
	return d.one.DetachedRetentionPartitions(ctx, q)
}

func (d citus) CreateRetentionPartition(ctx context.Context, db Beginner, p RetentionPartition) error {
	return d.one.CreateRetentionPartition(ctx, db, p)
}

func (d citus) DropRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) error {
	return d.one.DropRetentionPartition(ctx, q, p)
}

func (d citus) CallAddRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	return d.one.CallAddRetentionPartition(ctx, q, p)
}

func (d citus) CallExpireRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	return d.one.CallExpireRetentionPartition(ctx, q, p)
}

func (d citus) CallDropDetachedPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	return d.one.CallDropDetachedPartition(ctx, q, p)
}

func (d citus) UnacknowledgedInPartition(ctx context.Context, q Querier, p RetentionPartition) ([]SkippedRow, error) {
	return d.one.UnacknowledgedInPartition(ctx, q, p)
}

func (d citus) MessagesNewestFirst(ctx context.Context, q Querier, p BrowseParams) ([]BrowseRow, error) {
	return d.one.MessagesNewestFirst(ctx, q, p)
}

func (d citus) TopicDetail(ctx context.Context, q Querier, topic string, schema int) (TopicDetailRow, error) {
	return d.one.TopicDetail(ctx, q, topic, schema)
}

func (d citus) GroupLiveOwners(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error) {
	return d.one.GroupLiveOwners(ctx, q, group)
}

func (d citus) DeleteGroupOffsets(ctx context.Context, q Querier, group string, locked []GroupOffsetRow) (DeleteGroupOffsetsResult, error) {
	return d.one.DeleteGroupOffsets(ctx, q, group, locked)
}
