package pgsql

import (
	"context"
	"errors"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// SkipParams name one message of a consumer group's partition to move the
// group past (see [SkipMessage]).
type SkipParams struct {
	ConsumerGroup string
	Topic         string
	Partition     int32
	Position      Position
	// Force skips it while a live session owns the row (fencing it).
	Force bool
	// Notification is sent on the table's channel when the row is
	// written (ResetNotification), so that its owner claims it again.
	Notification string
}

// SkipRow is what [SkipMessage] found and did.
type SkipRow struct {
	// RowFound is false when the group has no offset row for the
	// partition; MessageFound when no message of the partition has the
	// position. Nothing else is set then.
	RowFound, MessageFound bool
	// From is the row's acknowledged position.
	From Position
	// AlreadyPast reports that the position is at or before From, or
	// already acknowledged above it: nothing to do.
	AlreadyPast bool
	// SessionID and LiveOwner are the row's owner as the snapshot read it
	// (LiveOwner nil: none live).
	SessionID *uuid.UUID
	LiveOwner *string
	// Changed reports that the row changed owner or epoch between the
	// snapshot and its lock: nothing was written, the caller runs it
	// again in a new transaction.
	Changed bool
	// Applied reports that the row was written.
	Applied bool
}

// SkipMessage moves a consumer group past one message of a partition, in
// the caller's transaction, and leaves every other message as it was: its
// position is added to the row's acked_above (the positions acknowledged
// above the row's position, which the owner skips and the position moves
// over), its waiting entry is dropped, and the epoch is bumped, which
// fences the owner. Whether the owner lives is read as ResetOffsets reads
// it (a snapshot, then the row locked, and a compare-and-swap on the
// session and epoch read first); a live owner is left alone unless
// p.Force. The statements are routed by topic on Citus: the same on both
// drivers.
func SkipMessage(ctx context.Context, q Querier, t *Tables, p SkipParams) (SkipRow, error) {
	var r SkipRow
	var epoch int64
	err := q.QueryRow(ctx, `SELECT o.session_id, o.epoch, CASE WHEN s.expires_at > pg_catalog.now() THEN s.owner END
FROM `+t.Offsets+` o LEFT JOIN `+t.Sessions+` s ON s.id = o.session_id
WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3`,
		p.ConsumerGroup, p.Topic, p.Partition).Scan(&r.SessionID, &epoch, &r.LiveOwner)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	r.RowFound = true
	var (
		curSession *uuid.UUID
		curEpoch   int64
		above      []string
	)
	if err := q.QueryRow(ctx, `SELECT session_id, epoch, acked_transaction_id::text, acked_offset, acked_above
FROM `+t.Offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3
FOR UPDATE`, p.ConsumerGroup, p.Topic, p.Partition).Scan(&curSession, &curEpoch,
		(*xid8)(&r.From.TransactionID), &r.From.Offset, &above); err != nil {
		return r, err
	}
	if !sameSession(curSession, r.SessionID) || curEpoch != epoch {
		r.Changed = true
		return r, nil
	}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t.Messages+` m
WHERE m.topic = $1 AND m.partition = $2 AND m.transaction_id = $3::text::xid8 AND m."offset" = $4)`,
		p.Topic, p.Partition, formatXID8(p.Position.TransactionID), p.Position.Offset).Scan(&r.MessageFound); err != nil {
		return r, err
	}
	if !r.MessageFound {
		return r, nil
	}
	entry := AboveEntry(p.Position)
	if !positionBefore(r.From, p.Position) || slices.Contains(above, entry) {
		r.AlreadyPast = true
		return r, nil
	}
	if r.LiveOwner != nil && !p.Force {
		return r, nil
	}
	tag, err := q.Exec(ctx, `UPDATE `+t.Offsets+` o
SET acked_above = pg_catalog.array_append(o.acked_above, $4::text), waiting = o.waiting - $4::text,
	epoch = o.epoch + 1, updated_at = pg_catalog.now(),
	session_id = CASE WHEN $7 THEN NULL ELSE o.session_id END
WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3
	AND o.session_id IS NOT DISTINCT FROM $5::uuid AND o.epoch = $6`,
		p.ConsumerGroup, p.Topic, p.Partition, entry, r.SessionID, epoch, r.LiveOwner == nil)
	if err != nil {
		return r, err
	}
	r.Applied = tag.RowsAffected() > 0
	if r.Applied && t.NotifyChannel != "" && p.Notification != "" {
		if _, err := q.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, t.NotifyChannel, p.Notification); err != nil {
			return r, err
		}
	}
	return r, nil
}
