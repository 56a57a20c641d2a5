package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// These tests need no database.

// TestPendingPoll: a hold is re-polled within pendingFastCap for
// pendingFastFor, then counts as a stall once and backs off up to the slow
// interval; a reset starts the next hold afresh, so short holds never add
// up to a stall.
func TestPendingPoll(t *testing.T) {
	t.Parallel()
	type step struct {
		at      time.Duration // since the start of the test
		reset   bool          // a read returned messages (or nothing held back) first
		stalled bool
		maxWait time.Duration // the wait returned is at most this
	}
	for _, tc := range []struct {
		name  string
		slow  time.Duration
		steps []step
	}{
		{name: "a long hold stalls once and backs off", slow: 5 * time.Second, steps: []step{
			{at: 0, maxWait: pendingFastFirst},
			{at: 500 * time.Millisecond, maxWait: pendingFastCap},
			{at: 1001 * time.Millisecond, stalled: true, maxWait: 5 * time.Second},
			{at: 1100 * time.Millisecond, maxWait: 5 * time.Second},
		}},
		{name: "short holds each start afresh", slow: 5 * time.Second, steps: []step{
			{at: 0, maxWait: pendingFastFirst},
			{at: 80 * time.Millisecond, maxWait: pendingFastCap},
			{at: 900 * time.Millisecond, reset: true, maxWait: pendingFastFirst},
			{at: 980 * time.Millisecond, maxWait: pendingFastCap},
			{at: 1800 * time.Millisecond, reset: true, maxWait: pendingFastFirst},
			{at: 2700 * time.Millisecond, maxWait: pendingFastCap},
		}},
		{name: "a slow interval no longer than the fast cap never stalls", slow: 10 * time.Millisecond, steps: []step{
			{at: 0, maxWait: pendingFastFirst},
			{at: 2 * time.Second, maxWait: pendingFastCap},
			{at: 3 * time.Second, maxWait: pendingFastCap},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			p := newPendingPoll(tc.slow)
			for i, s := range tc.steps {
				if s.reset {
					p.reset()
				}
				wait, stalled := p.held(start.Add(s.at))
				if stalled != s.stalled || wait > s.maxWait || wait <= 0 {
					t.Fatalf("step %d at %s: wait %s, stalled %v; want at most %s, stalled %v",
						i, s.at, wait, stalled, s.maxWait, s.stalled)
				}
			}
		})
	}
	// Once stalled, the waits grow to the slow interval.
	p := newPendingPoll(5 * time.Second)
	start := time.Now()
	p.held(start)
	p.held(start.Add(2 * time.Second))
	var wait time.Duration
	for range 20 {
		wait, _ = p.held(start.Add(3 * time.Second))
	}
	if wait < 2500*time.Millisecond {
		t.Fatalf("wait %s after a long stall, want half of the slow interval at least", wait)
	}
}

// The tests below drive a consumer's own, the delivery of one claim,
// against fakeConsumerStore, an in-memory partition and its offset row;
// the test plays the handler.

// fakeConsumerStore is one (topic, partition) of the messages table and
// its offset row, as a consumer's statements see them. Safe for
// concurrent use: a prefetch reads beside the consumer.
type fakeConsumerStore struct {
	mu   sync.Mutex
	msgs []storedMessage // whole, in position order
	// head is the row's count of deliveries of the message after its
	// committed position, which countHead adds one to.
	head      int
	reads     []readParams
	readsAt   []readAtParams
	commits   int        // commit calls, failed ones included
	committed []Position // positions the commits wrote
	// fail holds, per method, the errors its next calls return, in turn.
	fail map[string][]error
}

func newFakeConsumerStore(msgs ...storedMessage) *fakeConsumerStore {
	return &fakeConsumerStore{msgs: msgs, fail: map[string][]error{}}
}

// failNext makes the next calls of method return errs, one each.
func (f *fakeConsumerStore) failNext(method string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = append(f.fail[method], errs...)
}

