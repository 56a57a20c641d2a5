package engine

// Reading a claim's messages: within the byte budget (fetch), ahead of the
// delivery loop (prefetch), and paced while committed rows are held back
// by an older running transaction (pendingPoll).

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
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
// it: messages read and not handed out, or a reservation.
func (c *consumer) dropBuffered() {
	c.budget.giveBack(&c.lease, c.lease.n)
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
// bytes (all the prefetch holds) now in c.lease, which holds nothing else
// (no message read waits to go out), if it was read after after, the
// last message read; ok is false when there is none to use (fetch then
// reads).
func (c *consumer) takePrefetch(after Position) (rb readBatch, ok bool) {
	p := c.next
	if p == nil {
		return readBatch{}, false
	}
	<-p.done
	if !p.ok || p.after != after {
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
		workerHere: c.workerHere, bound: &c.bound})
}
