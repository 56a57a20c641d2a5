package pglease

// The consumer: the delivery state machine of one (topic, partition) of a
// subscription (claim, fetch, hand out, commit, release). It reaches its
// Subscriber only through consumerDeps, so that its decisions (attempt
// numbering, yielding, fencing, the byte budget, prefetch) are tested
// against a fake store without a database.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

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
	md, err := decodeMetadata([]byte(m.metadata))
	if err != nil {
		return nil, fmt.Errorf("decode the metadata of message %s: %w", m.uuid, err)
	}
	msg := message.NewMessage(m.uuid, m.payload)
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	return msg, nil
}

// abbreviateRaw cuts s to at most n bytes, on a character boundary, for
// a log line.
func abbreviateRaw(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

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
	// the messages of its batch not handed out yet. unsent is the size of
	// the message being delivered until it is first handed out.
	lease  budgetLease
	unsent int64
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
	// maxInFlight above 1 delivers through an in-flight window (ownWindow)
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

func newConsumerSettings(cfg SubscriberConfig) consumerSettings {
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
	reportStall()
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
				c.host.closeError(err)
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
	defer c.deliveriesCtx()()
	if c.settings.maxInFlight > 1 {
		return c.ownWindow(g, cl, hasNext)
	}
	retry := newBackoff(c.settings.retryFirst, maxRetryBackoff)
	// pending paces the re-polls while committed messages are not visible
	// yet.
	pending := newPendingPoll(c.settings.slowPoll)
	head := true // no message of this claim delivered yet
	// drained: the last read returned every message visible after the
	// position, none held back (pending), and they have all been handed
	// out: a message committed since comes with a notification (or the
	// idle poller's wake-up), so the consumer commits and waits for news
	// instead of reading again.
	drained := false
	// Messages of a batch not handed out when ownership ends are dropped:
	// their bytes go back to the budget.
	defer c.dropBuffered()
	defer c.dropPrefetch()
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
		if (first && !hasNext) || drained {
			drained = false
			if res := c.flush(g, cl); res != proceed {
				return res
			}
			if !c.waitIdle(g, cl) {
				return c.interrupted()
			}
			continue
		}
		sent := time.Now()
		rb, ok := c.takePrefetch(cl)
		var err error
		if !ok {
			rb, ok, err = c.fetch(g, cl, cl.acked, c.settings.batchSize, true)
		}
		if !ok {
			return c.interrupted()
		}
		if err != nil {
			if c.ctx.Err() != nil {
				return stopped
			}
			if errors.Is(cl.wentBack(err, "read messages of topic"), ErrDatabaseWentBack) {
				return lost // the session keeper logs it
			}
			c.outage.failed(sent, "Cannot read messages, retrying", err,
				watermill.LogFields{"topic": c.topic, "partition": c.partition})
			if !sleep(retry.delay(), c.ctx.Done(), g.lost) && c.ctx.Err() != nil {
				return stopped
			}
			continue
		}
		c.outage.ok()
		retry.reset()
		batch := rb.msgs
		if len(batch) > 0 || !rb.pending {
			// Messages to deliver, or none held back: the hold, if any,
			// is over, and a later one starts afresh. (A drained batch
			// is followed by a wait for news, not by an empty read.)
			pending.reset()
		}
		drained = rb.all && !rb.pending && len(batch) > 0
		if len(batch) == c.settings.batchSize {
			// A full batch: more are likely to follow. Read them while
			// this one is handed out.
			c.startPrefetch(batch[len(batch)-1].pos)
		}
		if len(batch) == 0 {
			if res := c.flush(g, cl); res != proceed {
				return res
			}
			if rb.pending {
				// Committed rows wait behind an older running transaction:
				// look again soon, backing off while it runs.
				wait, stalled := pending.held(time.Now())
				if stalled {
					c.stats.stalls.Add(1)
					c.host.reportStall()
				}
				if !c.waitWake(wait, g.lost) {
					return c.interrupted()
				}
				continue
			}
			if !c.waitIdle(g, cl) {
				return c.interrupted()
			}
			continue
		}
		for _, m := range batch {
			if c.yielding() || c.ctx.Err() != nil {
				return c.interrupted()
			}
			if cl.skips(m.pos) {
				// Acknowledged above an earlier message by a previous
				// owner: not handed out again.
				c.budget.giveBack(&c.lease, m.size)
				cl.acked, cl.headOut = m.pos, false
				if res := c.acknowledged(g, cl, 1); res != proceed {
					return res
				}
				continue
			}
			attempt := 1
			if head {
				// The first message after the claim's position: count
				// this claim's delivery of it in the row, across owners.
				n, res := c.countHead(g, cl)
				if res != proceed {
					return res
				}
				attempt, head = n, false
			}
			c.unsent = m.size
			if res := c.deliver(g, cl, m, attempt); res != proceed {
				return res
			}
			cl.acked, cl.headOut = m.pos, false
			if res := c.acknowledged(g, cl, 1); res != proceed {
				return res
			}
		}
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

// While committed rows are not visible yet, they are re-polled with a
// backoff from pendingFastFirst capped at pendingFastCap for pendingFastFor,
// then at PollInterval.
const (
	pendingFastFirst = 2 * time.Millisecond
	pendingFastCap   = 20 * time.Millisecond
	pendingFastFor   = time.Second
)

// pendingPoll paces a consumer's re-reads while committed messages after
// its position wait behind an older running transaction (a hold): every
// few milliseconds at first, as such a transaction usually ends a moment
// later, then, once the hold has lasted longer than pendingFastFor,
// backing off up to slow (PollInterval). A hold lasts from the first read
// that finds rows held back and nothing to deliver until reset, which the
// consumer calls on any read that returns messages or finds nothing held
// back, so that short holds each start afresh however long the claim
// lasts. Not safe for concurrent use.
type pendingPoll struct {
	slow  time.Duration
	since time.Time // when the hold began; zero between holds
	wait  backoff
}

func newPendingPoll(slow time.Duration) *pendingPoll {
	p := &pendingPoll{slow: slow}
	p.reset()
	return p
}

// reset ends the hold under way, if any.
func (p *pendingPoll) reset() {
	p.since = time.Time{}
	p.wait = *newBackoff(pendingFastFirst, pendingFastCap)
}

// held returns how long to wait before reading again after a read at now
// found rows held back and nothing to deliver, and whether this read made
// the hold a stall: it has lasted longer than pendingFastFor, and the
// waits now back off up to slow. That is reported once per hold, and never
// when slow is no longer than pendingFastCap.
func (p *pendingPoll) held(now time.Time) (wait time.Duration, stalled bool) {
	if p.since.IsZero() {
		p.since = now
	} else if now.Sub(p.since) > pendingFastFor && p.wait.max < p.slow {
		p.wait.max = p.slow
		stalled = true
	}
	return p.wait.delay(), stalled
}

// waitIdle waits for news of the topic after cl's position, with no timer
// of its own: a notification or the idle poller (one statement per
// Subscriber for all its idle topics) wakes it. It reports false when the
// subscription ended, the session was lost or the member asked for the
// topic.
func (c *consumer) waitIdle(g *sessionGen, cl *claim) bool {
	c.hub.setIdle(c, cl.acked)
	c.idle.Store(true)
	ok := c.waitWake(0, g.lost)
	c.idle.Store(false)
	c.hub.clearIdle(c)
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

// fetch reads the next messages after after (cl's position, or the last
// message of an in-flight window) within the byte budget
// (MaxBufferedBytes). It reserves up to an eighth of the budget, waiting
// while nothing is free (after committing what is due), and reads limit
// (BatchSize) messages, each sent with its payload only if it is at most a
// limit-th of the reservation, so that the payloads sent never exceed
// the reservation whatever the sizes (the metadata of the others is sent). The batch is the longest prefix of whole
// messages that fits the reservation. When the first message was not
// sent whole, the sizes read tell how many messages fit, and a second read
// gets exactly those, after reserving the first one's size when it alone
// is larger than the reservation (byteBudget.reserveExact). What the batch
// uses stays in c.lease until its messages are handed out; the rest is
// given back. ok is false when the subscription ended, the session was
// lost or the member asked for the row while it waited.
//
// Without wait (an in-flight window whose messages read and not handed out
// wait for their keys), the bytes c.lease holds stay held, and fetch never
// waits for the budget: when nothing is free, or the first message alone
// does not fit, it reads nothing and says so (readBatch.busy).
func (c *consumer) fetch(g *sessionGen, cl *claim, after Position, limit int, wait bool) (rb readBatch, ok bool, err error) {
	b := c.budget
	stop := budgetStop{c.ctx.Done(), g.lost, c.yield}
	if !wait {
		held := c.lease
		c.lease = budgetLease{}
		defer func() {
			c.lease.n += held.n
			c.lease.big = c.lease.big || held.big
		}()
		if !b.tryReserve(&c.lease, b.reserveWant()) {
			return readBatch{busy: true}, true, nil
		}
	} else {
		c.dropBuffered()
	}
	if wait && !b.tryReserve(&c.lease, b.reserveWant()) {
		// Nothing free: commit what is due before waiting.
		if c.flush(g, cl) != proceed {
			return readBatch{}, false, nil
		}
		if !b.reserve(&c.lease, b.reserveWant(), stop) {
			return readBatch{}, false, nil
		}
	}
	wholeUpTo := max(c.lease.n/int64(limit), 1)
	for {
		rows, pending, err := c.read(after, limit, wholeUpTo)
		if err != nil {
			c.dropBuffered()
			return readBatch{}, true, err
		}
		rb, fit := newReadBatch(rows, pending, limit, c.lease.n)
		if len(rb.msgs) > 0 || len(rows) == 0 {
			b.giveBack(&c.lease, c.lease.n-rb.bytes())
			return rb, true, nil
		}
		if fit == 0 {
			// The first message alone is larger than the reservation.
			c.dropBuffered()
			if !wait {
				return readBatch{busy: true}, true, nil
			}
			if !b.reserveExact(&c.lease, rows[0].size, stop) {
				return readBatch{}, false, nil
			}
			fit = 1
		}
		// The next read returns the same first messages (the partition is
		// this consumer's, and rows committed meanwhile come after them).
		limit, wholeUpTo = fit, c.lease.n
	}
}

// readBatch is what one read gives the consumer to hand out.
type readBatch struct {
	msgs []storedMessage
	// pending: committed messages after the position wait behind an
	// older running transaction.
	pending bool
	// all: msgs is every message the read saw after the position (fewer
	// than it asked for, all whole and within the budget).
	all bool
	// busy: nothing was read, for want of free bytes in the budget (a
	// read that does not wait for them).
	busy bool
}

// newReadBatch cuts the rows of a read of limit messages to the batch
// budget holds (cutBatch, whose fit it returns) and clears the payloads
// and metadata of the rows left out; their positions and sizes stay (the
// size of the first one is what fetch reserves when it alone does not
// fit).
func newReadBatch(rows []storedMessage, pending bool, limit int, budget int64) (readBatch, int) {
	batch, fit := cutBatch(rows, budget)
	for i := len(batch); i < len(rows); i++ {
		rows[i].payload, rows[i].metadata, rows[i].whole = nil, "", false
	}
	return readBatch{msgs: batch, pending: pending, all: len(rows) < limit && len(batch) == len(rows)}, fit
}

// bytes is what the batch counts against MaxBufferedBytes.
func (rb readBatch) bytes() int64 {
	var n int64
	for _, m := range rb.msgs {
		n += m.size
	}
	return n
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
	c.budget.giveBack(&c.lease, c.lease.n)
	c.unsent = 0
}

// prefetchMinConns is the smallest pool that prefetches: a prefetch holds
// a second connection of the Subscriber's pool beside the consumer's
// commits, and smaller pools keep theirs for heartbeats and claims.
const prefetchMinConns = 4

// prefetch is the read of the batch after the one being handed out. Its
// goroutine sets batch and ok, gives back what the batch does not use of
// the reservation in lease, and closes done; lease is the goroutine's
// until then, the consumer's after.
type prefetch struct {
	after  Position
	lease  budgetLease
	cancel context.CancelFunc
	done   chan struct{}
	batch  readBatch
	ok     bool // the read succeeded with a batch to hand out
}

// startPrefetch reads the batch after after, the last message of the
// current batch, in a goroutine of its own, if the byte budget has room
// for it now (it never waits for the budget) and the pool is large enough.
// Only a non-empty batch of whole messages that fit the reservation is
// kept; anything else (an error, no message, a first message larger than
// the reservation) is left to fetch, which reads again. Right after the
// read, the prefetch holds only its batch's bytes: the batch may wait long
// to be taken (the consumer keeps on a message its handler nacks), and
// the rest of the reservation is the other consumers' meanwhile.
func (c *consumer) startPrefetch(after Position) {
	if c.next != nil || !c.prefetch {
		return
	}
	b := c.budget
	p := &prefetch{after: after, done: make(chan struct{})}
	if !b.tryReserve(&p.lease, b.reserveWant()) {
		return
	}
	limit := c.settings.batchSize
	wholeUpTo := max(p.lease.n/int64(limit), 1)
	var ctx context.Context
	ctx, p.cancel = context.WithCancel(c.ctx)
	c.next = p
	c.goroutines.Add(1)
	go func() {
		defer c.goroutines.Done()
		defer close(p.done)
		// Nothing is kept after an error, an empty read (fetch reads
		// again, right before the consumer waits for news) or a first
		// message that does not fit the reservation (fetch reads it).
		if rows, pending, err := c.readCtx(ctx, after, limit, wholeUpTo); err == nil {
			if rb, _ := newReadBatch(rows, pending, limit, p.lease.n); len(rb.msgs) > 0 {
				p.batch, p.ok = rb, true
			}
		}
		b.giveBack(&p.lease, p.lease.n-p.batch.bytes())
	}()
}

// takePrefetch waits for the prefetched batch and returns it, with its
// bytes (all the prefetch holds) now in c.lease, if it was read after cl's
// position; ok is false when there is none to use (fetch then reads).
func (c *consumer) takePrefetch(cl *claim) (rb readBatch, ok bool) {
	p := c.next
	if p == nil {
		return readBatch{}, false
	}
	<-p.done
	if !p.ok || p.after != cl.acked {
		c.dropPrefetch()
		return readBatch{}, false
	}
	c.next = nil
	p.cancel()
	c.dropBuffered()
	c.lease = p.lease
	return p.batch, true
}

// dropPrefetch cancels a prefetch, waits for its goroutine and gives its
// bytes back to the budget.
func (c *consumer) dropPrefetch() {
	p := c.next
	if p == nil {
		return
	}
	c.next = nil
	p.cancel()
	<-p.done
	c.budget.giveBack(&p.lease, p.lease.n)
}

// read reads limit messages after after, each returned whole only if its
// size is at most wholeUpTo.
func (c *consumer) read(after Position, limit int, wholeUpTo int64) (rows []storedMessage, pending bool, err error) {
	return c.readCtx(c.ctx, after, limit, wholeUpTo)
}

// readCtx is read on ctx, which ends with the subscription or earlier.
// It touches nothing of c that changes, so a prefetch runs it beside the
// consumer's goroutine.
func (c *consumer) readCtx(ctx context.Context, after Position, limit int, wholeUpTo int64) (rows []storedMessage, pending bool, err error) {
	return c.store.read(ctx, readParams{row: c.row(), after: after, limit: limit, wholeUpTo: wholeUpTo, here: c.here,
		workerHere: c.workerHere})
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
		msg, mcancel, err := c.newDelivery(g, cl, m, attempt)
		if err != nil {
			c.skipUndecodable(m, err)
			c.budget.giveBack(&c.lease, c.unsent)
			c.unsent = 0
			return proceed
		}
		res, nacked := c.handOut(g, cl, msg)
		mcancel()
		if !nacked {
			return res
		}
		if !c.waitFlushing(g, cl, c.settings.nackResendDelay) {
			return c.interrupted()
		}
	}
}

// newDelivery builds the message of one delivery of m: a fresh one, with
// its attempt, whose context ends with the subscription or when cancel is
// called (after its Ack or Nack).
func (c *consumer) newDelivery(g *sessionGen, cl *claim, m storedMessage, attempt int) (*message.Message, context.CancelFunc, error) {
	msg, err := m.toMessage()
	if err != nil {
		return nil, nil, err
	}
	msg.Metadata.Set(DeliveryAttemptMetadata, strconv.Itoa(attempt))
	mctx, cancel := context.WithCancel(&deliveryCtx{Context: c.deliveries, d: delivery{
		topic: c.topic, partition: c.partition, pos: m.pos, group: cl.group,
		sessionID: cl.sessionID, epoch: cl.epoch, g: g, driver: c.driver, above: c.settings.maxInFlight > 1,
		workerHere: cl.workerHere}})
	msg.SetContext(mctx)
	return msg, cancel, nil
}

// skipUndecodable logs m, whose metadata cannot be decoded: a row this
// package did not write. Decoding it again gives the same error: it is
// skipped as if acknowledged (the row stays in the table, where the
// Inspector shows it raw).
func (c *consumer) skipUndecodable(m storedMessage, err error) {
	c.logger.Error("Cannot decode message, skipped", err, watermill.LogFields{"partition": c.partition,
		"position": strconv.FormatUint(m.pos.TransactionID, 10) + ":" + strconv.FormatInt(m.pos.Offset, 10),
		"uuid":     m.uuid, "metadata": abbreviateRaw(m.metadata, 200)})
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

// handOut sends msg and waits for its Ack or Nack. The OnDelivery hook
// sees the message before it is sent and its settlement on return.
func (c *consumer) handOut(g *sessionGen, cl *claim, msg *message.Message) (res outcome, nacked bool) {
	if settled := c.settings.onDelivery.begin(msg); settled != nil {
		defer func() { settled(settlement(msg, res)) }()
	}
	for sent := false; !sent; {
		if c.ctx.Err() != nil {
			return stopped, false
		}
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
			if res := c.flush(g, cl); res != proceed {
				return res, false
			}
		}
	}
	c.stats.delivered.Add(1)
	c.stats.inFlight.Add(1)
	defer c.stats.inFlight.Add(-1)
	cl.headOut = true // the message after cl.acked
	if c.unsent > 0 {
		// Handed out: the handler holds it now.
		c.budget.giveBack(&c.lease, c.unsent)
		c.unsent = 0
	}
	for {
		select {
		case <-msg.Acked():
			c.stats.acked.Add(1)
			return proceed, false
		case <-msg.Nacked():
			c.stats.nacked.Add(1)
			return proceed, true
		case <-c.ctx.Done():
			return c.drainOne(g, msg)
		case <-g.lost:
			return lost, false
		case <-c.flushC():
			if res := c.flush(g, cl); res != proceed {
				if res == stopped {
					// The subscription ended during the commit: wait
					// for the message out as any end does.
					return c.drainOne(g, msg)
				}
				return res, false
			}
		}
	}
}

// drainOne waits, once the subscription ended, for the Ack or Nack of
// msg, handed out, up to DrainTimeout (drainTimeout), so that a handler
// that finishes it has its Ack in the release. After a Nack, or once the
// bound passed, the message goes to the next owner (stopped).
func (c *consumer) drainOne(g *sessionGen, msg *message.Message) (res outcome, nacked bool) {
	if isAcked(msg) {
		return proceed, false
	}
	if d := c.settings.drainTimeout; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-msg.Acked():
			c.stats.acked.Add(1)
			return proceed, false
		case <-msg.Nacked():
			c.stats.nacked.Add(1)
			return stopped, false
		case <-g.lost:
			return lost, false
		case <-t.C:
		}
	}
	c.logUndrained(1)
	return stopped, false
}

// logUndrained logs that the consumer stopped waiting for n messages it
// handed out, which the next owner delivers again.
func (c *consumer) logUndrained(n int) {
	if n == 0 {
		return
	}
	c.logger.Info("Stopped waiting for messages handed out and not acked or nacked when the subscription ended "+
		"(DrainTimeout): they may be delivered again", watermill.LogFields{"messages": n,
		"drain_timeout": c.settings.drainTimeout.String(), "partition": c.partition})
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
			if c.flush(g, cl) != proceed {
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
		return proceed
	}
	// The end of the subscription may cut a commit off (stopped): the
	// release that follows writes the same position, fenced the same way.
	return c.fencedWrite(g, cl, "Cannot commit offset, retrying", func(ctx context.Context) error {
		return c.store.commit(ctx, cl)
	})
}
