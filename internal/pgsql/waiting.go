package pgsql

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The failure policy's statements (SubscriberConfig.Retry): the messages
// of an offset row that failed and wait for their next attempt live in
// the row's waiting column (schema version 16), an object keyed by
// position ([AboveEntry]) whose entries hold the attempts counted, the
// first and last failure, the next attempt's time (milliseconds since
// the epoch, on the server's clock) and the last reason. Only the row's
// owner writes it, fenced by session and epoch like a commit, so a
// takeover hands the schedule to the next owner with the row. The
// statements never compare positions: an entry is named by its key, and
// the engine decides which entries are stale.

// ErrRecorded is returned by [Driver.DeadLetterOffset] when the message's
// position is recorded in the row's acked_above already: it was
// acknowledged in a transaction (AckInTx) that committed, or moved
// before; nothing was written.
var ErrRecorded = errors.New("the message is acknowledged in the offset row already")

// nowMs is the server's clock in milliseconds since the epoch.
const nowMs = `(pg_catalog.date_part('epoch'::text, pg_catalog.now()) * 1000::float8)::int8`

// WaitingRow is one message of a row's waiting column.
type WaitingRow struct {
	Position Position
	// Attempts is how many hand-outs were counted.
	Attempts int32
	// FirstFailure and LastFailure are the server's times of the first
	// and the last failure recorded (zero: none yet).
	FirstFailure, LastFailure time.Time
	// DueIn is how long after the statement's now() the next attempt is
	// due (0: due).
	DueIn time.Duration
	// Reason is the reason recorded with the last failure ("": none).
	Reason string
	// NextAttempt is the server's time of the next attempt (zero: none
	// recorded); set by InspectWaiting only.
	NextAttempt time.Time
}

// WaitingParams are the parameters of [Driver.RecordWaiting] and
// [Driver.DeadLetterOffset]: the owner's fencing (OffsetParams: group,
// topic, partition, session, epoch, identity) and the message
// (OffsetParams.Position).
type WaitingParams struct {
	OffsetParams
	// Attempts is the attempts counted for the message.
	Attempts int32
	// Failed records a failure: its time (the first one kept), the next
	// attempt Delay after the server's now(), and Reason. Without it,
	// RecordWaiting only sets Attempts (an attempt about to go out).
	Failed bool
	Delay  time.Duration
	Reason string
	// Drop are positions whose entries are removed in the same write (the
	// messages acknowledged since they failed).
	Drop []Position
}

// waitingColumns are the columns of the JSON entry: attempts, first and
// last failure, milliseconds until due, reason.
func waitingColumns(entry string) string {
	return `(` + entry + ` ->> 'a')::int4, (` + entry + ` ->> 'f')::int8, (` + entry + ` ->> 'l')::int8,
	GREATEST((` + entry + ` ->> 'n')::int8 - ` + nowMs + `, 0::int8), ` + entry + ` ->> 'r'`
}

// waitingRaw is the columns of waitingColumns as scanned.
type waitingRaw struct {
	attempts    *int32
	first, last *int64
	dueMs       *int64
	reason      *string
}

func (w *waitingRaw) dest() []any { return []any{&w.attempts, &w.first, &w.last, &w.dueMs, &w.reason} }

// row returns the entry at pos; ok is false for no entry (NULLs).
func (w *waitingRaw) row(pos Position) (r WaitingRow, ok bool) {
	if w.attempts == nil {
		return WaitingRow{Position: pos}, false
	}
	r = WaitingRow{Position: pos, Attempts: *w.attempts}
	if w.first != nil {
		r.FirstFailure = time.UnixMilli(*w.first)
	}
	if w.last != nil {
		r.LastFailure = time.UnixMilli(*w.last)
	}
	if w.dueMs != nil {
		r.DueIn = time.Duration(*w.dueMs) * time.Millisecond
	}
	if w.reason != nil {
		r.Reason = *w.reason
	}
	return r, true
}

// waitingSet is the SET expression of RecordWaiting: $8 the entry's key,
// $9 the keys dropped, $10 whether a failure is recorded, $11 the
// attempts, $12 the delay in milliseconds, $13 the reason.
const waitingSet = `waiting = (waiting - $9::text[]) || pg_catalog.jsonb_build_object($8::text,
	CASE WHEN $10::bool THEN pg_catalog.jsonb_build_object('a', $11::int4,
		'f', COALESCE((waiting -> $8::text ->> 'f')::int8, ` + nowMs + `),
		'l', ` + nowMs + `, 'n', ` + nowMs + ` + $12::int8, 'r', NULLIF($13::text, ''))
	ELSE COALESCE(waiting -> $8::text, '{}'::jsonb) || pg_catalog.jsonb_build_object('a', $11::int4) END)`

