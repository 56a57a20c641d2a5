package pgsql

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The consumer's statements where the tables are distributed by Citus.
//
// The single-node statements decide in one statement what the topic's
// worker must decide: in an INSERT, UPDATE or DELETE, Citus evaluates
// pg_current_snapshot() (and now()) on the coordinator, even in a
// sub-select routed to the worker, so a position compared there would be
// compared with the coordinator's counter, which says nothing of the
// worker's transactions; and it refuses the claim's correlated sub-selects
// over common table expressions and the idle poll's lateral join. So on
// Citus:
//
//   - the worker's snapshot is read by a SELECT that Citus routes to the
//     topic's worker whole ([Tables.citusWorkerSnapshot]), and the fenced
//     statements check the position against it before writing: the
//     counter only grows, so a position below the counter read before the
//     write is below it at the write too;
//   - a claim is a few statements per topic: read the group's rows of the
//     topic with their owners' sessions (a reference table, joined on the
//     worker), delete the expired owners' sessions (on every node), then
//     move each free row to the session by a compare-and-swap on
//     (session_id, epoch), as the single-node claim does;
//   - the idle poll asks each worker once about all the (topic,
//     partition) rows whose shards it holds: a SELECT routed whole to
//     the worker of one of them calls the workers' function
//     (WorkerVisibleFunction), which probes each shard of the worker
//     by a statement of its own there, with the worker's counter;
//   - notifications are sent by statements that run on the coordinator,
//     where the Subscribers listen: a pg_notify in a statement routed to a
//     worker would notify that worker's listeners only.
//
// The session's identity (see [Here]) is the coordinator's: the claim
// checks it there. The claim also reads the identity of the topic's
// worker ([ClaimRow.WorkerHere]), and the statements of the claim routed
// to that worker (reads, commits, releases, delivery counts, AckInTx)
// check it there as well as that the position lies below the worker's
// counter: a worker restarted, failed over or replaced by a copy fences
// them as the coordinator's identity fences the session's, and so does a
// move of the topic's shard to another worker.

// citusSnapshot is what [Tables.citusWorkerSnapshot] reads on a topic's
// worker.
type citusSnapshot struct {
	// counter is the position the worker's sequence hands out next.
	counter uint64
	// here is the worker's identity (see [Here]).
	here string
	// groupRows counts the group's offset rows of the topic.
	groupRows int64
}

// citusWorkerSnapshot reads the position counter and the identity of
// the worker that holds topic's shard, and the number of group's offset
// rows of the topic. An aggregate without GROUP BY returns one row even
// where the topic has no row; filtered on the topic, Citus routes the
// whole statement, the functions included, to the topic's worker.
func (d citus) citusWorkerSnapshot(ctx context.Context, q Querier, group, topic string) (citusSnapshot, error) {
	var s citusSnapshot
	err := q.QueryRow(ctx, `SELECT `+d.workerCounter()+`::text, pg_catalog.count(*), `+here+`
FROM `+d.t.Offsets+` WHERE consumer_group = $1 AND topic = $2`, group, topic).
		Scan((*xid8)(&s.counter), &s.groupRows, &s.here)
	return s, err
}

