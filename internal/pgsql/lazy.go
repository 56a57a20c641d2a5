package pgsql

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lazy opens the Driver of a set of tables on first use, for the
// components whose constructors must not touch the database: it is a
// Driver whose every method first gets the Driver ([Lazy.Get]) with the
// method's Querier, then runs it. Safe for concurrent use.
type Lazy struct {
	t *Tables
	d atomic.Pointer[Driver]
}

// NewLazy returns a Lazy of t that has read nothing yet.
func NewLazy(t *Tables) *Lazy { return &Lazy{t: t} }

// Tables are the names of the Driver it opens.
func (l *Lazy) Tables() *Tables { return l.t }

// Get returns the Driver, reading the catalog with q ([OpenDriver]) until
// a read finds the messages table; from then on it answers from memory
// (a table is distributed once, by [Tables.DistributeScript], before the
// applications that use it start). Before the table exists, each call
// reads again, so that a set-up that creates the tables later (a
// Publisher's AutoInitializeSchema) is not taken for a single node for
// good.
func (l *Lazy) Get(ctx context.Context, q Querier) (Driver, error) {
	if d := l.d.Load(); d != nil {
		return *d, nil
	}
	d, found, err := openDriver(ctx, q, l.t)
	if err != nil {
		return nil, err
	}
	if found {
		l.d.CompareAndSwap(nil, &d)
		return *l.d.Load(), nil
	}
	return d, nil
}

var _ Driver = (*Lazy)(nil)

// QueueAck implements Driver: the opened Driver's; before the Driver is
// opened, an acknowledgement run after the batch (opening it then).
func (l *Lazy) QueueAck(b *pgx.Batch, p OffsetParams) QueuedAck {
	if d := l.d.Load(); d != nil {
		return (*d).QueueAck(b, p)
	}
	return QueuedAck{d: l, p: p}
}

// InsertMessages implements Driver.
func (l *Lazy) InsertMessages(ctx context.Context, q Querier, p InsertMessagesParams) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.InsertMessages(ctx, q, p)
}

// InsertDelayed implements Driver.
func (l *Lazy) InsertDelayed(ctx context.Context, q Querier, p InsertMessagesParams) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.InsertDelayed(ctx, q, p)
}

// InsertKeyed implements Driver.
func (l *Lazy) InsertKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InsertKeyed(ctx, q, p)
}

// InsertDelayedKeyed implements Driver.
func (l *Lazy) InsertDelayedKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InsertDelayedKeyed(ctx, q, p)
}

// KeyLanes implements Driver.
func (l *Lazy) KeyLanes(ctx context.Context, q Querier) ([]KeyLane, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.KeyLanes(ctx, q)
}

// AddKeyPartitions implements Driver.
func (l *Lazy) AddKeyPartitions(ctx context.Context, q Querier, class int) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.AddKeyPartitions(ctx, q, class)
}

// KeysLockHolders implements Driver.
func (l *Lazy) KeysLockHolders(ctx context.Context, q Querier) ([]string, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.KeysLockHolders(ctx, q)
}

// SetKeysSince implements Driver.
func (l *Lazy) SetKeysSince(ctx context.Context, q Querier, class int) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.SetKeysSince(ctx, q, class)
}

// ForgetKeys implements Driver.
func (l *Lazy) ForgetKeys(ctx context.Context, q Querier) (int, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return 0, err
	}
	return d.ForgetKeys(ctx, q)
}

// UpsertTopic implements Driver.
func (l *Lazy) UpsertTopic(ctx context.Context, q Querier, p TopicParams) (UpsertTopicResult, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return UpsertTopicResult{}, err
	}
	return d.UpsertTopic(ctx, q, p)
}

// TopicPartitions implements Driver.
func (l *Lazy) TopicPartitions(ctx context.Context, q Querier, topics []string) (map[string]int, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.TopicPartitions(ctx, q, topics)
}

// SelectMessagesAt implements Driver.
func (l *Lazy) SelectMessagesAt(ctx context.Context, q Querier, p SelectMessagesAtParams) (SelectResult, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return SelectResult{}, err
	}
	return d.SelectMessagesAt(ctx, q, p)
}

// SelectMessages implements Driver.
func (l *Lazy) SelectMessages(ctx context.Context, q Querier, p SelectMessagesParams) (SelectResult, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return SelectResult{}, err
	}
	return d.SelectMessages(ctx, q, p)
}

