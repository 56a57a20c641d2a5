package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/svc"
)

// Subscriber is a Watermill [message.Subscriber] reading from PostgreSQL.
//
// On its first Subscribe it opens one consumer-session row, kept alive by a
// heartbeat, and claims subscribed (consumer group, topic) rows through it:
// the live Subscribers of a group split the topics they subscribe to
// evenly. Messages of a claimed (topic, partition) are delivered in order,
// by default one at a time, the next only after the previous one was
// acked; with SubscriberConfig.MaxInFlight N, up to N at once, never two
// of one ordering key. The channel of a topic
// that another Subscriber of the group owns stays silent until this one is
// granted the topic; a topic can also move to another Subscriber between
// two messages when the group is split again. See the package documentation
// for the protocol.
//
// A Subscriber is safe for concurrent use.
type Subscriber struct {
	pool     *pgxpool.Pool
	settings Settings
	logger   watermill.LoggerAdapter
	offsets  offsetStore
	session  *sessionKeeper
	stats    *subscriberStats
	budget   *byteBudget // MaxBufferedBytes
	// stmtTimeout bounds each statement the Subscriber runs on the pool
	// (statementTimeout).
	stmtTimeout time.Duration
	// consumers is what every consumer of the Subscriber is given.
	consumerDeps *consumerDeps

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
	// stallXmin is the position held (on Citus the xmin horizon) of the
	// last delivery stall logged; stallChecking that a consumer is
	// reading what holds it now.
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
	// pollOutage logs the failures of the idle poll: once per outage
	// (outageLog).
	pollOutage *outageLog
	// connString is the pool's connection string: with the tables, the
	// group and the topic, what the subscriptions of the process that
	// share a topic's messages have in common (logIfShared).
	connString string
}

// statementTimeout bounds each statement a Subscriber runs on the pool
// (reads, commits, claims, idle polls, the maintainer's): SessionTTL. A
// statement that has not answered by then has outlived the trust window
// of the session it was sent under, whose consumers have stopped; one cut
// off is retried.
func statementTimeout(cfg Settings) time.Duration { return cfg.SessionTTL }

// topicSlot lets one consumer of this Subscriber at a time work on a
// (topic, partition) row, so that two Subscribe calls for the same topic
// take turns.
type topicSlot struct {
	token chan struct{}
	refs  int
}

// NewSubscriber returns a Subscriber reading with pool, configured by
// config (complete: defaults applied, validated). It does not touch the
// database: the session opens on the first Subscribe. logger is not nil.
func NewSubscriber(pool *pgxpool.Pool, config Settings, logger watermill.LoggerAdapter) *Subscriber {
	logger = logger.With(watermill.LogFields{"consumer_group": config.Group})
	ctx, cancel := context.WithCancel(context.Background())
	stats := newSubscriberStats(config.HeartbeatBuckets)
	driver := pgsql.NewLazy(config.Tables)
	s := &Subscriber{
		pool:     pool,
		settings: config,
		logger:   logger,
		offsets:  newOffsetStore(pool, driver, config.CloseTimeout, stats, logger),
		stats:    stats,
		budget:   newByteBudget(config.MaxBufferedBytes),

		stmtTimeout: statementTimeout(config),
		closeDone:   make(chan struct{}),
		giveUp:      make(chan struct{}),
		slots:       map[rowKey]*topicSlot{},
		ctx:         ctx,
		cancel:      cancel,

		partitionRefresh: partitionRefreshInterval,
		pollOutage:       newOutageLog(logger, componentIdlePoll),
		connString:       pool.Config().ConnString(),
	}
	s.releaseCtx, s.releaseCancel = context.WithCancel(context.Background())
	s.session = newSessionKeeper(pool, driver, config.Group, config.SessionTTL, stats, logger, sessionHooks{
		// A new session may claim rows and stand for maintainer at once.
		onNew: func() {
			s.member.wake()
			s.maint.notified(pgsql.NotifyMaintainer)
		},
		setUp: config.SetUp,
		// The maintainer deletes expired sessions; without one, each
		// Subscriber does.
		cleanup: config.Maintenance.Disabled,
	})
	s.member = newGroupMember(memberDeps{
		group: config.Group, pollInterval: config.PollInterval, startLatest: config.StartLatest,
		freeGrace: freeRowGrace(config.SessionTTL), logger: logger, stats: stats, session: s.session,
		store: pgGroupStore{offsets: &s.offsets, session: s.session, group: config.Group,
			timeout: s.stmtTimeout, releaseCtx: s.releaseCtx},
	})
	s.maint = newMaintainer(maintainerDeps{
		cfg: config.Maintenance, sessionTTL: config.SessionTTL, stmtTimeout: s.stmtTimeout, closeTimeout: config.CloseTimeout,
		logger: logger, stats: stats, session: s.session,
		store: pgMaintainerStore{pool: pool, driver: driver}, pool: pool, driver: driver,
	})
	s.hub = newWakeHub(s.member, s.maint, config.Group)
	s.consumerDeps = &consumerDeps{
		settings: newConsumerSettings(config),
		budget:   s.budget,
		store: pgConsumerStore{offsets: &s.offsets, timeout: s.stmtTimeout,
			releaseCtx: s.releaseCtx},
		member:     s.member,
		hub:        s.hub,
		host:       s,
		stats:      stats,
		outage:     newOutageLog(logger, componentConsumers),
		driver:     driver,
		goroutines: &s.consumers,
		giveUp:     s.giveUp,
		drains:     newDrainGate(),
		prefetch:   pool.Config().MaxConns >= prefetchMinConns,

		failurePolicy: newFailurePolicy(config.Retry),
		failures:      &s.offsets,
	}
	return s
}