// EnsureOffsets is [Driver.EnsureOffsets] on Citus: one INSERT per topic,
// every partition of the topic in it, starting, with p.Latest and for a
// group without a row of the topic, just below each partition's position
// bound on the topic's worker, computed by a statement before (as the
// single-node statement starts: (bound - 1, the largest offset)).
func (d citus) EnsureOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]EnsuredRow, error) {
	var out []EnsuredRow
	for _, tp := range byTopic(p.Topics, p.Partitions) {
		starts := make([]string, len(tp.partitions))
		offsets := make([]int64, len(tp.partitions))
		for i := range starts {
			starts[i] = "0"
		}
		if p.Latest {
			s, err := d.citusWorkerSnapshot(ctx, q, p.ConsumerGroup, tp.topic)
			if err != nil {
				return nil, err
			}
			if s.groupRows == 0 {
				bounds, err := d.citusBounds(ctx, q, tp.topic, tp.partitions)
				if err != nil {
					return nil, err
				}
				for i, b := range bounds {
					starts[i], offsets[i] = formatXID8(b-1), math.MaxInt64
				}
			}
		}
		rows, err := collect(ctx, q, Stmt{
			SQL: `INSERT INTO ` + d.t.Offsets + ` AS o (consumer_group, topic, partition, acked_transaction_id, acked_offset)
SELECT $1, $2, p.partition, p.start::xid8, p.off
FROM unnest($3::integer[], $4::text[], $5::bigint[]) AS p(partition, start, off)
ORDER BY p.partition
ON CONFLICT (consumer_group, topic, partition) DO NOTHING
RETURNING o.topic, o.partition, o.acked_transaction_id::text`,
			Args: []any{p.ConsumerGroup, tp.topic, tp.partitions, starts, offsets},
		}, func(row pgx.CollectableRow) (EnsuredRow, error) {
			var r EnsuredRow
			err := row.Scan(&r.Topic, &r.Partition, (*xid8)(&r.AckedTransactionID))
			return r, err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

// topicRows is one topic's partitions among a statement's rows.
type topicRows struct {
	topic      string
	partitions []int32
}

// byTopic groups the (topic, partition) rows by topic, in topic order,
// each topic's partitions in order.
func byTopic(topics []string, partitions []int32) []topicRows {
	partitions = partitionsOf(topics, partitions)
	idx := map[string]int{}
	var out []topicRows
	for i, tp := range topics {
		j, ok := idx[tp]
		if !ok {
			j = len(out)
			idx[tp] = j
			out = append(out, topicRows{topic: tp})
		}
		out[j].partitions = append(out[j].partitions, partitions[i])
	}
	slices.SortFunc(out, func(a, b topicRows) int {
		switch {
		case a.topic < b.topic:
			return -1
		case a.topic > b.topic:
			return 1
		}
		return 0
	})
	for _, tp := range out {
		slices.Sort(tp.partitions)
	}
	return out
}

// citusCandidate is a row the claim may take, as the topic's worker shows
// it: its owner and whether the owner's session is gone or expired.
type citusCandidate struct {
	partition int32
	session   *uuid.UUID
	epoch     int64
	ownerRow  bool // the owner's session row exists
	owner     *string
	expired   bool
	future    bool
	here      string // the worker's identity
}

// ClaimOffsets is [Driver.ClaimOffsets] on Citus. It checks the session's
// identity on the coordinator, then, topic by topic in order until
// p.Limit rows were found that it can claim (or are missing or ahead of
// the counter), reads the group's rows of the topic and their owners on
// the topic's worker, deletes the sessions of the expired owners (the
// heartbeat of an owner and the delete conflict on the session row, as in
// the single-node claim: only a delete that went through frees the row),
// and claims each free row with a compare-and-swap on (session_id,
// epoch): a row another claim changed in between is reported lost.
func (d citus) ClaimOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]ClaimRow, error) {
	var ok bool
	if err := q.QueryRow(ctx, `SELECT `+hereIs(1), p.Here).Scan(&ok); err != nil {
		return nil, err
	}
	if !ok {
		return []ClaimRow{{Kind: ClaimWentBack}}, nil
	}
	var out []ClaimRow
	for _, tp := range byTopic(p.Topics, p.Partitions) {
		if p.Limit > 0 && len(out) >= p.Limit {
			break
		}
		cands, err := d.citusClaimCandidates(ctx, q, p, tp)
		if err != nil {
			return nil, err
		}
		byPartition := make(map[int32]citusCandidate, len(cands))
		for _, c := range cands {
			byPartition[c.partition] = c
		}
		// The topic's rows that the claim looks at, in order, bounded by
		// what is left of the limit: missing, ahead of the counter, or
		// free (no owner, the claimer, a gone or an expired owner); a row
		// of a live owner is left out, as in the single-node claim.
		type pending struct {
			row ClaimRow
			c   citusCandidate
		}
		var rows []pending
		var expired []uuid.UUID
		for _, part := range tp.partitions {
			if p.Limit > 0 && len(out)+len(rows) >= p.Limit {
				break
			}
			c, ok := byPartition[part]
			other := ok && c.session != nil && *c.session != p.SessionID
			switch {
			case !ok:
				rows = append(rows, pending{row: ClaimRow{Kind: ClaimMissing, Topic: tp.topic, Partition: part}})
			case other && c.ownerRow && !c.expired:
				// owned by a live session
			case c.future:
				rows = append(rows, pending{row: ClaimRow{Kind: ClaimFuture, Topic: tp.topic, Partition: part}})
			default:
				rows = append(rows, pending{row: ClaimRow{Kind: ClaimLost, Topic: tp.topic, Partition: part}, c: c})
				if other && c.ownerRow {
					expired = append(expired, *c.session)
				}
			}
		}
		deleted := map[uuid.UUID]bool{}
		if len(expired) > 0 {
			ids, err := collect(ctx, q, Stmt{
				SQL:  `DELETE FROM ` + d.t.Sessions + ` s WHERE s.id = ANY ($1::uuid[]) AND s.expires_at < pg_catalog.now() RETURNING s.id`,
				Args: []any{expired},
			}, pgx.RowTo[uuid.UUID])
			if err != nil {
				return nil, err
			}
			for _, id := range ids {
				deleted[id] = true
			}
		}
		for _, r := range rows {
			if r.row.Kind == ClaimLost {
				if taken, err := d.citusClaimRow(ctx, q, p, tp.topic, r.c, deleted); err != nil {
					return nil, err
				} else if taken != nil {
					r.row = *taken
				}
			}
			out = append(out, r.row)
		}
	}
	d.withPlacementGroups(ctx, q, out)
	return out, nil
}

// citusClaimRow claims the free row c for p.SessionID by a compare-and-swap
// on the (session_id, epoch) read, unless its owner was expired and the
// delete of its session did not go through (its heartbeat came first). It
// returns the claimed row, or nil when the row was not taken (lost).
func (d citus) citusClaimRow(ctx context.Context, q Querier, p OffsetsParams, topic string, c citusCandidate,
	deleted map[uuid.UUID]bool) (*ClaimRow, error) {
	other := c.session != nil && *c.session != p.SessionID
	if other && c.ownerRow && !deleted[*c.session] {
		return nil, nil
	}
	var (
		epoch  int64
		txID   xid8
		offset int64
		above  []string
	)
	err := q.QueryRow(ctx, `UPDATE `+d.t.Offsets+` o
SET session_id = $4, epoch = o.epoch + 1, updated_at = pg_catalog.now()
WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3
	AND o.session_id IS NOT DISTINCT FROM $5::uuid AND o.epoch = $6
RETURNING o.epoch, o.acked_transaction_id::text, o.acked_offset,
	`+aboveAfter("o.acked_above", "o.acked_transaction_id", "o.acked_offset"),
		p.ConsumerGroup, topic, c.partition, p.SessionID, c.session, c.epoch).Scan(&epoch, &txID, &offset, &above)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	acked, err := parseAbove(above)
	if err != nil {
		return nil, fmt.Errorf("claim topic %q partition %d: %w", topic, c.partition, err)
	}
	r := &ClaimRow{Kind: ClaimTaken, Topic: topic, Partition: c.partition, Epoch: epoch,
		Acked: Position{TransactionID: uint64(txID), Offset: offset}, AckedAbove: acked,
		// Not read: the consumer reads at once, finding out.
		HasNext: true, WorkerHere: c.here}
	if other {
		r.Previous = *c.session
		if c.owner != nil {
			r.PreviousOwner = *c.owner
		}
	}
	return r, nil
}

// citusClaimCandidates reads the group's rows of one topic on its worker,
// with their owners' sessions (a reference table, joined there); a row
// whose position lies at or above the worker's counter is marked future.
func (d citus) citusClaimCandidates(ctx context.Context, q Querier, p OffsetsParams, tp topicRows) ([]citusCandidate, error) {
	t := d.t
	rows, err := q.Query(ctx, `SELECT o.partition, o.session_id, o.epoch, s.id IS NOT NULL, s.owner,
	COALESCE(s.expires_at < pg_catalog.now(), false),
	o.acked_transaction_id >= `+d.workerCounter()+`, `+here+`
FROM `+t.Offsets+` o LEFT JOIN `+t.Sessions+` s ON s.id = o.session_id
WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = ANY ($3::integer[])`,
		p.ConsumerGroup, tp.topic, tp.partitions)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (citusCandidate, error) {
		var c citusCandidate
		err := row.Scan(&c.partition, &c.session, &c.epoch, &c.ownerRow, &c.owner, &c.expired, &c.future, &c.here)
		return c, err
	})
}

// VisibleTopics is [Driver.VisibleTopics] on Citus: a statement per
// worker that holds some of the rows, each routed to the worker whole,
// where the workers' function (WorkerVisibleFunction) probes the rows of
// its shards with the worker's counter and snapshots (see
// citusVisibleByWorker); the rows no worker answered for (the function
// missing on a worker, or shards that kept moving while the poll asked),
// and every row where the tables were distributed by an earlier release,
// by a SELECT per row (citusVisibleByRow). The indexes are returned in
// ascending order.
func (d citus) VisibleTopics(ctx context.Context, q Querier, p VisibleTopicsParams) ([]int64, error) {
	partitions := partitionsOf(p.Topics, p.Partitions)
	rows := make([]int, len(p.Topics))
	for i := range rows {
		rows[i] = i
	}
	var out []int64
	if d.pollPerWorker && len(rows) > 0 {
		visible, left, err := d.citusVisibleByWorker(ctx, q, p, partitions, rows)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42883": // undefined_function
			// A worker added since `pglease migrate --citus` ran has
			// none of the workers' functions: its rows, and every other
			// row this poll, probed one by one (the reads of its topics
			// fail on it anyway).
		case err != nil:
			return nil, err
		default:
			out, rows = visible, left
		}
	}
	if len(rows) > 0 {
		visible, err := d.citusVisibleByRow(ctx, q, p, partitions, rows)
		if err != nil {
			return nil, err
		}
		out = append(out, visible...)
	}
	slices.Sort(out)
	return out, nil
}

