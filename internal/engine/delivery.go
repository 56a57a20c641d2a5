package engine

// The delivery of one claim: one loop for every MaxInFlight. MaxInFlight 1
// is an in-flight window of one whose messages are all keyless, so that
// the next message goes out only once the one before is acked (a Nack
// sends the same message out again); above 1 the window hands out up to
// MaxInFlight messages at once, ordered by their OrderingKey
// (inflightWindow).

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// ownership is the delivery of one claim, from the grant until the
// subscription ends (stopped), ownership is lost (lost) or the member
// asks for the row back (yielded). It reads messages into an in-flight
// window (fill), builds the delivery of the next message the window
// allows (pick), and waits for whatever comes first (wait): the handler
// taking that message, an Ack or a Nack (settle), a timer, news of the
// partition, a commit due, the end. Each turn of the loop starts with the
// checks of what ends the delivery (check).
//
// The window reads more whenever no message read may go out for its key's
// sake (one key nacked or slow does not hold the others up) or nothing
// read waits to go out, while it holds fewer than windowCap messages not
// acknowledged and windowAckedCap acknowledged above the first one that
// is not; at either cap it reads nothing more until the first one is
// acknowledged (logged once per first message, once that was nacked or
// has been out for windowFullLogAfter). A window of one reads the next
// batch once the last message of the current one is acked, or takes the
// batch prefetched meanwhile (startPrefetch).
//
// The contiguous acknowledged prefix is the claim's position, committed
// after CommitBatch Acks or CommitInterval (acknowledged). Acks above the
// prefix are kept in memory and carried in the release (claim.above) for
// the next owner to skip; a lost claim drops them. Asked for the row back,
// it hands nothing more out and yields once every message out is acked or
// nacked; a subscription that ends stops handing out and waits up to
// DrainTimeout for them (drain); a claim that is lost ends it at once (the
// contexts of the messages out are cancelled).
type ownership struct {
	c  *consumer
	g  *sessionGen
	cl *claim
	// w, retry and pending are held by value: an idle claim keeps its
	// ownership, and one allocation per claim keeps the memory of a
	// Subscriber of many idle topics down.
	w inflightWindow
	// keyed: MaxInFlight above 1, messages are ordered by their
	// OrderingKey; in a window of one every message is keyless.
	keyed bool
	retry backoff
	// pending paces the re-reads while committed rows are held back;
	// made when rows first are (nil: none have been, or the hold ended).
	pending *pendingPoll
	after   Position // the last message read
	head    bool     // the first message, after cl.acked, not counted yet
	readDue bool
	// news: everything visible was read; the consumer waits for news of
	// the partition (a notification or the idle poller) before it reads
	// again. idle: it told the wake hub so (once the window is empty).
	news bool
	idle bool
	// reread fires when a read is due again (after an error, or while
	// committed rows are held back); due when a nacked message may go
	// out; fullCheck when the first message of a full window will have
	// waited windowFullLogAfter. Each is made on first use.
	reread, due, fullCheck *time.Timer
	// fullAt is the first message of the window when reading last stopped
	// at a cap for its sake (logged once for it).
	fullAt *windowEntry
	// offer is the next message to go out, its delivery built; nil when
	// none is.
	offer  *windowEntry
	offerD handed
	// direct is a message out whose Ack and Nack the loop waits for in
	// its own select (the only one in a window of one); every other
	// message out is in out, with a goroutine that reports its Ack or
	// Nack on events (never blocking: at most MaxInFlight are out) until
	// done is closed.
	direct   *windowEntry
	directD  handed
	out      map[*windowEntry]handed
	events   chan windowEvent
	done     chan struct{}
	watchers sync.WaitGroup
	// waiting are the messages of the row that failed and wait for their
	// next attempt, by position, as written in the row (the failure
	// policy; nil without one); waitDue the due times read with them, for
	// the messages not read yet. drop are the positions whose entries are
	// stale (acknowledged since), removed at the next write.
	waiting map[Position]*waitingState
	waitDue map[Position]time.Time
	drop    []Position
	// handedOut is the row's hand-out mark as this claim knows it (marked:
	// there is one): every message after it has gone out from no owner
	// of the row since its last reset. Before a message after it goes out,
	// the claim moves the mark to the last message read (markHandedOut).
	handedOut Position
	marked    bool
	// countAvg is the moving average of the time the counts of retries'
	// attempts took (countLead).
	countAvg time.Duration
}

