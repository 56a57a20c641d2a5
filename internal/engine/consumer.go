package engine

// The consumer: the delivery state machine of one (topic, partition) of a
// subscription (claim, fetch, hand out, commit, release). It reaches its
// Subscriber only through consumerDeps, so that its decisions (attempt
// numbering, yielding, fencing, the byte budget, prefetch) are tested
// against a fake store without a database.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// consumer is one partition of a subscription: it registers its (topic,
// partition) row with the group member, waits for the member to grant it,
// delivers it while it owns it, and gives it back when the member asks,
// until the subscription ends.
type consumer struct {
	*consumerDeps
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
	// the messages read and not handed out yet.
	lease budgetLease
	// next is the batch after the one being handed out, read meanwhile
	// (prefetch); nil when none is being read.
	next *prefetch
	// here is the identity of the server the current grant's session
	// was made on (sessionGen.here), which every read carries. Set
	// before own, which waits for its prefetches before it returns.
	here string
	// workerHere is the identity of the Citus worker that held the
	// current grant's row when it was claimed (claim.workerHere), which
	// every read carries there; empty elsewhere.
	workerHere string
	// bound is the position bound (single node) of the last read, kept
	// while that read was full: every row below it is readable (a bound
	// stays safe for every later read, decision 0008), so the next read
	// of a backlog uses it instead of computing one; 0 after a read that
	// was not full, or on Citus: the next read computes one. Written by
	// prefetches too.
	bound atomic.Uint64
	// deliveries is the parent of the contexts of the messages handed
	// out under the current grant (deliveriesCtx).
	deliveries context.Context
}

// consumerDeps is what the consumers of a Subscriber need from it, built
// once by NewSubscriber and shared by all of them (a Subscriber may run
// 100,000), given explicitly so that a consumer runs against a fake store
// in tests.
type consumerDeps struct {
	settings consumerSettings
	budget   *byteBudget // MaxBufferedBytes
	store    consumerStore
	member   consumerMember
	hub      consumerHub
	host     consumerHost
	stats    *subscriberStats
	// outage logs the failures of the consumers' statements, once per
	// outage.
	outage *outageLog
	// driver runs a delivered message's AckInTx.
	driver *pgsql.Lazy
	// goroutines counts the consumers' goroutines and their prefetches,
	// for Close to wait for.
	goroutines *sync.WaitGroup
	// giveUp is closed when Close stops waiting for releases that fail.
	giveUp <-chan struct{}
	// drains counts the consumers that have not finished waiting for the
	// messages they handed out (nil in tests: none counted).
	drains *drainGate
	// prefetch tells whether the pool is large enough to read the next
	// batch while one is handed out (prefetchMinConns).
	prefetch bool
	// failurePolicy is Settings.Retry (nil: none), failures its
	// statements.
	failurePolicy *failurePolicy
	failures      failureStore
}

// consumerSettings are the SubscriberConfig fields a consumer goes by.
type consumerSettings struct {
	batchSize       int
	commitBatch     int
	commitInterval  time.Duration
	nackResendDelay time.Duration
	onDelivery      deliveryHook
	// retryFirst is the first wait before retrying a statement that
	// failed (PollInterval/20), doubling up to maxRetryBackoff; slowPoll
	// the slowest re-read while committed messages are held back
	// (PollInterval).
	retryFirst time.Duration
	slowPoll   time.Duration
	// maxInFlight above 1 delivers through an in-flight window (ownership)
	// of at most windowCap messages, ordered by orderingKey.
	maxInFlight int
	windowCap   int
	// windowAckedCap bounds the positions a window keeps acknowledged
	// above its first unacknowledged message (windowAckedCapOf).
	windowAckedCap int
	orderingKey    func(*message.Message) string
	// drainTimeout is how long a consumer whose subscription ended waits
	// for the messages it handed out to be acked or nacked before it
	// releases the row (DrainTimeout); 0: not at all.
	drainTimeout time.Duration
}

func newConsumerSettings(cfg Settings) consumerSettings {
	key := cfg.OrderingKey
	if key == nil {
		key = partitionKeyOf
	}
	return consumerSettings{
		maxInFlight:     max(cfg.MaxInFlight, 1),
		windowCap:       windowCapOf(cfg.BatchSize, cfg.MaxInFlight),
		windowAckedCap:  windowAckedCapOf(windowCapOf(cfg.BatchSize, cfg.MaxInFlight)),
		drainTimeout:    max(cfg.DrainTimeout, 0),
		orderingKey:     key,
		batchSize:       cfg.BatchSize,
		commitBatch:     cfg.CommitBatch,
		commitInterval:  cfg.CommitInterval,
		nackResendDelay: cfg.NackResendDelay,
		onDelivery:      cfg.OnDelivery,
		retryFirst:      cfg.PollInterval / 20,
		slowPoll:        cfg.PollInterval,
	}
}