// citusVisibleRounds bounds the rounds of citusVisibleByWorker: the
// first asks one worker, the second the workers that the first named;
// more only while shards move.
const citusVisibleRounds = 3

// citusVisibleStmt is the statement that asks the worker holding the
// shard of rows' first topic about rows: the workers' function, called
// by a SELECT that Citus routes to that topic's worker whole, as the
// bound's statement is, its columns taken apart there.
func (d citus) citusVisibleStmt(p VisibleTopicsParams, partitions []int32, rows []int) Stmt {
	topics := make([]string, len(rows))
	parts := make([]int32, len(rows))
	txIDs := make([]string, len(rows))
	offsets := make([]int64, len(rows))
	for j, i := range rows {
		topics[j], parts[j] = p.Topics[i], partitions[i]
		txIDs[j], offsets[j] = formatXID8(p.Positions[i].TransactionID), p.Positions[i].Offset
	}
	return Stmt{SQL: `SELECT (v.r).visible, (v.r).away, (v.r).away_groups
FROM (SELECT ` + d.t.WorkerVisibleFunction() + `($2::text[], $3::integer[], $4::text[], $5::bigint[]) AS r, pg_catalog.count(*)
	FROM ` + d.t.Offsets + ` o WHERE o.topic = $1 AND o.consumer_group = '') v`,
		Args: []any{topics[0], topics, parts, txIDs, offsets}}
}