// OpenPublishers implements Driver.
func (l *Lazy) OpenPublishers(ctx context.Context, q Querier) ([]PublisherRow, bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, false, err
	}
	return d.OpenPublishers(ctx, q)
}

// BoundHolder implements Driver.
func (l *Lazy) BoundHolder(ctx context.Context, q Querier, topic string, partition int32) (HorizonRow, bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return HorizonRow{}, false, err
	}
	return d.BoundHolder(ctx, q, topic, partition)
}

// PositionBounds implements Driver.
func (l *Lazy) PositionBounds(ctx context.Context, q Querier, topics []string, partitions []int32) ([]uint64, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.PositionBounds(ctx, q, topics, partitions)
}

// VisibleTopics implements Driver.
func (l *Lazy) VisibleTopics(ctx context.Context, q Querier, p VisibleTopicsParams) ([]int64, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.VisibleTopics(ctx, q, p)
}

// CreateSession implements Driver.
func (l *Lazy) CreateSession(ctx context.Context, q Querier, p SessionParams) (ClusterMark, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return ClusterMark{}, err
	}
	return d.CreateSession(ctx, q, p)
}

// HeartbeatSession implements Driver.
func (l *Lazy) HeartbeatSession(ctx context.Context, q Querier, p SessionParams) (HeartbeatRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return HeartbeatRow{}, err
	}
	return d.HeartbeatSession(ctx, q, p)
}

// DeleteSession implements Driver.
func (l *Lazy) DeleteSession(ctx context.Context, q Querier, p SessionParams) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.DeleteSession(ctx, q, p)
}

// DeleteExpiredSessions implements Driver.
func (l *Lazy) DeleteExpiredSessions(ctx context.Context, q Querier, ttl time.Duration) (int64, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return 0, err
	}
	return d.DeleteExpiredSessions(ctx, q, ttl)
}

// SetSubscriptions implements Driver.
func (l *Lazy) SetSubscriptions(ctx context.Context, q Querier, p SessionParams) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.SetSubscriptions(ctx, q, p)
}

// GroupMembers implements Driver.
func (l *Lazy) GroupMembers(ctx context.Context, q Querier, group string) ([]MemberRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.GroupMembers(ctx, q, group)
}

// OffsetOwners implements Driver.
func (l *Lazy) OffsetOwners(ctx context.Context, q Querier, group string, topics []string) ([]OwnerRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.OffsetOwners(ctx, q, group, topics)
}

// EnsureOffsets implements Driver.
func (l *Lazy) EnsureOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]EnsuredRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.EnsureOffsets(ctx, q, p)
}

// ClaimOffsets implements Driver.
func (l *Lazy) ClaimOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]ClaimRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.ClaimOffsets(ctx, q, p)
}

// CountHeadDelivery implements Driver.
func (l *Lazy) CountHeadDelivery(ctx context.Context, q Querier, p OffsetParams) (int32, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return 0, err
	}
	return d.CountHeadDelivery(ctx, q, p)
}

// CommitOffset implements Driver.
func (l *Lazy) CommitOffset(ctx context.Context, q Querier, p OffsetParams) (string, bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return "", false, err
	}
	return d.CommitOffset(ctx, q, p)
}

// ReleaseOffset implements Driver.
func (l *Lazy) ReleaseOffset(ctx context.Context, q Querier, p OffsetParams) (int64, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return 0, err
	}
	return d.ReleaseOffset(ctx, q, p)
}

// AckOffset implements Driver.
func (l *Lazy) AckOffset(ctx context.Context, q Querier, p OffsetParams) (AckRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return AckRow{}, err
	}
	return d.AckOffset(ctx, q, p)
}

// InspectSessions implements Driver.
func (l *Lazy) InspectSessions(ctx context.Context, q Querier) ([]SessionRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InspectSessions(ctx, q)
}

// InspectLag implements Driver.
func (l *Lazy) InspectLag(ctx context.Context, q Querier, groups, topics []string) ([]LagRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InspectLag(ctx, q, groups, topics)
}

// InspectHorizon implements Driver.
func (l *Lazy) InspectHorizon(ctx context.Context, q Querier) (HorizonRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return HorizonRow{}, err
	}
	return d.InspectHorizon(ctx, q)
}

// InspectTopics implements Driver.
func (l *Lazy) InspectTopics(ctx context.Context, q Querier, schema int) ([]TopicRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InspectTopics(ctx, q, schema)
}

