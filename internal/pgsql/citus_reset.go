package pgsql

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ResetOffsets is [Driver.ResetOffsets] on Citus, in the caller's
// transaction, as steps of the single-node statement: the rows and
// whether their owners live, read on the topic's worker (snap); their
// partitions' position bounds, computed there by a statement of their own
// (a bound read after the rows' snapshot could pass a message whose
// publisher committed in between); the rows locked there (cur); each
// row's new position (for "time", the first message at or after p.At
// below the bound, read on the worker; for "latest", just below the
// bound); each row written by a compare-and-swap on the
// (session_id, epoch) of snap, unless it changed between snap and cur;
// and, when a row was written, the notification sent from the
// coordinator, at the transaction's commit.
func (d citus) ResetOffsets(ctx context.Context, q Querier, p ResetParams) ([]ResetRow, error) {
	t := d.t
	type snapRow struct {
		session   *uuid.UUID
		epoch     int64
		liveOwner *string
	}
	snap := map[int32]snapRow{}
	rows, err := q.Query(ctx, `SELECT o.partition, o.session_id, o.epoch,
	CASE WHEN s.expires_at > pg_catalog.now() THEN s.owner END
FROM `+t.Offsets+` o LEFT JOIN `+t.Sessions+` s ON s.id = o.session_id
WHERE o.consumer_group = $1 AND o.topic = $2`, p.ConsumerGroup, p.Topic)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var (
			part int32
			r    snapRow
		)
		if err := rows.Scan(&part, &r.session, &r.epoch, &r.liveOwner); err != nil {
			rows.Close()
			return nil, err
		}
		snap[part] = r
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	type curRow struct {
		partition int32
		session   *uuid.UUID
		epoch     int64
		from      Position
	}
	bounds := map[int32]uint64{}
	if p.To != "earliest" && len(snap) > 0 {
		parts := make([]int32, 0, len(snap))
		for part := range snap {
			parts = append(parts, part)
		}
		b, err := d.citusBounds(ctx, q, p.Topic, parts)
		if err != nil {
			return nil, err
		}
		for i, part := range parts {
			bounds[part] = b[i]
		}
	}
	var cur []curRow
	rows, err = q.Query(ctx, `SELECT partition, session_id, epoch, acked_transaction_id::text, acked_offset
FROM `+t.Offsets+`
WHERE consumer_group = $1 AND topic = $2
ORDER BY partition
FOR UPDATE`, p.ConsumerGroup, p.Topic)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var c curRow
		if err := rows.Scan(&c.partition, &c.session, &c.epoch, (*xid8)(&c.from.TransactionID), &c.from.Offset); err != nil {
			rows.Close()
			return nil, err
		}
		cur = append(cur, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	var out []ResetRow
	applied := false
	for _, c := range cur {
		s, inSnap := snap[c.partition]
		changed := !inSnap || !sameSession(c.session, s.session) || c.epoch != s.epoch
		r := ResetRow{Partition: c.partition, SessionID: c.session, From: c.from, Changed: changed}
		if !changed {
			r.LiveOwner = s.liveOwner
		}
		bound, ok := bounds[c.partition]
		if !ok && p.To != "earliest" {
			// A row not in snap (changed: it is reported, not written).
			b, err := d.citusBounds(ctx, q, p.Topic, []int32{c.partition})
			if err != nil {
				return nil, err
			}
			bound = b[0]
		}
		switch p.To {
		case "earliest":
		case "time":
			r.To, err = d.citusFirstAfter(ctx, q, p.Topic, c.partition, p.At, bound)
			if err != nil {
				return nil, err
			}
		default: // latest
			r.To = Position{TransactionID: bound - 1, Offset: math.MaxInt64}
		}
		if !changed && (p.Force || s.liveOwner == nil) {
			tag, err := q.Exec(ctx, `UPDATE `+t.Offsets+` o
SET acked_transaction_id = $4::text::xid8, acked_offset = $5, epoch = o.epoch + 1, updated_at = pg_catalog.now(),
	head_deliveries = 0, acked_above = '{}', waiting = '{}', handed_out = NULL,
	session_id = CASE WHEN $8 THEN NULL ELSE o.session_id END
WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3
	AND o.session_id IS NOT DISTINCT FROM $6::uuid AND o.epoch = $7`,
				p.ConsumerGroup, p.Topic, c.partition, formatXID8(r.To.TransactionID), r.To.Offset, s.session, s.epoch, s.liveOwner == nil)
			if err != nil {
				return nil, err
			}
			r.Applied = tag.RowsAffected() > 0
			applied = applied || r.Applied
		}
		out = append(out, r)
	}
	if applied && t.NotifyChannel != "" {
		if _, err := q.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, t.NotifyChannel, p.Notification); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// citusFirstAfter is the position before the first message of the
// partition stored at or after at whose position lies below bound (the
// partition's position bound on the worker), read on the topic's worker;
// just below the bound when there is none.
func (d citus) citusFirstAfter(ctx context.Context, q Querier, topic string, partition int32, at time.Time, bound uint64) (Position, error) {
	var pos Position
	err := q.QueryRow(ctx, `SELECT m.transaction_id::text, m."offset" - 1 FROM `+d.t.Messages+` m
WHERE m.topic = $1 AND m.partition = $2 AND m.created_at >= $3 AND m.transaction_id < $4::text::xid8
ORDER BY m.transaction_id, m."offset"
LIMIT 1`, topic, partition, at, formatXID8(bound)).Scan((*xid8)(&pos.TransactionID), &pos.Offset)
	if errors.Is(err, pgx.ErrNoRows) {
		return Position{TransactionID: bound - 1, Offset: math.MaxInt64}, nil
	}
	return pos, err
}

func sameSession(a, b *uuid.UUID) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}