// citusVisibleByWorker runs the idle poll of rows (indexes into p) a
// worker at a time: first one statement routed to the worker of the
// first row's topic, which answers for every row whose shard it holds
// and names the node of each other row; then one statement per node
// named (sent as one pipelined batch when q can), and so on for at most
// citusVisibleRounds rounds. A poll costs a statement per worker that
// holds some of the rows, whatever their number. It returns the
// (1-based) indexes of the visible rows and the rows left unanswered.
func (d citus) citusVisibleByWorker(ctx context.Context, q Querier, p VisibleTopicsParams, partitions []int32,
	rows []int) (visible []int64, left []int, err error) {
	asks := [][]int{rows}
	for round := 0; round < citusVisibleRounds && len(asks) > 0; round++ {
		stmts := make([]Stmt, len(asks))
		for k, ask := range asks {
			stmts[k] = d.citusVisibleStmt(p, partitions, ask)
		}
		replies, err := queryEach(ctx, q, stmts, func(row pgx.Row) (citusVisibleReply, error) {
			var r citusVisibleReply
			err := row.Scan(&r.visible, &r.away, &r.awayGroups)
			return r, err
		})
		if err != nil {
			return nil, nil, err
		}
		byGroup := map[int32][]int{}
		var groups []int32
		for k, r := range replies {
			ask := asks[k]
			if len(r.away) != len(r.awayGroups) {
				return nil, nil, fmt.Errorf("pgsql: the idle poll of a worker named %d nodes for %d rows elsewhere", len(r.awayGroups), len(r.away))
			}
			for _, n := range r.visible {
				if n < 1 || int(n) > len(ask) {
					return nil, nil, fmt.Errorf("pgsql: the idle poll of a worker answered row %d of %d", n, len(ask))
				}
				visible = append(visible, int64(ask[n-1]+1))
			}
			for j, n := range r.away {
				if n < 1 || int(n) > len(ask) {
					return nil, nil, fmt.Errorf("pgsql: the idle poll of a worker answered row %d of %d", n, len(ask))
				}
				g := r.awayGroups[j]
				if g < 0 {
					// No placement known: probed by its own statement.
					left = append(left, ask[n-1])
					continue
				}
				if _, ok := byGroup[g]; !ok {
					groups = append(groups, g)
				}
				byGroup[g] = append(byGroup[g], ask[n-1])
			}
		}
		asks = asks[:0]
		for _, g := range groups {
			asks = append(asks, byGroup[g])
		}
	}
	for _, ask := range asks {
		left = append(left, ask...)
	}
	return visible, left, nil
}

