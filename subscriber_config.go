package pglease

import (
	"github.com/pglease/watermill-pglease/internal/engine"

	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// Defaults of [SubscriberConfig].
const (
	DefaultSessionTTL      = 10 * time.Second
	DefaultPollInterval    = time.Second
	DefaultNackResendDelay = 100 * time.Millisecond
	DefaultBatchSize       = 100
	DefaultCommitInterval  = 100 * time.Millisecond
	DefaultCommitBatch     = 100
	DefaultCloseTimeout    = 5 * time.Second
	DefaultDrainTimeout    = 10 * time.Second
	// DefaultMaxBufferedBytes is the default MaxBufferedBytes: 64 MiB.
	DefaultMaxBufferedBytes = 64 << 20
	// DefaultMaxInFlight is the default MaxInFlight: one message of a
	// partition out at a time.
	DefaultMaxInFlight = 1

	// MinSessionTTL is the shortest SessionTTL accepted.
	MinSessionTTL = time.Second

	// DefaultRetryMinBackoff, DefaultRetryMaxBackoff and
	// DefaultRetryJitter are the defaults of [RetryConfig].
	DefaultRetryMinBackoff = time.Second
	DefaultRetryMaxBackoff = time.Minute
	DefaultRetryJitter     = 0.1
)

// RetryConfig is a Subscriber's failure policy ([SubscriberConfig.Retry]):
// how a nacked message is retried, and where it goes after its last
// attempt. The zero value is no policy: a Nack sends the message out again
// after NackResendDelay, for ever. Any field set turns the policy on for
// the Subscriber's topics; the other fields take their defaults.
//
// Under the policy a nacked message waits for its next attempt in the
// Subscriber's in-flight window, whatever MaxInFlight: the later messages
// of its ordering key (OrderingKey) wait behind it, so the order per key
// is kept, and the other keys of the partition go on (a message without a
// key holds back the whole partition, as it does without the policy).
// Its attempts, failures and the time of its next attempt are written into
// its consumer group's offset row, fenced by the owner's epoch, before it
// waits: a crash or a takeover hands the schedule to the next owner. See
// docs/guarantees.md for what is exact across crashes.
type RetryConfig struct {
	// MaxAttempts sets how many times a message is handed out in all,
	// across Subscribers, crashes and takeovers, before it moves to
	// DeadLetterTopic, default 0: no limit (retried for ever, with
	// backoff). Set, it needs DeadLetterTopic.
	MaxAttempts int

	// MinBackoff sets how long a message waits after its first failure,
	// default DefaultRetryMinBackoff (1s); the wait doubles with each
	// failure up to MaxBackoff, default DefaultRetryMaxBackoff (1m). The
	// times are the database's: a failure's next attempt is written as
	// the server's now() plus the wait.
	MinBackoff time.Duration
	MaxBackoff time.Duration

	// Jitter sets by which fraction of it each wait varies either way, at
	// random, default DefaultRetryJitter (0.1: within ±10%), at most 1; a
	// negative value means none. A wait never exceeds MaxBackoff.
	Jitter float64

	// DeadLetterTopic sets the topic a message moves to after its last
	// attempt, default "": none (then MaxAttempts must be 0). The move
	// is written in the transaction that moves the consumer group past
	// the message, fenced by the owner's epoch: the copy lands exactly
	// once. It keeps the message's UUID, payload and metadata, and adds
	// the metadata DeadLetterSourceTopicMetadata and the others of its
	// kind: where it comes from, the group, the attempts, the first and
	// last failure and the reason given with [NackWithReason].
	DeadLetterTopic string
}

// enabled reports whether r sets a policy.
func (r RetryConfig) enabled() bool { return r != RetryConfig{} }

// StartFrom is where a consumer group starts on a topic it never consumed.
type StartFrom int

const (
	// StartFromEarliest starts at the first message of the topic.
	StartFromEarliest StartFrom = iota
	// StartFromLatest starts after the messages visible when the group's
	// offset rows of the topic are created. Partitions added to the topic
	// later are consumed from their first message.
	StartFromLatest
)

// SubscriberConfig configures a [Subscriber]. The zero value of every field
// means its default.
type SubscriberConfig struct {
	// ConsumerGroup sets the consumer group, default "" (a group like any
	// other, see below). The Subscribers of a group share topics: each
	// (ConsumerGroup, topic, partition) is delivered by one Subscriber at a
	// time, from the group's own offset. A new group starts where StartFrom
	// says. Every group receives every message of a topic; the
	// Subscribers of one group share them. The empty string is a group
	// like any other: unlike an empty consumer group in watermill-kafka or
	// an empty queue group in watermill-nats, which mean that every
	// Subscriber receives every message, Subscribers that all leave
	// ConsumerGroup empty share the messages. Handlers that must each
	// receive every message (CQRS event handlers) need a group each, their
	// handler's name for example.
	ConsumerGroup string

	// SessionTTL sets how long the Subscriber's session lives without a
	// heartbeat, default DefaultSessionTTL (10s), at least MinSessionTTL
	// (1s). Heartbeats run every SessionTTL/3. A crashed process's topics
	// are taken over after at most about SessionTTL.
	SessionTTL time.Duration

	// StartFrom sets where a consumer group starts on a topic it has no
	// offset row of yet, default StartFromEarliest: at the first message.
	// StartFromLatest starts after every message visible when the rows of
	// the topic's partitions are created (messages of transactions still
	// running then are delivered). A partition without a row of a
	// topic the group already has a row of (added to the topic after the
	// group started on it, or its row deleted) starts at its first
	// message whatever StartFrom says: its messages were published after
	// the group started. A row created again after it was found missing
	// (deleted by hand, or the group removed by
	// Maintenance.RemoveIdleGroupsAfter) is logged at Info with where it
	// starts. Once the rows exist StartFrom has no effect; reset positions
	// with admin.Inspector.ResetOffsets.
	StartFrom StartFrom

	// PollInterval sets how often a Subscriber polls, the fallback for
	// missed notifications, default DefaultPollInterval (1s). Subscribers
	// LISTEN for new messages, released topics and members of their group
	// that come and go, and are woken at once; besides, every PollInterval
	// one statement per Subscriber checks all its idle topics for messages,
	// and a Subscriber that holds less than its share of its group's topics
	// tries one claim statement this often. The partition counts of the
	// Subscriber's topics are read again every 5 minutes (at the first
	// PollInterval after), in case a raise was not notified.
	PollInterval time.Duration

	// ListenConnConfig sets what the connection that LISTENs for
	// notifications is dialled with, default nil: the pool's
	// ConnConfig. The pool's BeforeConnect, AfterConnect and
	// BeforeClose hooks apply either way. Set it to a direct connection
	// to the primary when the pool goes through a transaction pooler
	// (PgBouncer, RDS Proxy, Supavisor): a LISTEN needs a connection of
	// its own for as long as it runs. The connection is checked before
	// it LISTENs: one that goes through a pooler is refused, and the
	// Subscriber polls. Subscribers of a process that share a pool and
	// a ListenConnConfig (the same pointer) share one LISTEN
	// connection.
	ListenConnConfig *pgx.ConnConfig

	// PollOnly sets whether notifications are off, default false. With
	// PollOnly there is no LISTEN connection: new
	// messages, topics released by other Subscribers of the group,
	// members that come and go, and elections are then found by polling
	// every PollInterval: a message is delivered up to PollInterval after
	// its commit instead of at once, and a topic handed over up to
	// PollInterval after its release. For pools that cannot reach the
	// server but through a transaction pooler.
	PollOnly bool

	// NackResendDelay sets how long after a Nack the same message is
	// delivered again, default DefaultNackResendDelay (100ms).
	NackResendDelay time.Duration

	// BatchSize sets how many messages one query reads, default
	// DefaultBatchSize (100). They are handed out one by one all the same.
	BatchSize int

	// MaxBufferedBytes sets the bound on the bytes of the messages the
	// Subscriber has read and not handed out yet, over all its topics and
	// partitions together, default DefaultMaxBufferedBytes (64 MiB); must
	// not be negative. Each partition with a backlog reads up to BatchSize
	// messages ahead, so without a bound 1,024 partitions of 1 MB messages
	// would hold 100 GB. A message counts the length of its payload and
	// of its metadata (as JSON). A read takes at most an eighth of the
	// budget, is cut short to what its messages use, and waits while
	// nothing is free; a message larger than what is free is read once
	// its size is, and one larger than the budget once any byte is, one
	// such message at a time: the bytes held never exceed the budget by
	// more than one message. Messages handed out are no longer counted
	// (the handlers hold them until they ack or nack).
	MaxBufferedBytes int64

	// MaxInFlight sets how many messages of each owned (topic,
	// partition) may be out at once, handed out and not acked or nacked
	// yet, default DefaultMaxInFlight (1): the next message goes out
	// after the Ack of the one before, in order; must not be negative.
	// Above 1, messages go out in parallel, never two of one ordering
	// key (OrderingKey) at once, each key in order: a message goes out
	// once every earlier message of its key is acknowledged. A message
	// without a key (an empty one) is ordered against every message: it
	// goes out once every earlier message of the partition is
	// acknowledged, and none after it goes out before its Ack. A Nack
	// holds its key: the message goes out again after NackResendDelay,
	// the later ones of its key wait for it, other keys go on. The
	// committed position is the end of the contiguous acknowledged
	// prefix; Acks above it are kept in memory, so a crash or a
	// takeover delivers again, beyond the Acks not committed yet
	// (CommitBatch), at most the messages above that prefix the
	// consumer had read: at most max(BatchSize, 4×MaxInFlight) per
	// partition (see docs/guarantees.md). AckInTx works as with 1 (see
	// [AckInTx]).
	MaxInFlight int

	// OrderingKey sets the function that returns the ordering key of a
	// message when MaxInFlight is above 1, default nil: the message's
	// PartitionKeyMetadata metadata, the key a Publisher partitions by by
	// default. Messages of one key are handed out one at a time, in order;
	// "" means no key (ordered against every message). It is called
	// once per message read, from the consumer's goroutine of its
	// partition: it must not block, and is called concurrently for
	// different partitions. To hand out messages with no order between
	// them at all, return their UUID.
	OrderingKey func(msg *message.Message) string

	// CommitInterval sets how long after an Ack its position is committed
	// at most, default DefaultCommitInterval (100ms). Acknowledged
	// positions are coalesced: committed CommitInterval after an Ack,
	// after CommitBatch Acks, before the Subscriber waits for new
	// messages, and on release and Close, whichever comes first. After a
	// crash or a lost session, at most CommitInterval's worth of
	// acknowledged messages are delivered again.
	CommitInterval time.Duration

	// CommitBatch sets after how many Acks the position is committed at
	// the latest, default DefaultCommitBatch (100); see CommitInterval.
	// After a crash or a lost session, at most that many acknowledged
	// messages are delivered again. Set it to 1 to commit every Ack at
	// once (with MaxInFlight 1, before the next message is handed out).
	CommitBatch int

	// CloseTimeout sets the bound on the statements that release topics
	// and delete the session when a subscription ends or the Subscriber
	// closes, default DefaultCloseTimeout (5s). A release that fails is
	// retried while the session lives; Close stops retrying CloseTimeout
	// after it began and returns the error.
	CloseTimeout time.Duration

	// DrainTimeout sets how long, when a subscription ends (Close, or the
	// end of the context given to Subscribe, which is how a Router stops
	// on SIGTERM), the Subscriber waits for the messages it already
	// handed out to be acked or nacked before it releases their topics,
	// default DefaultDrainTimeout (10s); a negative value does not wait.
	// It hands nothing more out meanwhile, and the release writes their
	// Acks, so a clean shutdown delivers nothing twice. Their contexts
	// stay open until then. A message still out when the time is up is
	// delivered again by the next owner (logged, with how many). Close
	// takes up to DrainTimeout plus CloseTimeout.
	DrainTimeout time.Duration

	// InitializeSchema sets whether the first Subscribe or
	// SubscribeInitialize creates or migrates the tables, default false.
	// Leave it off when the DDL of [SchemaSQL] is applied by a migration
	// tool, or by `pglease migrate` as the tables' owner.
	InitializeSchema bool

	// Tables sets the names of the tables and their schema, default
	// Tables{}: the default names in the connection's search_path.
	Tables Tables

	// SchemaAdapter is the former name of Tables. Set one of the two:
	// both set to different tables is an error.
	//
	// Deprecated: use Tables. The field will be removed in the next minor
	// release.
	SchemaAdapter Tables

	// Maintenance sets the maintenance this Subscriber runs if it is
	// elected the maintainer, default on (MaintenanceConfig{}): delayed
	// messages, retention, expired sessions, idle groups.
	Maintenance MaintenanceConfig

	// OnDelivery sets a hook called for every delivery of a message,
	// default nil: none. It is called for redeliveries after a Nack
	// too, right before the message is offered on the subscription's
	// channel, from the goroutine that delivers its partition: it must
	// not block (the partition waits for it), must not ack or nack the
	// message, and is called concurrently for different partitions and
	// topics. The message's context is already the delivery's
	// ([MessageDeliveryFromCtx] reads it); the hook may replace it with
	// one derived from it (msg.SetContext), to put a span in it for
	// example: the handler receives the message with that context. The
	// otel module's Instrument sets it.
	//
	// The settled func it returns, unless nil, is called exactly once per
	// delivery, from the same goroutine, when the delivery ends: with nil
	// once the message was acked, with [ErrNacked] once it was nacked,
	// and with an error wrapping [ErrDeliveryEnded] when the delivery
	// ended first: the subscription ended (Close, or the end of the
	// context given to Subscribe), the ownership of the topic was lost
	// (the error wraps [ErrOwnershipLost] too), or the topic was handed
	// over to another member of the group before the message was
	// received. It must not block either. Close returns after the settled
	// funcs of its deliveries were called; neither func is called after.
	OnDelivery func(msg *message.Message) (settled func(err error))

	// Retry sets the failure policy, default RetryConfig{}: none (a Nack
	// sends the message out again after NackResendDelay). See
	// [RetryConfig].
	Retry RetryConfig
}

// zeroDrainTimeout is what a zero DrainTimeout means: DefaultDrainTimeout
// (the package's tests change it).
var zeroDrainTimeout = DefaultDrainTimeout

func (c *SubscriberConfig) setDefaults() {
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.NackResendDelay == 0 {
		c.NackResendDelay = DefaultNackResendDelay
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.CommitBatch == 0 {
		c.CommitBatch = DefaultCommitBatch
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = zeroDrainTimeout
	}
	if c.Maintenance.Interval == 0 {
		c.Maintenance.Interval = DefaultMaintenanceInterval
	}
	if c.Retry.enabled() {
		if c.Retry.MinBackoff == 0 {
			c.Retry.MinBackoff = DefaultRetryMinBackoff
		}
		if c.Retry.MaxBackoff == 0 {
			c.Retry.MaxBackoff = max(DefaultRetryMaxBackoff, c.Retry.MinBackoff)
		}
		if c.Retry.Jitter == 0 {
			c.Retry.Jitter = DefaultRetryJitter
		}
	}
}

func (c SubscriberConfig) validate() error {
	if c.SessionTTL < MinSessionTTL {
		return fmt.Errorf("SubscriberConfig.SessionTTL must be at least %s, got %s", MinSessionTTL, c.SessionTTL)
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("SubscriberConfig.PollInterval must be positive, got %s", c.PollInterval)
	}
	if c.NackResendDelay < 0 {
		return fmt.Errorf("SubscriberConfig.NackResendDelay must not be negative, got %s", c.NackResendDelay)
	}
	if c.BatchSize < 0 {
		return fmt.Errorf("SubscriberConfig.BatchSize must be positive, got %d", c.BatchSize)
	}
	if c.MaxBufferedBytes < 0 {
		return fmt.Errorf("SubscriberConfig.MaxBufferedBytes must not be negative, got %d", c.MaxBufferedBytes)
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("SubscriberConfig.MaxInFlight must not be negative, got %d", c.MaxInFlight)
	}
	if c.CommitInterval < 0 {
		return fmt.Errorf("SubscriberConfig.CommitInterval must be positive, got %s", c.CommitInterval)
	}
	if c.CommitBatch < 0 {
		return fmt.Errorf("SubscriberConfig.CommitBatch must be positive, got %d", c.CommitBatch)
	}
	if c.StartFrom != StartFromEarliest && c.StartFrom != StartFromLatest {
		return fmt.Errorf("SubscriberConfig.StartFrom must be StartFromEarliest or StartFromLatest, got %d", c.StartFrom)
	}
	if c.Maintenance.Interval < 0 {
		return fmt.Errorf("SubscriberConfig.Maintenance.Interval must be positive, got %s", c.Maintenance.Interval)
	}
	if c.Maintenance.RemoveIdleGroupsAfter < 0 {
		return fmt.Errorf("SubscriberConfig.Maintenance.RemoveIdleGroupsAfter must not be negative, got %s", c.Maintenance.RemoveIdleGroupsAfter)
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("SubscriberConfig.CloseTimeout must be positive, got %s", c.CloseTimeout)
	}
	if !validText(c.ConsumerGroup) {
		return fmt.Errorf("SubscriberConfig.ConsumerGroup must be UTF-8 without NUL bytes")
	}
	if c.PollOnly && c.ListenConnConfig != nil {
		return fmt.Errorf("SubscriberConfig.ListenConnConfig must be nil when PollOnly is set (PollOnly opens no LISTEN connection)")
	}
	if c.ListenConnConfig != nil && !parsedConnConfig(c.ListenConnConfig) {
		return fmt.Errorf("SubscriberConfig.ListenConnConfig must be created by pgx.ParseConfig")
	}
	if err := c.Retry.validate(); err != nil {
		return err
	}
	return checkTables("SubscriberConfig", c.Tables, c.SchemaAdapter)
}

func (r RetryConfig) validate() error {
	switch {
	case r.MaxAttempts < 0:
		return fmt.Errorf("SubscriberConfig.Retry.MaxAttempts must not be negative, got %d", r.MaxAttempts)
	case r.MaxAttempts > 0 && r.DeadLetterTopic == "":
		return fmt.Errorf("SubscriberConfig.Retry.DeadLetterTopic must be set with MaxAttempts (%d): "+
			"where the message goes after its last attempt", r.MaxAttempts)
	case r.MaxAttempts == 0 && r.DeadLetterTopic != "":
		return fmt.Errorf("SubscriberConfig.Retry.MaxAttempts must be set with DeadLetterTopic %q", r.DeadLetterTopic)
	case r.MinBackoff < 0:
		return fmt.Errorf("SubscriberConfig.Retry.MinBackoff must not be negative, got %s", r.MinBackoff)
	case r.MaxBackoff < r.MinBackoff:
		return fmt.Errorf("SubscriberConfig.Retry.MaxBackoff must be at least MinBackoff (%s), got %s", r.MinBackoff, r.MaxBackoff)
	case r.Jitter > 1:
		return fmt.Errorf("SubscriberConfig.Retry.Jitter must be at most 1, got %g", r.Jitter)
	}
	if r.DeadLetterTopic != "" {
		if err := validateTopic(r.DeadLetterTopic); err != nil {
			return fmt.Errorf("SubscriberConfig.Retry.DeadLetterTopic: %w", err)
		}
	}
	return nil
}

// settings are the engine's settings of r (nil: no policy).
func (r RetryConfig) settings() *engine.RetrySettings {
	if !r.enabled() {
		return nil
	}
	return &engine.RetrySettings{MaxAttempts: r.MaxAttempts, MinBackoff: r.MinBackoff, MaxBackoff: r.MaxBackoff,
		Jitter: max(r.Jitter, 0), DeadLetterTopic: r.DeadLetterTopic}
}

// tableNames returns the tables c names: Tables, or the deprecated
// SchemaAdapter when only that is set.
func (c SubscriberConfig) tableNames() Tables { return pickTables(c.Tables, c.SchemaAdapter) }

// settings are the engine's settings of c, whose defaults are set and
// which is valid (the set-up, Settings.SetUp, is the Subscriber's).
func (c SubscriberConfig) settings() engine.Settings {
	return engine.Settings{
		Group:            c.ConsumerGroup,
		Tables:           c.tableNames().tables(),
		SessionTTL:       c.SessionTTL,
		StartLatest:      c.StartFrom == StartFromLatest,
		PollInterval:     c.PollInterval,
		ListenConnConfig: c.ListenConnConfig,
		PollOnly:         c.PollOnly,
		NackResendDelay:  c.NackResendDelay,
		BatchSize:        c.BatchSize,
		MaxBufferedBytes: c.MaxBufferedBytes,
		MaxInFlight:      c.MaxInFlight,
		OrderingKey:      c.OrderingKey,
		CommitInterval:   c.CommitInterval,
		CommitBatch:      c.CommitBatch,
		CloseTimeout:     c.CloseTimeout,
		DrainTimeout:     c.DrainTimeout,
		Maintenance: engine.MaintenanceSettings{Disabled: c.Maintenance.Disabled, Interval: c.Maintenance.Interval,
			RemoveIdleGroupsAfter: c.Maintenance.RemoveIdleGroupsAfter},
		OnDelivery:       c.OnDelivery,
		HeartbeatBuckets: HeartbeatBuckets,
		Retry:            c.Retry.settings(),
	}
}
