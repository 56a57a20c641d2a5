package pgsql

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LoadWaiting is [Driver.LoadWaiting] on Citus: the single-node SELECT,
// routed whole to the topic's worker.
func (d citus) LoadWaiting(ctx context.Context, q Querier, p OffsetParams) ([]WaitingRow, error) {
	return d.one.LoadWaiting(ctx, q, p)
}

// InspectWaiting is [Driver.InspectWaiting] on Citus: the single-node
// SELECT, a multi-shard read of the column (no function of the worker's
// snapshot).
func (d citus) InspectWaiting(ctx context.Context, q Querier, groups, topics []string) ([]WaitingInspectRow, error) {
	return d.one.InspectWaiting(ctx, q, groups, topics)
}

// RecordWaiting is [Driver.RecordWaiting] on Citus: the worker's counter
// and identity are read first (citusOnHistory), then the entry as it is
// and the server's time, and the new entry, built here, replaces it,
// fenced by session and epoch. (Citus refuses the single-node SET: a
// STABLE function, jsonb_build_object or now(), inside a CASE or
// COALESCE of a modification of a distributed table.) Reading the entry
// first is safe: only the row's owner writes it, and a stale owner's
// write is fenced.
func (d citus) RecordWaiting(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	if ok, err := d.citusOnHistory(ctx, q, p.OffsetParams); err != nil {
		return WaitingRow{}, err
	} else if !ok {
		return WaitingRow{}, ErrWentBack
	}
	key := AboveEntry(p.Position)
	var (
		old *string
		now int64
	)
	err := q.QueryRow(ctx, `SELECT (waiting -> $4::text)::text, `+nowMs+`
FROM `+d.t.Offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, p.ConsumerGroup, p.Topic, p.Partition, key).Scan(&old, &now)
	if err != nil {
		return WaitingRow{}, err
	}
	entry := waitingEntry{}
	if old != nil {
		if err := json.Unmarshal([]byte(*old), &entry); err != nil {
			return WaitingRow{}, fmt.Errorf("waiting entry %s: %w", key, err)
		}
	}
	entry.A = p.Attempts
	if p.Failed {
		if entry.F == nil {
			entry.F = &now
		}
		next := now + p.Delay.Milliseconds()
		entry.L, entry.N, entry.R = &now, &next, nil
		if p.Reason != "" {
			entry.R = &p.Reason
		}
	}
	js, err := json.Marshal(map[string]waitingEntry{key: entry})
	if err != nil {
		return WaitingRow{}, err
	}
	tag, err := q.Exec(ctx, `UPDATE `+d.t.Offsets+`
SET waiting = (waiting - $7::text[] - $6::text) || $8::jsonb, updated_at = pg_catalog.now()
WHERE `+citusKeyed, p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch, key, AboveEntries(p.Drop), string(js))
	if err != nil {
		return WaitingRow{}, err
	}
	if tag.RowsAffected() == 0 {
		return WaitingRow{}, pgx.ErrNoRows
	}
	return entry.row(p.Position, now), nil
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

// LoadHandedOut is [Driver.LoadHandedOut] on Citus: the single-node
// SELECT, routed whole to the topic's worker.
func (d citus) LoadHandedOut(ctx context.Context, q Querier, p OffsetParams) (Position, bool, error) {
	return d.one.LoadHandedOut(ctx, q, p)
}

// MarkHandedOut is [Driver.MarkHandedOut] on Citus: the worker's counter
// and identity are read first (citusOnHistory), then the row written,
// fenced by session and epoch.
func (d citus) MarkHandedOut(ctx context.Context, q Querier, p OffsetParams) error {
	if ok, err := d.citusOnHistory(ctx, q, p); err != nil {
		return err
	} else if !ok {
		return ErrWentBack
	}
	tag, err := q.Exec(ctx, `UPDATE `+d.t.Offsets+`
SET handed_out = $6::text, updated_at = pg_catalog.now()
WHERE `+citusKeyed, p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch, AboveEntry(p.Position))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return pgx.ErrNoRows
	}
	return nil
}
