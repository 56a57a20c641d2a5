package pgsql

import (
	"time"

	"github.com/google/uuid"
)

// Migration is one step of the versioned schema. Versions start at 1 and
// grow by one; a step runs once, in a transaction, under an advisory lock.
type Migration struct {
	Version     int
	Description string
	SQL         string
}

// InsertMessagesParams are the messages of one or more Publish calls,
// written by one statement. The slices have one element per message, in
// publish order.
type InsertMessagesParams struct {
	Topics   []string
	UUIDs    []string
	Payloads [][]byte
	Metadata []string // JSON objects; "" stores NULL (no metadata)
	// PartitionHashes are the hashes of the messages' partition keys
	// (see pglease.PartitionOf): a message goes to partition hash mod the
	// topic's partition count, read from the topics table by the
	// statement itself. Nil (no message has a key) spreads the messages
	// over the partitions by a hash of their UUID computed by the server.
	PartitionHashes []uint32
	// NotifyChannel, when not empty, is the channel notified once per
	// distinct topic when the statement's transaction commits.
	NotifyChannel string
	// Keys, when not nil, holds the idempotency key of each message, as
	// a UUID's text: 16 bytes of the SHA-256 of the caller's key, "" for
	// a message without one. A message whose key its topic stored within
	// the key window is not stored (see keys.go); without keys the
	// statements are those of a plain insert.
	Keys []string
	// DueAt, when not nil, holds one time per message: the message is
	// delayed until then (Watermill's delay metadata). Only
	// [InsertDelayed] uses it.
	DueAt []time.Time
}

// SelectMessagesParams select the next messages of a topic after a position.
type SelectMessagesParams struct {
	Topic     string
	Partition int32
	After     Position
	Limit     int
	// MaxMessageBytes, when positive, is the size of the largest message
	// returned whole: a larger one is returned without its payload (see
	// [SelectMessages]); 0 means no bound.
	MaxMessageBytes int64
	// Here is the identity of the server the position was read on
	// ([ClusterMark.Here]): the statement reports
	// [SelectResult.WentBack] when it runs elsewhere.
	Here string
	// WorkerHere, on Citus, is the identity of the topic's worker when
	// its row was claimed ([ClaimRow.WorkerHere]), checked on the worker
	// instead of Here. Empty: not checked.
	WorkerHere string
	// Bound, on a single node, is the position below which rows are read
	// ([Driver.PositionBounds]), computed by an earlier statement; 0: the
	// driver computes it first, in a statement of its own. Citus reads
	// below its worker's xmin horizon and ignores it.
	Bound uint64
}

// SelectMessagesAtParams select messages of a topic's partition by their
// positions: messages read once already, whose payloads the reader dropped
// (an in-flight window's messages evicted while their key waits).
type SelectMessagesAtParams struct {
	Topic     string
	Partition int32
	Positions []Position
	// Here and WorkerHere are those of [SelectMessagesParams]: the
	// statement reports [SelectResult.WentBack] when it runs elsewhere,
	// or when a position lies at or above the transaction counter.
	Here       string
	WorkerHere string
}

// VisibleTopicsParams list (topic, partition) rows with a position each;
// the query returns the (1-based) index of every row that has a message
// visible to all readers after its position.
type VisibleTopicsParams struct {
	Topics     []string
	Partitions []int32 // nil: partition 0 of each topic
	Positions  []Position
}

// TopicParams are the settings of one topic.
type TopicParams struct {
	Topic      string
	Partitions int
	// Retention is how long the topic's messages are kept (0: forever),
	// and RetentionClass its class (see migrations/0006_maintenance.sql,
	// version 6), 0 for no retention.
	Retention      time.Duration
	RetentionClass int
	// KeyWindow is how long the topic recognises an idempotency key at
	// least when that is longer than its retention (0: its retention,
	// or a day), and KeyClass the retention class of KeyWindow (0 for
	// none); see keys.go.
	KeyWindow time.Duration
	KeyClass  int
	// NotifyChannel, when not empty, is notified with "p" + topic when the
	// statement creates the topic or raises its partition count.
	NotifyChannel string
}

// TopicsParams name topics whose settings are read together.
type TopicsParams struct {
	Topics []string
}