// handed is the delivery of a message of the window: what its handler
// holds once it is handed out.
type handed struct {
	msg    *message.Message
	cancel context.CancelFunc
	// settled is the OnDelivery hook's, called once when the message is
	// acked or nacked or the delivery ends (nil: no hook).
	settled func(error)
}

// windowEvent is the Ack or Nack of a message handed out, reported by its
// watcher.
type windowEvent struct {
	e     *windowEntry
	acked bool
	at    time.Time // when the watcher saw it
}

// own delivers the claimed row's messages until the subscription ends
// (stopped), ownership is lost (lost) or the member asks for the row
// (yielded, once the messages out are acked or nacked). Without hasNext
// it waits for news before its first read.
func (c *consumer) own(g *sessionGen, cl *claim, hasNext bool) (res outcome) {
	defer c.deliveriesCtx()()
	if !hasNext {
		// Nothing to read until news: wait for it before the delivery
		// state is built, which a claim that stays idle then does not
		// hold (a Subscriber of many idle topics).
		if res, news := c.idleUntilNews(g, cl); !news {
			cl.above = nil
			c.dropPrefetch()
			c.dropBuffered()
			return res
		}
		hasNext = true
	}
	s := &c.settings
	o := &ownership{c: c, g: g, cl: cl, w: inflightWindow{maxOut: max(s.maxInFlight, 1), one: !c.keyed()}, keyed: c.keyed(),
		retry: *newBackoff(s.retryFirst, maxRetryBackoff),
		after: cl.acked, head: true, readDue: hasNext, news: !hasNext}
	if o.keyed {
		o.out = map[*windowEntry]handed{}
		o.events = make(chan windowEvent, s.maxInFlight)
		o.done = make(chan struct{})
	}
	defer func() { o.end(res) }()
	if c.failurePolicy != nil {
		if res := o.loadWaiting(); res != proceed {
			return res
		}
	}
	return o.run()
}

// idleUntilNews waits, for a claim with nothing to read, until news of
// the partition comes (news: true), as the loop does when it has read
// and acknowledged everything (check, wait), or until the subscription
// ends, the session is lost or the member asks for the row (res).
func (c *consumer) idleUntilNews(g *sessionGen, cl *claim) (res outcome, news bool) {
	if res := c.flush(g, cl); res != proceed {
		return res, false
	}
	c.idle.Store(true)
	c.hub.setIdle(c, cl.acked)
	defer func() {
		c.hub.clearIdle(c)
		c.idle.Store(false)
	}()
	select {
	case <-c.wake:
		return proceed, true
	case <-c.ctx.Done():
		return stopped, false
	case <-g.lost:
		c.logLost(cl)
		return lost, false
	case <-c.yield:
		return yielded, false
	}
}

func (o *ownership) run() outcome {
	for {
		if res, end := o.check(); end {
			return res
		}
		yielding := o.c.yielding()
		if res, again := o.fill(yielding); res != proceed {
			return res
		} else if again {
			continue
		}
		if res, again := o.pick(yielding); res != proceed {
			return res
		} else if again {
			continue
		}
		if res := o.wait(yielding); res != proceed {
			return res
		}
	}
}

