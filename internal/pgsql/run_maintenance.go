package pgsql

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// AccessRow is the row of [MaintainerAccess].
type AccessRow struct {
	Role  string // current_user
	Owner string // the messages table's owner
	// Owns reports that the role has the owner's privileges: it runs the
	// partition DDL itself.
	Owns bool
	// Missing lists what it lacks of the grants of pglease.GrantSQL to do
	// the work through the owner's functions instead; empty when nothing.
	Missing []string
}

// MaintainerAccess tells how the connected role can do the maintainer's
// work. pgx.ErrNoRows: the messages table is missing.
func (d singleNode) MaintainerAccess(ctx context.Context, q Querier) (AccessRow, error) {
	s := d.t.MaintainerAccess()
	var r AccessRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.Role, &r.Owner, &r.Owns, &r.Missing)
	return r, err
}

// HolderRow says who holds the maintainer's row: Holder is nil when it is
// free, ExpiresInMs nil when the holder has no session row. Epoch, from
// [ClaimMaintainer] only, is the epoch claimed (nil: not claimed).
type HolderRow struct {
	Epoch       *int64
	Holder      *[16]byte
	ExpiresInMs *int64
}

// MaintainerHolder reads, without locking or writing anything, who holds
// the maintainer's row. pgx.ErrNoRows: the row is missing.
func (d singleNode) MaintainerHolder(ctx context.Context, q Querier) (HolderRow, error) {
	s := d.t.MaintainerHolder()
	var r HolderRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.Holder, &r.ExpiresInMs)
	return r, err
}

// ClaimMaintainer makes p.SessionID the maintainer if the row is free (no
// owner, the owner's session gone or expired, or already p.SessionID's).
// pgx.ErrNoRows: the row is missing.
func (d singleNode) ClaimMaintainer(ctx context.Context, q Querier, p MaintainerParams) (HolderRow, error) {
	s := d.t.ClaimMaintainer(p)
	var r HolderRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.Epoch, &r.Holder, &r.ExpiresInMs)
	return r, err
}

// ReleaseMaintainer frees the maintainer's row if p.SessionID still holds
// it at p.Epoch, and notifies.
func (d singleNode) ReleaseMaintainer(ctx context.Context, q Querier, p MaintainerParams) error {
	_, err := exec(ctx, q, d.t.ReleaseMaintainer(p))
	return err
}

// MoveDueMessages moves up to p.Limit due delayed messages, oldest due
// first, into the messages table, and returns how many, and in how many
// milliseconds the next one is due (nil: none waits).
func (d singleNode) MoveDueMessages(ctx context.Context, q Querier, p MoveDueParams) (moved int64, nextMs *int64, err error) {
	return moveDueMessages(ctx, q, d.t.moveDueMessages(p, d.register))
}

// moveDueMessages runs s, a statement of [Driver.MoveDueMessages].
func moveDueMessages(ctx context.Context, q Querier, s Stmt) (moved int64, nextMs *int64, err error) {
	err = q.QueryRow(ctx, s.SQL, s.Args...).Scan(&moved, &nextMs)
	return moved, nextMs, err
}

// IdleGroupRow is a consumer group whose offset rows [DeleteIdleGroups]
// deleted.
type IdleGroupRow struct {
	ConsumerGroup string
	Rows          int64
}

// DeleteIdleGroups deletes the offset rows of consumer groups that have no
// live session and whose rows were all last written more than idleFor ago.
func (d singleNode) DeleteIdleGroups(ctx context.Context, q Querier, idleFor time.Duration) ([]IdleGroupRow, error) {
	return collect(ctx, q, d.t.DeleteIdleGroups(idleFor), pgx.RowToStructByPos[IdleGroupRow])
}

// LaneRow is one retention class with a row in the retention table.
type LaneRow struct {
	Class        int16
	CoveredUntil time.Time
	// UsableUntil is how far publishers place messages in the class's
	// partitions (at most CoveredUntil: see [Driver.SetUsableUntil]).
	UsableUntil time.Time
	// LongestUs is the longest retention of the class's topics in
	// microseconds (nil: no topic has the class).
	LongestUs *int64
	Now       time.Time
}

// RetentionLanes returns the retention classes in use.
func (d singleNode) RetentionLanes(ctx context.Context, q Querier) ([]LaneRow, error) {
	return collect(ctx, q, d.t.RetentionLanes(), pgx.RowToStructByPos[LaneRow])
}