// SubscribeInitialize runs the set-up (Settings.SetUp), if any.
func (s *Subscriber) SubscribeInitialize() error {
	if s.isClosed() {
		return ErrSubscriberClosed
	}
	if s.settings.SetUp == nil {
		return nil
	}
	return s.settings.SetUp(s.ctx)
}

// Subscribe returns a channel of the messages of topic for this Subscriber's
// consumer group. The channel is closed when ctx ends or the Subscriber
// closes; the topic is then released, once the messages handed out are
// acked or nacked (or DrainTimeout passed), with its acknowledged offset,
// for another Subscriber of the group to take over.
//
// Every message must be acked or nacked: with MaxInFlight 1 (the default)
// the next one is delivered only after an Ack, with MaxInFlight N once
// fewer than N are out and the earlier ones of its ordering key are
// acked; a Nack delivers the same message again after NackResendDelay. When ctx ends or on Close, nothing more is handed out,
// and the topic is released once the messages out are acked or nacked, or
// DrainTimeout passed. A message's context is cancelled after its Ack or
// Nack, or when its topic is released or lost.
//
// The first Subscribe initializes the schema (with InitializeSchema) and
// opens the session. When the database cannot be reached (refused, cut,
// starting up, too slow), Subscribe returns the channel all the same: the
// set-up is retried in the background with the backoff of later outages,
// logged once at Error and then at Info at most every 15 seconds, and
// delivery starts once it succeeds; a service may start before its
// database. An error that retrying cannot fix (the tables, schema or
// database missing, the role lacking grants or failing to log in) is
// returned, as is ctx's error when it ends first.
//
// Subscriptions of one consumer group to one topic share its messages,
// whether made on one Subscriber or on several: each message goes to one
// of them. When a second one starts in this process (same database,
// tables, group and topic), it is logged at Info, saying to give each
// handler its own ConsumerGroup if each must receive every message.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.isClosed() {
		return nil, ErrSubscriberClosed
	}
	// The schema (InitializeSchema) and the first session: set up now,
	// or in the background while the database cannot be reached.
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
		key:    subscriptionKey{db: s.connString, messages: s.offsets.driver.Tables().Messages, group: s.settings.Group, topic: topic},
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
		if !s.settings.PollOnly {
			s.listener = acquireListener(s.pool, s.offsets.driver.Tables().NotifyChannel, s.settings.ListenConnConfig,
				s.hub, s.logger, s.settings.CloseTimeout)
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
	key    subscriptionKey // counted from start to end (logIfShared)

	mu         sync.Mutex
	partitions int  // consumers started: partitions 0 to partitions-1
	ending     bool // no consumer starts any more
	// running counts the consumers that may still send on out.
	running int
}

