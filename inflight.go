package pglease

// The in-flight window of a claim with MaxInFlight > 1: which message goes
// out next, which wait for their key, and how far the acknowledged prefix
// reaches. A pure type: the consumer (ownWindow) feeds it reads, hand-outs,
// Acks and Nacks, and commits the prefix it reports.

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// windowCapOf is the most messages not acknowledged yet that an in-flight
// window holds (read and waiting for their key, out, or nacked): a batch,
// or four times MaxInFlight, so that while every key in flight has more
// messages waiting, messages of other keys are read to go out beside them.
func windowCapOf(batchSize, maxInFlight int) int {
	return max(batchSize, 4*maxInFlight)
}

// windowFullLogAfter is how long the first message of a full window waits
// (or whether it was nacked) before that is logged: a key with many
// messages in a row fills the window for a moment as a matter of course.
const windowFullLogAfter = time.Second

// windowAckedCapOf is the most acknowledged positions an in-flight window
// keeps above its first message not acknowledged (a nacked or slow one):
// 64 windows. They are positions only (the messages are dropped at the
// Ack), carried in a release for the next owner to skip.
func windowAckedCapOf(windowCap int) int { return 64 * windowCap }

// partitionKeyOf is the default OrderingKey: the PartitionKeyMetadata
// metadata.
func partitionKeyOf(msg *message.Message) string {
	return msg.Metadata.Get(PartitionKeyMetadata)
}

// windowState is where a message of the window is.
type windowState uint8

const (
	windowReady  windowState = iota // read, never handed out yet
	windowOut                       // handed out, its handler holds it
	windowNacked                    // nacked, out again once due
	windowAcked                     // acknowledged (no longer in entries)
)

// windowEntry is one message of the window.
type windowEntry struct {
	msg storedMessage
	// key is the message's ordering key; keyless messages (key "") are
	// ordered against every other message.
	key   string
	state windowState
	// sent: handed out at least once (its bytes are no longer the
	// consumer's to hold).
	sent bool
	// attempt is the DeliveryAttemptMetadata of its next hand-out, from
	// the first; due is when a nacked one may go out again.
	attempt int
	due     time.Time
	// firstOut is when it was first handed out; nacked, whether it was
	// nacked since.
	firstOut time.Time
	nacked   bool
	// blockedSince is when it was first found ready but held back by an
	// earlier message (of its key, or any, for a keyless one); zero when
	// it is not (head-of-line wait).
	blockedSince time.Time
}

// inflightWindow is the messages of a claim from the first one not
// acknowledged to the last one read. It hands out up to maxOut at a time,
// never two of one key at once, each key in position order, a keyless
// message only once every earlier message is acknowledged and no later
// one until it is; it keeps the positions acknowledged above the first
// unacknowledged message, and reports how far the contiguous acknowledged
// prefix moved. Not safe for concurrent use.
type inflightWindow struct {
	maxOut int
	// entries are the messages not acknowledged, in position order;
	// acked the positions acknowledged above entries[0], in order.
	entries []*windowEntry
	acked   []Position
	out     int // entries in windowOut
	ready   int // entries never sent
	// holWait is the head-of-line wait accumulated since the last call of
	// takeWait.
	holWait time.Duration
}

func newInflightWindow(maxOut int) *inflightWindow {
	return &inflightWindow{maxOut: maxOut}
}

// push adds a message read after the last one, with its ordering key;
// attempt is the attempt of its first hand-out.
func (w *inflightWindow) push(m storedMessage, key string, attempt int) *windowEntry {
	e := &windowEntry{msg: m, key: key, attempt: attempt}
	w.entries = append(w.entries, e)
	w.ready++
	return e
}

// len is the number of messages in the window, acknowledged above the
// first unacknowledged one or not.
func (w *inflightWindow) len() int { return len(w.entries) + len(w.acked) }

// waiting is the number of messages of the window not acknowledged: read
// and not handed out yet, out, or nacked.
func (w *inflightWindow) waiting() int { return len(w.entries) }

// ackedAbove returns the positions acknowledged above the first message
// not acknowledged (what a release carries for the next owner to skip).
func (w *inflightWindow) ackedAbove() []Position { return slices.Clone(w.acked) }

// unsent is the number of messages read and never handed out.
func (w *inflightWindow) unsent() int { return w.ready }

// inFlight is the number of messages handed out and not acked or nacked.
func (w *inflightWindow) inFlight() int { return w.out }

