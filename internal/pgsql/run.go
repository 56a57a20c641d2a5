package pgsql

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The functions of this file run one statement each and return its rows,
// typed. Errors are the driver's, unwrapped: callers add what they were
// doing.

// collect runs s on q and scans every row with scan.
func collect[T any](ctx context.Context, q Querier, s Stmt, scan func(row pgx.CollectableRow) (T, error)) ([]T, error) {
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// exec runs s on q and returns the rows it affected.
func exec(ctx context.Context, q Querier, s Stmt) (int64, error) {
	tag, err := q.Exec(ctx, s.SQL, s.Args...)
	return tag.RowsAffected(), err
}

// --- topics and messages

// InsertMessages inserts messages in one statement, in order, and notifies
// p.NotifyChannel once for each distinct (topic, partition). A message of a
// topic with a retention goes to the partition of its retention class that
// covers its expiry, or, when none does yet, to the partition of messages
// kept forever. A message whose idempotency key its topic stored within
// the key window is not stored (see keys.go).
func (d singleNode) InsertMessages(ctx context.Context, q Querier, p InsertMessagesParams) error {
	_, err := d.InsertKeyed(ctx, q, p)
	return err
}

// InsertKeyed is InsertMessages, and returns the indexes of the messages
// it left out, their keys stored already.
func (d singleNode) InsertKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	if keyed(p) {
		return strictFirst(ctx, q, func(strict bool) Stmt { return d.t.insertKeyed(p, strict, d.register) })
	}
	_, err := exec(ctx, q, d.t.insertMessages(p, d.register))
	return nil, err
}

// InsertDelayed stores messages with their p.DueAt times, to be moved into
// the messages table when due, and notifies "d" + the earliest due time in
// Unix milliseconds.
func (d singleNode) InsertDelayed(ctx context.Context, q Querier, p InsertMessagesParams) error {
	_, err := d.InsertDelayedKeyed(ctx, q, p)
	return err
}

// InsertDelayedKeyed is InsertDelayed, and returns the indexes of the
// messages it left out, their keys stored already.
func (d singleNode) InsertDelayedKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	if keyed(p) {
		return strictFirst(ctx, q, func(strict bool) Stmt { return d.t.insertDelayedKeyed(p, strict) })
	}
	_, err := exec(ctx, q, d.t.InsertDelayed(p))
	return nil, err
}

// UpsertTopicResult is the row of [UpsertTopic].
type UpsertTopicResult struct {
	// OldPartitions is the count before (nil when the statement's
	// snapshot had no row), NewPartitions the count written (nil when
	// nothing was written).
	OldPartitions, NewPartitions *int32
	Notified                     int64
}

// UpsertTopic creates the topic's settings row, or raises its partition
// count to p.Partitions (never lowering it: then nothing is written) and
// sets its retention, and notifies.
func (d singleNode) UpsertTopic(ctx context.Context, q Querier, p TopicParams) (UpsertTopicResult, error) {
	return upsertTopic(ctx, q, d.t.UpsertTopic(p))
}

// upsertTopic runs s, a statement of [Driver.UpsertTopic].
func upsertTopic(ctx context.Context, q Querier, s Stmt) (UpsertTopicResult, error) {
	var r UpsertTopicResult
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.OldPartitions, &r.NewPartitions, &r.Notified)
	return r, err
}

