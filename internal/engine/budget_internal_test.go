package engine

import (
	"sync"
	"testing"
	"time"
)

// These tests need no database.

// none never stops a wait.
var none budgetStop

func TestBudgetReserveTakesWhatIsFree(t *testing.T) {
	b := newByteBudget(100)
	if got := b.reserveWant(); got != 12 {
		t.Fatalf("reserveWant = %d, want 12 (an eighth)", got)
	}
	var l1, l2 budgetLease
	if !b.reserve(&l1, 80, none) || l1.n != 80 {
		t.Fatalf("first reserve: %+v", l1)
	}
	if !b.reserve(&l2, 80, none) || l2.n != 20 {
		t.Fatalf("second reserve gets the 20 bytes left, got %+v", l2)
	}
	if b.tryReserve(&l2, 1) {
		t.Fatal("tryReserve succeeded with nothing free")
	}
	b.giveBack(&l1, 30) // the read used 50
	if l1.n != 50 || b.buffered() != 70 {
		t.Fatalf("after giving 30 back: lease %d, buffered %d", l1.n, b.buffered())
	}
	b.giveBack(&l2, 1000) // more than held: all of it
	if l2.n != 0 || b.buffered() != 50 {
		t.Fatalf("after giving all back: lease %d, buffered %d", l2.n, b.buffered())
	}
	if newByteBudget(3).reserveWant() != 1 {
		t.Fatal("reserveWant of a tiny budget must be 1")
	}
}

func TestBudgetReserveWaitsAndStops(t *testing.T) {
	b := newByteBudget(10)
	var full, waiter budgetLease
	b.reserve(&full, 10, none)
	got := make(chan bool)
	go func() { got <- b.reserve(&waiter, 5, none) }()
	select {
	case <-got:
		t.Fatal("reserve returned with nothing free")
	case <-time.After(20 * time.Millisecond):
	}
	b.giveBack(&full, 3)
	if ok := <-got; !ok || waiter.n != 3 {
		t.Fatalf("reserve after 3 bytes came back: ok %v, lease %d", ok, waiter.n)
	}

	stop := make(chan struct{})
	var cancelled budgetLease
	go func() { got <- b.reserve(&cancelled, 5, budgetStop{nil, stop, nil}) }()
	close(stop)
	if ok := <-got; ok || cancelled.n != 0 {
		t.Fatalf("reserve after stop: ok %v, lease %d", ok, cancelled.n)
	}
	go func() { got <- b.reserveExact(&cancelled, 50, budgetStop{nil, nil, stop}) }()
	if ok := <-got; ok || cancelled.n != 0 {
		t.Fatalf("reserveExact after stop: ok %v, lease %d", ok, cancelled.n)
	}
	b.mu.Lock()
	waiting := b.bigWaiting
	b.mu.Unlock()
	if waiting != 0 {
		t.Fatalf("bigWaiting = %d after the stopped wait", waiting)
	}
}

// A message larger than the budget is granted once any byte is free, one
// such grant at a time; the bytes held exceed the budget by at most one
// message.
func TestBudgetExactGrantBeyondTheBudget(t *testing.T) {
	b := newByteBudget(100)
	var small, big1, big2 budgetLease
	b.reserve(&small, 60, none)
	if !b.reserveExact(&big1, 40, none) || big1.big {
		t.Fatalf("a 40-byte message fits the 40 bytes free: %+v", big1)
	}
	b.giveBack(&big1, 40)
	if !b.reserveExact(&big1, 500, none) || !big1.big {
		t.Fatalf("a 500-byte message is granted beyond the budget: %+v", big1)
	}
	if got := b.buffered(); got != 560 {
		t.Fatalf("buffered = %d, want 560", got)
	}
	got := make(chan bool)
	go func() { got <- b.reserveExact(&big2, 300, none) }()
	b.giveBack(&small, 60) // frees nothing usable: 500 are out beyond 100
	select {
	case <-got:
		t.Fatal("a second grant beyond the budget while the first is out")
	case <-time.After(20 * time.Millisecond):
	}
	b.giveBack(&big1, 500)
	if ok := <-got; !ok || !big2.big || b.buffered() != 300 {
		t.Fatalf("second big grant after the first ended: ok %v, %+v, buffered %d", ok, big2, b.buffered())
	}
}

