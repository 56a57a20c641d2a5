package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// PoisonedTopicKey is the metadata key under which Watermill's PoisonQueue
// middleware (message/router/middleware) records the topic a poisoned
// message was consumed from; [Inspector.Replay] with ToOriginal sends a
// message back there.
const PoisonedTopicKey = "topic_poisoned"

// Defaults and bounds of the message browser and replay.
const (
	// DefaultMessagesLimit is how many messages [Inspector.Messages]
	// returns when MessagesParams.Limit is 0.
	DefaultMessagesLimit = 20
	// MaxMessagesLimit bounds MessagesParams.Limit.
	MaxMessagesLimit = 1000
	// DefaultPreviewBytes is how much of each payload [Inspector.Messages]
	// returns when MessagesParams.PreviewBytes is 0.
	DefaultPreviewBytes = 1024
	// DefaultReplayLimit is how many messages [Inspector.Replay] moves
	// when ReplayParams.Limit is 0.
	DefaultReplayLimit = 1000
	// DefaultExactCountUpTo is the per-topic count below which
	// [Inspector.TopicMessages] counts exactly.
	DefaultExactCountUpTo = 10000
)

// StoredMessage is one message of the messages table.
type StoredMessage struct {
	Topic     string           `json:"topic"`
	Partition int32            `json:"partition"`
	Position  pglease.Position `json:"position"`
	UUID      string           `json:"uuid"`
	// Payload is the payload, or its first bytes when PayloadTruncated
	// (see MessagesParams.PreviewBytes); PayloadSize is its whole size.
	Payload          []byte            `json:"payload"`
	PayloadSize      int               `json:"payload_size"`
	PayloadTruncated bool              `json:"payload_truncated"`
	Metadata         map[string]string `json:"metadata"`
	// RawMetadata is the metadata as stored when it is not a JSON object
	// of strings (Metadata is then empty): such a row cannot become a
	// Watermill message, and Subscribers skip it (see
	// pglease.ErrUndecodableMetadata). Empty otherwise.
	RawMetadata string    `json:"raw_metadata,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	// ExpiresAt is when retention removes it (nil: kept forever).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// toStoredMessage converts a row of topic; the payload may have been cut at
// the statement's preview bytes. Metadata that is not a JSON object of
// strings is kept as it is, in RawMetadata.
func toStoredMessage(topic string, r pgsql.BrowseRow) StoredMessage {
	m := StoredMessage{
		Topic: topic, Partition: r.Partition, Position: pglease.Position(r.Position),
		UUID: r.UUID, Payload: r.Payload, PayloadSize: int(r.PayloadSize), CreatedAt: r.CreatedAt,
		Metadata: map[string]string{},
	}
	m.PayloadTruncated = len(m.Payload) < m.PayloadSize
	if r.ExpiresAt != nil && r.ExpiresAt.Year() < 9999 {
		m.ExpiresAt = r.ExpiresAt
	}
	if md, err := decodeMetadata(r.Metadata); err != nil {
		m.RawMetadata = string(r.Metadata)
	} else if md != nil {
		m.Metadata = md
	}
	return m
}

// decodeMetadata decodes a message's stored metadata (nil or JSON null:
// none) as Subscribers do. It fails on anything but a JSON object of
// strings, which pglease never writes (a row inserted by hand or by
// another program).
func decodeMetadata(raw []byte) (map[string]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var md map[string]string
	if err := json.Unmarshal(raw, &md); err != nil {
		return nil, fmt.Errorf("%w: %w", pglease.ErrUndecodableMetadata, err)
	}
	return md, nil
}

// MessagesParams select the messages of [Inspector.Messages].
type MessagesParams struct {
	// Topic sets the topic, required.
	Topic string
	// Partition sets the one partition to read, default nil: every
	// partition, merged by position.
	Partition *int32
	// From sets the position of the newest message to return (it and
	// older ones are returned), default nil: the newest message. A page's
	// Next is the From of the page after it.
	From *pglease.Position
	// Limit sets the page size, default DefaultMessagesLimit, at most
	// MaxMessagesLimit.
	Limit int
	// PreviewBytes sets how much of each payload to return, default
	// DefaultPreviewBytes; negative: all of it.
	PreviewBytes int
}

// MessagePage is a page of [Inspector.Messages], newest first.
type MessagePage struct {
	Messages []StoredMessage `json:"messages"`
	// Next is where the next (older) page starts; nil on the last page.
	Next *pglease.Position `json:"next,omitempty"`
}

// Messages returns a page of the stored messages of a topic, newest first
// (by position: the order in which a consumer group receives them, each
// partition on its own). It reads the primary key backwards from the
// position, so a page costs its rows, however deep it lies. Messages of
// transactions not yet below the xmin horizon are shown too (they are
// committed, but not delivered yet).
func (i *Inspector) Messages(ctx context.Context, p MessagesParams) (MessagePage, error) {
	var page MessagePage
	if err := validateTopic(p.Topic); err != nil {
		return page, err
	}
	a := i.driver
	switch {
	case p.Limit == 0:
		p.Limit = DefaultMessagesLimit
	case p.Limit < 0 || p.Limit > MaxMessagesLimit:
		return page, fmt.Errorf("%w: MessagesParams.Limit must be between 1 and %d, got %d", pglease.ErrInvalidConfig, MaxMessagesLimit, p.Limit)
	}
	if p.PreviewBytes == 0 {
		p.PreviewBytes = DefaultPreviewBytes
	}
	partition := int32(-1)
	if p.Partition != nil {
		if *p.Partition < 0 {
			return page, fmt.Errorf("%w: MessagesParams.Partition must not be negative, got %d", pglease.ErrInvalidConfig, *p.Partition)
		}
		partition = *p.Partition
	}
	at := pgsql.Position{TransactionID: math.MaxUint64, Offset: math.MaxInt64} // after every message
	if p.From != nil {
		at = pgsql.Position(*p.From)
	}
	rows, err := a.MessagesNewestFirst(ctx, i.db, pgsql.BrowseParams{Topic: p.Topic, Partition: partition, At: at,
		Limit: p.Limit + 1, Preview: p.PreviewBytes})
	if err != nil {
		return page, fmt.Errorf("read the messages of topic %q: %w", p.Topic, check.MissingSchema(err))
	}
	page.Messages = make([]StoredMessage, 0, len(rows))
	for n, r := range rows {
		m := toStoredMessage(p.Topic, r)
		if n == p.Limit {
			page.Next = &m.Position
			break
		}
		page.Messages = append(page.Messages, m)
	}
	return page, nil
}

// MessagesByUUID returns the messages with the UUID, whole, oldest first:
// of one topic, or of every topic when topic is "" (which reads the whole
// messages table: the UUID is not indexed). Every payload is read whole:
// to look messages up with a bound on what is read, use
// [Inspector.FindMessages].
func (i *Inspector) MessagesByUUID(ctx context.Context, topic, id string) ([]StoredMessage, error) {
	out, err := i.findMessages(ctx, topic, id, -1, -1)
	slices.Reverse(out)
	return out, err
}

// FindMessagesParams select the messages of [Inspector.FindMessages].
type FindMessagesParams struct {
	// Topic sets the topic, required.
	Topic string
	// UUID sets the UUID to look for, required.
	UUID string
	// Limit sets how many messages to return at most, default
	// DefaultMessagesLimit, at most MaxMessagesLimit.
	Limit int
	// PreviewBytes sets how much of each payload to return, default
	// DefaultPreviewBytes; negative: all of it.
	PreviewBytes int
}

// FindMessages returns the messages of a topic with a UUID, newest first,
// at most Limit of them, each payload cut at PreviewBytes (by the
// database: what is read is bounded by Limit × PreviewBytes, whatever the
// payloads' sizes). The UUID is not indexed: it reads the topic's
// messages.
func (i *Inspector) FindMessages(ctx context.Context, p FindMessagesParams) ([]StoredMessage, error) {
	if err := validateTopic(p.Topic); err != nil {
		return nil, err
	}
	switch {
	case p.Limit == 0:
		p.Limit = DefaultMessagesLimit
	case p.Limit < 0 || p.Limit > MaxMessagesLimit:
		return nil, fmt.Errorf("%w: FindMessagesParams.Limit must be between 1 and %d, got %d", pglease.ErrInvalidConfig, MaxMessagesLimit, p.Limit)
	}
	if p.PreviewBytes == 0 {
		p.PreviewBytes = DefaultPreviewBytes
	}
	return i.findMessages(ctx, p.Topic, p.UUID, p.PreviewBytes, p.Limit)
}

// findMessages reads the messages with the UUID, newest first, at most
// limit of them (-1: all).
func (i *Inspector) findMessages(ctx context.Context, topic, id string, preview, limit int) ([]StoredMessage, error) {
	rows, err := i.driver.MessagesByUUID(ctx, i.db, topic, id, preview, limit)
	if err != nil {
		return nil, fmt.Errorf("look up message %q: %w", id, check.MissingSchema(err))
	}
	out := make([]StoredMessage, 0, len(rows))
	for _, r := range rows {
		out = append(out, toStoredMessage(r.Topic, r))
	}
	return out, nil
}

// TopicDetail is what [Inspector.TopicDetail] reads of one topic.
type TopicDetail struct {
	Topic      string        `json:"topic"`
	Partitions int           `json:"partitions"`
	Retention  time.Duration `json:"retention_ns"`
	// KeyWindow, EffectiveKeyWindow and PendingKeyWindow are the
	// topic's key windows, as [TopicInfo] has them: the
	// pglease.TopicConfig.KeyWindow as set, how long a retried Publish is
	// recognised now, and the longer window that waits for the
	// maintainer (0: none).
	KeyWindow          time.Duration `json:"key_window_ns"`
	EffectiveKeyWindow time.Duration `json:"effective_key_window_ns"`
	PendingKeyWindow   time.Duration `json:"pending_key_window_ns,omitempty"`
	// Messages counts its stored messages, exactly up to
	// DefaultExactCountUpTo, estimated above (MessagesEstimated).
	Messages          int64 `json:"messages"`
	MessagesEstimated bool  `json:"messages_estimated"`
	// Delayed counts its messages waiting for their delay; NextDueAt is
	// when the first of them is due (nil: none).
	Delayed   int64      `json:"delayed"`
	NextDueAt *time.Time `json:"next_due_at,omitempty"`
}

// TopicDetail returns a topic's settings, its key windows, its stored and
// its delayed messages. A topic never created has 1 partition, no
// retention and a key window of a day. It reads the schema's version
// first and runs on the schema of an earlier release, whose key windows
// it reports as [Inspector.Topics] does.
func (i *Inspector) TopicDetail(ctx context.Context, topic string) (TopicDetail, error) {
	d := TopicDetail{Topic: topic}
	if err := validateTopic(topic); err != nil {
		return d, err
	}
	a := i.driver
	schema, err := pgsql.SchemaVersion(ctx, i.db, a.Tables())
	if err != nil {
		return d, fmt.Errorf("read topic %q: %w", topic, check.MissingSchema(err))
	}
	row, err := a.TopicDetail(ctx, i.db, topic, schema)
	if err != nil {
		return d, fmt.Errorf("read topic %q: %w", topic, check.MissingSchema(err))
	}
	d.Partitions, d.Retention = int(row.Partitions), time.Duration(row.RetentionUs)*time.Microsecond
	d.KeyWindow = time.Duration(row.KeyWindowUs) * time.Microsecond
	d.EffectiveKeyWindow, d.PendingKeyWindow = keyWindows(schema, d.Retention, d.KeyWindow, row.KeyClassReady)
	d.Delayed, d.NextDueAt = row.Delayed, row.NextDueAt
	counts, err := a.CountTopicMessages(ctx, i.db, []string{topic}, DefaultExactCountUpTo)
	if err != nil {
		return d, fmt.Errorf("count the messages of topic %q: %w", topic, err)
	}
	for _, c := range counts {
		d.Messages, d.MessagesEstimated = c.Messages, c.Capped
		if c.Capped {
			if d.Messages, err = i.estimate(ctx, a, topic, c.Messages); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

// TopicMessageCount is the number of stored messages of one topic.
type TopicMessageCount struct {
	Topic    string `json:"topic"`
	Messages int64  `json:"messages"`
	// Estimated is true when the count is the planner's estimate from
	// the table's statistics (over the exact-count bound).
	Estimated bool `json:"estimated"`
}

// TopicMessagesParams select the topics of [Inspector.TopicMessages].
type TopicMessagesParams struct {
	// Topics sets the topics to count (each is returned, 0 included),
	// default nil: every topic that has messages (found by skipping
	// through the primary key, one probe per topic).
	Topics []string
	// ExactUpTo sets the count up to which a topic is counted exactly,
	// default DefaultExactCountUpTo.
	ExactUpTo int64
}

// TopicMessages returns the stored messages of topics: counted exactly up
// to ExactUpTo per topic, reading at most that many index entries of
// each, and above it the planner's estimate from the table's statistics
// (at least ExactUpTo). A poison topic of a few messages is counted
// exactly; a topic of millions costs a plan. On every topic of a large
// database it costs a probe and a short count per topic (0.86 s on
// 100,000 topics, BenchmarkTopicMessages): name the topics to watch to
// read only those.
func (i *Inspector) TopicMessages(ctx context.Context, p TopicMessagesParams) ([]TopicMessageCount, error) {
	a := i.driver
	if p.ExactUpTo <= 0 {
		p.ExactUpTo = DefaultExactCountUpTo
	}
	rows, err := a.CountTopicMessages(ctx, i.db, p.Topics, p.ExactUpTo)
	if err != nil {
		return nil, fmt.Errorf("count the messages of the topics: %w", check.MissingSchema(err))
	}
	out := make([]TopicMessageCount, 0, len(rows))
	for _, r := range rows {
		c := TopicMessageCount{Topic: r.Topic, Messages: r.Messages, Estimated: r.Capped}
		if r.Capped {
			if c.Messages, err = i.estimate(ctx, a, r.Topic, r.Messages); err != nil {
				return nil, err
			}
		}
		out = append(out, c)
	}
	return out, nil
}

func (i *Inspector) estimate(ctx context.Context, a pgsql.Driver, topic string, atLeast int64) (int64, error) {
	n, err := a.EstimateTopicMessages(ctx, i.db, topic)
	if err != nil {
		return 0, fmt.Errorf("estimate the messages of topic %q: %w", topic, err)
	}
	return max(n, atLeast), nil
}

// originalTopicKeys are the metadata keys that name a message's original
// topic, in the order ToOriginal reads them.
var originalTopicKeys = []string{PoisonedTopicKey, pglease.DeadLetterSourceTopicMetadata}

// originalTopic is the topic the metadata names under the first of
// originalTopicKeys it has.
func originalTopic(md map[string]string) string {
	for _, k := range originalTopicKeys {
		if v := md[k]; v != "" {
			return v
		}
	}
	return ""
}

// ReplayParams select the messages of [Inspector.Replay] and where they go.
type ReplayParams struct {
	// From sets the topic to take the messages from (a poison topic),
	// required.
	From string
	// To sets the topic to publish them to, default "": ToOriginal must
	// be set. Exactly one of To and ToOriginal.
	To string
	// ToOriginal sets whether each message goes to the topic it names in
	// its metadata under PoisonedTopicKey (as Watermill's PoisonQueue
	// records it) or, without it, pglease.DeadLetterSourceTopicMetadata
	// (as a failure policy's dead-letter move records it; messages with
	// neither are left where they are), default false.
	ToOriginal bool
	// Metadata sets the metadata a message must have to be moved, every
	// one of these keys with the value, default nil: every message.
	Metadata map[string]string
	// Limit sets how many messages to move, oldest first, default
	// DefaultReplayLimit.
	Limit int
	// DryRun sets whether everything is done in a transaction that is
	// rolled back, default false.
	DryRun bool
}

// ReplayedMessage is one message moved by [Inspector.Replay].
type ReplayedMessage struct {
	StoredMessage
	// To is the topic it was published to.
	To string `json:"to"`
}

// Replay moves messages from one topic (a poison topic) to another, in one
// transaction: they are deleted from From and published (uuid, payload and
// metadata as they were, in their order, through a [pglease.Publisher] on the
// transaction, so that partition keys, delays and retention apply as to
// any message) to their topic. All or nothing; a replay run twice moves
// each message once, and two replays running at once each take different
// messages (the rows are locked, then deleted). Consumer groups of From
// skip the moved messages. The Inspector's db may be a pgx.Tx: then the
// replay is a savepoint of it, and commits with it.
func (i *Inspector) Replay(ctx context.Context, p ReplayParams) ([]ReplayedMessage, error) {
	if err := validateTopic(p.From); err != nil {
		return nil, fmt.Errorf("ReplayParams.From: %w", err)
	}
	switch {
	case p.ToOriginal && p.To != "":
		return nil, fmt.Errorf("%w: ReplayParams: give To or ToOriginal, not both", pglease.ErrInvalidConfig)
	case !p.ToOriginal && p.To == "":
		return nil, fmt.Errorf("%w: ReplayParams: say where to: To or ToOriginal", pglease.ErrInvalidConfig)
	case p.To == p.From:
		return nil, fmt.Errorf("%w: ReplayParams.To is ReplayParams.From (%q)", pglease.ErrInvalidConfig, p.From)
	case p.Limit < 0:
		return nil, fmt.Errorf("%w: ReplayParams.Limit must not be negative, got %d", pglease.ErrInvalidConfig, p.Limit)
	case p.Limit == 0:
		p.Limit = DefaultReplayLimit
	}
	a := i.driver
	filter, err := json.Marshal(p.Metadata)
	if err != nil || p.Metadata == nil {
		filter = []byte("{}")
	}
	what := fmt.Sprintf("replay messages of topic %q", p.From)
	tx, err := i.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := a.DeleteMessagesForReplay(ctx, tx, pgsql.ReplayParams{Topic: p.From, Filter: filter,
		ToOriginal: p.ToOriginal, OriginalTopicKeys: originalTopicKeys, Limit: p.Limit})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, check.MissingSchema(err))
	}
	out := make([]ReplayedMessage, 0, len(rows))
	for _, r := range rows {
		m := toStoredMessage(p.From, r)
		if m.RawMetadata != "" {
			return nil, fmt.Errorf("%s: message %s at %d:%d: %w, it cannot be published: %s", what, m.UUID,
				m.Position.TransactionID, m.Position.Offset, pglease.ErrUndecodableMetadata, m.RawMetadata)
		}
		to := p.To
		if p.ToOriginal {
			to = originalTopic(m.Metadata)
		}
		if err := validateTopic(to); err != nil {
			return nil, fmt.Errorf("%s: message %s: %w", what, m.UUID, err)
		}
		out = append(out, ReplayedMessage{StoredMessage: m, To: to})
	}
	pub, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: pglease.Tables(a.Tables().Names)}, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = pub.Close() }()
	// Consecutive messages to the same topic are published together, so
	// that each topic gets them in their order.
	for start := 0; start < len(out); {
		end := start + 1
		for end < len(out) && out[end].To == out[start].To {
			end++
		}
		msgs := make([]*message.Message, 0, end-start)
		for _, r := range out[start:end] {
			msg := message.NewMessage(r.UUID, r.Payload)
			for k, v := range r.Metadata {
				msg.Metadata.Set(k, v)
			}
			msg.SetContext(ctx)
			msgs = append(msgs, msg)
		}
		if err := pub.Publish(out[start].To, msgs...); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		start = end
	}
	if p.DryRun {
		return out, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("%s: commit: %w", what, err)
	}
	return out, nil
}

// GroupInUseError is the error of [Inspector.DeleteGroupOffsets] refused
// because the group is in use: live sessions own rows of it, or rows of
// it were created each time it was about to delete (a Subscriber of the
// group starting). It wraps [ErrOwnedByLiveSession].
type GroupInUseError struct {
	ConsumerGroup string
	// Owned are the rows owned by a live session: "topic/partition by
	// owner".
	Owned []string
	// Created are the rows created while the last attempt deleted:
	// "topic/partition" (set when Owned is empty).
	Created []string
}

func (e *GroupInUseError) Error() string {
	if len(e.Owned) == 0 {
		return fmt.Sprintf("delete the offsets of consumer group %q: rows of it were created while deleting, %d times: %s (stop its Subscribers first)",
			e.ConsumerGroup, deleteGroupAttempts, strings.Join(e.Created, ", "))
	}
	return fmt.Sprintf("delete the offsets of consumer group %q: %v: %s (stop its Subscribers first)",
		e.ConsumerGroup, ErrOwnedByLiveSession, strings.Join(e.Owned, ", "))
}

// Unwrap returns ErrOwnedByLiveSession.
func (e *GroupInUseError) Unwrap() error { return ErrOwnedByLiveSession }

// deleteGroupAttempts is how many times DeleteGroupOffsets locks a
// group's rows when rows of it are created while it deletes.
const deleteGroupAttempts = 3

// DeleteGroupOffsets deletes every offsets row of an idle consumer group
// (one whose rows no live session owns) and returns how many it deleted;
// a group that subscribes again later starts as a new one (see
// pglease.SubscriberConfig.StartFrom). While a live session owns a row it fails
// with a *GroupInUseError and deletes nothing.
//
// It locks the group's rows, reads their owners on a snapshot taken after
// the lock (a claim that committed meanwhile is seen) and deletes exactly
// the rows it locked, which nobody can claim until it commits. A row
// created after the lock (a Subscriber of the group subscribing to
// another topic) is not deleted unlocked: when the delete finds one, it
// deletes nothing and starts again, locking that row too (and refusing if
// a live session owns it); after a few attempts that each found new rows
// it fails with a *GroupInUseError. A row committed after the delete
// statement began is left alone: it belongs to the group that starts
// again.
func (i *Inspector) DeleteGroupOffsets(ctx context.Context, group string) (int64, error) {
	var created []pgsql.GroupOffsetRow
	for range deleteGroupAttempts {
		n, others, err := i.deleteGroupOffsets(ctx, group)
		if err != nil || len(others) == 0 {
			return n, err
		}
		created = others
	}
	e := &GroupInUseError{ConsumerGroup: group}
	for _, o := range created {
		e.Created = append(e.Created, fmt.Sprintf("%s/%d", o.Topic, o.Partition))
	}
	return 0, e
}

// deleteGroupOffsets is one attempt of DeleteGroupOffsets, in a
// transaction of its own. When the group has rows that it did not lock,
// it deletes nothing and returns them.
func (i *Inspector) deleteGroupOffsets(ctx context.Context, group string) (int64, []pgsql.GroupOffsetRow, error) {
	a := i.driver
	what := fmt.Sprintf("delete the offsets of consumer group %q", group)
	tx, err := i.db.Begin(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	locked, err := a.LockGroupOffsets(ctx, tx, group)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", what, check.MissingSchema(err))
	}
	owned, err := a.GroupLiveOwners(ctx, tx, group)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(owned) > 0 {
		e := &GroupInUseError{ConsumerGroup: group}
		for _, o := range owned {
			e.Owned = append(e.Owned, fmt.Sprintf("%s/%d by %s", o.Topic, o.Partition, deref(o.LiveOwner)))
		}
		return 0, nil, e
	}
	if i.beforeDeleteGroup != nil {
		i.beforeDeleteGroup()
	}
	res, err := a.DeleteGroupOffsets(ctx, tx, group, locked)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(res.Others) > 0 {
		return 0, res.Others, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, fmt.Errorf("%s: commit: %w", what, err)
	}
	return res.Deleted, nil, nil
}