// citusVisibleReply is a worker's answer to citusVisibleStmt: the
// visible rows among those it was asked about, the rows whose shards
// lie elsewhere (1-based) and the group of the node of each.
type citusVisibleReply struct {
	visible, away []int32
	awayGroups    []int32
}

// queryEach runs stmts, each returning one row, as one pipelined batch
// when q can send one, else one after the other, and scans each row.
func queryEach[T any](ctx context.Context, q Querier, stmts []Stmt, scan func(pgx.Row) (T, error)) ([]T, error) {
	out := make([]T, 0, len(stmts))
	if b, ok := q.(batcher); ok && len(stmts) > 1 {
		batch := &pgx.Batch{}
		for _, s := range stmts {
			batch.Queue(s.SQL, s.Args...)
		}
		res := b.SendBatch(ctx, batch)
		for range stmts {
			v, err := scan(res.QueryRow())
			if err != nil {
				_ = res.Close()
				return nil, err
			}
			out = append(out, v)
		}
		return out, res.Close()
	}
	for _, s := range stmts {
		v, err := scan(q.QueryRow(ctx, s.SQL, s.Args...))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// citusVisibleProbe is the statement of citusVisibleByRow: one row,
// routed to its topic's worker whole, the snapshot and the counter the
// worker's.
func (d citus) citusVisibleProbe() string {
	return `SELECT EXISTS (SELECT 1 FROM ` + d.t.Messages + ` m
	WHERE m.topic = $1 AND m.partition = $2 AND ` + d.t.classesOf("$1") + `
		AND (m.transaction_id, m."offset") > ($3::text::xid8, $4::bigint)
		AND m.transaction_id < ` + d.workerCounter() + `)`
}

// citusVisibleByRow runs the idle poll of rows (indexes into p) a
// SELECT per row (citusVisibleProbe), sent as one pipelined batch when
// q can, and returns the (1-based) indexes of the visible rows.
func (d citus) citusVisibleByRow(ctx context.Context, q Querier, p VisibleTopicsParams, partitions []int32, rows []int) ([]int64, error) {
	sql := d.citusVisibleProbe()
	stmts := make([]Stmt, len(rows))
	for j, i := range rows {
		stmts[j] = Stmt{SQL: sql, Args: []any{p.Topics[i], partitions[i], formatXID8(p.Positions[i].TransactionID), p.Positions[i].Offset}}
	}
	found, err := queryEach(ctx, q, stmts, func(row pgx.Row) (bool, error) {
		var visible bool
		err := row.Scan(&visible)
		return visible, err
	})
	if err != nil {
		return nil, err
	}
	var out []int64
	for j, visible := range found {
		if visible {
			out = append(out, int64(rows[j]+1))
		}
	}
	return out, nil
}

// batcher is a Querier that can send a pipelined batch (a connection).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// citusOnHistory reads the counter and identity of p.Topic's worker and
// reports whether p.Position lies below the counter and the worker is
// the one that held the row when it was claimed (p.WorkerHere, when
// set): the fenced statements' check on Citus (see onHistory). When it
// does not hold and p.WorkerHere is set, it returns the error to report
// instead (citusWentBack: ErrWentBack, or a ShardMovedError).
func (d citus) citusOnHistory(ctx context.Context, q Querier, p OffsetParams) (bool, error) {
	s, err := d.citusWorkerSnapshot(ctx, q, p.ConsumerGroup, p.Topic)
	if err != nil {
		return false, err
	}
	here, _ := splitWorkerHere(p.WorkerHere)
	if p.Position.TransactionID < s.counter && (p.WorkerHere == "" || s.here == here) {
		return true, nil
	}
	if p.WorkerHere == "" {
		return false, nil
	}
	// A planned move of the topic's shard is reported as such
	// (ShardMovedError), a worker that went back as ErrWentBack.
	return false, d.citusWentBack(ctx, q, p.Topic, p.WorkerHere, p.Position)
}

// citusKeyed is the condition of the fenced updates on Citus: the row,
// still the session's at the epoch.
const citusKeyed = `consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5`

// CommitOffset is [Driver.CommitOffset] on Citus: no version hint (the row
// is looked up by its key on the worker).
func (d citus) CommitOffset(ctx context.Context, q Querier, p OffsetParams) (string, bool, error) {
	if ok, err := d.citusOnHistory(ctx, q, p); err != nil {
		return "", false, err
	} else if !ok {
		return "", false, ErrWentBack
	}
	tag, err := q.Exec(ctx, `UPDATE `+d.t.Offsets+`
SET `+forwardSet(8)+`, updated_at = pg_catalog.now()
WHERE `+citusKeyed,
		p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		formatXID8(p.Position.TransactionID), p.Position.Offset, p.HeadOut)
	if err != nil {
		return "", false, err
	}
	return "", tag.RowsAffected() > 0, nil
}

// ReleaseOffset is [Driver.ReleaseOffset] on Citus, the notification sent
// from the coordinator after the release.
func (d citus) ReleaseOffset(ctx context.Context, q Querier, p OffsetParams) (int64, error) {
	if ok, err := d.citusOnHistory(ctx, q, p); err != nil {
		return 0, err
	} else if !ok {
		return 0, ErrWentBack
	}
	tag, err := q.Exec(ctx, `UPDATE `+d.t.Offsets+`
SET `+forwardSet(8)+`, `+keptAboveSet(9)+`, session_id = NULL, updated_at = pg_catalog.now()
WHERE `+citusKeyed,
		p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		formatXID8(p.Position.TransactionID), p.Position.Offset, p.HeadOut, AboveEntries(p.AckedAbove))
	if err != nil {
		return 0, err
	}
	if tag.RowsAffected() > 0 && p.NotifyChannel != "" {
		if _, err := q.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, p.NotifyChannel, string(rune(NotifyReleased))+p.Topic); err != nil {
			return 0, err
		}
	}
	return tag.RowsAffected(), nil
}

// ReleaseOffsets is [Driver.ReleaseOffsets] on Citus: the releases of
// one session (all of them, when a Subscriber closes) in two statements
// whatever their number, where ReleaseOffset takes two or three per
// release, each waiting for its worker. First a SELECT of the released
// topics' rows (citusReleaseCheckStmt), which Citus sends to their
// shards, reads each topic's worker's counter and identity there, the
// check citusOnHistory makes of one; then one UPDATE of the rows that
// pass it (citusReleaseStmt), which Citus runs on their shards in one
// distributed transaction, each row fenced by session and epoch as
// ReleaseOffset's is, and which notifies from the coordinator. A
// release that fails the check, whose topic has no row of the group, or
// that repeats a row already in the UPDATE is run by ReleaseOffset
// after it, which reads its worker again and says why it is refused
// (ErrWentBack, a ShardMovedError) or finds ownership lost. Each
// statement is bounded by timeout. A failure before anything may have
// been written is returned for all (nothing was released); after, it is
// the outcome of each release it concerns.
func (d citus) ReleaseOffsets(ctx context.Context, q BatchQuerier, ps []OffsetParams, timeout time.Duration) ([]ReleaseResult, error) {
	out := make([]ReleaseResult, len(ps))
	var (
		alone []int
		wrote bool
	)
	for _, set := range releaseSets(ps) {
		left, err := d.citusReleaseSet(ctx, q, ps, set, out, timeout)
		if err != nil {
			if !wrote {
				return nil, err
			}
			for _, i := range set {
				out[i].Err = err
			}
			continue
		}
		wrote = true
		alone = append(alone, left...)
	}
	slices.Sort(alone)
	for _, i := range alone {
		func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i].Released, out[i].Err = d.ReleaseOffset(ctx, q, ps[i])
		}()
	}
	return out, nil
}

