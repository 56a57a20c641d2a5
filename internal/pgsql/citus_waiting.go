package pgsql

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// LoadWaiting is [Driver.LoadWaiting] on Citus: the single-node SELECT,
// routed whole to the topic's worker.
func (d citus) LoadWaiting(ctx context.Context, q Querier, p OffsetParams) ([]WaitingRow, error) {
	return d.one.LoadWaiting(ctx, q, p)
}

// RecordWaiting is [Driver.RecordWaiting] on Citus: the worker's counter
// and identity are read first (citusOnHistory), then the row is written
// with the single-node SET, fenced by session and epoch.
func (d citus) RecordWaiting(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	if ok, err := d.citusOnHistory(ctx, q, p.OffsetParams); err != nil {
		return WaitingRow{}, err
	} else if !ok {
		return WaitingRow{}, ErrWentBack
	}
	var w waitingRaw
	err := q.QueryRow(ctx, `UPDATE `+d.t.Offsets+` SET `+waitingSet+`, updated_at = pg_catalog.now()
WHERE `+citusKeyed+` AND $6::text IS NOT NULL AND $7::text IS NOT NULL
RETURNING `+waitingColumns("(waiting -> $8::text)"), p.args()...).Scan(w.dest()...)
	if err != nil {
		return WaitingRow{}, err
	}
	r, written := w.row(p.Position)
	if !written {
		return WaitingRow{}, pgx.ErrNoRows
	}
	return r, nil
}

// DeadLetterOffset is [Driver.DeadLetterOffset] on Citus, in the caller's
// transaction: the row is locked and read on the worker, the worker's
// counter and identity checked, then the row written, fenced by session
// and epoch.
func (d citus) DeadLetterOffset(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	var (
		w        waitingRaw
		recorded bool
		now      int64
	)
	err := q.QueryRow(ctx, `SELECT `+waitingColumns("(waiting -> $4::text)")+`, $4::text = ANY(acked_above), `+nowMs+`
FROM `+d.t.Offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3
FOR UPDATE`, p.ConsumerGroup, p.Topic, p.Partition, AboveEntry(p.Position)).Scan(append(w.dest(), &recorded, &now)...)
	if err != nil {
		return WaitingRow{}, err
	}
	if ok, err := d.citusOnHistory(ctx, q, p.OffsetParams); err != nil {
		return WaitingRow{}, err
	} else if !ok {
		return WaitingRow{}, ErrWentBack
	}
	if recorded {
		return WaitingRow{}, ErrRecorded
	}
	tag, err := q.Exec(ctx, `UPDATE `+d.t.Offsets+`
SET acked_above = pg_catalog.array_append(acked_above, $6::text), waiting = waiting - $6::text - $7::text[],
	updated_at = pg_catalog.now()
WHERE `+citusKeyed, p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		AboveEntry(p.Position), AboveEntries(p.Drop))
	if err != nil {
		return WaitingRow{}, err
	}
	if tag.RowsAffected() == 0 {
		return WaitingRow{}, pgx.ErrNoRows
	}
	return w.final(p, now), nil
}