// TopicPartitions returns the partition count of each topic (1 for a topic
// with no settings row).
func (d singleNode) TopicPartitions(ctx context.Context, q Querier, topics []string) (map[string]int, error) {
	s := d.t.TopicPartitions(TopicsParams{Topics: topics})
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(topics))
	var topic string
	var n int32
	_, err = pgx.ForEachRow(rows, []any{&topic, &n}, func() error {
		out[topic] = int(n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MessageRow is one message of [SelectMessages]. Payload is nil when the
// message was larger than the bound asked for (Size says how large).
type MessageRow struct {
	Position Position
	UUID     string
	Payload  []byte
	Metadata string // "" for none
	Size     int64
}

// SelectResult is what [SelectMessages] read.
type SelectResult struct {
	Messages []MessageRow
	// Pending reports committed messages after the position that are not
	// visible to every transaction yet (an older transaction still runs).
	Pending bool
	// Future is the highest stored message of the partition whose
	// transaction id lies at or above the database's transaction
	// counter, if any: a row no transaction of this database wrote (its
	// trigger sets every row's transaction id), copied from another
	// cluster or written by the owner. It is not among Messages (it is
	// returned only once the counter has passed it); its Payload and
	// Metadata are not read.
	Future *MessageRow
	// WentBack reports that the statement ran elsewhere than p.Here, or
	// that p.After lies ahead of the transaction counter: the database
	// is not on the history the position was read on. Nothing else is
	// set.
	WentBack bool
	// Elsewhere, with WentBack on Citus, is what the topic's worker was
	// and is (a WorkerWentBackError, an ErrWentBack), for the log; nil
	// otherwise.
	Elsewhere error
	// Bound is the position bound the read used (single node; 0 on
	// Citus): a later read may pass it as SelectMessagesParams.Bound.
	Bound uint64
}

// SelectMessages returns at most p.Limit messages after p.After that every
// transaction can see, in delivery order. A message's size is the length
// of its payload plus the stored size of its metadata; with
// p.MaxMessageBytes, a larger message comes without its payload.
func (d singleNode) SelectMessages(ctx context.Context, q Querier, p SelectMessagesParams) (SelectResult, error) {
	if b, ok := q.(batcher); ok && p.Bound == 0 {
		return d.selectBelowNewBound(ctx, b, p)
	}
	if p.Bound == 0 {
		bounds, err := d.PositionBounds(ctx, q, []string{p.Topic}, []int32{p.Partition})
		if err != nil {
			return SelectResult{}, err
		}
		p.Bound = bounds[0]
	}
	res, err := selectMessages(ctx, q, d.t.SelectMessages(p), p.Limit)
	if err == nil && !res.WentBack {
		res.Bound = p.Bound
	}
	return res, err
}

// SelectMessagesAt returns the messages of p.Positions that are stored,
// whole, in delivery order: messages read before (below a position bound
// then), whose payloads the reader dropped. A position whose message is
// no longer stored (retention removed it) is left out.
func (d singleNode) SelectMessagesAt(ctx context.Context, q Querier, p SelectMessagesAtParams) (SelectResult, error) {
	return selectMessagesAt(ctx, q, d.t.SelectMessagesAt(p), p.Positions)
}

// selectMessagesAt runs s, a statement of [Driver.SelectMessagesAt], and
// keeps the rows at positions (the statement's arrays select a superset
// of them).
func selectMessagesAt(ctx context.Context, q Querier, s Stmt, positions []Position) (SelectResult, error) {
	if len(positions) == 0 {
		return SelectResult{}, nil
	}
	res, err := selectMessages(ctx, q, s, len(positions))
	if err != nil || res.WentBack || len(positions) == 1 {
		return res, err
	}
	want := make(map[Position]bool, len(positions))
	for _, p := range positions {
		want[p] = true
	}
	kept := res.Messages[:0]
	for _, m := range res.Messages {
		if want[m.Position] {
			kept = append(kept, m)
		}
	}
	res.Messages = kept
	return res, nil
}

// PositionBounds implements Driver: one statement, whose snapshot the
// reads that use the bounds must not share (each later statement of READ
// COMMITTED takes its own).
func (d singleNode) PositionBounds(ctx context.Context, q Querier, topics []string, partitions []int32) ([]uint64, error) {
	s := d.t.PositionBounds(topics, partitions)
	var bounds []int64
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&bounds); err != nil {
		return nil, err
	}
	if len(bounds) != len(topics) {
		return nil, fmt.Errorf("pgsql: %d position bounds for %d rows", len(bounds), len(topics))
	}
	out := make([]uint64, len(bounds))
	for i, b := range bounds {
		out[i] = uint64(b)
	}
	return out, nil
}

// selectBelowNewBound is SelectMessages with a new bound in one round trip:
// the bound's statement and the read are sent together (a pipeline, or one
// multi-statement query under the simple protocol), which PostgreSQL runs
// as one implicit transaction; at READ COMMITTED each statement still
// takes its own snapshot, the read's after the bound's statement ended, as
// decision 0008 needs. The bound reaches the read through a setting local
// to that transaction (SelectMessagesBound).
func (d singleNode) selectBelowNewBound(ctx context.Context, q batcher, p SelectMessagesParams) (SelectResult, error) {
	bound, read := d.t.SelectMessagesBound(p)
	b := &pgx.Batch{}
	b.Queue(bound.SQL, bound.Args...)
	b.Queue(read.SQL, read.Args...)
	br := q.SendBatch(ctx, b)
	var (
		value int64
		set   string
	)
	if err := br.QueryRow().Scan(&value, &set); err != nil {
		_ = br.Close()
		return SelectResult{}, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return SelectResult{}, err
	}
	res, err := scanMessages(rows, p.Limit)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return SelectResult{}, err
	}
	if !res.WentBack {
		res.Bound = uint64(value)
	}
	return res, nil
}

// selectMessages runs s, a statement of [Driver.SelectMessages] reading at
// most limit messages.
func selectMessages(ctx context.Context, q Querier, s Stmt, limit int) (SelectResult, error) {
	res, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return SelectResult{}, err
	}
	return scanMessages(res, limit)
}