func (p WaitingParams) args() []any {
	return []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		formatXID8(p.Position.TransactionID), p.Here, AboveEntry(p.Position), AboveEntries(p.Drop),
		p.Failed, p.Attempts, p.Delay.Milliseconds(), p.Reason}
}

// LoadWaiting is the statement of [LoadWaiting].
func (t *Tables) LoadWaiting(p OffsetParams) Stmt {
	return Stmt{
		SQL: `SELECT w.key, ` + waitingColumns("w.value") + `
FROM ` + t.Offsets + ` o, pg_catalog.jsonb_each(o.waiting) w
WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3 AND o.session_id = $4 AND o.epoch = $5`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch},
	}
}

// RecordWaiting is the statement of [RecordWaiting]: its row is whether
// onHistory held, and the entry written (NULLs: ownership lost).
func (t *Tables) RecordWaiting(p WaitingParams) Stmt {
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + t.onHistory(7) + ` AS ok
), written AS (
	UPDATE ` + t.Offsets + ` SET ` + waitingSet + `, updated_at = pg_catalog.now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND (SELECT ok FROM here)
	RETURNING waiting -> $8::text AS e
)
SELECT (SELECT ok FROM here), ` + waitingColumns("w.e") + `
FROM (SELECT 1) one LEFT JOIN written w ON true`,
		Args: p.args(),
	}
}