// headOut reports whether the first message not acknowledged has been
// handed out (claim.headOut).
func (w *inflightWindow) headOut() bool {
	return len(w.entries) > 0 && w.entries[0].sent
}

// head returns the first message not acknowledged, or nil.
func (w *inflightWindow) head() *windowEntry {
	if len(w.entries) == 0 {
		return nil
	}
	return w.entries[0]
}

// unsentFree reports whether a message never handed out may go out as far
// as order goes (no earlier message of its key, or any for a keyless one,
// waits): while none may, reading more gives the free keys work.
func (w *inflightWindow) unsentFree() bool {
	if w.ready == 0 {
		return false
	}
	var busy map[string]bool
	for i, c := range w.entries {
		if c.state == windowReady && (c.key == "" && i == 0 || c.key != "" && !busy[c.key]) {
			return true
		}
		if c.key == "" {
			return false
		}
		if busy == nil {
			busy = map[string]bool{}
		}
		busy[c.key] = true
	}
	return false
}

// next returns the first message that may go out at now, or nil; then
// wake is the earliest time a nacked message becomes due (zero if none
// waits for its time): the caller looks again then, or after an Ack.
func (w *inflightWindow) next(now time.Time) (e *windowEntry, wake time.Time) {
	if w.out >= w.maxOut {
		return nil, time.Time{}
	}
	var busy map[string]bool // keys with an earlier message not acknowledged
	for i, c := range w.entries {
		free := !busy[c.key]
		if c.key == "" {
			free = i == 0 // every earlier message is acknowledged
		}
		switch {
		case free && c.state == windowReady:
			w.unblock(c, now)
			return c, time.Time{}
		case free && c.state == windowNacked && !now.Before(c.due):
			return c, time.Time{}
		case free && c.state == windowNacked && (wake.IsZero() || c.due.Before(wake)):
			wake = c.due
		case !free && c.state == windowReady && c.blockedSince.IsZero():
			c.blockedSince = now
		}
		if c.key == "" {
			// Nothing after an unacknowledged keyless message goes out.
			return nil, wake
		}
		if busy == nil {
			busy = map[string]bool{}
		}
		busy[c.key] = true
	}
	return nil, wake
}

// unblock ends e's head-of-line wait, if any.
func (w *inflightWindow) unblock(e *windowEntry, now time.Time) {
	if !e.blockedSince.IsZero() {
		w.holWait += now.Sub(e.blockedSince)
		e.blockedSince = time.Time{}
	}
}

// takeWait returns the head-of-line wait accumulated since its last call.
func (w *inflightWindow) takeWait() time.Duration {
	d := w.holWait
	w.holWait = 0
	return d
}

// handOut records that e, returned by next, went out.
func (w *inflightWindow) handOut(e *windowEntry) {
	if !e.sent {
		e.sent = true
		e.firstOut = time.Now()
		w.ready--
	}
	e.state = windowOut
	w.out++
}

// nack records e's Nack: it goes out again at due, with the next attempt,
// and the later messages of its key wait for it.
func (w *inflightWindow) nack(e *windowEntry, due time.Time) {
	w.settle(e)
	e.state, e.due, e.nacked = windowNacked, due, true
	e.attempt++
}

// ack records e's Ack (or a message skipped as if acknowledged), and
// returns the end of the acknowledged prefix when it moved, with the
// number of messages it moved over. The message's payload is dropped: an
// acknowledged message above the prefix is kept as its position only.
func (w *inflightWindow) ack(e *windowEntry) (prefix Position, moved int) {
	w.settle(e)
	if !e.sent {
		e.sent = true
		w.ready--
	}
	e.state = windowAcked
	i := slices.Index(w.entries, e)
	if i < 0 {
		return Position{}, 0
	}
	w.entries[i] = nil
	w.entries = slices.Delete(w.entries, i, i+1)
	if i > 0 {
		// Above an earlier message not acknowledged: kept as a position.
		j, _ := slices.BinarySearchFunc(w.acked, e.msg.pos, comparePositions)
		w.acked = slices.Insert(w.acked, j, e.msg.pos)
		return Position{}, 0
	}
	prefix, moved = e.msg.pos, 1
	n := len(w.acked)
	if len(w.entries) > 0 {
		n, _ = slices.BinarySearchFunc(w.acked, w.entries[0].msg.pos, comparePositions)
	}
	if n > 0 {
		prefix, moved = w.acked[n-1], moved+n
		w.acked = slices.Delete(w.acked, 0, n)
	}
	return prefix, moved
}

