package engine

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// These tests need no database.

// windowScript drives an inflightWindow through steps written as text, one
// per line:
//
//	push a1 a2 b1 -1   messages with keys a, a, b and a keyless one (offsets 1..4)
//	out 1 3            next hands out exactly these offsets, in order, then nothing
//	ack 3              an Ack; "=> 2:5" checks that the prefix moved over 2 messages to offset 5, "=> -" that it did not move
//	nack 1             a Nack, due at once
type windowScript struct {
	t       *testing.T
	w       *inflightWindow
	entries map[int64]*windowEntry
	offset  int64
	now     time.Time
}

func runWindowScript(t *testing.T, maxOut int, script string) *inflightWindow {
	t.Helper()
	s := &windowScript{t: t, w: newInflightWindow(maxOut), entries: map[int64]*windowEntry{}, now: time.Unix(1000, 0)}
	for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
		f := strings.Fields(line)
		switch f[0] {
		case "push":
			for _, k := range f[1:] {
				s.offset++
				key := strings.TrimRight(k, "0123456789")
				if k == "-" || strings.HasPrefix(k, "-") {
					key = ""
				}
				s.entries[s.offset] = s.w.push(testMessage(s.offset, 1), key, 1)
			}
		case "out":
			var want, got []string
			want = f[1:]
			for {
				e, _ := s.w.next(s.now)
				if e == nil {
					break
				}
				s.w.handOut(e)
				got = append(got, fmt.Sprint(e.msg.pos.Offset))
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("%q: handed out %v, want %v", line, got, want)
			}
		case "ack", "nack":
			off, err := strconv.ParseInt(f[1], 10, 64)
			e := s.entries[off]
			if err != nil || e == nil {
				t.Fatalf("%q: no message %s", line, f[1])
			}
			if f[0] == "nack" {
				s.w.nack(e, s.now)
				continue
			}
			prefix, moved := s.w.ack(e)
			if len(f) == 4 {
				got := "-"
				if moved > 0 {
					got = fmt.Sprintf("%d:%d", moved, prefix.Offset)
				}
				if got != f[3] {
					t.Fatalf("%q: prefix moved %s, want %s", line, got, f[3])
				}
			}
		default:
			t.Fatalf("unknown step %q", line)
		}
	}
	return s.w
}

// TestInflightWindow: hand-out order, one message per key at a time, the
// limit, keyless messages as barriers, the contiguous prefix, and Nacks
// that hold their key while other keys go on.
func TestInflightWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		maxOut int
		script string
	}{
		{name: "one per key, in order", maxOut: 10, script: `
push a1 b1 a2 c1 b2
out 1 2 4
ack 2 => -
out 5
ack 1 => 2:2
out 3
ack 4 => -
ack 3 => 2:4
ack 5 => 1:5
out`},
		{name: "the limit", maxOut: 2, script: `
push a1 b1 c1 d1
out 1 2
ack 2 => -
out 3
ack 1 => 2:2
out 4
ack 3 => 1:3
ack 4 => 1:4`},
		{name: "a keyless message waits for all before it and holds all after it", maxOut: 10, script: `
push a1 b1 -1 c1 a2
out 1 2
ack 1 => 1:1
out
ack 2 => 1:2
out 3
ack 3 => 1:3
out 4 5
ack 5 => -
ack 4 => 2:5`},
		{name: "a nack holds its key, other keys go on", maxOut: 10, script: `
push a1 a2 b1 b2
out 1 3
nack 1
ack 3 => -
out 1 4
ack 4 => -
ack 1 => 1:1
out 2
ack 2 => 3:4`},
		{name: "acks above a gap stay in memory", maxOut: 4, script: `
push a1 b1 c1 d1
out 1 2 3 4
ack 4 => -
ack 3 => -
ack 2 => -
ack 1 => 4:4`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := runWindowScript(t, tc.maxOut, tc.script)
			if w.inFlight() < 0 || w.unsent() < 0 {
				t.Fatalf("in flight %d, unsent %d", w.inFlight(), w.unsent())
			}
		})
	}
}