// LoadHandedOut is the statement of [LoadHandedOut].
func (t *Tables) LoadHandedOut(p OffsetParams) Stmt {
	return Stmt{
		SQL: `SELECT handed_out FROM ` + t.Offsets + `
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch},
	}
}

// MarkHandedOut is the statement of [MarkHandedOut]: its row is whether
// onHistory held, and whether the row was written.
func (t *Tables) MarkHandedOut(p OffsetParams) Stmt {
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + t.onHistory(7) + ` AS ok
), marked AS (
	UPDATE ` + t.Offsets + ` SET handed_out = $8::text, updated_at = pg_catalog.now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND (SELECT ok FROM here)
	RETURNING 1
)
SELECT (SELECT ok FROM here), EXISTS (SELECT 1 FROM marked)`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Here, AboveEntry(p.Position)},
	}
}

// LoadHandedOut returns the row's hand-out mark ([MarkHandedOut]) while
// the row is still p's session's at p's epoch: ok is false for none (no
// owner with a failure policy wrote one since the row's last reset, or
// the row is no longer p's).
func (d singleNode) LoadHandedOut(ctx context.Context, q Querier, p OffsetParams) (Position, bool, error) {
	s := d.t.LoadHandedOut(p)
	return scanHandedOut(q.QueryRow(ctx, s.SQL, s.Args...))
}

func scanHandedOut(row pgx.Row) (Position, bool, error) {
	var mark *string
	if err := row.Scan(&mark); errors.Is(err, pgx.ErrNoRows) {
		return Position{}, false, nil
	} else if err != nil {
		return Position{}, false, err
	}
	if mark == nil {
		return Position{}, false, nil
	}
	pos, err := ParseAboveEntry(*mark)
	if err != nil {
		return Position{}, false, fmt.Errorf("hand-out mark: %w", err)
	}
	return pos, true, nil
}

// MarkHandedOut writes p.Position as the row's hand-out mark, fenced by
// session, epoch and identity (as [CommitOffset]): the owner hands out no
// message after the mark before it has written one at or after it, so
// that the next owner counts one attempt for every message at or before
// the mark that has no waiting entry. The statement does not compare the
// mark with the one there: the owner only moves it forward. It returns
// pgx.ErrNoRows when the row is no longer the session's at the epoch,
// [ErrWentBack] when the identity or the position does not hold.
func (d singleNode) MarkHandedOut(ctx context.Context, q Querier, p OffsetParams) error {
	s := d.t.MarkHandedOut(p)
	var ok, marked bool
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&ok, &marked); err != nil {
		return err
	}
	switch {
	case !ok:
		return ErrWentBack
	case !marked:
		return pgx.ErrNoRows
	}
	return nil
}

// DeadLetterOffset is the statement of [DeadLetterOffset]: its row is
// whether onHistory held, whether the row was written, and the message's
// entry as it was.
func (t *Tables) DeadLetterOffset(p WaitingParams) Stmt {
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + t.onHistory(7) + ` AS ok
), cur AS (
	SELECT waiting -> $8::text AS e, $8::text = ANY(acked_above) AS recorded
	FROM ` + t.Offsets + `
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3
	FOR UPDATE
), moved AS (
	UPDATE ` + t.Offsets + `
	SET acked_above = pg_catalog.array_append(acked_above, $8::text), waiting = waiting - $8::text - $9::text[],
		updated_at = pg_catalog.now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND NOT $8::text = ANY(acked_above) AND (SELECT ok FROM here)
	RETURNING 1
)
SELECT (SELECT ok FROM here), EXISTS (SELECT 1 FROM moved), COALESCE(cur.recorded, false), ` + nowMs + `, ` + waitingColumns("cur.e") + `
FROM (SELECT 1) one LEFT JOIN cur ON true`,
		Args: p.args()[:9],
	}
}

// LoadWaiting returns the waiting messages of the row p names while it is
// still p's session's at p's epoch (none otherwise).
func (d singleNode) LoadWaiting(ctx context.Context, q Querier, p OffsetParams) ([]WaitingRow, error) {
	s := d.t.LoadWaiting(p)
	return scanWaitingRows(q.Query(ctx, s.SQL, s.Args...))
}

func scanWaitingRows(rows pgx.Rows, err error) ([]WaitingRow, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []WaitingRow
	for rows.Next() {
		var (
			w   waitingRaw
			key string
		)
		if err := rows.Scan(append([]any{&key}, w.dest()...)...); err != nil {
			return nil, err
		}
		pos, err := ParseAboveEntry(key)
		if err != nil {
			return nil, err
		}
		if r, ok := w.row(pos); ok {
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// RecordWaiting writes the entry of the message at p.Position in the row's
// waiting column, fenced by session, epoch and identity (as
// [CommitOffset]): the attempts counted, and with p.Failed the failure
// and the next attempt's time; it drops the entries of p.Drop. It returns
// the entry written; pgx.ErrNoRows when the row is no longer the
// session's at the epoch, [ErrWentBack] when the identity or the position
// does not hold.
func (d singleNode) RecordWaiting(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	s := d.t.RecordWaiting(p)
	var (
		ok bool
		w  waitingRaw
	)
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(append([]any{&ok}, w.dest()...)...); err != nil {
		return WaitingRow{}, err
	}
	if !ok {
		return WaitingRow{}, ErrWentBack
	}
	r, written := w.row(p.Position)
	if !written {
		return WaitingRow{}, pgx.ErrNoRows
	}
	return r, nil
}

// DeadLetterOffset moves the group past the message at p.Position, fenced
// as [RecordWaiting]: it records the position in the row's acked_above
// (the next owner skips the message, the owner's commits move over it)
// and removes its waiting entry (and those of p.Drop). Run it in the
// transaction that writes the message's dead-letter copy: the copy and
// the move commit together or not at all. It locks the row first, so a
// claim either comes before (the statement writes nothing) or waits for
// the transaction. It returns the message's entry with its last failure
// at the statement's now() and its attempts p.Attempts; [ErrRecorded]
// when the position is recorded in acked_above already, pgx.ErrNoRows
// when the row is no longer the session's at the epoch (nothing written
// either way), [ErrWentBack] when the identity or the position does not
// hold.
func (d singleNode) DeadLetterOffset(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	s := d.t.DeadLetterOffset(p)
	var (
		ok, moved, recorded bool
		now                 int64
		w                   waitingRaw
	)
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(append([]any{&ok, &moved, &recorded, &now}, w.dest()...)...); err != nil {
		return WaitingRow{}, err
	}
	switch {
	case !ok:
		return WaitingRow{}, ErrWentBack
	case moved:
	case recorded:
		return WaitingRow{}, ErrRecorded
	default:
		return WaitingRow{}, pgx.ErrNoRows
	}
	return w.final(p, now), nil
}

// final is the entry of a message moved to the dead-letter topic at the
// server's time now (milliseconds): its last failure then, its first
// one the entry's (now when it had none), its attempts p.Attempts.
func (w *waitingRaw) final(p WaitingParams, now int64) WaitingRow {
	r, _ := w.row(p.Position)
	r.Attempts, r.LastFailure, r.DueIn = p.Attempts, time.UnixMilli(now), 0
	if r.FirstFailure.IsZero() {
		r.FirstFailure = r.LastFailure
	}
	return r
}

// ParseAboveEntry reads a position written by [AboveEntry].
func ParseAboveEntry(s string) (Position, error) {
	tx, off, ok := strings.Cut(s, ":")
	if !ok {
		return Position{}, errors.New("position " + strconv.Quote(s) + " is not transaction_id:offset")
	}
	t, err := strconv.ParseUint(tx, 10, 64)
	if err != nil {
		return Position{}, err
	}
	o, err := strconv.ParseInt(off, 10, 64)
	if err != nil {
		return Position{}, err
	}
	return Position{TransactionID: t, Offset: o}, nil
}

// InspectWaiting is the statement of [InspectWaiting].
func (t *Tables) InspectWaiting(groups, topics []string) Stmt {
	return Stmt{
		SQL: `SELECT consumer_group, topic, partition, acked_transaction_id::text, acked_offset, acked_above, waiting::text, ` + nowMs + `