// check reports whether the delivery ends: the subscription ended (after
// draining the messages out), the session was lost (its channel closed;
// pick checks the trust deadline), or the member asked
// for the row and no message is out. With everything read acknowledged
// and nothing more to read until news, it commits and tells the wake hub
// that the consumer waits for news.
func (o *ownership) check() (res outcome, end bool) {
	c := o.c
	if c.ctx.Err() != nil {
		o.dropOffer(stopped)
		return o.drain(), true
	}
	if o.lost() {
		return lost, true
	}
	if o.inFlight() == 0 && c.yielding() {
		return yielded, true
	}
	if o.news && !o.idle && o.w.len() == 0 {
		if res := c.flush(o.g, o.cl); res != proceed {
			return res, true
		}
		o.idle = true
		c.idle.Store(true)
		c.hub.setIdle(c, o.after)
	}
	return proceed, false
}

// lost reports whether the session generation was found lost (logged).
// The trust deadline is checked on the monotonic clock before each
// delivery is built (pick); every wait selects on the generation's lost
// channel.
func (o *ownership) lost() bool {
	select {
	case <-o.g.lost:
	default:
		return false
	}
	o.c.logLost(o.cl)
	return true
}

// logLost logs that cl's session was found lost.
func (c *consumer) logLost(cl *claim) {
	c.logger.Info("Session lost, topic delivery stopped", watermill.LogFields{
		"epoch": cl.epoch, "session_id": cl.sessionID.String()})
}

// inFlight is the number of messages handed out and not acked or nacked.
func (o *ownership) inFlight() int {
	n := len(o.out)
	if o.direct != nil {
		n++
	}
	return n
}

// fill reads more messages into the window when a read is due and the
// window wants them (see ownership). again: the loop starts over (the
// read was interrupted, or skipped messages ended it).
func (o *ownership) fill(yielding bool) (res outcome, again bool) {
	c, s, w := o.c, &o.c.settings, &o.w
	if w.rereadDue && !yielding {
		// Evicted messages whose key no longer waits go first: they lie
		// before anything a read brings.
		if res, again := o.readEvicted(); res != proceed || again {
			return res, again
		}
	}
	if !o.readDue || yielding || !w.wantsMore() {
		return proceed, false
	}
	// The caps bound a keyed window; a window of one reads only once it
	// is empty. A window full of messages held back by their waiting
	// keys evicts them and reads on.
	if o.keyed && (w.waiting() >= s.windowCap || w.positions() >= s.windowAckedCap) {
		if w.waiting() >= s.windowCap && w.positions() < s.windowAckedCap && o.evict() {
			return proceed, true
		}
		o.noteFull()
		return proceed, false
	}
	o.readDue = false
	sent := time.Now()
	rb, ok, err := o.read()
	switch {
	case !ok:
		return proceed, true // the checks say why
	case err != nil:
		if c.ctx.Err() != nil {
			return proceed, true
		}
		if errors.Is(o.cl.wentBack(err, "read messages of topic"), ErrDatabaseWentBack) {
			return lost, false // the session keeper logs it
		}
		c.outage.failed(sent, "Cannot read messages, retrying", err,
			watermill.LogFields{"topic": c.topic, "partition": c.partition})
		resetTimer(&o.reread, o.retry.delay())
		return proceed, false
	}
	c.outage.ok()
	o.retry.reset()
	if rb.busy {
		// The budget is taken: look again soon, or once a message goes
		// out (then a read waits for it).
		resetTimer(&o.reread, s.retryFirst)
		return proceed, false
	}
	if len(rb.msgs) > 0 || !rb.pending {
		// Messages to deliver, or none held back: the hold, if any, is
		// over, and a later one starts afresh.
		o.pending = nil
	}
	if !o.keyed && len(rb.msgs) == s.batchSize {
		// A full batch: more are likely to follow. Read them while this
		// one is handed out.
		c.startPrefetch(rb.msgs[len(rb.msgs)-1].pos)
	}
	for i := range rb.msgs {
		if res := o.push(rb.msgs[i]); res != proceed {
			return res, false
		}
	}
	switch {
	case len(rb.msgs) > 0 && !rb.all:
		o.readDue = true // more follow
	case rb.pending:
		// Committed rows wait behind an older running transaction: look
		// again soon, backing off while it runs.
		if len(rb.msgs) == 0 && w.len() == 0 {
			if res := c.flush(o.g, o.cl); res != proceed {
				return res, false
			}
		}
		if o.pending == nil {
			o.pending = newPendingPoll(s.slowPoll)
		}
		wait, stalled := o.pending.held(time.Now())
		if stalled {
			c.stats.stalls.Add(1)
			c.host.reportStall(c.row())
		}
		resetTimer(&o.reread, wait)
	default:
		// All read: a message committed since comes with a notification
		// or the idle poller's wake-up.
		o.news = true
	}
	return proceed, true // the checks see the window filled (or empty)
}