func (f *fakeConsumerStore) failure(method string) error {
	errs := f.fail[method]
	if len(errs) == 0 {
		return nil
	}
	f.fail[method] = errs[1:]
	return errs[0]
}

// read returns up to p.limit messages after p.after; those larger than
// p.wholeUpTo come without their payload and metadata, as
// SelectMessages sends them.
func (f *fakeConsumerStore) read(_ context.Context, p readParams) ([]storedMessage, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads = append(f.reads, p)
	if err := f.failure("read"); err != nil {
		return nil, false, err
	}
	var rows []storedMessage
	for _, m := range f.msgs {
		if len(rows) == p.limit {
			break
		}
		if comparePositions(m.pos, p.after) <= 0 {
			continue
		}
		m.whole = m.size <= p.wholeUpTo
		if !m.whole {
			m.payload, m.metadata = nil, ""
		}
		rows = append(rows, m)
	}
	return rows, false, nil
}

// readAt returns the messages at p.positions, whole.
func (f *fakeConsumerStore) readAt(_ context.Context, p readAtParams) ([]storedMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readsAt = append(f.readsAt, p)
	if err := f.failure("readAt"); err != nil {
		return nil, err
	}
	var rows []storedMessage
	for _, m := range f.msgs {
		if slices.Contains(p.positions, m.pos) {
			rows = append(rows, m)
		}
	}
	return rows, nil
}

func (f *fakeConsumerStore) countHead(context.Context, *claim) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure("countHead"); err != nil {
		return 0, err
	}
	f.head++
	return f.head, nil
}

func (f *fakeConsumerStore) commit(_ context.Context, cl *claim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commits++
	if err := f.failure("commit"); err != nil {
		return err
	}
	f.committed = append(f.committed, cl.acked)
	cl.committed = cl.acked
	return nil
}

func (f *fakeConsumerStore) release(*claim) error { return nil }

// afters returns where each read started.
func (f *fakeConsumerStore) afters() []Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Position
	for _, r := range f.reads {
		out = append(out, r.after)
	}
	return out
}

func (f *fakeConsumerStore) commitCalls() (int, []Position) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commits, slices.Clone(f.committed)
}

// fakeConsumerHub records the positions the consumer waits for news
// after.
type fakeConsumerHub struct{ idle chan Position }

func (h fakeConsumerHub) setIdle(_ *consumer, after Position) { h.idle <- after }
func (fakeConsumerHub) clearIdle(*consumer)                   {}
func (fakeConsumerHub) remove(*consumer)                      {}

type fakeConsumerHost struct{}

func (fakeConsumerHost) releaseSlot(rowKey, *topicSlot) {}
func (fakeConsumerHost) closeError(error)               {}
func (fakeConsumerHost) reportStall(rowKey)             {}

// testMessage is a stored message at position (1, offset) whose payload
// is size bytes, with no metadata.
func testMessage(offset int64, size int) storedMessage {
	return storedMessage{pos: Position{TransactionID: 1, Offset: offset}, uuid: fmt.Sprintf("m%d", offset),
		payload: bytes.Repeat([]byte{'x'}, size), size: int64(size), whole: true}
}

// ownRun is one call of own under way, in a goroutine of its own.
type ownRun struct {
	c     *consumer
	store *fakeConsumerStore
	g     *sessionGen
	cl    *claim
	idle  chan Position
	yield chan struct{}
	stop  context.CancelFunc
	res   chan outcome
}

// testSettings are settings for own in milliseconds: a commit per Ack.
var testSettings = consumerSettings{batchSize: 10, commitBatch: 1, commitInterval: time.Hour,
	nackResendDelay: time.Millisecond, retryFirst: time.Millisecond, slowPoll: 10 * time.Millisecond}

// startOwn runs own on a new claim of store's partition, at the
// beginning, with a message known to follow.
func startOwn(t *testing.T, store *fakeConsumerStore, settings consumerSettings, budget *byteBudget, prefetch bool) *ownRun {
	t.Helper()
	return startOwnWith(t, store, settings, budget, prefetch, nil)
}

