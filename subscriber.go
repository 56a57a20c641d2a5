package pglease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/svc"
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
	// DefaultMaxBufferedBytes is the default MaxBufferedBytes: 64 MiB.
	DefaultMaxBufferedBytes = 64 << 20

	// MinSessionTTL is the shortest SessionTTL accepted.
	MinSessionTTL = time.Second
	// maxRetryBackoff caps the wait between retries of failed statements.
	maxRetryBackoff = time.Second
)

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
	// ConsumerGroup names the group whose Subscribers share topics: each
	// (ConsumerGroup, topic, partition) is delivered by one Subscriber at a
	// time, from the group's own offset. A new group starts where StartFrom
	// says. The empty string is a group like any other.
	ConsumerGroup string

	// SessionTTL is how long the Subscriber's session lives without a
	// heartbeat; heartbeats run every SessionTTL/3. A crashed process's
	// topics are taken over after at most about SessionTTL. Default
	// DefaultSessionTTL (10s), at least MinSessionTTL (1s).
	SessionTTL time.Duration

	// StartFrom is where a consumer group starts on a topic it has no
	// offset row of yet: StartFromEarliest (the default) at the first
	// message, StartFromLatest after every message visible when the rows
	// of the topic's partitions are created (messages of transactions
	// still running then are delivered). A partition without a row of a
	// topic the group already has a row of (added to the topic after the
	// group started on it, or its row deleted) starts at its first
	// message whatever StartFrom says: its messages were published after
	// the group started. A row created again after it was found missing
	// (deleted by hand, or the group removed by
	// Maintenance.RemoveIdleGroupsAfter) is logged at Info with where it
	// starts. Once the rows exist StartFrom has no effect; reset positions
	// with Inspector.ResetOffsets.
	StartFrom StartFrom

	// PollInterval is the fallback for missed notifications. Subscribers
	// LISTEN for new messages, released topics and members of their group
	// that come and go, and are woken at once; besides, every PollInterval
	// one statement per Subscriber checks all its idle topics for messages,
	// and a Subscriber that holds less than its share of its group's topics
	// tries one claim statement this often. The partition counts of the
	// Subscriber's topics are read again every 5 minutes (at the first
	// PollInterval after), in case a raise was not notified. Default
	// DefaultPollInterval (1s).
	PollInterval time.Duration

	// ListenConnConfig, when set, is what the connection that LISTENs for
	// notifications is dialled with, instead of the pool's ConnConfig (the
	// pool's BeforeConnect, AfterConnect and BeforeClose hooks still
	// apply). Set it to a direct connection to the primary when the pool
	// goes through a transaction pooler (PgBouncer, RDS Proxy,
	// Supavisor): a LISTEN needs a connection of its own for as long as it
	// runs. The connection is checked before it LISTENs: one that goes
	// through a pooler is refused, and the Subscriber polls. Subscribers
	// of a process that share a pool and a ListenConnConfig (the same
	// pointer) share one LISTEN connection. Nil (the default) dials with
	// the pool's settings.
	ListenConnConfig *pgx.ConnConfig

	// PollOnly turns notifications off: no LISTEN connection. New
	// messages, topics released by other Subscribers of the group,
	// members that come and go, and elections are then found by polling
	// every PollInterval: a message is delivered up to PollInterval after
	// its commit instead of at once, and a topic handed over up to
	// PollInterval after its release. For pools that cannot reach the
	// server but through a transaction pooler. Default false.
	PollOnly bool

	// NackResendDelay is how long after a Nack the same message is
	// delivered again. Default DefaultNackResendDelay (100ms).
	NackResendDelay time.Duration

	// BatchSize is how many messages one query reads; they are still handed
	// out one at a time. Default DefaultBatchSize (100).
	BatchSize int

	// MaxBufferedBytes bounds the bytes of the messages the Subscriber has
	// read and not handed out yet, over all its topics and partitions
	// together: each partition with a backlog reads up to BatchSize
	// messages ahead, so without a bound 1,024 partitions of 1 MB messages
	// would hold 100 GB. A message counts the length of its payload and
	// of its metadata (as JSON). A read takes at most an eighth of the
	// budget, is cut short to what its messages use, and waits while
	// nothing is free; a message larger than what is free is read once
	// its size is, and one larger than the budget once any byte is, one
	// such message at a time: the bytes held never exceed the budget by
	// more than one message. Messages handed out are no longer counted
	// (the handlers hold them until they ack or nack). Default
	// DefaultMaxBufferedBytes (64 MiB); must not be negative.
	MaxBufferedBytes int64

	// CommitInterval and CommitBatch bound how acknowledged offsets are
	// coalesced: the position is committed at most CommitInterval after an
	// Ack, after CommitBatch Acks, before the Subscriber waits for new
	// messages, and on release and Close. After a crash or a lost session,
	// at most that many acknowledged messages are delivered again. Set
	// CommitBatch to 1 to commit every Ack before the next message is
	// handed out. Defaults DefaultCommitInterval (100ms) and
	// DefaultCommitBatch (100).
	CommitInterval time.Duration
	CommitBatch    int

	// CloseTimeout bounds the statements that release topics and delete the
	// session when a subscription ends or the Subscriber closes. A release
	// that fails is retried while the session lives; Close stops retrying
	// CloseTimeout after it began and returns the error. Default
	// DefaultCloseTimeout (5s).
	CloseTimeout time.Duration

	// InitializeSchema creates or migrates the tables on the first
	// Subscribe or SubscribeInitialize. Leave it off when the DDL of
	// [SchemaSQL] is applied by a migration tool.
	InitializeSchema bool

	// SchemaAdapter names the tables. Default DefaultSchemaAdapter{}: the
	// default names in the connection's search_path.
	SchemaAdapter DefaultSchemaAdapter

	// Maintenance configures the maintenance this Subscriber runs if it is
	// elected the maintainer: delayed messages, retention, expired
	// sessions, idle groups. On by default.
	Maintenance MaintenanceConfig
}

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
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.CommitBatch == 0 {
		c.CommitBatch = DefaultCommitBatch
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.Maintenance.Interval == 0 {
		c.Maintenance.Interval = DefaultMaintenanceInterval
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
	if err := c.SchemaAdapter.validate(); err != nil {
		return fmt.Errorf("SubscriberConfig.SchemaAdapter: %w", err)
	}
	return nil
}

// Subscriber is a Watermill [message.Subscriber] reading from PostgreSQL.
//
// On its first Subscribe it opens one consumer-session row, kept alive by a
// heartbeat, and claims subscribed (consumer group, topic) rows through it:
// the live Subscribers of a group split the topics they subscribe to
// evenly. Messages of a claimed topic are delivered in order, one at a time:
// the next only after the previous one was acked. The channel of a topic
// that another Subscriber of the group owns stays silent until this one is
// granted the topic; a topic can also move to another Subscriber between
// two messages when the group is split again. See the package documentation
// for the protocol.
//
// A Subscriber is safe for concurrent use.
type Subscriber struct {
	pool    *pgxpool.Pool
	config  SubscriberConfig
	logger  watermill.LoggerAdapter
	offsets offsetStore
	session *sessionKeeper
	stats   *subscriberStats
	budget  *byteBudget // MaxBufferedBytes

	schemaMu    sync.Mutex
	schemaReady bool

	hub      *wakeHub
	listener *sharedListener // set with started
	member   *groupMember
	maint    *maintainer // nil when maintenance is disabled

	mu        sync.Mutex
	closed    bool
	started   bool // listener and idle poller running
	slots     map[rowKey]*topicSlot
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	consumers sync.WaitGroup
	poller    svc.Service   // pollIdle, started with the listener
	closeDone chan struct{} // closed when the first Close returns
	// giveUp is closed CloseTimeout after Close began: subscriptions stop
	// retrying releases that fail, and Close reports them.
	giveUp    chan struct{}
	closeErrs []error // under mu
	// stallXmin is the xmin horizon of the last delivery stall logged;
	// stallChecking that a consumer is reading the horizon now.
	stallMu       sync.Mutex
	stallXmin     uint64
	stallChecking bool
	// releaseCtx bounds the wait of releases for their turn: it ends with
	// giveUp. Each release statement is bounded by CloseTimeout once sent.
	releaseCtx    context.Context
	releaseCancel context.CancelFunc
	// partitionRefresh is partitionRefreshInterval when the Subscriber was
	// made.
	partitionRefresh time.Duration
}

// topicSlot lets one consumer of this Subscriber at a time work on a
// (topic, partition) row, so that two Subscribe calls for the same topic
// take turns.
type topicSlot struct {
	token chan struct{}
	refs  int
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber returns a Subscriber reading with pool. It does not touch the
// database: the session opens on the first Subscribe. A nil logger means no
// logging.
func NewSubscriber(pool *pgxpool.Pool, config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: NewSubscriber needs a *pgxpool.Pool, got nil", ErrInvalidConfig)
	}
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	logger = logger.With(watermill.LogFields{"consumer_group": config.ConsumerGroup})
	ctx, cancel := context.WithCancel(context.Background())
	stats := newSubscriberStats()
	tables := config.SchemaAdapter.tables()
	s := &Subscriber{
		pool:      pool,
		config:    config,
		logger:    logger,
		offsets:   newOffsetStore(pool, tables, config.CloseTimeout, stats, logger),
		session:   newSessionKeeper(pool, tables, config.ConsumerGroup, config.SessionTTL, stats, logger),
		stats:     stats,
		budget:    newByteBudget(config.MaxBufferedBytes),
		closeDone: make(chan struct{}),
		giveUp:    make(chan struct{}),
		slots:     map[rowKey]*topicSlot{},
		ctx:       ctx,
		cancel:    cancel,

		partitionRefresh: partitionRefreshInterval,
	}
	s.releaseCtx, s.releaseCancel = context.WithCancel(context.Background())
	s.member = newGroupMember(s)
	s.maint = newMaintainer(s)
	s.hub = newWakeHub(s.member, s.maint, config.ConsumerGroup)
	s.session.onNewSession = func() {
		s.member.wake()
		s.maint.notified('e')
	}
	// The maintainer deletes expired sessions; without one, each Subscriber does.
	s.session.cleanup = s.maint == nil
	return s, nil
}

// SubscribeInitialize validates topic and, with InitializeSchema, creates
// the tables. It implements [message.SubscribeInitializer].
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := validateTopic(topic); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrSubscriberClosed
	}
	return s.initializeSchema(s.ctx)
}