func (w *inflightWindow) settle(e *windowEntry) {
	if e.state == windowOut {
		w.out--
	}
}

// comparePositions orders positions as the delivery order does.
func comparePositions(a, b Position) int {
	if c := cmp.Compare(a.TransactionID, b.TransactionID); c != 0 {
		return c
	}
	return cmp.Compare(a.Offset, b.Offset)
}

// windowEvent is the Ack or Nack of a message handed out by ownWindow.
type windowEvent struct {
	e     *windowEntry
	acked bool
}

// windowDelivery is a message of the window that its handler holds.
type windowDelivery struct {
	msg    *message.Message
	cancel context.CancelFunc
	// settled is the OnDelivery hook's, called once when the message is
	// acked or nacked or the window ends (nil: no hook).
	settled func(error)
}

// ownWindow is own for MaxInFlight above 1: it reads messages into an
// in-flight window and hands out what the window allows
// (inflightWindow.next) while it waits for Acks and Nacks, and commits the
// contiguous acknowledged prefix as own commits each Ack. It reads more
// whenever no message read may go out for its key's sake (one key nacked
// or slow does not hold the others up), while the window holds fewer than
// windowCap messages not acknowledged and windowAckedCap acknowledged
// above the first one that is not; at either cap it reads nothing more
// until the first one is acknowledged (logged once per first message,
// once that was nacked or has been out for windowFullLogAfter).
// Acks above the prefix are kept in memory and carried in the release
// (claim.above) for the next owner to skip; a lost claim drops them. Asked
// for the row back, it hands nothing more out and yields once every
// message out is acked or nacked; a subscription that ends stops handing
// out and waits up to drainTimeout for them (windowDrain); a claim that
// is lost ends it at once (the contexts of the messages out are
// cancelled).
func (c *consumer) ownWindow(g *sessionGen, cl *claim, hasNext bool) (res outcome) {
	s := c.settings
	w := newInflightWindow(s.maxInFlight)
	retry := newBackoff(s.retryFirst, maxRetryBackoff)
	pending := newPendingPoll(s.slowPoll)
	// Each message out has a goroutine that reports its Ack or Nack
	// (never blocking: at most maxInFlight are out).
	events := make(chan windowEvent, s.maxInFlight)
	done := make(chan struct{})
	var watchers sync.WaitGroup
	out := map[*windowEntry]windowDelivery{}
	var offer *windowEntry // the next message to go out, built as offerMsg
	var offerMsg *message.Message
	var offerCancel context.CancelFunc
	var offerSettled func(error) // the hook's, for offerMsg
	defer func() {
		cl.above = w.ackedAbove()
		close(done)
		watchers.Wait()
		for _, d := range out {
			d.cancel()
			if d.settled != nil {
				d.settled(settlement(d.msg, res))
			}
		}
		if offerCancel != nil {
			offerCancel()
		}
		if offerSettled != nil {
			offerSettled(settlement(offerMsg, res))
		}
		c.stats.inFlight.Add(-int64(len(out)))
		c.budget.giveBack(&c.lease, c.lease.n)
		c.hub.clearIdle(c)
		c.idle.Store(false)
	}()
	// reread fires when a read is due again (after an error, or while
	// committed rows are held back); due when a nacked message may go out.
	reread, due := newStoppedTimer(), newStoppedTimer()
	defer reread.Stop()
	defer due.Stop()
	after := cl.acked // the last message read
	head := true      // the first message, after cl.acked, not counted yet
	readDue := hasNext
	// news: the consumer waits for news of the partition (the wake hub's
	// idle list) before it reads again.
	news := !hasNext
	if news {
		c.hub.setIdle(c, after)
	}
	// fullAt is the first message of the window when reading last stopped
	// at a cap for its sake (logged once for it); fullCheck fires when the
	// first message will have waited windowFullLogAfter.
	var fullAt *windowEntry
	fullCheck := newStoppedTimer()
	defer fullCheck.Stop()
	// settle records the Ack or Nack of ev; draining, it commits nothing
	// (the release writes the position).
	settle := func(ev windowEvent, draining bool) outcome {
		d, ok := out[ev.e]
		if !ok {
			// Settled already: windowDrain found it acked before its
			// watcher's report came.
			return proceed
		}
		delete(out, ev.e)
		d.cancel()
		if d.settled != nil {
			if ev.acked {
				d.settled(nil)
			} else {
				d.settled(ErrNacked)
			}
		}
		c.stats.inFlight.Add(-1)
		if !ev.acked {
			c.stats.nacked.Add(1)
			w.nack(ev.e, time.Now().Add(s.nackResendDelay))
			return proceed
		}
		c.stats.acked.Add(1)
		if draining {
			if prefix, moved := w.ack(ev.e); moved > 0 {
				cl.acked = prefix
			}
			cl.headOut = w.headOut()
			return proceed
		}
		return c.windowAcked(g, cl, w, ev.e)
	}
	for {
		if c.ctx.Err() != nil {
			if offerCancel != nil {
				// Never handed out: its delivery ends here.
				offerCancel()
				if offerSettled != nil {
					offerSettled(settlement(offerMsg, stopped))
				}
			}
			return c.windowDrain(g, events, out, settle)
		}
		if g.isLost() {
			c.logger.Info("Session lost, topic delivery stopped", watermill.LogFields{
				"epoch": cl.epoch, "session_id": cl.sessionID.String()})
			return lost
		}
		yielding := c.yielding()
		if yielding && len(out) == 0 {
			return yielded
		}
		if news && w.len() == 0 {
			// Everything read is acknowledged: commit before waiting.
			c.idle.Store(true)
			if res := c.flush(g, cl); res != proceed {
				return res
			}
		}
		full := w.waiting() >= s.windowCap || w.len()-w.waiting() >= s.windowAckedCap
		if readDue && !yielding && !w.unsentFree() && full {
			if h := w.head(); h != fullAt && h.sent {
				if waited := time.Since(h.firstOut); h.nacked || waited >= windowFullLogAfter {
					fullAt = h
					c.logWindowFull(w, h)
				} else {
					resetTimer(fullCheck, windowFullLogAfter-waited)
				}
			}
		}
		if readDue && !yielding && !w.unsentFree() && !full {
			readDue = false
			sent := time.Now()
			// Messages read wait for their keys: read more without
			// waiting for the budget, keeping theirs.
			rb, ok, err := c.fetch(g, cl, after, min(s.batchSize, s.windowCap-w.waiting()), w.unsent() == 0)
			switch {
			case !ok:
				continue // the loop's checks say why
			case err != nil:
				if c.ctx.Err() != nil {
					continue
				}
				if errors.Is(cl.wentBack(err, "read messages of topic"), ErrDatabaseWentBack) {
					return lost // the session keeper logs it
				}
				c.outage.failed(sent, "Cannot read messages, retrying", err,
					watermill.LogFields{"topic": c.topic, "partition": c.partition})
				resetTimer(reread, retry.delay())
				continue
			}
			c.outage.ok()
			retry.reset()
			if rb.busy {
				// The budget is taken: look again soon, or once a
				// message goes out (then a read waits for it).
				resetTimer(reread, s.retryFirst)
				continue
			}
			if len(rb.msgs) > 0 || !rb.pending {
				pending.reset()
			}
			for _, m := range rb.msgs {
				after = m.pos
				if cl.skips(m.pos) {
					// Acknowledged above an earlier message by a previous
					// owner: not handed out again.
					e := w.push(m, "", 1)
					c.budget.giveBack(&c.lease, m.size)
					if res := c.windowAcked(g, cl, w, e); res != proceed {
						return res
					}
					continue
				}
				key := ""
				if msg, err := m.toMessage(); err == nil {
					key = s.orderingKey(msg)
				}
				w.push(m, key, 1)
			}
			switch {
			case len(rb.msgs) > 0 && !rb.all:
				readDue = true // more follow
			case rb.pending:
				wait, stalled := pending.held(time.Now())
				if stalled {
					c.stats.stalls.Add(1)
					c.host.reportStall()
				}
				resetTimer(reread, wait)
			default:
				// All read: a message committed since comes with a
				// notification or the idle poller's wake-up.
				news = true
				c.hub.setIdle(c, after)
			}
		}
		if offer == nil && !yielding {
			e, wake := w.next(time.Now())
			c.stats.holWaitNanos.Add(int64(w.takeWait()))
			switch {
			case e != nil:
				if head {
					// The first message after the claim's position: count
					// this claim's delivery of it in the row, across owners.
					n, res := c.countHead(g, cl)
					if res != proceed {
						return res
					}
					e.attempt, head = n, false
				}
				msg, cancel, err := c.newDelivery(g, cl, e.msg, e.attempt)
				if err != nil {
					c.skipUndecodable(e.msg, err)
					if !e.sent {
						c.budget.giveBack(&c.lease, e.msg.size)
					}
					if res := c.windowAcked(g, cl, w, e); res != proceed {
						return res
					}
					continue
				}
				offer, offerMsg, offerCancel = e, msg, cancel
				offerSettled = s.onDelivery.begin(msg)
			case !wake.IsZero():
				resetTimer(due, time.Until(wake))
			}
		}
		var outC chan<- *message.Message
		if offer != nil && !yielding {
			outC = c.out
		}
		var yieldC <-chan struct{}
		if !yielding {
			yieldC = c.yield
		}
		select {
		case outC <- offerMsg:
			e, d := offer, windowDelivery{msg: offerMsg, cancel: offerCancel, settled: offerSettled}
			offer, offerMsg, offerCancel, offerSettled = nil, nil, nil, nil
			if !e.sent {
				// Handed out: the handler holds it now.
				c.budget.giveBack(&c.lease, e.msg.size)
			}
			w.handOut(e)
			out[e] = d
			cl.headOut = w.headOut()
			c.stats.delivered.Add(1)
			c.stats.inFlight.Add(1)
			watchers.Add(1)
			go func() {
				defer watchers.Done()
				var ev windowEvent
				select {
				case <-d.msg.Acked():
					ev = windowEvent{e: e, acked: true}
				case <-d.msg.Nacked():
					ev = windowEvent{e: e}
				case <-done:
					return
				}
				select {
				case events <- ev:
				case <-done:
				}
			}()
		case ev := <-events:
			if res := settle(ev, false); res != proceed {
				return res
			}
		case <-reread.C:
			readDue = true
		case <-due.C:
		case <-fullCheck.C:
		case <-c.wake:
			if news {
				news = false
				c.idle.Store(false)
				c.hub.clearIdle(c)
			}
			readDue = true
		case <-c.flushC():
			// Cut off by the end of the subscription (stopped): as in
			// windowAcked, the next check drains before the release.
			if res := c.flush(g, cl); res != proceed && res != stopped {
				return res
			}
		case <-c.ctx.Done():
		case <-g.lost:
		case <-yieldC:
		}
	}
}