// scanMessages reads the rows of a statement of [Driver.SelectMessages]
// and closes them.
func scanMessages(res pgx.Rows, limit int) (SelectResult, error) {
	var err error
	defer res.Close()
	out := SelectResult{Messages: make([]MessageRow, 0, limit)}
	// The scan targets are values declared once, and the transaction id is
	// parsed from the row's raw bytes: per message, only the UUID, the
	// payload and the metadata are allocated (measured: 7.4 allocations per
	// message with pointer targets declared in the loop).
	var (
		offset, size      pgtype.Int8
		msgUUID, metadata pgtype.Text
		payload           []byte
		more, future      bool
		wentBack          bool
		dest              = []any{&offset, nil, &msgUUID, &payload, &metadata, &more, &future, &size, &wentBack}
	)
	for res.Next() {
		payload = nil
		if err := res.Scan(dest...); err != nil {
			return SelectResult{}, err
		}
		if wentBack {
			return SelectResult{WentBack: true}, nil
		}
		if future {
			out.Pending = out.Pending || more
			txText := res.RawValues()[1]
			if !offset.Valid || txText == nil || !msgUUID.Valid {
				return SelectResult{}, fmt.Errorf("incomplete row")
			}
			f := &MessageRow{UUID: msgUUID.String}
			f.Position.Offset = offset.Int64
			if f.Position.TransactionID, err = parseXID8Bytes(txText); err != nil {
				return SelectResult{}, err
			}
			out.Future = f
			continue
		}
		if more {
			out.Pending = true
			continue
		}
		txText := res.RawValues()[1]
		if !offset.Valid || txText == nil || !msgUUID.Valid || !size.Valid {
			return SelectResult{}, fmt.Errorf("incomplete row")
		}
		m := MessageRow{UUID: msgUUID.String, Payload: payload, Size: size.Int64}
		m.Position.Offset = offset.Int64
		if m.Position.TransactionID, err = parseXID8Bytes(txText); err != nil {
			return SelectResult{}, err
		}
		if metadata.Valid {
			m.Metadata = metadata.String
		}
		out.Messages = append(out.Messages, m)
	}
	if err := res.Err(); err != nil {
		return SelectResult{}, err
	}
	return out, nil
}

// VisibleTopics returns the (1-based) index of each row of p that has a
// visible message after its position.
func (d singleNode) VisibleTopics(ctx context.Context, q Querier, p VisibleTopicsParams) ([]int64, error) {
	return collect(ctx, q, d.t.VisibleTopics(p), pgx.RowTo[int64])
}

// --- sessions

// ClusterMark is where the database was when a statement ran: its
// transaction counter (xid8 as text), WAL position in bytes (numeric as
// text), timeline (8 hex digits) and identity (see [Here]).
type ClusterMark struct {
	Xmax     uint64
	LSN      string
	Timeline string
	Here     string
}

// CreateSession inserts a session row expiring at now() + TTL (and deletes
// p.ReplacesSessionID), notifies the group, and returns where the
// database is.
func (d singleNode) CreateSession(ctx context.Context, q Querier, p SessionParams) (ClusterMark, error) {
	return createSession(ctx, q, d.t.CreateSession(p))
}