FROM ` + t.Offsets + `
WHERE waiting <> '{}'::jsonb AND ($1::text[] IS NULL OR consumer_group = ANY($1)) AND ($2::text[] IS NULL OR topic = ANY($2))
ORDER BY consumer_group, topic, partition`,
		Args: []any{groups, topics},
	}
}

// WaitingInspectRow is one offset row with waiting entries, as
// [InspectWaiting] returns it: the row's position and acknowledgements
// above it, and its entries after the position and not acknowledged (the
// others are stale, left for the owner's next write to drop).
type WaitingInspectRow struct {
	ConsumerGroup string
	Topic         string
	Partition     int32
	Acked         Position
	AckedAbove    []string
	Entries       []WaitingRow
}

// InspectWaiting returns the offset rows of the groups and topics (nil:
// all) that have waiting entries (the failure policy), with the entries.
// A plain read of the column, parsed here: the same on Citus.
func (d singleNode) InspectWaiting(ctx context.Context, q Querier, groups, topics []string) ([]WaitingInspectRow, error) {
	s := d.t.InspectWaiting(groups, topics)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []WaitingInspectRow
	for rows.Next() {
		var (
			r       WaitingInspectRow
			waiting string
			now     int64
		)
		if err := rows.Scan(&r.ConsumerGroup, &r.Topic, &r.Partition, (*xid8)(&r.Acked.TransactionID), &r.Acked.Offset,
			&r.AckedAbove, &waiting, &now); err != nil {
			return nil, err
		}
		entries, err := parseWaiting(waiting, now)
		if err != nil {
			return nil, fmt.Errorf("waiting entries of group %q topic %q partition %d: %w", r.ConsumerGroup, r.Topic, r.Partition, err)
		}
		for _, e := range entries {
			if positionBefore(r.Acked, e.Position) && !slices.Contains(r.AckedAbove, AboveEntry(e.Position)) {
				r.Entries = append(r.Entries, e)
			}
		}
		if len(r.Entries) > 0 {
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// waitingEntry is one entry of the waiting column as JSON (times in
// milliseconds since the epoch, on the server's clock).
type waitingEntry struct {
	A int32   `json:"a"`
	F *int64  `json:"f,omitempty"`
	L *int64  `json:"l,omitempty"`
	N *int64  `json:"n,omitempty"`
	R *string `json:"r,omitempty"`
}

// row is the entry of the message at pos, its due time relative to the
// server's time now (milliseconds).
func (e waitingEntry) row(pos Position, now int64) WaitingRow {
	w := waitingRaw{attempts: &e.A, first: e.F, last: e.L, reason: e.R}
	if e.N != nil {
		due := max(*e.N-now, 0)
		w.dueMs = &due
	}
	r, _ := w.row(pos)
	if e.N != nil {
		r.NextAttempt = time.UnixMilli(*e.N)
	}
	return r
}

// parseWaiting reads a waiting column (JSON), its due times relative to
// the server's now (milliseconds), in position order.
func parseWaiting(raw string, now int64) ([]WaitingRow, error) {
	var m map[string]waitingEntry
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, err
	}
	out := make([]WaitingRow, 0, len(m))
	for k, e := range m {
		pos, err := ParseAboveEntry(k)
		if err != nil {
			return nil, err
		}
		out = append(out, e.row(pos, now))
	}
	slices.SortFunc(out, func(a, b WaitingRow) int {
		if c := cmp.Compare(a.Position.TransactionID, b.Position.TransactionID); c != 0 {
			return c
		}
		return cmp.Compare(a.Position.Offset, b.Position.Offset)
	})
	return out, nil
}