// TestInflightWindowNackDue: a nacked message goes out again only once its
// delay is over; next says when to look again meanwhile.
func TestInflightWindowNackDue(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	w := newInflightWindow(4)
	a := w.push(testMessage(1, 1), "a", 1)
	w.push(testMessage(2, 1), "a", 1)
	e, _ := w.next(now)
	w.handOut(e)
	due := now.Add(100 * time.Millisecond)
	w.nack(a, due)
	if e, wake := w.next(now); e != nil || !wake.Equal(due) {
		t.Fatalf("next before the delay: %v, wake %v; want nothing until %v", e, wake, due)
	}
	if e, _ := w.next(due); e != a || e.attempt != 2 {
		t.Fatalf("next at the due time: %v, want the nacked message, attempt 2", e)
	}
	if !w.headOut() || w.inFlight() != 0 || w.unsent() != 1 {
		t.Fatalf("headOut %v, in flight %d, unsent %d; want true, 0, 1", w.headOut(), w.inFlight(), w.unsent())
	}
}

// TestInflightWindowHeadOfLineWait: a ready message held back by an
// earlier one of its key counts its wait from when it was first found
// held back to when it goes out.
func TestInflightWindowHeadOfLineWait(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	w := newInflightWindow(4)
	a1 := w.push(testMessage(1, 1), "a", 1)
	w.push(testMessage(2, 1), "a", 1)
	e, _ := w.next(now)
	w.handOut(e)
	if e, _ := w.next(now); e != nil {
		t.Fatalf("a2 handed out beside a1")
	}
	w.ack(a1)
	later := now.Add(30 * time.Millisecond)
	if e, _ := w.next(later); e == nil || e.msg.pos.Offset != 2 {
		t.Fatalf("a2 not handed out after a1's Ack")
	}
	if d := w.takeWait(); d != 30*time.Millisecond {
		t.Fatalf("head-of-line wait %s, want 30ms", d)
	}
	if d := w.takeWait(); d != 0 {
		t.Fatalf("head-of-line wait %s taken twice", d)
	}
}

// keyedMessage is a stored message at position (1, offset) with key as
// its PartitionKeyMetadata ("" for none).
func keyedMessage(offset int64, key string) storedMessage {
	m := testMessage(offset, 10)
	if key != "" {
		m.metadata = fmt.Sprintf(`{%q:%q}`, PartitionKeyMetadata, key)
	}
	m.size += int64(len(m.metadata))
	return m
}

// windowSettings are testSettings with an in-flight window of maxInFlight.
func windowSettings(maxInFlight int) consumerSettings {
	s := testSettings
	s.maxInFlight = maxInFlight
	s.windowCap = windowCapOf(s.batchSize, maxInFlight)
	s.windowAckedCap = windowAckedCapOf(s.windowCap)
	s.orderingKey = partitionKeyOf
	return s
}

// waitAcked waits for the consumer to have counted n Acks.
func (r *ownRun) waitAcked(t *testing.T, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.c.stats.acked.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d Acks counted within 5s, want %d", r.c.stats.acked.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitCond waits for cond, for at most 5s.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitCommitted waits for a commit of pos.
func (r *ownRun) waitCommitted(t *testing.T, pos Position) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, committed := r.store.commitCalls()
		if slices.Contains(committed, pos) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed %v within 5s, want %v", committed, pos)
		}
		time.Sleep(time.Millisecond)
	}
}

// nextN takes the next n messages handed out.
func (r *ownRun) nextN(t *testing.T, n int) []*message.Message {
	t.Helper()
	var msgs []*message.Message
	for range n {
		msgs = append(msgs, r.next(t))
	}
	return msgs
}

func uuids(msgs []*message.Message) string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.UUID)
	}
	return strings.Join(ids, " ")
}