// releaseSets splits the indexes of ps by the session that releases
// (consumer group, session, notification channel), in the order of ps.
func releaseSets(ps []OffsetParams) [][]int {
	type session struct {
		group   string
		id      uuid.UUID
		channel string
	}
	at := map[session]int{}
	var sets [][]int
	for i, p := range ps {
		k := session{p.ConsumerGroup, p.SessionID, p.NotifyChannel}
		j, ok := at[k]
		if !ok {
			j = len(sets)
			at[k] = j
			sets = append(sets, nil)
		}
		sets[j] = append(sets[j], i)
	}
	return sets
}

// citusReleaseSet releases the rows of ps at set (one session's) that
// pass the check on their workers by one UPDATE, recording each in out,
// and returns the indexes left to ReleaseOffset.
func (d citus) citusReleaseSet(ctx context.Context, q Querier, ps []OffsetParams, set []int, out []ReleaseResult,
	timeout time.Duration) (left []int, err error) {
	var topics []string
	seen := map[string]bool{}
	for _, i := range set {
		if t := ps[i].Topic; !seen[t] {
			seen[t] = true
			topics = append(topics, t)
		}
	}
	snapshots, err := d.citusReleaseCheck(ctx, q, ps[set[0]].ConsumerGroup, topics, timeout)
	if err != nil {
		return nil, err
	}
	type row struct {
		topic     string
		partition int32
	}
	var rows []int
	sent := map[row]bool{}
	for _, i := range set {
		p := ps[i]
		s, ok := snapshots[p.Topic]
		here, _ := splitWorkerHere(p.WorkerHere)
		r := row{p.Topic, p.Partition}
		if !ok || sent[r] || p.Position.TransactionID >= s.counter || (p.WorkerHere != "" && s.here != here) {
			left = append(left, i)
			continue
		}
		sent[r] = true
		rows = append(rows, i)
	}
	if len(rows) == 0 {
		return left, nil
	}
	stmt := d.citusReleaseStmt(ps, rows)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	released, err := q.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, err
	}
	var r row
	freed := map[row]bool{}
	if _, err := pgx.ForEachRow(released, []any{&r.topic, &r.partition}, func() error {
		freed[r] = true
		return nil
	}); err != nil {
		return nil, err
	}
	for _, i := range rows {
		if freed[row{ps[i].Topic, ps[i].Partition}] {
			out[i].Released = 1
		}
	}
	return left, nil
}