// read returns the batch after the last message read: the one prefetched,
// if any, or a new read of what the window has room for. With messages
// read and not handed out yet (they wait for their keys), it reads
// without waiting for the byte budget.
func (o *ownership) read() (rb readBatch, ok bool, err error) {
	c, s, w := o.c, &o.c.settings, &o.w
	if w.unsent() == 0 {
		if rb, ok := c.takePrefetch(o.after); ok {
			return rb, true, nil
		}
	}
	limit := s.batchSize
	if o.keyed {
		limit = min(limit, s.windowCap-w.waiting())
	}
	return c.fetch(o.g, o.cl, o.after, limit, w.unsent() == 0)
}

// push adds m, just read, to the window. A message acknowledged above an
// earlier one by a previous owner (claim.skips) is acknowledged at once.
func (o *ownership) push(m storedMessage) outcome {
	c := o.c
	o.after = m.pos
	if o.cl.skips(m.pos) {
		// Not handed out again.
		e := o.w.push(m, "", 1)
		c.budget.giveBack(&c.lease, m.size)
		return o.acked(e)
	}
	key := ""
	if o.keyed {
		if msg, err := m.toMessage(); err == nil {
			key = c.settings.orderingKey(msg)
		}
	}
	e := o.w.push(m, key, 1)
	if o.waiting != nil {
		o.resume(e)
	}
	if o.keyed && o.w.evicts(e) && m.size <= c.budget.reserveWant() {
		// Behind an evicted message of its key: evicted too, so that the
		// window's room goes to the keys that may go on.
		o.w.evict(e)
		c.budget.giveBack(&c.lease, m.size)
		c.stats.evicted.Add(1)
	}
	return proceed
}

// noteFull logs, once per first message, that the window reads nothing
// more for its sake, once that message was nacked or has been out for
// windowFullLogAfter.
func (o *ownership) noteFull() {
	h := o.w.head()
	if h == o.fullAt || !h.sent {
		return
	}
	if waited := time.Since(h.firstOut); h.nacked || waited >= windowFullLogAfter {
		o.fullAt = h
		o.c.logWindowFull(&o.w, h)
	} else {
		resetTimer(&o.fullCheck, windowFullLogAfter-waited)
	}
}