// TestOwnWindow: with MaxInFlight 3, the consumer hands out the first
// message of each key at once (a2 waits for a1), commits only the
// contiguous acknowledged prefix, and hands a2 out after a1's Ack.
func TestOwnWindow(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "b"), keyedMessage(3, "a"), keyedMessage(4, "c")}
	store := newFakeConsumerStore(m...)
	r := startOwn(t, store, windowSettings(3), newByteBudget(1<<20), false)

	first := r.nextN(t, 3)
	if got := uuids(first); got != "m1 m2 m4" {
		t.Fatalf("handed out %s, want m1 m2 m4 (m3 waits for m1, of its key)", got)
	}
	waitCond(t, "the in-flight gauge at 3", func() bool { return r.c.stats.inFlight.Load() == 3 })
	first[1].Ack() // m2: above the unacknowledged m1
	first[2].Ack() // m4
	r.waitAcked(t, 2)
	if commits, _ := store.commitCalls(); commits != 0 {
		t.Fatalf("%d commits with m1 unacknowledged, want none", commits)
	}
	first[0].Ack() // m1: the prefix reaches m2
	if msg := r.next(t); msg.UUID != "m3" {
		t.Fatalf("then %s, want m3", msg.UUID)
	} else {
		msg.Ack()
	}
	if pos := r.waitIdle(t); pos != m[3].pos {
		t.Fatalf("waits for news after %v, want %v", pos, m[3].pos)
	}
	r.waitCommitted(t, m[3].pos)
	if _, committed := store.commitCalls(); !slices.Equal(committed, []Position{m[1].pos, m[3].pos}) {
		t.Fatalf("committed %v, want the prefix m2 (after m1's Ack), then m4", committed)
	}
	waitCond(t, "the in-flight gauge at 0 after every Ack", func() bool { return r.c.stats.inFlight.Load() == 0 })
	if r.c.stats.holWaitNanos.Load() <= 0 {
		t.Fatal("no head-of-line wait counted for m3")
	}
	r.end(t)
}

// TestOwnWindowNack: a Nack holds its key (a2 waits) while other keys go
// on; the nacked message comes again with the next attempt.
func TestOwnWindowNack(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "a"), keyedMessage(3, "b"), keyedMessage(4, "b")}
	store := newFakeConsumerStore(m...)
	r := startOwn(t, store, windowSettings(4), newByteBudget(1<<20), false)

	first := r.nextN(t, 2)
	if got := uuids(first); got != "m1 m3" {
		t.Fatalf("handed out %s, want m1 m3", got)
	}
	first[0].Nack()
	first[1].Ack()
	// m4 (b) goes on; m1 comes again after the delay, before m2.
	next := r.nextN(t, 2)
	slices.SortFunc(next, func(a, b *message.Message) int { return strings.Compare(a.UUID, b.UUID) })
	if got := uuids(next); got != "m1 m4" {
		t.Fatalf("then %s, want m1 again and m4", got)
	}
	if attemptOf(next[0]) != "2" || attemptOf(next[1]) != "1" {
		t.Fatalf("attempts %s and %s, want 2 for the nacked m1, 1 for m4", attemptOf(next[0]), attemptOf(next[1]))
	}
	next[1].Ack()
	next[0].Ack()
	if msg := r.next(t); msg.UUID != "m2" {
		t.Fatalf("then %s, want m2", msg.UUID)
	} else {
		msg.Ack()
	}
	r.waitCommitted(t, m[3].pos)
	r.end(t)
}

// TestOwnWindowKeyless: a message without a key goes out alone, once
// every message before it is acknowledged.
func TestOwnWindowKeyless(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "b"), keyedMessage(3, ""), keyedMessage(4, "c")}
	r := startOwn(t, newFakeConsumerStore(m...), windowSettings(4), newByteBudget(1<<20), false)
	first := r.nextN(t, 2)
	if got := uuids(first); got != "m1 m2" {
		t.Fatalf("handed out %s, want m1 m2", got)
	}
	first[0].Ack()
	first[1].Ack()
	msg := r.next(t)
	if msg.UUID != "m3" {
		t.Fatalf("then %s, want the keyless m3 alone", msg.UUID)
	}
	msg.Ack()
	if msg := r.next(t); msg.UUID != "m4" {
		t.Fatalf("then %s, want m4", msg.UUID)
	} else {
		msg.Ack()
	}
	r.waitCommitted(t, m[3].pos)
	r.end(t)
}