// Subscribe returns a channel of the messages of topic for this Subscriber's
// consumer group. The channel is closed when ctx ends or the Subscriber
// closes; the topic is then released at once, with its acknowledged offset,
// for another Subscriber of the group to take over.
//
// Every message must be acked or nacked: the next one is delivered only
// after an Ack, a Nack delivers the same message again after
// NackResendDelay. A message's context is cancelled after its Ack or Nack,
// when ctx ends and on Close.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, ErrSubscriberClosed
	}
	if err := s.initializeSchema(ctx); err != nil {
		return nil, err
	}
	if err := s.session.start(ctx); err != nil {
		if errors.Is(err, ErrSubscriberClosed) {
			return nil, err
		}
		return nil, fmt.Errorf("subscribe to topic %q: %w", topic, err)
	}

	cctx, cancel := context.WithCancel(ctx)
	sub := &subscription{
		s:      s,
		topic:  topic,
		ctx:    cctx,
		cancel: cancel,
		out:    make(chan *message.Message),
		logger: s.logger.With(watermill.LogFields{"topic": topic}),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		cancel()
		return nil, ErrSubscriberClosed
	}
	s.consumers.Add(1)
	if !s.started {
		s.started = true
		if !s.config.PollOnly {
			s.listener = acquireListener(s.pool, s.offsets.tables.NotifyChannel, s.config.ListenConnConfig,
				s.hub, s.logger, s.config.CloseTimeout)
		}
		// Their contexts end with s.ctx, when Close begins.
		s.poller.Start(s.ctx, s.pollIdle)
		s.member.loop.Start(s.ctx, s.member.run)
		if s.maint != nil {
			s.maint.loop.Start(s.ctx, s.maint.run)
		}
	}
	// Under s.mu: a Close that follows finds the subscription registered
	// and ends it (groupMember.cancelAll).
	sub.start()
	return sub.out, nil
}