// consumerStore runs the statements of a consumer (pgConsumerStore in
// production). Each statement has a timeout of its own; ctx ends it
// earlier. Not for implementing outside this package.
type consumerStore interface {
	// read reads up to p.limit messages of p.row after p.after (see
	// pgsql.Driver.SelectMessages); pending reports committed messages after
	// them held back by an older running transaction. An error wrapping
	// pgsql.ErrWentBack means the database is no longer where p.here
	// says.
	read(ctx context.Context, p readParams) (rows []storedMessage, pending bool, err error)
	// readAt reads the messages at p.positions again, whole (see
	// pgsql.Driver.SelectMessagesAt): those an in-flight window evicted.
	readAt(ctx context.Context, p readAtParams) ([]storedMessage, error)
	// countHead counts a delivery of the message after cl's committed
	// position and returns the count (offsetStore.countHead).
	countHead(ctx context.Context, cl *claim) (int, error)
	// commit writes cl's acknowledged position, fenced
	// (offsetStore.commit).
	commit(ctx context.Context, cl *claim) error
	// release writes cl's acknowledged position and frees the row,
	// fenced (offsetStore.release); its wait for its turn ends when Close
	// gives up.
	release(cl *claim) error
}

// readParams are the parameters of consumerStore.read: each message is
// returned whole (with its payload and metadata) only if its size is at
// most wholeUpTo; here is the identity of the server the claim's session
// was made on.
type readParams struct {
	row       rowKey
	after     Position
	limit     int
	wholeUpTo int64
	here      string
	// workerHere: see consumer.workerHere.
	workerHere string
	// bound: see consumer.bound (nil: a bound is computed every read).
	bound *atomic.Uint64
}

// deliveriesCtx returns the parent of the contexts of the messages a claim
// hands out: it ends when end is called (own does as it returns), not with
// the subscription, so that a handler finishing its message while the
// consumer drains (DrainTimeout) is not cut off.
func (c *consumer) deliveriesCtx() (end context.CancelFunc) {
	c.deliveries, end = context.WithCancel(context.WithoutCancel(c.ctx))
	return end
}

// consumerMember is what a consumer asks of the group member
// (*groupMember): to be granted its row, to stop waiting for it, and to
// forget that it owns it.
type consumerMember interface {
	register(c *consumer)
	unregister(c *consumer) (grant, bool)
	disown(c *consumer)
}

// consumerHub is what a consumer tells the wake hub (*wakeHub): that it
// waits for news after a position, that it no longer does, that it ended.
type consumerHub interface {
	setIdle(c *consumer, after Position)
	clearIdle(c *consumer)
	remove(c *consumer)
}

// consumerHost is the rest of the Subscriber a consumer deals with
// (*Subscriber): its slot of the row, the errors Close returns, and the
// report of a delivery stall.
type consumerHost interface {
	releaseSlot(key rowKey, slot *topicSlot)
	closeError(err error)
	reportStall(row rowKey)
}

// keyed reports whether messages are ordered by their ordering key in a
// window of MaxInFlight: MaxInFlight above 1, or a failure policy (whose
// waiting message holds back only its key); otherwise a window of one
// whose messages are all keyless.
func (c *consumer) keyed() bool { return c.settings.maxInFlight > 1 || c.failurePolicy != nil }

func (c *consumer) row() rowKey { return rowKey{topic: c.topic, partition: c.partition} }

func (c *consumer) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

type outcome int

const (
	proceed outcome = iota // the step went through: deliver on
	stopped                // the subscription ended: release the claim
	lost                   // ownership lost: wait for a new grant
	yielded                // the member asked for the topic: release it, wait
)

func (c *consumer) run() {
	defer c.goroutines.Done()
	defer c.host.releaseSlot(c.row(), c.slot)
	defer c.hub.remove(c)
	defer c.resetFlush()

	select {
	case c.slot.token <- struct{}{}:
	case <-c.ctx.Done():
		c.drains.leave()
		c.sub.consumerDone()
		return
	}
	// The slot is held until nothing of this subscription may own the row
	// any more: no other subscription of this Subscriber claims it meanwhile.
	defer func() { <-c.slot.token }()
	left := c.consume()
	c.drains.leave() // own has waited for the messages out (DrainTimeout)
	c.sub.cancel()   // a consumer ends only with its subscription
	c.finish(&left)
}

// drainGate counts the consumers that may still be waiting for the
// messages they handed out (DrainTimeout) before they release: Close
// starts the CloseTimeout of the releases once there are none. A nil gate
// counts nothing.
type drainGate struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n is 0
}

func newDrainGate() *drainGate {
	g := &drainGate{idle: make(chan struct{})}
	close(g.idle)
	return g
}

// enter counts a consumer that is starting.
func (g *drainGate) enter() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
}

// leave counts a consumer out: it waits for no message any more.
func (g *drainGate) leave() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n == 0 {
		close(g.idle)
	}
}

// wait returns a channel closed once no consumer is counted.
func (g *drainGate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.idle
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
	m := c.member
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
		c.here, c.workerHere = gr.g.here, gr.cl.workerHere
		c.bound.Store(0)
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
	retry := newBackoff(c.settings.retryFirst, maxRetryBackoff)
	for err != nil {
		if !sleep(retry.delay(), c.giveUp, left.g.lost) {
			if c.givingUp() {
				// Named here: an error of the release batch itself (the
				// wait for it cut short by Close, a connection that could
				// not be had) does not name the topic.
				c.host.closeError(fmt.Errorf("topic %q partition %d not released: %w", c.topic, c.partition, err))
			}
			return
		}
		err = c.releaseLeftover(left)
	}
}