// startOwnWith is startOwn that lets setup change the consumer and the
// claim before own runs.
func startOwnWith(t *testing.T, store *fakeConsumerStore, settings consumerSettings, budget *byteBudget, prefetch bool,
	setup func(r *ownRun)) *ownRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &sessionGen{id: uuid.New(), lost: make(chan struct{})}
	g.trustUntil.Store(math.MaxInt64)
	r := &ownRun{store: store, g: g, idle: make(chan Position, 100), yield: make(chan struct{}), stop: cancel,
		res: make(chan outcome, 1)}
	r.cl = &claim{group: "g", topic: "t", sessionID: g.id, g: g, epoch: 1}
	r.c = &consumer{
		consumerDeps: &consumerDeps{settings: settings, budget: budget, store: store,
			hub: fakeConsumerHub{idle: r.idle}, host: fakeConsumerHost{}, stats: newSubscriberStats(nil),
			outage: newOutageLog(watermill.NopLogger{}, componentConsumers), driver: pgsql.NewLazy(pgsql.NewTables(pgsql.Names{})),
			goroutines: &sync.WaitGroup{}, prefetch: prefetch},
		topic: "t", ctx: ctx, out: make(chan *message.Message), wake: make(chan struct{}, 1),
		yield: r.yield, logger: watermill.NopLogger{},
	}
	if setup != nil {
		setup(r)
	}
	go func() { r.res <- r.c.own(g, r.cl, true) }()
	t.Cleanup(func() {
		cancel()
		r.c.goroutines.Wait()
	})
	return r
}

// next waits for the next message handed out.
func (r *ownRun) next(t *testing.T) *message.Message {
	t.Helper()
	select {
	case msg := <-r.c.out:
		return msg
	case res := <-r.res:
		t.Fatalf("own returned %d instead of handing a message out", res)
	case <-time.After(5 * time.Second):
		t.Fatal("no message handed out within 5s")
	}
	return nil
}

// waitIdle waits for the consumer to wait for news, and returns the
// position it waits after.
func (r *ownRun) waitIdle(t *testing.T) Position {
	t.Helper()
	select {
	case pos := <-r.idle:
		return pos
	case res := <-r.res:
		t.Fatalf("own returned %d instead of waiting for news", res)
	case <-time.After(5 * time.Second):
		t.Fatal("the consumer did not wait for news within 5s")
	}
	return Position{}
}

// result waits for own to return, and checks that every byte it held of
// the budget went back and no prefetch runs.
func (r *ownRun) result(t *testing.T) outcome {
	t.Helper()
	select {
	case res := <-r.res:
		r.c.goroutines.Wait()
		if n := r.c.budget.buffered(); n != 0 {
			t.Errorf("%d bytes of the budget still held after own returned", n)
		}
		return res
	case <-time.After(5 * time.Second):
		t.Fatal("own did not return within 5s")
	}
	return 0
}

// end ends the subscription and checks that own stopped.
func (r *ownRun) end(t *testing.T) {
	t.Helper()
	r.stop()
	if res := r.result(t); res != stopped {
		t.Fatalf("own returned %d after the subscription ended, want stopped (%d)", res, stopped)
	}
}

func attemptOf(msg *message.Message) string { return msg.Metadata.Get(DeliveryAttemptMetadata) }