// subscription is one Subscribe call. It runs one consumer per partition of
// its topic, started once the group member has read the topic's partition
// count (grow), all delivering on the one channel: the messages of each
// partition in order, one unacked message per partition at a time.
type subscription struct {
	s      *Subscriber
	topic  string
	ctx    context.Context // ends with the Subscribe context or Close
	cancel context.CancelFunc
	out    chan *message.Message
	logger watermill.LoggerAdapter

	mu         sync.Mutex
	partitions int  // consumers started: partitions 0 to partitions-1
	ending     bool // no consumer starts any more
	// running counts the consumers that may still send on out.
	running int
}

// start registers the subscription with the group member and arranges
// for its end. It runs no goroutine of its own: a Subscriber of 100,000
// topics runs one goroutine per topic, its consumer's. Close ends it
// through the member (cancelAll).
func (sub *subscription) start() {
	sub.s.member.addSubscription(sub)
	context.AfterFunc(sub.ctx, sub.end)
}

// end runs when the subscription's context ends: no consumer starts any
// more, and the channel is closed once no consumer sends on it.
func (sub *subscription) end() {
	sub.s.member.removeSubscription(sub)
	sub.mu.Lock()
	sub.ending = true
	done := sub.running == 0
	sub.mu.Unlock()
	if done {
		sub.closeOut()
	}
}

// consumerDone is called by each consumer once it no longer sends on out.
func (sub *subscription) consumerDone() {
	sub.mu.Lock()
	sub.running--
	done := sub.ending && sub.running == 0
	sub.mu.Unlock()
	if done {
		sub.closeOut()
	}
}

func (sub *subscription) closeOut() {
	close(sub.out)
	sub.s.consumers.Done()
}

// partitionCount returns how many partitions the subscription consumes.
func (sub *subscription) partitionCount() int {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.partitions
}

// grow starts the consumers of partitions up to n (a topic's partition
// count only grows). It returns the first partition it started a consumer
// for (n when it started none).
func (sub *subscription) grow(n int) (from int) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.ending || n <= sub.partitions {
		return n
	}
	from = sub.partitions
	s := sub.s
	for p := sub.partitions; p < n; p++ {
		key := rowKey{topic: sub.topic, partition: int32(p)}
		s.mu.Lock()
		slot := s.slots[key]
		if slot == nil {
			slot = &topicSlot{token: make(chan struct{}, 1)}
			s.slots[key] = slot
		}
		slot.refs++
		// The subscription's own count (until its channel is closed)
		// keeps s.consumers above zero.
		s.consumers.Add(1)
		s.mu.Unlock()
		logger := sub.logger
		if n > 1 {
			logger = logger.With(watermill.LogFields{"partition": p})
		}
		c := &consumer{
			s:         s,
			sub:       sub,
			topic:     sub.topic,
			partition: int32(p),
			slot:      slot,
			ctx:       sub.ctx,
			out:       sub.out,
			wake:      make(chan struct{}, 1),
			grant:     make(chan grant, 1),
			logger:    logger,
		}
		s.hub.add(c)
		sub.running++
		go c.run()
	}
	if sub.partitions > 0 {
		sub.logger.Info("The topic's partition count was raised: consuming the new partitions",
			watermill.LogFields{"partitions": n, "before": sub.partitions})
	}
	sub.partitions = n
	return from
}