// InspectTopicsPage implements Driver.
func (l *Lazy) InspectTopicsPage(ctx context.Context, q Querier, p TopicsPageParams) ([]TopicPageRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InspectTopicsPage(ctx, q, p)
}

// ResetOffsets implements Driver.
func (l *Lazy) ResetOffsets(ctx context.Context, q Querier, p ResetParams) ([]ResetRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.ResetOffsets(ctx, q, p)
}

// InspectSettings implements Driver.
func (l *Lazy) InspectSettings(ctx context.Context, q Querier) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.InspectSettings(ctx, q)
}

// InspectWorkers implements Driver.
func (l *Lazy) InspectWorkers(ctx context.Context, q Querier) (WorkersRow, bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return WorkersRow{}, false, err
	}
	return d.InspectWorkers(ctx, q)
}

// MaintainerAccess implements Driver.
func (l *Lazy) MaintainerAccess(ctx context.Context, q Querier) (AccessRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return AccessRow{}, err
	}
	return d.MaintainerAccess(ctx, q)
}

// MaintainerHolder implements Driver.
func (l *Lazy) MaintainerHolder(ctx context.Context, q Querier) (HolderRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return HolderRow{}, err
	}
	return d.MaintainerHolder(ctx, q)
}

// ClaimMaintainer implements Driver.
func (l *Lazy) ClaimMaintainer(ctx context.Context, q Querier, p MaintainerParams) (HolderRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return HolderRow{}, err
	}
	return d.ClaimMaintainer(ctx, q, p)
}

// ReleaseMaintainer implements Driver.
func (l *Lazy) ReleaseMaintainer(ctx context.Context, q Querier, p MaintainerParams) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.ReleaseMaintainer(ctx, q, p)
}

// MoveDueMessages implements Driver.
func (l *Lazy) MoveDueMessages(ctx context.Context, q Querier, p MoveDueParams) (int64, *int64, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return 0, nil, err
	}
	return d.MoveDueMessages(ctx, q, p)
}

// DeleteIdleGroups implements Driver.
func (l *Lazy) DeleteIdleGroups(ctx context.Context, q Querier, idleFor time.Duration) ([]IdleGroupRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.DeleteIdleGroups(ctx, q, idleFor)
}

// RetentionLanes implements Driver.
func (l *Lazy) RetentionLanes(ctx context.Context, q Querier) ([]LaneRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.RetentionLanes(ctx, q)
}

// MessagesLockHolders implements Driver.
func (l *Lazy) MessagesLockHolders(ctx context.Context, q Querier) ([]string, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.MessagesLockHolders(ctx, q)
}

// SetUsableUntil implements Driver.
func (l *Lazy) SetUsableUntil(ctx context.Context, q Querier, class int, until time.Time) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.SetUsableUntil(ctx, q, class, until)
}

// RetentionPartitions implements Driver.
func (l *Lazy) RetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.RetentionPartitions(ctx, q)
}

// DetachedRetentionPartitions implements Driver.
func (l *Lazy) DetachedRetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.DetachedRetentionPartitions(ctx, q)
}

// CreateRetentionPartition implements Driver.
func (l *Lazy) CreateRetentionPartition(ctx context.Context, db Beginner, p RetentionPartition) error {
	q, ok := db.(Querier)
	if !ok {
		return fmt.Errorf("pgsql: CreateRetentionPartition needs a *pgxpool.Pool, *pgx.Conn or pgx.Tx, got %T", db)
	}
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.CreateRetentionPartition(ctx, db, p)
}

// DetachRetentionPartition implements Driver.
func (l *Lazy) DetachRetentionPartition(ctx context.Context, q Querier, p RetentionPartition, finalize bool) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.DetachRetentionPartition(ctx, q, p, finalize)
}

// DropRetentionPartition implements Driver.
func (l *Lazy) DropRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.DropRetentionPartition(ctx, q, p)
}

// CallAddRetentionPartition implements Driver.
func (l *Lazy) CallAddRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.CallAddRetentionPartition(ctx, q, p)
}

// CallExpireRetentionPartition implements Driver.
func (l *Lazy) CallExpireRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.CallExpireRetentionPartition(ctx, q, p)
}

// CallDropDetachedPartition implements Driver.
func (l *Lazy) CallDropDetachedPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return false, err
	}
	return d.CallDropDetachedPartition(ctx, q, p)
}