// TestOwnNackAndAttempts: the first message of a claim carries the row's
// count of its deliveries, a Nack delivers the same message again with
// the next attempt, after an Ack the next message is attempt 1, and each
// Ack is committed (CommitBatch 1) before the consumer waits for news.
func TestOwnNackAndAttempts(t *testing.T) {
	t.Parallel()
	m1, m2 := testMessage(1, 10), testMessage(2, 10)
	store := newFakeConsumerStore(m1, m2)
	store.head = 2 // two claims handed m1 out before, unacked
	r := startOwn(t, store, testSettings, newByteBudget(1<<20), false)

	msg := r.next(t)
	if msg.UUID != "m1" || attemptOf(msg) != "3" {
		t.Fatalf("first delivery: %s attempt %s, want m1 attempt 3", msg.UUID, attemptOf(msg))
	}
	msg.Nack()
	msg = r.next(t)
	if msg.UUID != "m1" || attemptOf(msg) != "4" {
		t.Fatalf("after a Nack: %s attempt %s, want m1 attempt 4", msg.UUID, attemptOf(msg))
	}
	msg.Ack()
	msg = r.next(t)
	if msg.UUID != "m2" || attemptOf(msg) != "1" {
		t.Fatalf("after an Ack: %s attempt %s, want m2 attempt 1", msg.UUID, attemptOf(msg))
	}
	msg.Ack()
	if pos := r.waitIdle(t); pos != m2.pos {
		t.Fatalf("waits for news after %v, want %v", pos, m2.pos)
	}
	if _, committed := store.commitCalls(); !slices.Equal(committed, []Position{m1.pos, m2.pos}) {
		t.Fatalf("committed %v, want each Ack's position", committed)
	}
	if store.head != 3 {
		t.Fatalf("the head's deliveries were counted %d times, want once per claim", store.head-2)
	}
	r.end(t)
}

// TestOwnYieldsMidBatch: asked for the topic back while a message of its
// batch is out, the consumer waits for that message's Ack, hands nothing
// more out and yields with the Ack's position for the release to write;
// the rest of the batch goes back to the budget.
func TestOwnYieldsMidBatch(t *testing.T) {
	t.Parallel()
	m1, m2, m3 := testMessage(1, 10), testMessage(2, 10), testMessage(3, 10)
	settings := testSettings
	settings.commitBatch = 100 // the release writes the position
	r := startOwn(t, newFakeConsumerStore(m1, m2, m3), settings, newByteBudget(1<<20), false)

	msg := r.next(t)
	close(r.yield)
	msg.Ack()
	if res := r.result(t); res != yielded {
		t.Fatalf("own returned %d, want yielded (%d)", res, yielded)
	}
	if r.cl.acked != m1.pos || !r.cl.dirty() {
		t.Fatalf("claim at %v (dirty %v), want the Ack's position %v, not committed yet", r.cl.acked, r.cl.dirty(), m1.pos)
	}
	select {
	case msg := <-r.c.out:
		t.Fatalf("%s handed out after the yield", msg.UUID)
	default:
	}
}

// TestOwnCommitFails: a commit refused by the fence (the row was taken
// over) ends the delivery at once, with nothing more handed out; one that
// cannot reach the database is retried and delivery goes on.
func TestOwnCommitFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		want    outcome
		commits int
	}{
		{name: "fenced", err: fmt.Errorf("commit offset for topic %q (epoch 1): %w", "t", ErrOwnershipLost), want: lost, commits: 1},
		{name: "unreachable", err: errors.New("dial tcp: connection refused"), want: proceed, commits: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m1, m2 := testMessage(1, 10), testMessage(2, 10)
			store := newFakeConsumerStore(m1, m2)
			store.failNext("commit", tc.err)
			r := startOwn(t, store, testSettings, newByteBudget(1<<20), false)
			r.next(t).Ack()
			if tc.want == lost {
				if res := r.result(t); res != lost {
					t.Fatalf("own returned %d, want lost (%d)", res, lost)
				}
			} else {
				r.next(t).Ack()
				r.waitIdle(t)
			}
			commits, committed := store.commitCalls()
			if commits != tc.commits {
				t.Fatalf("%d commit calls, want %d", commits, tc.commits)
			}
			if tc.want == lost {
				if len(committed) != 0 {
					t.Fatalf("committed %v after the fence refused", committed)
				}
				return
			}
			if !slices.Equal(committed, []Position{m1.pos, m2.pos}) {
				t.Fatalf("committed %v, want %v and %v", committed, m1.pos, m2.pos)
			}
			r.end(t)
		})
	}
}