// Close ends every subscription: it releases their topics with their
// acknowledged offsets, closes their channels, waits for every goroutine the
// Subscriber started, and deletes the session row. Releases that fail are
// retried until CloseTimeout has passed since Close began.
//
// Close returns an error when a release or the session delete could not be
// written (the database is unreachable, say): nothing is lost, the topics
// are free for other Subscribers once the session row expires, after at
// most SessionTTL. It is idempotent: a call made while another is under way
// returns when that one is done; later calls return nil.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.closeDone // a concurrent Close may still be releasing
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	defer close(s.closeDone)

	giveUp := time.AfterFunc(s.config.CloseTimeout, func() {
		close(s.giveUp)
		s.releaseCancel()
	})
	s.cancel()
	s.member.cancelAll()
	s.consumers.Wait()
	if giveUp.Stop() {
		close(s.giveUp)
		s.releaseCancel()
	}
	for _, stop := range s.closeSteps() {
		stop()
	}
	s.mu.Lock()
	errs := s.closeErrs
	s.mu.Unlock()
	// Last: the session row, which the releases above were fenced by.
	if err := s.session.close(s.config.CloseTimeout); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("close subscriber of consumer group %q (its topics are free once its session expires): %w",
			s.config.ConsumerGroup, errors.Join(summarize(errs, maxCloseErrors)...))
	}
	s.logger.Info("Subscriber closed", nil)
	return nil
}

// closeSteps are what Close stops, in this order, once the consumers have
// ended (their releases written or given up) and before it deletes the
// session: the loops that start consumers, claim and elect (their contexts
// ended with s.ctx when Close began; here Close waits for them), the
// releases still being written, and this Subscriber's share of the LISTEN
// connection. Each step may run before its service was started.
func (s *Subscriber) closeSteps() []func() {
	steps := []func(){
		s.poller.Stop,
		s.member.loop.Stop,
	}
	if s.maint != nil {
		steps = append(steps, s.maint.loop.Stop)
	}
	steps = append(steps, s.offsets.releases.wait)
	if s.listener != nil {
		steps = append(steps, func() { s.listener.release(s.hub) })
	}
	return steps
}

// maxCloseErrors bounds the errors that Close reports one by one.
const maxCloseErrors = 10

// summarize returns at most max of errs, the last one saying how many more
// there were.
func summarize(errs []error, max int) []error {
	if len(errs) <= max {
		return errs
	}
	return append(errs[:max-1:max-1], fmt.Errorf("and %d more errors", len(errs)-max+1))
}

// reportStall logs, once per stall (per xmin horizon), that committed
// messages have waited behind an older running transaction for over
// pendingFastFor, naming the backend that holds the horizon back.
func (s *Subscriber) reportStall() {
	s.stallMu.Lock()
	if s.stallChecking {
		s.stallMu.Unlock()
		return
	}
	s.stallChecking = true
	s.stallMu.Unlock()
	defer func() {
		s.stallMu.Lock()
		s.stallChecking = false
		s.stallMu.Unlock()
	}()
	insp := &Inspector{db: s.pool, tables: s.offsets.tables}
	ctx, cancel := context.WithTimeout(s.ctx, s.config.SessionTTL)
	defer cancel()
	h, err := insp.Horizon(ctx)
	if err != nil {
		return
	}
	s.stallMu.Lock()
	seen := h.Xmin == s.stallXmin
	s.stallXmin = h.Xmin
	s.stallMu.Unlock()
	if seen {
		return
	}
	fields := watermill.LogFields{"xmin": h.Xmin}
	if hh := h.Holder; hh != nil {
		fields["pid"], fields["application_name"], fields["state"] = hh.PID, hh.ApplicationName, hh.State
		fields["transaction_age"], fields["xact_start"] = hh.Age.Round(time.Millisecond).String(), hh.XactStart
		if hh.GID != "" {
			fields["prepared_gid"] = hh.GID
		}
	}
	s.logger.Error("Delivery is held back: committed messages wait for an older transaction to end "+
		"(every topic of the cluster waits; end it, or bound such transactions with idle_in_transaction_session_timeout)",
		ErrDeliveryHeldBack, fields)
}

// isGivingUp reports whether Close stopped waiting for releases.
func (s *Subscriber) isGivingUp() bool {
	select {
	case <-s.giveUp:
		return true
	default:
		return false
	}
}

// closeError records an error for Close to return.
func (s *Subscriber) closeError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeErrs = append(s.closeErrs, err)
}

func (s *Subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Subscriber) initializeSchema(ctx context.Context) error {
	if !s.config.InitializeSchema {
		return nil
	}
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.schemaReady {
		return nil
	}
	if err := initializeSchema(ctx, s.pool, s.offsets.tables); err != nil {
		return err
	}
	s.schemaReady = true
	return nil
}

func (s *Subscriber) releaseSlot(key rowKey, slot *topicSlot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot.refs--
	if slot.refs == 0 {
		delete(s.slots, key)
	}
}

// storedMessage is one row read from the messages table.
type storedMessage struct {
	pos      Position
	uuid     string
	payload  []byte
	metadata string
	// size is what the message counts against MaxBufferedBytes, as
	// SelectMessages computes it; whole is false when the read left its
	// payload and metadata out (larger than it asked for).
	size  int64
	whole bool
}

// toMessage builds a new Watermill message each time, so that an Ack of a
// nacked delivery can never affect the next one.
func (m storedMessage) toMessage() (*message.Message, error) {
	msg := message.NewMessage(m.uuid, m.payload)
	if m.metadata != "" {
		if err := json.Unmarshal([]byte(m.metadata), &msg.Metadata); err != nil {
			return nil, fmt.Errorf("decode metadata of message %s: %w", m.uuid, err)
		}
	}
	return msg, nil
}