// createSession runs s, a statement of [Driver.CreateSession].
func createSession(ctx context.Context, q Querier, s Stmt) (ClusterMark, error) {
	var (
		notified int64
		m        ClusterMark
	)
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&notified, (*xid8)(&m.Xmax), &m.LSN, &m.Timeline, &m.Here)
	return m, err
}

// HeartbeatRow is the row of [HeartbeatSession]: the rows updated (0: the
// session is lost), and where the database is.
type HeartbeatRow struct {
	Updated int64
	ClusterMark
}

// HeartbeatSession moves the session's expiry to now() + TTL only if it has
// not expired yet, and reads where the database is (for uuid.Nil it
// updates nothing and only reads that).
func (d singleNode) HeartbeatSession(ctx context.Context, q Querier, p SessionParams) (HeartbeatRow, error) {
	s := d.t.HeartbeatSession(p)
	var r HeartbeatRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.Updated, (*xid8)(&r.Xmax), &r.LSN, &r.Timeline, &r.Here)
	return r, err
}

// DeleteSession deletes the session row and notifies its group.
func (d singleNode) DeleteSession(ctx context.Context, q Querier, p SessionParams) error {
	_, err := exec(ctx, q, d.t.DeleteSession(p))
	return err
}

// DeleteExpiredSessions deletes the sessions expired for longer than ttl
// and returns how many.
func (d singleNode) DeleteExpiredSessions(ctx context.Context, q Querier, ttl time.Duration) (int64, error) {
	return exec(ctx, q, d.t.DeleteExpiredSessions(SessionParams{TTL: ttl}))
}

// SetSubscriptions records, in the session row, the hash and number of the
// rows the session subscribes to, and notifies the group. It reports false
// when the session row is gone.
func (d singleNode) SetSubscriptions(ctx context.Context, q Querier, p SessionParams) (bool, error) {
	return setSubscriptions(ctx, q, d.t.SetSubscriptions(p))
}

// setSubscriptions runs s, a statement of [Driver.SetSubscriptions].
func setSubscriptions(ctx context.Context, q Querier, s Stmt) (bool, error) {
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return false, err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	return rows.CommandTag().RowsAffected() > 0, nil
}

// MemberRow is one live session of a group ([GroupMembers]).
type MemberRow struct {
	ID               uuid.UUID
	CreatedAt        time.Time
	ExpiresInMs      int64 // by the server's clock
	SubscriptionHash int64
	SubscriptionSize int
	Owner            string // host/pid, for humans
	// Protocol is the version of the group's rules the session follows:
	// 1 for the sessions of releases that do not record it (the column's
	// default).
	Protocol int
}

// GroupMembers returns the live sessions of a consumer group.
func (d singleNode) GroupMembers(ctx context.Context, q Querier, group string) ([]MemberRow, error) {
	return collect(ctx, q, d.t.GroupMembers(GroupParams{ConsumerGroup: group}), pgx.RowToStructByPos[MemberRow])
}

// --- offsets

// OwnerRow is a row of [OffsetOwners]: who owns an offset row (nil:
// nobody), under which epoch.
type OwnerRow struct {
	Topic     string
	Partition int32
	SessionID *uuid.UUID
	Epoch     int64
}

// OffsetOwners reads the owner and epoch of group's offset rows of topics.
func (d singleNode) OffsetOwners(ctx context.Context, q Querier, group string, topics []string) ([]OwnerRow, error) {
	return collect(ctx, q, d.t.OffsetOwners(OffsetsParams{ConsumerGroup: group, Topics: topics}), pgx.RowToStructByPos[OwnerRow])
}

// EnsuredRow is an offset row [EnsureOffsets] created, and the transaction
// id of the position it starts at (0: the beginning of the partition).
type EnsuredRow struct {
	Topic              string
	Partition          int32
	AckedTransactionID uint64
}

