package engine

// The in-flight window of a claim: which message goes out next, which wait
// for their key, and how far the acknowledged prefix reaches. A pure type:
// the delivery loop (ownership) feeds it reads, hand-outs, Acks and Nacks,
// and commits the prefix it reports. With MaxInFlight 1 it is a window of
// one whose messages are all keyless.

import (
	"cmp"
	"slices"
	"time"

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
	// windowEvicted: read, never handed out, its payload and metadata
	// dropped while an earlier message of its key waits (evictWaiting);
	// it keeps its place, and is read again by its position (restore)
	// before it goes out.
	windowEvicted
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
	// guessed: its attempt is 2 because a previous owner's hand-out mark
	// covers it, with nothing else counted (the failure policy): that
	// owner may have died before handing it out.
	guessed bool
	// firstOut is when it was first handed out (in a window of more than
	// one: what a full window logs); nacked, whether it was nacked since.
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
	// one: a window of one whose messages are all keyless (it reads
	// once it is empty).
	one bool
	// entries are the messages not acknowledged, in position order;
	// acked the positions acknowledged above entries[0], in order.
	entries []*windowEntry
	acked   []Position
	out     int // entries in windowOut
	ready   int // entries never sent, not evicted
	keyless int // entries with no key
	// evicted counts the entries in windowEvicted, evictedKeys them by
	// key; rereadDue: an entry of a key with evicted entries was
	// acknowledged (or a read again was cut short), so some may be free
	// to read again (rereadable).
	evicted     int
	evictedKeys map[string]int
	rereadDue   bool
	// holWait is the head-of-line wait accumulated since the last call of
	// takeWait.
	holWait time.Duration
	// spare are entries allocated together, and free entries given back
	// (reuse), for the next messages pushed.
	spare []windowEntry
	free  []*windowEntry
}

// entrySlab is how many window entries are allocated at once: one
// allocation per message would cost the delivery loop more than its
// bookkeeping.
const entrySlab = 32

func newInflightWindow(maxOut int) *inflightWindow {
	return &inflightWindow{maxOut: maxOut, one: maxOut == 1}
}

// push adds a message read after the last one, with its ordering key;
// attempt is the attempt of its first hand-out.
func (w *inflightWindow) push(m storedMessage, key string, attempt int) *windowEntry {
	var e *windowEntry
	if n := len(w.free); n > 0 {
		e, w.free = w.free[n-1], w.free[:n-1]
	} else {
		if len(w.spare) == 0 {
			w.spare = make([]windowEntry, entrySlab)
		}
		e, w.spare = &w.spare[0], w.spare[1:]
	}
	*e = windowEntry{msg: m, key: key, attempt: attempt}
	w.entries = append(w.entries, e)
	w.ready++
	if key == "" {
		w.keyless++
	}
	return e
}

// len is the number of messages in the window, acknowledged above the
// first unacknowledged one or not.
func (w *inflightWindow) len() int { return len(w.entries) + len(w.acked) }

// waiting is the number of messages of the window not acknowledged and
// held whole: read and not handed out yet, out, or nacked. Evicted
// messages, held as their positions, are not counted (see positions).
func (w *inflightWindow) waiting() int { return len(w.entries) - w.evicted }

// positions is the number of messages of the window held as their
// positions only: acknowledged above the first message not acknowledged,
// or evicted.
func (w *inflightWindow) positions() int { return len(w.acked) + w.evicted }

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