// consumer is one partition of a subscription: it registers its (topic,
// partition) row with the group member, waits for the member to grant it,
// delivers it while it owns it, and gives it back when the member asks,
// until the subscription ends.
type consumer struct {
	s         *Subscriber
	sub       *subscription
	topic     string
	partition int32
	slot      *topicSlot
	ctx       context.Context // the subscription's
	out       chan *message.Message
	logger    watermill.LoggerAdapter

	// wake is poked (never blocking) by notifications and the idle poller.
	wake chan struct{}
	// grant receives the claims of the topic from the group member; it
	// holds at most one, as the member grants only to waiting consumers.
	grant chan grant
	// yield is closed when the member asks for the topic back; set from
	// each grant, used by this consumer's goroutine only.
	yield chan struct{}
	// owning tells the wake hub which notifications concern this consumer;
	// idle that it waits for news with nothing in flight.
	owning atomic.Bool
	idle   atomic.Bool
	// flushTimer fires CommitInterval after the first uncommitted Ack; it
	// is made on the first Ack (an idle topic has none).
	flushTimer *time.Timer
	flushArmed bool
	unflushed  int
	// lease is what the consumer holds of the Subscriber's byte budget:
	// the messages of its batch not handed out yet. unsent is the size of
	// the message being delivered until it is first handed out.
	lease  budgetLease
	unsent int64
}

func (c *consumer) row() rowKey { return rowKey{topic: c.topic, partition: c.partition} }

func (c *consumer) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

type outcome int

const (
	acked   outcome = iota
	stopped         // the subscription ended: release the claim
	lost            // ownership lost: wait for a new grant
	yielded         // the member asked for the topic: release it, wait
)

func (c *consumer) run() {
	defer c.s.consumers.Done()
	defer c.s.releaseSlot(c.row(), c.slot)
	defer c.s.hub.remove(c)
	defer c.resetFlush()

	select {
	case c.slot.token <- struct{}{}:
	case <-c.ctx.Done():
		c.sub.consumerDone()
		return
	}
	// The slot is held until nothing of this subscription may own the row
	// any more: no other subscription of this Subscriber claims it meanwhile.
	defer func() { <-c.slot.token }()
	left := c.consume()
	c.sub.cancel() // a consumer ends only with its subscription
	c.finish(&left)
}

// leftover is a claim that a subscription may still hold when it stops
// owning the topic: released by releaseLeftover.
type leftover struct {
	g  *sessionGen
	cl *claim
}

// consume registers the topic with the group member, waits for it to
// grant the topic, delivers it while it owns it, and gives it back when
// the member asks for it, until the subscription ends. It returns what
// the subscription may still hold. Every way of ending ownership goes
// through releaseLeftover, but for a lost one (nothing to release).
func (c *consumer) consume() leftover {
	m := c.s.member
	m.register(c)
	for {
		var gr grant
		select {
		case gr = <-c.grant:
		case <-c.ctx.Done():
			if gr, ok := m.unregister(c); ok {
				return leftover{g: gr.g, cl: gr.cl}
			}
			return leftover{}
		}
		c.yield = gr.yield
		c.owning.Store(true)
		out := c.own(gr.g, gr.cl, gr.hasNext)
		c.owning.Store(false)
		c.idle.Store(false)
		c.resetFlush()
		switch out {
		case stopped:
			m.unregister(c)
			return leftover{g: gr.g, cl: gr.cl}
		case yielded:
			left := leftover{g: gr.g, cl: gr.cl}
			c.releaseRetrying(&left, c.releaseLeftover(&left))
			c.logger.Debug("Topic given up to another member of the group", nil)
		}
		m.disown(c)
	}
}

// standbyMargin is added to another member's expiry before this member
// looks at the group again, so that it lands after the expiry on the
// server.
const standbyMargin = 20 * time.Millisecond

// finish ends the consumer: it releases what it may still hold, lets the
// subscription close its channel, and, if the release could not be
// written, tries again with backoff while the session lives. A live session never keeps a
// topic that no subscription consumes: it holds the row only until the
// release goes through, the session is lost (its rows are free with it), or
// Close gives up after CloseTimeout (then Close deletes the session row).
func (c *consumer) finish(left *leftover) {
	err := c.releaseLeftover(left)
	c.sub.consumerDone()
	c.releaseRetrying(left, err)
}

// releaseRetrying retries a failed release (err, from releaseLeftover) with
// backoff until it goes through, the session is lost or Close gives up.
func (c *consumer) releaseRetrying(left *leftover, err error) {
	retry := newBackoff(c.s.config.PollInterval/20, maxRetryBackoff)
	for err != nil {
		if !sleep(retry.delay(), c.s.giveUp, left.g.lost) {
			if c.s.isGivingUp() {
				c.s.closeError(err)
			}
			return
		}
		err = c.releaseLeftover(left)
	}
}

// releaseLeftover makes one attempt at releasing what left holds; nil means
// nothing is left to do.
func (c *consumer) releaseLeftover(left *leftover) error {
	if left.cl == nil {
		return nil
	}
	cl := left.cl
	err := c.s.offsets.release(c.s.releaseCtx, cl)
	switch {
	case err == nil:
		c.logger.Debug("Topic released", watermill.LogFields{"epoch": cl.epoch,
			"acked_transaction_id": cl.acked.TransactionID, "acked_offset": cl.acked.Offset})
		return nil
	case errors.Is(err, ErrOwnershipLost):
		c.logger.Info("Topic was already taken over before release (fenced)", watermill.LogFields{
			"epoch": cl.epoch, "session_id": cl.sessionID.String()})
		return nil
	default:
		c.logger.Error("Cannot release the topic, retrying while the session lives", err, nil)
		return err
	}
}