// citusReleaseCheckStmt is the statement of citusReleaseCheck.
func (d citus) citusReleaseCheckStmt(group string, topics []string) Stmt {
	return Stmt{SQL: `SELECT o.topic, ` + d.workerCounter() + `::text, ` + here + `
FROM ` + d.t.Offsets + ` o WHERE o.consumer_group = $1 AND o.topic = ANY($2::text[])`, Args: []any{group, topics}}
}

// citusReleaseCheck reads, for each of topics that group has a row of,
// the counter and the identity of the topic's worker. Citus sends the
// SELECT to the topics' shards, whose queries call the counter's
// function (which refuses to run on the coordinator) and read the
// identity on the worker, a row of the group at a time.
func (d citus) citusReleaseCheck(ctx context.Context, q Querier, group string, topics []string,
	timeout time.Duration) (map[string]citusSnapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s := d.citusReleaseCheckStmt(group, topics)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]citusSnapshot, len(topics))
	var (
		topic string
		snap  citusSnapshot
	)
	_, err = pgx.ForEachRow(rows, []any{&topic, (*xid8)(&snap.counter), &snap.here}, func() error {
		out[topic] = snap
		return nil
	})
	return out, err
}

// citusReleaseStmt is the UPDATE of citusReleaseSet: the releases of
// ps at rows (one session's, one per row) as ReleaseOffset's UPDATE on
// Citus makes each, the parameters of each row from arrays joined to
// the rows (so the statement's text is the same whatever their
// number), the shards pruned to those of the topics. Its rows are the
// rows released; with a notification channel, it notifies "r" + topic
// from the coordinator for each (pg_notify over the UPDATE's result).
func (d citus) citusReleaseStmt(ps []OffsetParams, rows []int) Stmt {
	p := ps[rows[0]]
	topics := make([]string, len(rows))
	parts := make([]int32, len(rows))
	epochs := make([]int64, len(rows))
	txIDs := make([]string, len(rows))
	offsets := make([]int64, len(rows))
	headOut := make([]bool, len(rows))
	above := make([]string, len(rows))
	for j, i := range rows {
		r := ps[i]
		topics[j], parts[j], epochs[j] = r.Topic, r.Partition, r.Epoch
		txIDs[j], offsets[j], headOut[j] = formatXID8(r.Position.TransactionID), r.Position.Offset, r.HeadOut
		above[j] = strings.Join(AboveEntries(r.AckedAbove), ",")
	}
	sql := `WITH released AS (
	UPDATE ` + d.t.Offsets + ` o
	SET ` + forwardSetOf(`v.tx::xid8`, `v.off`, `v.head_out`) + `,
		` + keptAboveSetOf(`pg_catalog.string_to_array(v.above, ',')`, `v.tx::xid8`, `v.off`) + `,
		session_id = NULL, updated_at = pg_catalog.now()
	FROM ROWS FROM (pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::integer[]), pg_catalog.unnest($5::bigint[]),
		pg_catalog.unnest($6::text[]), pg_catalog.unnest($7::bigint[]), pg_catalog.unnest($8::boolean[]),
		pg_catalog.unnest($9::text[])) AS v(topic, partition, epoch, tx, off, head_out, above)
	WHERE o.consumer_group = $1 AND o.session_id = $2 AND o.topic = ANY($3::text[])
		AND o.topic = v.topic AND o.partition = v.partition AND o.epoch = v.epoch
	RETURNING o.topic, o.partition
)`
	args := []any{p.ConsumerGroup, p.SessionID, topics, parts, epochs, txIDs, offsets, headOut, above}
	if p.NotifyChannel == "" {
		return Stmt{SQL: sql + `
SELECT topic, partition FROM released`, Args: args}
	}
	return asCitus(Stmt{SQL: sql + `, notified AS (
	SELECT topic, partition, pg_catalog.pg_notify($10, ` + kind(NotifyReleased) + ` || topic) FROM released
)
SELECT topic, partition FROM notified`, Args: append(args, p.NotifyChannel)})
}