// UnacknowledgedInPartition implements Driver.
func (l *Lazy) UnacknowledgedInPartition(ctx context.Context, q Querier, p RetentionPartition) ([]SkippedRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.UnacknowledgedInPartition(ctx, q, p)
}

// DeleteExpiredKept implements Driver.
func (l *Lazy) DeleteExpiredKept(ctx context.Context, q Querier, limit int) ([]SkippedRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.DeleteExpiredKept(ctx, q, limit)
}

// MessagesNewestFirst implements Driver.
func (l *Lazy) MessagesNewestFirst(ctx context.Context, q Querier, p BrowseParams) ([]BrowseRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.MessagesNewestFirst(ctx, q, p)
}

// MessagesByUUID implements Driver.
func (l *Lazy) MessagesByUUID(ctx context.Context, q Querier, topic, id string, preview, limit int) ([]BrowseRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.MessagesByUUID(ctx, q, topic, id, preview, limit)
}

// DeleteMessagesForReplay implements Driver.
func (l *Lazy) DeleteMessagesForReplay(ctx context.Context, q Querier, p ReplayParams) ([]BrowseRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.DeleteMessagesForReplay(ctx, q, p)
}

// TopicDetail implements Driver.
func (l *Lazy) TopicDetail(ctx context.Context, q Querier, topic string, schema int) (TopicDetailRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return TopicDetailRow{}, err
	}
	return d.TopicDetail(ctx, q, topic, schema)
}

// CountTopicMessages implements Driver.
func (l *Lazy) CountTopicMessages(ctx context.Context, q Querier, topics []string, capPerTopic int64) ([]TopicCountRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.CountTopicMessages(ctx, q, topics, capPerTopic)
}

// EstimateTopicMessages implements Driver.
func (l *Lazy) EstimateTopicMessages(ctx context.Context, q Querier, topic string) (int64, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return 0, err
	}
	return d.EstimateTopicMessages(ctx, q, topic)
}

// LockGroupOffsets implements Driver.
func (l *Lazy) LockGroupOffsets(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.LockGroupOffsets(ctx, q, group)
}

// GroupLiveOwners implements Driver.
func (l *Lazy) GroupLiveOwners(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.GroupLiveOwners(ctx, q, group)
}

// DeleteGroupOffsets implements Driver.
func (l *Lazy) DeleteGroupOffsets(ctx context.Context, q Querier, group string, locked []GroupOffsetRow) (DeleteGroupOffsetsResult, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return DeleteGroupOffsetsResult{}, err
	}
	return d.DeleteGroupOffsets(ctx, q, group, locked)
}

// ReleaseOffsets implements Driver.
func (l *Lazy) ReleaseOffsets(ctx context.Context, q BatchQuerier, ps []OffsetParams, timeout time.Duration) ([]ReleaseResult, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.ReleaseOffsets(ctx, q, ps, timeout)
}

// InspectWaiting implements Driver.
func (l *Lazy) InspectWaiting(ctx context.Context, q Querier, groups, topics []string) ([]WaitingInspectRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.InspectWaiting(ctx, q, groups, topics)
}

// LoadWaiting implements Driver.
func (l *Lazy) LoadWaiting(ctx context.Context, q Querier, p OffsetParams) ([]WaitingRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	return d.LoadWaiting(ctx, q, p)
}

// RecordWaiting implements Driver.
func (l *Lazy) RecordWaiting(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return WaitingRow{}, err
	}
	return d.RecordWaiting(ctx, q, p)
}

// LoadHandedOut implements Driver.
func (l *Lazy) LoadHandedOut(ctx context.Context, q Querier, p OffsetParams) (Position, bool, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return Position{}, false, err
	}
	return d.LoadHandedOut(ctx, q, p)
}

// MarkHandedOut implements Driver.
func (l *Lazy) MarkHandedOut(ctx context.Context, q Querier, p OffsetParams) error {
	d, err := l.Get(ctx, q)
	if err != nil {
		return err
	}
	return d.MarkHandedOut(ctx, q, p)
}

// DeadLetterOffset implements Driver.
func (l *Lazy) DeadLetterOffset(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error) {
	d, err := l.Get(ctx, q)
	if err != nil {
		return WaitingRow{}, err
	}
	return d.DeadLetterOffset(ctx, q, p)
}