// waitWake waits for d (forever when d is 0), a wake-up, the end of the
// subscription, the loss of the session (when lost is not nil) or the
// member's request for the topic. It reports whether it returned because
// of the timer or a wake-up.
func (c *consumer) waitWake(d time.Duration, lost <-chan struct{}) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
		return true
	case <-c.wake:
		return true
	case <-c.ctx.Done():
		return false
	case <-lost:
		return false
	case <-c.yield:
		return false
	}
}

// own delivers the claimed topic's messages until the subscription ends
// (stopped), ownership is lost (lost) or the member asks for the topic
// (yielded, only between messages: a message handed out is first acked or
// nacked). Without hasNext it waits for news before its first read.
func (c *consumer) own(g *sessionGen, cl *claim, hasNext bool) outcome {
	retry := newBackoff(c.s.config.PollInterval/20, maxRetryBackoff)
	// pendingWait re-polls while committed messages are not visible yet:
	// every few milliseconds at first (such rows usually wait behind a
	// transaction that ends a moment later), then backing off to
	// PollInterval once that has lasted longer than pendingFastFor.
	pendingWait := newBackoff(2*time.Millisecond, pendingFastCap)
	var pendingSince time.Time
	head := true // no message of this claim delivered yet
	// Messages of a batch not handed out when ownership ends are dropped:
	// their bytes go back to the budget.
	defer c.dropBuffered()
	for first := true; ; first = false {
		if c.ctx.Err() != nil {
			return stopped
		}
		if g.isLost() {
			c.logger.Info("Session lost, topic delivery stopped", watermill.LogFields{
				"epoch": cl.epoch, "session_id": cl.sessionID.String()})
			return lost
		}
		if c.yielding() {
			return c.interrupted()
		}
		if first && !hasNext {
			if !c.waitIdle(g, cl) {
				return c.interrupted()
			}
			continue
		}
		batch, pending, ok, err := c.fetch(g, cl)
		if !ok {
			return c.interrupted()
		}
		if err != nil {
			if c.ctx.Err() != nil {
				return stopped
			}
			c.logger.Error("Cannot read messages, retrying", err, nil)
			if !sleep(retry.delay(), c.ctx.Done(), g.lost) && c.ctx.Err() != nil {
				return stopped
			}
			continue
		}
		retry.reset()
		if len(batch) == 0 {
			if res := c.flush(g, cl); res != acked {
				return res
			}
			if pending {
				// Committed rows wait behind an older running transaction:
				// look again soon, backing off while it runs.
				if pendingSince.IsZero() {
					pendingSince = time.Now()
				} else if time.Since(pendingSince) > pendingFastFor {
					if pendingWait.max < c.s.config.PollInterval {
						c.s.reportStall()
					}
					pendingWait.max = max(pendingFastCap, c.s.config.PollInterval)
				}
				if !c.waitWake(pendingWait.delay(), g.lost) {
					return c.interrupted()
				}
				continue
			}
			pendingSince = time.Time{}
			pendingWait = newBackoff(2*time.Millisecond, pendingFastCap)
			if !c.waitIdle(g, cl) {
				return c.interrupted()
			}
			continue
		}
		for _, m := range batch {
			if c.yielding() {
				return c.interrupted()
			}
			attempt := 1
			if head {
				// The first message after the claim's position: count
				// this claim's delivery of it in the row, across owners.
				n, res := c.countHead(g, cl)
				if res != acked {
					return res
				}
				attempt, head = n, false
			}
			c.unsent = m.size
			if res := c.deliver(g, cl, m, attempt); res != acked {
				return res
			}
			cl.acked = m.pos
			c.unflushed++
			if c.unflushed >= c.s.config.CommitBatch {
				if res := c.flush(g, cl); res != acked {
					return res
				}
			} else if !c.flushArmed {
				c.flushArmed = true
				if c.flushTimer == nil {
					c.flushTimer = time.NewTimer(c.s.config.CommitInterval)
				} else {
					c.flushTimer.Reset(c.s.config.CommitInterval)
				}
			}
		}
	}
}

// While committed rows are not visible yet, they are re-polled with a
// backoff capped at pendingFastCap for pendingFastFor, then at PollInterval.
const (
	pendingFastCap = 20 * time.Millisecond
	pendingFastFor = time.Second
)

// waitIdle waits for news of the topic after cl's position, with no timer
// of its own: a notification or the idle poller (one statement per
// Subscriber for all its idle topics) wakes it. It reports false when the
// subscription ended, the session was lost or the member asked for the
// topic.
func (c *consumer) waitIdle(g *sessionGen, cl *claim) bool {
	c.s.hub.setIdle(c, cl.acked)
	c.idle.Store(true)
	ok := c.waitWake(0, g.lost)
	c.idle.Store(false)
	c.s.hub.clearIdle(c)
	return ok
}

// yielding reports whether the member asked for the topic back.
func (c *consumer) yielding() bool {
	select {
	case <-c.yield:
		return true
	default:
		return false
	}
}

// interrupted tells why a wait ended early.
func (c *consumer) interrupted() outcome {
	switch {
	case c.ctx.Err() != nil:
		return stopped
	case c.yielding():
		return yielded
	default:
		return lost
	}
}