// TestOwnWindowKeylessReadsBatches: while a message without a key is out,
// nothing read after it could go out before its Ack, so the window reads
// nothing more until every message read has gone out: keyless messages
// are read a batch at a time (BatchSize 10), not one per Ack.
func TestOwnWindowKeylessReadsBatches(t *testing.T) {
	t.Parallel()
	var m []storedMessage
	for i := range 30 {
		m = append(m, keyedMessage(int64(i+1), ""))
	}
	r := startOwn(t, newFakeConsumerStore(m...), windowSettings(4), newByteBudget(1<<20), false)
	for i := range 20 {
		msg := r.next(t)
		if msg.UUID != m[i].uuid {
			t.Fatalf("message %d is %s, want %s", i, msg.UUID, m[i].uuid)
		}
		msg.Ack()
	}
	// The read after m20 comes in the turn that hands m20 out, before
	// its Ack is counted.
	r.waitAcked(t, 20)
	if got, want := r.store.afters(), []Position{{}, m[9].pos, m[19].pos}; !slices.Equal(got, want) {
		t.Fatalf("reads after %v, want %v (a batch each once the last message read is out)", got, want)
	}
	r.end(t)
}

// TestOwnWindowClaimLost: a commit refused by the fence ends the delivery
// at once: nothing more goes out, the contexts of the messages out end,
// the Acks above the prefix are dropped and no commit passes an
// unacknowledged message.
func TestOwnWindowClaimLost(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "b"), keyedMessage(3, "c"), keyedMessage(4, "d")}
	store := newFakeConsumerStore(m...)
	store.failNext("commit", fmt.Errorf("commit offset for topic %q (epoch 1): %w", "t", ErrOwnershipLost))
	r := startOwn(t, store, windowSettings(3), newByteBudget(1<<20), false)
	first := r.nextN(t, 3)
	first[2].Ack() // m3, above the gap: in memory only
	r.waitAcked(t, 1)
	first[0].Ack() // m1: the prefix commit is fenced
	if res := r.result(t); res != lost {
		t.Fatalf("own returned %d, want lost (%d)", res, lost)
	}
	if err := first[1].Context().Err(); err == nil {
		t.Fatal("the context of m2, still out, did not end with the claim")
	}
	if _, committed := store.commitCalls(); len(committed) != 0 {
		t.Fatalf("committed %v after the fence refused", committed)
	}
	if r.cl.acked != m[0].pos {
		t.Fatalf("claim at %v, want the prefix %v only", r.cl.acked, m[0].pos)
	}
	select {
	case msg := <-r.c.out:
		t.Fatalf("%s handed out after the claim was lost", msg.UUID)
	default:
	}
	if n := r.c.stats.inFlight.Load(); n != 0 {
		t.Fatalf("in-flight gauge %d after the claim was lost, want 0", n)
	}
}

// TestOwnWindowYield: asked for the row back, the consumer hands nothing
// more out and yields once the messages out are acked, with the prefix
// for the release to write.
func TestOwnWindowYield(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "b"), keyedMessage(3, "c")}
	settings := windowSettings(2)
	settings.commitBatch = 100 // the release writes the position
	r := startOwn(t, newFakeConsumerStore(m...), settings, newByteBudget(1<<20), false)
	first := r.nextN(t, 2)
	close(r.yield)
	first[1].Ack()
	first[0].Ack()
	if res := r.result(t); res != yielded {
		t.Fatalf("own returned %d, want yielded (%d)", res, yielded)
	}
	if r.cl.acked != m[1].pos {
		t.Fatalf("claim at %v, want %v", r.cl.acked, m[1].pos)
	}
	select {
	case msg := <-r.c.out:
		t.Fatalf("%s handed out after the yield", msg.UUID)
	default:
	}
}

// TestOwnWindowStopped: when the subscription ends, the Acks given before
// move the position the release writes, over the contiguous prefix only.
func TestOwnWindowStopped(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "b"), keyedMessage(3, "c")}
	settings := windowSettings(3)
	settings.commitBatch = 100
	r := startOwn(t, newFakeConsumerStore(m...), settings, newByteBudget(1<<20), false)
	msgs := r.nextN(t, 3)
	msgs[0].Ack()
	msgs[2].Ack()
	r.waitAcked(t, 2)
	r.end(t)
	if r.cl.acked != m[0].pos {
		t.Fatalf("claim at %v after the end, want %v (m2 was not acked)", r.cl.acked, m[0].pos)
	}
}

