package engine

import "sync"

// byteBudget is a Subscriber's MaxBufferedBytes: the bytes of the messages
// its consumers read and have not handed out yet, shared by all of them.
// A consumer reserves bytes before it reads (reserve; see consumer.fetch
// for how a read stays within them), gives back what its batch does not
// use, then each message's bytes as it hands the message out (giveBack),
// and what it still holds when it stops owning its row.
//
// A message larger than what a consumer could reserve is not read whole;
// the consumer learns its size and waits for that many bytes
// (reserveExact). So that a message larger than the whole budget is
// delivered too, one consumer at a time may take such a message beyond
// the budget, as soon as any byte is free: the bytes held never exceed the
// budget by more than one message. While a consumer waits for that grant,
// new reservations wait too, so that smaller ones cannot starve it.
//
// It is safe for concurrent use.
type byteBudget struct {
	max int64

	mu   sync.Mutex
	used int64
	// bigOut is set while a grant beyond the budget is held; bigWaiting
	// counts the consumers waiting for one.
	bigOut     bool
	bigWaiting int
	// changed is closed (and replaced) when bytes are given back while
	// waiting consumers (waiters) may want them.
	changed chan struct{}
	waiters int
}

// budgetLease is what one consumer, or one of its prefetches, holds of the
// budget. One goroutine at a time uses it: a prefetch's lease is its
// goroutine's until the read is done, then the consumer's.
type budgetLease struct {
	n   int64
	big bool // the grant beyond the budget
}

func newByteBudget(limit int64) *byteBudget {
	return &byteBudget{max: limit, changed: make(chan struct{})}
}

// reserveWant is the most one read reserves: an eighth of the budget (at
// least one byte), so that several consumers read at once and a consumer's
// reservation, most of it given back right after its read, keeps the
// others waiting only while no other byte is free.
func (b *byteBudget) reserveWant() int64 { return max(b.max/8, 1) }

// reserve waits until bytes are free and adds up to want of them (at least
// one) to l. It reports false, reserving nothing, when one of stop is
// closed first (a nil channel never is).
func (b *byteBudget) reserve(l *budgetLease, want int64, stop budgetStop) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.take(l, want) {
		if !b.wait(stop) {
			return false
		}
	}
	return true
}

// tryReserve is reserve without waiting: it reports false when nothing
// can be reserved now.
func (b *byteBudget) tryReserve(l *budgetLease, want int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.take(l, want)
}

// take adds up to want free bytes (at least one) to l, unless none are
// free or a wait for a grant beyond the budget comes first; b.mu must be
// held.
func (b *byteBudget) take(l *budgetLease, want int64) bool {
	free := b.max - b.used
	if free <= 0 || (b.bigWaiting > 0 && !b.bigOut) {
		return false
	}
	n := min(free, max(want, 1))
	b.used += n
	l.n += n
	return true
}

// reserveExact waits until size bytes are free and adds them to l, or,
// when no grant beyond the budget is out, takes them as that grant as
// soon as any byte is free (a message larger than the budget, or than
// what is left of it while the others hold the rest). l must hold
// nothing. It reports false, reserving nothing, when one of stop is
// closed first.
func (b *byteBudget) reserveExact(l *budgetLease, size int64, stop budgetStop) bool {
	b.mu.Lock()
	b.bigWaiting++
	for {
		free := b.max - b.used
		switch {
		case size <= free:
			b.used += size
			l.n += size
		case free > 0 && !b.bigOut:
			b.used += size
			l.n += size
			l.big, b.bigOut = true, true
		default:
			if !b.wait(stop) {
				b.bigWaiting--
				b.broadcast()
				b.mu.Unlock()
				return false
			}
			continue
		}
		b.bigWaiting--
		b.broadcast() // reservations held back for this one go on
		b.mu.Unlock()
		return true
	}
}

// wait releases b.mu until bytes are given back or one of stop is closed
// (it reports false then), and takes it again.
func (b *byteBudget) wait(stop budgetStop) bool {
	changed := b.changed
	b.waiters++
	b.mu.Unlock()
	ok := stop.wait(changed)
	b.mu.Lock()
	b.waiters--
	return ok
}

// giveBack returns n of l's bytes (all of them when n exceeds what l
// holds); a lease that holds nothing any more ends its grant beyond the
// budget.
func (b *byteBudget) giveBack(l *budgetLease, n int64) {
	n = min(n, l.n)
	if n <= 0 && !l.big {
		return
	}
	b.mu.Lock()
	b.used -= n
	l.n -= n
	if l.n == 0 && l.big {
		l.big, b.bigOut = false, false
	}
	b.broadcast()
	b.mu.Unlock()
}

// buffered returns the bytes held now.
func (b *byteBudget) buffered() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// budgetStop are the channels that end a wait for the budget: the end of
// the subscription, the loss of the session, the member's request for the
// row.
type budgetStop [3]<-chan struct{}

// wait waits until changed or one of s is closed; it reports false for s.
func (s budgetStop) wait(changed <-chan struct{}) bool {
	select {
	case <-changed:
		return true
	case <-s[0]:
		return false
	case <-s[1]:
		return false
	case <-s[2]:
		return false
	}
}

// broadcast wakes every waiter, if any; b.mu must be held.
func (b *byteBudget) broadcast() {
	if b.waiters == 0 {
		return
	}
	close(b.changed)
	b.changed = make(chan struct{})
}
