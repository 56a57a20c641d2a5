package pgsql

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Shard moves, told apart from a worker that went back.
//
// The statements of a claim routed to its topic's worker check the
// worker's identity read when the row was claimed ([ClaimRow.WorkerHere]).
// A move of the topic's shard to another worker (citus_move_shard_placement:
// `pglease move-shard`, `pglease rebalance`) fails that check as a failover
// of the worker does, and the Subscriber resynchronises either way: it
// drops the positions it holds in memory and claims again from the ones
// committed. But a move is planned and loses nothing (Citus copies the
// shard with its writes blocked), so it is logged as what it is.
//
// What tells them apart is Citus's catalog on the coordinator: a
// placement's node group changes only when the shard moves, while a
// worker failed over or restarted keeps its group (citus_update_node gives
// the group another host). So the claim reads, after it read the workers'
// identities, the group of each claimed topic's placement
// (pg_dist_placement, which every role may read) and keeps it in
// WorkerHere after the identity ("identity@group"). When a statement then
// finds another identity, [citus.citusWentBack] reads the topic's worker
// again and its placement: the group changed since the claim and the
// position lies below the new worker's counter (its position sequence was
// raised before the move, as the move scripts do) is a planned move,
// reported as a [ShardMovedError]; anything else as [ErrWentBack].
//
// The group is read after the identities: a move that completes between
// the two reads leaves the identity of the source with the group of the
// target, which a later statement reports as the worker going back (the
// safe side: logged as an error, resynchronised the same). A claim whose
// group could not be read (more than one placement, the catalog not
// readable) keeps none, and every identity change is reported as going
// back.

// ShardMovedError is the error of a statement of a claim that found its
// topic's shard on another worker than when the row was claimed, moved
// there since by a planned move: the placement's node group changed and
// the position read lies below that worker's counter. It is an
// [ErrWentBack]: the claim must be made again.
type ShardMovedError struct {
	Topic string
	// Shard is the shard's id.
	Shard int64
	// From and To are the workers (host:port) of the node groups the
	// shard was on when the row was claimed and is on now; From is the
	// group's number when it has no node any more.
	From, To string
}

func (e *ShardMovedError) Error() string {
	return fmt.Sprintf("the shard of topic %q (shard %d) moved from worker %s to worker %s", e.Topic, e.Shard, e.From, e.To)
}

// Unwrap makes a ShardMovedError an ErrWentBack.
func (e *ShardMovedError) Unwrap() error { return ErrWentBack }

// WorkerWentBackError is the error of a statement of a claim on Citus
// that found its topic's worker elsewhere than the claim did, or the
// claim's position not below that worker's counter, and no planned move
// of the topic's shard: the worker went back (a failover to a standby
// that lagged, a restore). It is an [ErrWentBack]; it says what the
// worker was and is, where the session's own marks are the
// coordinator's.
type WorkerWentBackError struct {
	Topic string
	// Position is the position the claim held, Counter the position the
	// topic's worker hands out next (its position sequence).
	Position, Counter uint64
	// Before and Now are the worker's identity (see [Here]) when the row
	// was claimed and now.
	Before, Now string
}

func (e *WorkerWentBackError) Error() string {
	return fmt.Sprintf("the worker of topic %q went back: identity %s when claimed, %s now; position %d, the worker's counter %d",
		e.Topic, e.Before, e.Now, e.Position, e.Counter)
}

// Unwrap makes a WorkerWentBackError an ErrWentBack.
func (e *WorkerWentBackError) Unwrap() error { return ErrWentBack }

// workerGroupMark separates a worker's identity from its node group in
// [ClaimRow.WorkerHere] (an identity has no such character, see here).
const workerGroupMark = "@"

// splitWorkerHere returns the worker's identity of a WorkerHere and the
// node group the claim found the topic's shard in (0: not known).
func splitWorkerHere(workerHere string) (here string, group int64) {
	here, g, ok := strings.Cut(workerHere, workerGroupMark)
	if !ok {
		return workerHere, 0
	}
	n, err := strconv.ParseInt(g, 10, 64)
	if err != nil {
		return here, 0
	}
	return here, n
}