// TestOwnWindowBudget: with a byte budget smaller than a batch, the window
// reads what the budget holds, hands out beyond one read, holds none of
// the bytes of the messages out, and gives every byte back at the end.
func TestOwnWindowBudget(t *testing.T) {
	t.Parallel()
	var m []storedMessage
	for i := range 8 {
		m = append(m, keyedMessage(int64(i+1), fmt.Sprintf("k%d", i)))
	}
	// Reservations of 100 bytes: 3 messages of 32 bytes fit in one read.
	budget := newByteBudget(800)
	r := startOwn(t, newFakeConsumerStore(m...), windowSettings(4), budget, false)
	out := r.nextN(t, 4)
	if got := uuids(out); got != "m1 m2 m3 m4" {
		t.Fatalf("handed out %s, want m1 to m4", got)
	}
	if n := budget.buffered(); n > 100 {
		t.Fatalf("%d bytes buffered with four messages out, want at most one reservation", n)
	}
	for _, msg := range out {
		msg.Ack()
	}
	for _, msg := range r.nextN(t, 4) {
		msg.Ack()
	}
	r.waitCommitted(t, m[7].pos)
	if n := len(r.store.afters()); n < 3 {
		t.Fatalf("%d reads, want at least 3 (the budget holds 3 messages per read)", n)
	}
	r.end(t)
}

// infoCounter counts the Info lines logged that start with prefix.
type infoCounter struct {
	watermill.NopLogger
	prefix string
	n      *atomic.Int64
}

func (l infoCounter) Info(msg string, _ watermill.LogFields) {
	if strings.HasPrefix(msg, l.prefix) {
		l.n.Add(1)
	}
}

func (l infoCounter) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// TestOwnWindowFull: with a1 out and slow (not acked) and the later
// messages of its key filling the window's cap of messages not
// acknowledged, the window reads nothing more (b1 does not go out: a slow
// key's messages are not evicted, it may go on at any moment) and logs it
// once, however often it looks; after a1's Ack it reads on and b1 goes
// out.
func TestOwnWindowFull(t *testing.T) {
	t.Parallel()
	var m []storedMessage
	for i := range 10 {
		m = append(m, keyedMessage(int64(i+1), "a"))
	}
	m = append(m, keyedMessage(11, "b"))
	settings := windowSettings(2) // a cap of 10 messages not acknowledged
	logged := &atomic.Int64{}
	r := startOwnWith(t, newFakeConsumerStore(m...), settings, newByteBudget(1<<20), false, func(r *ownRun) {
		r.c.logger = infoCounter{prefix: "In-flight window full", n: logged}
	})
	a1 := r.next(t)
	if a1.UUID != "m1" {
		t.Fatalf("first %s, want m1", a1.UUID)
	}
	r.c.fullCheck(t, logged)
	for range 3 {
		r.c.poke() // news: the window looks again
	}
	select {
	case msg := <-r.c.out:
		t.Fatalf("%s handed out while the window is full", msg.UUID)
	default:
	}
	if n := r.c.stats.evicted.Load(); n != 0 {
		t.Fatalf("%d messages evicted behind a message out, want none", n)
	}
	a1.Ack()
	for _, want := range []string{"m2", "m11"} {
		msg := r.next(t)
		if msg.UUID != want {
			t.Fatalf("after a1's Ack %s went out, want %s", msg.UUID, want)
		}
		msg.Ack()
	}
	if n := logged.Load(); n != 1 {
		t.Fatalf("logged %d times, want once", n)
	}
}