// fetch reads the next messages after cl's position within the byte
// budget (MaxBufferedBytes). It reserves up to an eighth of the budget,
// waiting while nothing is free (after committing what is due), and reads
// BatchSize messages, each sent with its payload only if it is at most a
// BatchSize-th of the reservation, so that the payloads sent never exceed
// the reservation whatever the sizes (the metadata of the others is sent). The batch is the longest prefix of whole
// messages that fits the reservation. When the first message was not
// sent whole, the sizes read tell how many messages fit, and a second read
// gets exactly those, after reserving the first one's size when it alone
// is larger than the reservation (byteBudget.reserveExact). What the batch
// uses stays in c.lease until its messages are handed out; the rest is
// given back. ok is false when the subscription ended, the session was
// lost or the member asked for the row while it waited.
func (c *consumer) fetch(g *sessionGen, cl *claim) (batch []storedMessage, pending, ok bool, err error) {
	b := c.s.budget
	stop := budgetStop{c.ctx.Done(), g.lost, c.yield}
	c.dropBuffered()
	if !b.tryReserve(&c.lease, b.reserveWant()) {
		// Nothing free: commit what is due before waiting.
		if c.flush(g, cl) != acked {
			return nil, false, false, nil
		}
		if !b.reserve(&c.lease, b.reserveWant(), stop) {
			return nil, false, false, nil
		}
	}
	limit := c.s.config.BatchSize
	wholeUpTo := max(c.lease.n/int64(limit), 1)
	for {
		var rows []storedMessage
		rows, pending, err = c.read(cl.acked, limit, wholeUpTo)
		if err != nil {
			c.dropBuffered()
			return nil, false, true, err
		}
		batch, fit := cutBatch(rows, c.lease.n)
		clear(rows[len(batch):]) // the payloads and metadata left out
		if len(batch) > 0 || len(rows) == 0 {
			var used int64
			for _, m := range batch {
				used += m.size
			}
			b.giveBack(&c.lease, c.lease.n-used)
			return batch, pending, true, nil
		}
		if fit == 0 {
			// The first message alone is larger than the reservation.
			c.dropBuffered()
			if !b.reserveExact(&c.lease, rows[0].size, stop) {
				return nil, false, false, nil
			}
			fit = 1
		}
		// The next read returns the same first messages (the partition is
		// this consumer's, and rows committed meanwhile come after them).
		limit, wholeUpTo = fit, c.lease.n
	}
}

// cutBatch returns the longest prefix of rows that are whole and whose
// sizes add up to at most budget, and how many of rows, whole or not, fit
// in budget.
func cutBatch(rows []storedMessage, budget int64) (batch []storedMessage, fit int) {
	var sum int64
	whole := true
	for _, m := range rows {
		sum += m.size
		if sum > budget {
			break
		}
		whole = whole && m.whole
		if whole {
			batch = rows[:fit+1]
		}
		fit++
	}
	return batch, fit
}

// dropBuffered gives back to the budget what the consumer still holds of
// it: a batch not handed out, or a reservation.
func (c *consumer) dropBuffered() {
	c.s.budget.giveBack(&c.lease, c.lease.n)
	c.unsent = 0
}

// read runs one SelectMessages for limit messages after after, each
// returned whole only if its size is at most wholeUpTo.
func (c *consumer) read(after Position, limit int, wholeUpTo int64) (rows []storedMessage, pending bool, err error) {
	conn, err := c.s.offsets.gate.acquire(c.ctx)
	if err != nil {
		return nil, false, fmt.Errorf("read messages of topic %q: %w", c.topic, err)
	}
	defer c.s.offsets.gate.release(conn)
	ctx, cancel := context.WithTimeout(c.ctx, c.s.config.SessionTTL)
	defer cancel()
	res, err := pgsql.SelectMessages(ctx, conn, c.s.offsets.tables, pgsql.SelectMessagesParams{
		Topic:           c.topic,
		Partition:       c.partition,
		After:           pgsql.Position(after),
		Limit:           limit,
		MaxMessageBytes: wholeUpTo,
	})
	if err != nil {
		return nil, false, fmt.Errorf("read messages of topic %q: %w", c.topic, wrapMissingSchema(err))
	}
	if res.Future {
		return nil, false, fmt.Errorf("read messages of topic %q: a stored message was written by a transaction "+
			"this database has not reached yet, so it would be delivered after messages published later or "+
			"never: %w", c.topic, ErrFuturePosition)
	}
	rows = make([]storedMessage, len(res.Messages))
	for i, m := range res.Messages {
		rows[i] = storedMessage{uuid: m.UUID, payload: m.Payload, metadata: m.Metadata, size: m.Size,
			whole: m.Size <= wholeUpTo, pos: Position(m.Position)}
	}
	return rows, res.Pending, nil
}

// flushC is the flush timer's channel while acknowledged positions wait to
// be committed, nil otherwise.
func (c *consumer) flushC() <-chan time.Time {
	if c.flushArmed {
		return c.flushTimer.C
	}
	return nil
}

func (c *consumer) resetFlush() {
	if c.flushTimer != nil {
		c.flushTimer.Stop()
	}
	c.flushArmed = false
	c.unflushed = 0
}