// givingUp reports whether Close stopped waiting for releases.
func (c *consumer) givingUp() bool {
	select {
	case <-c.giveUp:
		return true
	default:
		return false
	}
}

// releaseLeftover makes one attempt at releasing what left holds; nil means
// nothing is left to do.
func (c *consumer) releaseLeftover(left *leftover) error {
	if left.cl == nil {
		return nil
	}
	cl := left.cl
	sent := time.Now()
	err := c.store.release(cl)
	if err == nil || errors.Is(err, ErrOwnershipLost) || errors.Is(err, ErrDatabaseWentBack) {
		c.outage.ok()
	}
	switch {
	case err == nil:
		c.logger.Debug("Topic released", watermill.LogFields{"epoch": cl.epoch,
			"acked_transaction_id": cl.acked.TransactionID, "acked_offset": cl.acked.Offset})
		return nil
	case errors.Is(err, ErrOwnershipLost):
		c.logger.Info("Topic was already taken over before release (fenced)", watermill.LogFields{
			"epoch": cl.epoch, "session_id": cl.sessionID.String()})
		return nil
	case errors.Is(err, ErrDatabaseWentBack):
		// The session was dropped (claim.wentBack): the row is free with
		// it, its committed position is the one to resume from.
		c.logger.Info("Topic not released: the database is not where the session was made; the session is dropped, "+
			"which frees the topic at its committed position", watermill.LogFields{
			"epoch": cl.epoch, "session_id": cl.sessionID.String()})
		return nil
	default:
		c.outage.failed(sent, "Cannot release the topic, retrying while the session lives", err,
			watermill.LogFields{"topic": c.topic, "partition": c.partition})
		return err
	}
}

// acknowledged counts n more Acks in cl.acked: it commits them after
// CommitBatch Acks, or arms the flush timer for CommitInterval.
func (c *consumer) acknowledged(g *sessionGen, cl *claim, n int) outcome {
	c.unflushed += n
	if c.unflushed >= c.settings.commitBatch {
		return c.flush(g, cl)
	}
	if !c.flushArmed {
		c.flushArmed = true
		if c.flushTimer == nil {
			c.flushTimer = time.NewTimer(c.settings.commitInterval)
		} else {
			c.flushTimer.Reset(c.settings.commitInterval)
		}
	}
	return proceed
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

// countHead counts one more delivery of the message after cl's position
// in the offsets row, and returns the count: how many claims have handed
// that message out without its position being committed. It retries while
// the database cannot be reached.
func (c *consumer) countHead(g *sessionGen, cl *claim) (int, outcome) {
	var n int
	res := c.fencedWrite(g, cl, "Cannot count the delivery, retrying", func(ctx context.Context) (err error) {
		n, err = c.store.countHead(ctx, cl)
		return err
	})
	return n, res
}

// fencedWrite runs write, a statement fenced by cl's session and epoch,
// retrying with backoff while the database cannot be reached (logging
// retryMsg). It reports proceed when it went through, lost when the row was
// taken over, and stopped or why a wait was interrupted otherwise. The end
// of the subscription cuts a write off; the store bounds each attempt.
func (c *consumer) fencedWrite(g *sessionGen, cl *claim, retryMsg string, write func(context.Context) error) outcome {
	retry := newBackoff(c.settings.retryFirst, maxRetryBackoff)
	for {
		// A generation found lost (expired, self-fenced, or dropped
		// because the database went back in time) writes nothing more:
		// its acknowledged positions may name transaction ids the
		// database hands out again.
		if g.isLost() {
			return lost
		}
		sent := time.Now()
		err := write(c.ctx)
		if err == nil {
			c.outage.ok()
			return proceed
		}
		if errors.Is(err, ErrDatabaseWentBack) {
			return lost // the session keeper logs it
		}
		if errors.Is(err, ErrOwnershipLost) {
			c.logger.Info("Topic was taken over by another session (fenced), delivery stopped",
				watermill.LogFields{"epoch": cl.epoch, "session_id": cl.sessionID.String(), "error": err.Error()})
			return lost
		}
		if c.ctx.Err() != nil {
			return stopped
		}
		c.outage.failed(sent, retryMsg, err, watermill.LogFields{"topic": c.topic, "partition": c.partition})
		if !sleep(retry.delay(), c.ctx.Done(), g.lost) {
			return c.interrupted()
		}
	}
}

// flush commits the acknowledged position, fenced by session and epoch,
// retrying while the database cannot be reached. Nothing to commit is a
// no-op.
func (c *consumer) flush(g *sessionGen, cl *claim) outcome {
	c.resetFlush()
	if !cl.dirty() {
		return proceed
	}
	// The end of the subscription may cut a commit off (stopped): the
	// release that follows writes the same position, fenced the same way.
	return c.fencedWrite(g, cl, "Cannot commit offset, retrying", func(ctx context.Context) error {
		return c.store.commit(ctx, cl)
	})
}
