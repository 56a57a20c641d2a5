package pglease

// The in-flight window of a claim with MaxInFlight > 1: which message goes
// out next, which wait for their key, and how far the acknowledged prefix
// reaches. A pure type: the consumer (ownWindow) feeds it reads, hand-outs,
// Acks and Nacks, and commits the prefix it reports.

import "time"

// windowState is where a message of the window is.
type windowState uint8

const (
	windowReady windowState = iota // read, never handed out yet
	windowOut                      // handed out, its handler holds it
	windowNacked                   // nacked, out again once due
	windowAcked                    // acknowledged, above an earlier one that is not
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
	// blockedSince is when it was first found ready but held back by an
	// earlier message (of its key, or any, for a keyless one); zero when
	// it is not (head-of-line wait).
	blockedSince time.Time
	// delivered is the delivery handed out, set by the consumer.
	delivered any
}

// inflightWindow is the messages of a claim from the first one not
// acknowledged to the last one read. It hands out up to maxOut at a time,
// never two of one key at once, each key in position order, a keyless
// message only once every earlier message is acknowledged and no later
// one until it is; it keeps Acks above the first unacknowledged message
// in memory, and reports how far the contiguous acknowledged prefix
// moved. Not safe for concurrent use.
type inflightWindow struct {
	maxOut  int
	entries []*windowEntry // in position order
	out     int            // entries in windowOut
	ready   int            // entries never sent
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

// len is the number of messages in the window: the bound of what a
// takeover delivers again beyond what was acknowledged and not committed.
func (w *inflightWindow) len() int { return len(w.entries) }

// unsent is the number of messages read and never handed out.
func (w *inflightWindow) unsent() int { return w.ready }

// inFlight is the number of messages handed out and not acked or nacked.
func (w *inflightWindow) inFlight() int { return w.out }

// headOut reports whether the first message not acknowledged has been
// handed out (claim.headOut).
func (w *inflightWindow) headOut() bool {
	return len(w.entries) > 0 && w.entries[0].sent
}

// next returns the first message that may go out at now, or nil; then
// wake is the earliest time a nacked message becomes due (zero if none
// waits for its time): the caller looks again then, or after an Ack.
func (w *inflightWindow) next(now time.Time) (e *windowEntry, wake time.Time) {
	if w.out >= w.maxOut {
		return nil, time.Time{}
	}
	var busy map[string]bool // keys with an earlier message not acknowledged
	earlier := false         // an earlier message is not acknowledged
	for _, c := range w.entries {
		if c.state == windowAcked {
			continue
		}
		free := !busy[c.key]
		if c.key == "" {
			free = !earlier
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
		earlier = true
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
		w.ready--
	}
	e.state = windowOut
	w.out++
}

// nack records e's Nack: it goes out again at due, with the next attempt,
// and the later messages of its key wait for it.
func (w *inflightWindow) nack(e *windowEntry, due time.Time) {
	w.settle(e)
	e.state, e.due = windowNacked, due
	e.attempt++
}

// ack records e's Ack (or a message skipped as if acknowledged), and
// returns the end of the acknowledged prefix when it moved, with the
// number of messages it moved over.
func (w *inflightWindow) ack(e *windowEntry) (prefix Position, moved int) {
	w.settle(e)
	if !e.sent {
		e.sent = true
		w.ready--
	}
	e.state = windowAcked
	for moved < len(w.entries) && w.entries[moved].state == windowAcked {
		prefix = w.entries[moved].msg.pos
		moved++
	}
	if moved > 0 {
		clear(w.entries[:moved])
		w.entries = w.entries[moved:]
	}
	return prefix, moved
}

func (w *inflightWindow) settle(e *windowEntry) {
	if e.state == windowOut {
		w.out--
	}
}