// pick builds the delivery of the next message the window lets out, if
// none is built yet; the first of the claim counts its delivery in the
// row (countHead). A message whose metadata cannot be decoded is skipped
// as if acknowledged (again: the loop looks for the next).
func (o *ownership) pick(yielding bool) (res outcome, again bool) {
	c := o.c
	if o.offer != nil || yielding {
		return proceed, false
	}
	e, wake := o.w.nextNow()
	if d := o.w.takeWait(); d > 0 {
		c.stats.holWaitNanos.Add(int64(d))
	}
	if e == nil {
		if !wake.IsZero() {
			resetTimer(&o.due, time.Until(wake))
		}
		return proceed, false
	}
	if o.g.isLost() {
		// Past the trust deadline: nothing more is handed out.
		o.c.logLost(o.cl)
		return lost, false
	}
	if c.failurePolicy != nil {
		c.failurePolicy.at(FailureStepPick, e)
	}
	if o.head {
		// The first message after the claim's position: count this
		// claim's delivery of it in the row, across owners.
		n, res := c.countHead(o.g, o.cl)
		if res != proceed {
			return res, false
		}
		if n > e.attempt {
			e.guessed = false
		}
		e.attempt, o.head = max(e.attempt, n), false
	}
	if c.failurePolicy != nil {
		if res, moved := o.beforeHandOut(e); res != proceed || moved {
			return res, moved
		}
		c.failurePolicy.at(FailureStepCounted, e)
	}
	msg, cancel, err := c.newDelivery(o.g, o.cl, e.msg, e.attempt)
	if err != nil {
		c.skipUndecodable(e.msg, err)
		if !e.sent {
			c.budget.giveBack(&c.lease, e.msg.size)
		}
		return o.acked(e), true
	}
	o.offer, o.offerD = e, handed{msg: msg, cancel: cancel, settled: c.settings.onDelivery.begin(msg)}
	return proceed, false
}

// wait waits for the first of: the handler takes the offer, a message out
// is acked or nacked, a timer fires, news of the partition, a commit due,
// the end of the subscription, the loss of the session, the member's
// request for the row.
func (o *ownership) wait(yielding bool) outcome {
	c := o.c
	// Only what may change what the loop does next is waited for: each
	// case of a select costs its time on every message. The member's
	// request for the row matters while an offer may go out or nothing is
	// out (with messages out it is seen at their Ack or Nack); news only
	// while no read is due (a poke waits in the channel meanwhile).
	var outC chan<- *message.Message
	var yieldC <-chan struct{}
	if !yielding && (o.offer != nil || o.inFlight() == 0) {
		yieldC = c.yield
	}
	if !yielding && o.offer != nil {
		outC = c.out
	}
	var wakeC <-chan struct{}
	if !o.readDue {
		wakeC = c.wake
	}
	var ackC, nackC <-chan struct{}
	if o.direct != nil {
		ackC, nackC = o.directD.msg.Acked(), o.directD.msg.Nacked()
	}
	select {
	case outC <- o.offerD.msg:
		o.handOut()
	case <-ackC:
		return o.settle(o.direct, true, time.Time{})
	case <-nackC:
		return o.settle(o.direct, false, time.Now())
	case ev := <-o.events:
		return o.settle(ev.e, ev.acked, ev.at)
	case <-timerC(o.reread):
		o.readDue = true
		o.w.rereadDue = o.w.rereadDue || o.w.evicted > 0
	case <-timerC(o.due):
	case <-timerC(o.fullCheck):
	case <-wakeC:
		if o.news {
			o.news = false
			if o.idle {
				o.idle = false
				c.idle.Store(false)
				c.hub.clearIdle(c)
			}
		}
		o.readDue = true
	case <-c.flushC():
		// Cut off by the end of the subscription (stopped): the next
		// check drains the messages out before the release.
		if res := c.flush(o.g, o.cl); res != proceed && res != stopped {
			return res
		}
	case <-c.ctx.Done():
	case <-o.g.lost:
	case <-yieldC:
	}
	return proceed
}

// handOut records that the handler took the offer.
func (o *ownership) handOut() {
	c := o.c
	e, d := o.offer, o.offerD
	o.offer, o.offerD = nil, handed{}
	if !e.sent {
		// Handed out: the handler holds it now.
		c.budget.giveBack(&c.lease, e.msg.size)
	}
	o.w.handOut(e)
	o.cl.headOut = o.w.headOut()
	c.stats.delivered.Add(1)
	c.stats.inFlight.Add(1)
	if o.direct == nil {
		o.direct, o.directD = e, d
		return
	}
	o.out[e] = d
	o.watchers.Add(1)
	go o.watch(e, d.msg)
}