// TestOwnDatabaseWentBack: a read that finds the database elsewhere than
// where the claim's session was made drops the session generation (every
// position held in memory goes with it) and ends the delivery; any other
// read error is retried.
func TestOwnDatabaseWentBack(t *testing.T) {
	t.Parallel()
	m1 := testMessage(1, 10)
	store := newFakeConsumerStore(m1)
	store.failNext("read", errors.New("read messages of topic \"t\": connection reset"),
		fmt.Errorf("read messages of topic %q after 0:0: %w", "t", pgsql.ErrWentBack))
	r := startOwn(t, store, testSettings, newByteBudget(1<<20), false)
	if res := r.result(t); res != lost {
		t.Fatalf("own returned %d, want lost (%d)", res, lost)
	}
	if !r.g.isLost() {
		t.Fatal("the session generation is still trusted after the database went back")
	}
	if n := len(store.afters()); n != 2 {
		t.Fatalf("%d reads, want 2 (the failed one retried)", n)
	}
}

// TestOwnMessageLargerThanAReservation: a message larger than what one
// read reserves (an eighth of the budget), or than the whole budget, is
// read without its payload first, then alone once its size is reserved,
// and delivered whole; the budget holds none of it once it is handed out.
func TestOwnMessageLargerThanAReservation(t *testing.T) {
	t.Parallel()
	const budget = 800 // reservations of 100 bytes; BatchSize 10: whole up to 10 bytes
	for _, size := range []int{500, 2000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			big, after := testMessage(1, size), testMessage(2, 5)
			store := newFakeConsumerStore(big, after)
			r := startOwn(t, store, testSettings, newByteBudget(budget), false)
			msg := r.next(t)
			if msg.UUID != "m1" || len(msg.Payload) != size {
				t.Fatalf("handed out %s with %d bytes, want m1 whole (%d)", msg.UUID, len(msg.Payload), size)
			}
			// The consumer gives the bytes back right after the channel
			// took the message: wait for it rather than race it.
			waitUntil(t, func() bool { return r.c.budget.buffered() == 0 })
			msg.Ack()
			if msg := r.next(t); msg.UUID != "m2" {
				t.Fatalf("then %s, want m2", msg.UUID)
			}
			store.mu.Lock()
			first, second := store.reads[0], store.reads[1]
			store.mu.Unlock()
			if first.limit != 10 || first.wholeUpTo != 10 || second.limit != 1 || second.wholeUpTo != int64(size) {
				t.Fatalf("reads %+v then %+v; want 10 messages whole up to 10 bytes, then the one message whole", first, second)
			}
			r.end(t)
		})
	}
}

// TestOwnPrefetch: while a full batch is handed out, the next one is read
// (when the pool allows it), and used as it is once the batch is acked:
// no message is read twice. Without prefetch each batch is read when the
// last one is done.
func TestOwnPrefetch(t *testing.T) {
	t.Parallel()
	m := []storedMessage{testMessage(1, 10), testMessage(2, 10), testMessage(3, 10), testMessage(4, 10)}
	for _, tc := range []struct {
		prefetch bool
		reads    []Position
	}{
		// The prefetch after m4 finds nothing and is not kept: fetch reads
		// again before the consumer waits for news.
		{prefetch: true, reads: []Position{{}, m[1].pos, m[3].pos, m[3].pos}},
		{prefetch: false, reads: []Position{{}, m[1].pos, m[3].pos}},
	} {
		t.Run(fmt.Sprintf("prefetch=%v", tc.prefetch), func(t *testing.T) {
			t.Parallel()
			settings := testSettings
			settings.batchSize = 2
			store := newFakeConsumerStore(m...)
			r := startOwn(t, store, settings, newByteBudget(1<<20), tc.prefetch)
			for i := range m {
				msg := r.next(t)
				if msg.UUID != m[i].uuid {
					t.Fatalf("message %d is %s, want %s", i, msg.UUID, m[i].uuid)
				}
				msg.Ack()
			}
			r.waitIdle(t)
			if got := store.afters(); !slices.Equal(got, tc.reads) {
				t.Fatalf("reads after %v, want %v", got, tc.reads)
			}
			r.end(t)
		})
	}
}