// EnsureOffsets creates the missing offset rows of p's (topic, partition)
// rows at the beginning of each, or, with p.Latest and for a topic the
// group has no row of yet, just below the xmin horizon.
func (d singleNode) EnsureOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]EnsuredRow, error) {
	return collect(ctx, q, d.t.EnsureOffsets(p), func(row pgx.CollectableRow) (EnsuredRow, error) {
		var r EnsuredRow
		err := row.Scan(&r.Topic, &r.Partition, (*xid8)(&r.AckedTransactionID))
		return r, err
	})
}

// Kinds of the rows of [ClaimOffsets].
const (
	ClaimTaken   = 'c' // claimed
	ClaimMissing = 'm' // no offset row
	ClaimFuture  = 'f' // position ahead of the transaction counter: not claimed
	ClaimLost    = 'l' // free in the snapshot, changed by another transaction before the claim
	// ClaimWentBack is the only row of a claim run elsewhere than
	// p.Here: nothing was claimed.
	ClaimWentBack = 'w'
)

// ClaimRow is one row of [ClaimOffsets]. The fields after Partition are
// set for ClaimTaken only.
type ClaimRow struct {
	Kind      byte
	Topic     string
	Partition int32
	Epoch     int64
	Acked     Position
	// HasNext reports a message after the position.
	HasNext bool
	// Previous is the session the row was taken from (uuid.Nil when it
	// was free or already the claimer's); PreviousOwner its owner, empty
	// when that session's row was gone.
	Previous      uuid.UUID
	PreviousOwner string
	// WorkerHere is, on Citus, the identity of the worker that holds
	// the row (see [Here]), read when it was claimed.
	WorkerHere string
	// AckedAbove are the positions after Acked that are acknowledged
	// already (the row's acked_above): the claim skips their messages.
	AckedAbove []Position
}

// parseAbove parses acked_above entries ("xid:offset", [AboveEntry]).
func parseAbove(entries []string) ([]Position, error) {
	var out []Position
	for _, e := range entries {
		tx, off, ok := strings.Cut(e, ":")
		if !ok {
			return nil, fmt.Errorf("parse acked_above entry %q: no colon", e)
		}
		x, err := parseXID8(tx)
		if err != nil {
			return nil, fmt.Errorf("parse acked_above entry %q: %w", e, err)
		}
		o, err := strconv.ParseInt(off, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parse acked_above entry %q: %w", e, err)
		}
		out = append(out, Position{TransactionID: x, Offset: o})
	}
	return out, nil
}

// ClaimOffsets claims, for p.SessionID, up to p.Limit of p's (topic,
// partition) rows that are free, bumping their epochs (see the statement,
// [Tables.ClaimOffsets]).
func (d singleNode) ClaimOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]ClaimRow, error) {
	return collect(ctx, q, d.t.ClaimOffsets(p), scanClaim)
}

func scanClaim(row pgx.CollectableRow) (ClaimRow, error) {
	var (
		r         ClaimRow
		kind      string
		epoch     *int64
		txID      *xid8
		offset    *int64
		hasNext   *bool
		previous  *uuid.UUID
		prevOwner *string
		above     []string
	)
	if err := row.Scan(&kind, &r.Topic, &r.Partition, &epoch, &txID, &offset, &hasNext, &previous, &prevOwner,
		&above); err != nil {
		return r, err
	}
	r.Kind = kind[0]
	if r.Kind == ClaimTaken {
		if epoch == nil || txID == nil || offset == nil || hasNext == nil {
			return r, fmt.Errorf("claim topic %q partition %d: incomplete row", r.Topic, r.Partition)
		}
		r.Epoch, r.Acked, r.HasNext = *epoch, Position{TransactionID: uint64(*txID), Offset: *offset}, *hasNext
		var err error
		if r.AckedAbove, err = parseAbove(above); err != nil {
			return r, fmt.Errorf("claim topic %q partition %d: %w", r.Topic, r.Partition, err)
		}
	}
	if previous != nil {
		r.Previous = *previous
	}
	if prevOwner != nil {
		r.PreviousOwner = *prevOwner
	}
	return r, nil
}