// watch reports the Ack or Nack of msg, e's, on events, until done.
func (o *ownership) watch(e *windowEntry, msg *message.Message) {
	defer o.watchers.Done()
	var ev windowEvent
	select {
	case <-msg.Acked():
		ev = windowEvent{e: e, acked: true}
	case <-msg.Nacked():
		ev = windowEvent{e: e, at: time.Now()}
	case <-o.done:
		return
	}
	select {
	case o.events <- ev:
	case <-o.done:
	}
}

// settle records the Ack or Nack of e, out: a Nack (seen at nackedAt)
// sends it out again NackResendDelay later with the next attempt, an Ack
// moves (and commits) the prefix. A message settled already (drain found
// it acked before its watcher reported it) is left alone.
func (o *ownership) settle(e *windowEntry, acked bool, nackedAt time.Time) outcome {
	d, ok := o.unhand(e)
	if !ok {
		return proceed
	}
	if !acked {
		o.c.stats.nacked.Add(1)
		if o.c.failurePolicy != nil {
			return o.failed(e, d.msg, nackedAt)
		}
		o.w.nack(e, time.Now().Add(o.c.settings.nackResendDelay))
		return proceed
	}
	o.c.stats.acked.Add(1)
	if o.waiting != nil {
		o.acknowledgedWaiting(e)
	}
	return o.acked(e)
}

// unhand ends the delivery of e, out, acked or nacked, and returns it; it
// reports false when e is not out.
func (o *ownership) unhand(e *windowEntry) (handed, bool) {
	var d handed
	switch {
	case e == o.direct:
		d = o.directD
		o.direct, o.directD = nil, handed{}
	case o.out[e].msg != nil:
		d = o.out[e]
		delete(o.out, e)
	default:
		return handed{}, false
	}
	d.cancel()
	if d.settled != nil {
		d.settled(settlement(d.msg, proceed))
	}
	o.c.stats.inFlight.Add(-1)
	return d, true
}

// acked records e's Ack in the window and moves the claim's position over
// the acknowledged prefix, committing it after CommitBatch Acks or
// CommitInterval. A commit that the end of the subscription cuts off is
// not an end of its own: the next check drains the messages out, whose
// Acks the release carries too.
func (o *ownership) acked(e *windowEntry) outcome {
	prefix, moved := o.w.ack(e)
	if !o.keyed {
		// Nothing refers to it any more (a keyed window's watchers may
		// still report it).
		o.w.reuse(e)
	}
	o.cl.headOut = o.w.headOut()
	if moved == 0 {
		return proceed
	}
	o.cl.acked = prefix
	if res := o.c.acknowledged(o.g, o.cl, moved); res != stopped {
		return res
	}
	return proceed
}

// drain ends the delivery when the subscription ended: it hands nothing
// more out and waits up to DrainTimeout for the messages out to be acked
// or nacked, so that their Acks go into the position and the acknowledged
// positions above it that the release writes (nothing is committed
// meanwhile); a Nack leaves its message to the next owner. Once the bound
// passed, the messages still out go to the next owner too (logged).
func (o *ownership) drain() outcome {
	c := o.c
	settle := func(e *windowEntry, acked bool) {
		if _, ok := o.unhand(e); !ok {
			return
		}
		if !acked {
			c.stats.nacked.Add(1)
			o.w.nack(e, time.Now())
			return
		}
		c.stats.acked.Add(1)
		if prefix, moved := o.w.ack(e); moved > 0 {
			o.cl.acked = prefix
		}
		o.cl.headOut = o.w.headOut()
	}
	for reported := true; reported; {
		select {
		case ev := <-o.events:
			settle(ev.e, ev.acked)
		default:
			reported = false
		}
	}
	if o.direct != nil && isAcked(o.directD.msg) {
		settle(o.direct, true)
	}
	for e, d := range o.out {
		if isAcked(d.msg) {
			settle(e, true)
		}
	}
	if o.inFlight() > 0 && c.settings.drainTimeout > 0 {
		t := time.NewTimer(c.settings.drainTimeout)
		defer t.Stop()
		for o.inFlight() > 0 {
			var ackC, nackC <-chan struct{}
			if o.direct != nil {
				ackC, nackC = o.directD.msg.Acked(), o.directD.msg.Nacked()
			}
			select {
			case <-ackC:
				settle(o.direct, true)
			case <-nackC:
				settle(o.direct, false)
			case ev := <-o.events:
				settle(ev.e, ev.acked)
			case <-o.g.lost:
				return lost
			case <-t.C:
				c.logUndrained(o.inFlight())
				return stopped
			}
		}
	}
	c.logUndrained(o.inFlight())
	return stopped
}