// PartitionRow is one retention partition: its class, the Unix time (s)
// its slot starts at, and (for [RetentionPartitions]) whether a detach is
// pending.
type PartitionRow struct {
	Class         int32
	Start         int64
	DetachPending bool
}

// RetentionPartitions returns the partitions of the retention classes.
func (d singleNode) RetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error) {
	return collect(ctx, q, d.t.RetentionPartitions(), pgx.RowToStructByPos[PartitionRow])
}

// DetachedRetentionPartitions returns the tables named as retention
// partitions of the messages table that are no partition any more.
func (d singleNode) DetachedRetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error) {
	return collect(ctx, q, d.t.DetachedRetentionPartitions(), func(row pgx.CollectableRow) (PartitionRow, error) {
		var r PartitionRow
		err := row.Scan(&r.Class, &r.Start)
		return r, err
	})
}

// Beginner begins a transaction (a savepoint on a pgx.Tx).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CreateRetentionPartition adds the partition and records that its class
// is covered up to its end, in one transaction of db. It needs the owner's
// privileges.
func (d singleNode) CreateRetentionPartition(ctx context.Context, db Beginner, p RetentionPartition) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, stmt := range d.t.CreateRetentionPartition(p) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
}

// DetachRetentionPartition detaches the partition without blocking readers
// (CONCURRENTLY, outside a transaction), or, with finalize, completes a
// detach that was interrupted. It needs the owner's privileges. Where
// the messages table is distributed by Citus, which refuses CONCURRENTLY,
// it detaches in a transaction that waits at most 5 s for its lock.
func (d singleNode) DetachRetentionPartition(ctx context.Context, q Querier, p RetentionPartition, finalize bool) error {
	_, err := q.Exec(ctx, d.t.DetachRetentionPartition(p, finalize))
	return err
}

// DropRetentionPartition drops a detached partition. It needs the owner's
// privileges.
func (d singleNode) DropRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) error {
	_, err := q.Exec(ctx, d.t.DropRetentionPartition(p))
	return err
}

// CallAddRetentionPartition does what CreateRetentionPartition does,
// through the owner's function: false when the partition exists already.
func (d singleNode) CallAddRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	return queryBool(ctx, q, d.t.CallAddRetentionPartition(p))
}

// CallExpireRetentionPartition detaches and drops the partition, or
// finishes a detach left pending, through the owner's function: false when
// it is no partition of the messages table.
func (d singleNode) CallExpireRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	return queryBool(ctx, q, d.t.CallExpireRetentionPartition(p))
}

// CallDropDetachedPartition drops a detached retention partition through
// the owner's function: false when there is no table of that name.
func (d singleNode) CallDropDetachedPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	return queryBool(ctx, q, d.t.CallDropDetachedPartition(p))
}

func queryBool(ctx context.Context, q Querier, s Stmt) (bool, error) {
	var b bool
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&b)
	return b, err
}

// SkippedRow counts messages after a consumer group's position on one
// (topic, partition); a row whose ConsumerGroup is nil is a statement's
// total.
type SkippedRow struct {
	ConsumerGroup *string
	Topic         *string
	Partition     *int32
	Messages      int64
}

// UnacknowledgedInPartition counts, per consumer group, topic and
// partition, the messages of the retention partition after the group's
// position.
func (d singleNode) UnacknowledgedInPartition(ctx context.Context, q Querier, p RetentionPartition) ([]SkippedRow, error) {
	return collect(ctx, q, d.t.UnacknowledgedInPartition(p), pgx.RowToStructByPos[SkippedRow])
}

// DeleteExpiredKept deletes, at most limit rows, the messages in the
// partition of messages kept forever whose topic has a retention now and
// that are older than it: one total row (the rows deleted), then one row
// per (consumer group, topic, partition) with those after the group's
// position. Where the messages table is distributed by Citus, it runs
// one statement per topic with a retention, each routed to the topic's
// worker.
func (d singleNode) DeleteExpiredKept(ctx context.Context, q Querier, limit int) ([]SkippedRow, error) {
	return collect(ctx, q, d.t.DeleteExpiredKept(limit), pgx.RowToStructByPos[SkippedRow])
}