// deliver hands m out until it is acked. Each delivery is a fresh message
// whose context ends after its Ack or Nack. Nothing is handed out once the
// session generation is lost or its trust window has passed. While it
// waits, acknowledged positions due for commit are flushed.
func (c *consumer) deliver(g *sessionGen, cl *claim, m storedMessage, attempt int) outcome {
	for ; ; attempt++ {
		if g.isLost() {
			return lost
		}
		msg, err := m.toMessage()
		if err != nil {
			// A row this package did not write; delivering it without its
			// metadata would hide the problem, skipping it would lose it.
			c.logger.Error("Cannot decode message, retrying", err, nil)
			if !sleep(maxRetryBackoff, c.ctx.Done(), g.lost) {
				return c.interrupted()
			}
			continue
		}
		msg.Metadata.Set(DeliveryAttemptMetadata, strconv.Itoa(attempt))
		mctx, mcancel := context.WithCancel(&deliveryCtx{Context: c.ctx, d: delivery{
			topic: c.topic, partition: c.partition, pos: m.pos, group: cl.group,
			sessionID: cl.sessionID, epoch: cl.epoch, g: g, tables: c.s.offsets.tables}})
		msg.SetContext(mctx)
		res, nacked := c.handOut(g, cl, m, msg)
		mcancel()
		if !nacked {
			return res
		}
		if !c.waitFlushing(g, cl, c.s.config.NackResendDelay) {
			return c.interrupted()
		}
	}
}

// countHead counts one more delivery of the message after cl's position
// in the offsets row, and returns the count: how many claims have handed
// that message out without its position being committed. It retries while
// the database cannot be reached.
func (c *consumer) countHead(g *sessionGen, cl *claim) (int, outcome) {
	var n int
	res := c.fencedWrite(g, cl, "Cannot count the delivery, retrying", func(ctx context.Context) (err error) {
		n, err = c.s.offsets.countHead(ctx, cl)
		return err
	})
	return n, res
}

// fencedWrite runs write, a statement fenced by cl's session and epoch,
// retrying with backoff while the database cannot be reached (logging
// retryMsg). It reports acked when it went through, lost when the row was
// taken over, and stopped or why a wait was interrupted otherwise. The end
// of the subscription cuts a write off.
func (c *consumer) fencedWrite(g *sessionGen, cl *claim, retryMsg string, write func(context.Context) error) outcome {
	retry := newBackoff(c.s.config.PollInterval/20, maxRetryBackoff)
	for {
		// A generation found lost (expired, self-fenced, or dropped
		// because the database went back in time) writes nothing more:
		// its acknowledged positions may name transaction ids the
		// database hands out again.
		if g.isLost() {
			return lost
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.s.config.SessionTTL)
		err := write(ctx)
		cancel()
		if err == nil {
			return acked
		}
		if errors.Is(err, ErrOwnershipLost) {
			c.logger.Info("Topic was taken over by another session (fenced), delivery stopped",
				watermill.LogFields{"epoch": cl.epoch, "session_id": cl.sessionID.String(), "error": err.Error()})
			return lost
		}
		if c.ctx.Err() != nil {
			return stopped
		}
		c.logger.Error(retryMsg, err, nil)
		if !sleep(retry.delay(), c.ctx.Done(), g.lost) {
			return c.interrupted()
		}
	}
}

// handOut sends msg and waits for its Ack or Nack.
func (c *consumer) handOut(g *sessionGen, cl *claim, m storedMessage, msg *message.Message) (res outcome, nacked bool) {
	for sent := false; !sent; {
		select {
		case c.out <- msg:
			sent = true
		case <-c.ctx.Done():
			return stopped, false
		case <-g.lost:
			return lost, false
		case <-c.yield:
			return yielded, false
		case <-c.flushC():
			if res := c.flush(g, cl); res != acked {
				return res, false
			}
		}
	}
	c.s.stats.delivered.Add(1)
	if c.unsent > 0 {
		// Handed out: the handler holds it now.
		c.s.budget.giveBack(&c.lease, c.unsent)
		c.unsent = 0
	}
	for {
		select {
		case <-msg.Acked():
			c.s.stats.acked.Add(1)
			return acked, false
		case <-msg.Nacked():
			c.s.stats.nacked.Add(1)
			return acked, true
		case <-c.ctx.Done():
			if isAcked(msg) {
				return acked, false
			}
			return stopped, false
		case <-g.lost:
			return lost, false
		case <-c.flushC():
			if res := c.flush(g, cl); res != acked {
				if res == stopped && isAcked(msg) {
					// Acked just before the subscription ended: its
					// position goes into the release.
					return acked, false
				}
				return res, false
			}
		}
	}
}

// waitFlushing sleeps d, flushing due commits meanwhile. It reports false
// when the subscription ended or the session was lost.
func (c *consumer) waitFlushing(g *sessionGen, cl *claim, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-c.ctx.Done():
			return false
		case <-g.lost:
			return false
		case <-c.yield:
			return false // the nacked message goes to the next owner
		case <-c.flushC():
			if c.flush(g, cl) != acked {
				return false
			}
		}
	}
}

func isAcked(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	default:
		return false
	}
}

// flush commits the acknowledged position, fenced by session and epoch,
// retrying while the database cannot be reached. Nothing to commit is a
// no-op.
func (c *consumer) flush(g *sessionGen, cl *claim) outcome {
	c.resetFlush()
	if !cl.dirty() {
		return acked
	}
	// The end of the subscription may cut a commit off (stopped): the
	// release that follows writes the same position, fenced the same way.
	return c.fencedWrite(g, cl, "Cannot commit offset, retrying", func(ctx context.Context) error {
		return c.s.offsets.commit(ctx, cl)
	})
}