// dropOffer ends the delivery of the offer, never handed out.
func (o *ownership) dropOffer(res outcome) {
	if o.offer == nil {
		return
	}
	o.offerD.cancel()
	if o.offerD.settled != nil {
		o.offerD.settled(settlement(o.offerD.msg, res))
	}
	o.offer, o.offerD = nil, handed{}
}

// end ends the delivery with res: the messages still out lose their
// contexts (their settled hooks learn why), the acknowledged positions
// above the prefix go to the claim for the release, the prefetch and the
// bytes held go back to the budget.
func (o *ownership) end(res outcome) {
	c := o.c
	o.cl.above = o.w.ackedAbove()
	if o.done != nil {
		close(o.done)
		o.watchers.Wait()
	}
	ends := func(d handed) {
		d.cancel()
		if d.settled != nil {
			d.settled(settlement(d.msg, res))
		}
	}
	if o.direct != nil {
		ends(o.directD)
	}
	for _, d := range o.out {
		ends(d)
	}
	c.stats.inFlight.Add(-int64(o.inFlight()))
	o.dropOffer(res)
	for _, t := range []*time.Timer{o.reread, o.due, o.fullCheck} {
		if t != nil {
			t.Stop()
		}
	}
	c.dropPrefetch()
	c.dropBuffered()
	c.hub.clearIdle(c)
	c.idle.Store(false)
}

// timerC is t's channel, nil for a timer not made yet.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// resetTimer makes *t fire after d, whatever it was set to, making it on
// first use.
func resetTimer(t **time.Timer, d time.Duration) {
	if *t == nil {
		*t = time.NewTimer(d)
		return
	}
	(*t).Reset(d) // since Go 1.23 a reset timer delivers no stale value
}

// newDelivery builds the message of one delivery of m: a fresh one, with
// its attempt, whose context ends with the claim's deliveries or when
// cancel is called (after its Ack or Nack).
func (c *consumer) newDelivery(g *sessionGen, cl *claim, m storedMessage, attempt int) (*message.Message, context.CancelFunc, error) {
	msg, err := m.toMessage()
	if err != nil {
		return nil, nil, err
	}
	msg.Metadata.Set(DeliveryAttemptMetadata, strconv.Itoa(attempt))
	mctx, cancel := context.WithCancel(&deliveryCtx{Context: c.deliveries, d: delivery{
		topic: c.topic, partition: c.partition, pos: m.pos, group: cl.group,
		sessionID: cl.sessionID, epoch: cl.epoch, g: g, driver: c.driver, above: c.keyed(),
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

// logWindowFull logs that the window reads nothing more until its first
// message, head, is acknowledged.
func (c *consumer) logWindowFull(w *inflightWindow, head *windowEntry) {
	fields := watermill.LogFields{"partition": c.partition, "waiting": w.waiting(),
		"acknowledged_above": w.len() - w.waiting(), "key": head.key,
		"position": strconv.FormatUint(head.msg.pos.TransactionID, 10) + ":" + strconv.FormatInt(head.msg.pos.Offset, 10),
		"attempt":  head.attempt}
	c.logger.Info("In-flight window full: no more messages of the partition are read until its first "+
		"unacknowledged message is acked (it is nacked again and again, or its handler is slow)", fields)
}

func isAcked(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	default:
		return false
	}
}