// While a consumer waits for an exact grant, new reservations wait too, so
// that a stream of small reads cannot starve it.
func TestBudgetExactGrantIsNotStarved(t *testing.T) {
	b := newByteBudget(100)
	var held, big, small budgetLease
	b.reserve(&held, 100, none)
	bigDone := make(chan bool)
	go func() { bigDone <- b.reserveExact(&big, 80, none) }()
	waitUntil(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.bigWaiting == 1
	})
	smallDone := make(chan bool)
	go func() { smallDone <- b.reserve(&small, 10, none) }()
	b.giveBack(&held, 30) // 30 free: the exact grant takes them, beyond the budget
	if ok := <-bigDone; !ok || big.n != 80 || !big.big {
		t.Fatalf("exact grant: ok %v, %+v", ok, big)
	}
	select {
	case <-smallDone:
		t.Fatal("the small reservation found bytes free beyond the budget")
	case <-time.After(20 * time.Millisecond):
	}
	b.giveBack(&big, 80)
	if ok := <-smallDone; !ok || small.n != 10 {
		t.Fatalf("small reservation after the grant ended: ok %v, %+v", ok, small)
	}
}

// Many consumers reading and handing out at once never hold more than the
// budget plus one message.
func TestBudgetBoundUnderConcurrency(t *testing.T) {
	const budget, msg = 1000, 300
	b := newByteBudget(budget)
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := int64(0)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l budgetLease
			for range 200 {
				size := int64(msg)
				if i%4 == 0 {
					size = 1500 // larger than the budget
				}
				if !b.reserve(&l, b.reserveWant(), none) {
					t.Error("reserve failed")
					return
				}
				if l.n < size {
					b.giveBack(&l, l.n)
					b.reserveExact(&l, size, none)
				} else {
					b.giveBack(&l, l.n-size)
				}
				mu.Lock()
				peak = max(peak, b.buffered())
				mu.Unlock()
				b.giveBack(&l, size)
			}
		}()
	}
	wg.Wait()
	if peak > budget+1500 {
		t.Fatalf("peak %d bytes held, budget %d plus one message of at most 1500", peak, budget)
	}
	if b.buffered() != 0 {
		t.Fatalf("%d bytes still held", b.buffered())
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNewReadBatch: the batch is the longest prefix of whole messages
// within the budget, the rows left out lose their payloads but keep their
// sizes, and all holds
// only when the read returned fewer rows than asked and every one of them
// is in the batch.
func TestNewReadBatch(t *testing.T) {
	t.Parallel()
	row := func(size int64, whole bool) storedMessage {
		return storedMessage{uuid: "m", payload: []byte("x"), size: size, whole: whole}
	}
	for _, tc := range []struct {
		name     string
		rows     []storedMessage
		limit    int
		budget   int64
		n, fit   int
		all      bool
		leftOver bool // a row left out whose payload must be cleared
	}{
		{name: "fewer than asked, all fit", rows: []storedMessage{row(10, true), row(10, true)}, limit: 3, budget: 100, n: 2, fit: 2, all: true},
		{name: "as many as asked", rows: []storedMessage{row(10, true), row(10, true)}, limit: 2, budget: 100, n: 2, fit: 2},
		{name: "over the budget", rows: []storedMessage{row(10, true), row(10, true)}, limit: 3, budget: 15, n: 1, fit: 1, leftOver: true},
		{name: "one not whole", rows: []storedMessage{row(10, true), row(10, false)}, limit: 3, budget: 100, n: 1, fit: 2, leftOver: true},
		{name: "nothing", limit: 3, budget: 100, all: true},
		{name: "first larger than the budget", rows: []storedMessage{row(10, false), row(10, true)}, limit: 3, budget: 5, leftOver: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rb, fit := newReadBatch(tc.rows, true, tc.limit, tc.budget)
			if len(rb.msgs) != tc.n || fit != tc.fit || rb.all != tc.all || !rb.pending {
				t.Fatalf("%d messages, fit %d, all %v, pending %v; want %d, %d, %v, true",
					len(rb.msgs), fit, rb.all, rb.pending, tc.n, tc.fit, tc.all)
			}
			if got := rb.bytes(); got != int64(10*tc.n) {
				t.Errorf("bytes = %d, want %d", got, 10*tc.n)
			}
			if tc.leftOver {
				// fetch reserves the size of a first message that does
				// not fit: it must survive the cut.
				if left := tc.rows[tc.n]; left.payload != nil || left.whole || left.size != 10 || left.uuid != "m" {
					t.Errorf("the row left out: %+v, want its payload gone and its size and identity kept", left)
				}
			}
		})
	}
}