// start counts the subscription among those of the process
// (logIfShared), registers it with the group member and arranges for its
// end. It runs no goroutine of its own: a Subscriber of 100,000
// topics runs one goroutine per topic, its consumer's. Close ends it
// through the member (cancelAll).
func (sub *subscription) start() {
	sub.logIfShared()
	sub.s.member.addSubscription(sub)
	context.AfterFunc(sub.ctx, sub.end)
}

// end runs when the subscription's context ends: no consumer starts any
// more, and the channel is closed once no consumer sends on it.
func (sub *subscription) end() {
	untrackSubscription(sub.key)
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
			consumerDeps: s.consumerDeps,
			sub:          sub,
			topic:        sub.topic,
			partition:    int32(p),
			slot:         slot,
			ctx:          sub.ctx,
			out:          sub.out,
			wake:         make(chan struct{}, 1),
			grant:        make(chan grant, 1),
			logger:       logger,
		}
		s.hub.add(c)
		s.consumerDeps.drains.enter()
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

// Close ends every subscription: it hands nothing more out, waits up to
// DrainTimeout for the messages already handed out to be acked or nacked,
// releases the topics with their acknowledged offsets, closes their
// channels, waits for every goroutine the Subscriber started, and deletes
// the session row. Releases that fail are retried until CloseTimeout has
// passed since the last subscription stopped waiting (at most DrainTimeout
// after Close began).
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

	s.cancel()
	s.member.cancelAll()
	// The consumers first wait up to DrainTimeout for the messages they
	// handed out; the releases have CloseTimeout from then.
	drained := time.NewTimer(max(s.settings.DrainTimeout, 0))
	select {
	case <-s.consumerDeps.drains.wait():
	case <-drained.C:
	}
	drained.Stop()
	giveUp := time.AfterFunc(s.settings.CloseTimeout, func() {
		close(s.giveUp)
		s.releaseCancel()
	})
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
	if err := s.session.close(s.settings.CloseTimeout); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("close subscriber of consumer group %q (its topics are free once its session expires): %w",
			s.settings.Group, errors.Join(summarize(errs, maxCloseErrors)...))
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

// summarize returns at most n of errs, the last one saying how many more
// there were.
func summarize(errs []error, n int) []error {
	if len(errs) <= n {
		return errs
	}
	return append(errs[:n-1:n-1], fmt.Errorf("and %d more errors", len(errs)-n+1))
}

// reportStall logs, once per stall (per position held), that committed
// messages of row have waited for over pendingFastFor, naming the backend
// that holds them back: on a single node a transaction that published to
// the row's topic and partition and has not ended, on Citus the oldest
// running transaction (the xmin horizon).
func (s *Subscriber) reportStall(row rowKey) {
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
	ctx, cancel := context.WithTimeout(s.ctx, s.stmtTimeout)
	defer cancel()
	h, err := readHorizon(ctx, s.pool, s.offsets.driver, row)
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
	if h.TopicOnly {
		fields = watermill.LogFields{"topic": row.topic, "partition": row.partition, "held_position": h.Xmin}
	}
	if hh := h.Holder; hh != nil {
		fields["pid"], fields["application_name"], fields["state"] = hh.PID, hh.ApplicationName, hh.State
		fields["transaction_age"], fields["xact_start"] = hh.Age.Round(time.Millisecond).String(), hh.XactStart
		if hh.GID != "" {
			fields["prepared_gid"] = hh.GID
		}
		if hh.Node != "" {
			fields["worker"] = hh.Node
		}
	}
	if h.TopicOnly {
		s.logger.Error("Delivery is held back: committed messages of this topic wait for a transaction that published "+
			"to it earlier to end (only this topic and partition waits; end it, or bound such transactions with "+
			"idle_in_transaction_session_timeout)", ErrDeliveryHeldBack, fields)
		return
	}
	s.logger.Error("Delivery is held back: committed messages wait for an older transaction to end "+
		"(every topic of the cluster waits; end it, or bound such transactions with idle_in_transaction_session_timeout)",
		ErrDeliveryHeldBack, fields)
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

func (s *Subscriber) releaseSlot(key rowKey, slot *topicSlot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot.refs--
	if slot.refs == 0 {
		delete(s.slots, key)
	}
}