// CountHeadDelivery is [Driver.CountHeadDelivery] on Citus.
func (d citus) CountHeadDelivery(ctx context.Context, q Querier, p OffsetParams) (int32, error) {
	if ok, err := d.citusOnHistory(ctx, q, p); err != nil {
		return 0, err
	} else if !ok {
		return 0, ErrWentBack
	}
	var n int32
	err := q.QueryRow(ctx, `UPDATE `+d.t.Offsets+` SET head_deliveries = head_deliveries + 1
WHERE `+citusKeyed+` AND acked_transaction_id = $6::text::xid8 AND acked_offset = $7
RETURNING head_deliveries`,
		p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		formatXID8(p.Position.TransactionID), p.Position.Offset).Scan(&n)
	return n, err
}

// AckOffset is [Driver.AckOffset] on Citus, in the caller's transaction: it
// locks the row on the worker, reading the worker's counter there, and
// then writes it.
func (d citus) AckOffset(ctx context.Context, q Querier, p OffsetParams) (AckRow, error) {
	t := d.t
	var (
		r          AckRow
		counter    xid8
		workerHere string
	)
	err := q.QueryRow(ctx, `SELECT session_id, epoch, acked_transaction_id::text, acked_offset,
	$4::text = ANY(acked_above), `+d.workerCounter()+`::text, `+here+`
FROM `+t.Offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3
FOR UPDATE`, p.ConsumerGroup, p.Topic, p.Partition, AboveEntry(p.Position)).
		Scan(&r.SessionID, &r.Epoch, (*xid8)(&r.Acked.TransactionID), &r.Acked.Offset, &r.Recorded, &counter, &workerHere)
	if err != nil {
		return AckRow{}, err
	}
	claimedHere, _ := splitWorkerHere(p.WorkerHere)
	r.OnHistory = p.Position.TransactionID < uint64(counter) && (p.WorkerHere == "" || workerHere == claimedHere)
	if !r.OnHistory && p.WorkerHere != "" {
		// What the worker is now: a planned move is logged as that.
		if err := d.citusWentBack(ctx, q, p.Topic, p.WorkerHere, p.Position); wentBackSays(err) {
			r.Elsewhere = err
		}
	}
	if !r.OnHistory || r.SessionID == nil || *r.SessionID != p.SessionID || r.Epoch != p.Epoch || r.Recorded ||
		!positionBefore(r.Acked, p.Position) {
		return r, nil
	}
	set := `acked_transaction_id = $4::text::xid8, acked_offset = $5, head_deliveries = 0`
	if p.Above {
		set = `acked_above = pg_catalog.array_append(ARRAY(SELECT a FROM pg_catalog.unnest(acked_above) a
		WHERE (pg_catalog.split_part(a, ':', 1)::xid8, pg_catalog.split_part(a, ':', 2)::bigint)
			> (acked_transaction_id, acked_offset)), $6::text)`
	}
	tag, err := q.Exec(ctx, `UPDATE `+t.Offsets+` SET `+set+`, updated_at = pg_catalog.now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`+ignoreArgs(p.Above),
		p.ConsumerGroup, p.Topic, p.Partition, formatXID8(p.Position.TransactionID), p.Position.Offset, AboveEntry(p.Position))
	if err != nil {
		return AckRow{}, err
	}
	r.Advanced = tag.RowsAffected() > 0
	return r, nil
}

// ignoreArgs types the parameters a statement of AckOffset on Citus does not
// use, so that it may be given all of them.
func ignoreArgs(above bool) string {
	if above {
		return ` AND $4::text IS NOT NULL AND $5::bigint IS NOT NULL`
	}
	return ` AND $6::text IS NOT NULL`
}

func positionBefore(a, b Position) bool {
	if a.TransactionID != b.TransactionID {
		return a.TransactionID < b.TransactionID
	}
	return a.Offset < b.Offset
}