// placementGroupsSQL reads the node group of each topic's shard
// placement ($1, the topics) on the coordinator, leaving out a topic whose
// shard has more than one placement.
func (d citus) placementGroupsSQL() string {
	return `SELECT t.topic, pg_catalog.min(p.groupid)
FROM pg_catalog.unnest($1::text[]) AS t(topic)
JOIN pg_catalog.pg_dist_placement p
	ON p.shardid = pg_catalog.get_shard_id_for_distribution_column(` + quoteLiteral(d.t.Messages) + `::regclass, t.topic)
GROUP BY t.topic HAVING pg_catalog.count(*) = 1`
}

// withPlacementGroups adds to the WorkerHere of each row the claim took
// the node group of its topic's placement, read now (after the rows'
// identities). When the groups cannot be read, the rows keep the
// identity alone: the claim stands, and a move of their shards will be
// reported as the worker going back.
func (d citus) withPlacementGroups(ctx context.Context, q Querier, out []ClaimRow) {
	var topics []string
	for _, r := range out {
		if r.Kind == ClaimTaken && r.WorkerHere != "" && !slices.Contains(topics, r.Topic) {
			topics = append(topics, r.Topic)
		}
	}
	if len(topics) == 0 {
		return
	}
	rows, err := q.Query(ctx, d.placementGroupsSQL(), topics)
	if err != nil {
		return
	}
	groups := map[string]int64{}
	for rows.Next() {
		var (
			topic string
			group int64
		)
		if rows.Scan(&topic, &group) == nil {
			groups[topic] = group
		}
	}
	if rows.Err() != nil {
		return
	}
	for i, r := range out {
		if g, ok := groups[r.Topic]; ok && r.Kind == ClaimTaken && r.WorkerHere != "" {
			out[i].WorkerHere = r.WorkerHere + workerGroupMark + strconv.FormatInt(g, 10)
		}
	}
}

// citusWentBack is the error of a statement of a claim on topic that
// found its worker elsewhere than the claim did (workerHere) or pos not
// below its counter: a [ShardMovedError] when the topic's shard moved to
// another node group since the claim and pos lies below the counter of
// the worker it is on now; otherwise (or when that cannot be read)
// [ErrWentBack].
func (d citus) citusWentBack(ctx context.Context, q Querier, topic, workerHere string, pos Position) error {
	here, group := splitWorkerHere(workerHere)
	s, err := d.citusWorkerSnapshot(ctx, q, "", topic)
	if err != nil {
		return ErrWentBack
	}
	back := &WorkerWentBackError{Topic: topic, Position: pos.TransactionID, Counter: s.counter, Before: here, Now: s.here}
	if group == 0 || s.here == here || pos.TransactionID >= s.counter {
		return back
	}
	var (
		moved    ShardMovedError
		now      int64
		from, to *string
	)
	err = q.QueryRow(ctx, `SELECT p.shardid, p.groupid,
	(SELECT n.nodename || ':' || n.nodeport FROM pg_catalog.pg_dist_node n WHERE n.groupid = $2 ORDER BY n.noderole <> 'primary', n.nodeid LIMIT 1),
	(SELECT n.nodename || ':' || n.nodeport FROM pg_catalog.pg_dist_node n WHERE n.groupid = p.groupid ORDER BY n.noderole <> 'primary', n.nodeid LIMIT 1)
FROM pg_catalog.pg_dist_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column(`+quoteLiteral(d.t.Messages)+`::regclass, $1::text)
	AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_placement o WHERE o.shardid = p.shardid) = 1`,
		topic, group).Scan(&moved.Shard, &now, &from, &to)
	if err != nil || now == group {
		// (No row: more than one placement.)
		return back
	}
	moved.Topic, moved.From, moved.To = topic, "group "+strconv.FormatInt(group, 10), "group "+strconv.FormatInt(now, 10)
	if from != nil {
		moved.From = *from
	}
	if to != nil {
		moved.To = *to
	}
	return &moved
}