// CountHeadDelivery adds one to the row's head_deliveries, fenced by
// session and epoch and only while its acknowledged position is still
// p.Position, and returns the new count; pgx.ErrNoRows: ownership lost;
// [ErrWentBack]: run elsewhere than p.Here, or p.Position lies ahead of
// the transaction counter.
func (d singleNode) CountHeadDelivery(ctx context.Context, q Querier, p OffsetParams) (int32, error) {
	s := d.t.CountHeadDelivery(p)
	var (
		ok bool
		n  *int32
	)
	if err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&ok, &n); err != nil {
		return 0, err
	}
	switch {
	case !ok:
		return 0, ErrWentBack
	case n == nil:
		return 0, pgx.ErrNoRows
	}
	return *n, nil
}

// ErrWentBack is returned by the statements that find they run elsewhere
// than the identity they were given, or with a position ahead of the
// transaction counter (see [Here]).
var ErrWentBack = errors.New("the database is not on the history the session was made on")

// CommitOffset moves the acknowledged position forward, fenced by session
// and epoch, starting from the row version p.Version when it is set. It
// returns the version written (the tuple id, for the next commit) and
// whether a row was written (false: ownership lost); [ErrWentBack] when
// it ran elsewhere than p.Here or p.Position lies ahead of the
// transaction counter.
func (d singleNode) CommitOffset(ctx context.Context, q Querier, p OffsetParams) (version string, written bool, err error) {
	s := d.t.CommitOffset(p)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return "", false, err
	}
	var (
		v        *string
		wentBack bool
	)
	_, err = pgx.ForEachRow(rows, []any{&v, &wentBack}, func() error {
		if wentBack {
			return ErrWentBack
		}
		written = true
		if v != nil {
			version = *v
		}
		return nil
	})
	if err != nil {
		return "", false, err
	}
	return version, written, nil
}

// ReleaseOffset writes the acknowledged position (never moving it back)
// and frees the claim in one statement, fenced by session and epoch, and
// returns the rows released (0: ownership lost); [ErrWentBack] when it ran
// elsewhere than p.Here or p.Position lies ahead of the transaction
// counter (nothing written: the session's positions are not this
// database's). Several at once: [Driver.ReleaseOffsets].
func (d singleNode) ReleaseOffset(ctx context.Context, q Querier, p OffsetParams) (int64, error) {
	s := d.t.ReleaseOffset(p)
	return ScanRelease(q.QueryRow(ctx, s.SQL, s.Args...))
}

// ScanRelease reads the row of [Tables.ReleaseOffset] as [ReleaseOffset]
// returns it.
func ScanRelease(row pgx.Row) (int64, error) {
	var (
		ok       bool
		released int64
	)
	if err := row.Scan(&ok, &released); err != nil {
		return 0, err
	}
	if !ok {
		return 0, ErrWentBack
	}
	return released, nil
}

// AckRow is the row of [AckOffset]: the row as it was before, whether
// the statement moved its position, and whether it ran where p.Here says
// with a position below the transaction counter (false: nothing written).
type AckRow struct {
	SessionID *uuid.UUID
	Epoch     int64
	Acked     Position
	Advanced  bool
	OnHistory bool
	// Recorded: the position was in the row's acked_above already (an
	// AckInTx of a message delivered with MaxInFlight above 1 committed).
	Recorded bool
	// Elsewhere, when OnHistory is false on Citus, says what the topic's
	// worker found: a planned move of its shard (a ShardMovedError) or the
	// worker gone back (a WorkerWentBackError); nil otherwise.
	Elsewhere error
}

// AckOffset is what AckInTx runs in the caller's transaction: it locks the
// row and moves its acknowledged position to p.Position (with p.Above,
// records p.Position in acked_above) if the row is still p.SessionID's at
// p.Epoch, the position lies ahead and is not recorded already.
// pgx.ErrNoRows: the row does not exist. With other statements in a
// batch: [Driver.QueueAck].
func (d singleNode) AckOffset(ctx context.Context, q Querier, p OffsetParams) (AckRow, error) {
	s := d.t.AckOffset(p)
	return ScanAck(q.QueryRow(ctx, s.SQL, s.Args...))
}

// ScanAck scans the row of [AckOffset].
func ScanAck(row pgx.Row) (AckRow, error) {
	var r AckRow
	err := row.Scan(&r.SessionID, &r.Epoch, (*xid8)(&r.Acked.TransactionID), &r.Acked.Offset, &r.Advanced, &r.OnHistory, &r.Recorded)
	return r, err
}