// newStoppedTimer returns a timer that has not started.
func newStoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// resetTimer makes t fire after d, whatever it was set to.
func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// windowAcked records e's Ack in w and moves cl's acknowledged position
// over the prefix, committing it as own commits Acks. A commit that the
// end of the subscription cuts off is not an end of its own: ownWindow
// goes on to drain the messages out (windowDrain) before the release.
func (c *consumer) windowAcked(g *sessionGen, cl *claim, w *inflightWindow, e *windowEntry) outcome {
	prefix, moved := w.ack(e)
	cl.headOut = w.headOut()
	if moved == 0 {
		return proceed
	}
	cl.acked = prefix
	if res := c.acknowledged(g, cl, moved); res != stopped {
		return res
	}
	// The end of the subscription cut the commit off: the release writes
	// the position, after ownWindow's next check has waited for the
	// messages still out (windowDrain), whose Acks it carries too.
	return proceed
}

// windowDrain ends ownWindow when the subscription ended: it hands
// nothing more out and waits up to drainTimeout for the messages out to be
// acked or nacked, so that their Acks go into the position and the
// acknowledged positions above it that the release writes; a Nack leaves
// its message to the next owner. Once the bound passed, the messages still
// out go to the next owner too (logged).
func (c *consumer) windowDrain(g *sessionGen, events chan windowEvent, out map[*windowEntry]windowDelivery,
	settle func(windowEvent, bool) outcome) outcome {
	for reported := true; reported; {
		select {
		case ev := <-events:
			settle(ev, true)
		default:
			reported = false
		}
	}
	for e, d := range out {
		if isAcked(d.msg) {
			settle(windowEvent{e: e, acked: true}, true)
		}
	}
	if len(out) > 0 && c.settings.drainTimeout > 0 {
		t := time.NewTimer(c.settings.drainTimeout)
		defer t.Stop()
		for len(out) > 0 {
			select {
			case ev := <-events:
				settle(ev, true)
			case <-g.lost:
				return lost
			case <-t.C:
				c.logUndrained(len(out))
				return stopped
			}
		}
	}
	c.logUndrained(len(out))
	return stopped
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