// fullCheck waits for the full window to be logged (once the first
// message has been out for windowFullLogAfter).
func (c *consumer) fullCheck(t *testing.T, logged *atomic.Int64) {
	t.Helper()
	deadline := time.Now().Add(windowFullLogAfter + 5*time.Second)
	for logged.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the full window not logged within %s", windowFullLogAfter+5*time.Second)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOwnWindowEvictsAWaitingKey: a1 nacked (waiting for its next
// attempt) with the later messages of its key filling the window: they
// are evicted (their bytes go back to the budget), the window reads on
// and b1 goes out while a1 waits; the position does not pass a2. After
// a1's Ack, a2 to a10 are read again by their positions, in one read, and
// go out in order, each once, as attempt 1; the position then reaches b1.
// Nothing is read twice by the read position: the reads after the first
// start at a10 or later.
func TestOwnWindowEvictsAWaitingKey(t *testing.T) {
	t.Parallel()
	var m []storedMessage
	for i := range 10 {
		m = append(m, keyedMessage(int64(i+1), "a"))
	}
	m = append(m, keyedMessage(11, "b"))
	settings := windowSettings(2) // a cap of 10 messages not acknowledged
	// a1's next attempt comes long after everything the loop does
	// meanwhile: b1 must go out before it, which it never did before
	// eviction (the window read nothing more).
	settings.nackResendDelay = 500 * time.Millisecond
	store := newFakeConsumerStore(m...)
	r := startOwn(t, store, settings, newByteBudget(1<<20), false)
	a1 := r.next(t)
	if a1.UUID != "m1" {
		t.Fatalf("first %s, want m1", a1.UUID)
	}
	a1.Nack()
	b1 := r.next(t)
	if b1.UUID != "m11" {
		t.Fatalf("after a1's Nack %s went out, want b1 (m11) while a1 waits", b1.UUID)
	}
	if n := r.c.stats.evicted.Load(); n != 9 {
		t.Fatalf("%d messages evicted, want a2 to a10 (9)", n)
	}
	// The budget holds nothing of the evicted messages once b1 is out
	// (the loop gives b1's bytes back after the send that handed it out,
	// a moment after this test received it).
	waitUntil(t, func() bool { return r.c.budget.buffered() == 0 })
	b1.Ack()
	a1 = r.next(t)
	if a1.UUID != "m1" || attemptOf(a1) != "2" {
		t.Fatalf("then %s attempt %s, want m1 attempt 2", a1.UUID, attemptOf(a1))
	}
	if _, committed := store.commitCalls(); len(committed) != 0 {
		t.Fatalf("committed %v with a1 not acknowledged", committed)
	}
	a1.Ack()
	for i := 2; i <= 10; i++ {
		msg := r.next(t)
		if want := fmt.Sprintf("m%d", i); msg.UUID != want || attemptOf(msg) != "1" || len(msg.Payload) != 10 {
			t.Fatalf("after a1's Ack %s attempt %s (%d bytes) went out, want %s attempt 1 whole", msg.UUID,
				attemptOf(msg), len(msg.Payload), want)
		}
		msg.Ack()
	}
	r.waitCommitted(t, m[10].pos)
	store.mu.Lock()
	readsAt := slices.Clone(store.readsAt)
	store.mu.Unlock()
	if len(readsAt) != 1 || !slices.Equal(readsAt[0].positions, positionsOfMessages(m[1:10])) {
		t.Fatalf("read again %+v, want a2 to a10 in one read", readsAt)
	}
	if got := store.afters(); len(got) < 2 || got[0] != (Position{}) || slices.ContainsFunc(got[1:], func(p Position) bool {
		return comparePositions(p, m[9].pos) < 0
	}) {
		t.Fatalf("reads after %v, want the start, then none before a10 (%v)", got, m[9].pos)
	}
	r.end(t)
}

// TestOwnWindowEvictsLaterMessagesOfAnEvictedKey: a message read after an
// evicted one of its key is evicted at once (it could not go out before
// it), whether or not the window is full; one of another key is not.
func TestOwnWindowEvictsLaterMessagesOfAnEvictedKey(t *testing.T) {
	t.Parallel()
	var m []storedMessage
	for i := range 10 {
		m = append(m, keyedMessage(int64(i+1), "a"))
	}
	m = append(m, keyedMessage(11, "b"), keyedMessage(12, "a"), keyedMessage(13, "c"))
	settings := windowSettings(2)
	settings.nackResendDelay = time.Hour
	store := newFakeConsumerStore(m...)
	r := startOwn(t, store, settings, newByteBudget(1<<20), false)
	r.next(t).Nack()
	got := r.nextN(t, 2)
	if ids := uuids(got); ids != "m11 m13" {
		t.Fatalf("handed out %s while a1 waits, want m11 m13", ids)
	}
	if n := r.c.stats.evicted.Load(); n != 10 {
		t.Fatalf("%d messages evicted, want a2 to a10 and a11 (10)", n)
	}
	for _, msg := range got {
		msg.Ack()
	}
	r.waitAcked(t, 2)
	select {
	case msg := <-r.c.out:
		t.Fatalf("%s handed out while a1 waits", msg.UUID)
	default:
	}
	r.end(t)
}

// TestOwnWindowEvictedMessageGone: an evicted message no longer stored
// when it is read again (retention removed it) is skipped as if
// acknowledged, and the next one of its key goes out.
func TestOwnWindowEvictedMessageGone(t *testing.T) {
	t.Parallel()
	var m []storedMessage
	for i := range 10 {
		m = append(m, keyedMessage(int64(i+1), "a"))
	}
	m = append(m, keyedMessage(11, "b"))
	settings := windowSettings(2)
	settings.nackResendDelay = 200 * time.Millisecond
	store := newFakeConsumerStore(m...)
	r := startOwn(t, store, settings, newByteBudget(1<<20), false)
	r.next(t).Nack()
	if b1 := r.next(t); b1.UUID != "m11" {
		t.Fatalf("after a1's Nack %s, want m11", b1.UUID)
	} else {
		b1.Ack()
	}
	store.mu.Lock()
	store.msgs = slices.Delete(store.msgs, 1, 2) // a2
	store.mu.Unlock()
	a1 := r.next(t)
	if a1.UUID != "m1" {
		t.Fatalf("then %s, want m1 again", a1.UUID)
	}
	a1.Ack()
	if msg := r.next(t); msg.UUID != "m3" {
		t.Fatalf("after a1's Ack %s, want m3 (a2 is gone)", msg.UUID)
	} else {
		msg.Ack()
	}
	r.end(t)
}

func positionsOfMessages(ms []storedMessage) []Position {
	out := make([]Position, len(ms))
	for i, m := range ms {
		out[i] = m.pos
	}
	return out
}

// TestOwnWindowSkipsAndCarriesAckedAbove: a claim whose row carried
// acknowledged positions (claim.skip) does not hand their messages out;
// a yield with a1 nacked leaves the Acks above it in claim.above for the
// release, with the skipped positions that lie above a1 too.
func TestOwnWindowSkipsAndCarriesAckedAbove(t *testing.T) {
	t.Parallel()
	m := []storedMessage{keyedMessage(1, "a"), keyedMessage(2, "b"), keyedMessage(3, "c"), keyedMessage(4, "d")}
	settings := windowSettings(4)
	settings.commitBatch = 100
	settings.nackResendDelay = time.Hour
	r := startOwnWith(t, newFakeConsumerStore(m...), settings, newByteBudget(1<<20), false, func(r *ownRun) {
		r.cl.skip = map[Position]struct{}{m[2].pos: {}}
	})
	got := r.nextN(t, 2)
	if ids := uuids(got); ids != "m1 m2" {
		t.Fatalf("handed out %s, want m1 m2", ids)
	}
	got[0].Nack()
	got[1].Ack()
	if msg := r.next(t); msg.UUID != "m4" {
		t.Fatalf("then %s, want m4 (m3 was acknowledged when the row was claimed)", msg.UUID)
	} else {
		msg.Ack()
	}
	r.waitAcked(t, 2)
	close(r.yield)
	if res := r.result(t); res != yielded {
		t.Fatalf("own returned %d, want yielded (%d)", res, yielded)
	}
	if want := []Position{m[1].pos, m[2].pos, m[3].pos}; !slices.Equal(r.cl.above, want) || r.cl.acked != (Position{}) {
		t.Fatalf("claim at %v with %v above, want the start with %v above", r.cl.acked, r.cl.above, want)
	}
}