// SessionParams identify a consumer session.
type SessionParams struct {
	SessionID uuid.UUID
	// NotifyChannel, when not empty, is notified with "g" + consumer group
	// when a session starts or ends or changes its subscriptions, to wake
	// the other members of the group.
	NotifyChannel string
	// SubscriptionHash and SubscriptionSize describe the rows the session
	// subscribes to (see [GroupMembers]).
	SubscriptionHash int64
	SubscriptionSize int
	// ReplacesSessionID, when not uuid.Nil, is an older session of the same
	// Subscriber that is deleted in the same statement that creates SessionID.
	ReplacesSessionID uuid.UUID
	ConsumerGroup     string
	Owner             string
	TTL               time.Duration
	// Protocol is the version of the group's rules the session follows
	// (see [GroupMembers]).
	Protocol int
}

// GroupParams select the sessions of a consumer group.
type GroupParams struct {
	ConsumerGroup string
}

// OffsetsParams name many (topic, partition) rows of one consumer group for
// statements that handle them together.
type OffsetsParams struct {
	ConsumerGroup string
	Topics        []string
	Partitions    []int32 // one per topic; nil: partition 0 of each topic
	SessionID     uuid.UUID
	// Here is the identity of the server the session was made on
	// ([ClusterMark.Here]): a claim run elsewhere claims nothing.
	Here string
	// Limit bounds the rows a claim takes.
	Limit int
	// Latest makes EnsureOffsets create the rows of a topic the group has
	// no row of at all at the end of the topic (every message visible now
	// counts as acknowledged) instead of at the beginning. The rows of a
	// topic the group already has a row of (partitions added after it
	// started on the topic, a row deleted by hand) start at the beginning
	// all the same: their messages were published after the group started.
	Latest bool
}

// OffsetParams identify one (consumer group, topic, partition) row and, for
// fenced statements, the session and epoch that must still own it.
type OffsetParams struct {
	ConsumerGroup string
	Topic         string
	Partition     int32
	SessionID     uuid.UUID
	Epoch         int64
	// Position is the acknowledged position written by commit and release.
	Position Position
	// HeadOut, for commit and release, says that the claim has handed out
	// the message after Position (its handler holds it, or nacked it):
	// when the statement moves the position, the row's head_deliveries
	// becomes 1 instead of 0, so that the next claim to hand that message
	// out counts this one (see [CountHeadDelivery]).
	HeadOut bool
	// Above, for AckOffset, records the acknowledgement of Position in the
	// row's acked_above instead of moving its position: the message was
	// delivered with MaxInFlight above 1, and an earlier one may not be
	// acknowledged yet. The consumer's commits move the position over the
	// contiguous acknowledged prefix; AckOffset finds a position recorded
	// there acknowledged already.
	Above bool
	// AckedAbove, for ReleaseOffset, are positions acknowledged above
	// Position (MaxInFlight above 1: above a message not acknowledged
	// yet). The release adds them to the row's acked_above, where the next
	// claim finds them ([ClaimRow.AckedAbove]) and skips their messages.
	AckedAbove []Position
	// Here is the identity of the server the session was made on
	// ([ClusterMark.Here]): a fenced statement run elsewhere writes
	// nothing.
	Here string
	// Version, when not empty, is where CommitOffset last wrote the row:
	// the tuple id (ctid, as text) of the version it returned. The commit
	// tries that version first, which costs one block read however many
	// older versions a held vacuum horizon keeps, and looks the row up by
	// its key only when that version is no longer the row's latest. It is
	// a hint: the statement's conditions decide as without it.
	Version string
	// WorkerHere is, on Citus, the identity of the topic's worker when
	// the row was claimed ([ClaimRow.WorkerHere]): the statements routed
	// to the worker write nothing on another server or timeline. Empty:
	// not checked.
	WorkerHere string
	// NotifyChannel, when not empty, is notified with "r" + topic when a
	// release frees the row, to wake waiting Subscribers.
	NotifyChannel string
}

// MaintainerParams identify the session that claims or holds the
// maintainer's row.
type MaintainerParams struct {
	SessionID uuid.UUID
	Epoch     int64
	// NotifyChannel, when not empty, is notified with "e" when a release
	// frees the row, to wake the other candidates.
	NotifyChannel string
}

// MoveDueParams bound one run of [MoveDueMessages].
type MoveDueParams struct {
	Limit         int
	NotifyChannel string
}

// RetentionPartition names one partition of a retention class: it holds
// the messages of the class that expire in [Start, Start + slot).
type RetentionPartition struct {
	Class int
	Start time.Time
	End   time.Time
}