// wantsMore reports whether reading more may give a message that goes out
// before those read: none read waits to go out, or those that wait are
// held back by their keys and no keyless message, which holds back every
// message after it, is in the window. A window of one reads once it is
// empty: its message is acked (the prefetch reads ahead instead).
func (w *inflightWindow) wantsMore() bool {
	if w.one {
		return len(w.entries) == 0
	}
	return w.ready == 0 || w.keyless == 0 && !w.unsentFree()
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

// nextNow is next at the current time, which it reads only when it needs
// it: nothing may go out, or the first message goes out for the first
// time without having waited.
func (w *inflightWindow) nextNow() (e *windowEntry, wake time.Time) {
	if w.out >= w.maxOut {
		return nil, time.Time{}
	}
	if len(w.entries) > 0 {
		if h := w.entries[0]; h.state == windowReady && h.blockedSince.IsZero() {
			return h, time.Time{}
		}
	}
	return w.next(time.Now())
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
		if !w.one {
			e.firstOut = time.Now()
		}
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

// wait makes e, read and not handed out yet, wait until due: a message
// that failed under an earlier owner (the failure policy), which goes out
// as a nacked one does.
func (w *inflightWindow) wait(e *windowEntry, due time.Time) {
	e.state, e.due = windowNacked, due
}

// ack records e's Ack (or a message skipped as if acknowledged), and
// returns the end of the acknowledged prefix when it moved, with the
// number of messages it moved over. The message's payload is dropped: an
// acknowledged message above the prefix is kept as its position only.
func (w *inflightWindow) ack(e *windowEntry) (prefix Position, moved int) {
	w.settle(e)
	if !e.sent {
		e.sent = true
		if e.state != windowEvicted {
			w.ready--
		}
	}
	if e.state == windowEvicted {
		w.unevict(e)
	}
	e.state = windowAcked
	if w.evictedKeys[e.key] > 0 {
		w.rereadDue = true
	}
	// Dropped: the entry's slab outlives it.
	e.msg.payload, e.msg.metadata = nil, ""
	i := slices.Index(w.entries, e)
	if i < 0 {
		return Position{}, 0
	}
	if i == 0 {
		// The usual case: no entry moves.
		w.entries[0] = nil
		w.entries = w.entries[1:]
	} else {
		w.entries[i] = nil
		w.entries = slices.Delete(w.entries, i, i+1)
	}
	if e.key == "" {
		w.keyless--
	}
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

// evictWaiting evicts the messages never handed out whose key waits: an
// earlier message of the key is nacked (waiting for its next attempt) or
// evicted, up to the first message not acknowledged that has no key
// (nothing after it goes out before it is acknowledged, so nothing after
// it is evicted either). A message larger than maxSize stays (it is read
// again only within the byte budget: see ownership.readEvicted). It returns
// the evicted entries' sizes added up and their number.
func (w *inflightWindow) evictWaiting(maxSize int64) (bytes int64, n int) {
	var waits map[string]bool
	for _, c := range w.entries {
		if c.key == "" {
			break
		}
		switch {
		case c.state == windowReady && waits[c.key] && c.msg.size <= maxSize:
			bytes += c.msg.size
			w.evict(c)
			n++
		case c.state == windowNacked || c.state == windowEvicted:
			if waits == nil {
				waits = map[string]bool{}
			}
			waits[c.key] = true
		}
	}
	return bytes, n
}

// evicts reports whether e, just pushed and never handed out, follows an
// evicted message of its key (then it is evicted too, at once).
func (w *inflightWindow) evicts(e *windowEntry) bool {
	return e.key != "" && e.state == windowReady && w.evictedKeys[e.key] > 0
}

// evict drops the payload and metadata of e, read and never handed out:
// it keeps its place in the window (its key's order, the acknowledged
// prefix), as its position, key, size and attempt.
func (w *inflightWindow) evict(e *windowEntry) {
	e.state = windowEvicted
	e.msg.payload, e.msg.metadata = nil, ""
	w.ready--
	w.evicted++
	if w.evictedKeys == nil {
		w.evictedKeys = map[string]int{}
	}
	w.evictedKeys[e.key]++
}

// unevict ends e's eviction (read again, or acknowledged).
func (w *inflightWindow) unevict(e *windowEntry) {
	w.evicted--
	if w.evictedKeys[e.key]--; w.evictedKeys[e.key] <= 0 {
		delete(w.evictedKeys, e.key)
	}
}

// rereadable returns, in position order, up to limit evicted messages
// that may go out once read again: no earlier message of their key is
// out or nacked (an earlier one read again, or never handed out, goes
// first), up to the first message not acknowledged that has no key. It
// clears rereadDue, unless limit cut the list short.
func (w *inflightWindow) rereadable(limit int) []*windowEntry {
	w.rereadDue = false
	if w.evicted == 0 || limit <= 0 {
		return nil
	}
	var (
		out   []*windowEntry
		held  map[string]bool
		found int
	)
	for _, c := range w.entries {
		if c.key == "" || found == w.evicted {
			break
		}
		switch c.state {
		case windowEvicted:
			found++
			if held[c.key] {
				continue
			}
			if len(out) == limit {
				w.rereadDue = true
				return out
			}
			out = append(out, c)
		case windowOut, windowNacked:
			if held == nil {
				held = map[string]bool{}
			}
			held[c.key] = true
		}
	}
	return out
}

// restore gives e, evicted, back the message read again at its position.
func (w *inflightWindow) restore(e *windowEntry, m storedMessage) {
	w.unevict(e)
	// Its size stays the one the budget counted when it was read: it is
	// what the hand-out gives back.
	e.msg.payload, e.msg.metadata, e.msg.whole = m.payload, m.metadata, true
	e.state = windowReady
	w.ready++
}

// reuse takes back e, acknowledged (its payload dropped), for a later
// push, which overwrites it: the caller holds no reference to it any
// more, nor does anything else.
func (w *inflightWindow) reuse(e *windowEntry) {
	w.free = append(w.free, e)
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
