package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// These tests need no database: group members run their steps against
// fakeGroupStore, an in-memory sessions and offsets table, and the tests
// play the consumers.

// fakeGroupStore is the sessions and offsets tables of one group, as the
// group members' statements see them. Safe for concurrent use.
type fakeGroupStore struct {
	mu       sync.Mutex
	counts   map[string]int        // partition counts of created topics
	owner    map[rowKey]uuid.UUID  // the offset rows; uuid.Nil: free
	epoch    map[rowKey]int64      // bumped on every claim
	future   map[rowKey]bool       // rows whose position lies ahead
	sessions map[uuid.UUID]*member // live sessions
	released []rowKey              // rows released by releaseOffset
	fail     map[string]error      // the next call of a method fails with its error
	// lostReply, when set, is what the next claim returns after it
	// committed, as if its reply had been lost.
	lostReply error
	calls     map[string]int         // calls per method
	created   map[rowKey]bool        // rows ensureOffsets created
	claimed   map[uuid.UUID][]rowKey // rows each session's claims took
}

func newFakeGroupStore() *fakeGroupStore {
	return &fakeGroupStore{counts: map[string]int{}, owner: map[rowKey]uuid.UUID{}, epoch: map[rowKey]int64{},
		future: map[rowKey]bool{}, sessions: map[uuid.UUID]*member{}, fail: map[string]error{},
		calls: map[string]int{}, created: map[rowKey]bool{}, claimed: map[uuid.UUID][]rowKey{}}
}

// call counts a call of method and returns the failure set for it.
func (f *fakeGroupStore) call(method string) error {
	f.calls[method]++
	err := f.fail[method]
	delete(f.fail, method)
	return err
}

// join makes a live session of this release, ranked after those before
// it.
func (f *fakeGroupStore) join(id uuid.UUID) *sessionGen {
	return f.joinAs(id, groupProtocol)
}

// joinAs is join for a session that follows protocol.
func (f *fakeGroupStore) joinAs(id uuid.UUID, protocol int) *sessionGen {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions[id] = &member{id: id, createdAt: t0.Add(time.Duration(len(f.sessions)) * time.Second),
		expiresAt: t0.Add(time.Hour), protocol: protocol}
	g := &sessionGen{id: id, lost: make(chan struct{})}
	g.trustUntil.Store(math.MaxInt64)
	return g
}

// leave ends a session, as its expiry and a claimer's delete do: its rows
// are free.
func (f *fakeGroupStore) leave(id uuid.UUID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sessions, id)
}

func (f *fakeGroupStore) partitionCounts(_ context.Context, topics []string) (map[string]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("partitionCounts"); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, t := range topics {
		out[t] = max(f.counts[t], 1)
	}
	return out, nil
}

func (f *fakeGroupStore) ensureOffsets(_ context.Context, rows []rowKey, _ bool) ([]createdRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ensureOffsets"); err != nil {
		return nil, err
	}
	var out []createdRow
	for _, r := range rows {
		if _, ok := f.owner[r]; !ok {
			f.owner[r] = uuid.Nil
			f.created[r] = true
			out = append(out, createdRow{row: r})
		}
	}
	return out, nil
}

func (f *fakeGroupStore) claimOffsets(_ context.Context, rows []rowKey, g *sessionGen, limit int) ([]claimedRow, error) {
	session := g.id
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("claimOffsets"); err != nil {
		return nil, err
	}
	var out []claimedRow
	for _, r := range rows {
		if len(out) == limit {
			break
		}
		o, ok := f.owner[r]
		switch {
		case !ok:
			out = append(out, claimedRow{kind: claimMissing, row: r})
		case o != uuid.Nil && o != session && f.sessions[o] != nil:
			// owned by a live session: not a candidate
		case f.future[r]:
			out = append(out, claimedRow{kind: claimFuture, row: r})
		default:
			f.owner[r] = session
			f.epoch[r]++
			f.claimed[session] = append(f.claimed[session], r)
			cr := claimedRow{kind: claimTaken, row: r, claim: &claim{topic: r.topic, partition: r.partition, sessionID: session, g: g, epoch: f.epoch[r]}}
			if o != uuid.Nil && o != session {
				cr.previous = o
			}
			out = append(out, cr)
		}
	}
	if err := f.lostReply; err != nil {
		f.lostReply = nil
		return nil, err
	}
	return out, nil
}

func (f *fakeGroupStore) releaseOffset(c *claim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("releaseOffset"); err != nil {
		return err
	}
	r := c.row()
	if f.owner[r] != c.sessionID || f.epoch[r] != c.epoch {
		return ErrOwnershipLost
	}
	f.owner[r] = uuid.Nil
	f.released = append(f.released, r)
	return nil
}

func (f *fakeGroupStore) setSubscriptions(g *sessionGen, set rowSet) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("setSubscriptions"); err != nil {
		return false, err
	}
	s := f.sessions[g.id]
	if s == nil {
		return false, nil
	}
	s.set, s.size = set.hash, set.size
	return true, nil
}

func (f *fakeGroupStore) offsetOwners(_ context.Context, topics []string) (map[rowKey]rowOwner, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("offsetOwners"); err != nil {
		return nil, err
	}
	out := map[rowKey]rowOwner{}
	for r, o := range f.owner {
		if slices.Contains(topics, r.topic) {
			out[r] = rowOwner{session: o, epoch: f.epoch[r]}
		}
	}
	return out, nil
}

func (f *fakeGroupStore) groupMembers() ([]member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("groupMembers"); err != nil {
		return nil, err
	}
	var out []member
	for _, s := range f.sessions {
		out = append(out, *s)
	}
	slices.SortFunc(out, memberBefore)
	return out, nil
}

// ownedBy returns the rows id owns, in row order.
func (f *fakeGroupStore) ownedBy(id uuid.UUID) []rowKey {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []rowKey
	for r, o := range f.owner {
		if o == id {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, compareRows)
	return out
}

// fakeSub is a subscription: grow registers a consumer per new partition
// with the member, as the consumers started by subscription.grow do.
type fakeSub struct {
	m          *groupMember
	topic      string
	mu         sync.Mutex
	partitions int
	consumers  []*consumer
	stopped    bool
}

func (s *fakeSub) subTopic() string { return s.topic }
func (s *fakeSub) stop()            { s.mu.Lock(); s.stopped = true; s.mu.Unlock() }
func (s *fakeSub) partitionCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.partitions
}

func (s *fakeSub) grow(n int) int {
	s.mu.Lock()
	if n <= s.partitions {
		s.mu.Unlock()
		return n
	}
	from := s.partitions
	var cs []*consumer
	for p := from; p < n; p++ {
		cs = append(cs, &consumer{topic: s.topic, partition: int32(p), grant: make(chan grant, 1)})
	}
	s.consumers = append(s.consumers, cs...)
	s.partitions = n
	s.mu.Unlock()
	for _, c := range cs {
		s.m.register(c)
	}
	return from
}

// testMember is a group member of store under session g, with a clock the
// test sets.
type testMember struct {
	*groupMember
	g     *sessionGen
	store *fakeGroupStore
	subs  []*fakeSub
	clock time.Time
}

// testGrace is the test members' wait before they claim free rows beyond
// their caps, on their clocks.
const testGrace = 500 * time.Millisecond

func newTestMember(store *fakeGroupStore, id byte) *testMember {
	tm := &testMember{store: store, clock: t0}
	tm.g = store.join(uuid.UUID{id})
	tm.groupMember = newGroupMember(memberDeps{group: "g", pollInterval: time.Second, logger: watermill.NopLogger{},
		stats: newSubscriberStats(nil), store: store, now: func() time.Time { return tm.clock }, freeGrace: testGrace})
	return tm
}

func (tm *testMember) subscribe(topics ...string) {
	for _, t := range topics {
		s := &fakeSub{m: tm.groupMember, topic: t}
		tm.subs = append(tm.subs, s)
		tm.addSubscription(s)
	}
}

// step runs the member's steps until it wants no immediate next one, and
// returns the wait it asked for and the error of the last step.
func (tm *testMember) step(t *testing.T) (time.Duration, error) {
	t.Helper()
	for range 100 {
		next, err := tm.groupMember.step(context.Background(), tm.g)
		if err != nil || next != time.Millisecond {
			return next, err
		}
	}
	t.Fatal("the member keeps asking for another step at once")
	return 0, nil
}

func (tm *testMember) mustStep(t *testing.T) time.Duration {
	t.Helper()
	next, err := tm.step(t)
	if err != nil {
		t.Fatalf("step: %v", err)
	}
	return next
}

// take plays the consumers: each takes the grant sent to it. It returns
// the rows granted, in row order.
func (tm *testMember) take() []rowKey {
	var out []rowKey
	for _, s := range tm.subs {
		for _, c := range s.consumers {
			select {
			case gr := <-c.grant:
				out = append(out, gr.cl.row())
			default:
			}
		}
	}
	slices.SortFunc(out, compareRows)
	return out
}

// giveUp plays the consumers asked to yield: each releases its row and
// goes back to waiting. It returns the rows given up, in row order.
func (tm *testMember) giveUp(t *testing.T) []rowKey {
	t.Helper()
	var out []rowKey
	tm.mu.Lock()
	var asked []*held
	for _, h := range tm.owning {
		select {
		case <-h.yield:
			asked = append(asked, h)
		default:
		}
	}
	tm.mu.Unlock()
	for _, h := range asked {
		r := h.c.row()
		tm.store.mu.Lock()
		tm.store.owner[r] = uuid.Nil
		tm.store.mu.Unlock()
		tm.disown(h.c)
		out = append(out, r)
	}
	slices.SortFunc(out, compareRows)
	return out
}

func (tm *testMember) owned() int { return tm.ownedRows() }

func topicNames(n int) []string {
	ts := make([]string, n)
	for i := range ts {
		ts[i] = fmt.Sprintf("t%02d", i)
	}
	return ts
}

// TestMemberAloneClaimsEverything: a member alone in its group resolves
// its topics' partitions, creates their rows, publishes its set, and
// claims and grants every row in one statement, then sleeps until woken.
func TestMemberAloneClaimsEverything(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	store.counts["p"] = 3
	m := newTestMember(store, 1)
	m.subscribe("a", "b", "p")
	if next := m.mustStep(t); next != 0 {
		t.Errorf("next wake %s, want 0 (only when woken)", next)
	}
	want := append(append(rows("a", 0), rows("b", 0)...), rows("p", 0, 1, 2)...)
	if got := m.take(); !slices.Equal(got, want) {
		t.Fatalf("granted %v, want %v", got, want)
	}
	if got := store.ownedBy(m.g.id); !slices.Equal(got, want) {
		t.Errorf("the store has it own %v, want %v", got, want)
	}
	if len(store.created) != 5 || store.calls["claimOffsets"] != 1 || store.calls["ensureOffsets"] != 1 {
		t.Errorf("created %d rows with %d statements, %d claim statements; want 5, 1, 1",
			len(store.created), store.calls["ensureOffsets"], store.calls["claimOffsets"])
	}
	// Nothing changed: another step runs no statement.
	before := fmt.Sprint(store.calls)
	m.mustStep(t)
	if after := fmt.Sprint(store.calls); after != before {
		t.Errorf("an idle step ran statements: %s, then %s", before, after)
	}
}

// TestMembersSplitAndRebalance plays a group through joins and a leave:
// the caps by rank add up to the rows, a joiner is served by the surplus
// of the others (given up, never taken), and a member that leaves has its
// rows claimed by the others.
func TestMembersSplitAndRebalance(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	topics := topicNames(7)
	a := newTestMember(store, 1)
	a.subscribe(topics...)
	a.mustStep(t)
	if got := len(a.take()); got != 7 {
		t.Fatalf("a alone got %d rows, want 7", got)
	}

	// b joins: its first step finds every row owned by a live session.
	b := newTestMember(store, 2)
	b.subscribe(topics...)
	if next := b.mustStep(t); next != time.Second {
		t.Errorf("b below its share waits %s, want the poll interval", next)
	}
	if got := b.take(); len(got) != 0 {
		t.Fatalf("b took %v from a live member", got)
	}
	// a learns of b (its notification): it gives up 3, newest first.
	a.membersChanged()
	a.mustStep(t)
	if got := a.giveUp(t); len(got) != 3 {
		t.Fatalf("a gave up %v, want 3 rows", got)
	}
	b.mustStep(t)
	if got := len(b.take()); got != 3 {
		t.Fatalf("b got %d rows, want 3", got)
	}
	if a.owned() != 4 || b.owned() != 3 {
		t.Fatalf("owned %d and %d, want 4 and 3 (the older member takes the extra row)", a.owned(), b.owned())
	}

	// c joins: 3, 2, 2.
	c := newTestMember(store, 3)
	c.subscribe(topics...)
	c.mustStep(t)
	for _, x := range []*testMember{a, b} {
		x.membersChanged()
		x.mustStep(t)
		x.giveUp(t)
	}
	c.mustStep(t)
	c.take()
	if got := []int{a.owned(), b.owned(), c.owned()}; !slices.Equal(got, []int{3, 2, 2}) {
		t.Fatalf("owned %v, want [3 2 2]", got)
	}

	// b leaves (its session expired): a and c take its rows at their
	// caps, 4 and 3.
	store.leave(b.g.id)
	for _, x := range []*testMember{a, c} {
		x.membersChanged()
		x.mustStep(t)
		x.take()
	}
	if got := []int{a.owned(), c.owned()}; !slices.Equal(got, []int{4, 3}) {
		t.Fatalf("after b left, owned %v, want [4 3]", got)
	}
	// Every row is owned, by a or c only.
	seen := map[rowKey]bool{}
	for _, x := range []*testMember{a, c} {
		for _, r := range store.ownedBy(x.g.id) {
			seen[r] = true
		}
	}
	if len(seen) != 7 {
		t.Errorf("%d of 7 rows owned by live members", len(seen))
	}
}

// TestMemberCannotReachTheStore: a member whose statements fail keeps its
// state and retries; a claim whose reply was lost is claimed again first
// (and what it took granted), while one the server rejected is not.
func TestMemberCannotReachTheStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		method    string
		err       error
		unsettled bool
	}{
		{name: "partition counts", method: "partitionCounts", err: errors.New("connection refused")},
		{name: "ensure rows", method: "ensureOffsets", err: errors.New("connection refused")},
		{name: "publish the set", method: "setSubscriptions", err: errors.New("connection refused")},
		{name: "read the members", method: "groupMembers", err: errors.New("i/o timeout")},
		{name: "claim never sent", method: "claimOffsets", err: fmt.Errorf("claim topics: %w: %w", errNotSent, context.Canceled)},
		{name: "claim rejected by the server", method: "claimOffsets", err: &pgconn.PgError{Code: "40P01"}},
		{name: "claim reply lost", method: "claimOffsets", err: errors.New("unexpected EOF"), unsettled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newFakeGroupStore()
			m := newTestMember(store, 1)
			m.subscribe("a", "b")
			store.fail[tc.method] = tc.err
			if _, err := m.step(t); !errors.Is(err, tc.err) {
				t.Fatalf("step returned %v, want %v", err, tc.err)
			}
			m.mu.Lock()
			unsettled := len(m.unsettled)
			m.mu.Unlock()
			if (unsettled > 0) != tc.unsettled {
				t.Fatalf("%d unsettled rows after the failure, want them: %v", unsettled, tc.unsettled)
			}
			if got := m.take(); len(got) != 0 {
				t.Fatalf("granted %v after a failed step", got)
			}
			// The store answers again: the next step gets there.
			claims := store.calls["claimOffsets"]
			m.mustStep(t)
			if got := m.take(); !slices.Equal(got, append(rows("a", 0), rows("b", 0)...)) {
				t.Fatalf("after recovery granted %v", got)
			}
			// One statement: the unsettled rows are all it waits for.
			if got := store.calls["claimOffsets"] - claims; got != 1 {
				t.Errorf("%d claim statements after recovery, want 1", got)
			}
		})
	}
}

// TestMemberSettlesALostClaimReply: a claim that committed but whose
// reply was lost is claimed again first (the same session may); what it
// takes is granted if still waited for, else released.
func TestMemberSettlesALostClaimReply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		ended bool // the subscription ended before the retry
	}{{name: "still waited for: granted"}, {name: "subscription ended: released", ended: true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newFakeGroupStore()
			m := newTestMember(store, 1)
			m.subscribe("a", "b")
			lost := errors.New("read tcp: connection reset by peer")
			store.lostReply = lost
			if _, err := m.step(t); !errors.Is(err, lost) {
				t.Fatalf("step returned %v, want the lost reply", err)
			}
			if got := store.ownedBy(m.g.id); len(got) != 2 {
				t.Fatalf("the claim committed %v", got)
			}
			if got := m.take(); len(got) != 0 {
				t.Fatalf("granted %v without a reply", got)
			}
			if tc.ended {
				for _, c := range m.subs[0].consumers {
					m.unregister(c)
				}
			}
			m.mustStep(t)
			got := m.take()
			switch {
			case tc.ended && (!slices.Equal(got, rows("b", 0)) || !slices.Equal(store.released, rows("a", 0))):
				t.Fatalf("granted %v, released %v; want b/0 granted, a/0 released", got, store.released)
			case !tc.ended && (!slices.Equal(got, append(rows("a", 0), rows("b", 0)...)) || len(store.released) != 0):
				t.Fatalf("granted %v, released %v; want both granted", got, store.released)
			}
			m.mu.Lock()
			unsettled := len(m.unsettled)
			m.mu.Unlock()
			if unsettled != 0 {
				t.Errorf("%d rows still unsettled", unsettled)
			}
		})
	}
}

// TestMemberRecreatesMissingRows: a claim that finds a row missing has
// every subscribed partition of its topic created again, then claimed.
func TestMemberRecreatesMissingRows(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	store.counts["p"] = 3
	m := newTestMember(store, 1)
	m.subscribe("p")
	m.mustStep(t)
	if got := m.take(); len(got) != 3 {
		t.Fatalf("granted %v", got)
	}
	// The group's rows are deleted by hand; the member holds p/1 and
	// p/2 still (they have nothing to commit) and p/0 comes back to it.
	c := m.subs[0].consumers[0]
	m.disown(c)
	store.mu.Lock()
	clear(store.owner)
	clear(store.created)
	store.mu.Unlock()
	m.mustStep(t)
	if got := m.take(); !slices.Equal(got, rows("p", 0)) {
		t.Fatalf("granted %v, want p/0 once created again", got)
	}
	store.mu.Lock()
	created := len(store.created)
	store.mu.Unlock()
	if created != 3 {
		t.Errorf("created %d rows again, want every partition of the topic (3)", created)
	}
}

// TestMemberHoldsBackAFuturePosition: a row refused for a position ahead
// of the transaction counter is not claimed again until its hold ends.
func TestMemberHoldsBackAFuturePosition(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	m := newTestMember(store, 1)
	m.subscribe("a", "b")
	store.future[rowKey{topic: "a"}] = true
	m.mustStep(t)
	if got := m.take(); !slices.Equal(got, rows("b", 0)) {
		t.Fatalf("granted %v, want b/0", got)
	}
	claims := store.calls["claimOffsets"]
	m.membersChanged()
	m.mustStep(t)
	if got := store.calls["claimOffsets"]; got != claims {
		t.Fatalf("claimed a held row again (%d claim statements, want %d)", got, claims)
	}
	store.future[rowKey{topic: "a"}] = false
	m.clock = m.clock.Add(time.Second)
	m.mustStep(t)
	if got := m.take(); !slices.Equal(got, rows("a", 0)) {
		t.Fatalf("after the hold granted %v, want a/0", got)
	}
}

// TestMemberResolvesRaisedPartitions: a raised partition count starts the
// new partitions' consumers only, creates their rows, and claims them; a
// mark made while a read ran is not cleared by it.
func TestMemberResolvesRaisedPartitions(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	store.counts["p"] = 2
	m := newTestMember(store, 1)
	m.subscribe("p")
	m.mustStep(t)
	m.take()
	store.mu.Lock()
	store.counts["p"] = 4
	store.mu.Unlock()
	topic := "p"
	m.topicChanged(&topic)
	m.mustStep(t)
	if got := m.take(); !slices.Equal(got, rows("p", 2, 3)) {
		t.Fatalf("granted %v, want the new partitions p/2 and p/3", got)
	}
	if n := m.subs[0].partitionCount(); n != 4 {
		t.Errorf("the subscription consumes %d partitions, want 4", n)
	}
	m.mu.Lock()
	left := len(m.unresolved)
	m.mu.Unlock()
	if left != 0 {
		t.Errorf("%d subscriptions left unresolved", left)
	}
}

// TestMemberGroupsWithDifferentSets: members that subscribe to different
// sets split each set among its own subscribers.
func TestMemberGroupsWithDifferentSets(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	a := newTestMember(store, 1)
	a.subscribe("x", "y")
	a.mustStep(t)
	b := newTestMember(store, 2)
	b.subscribe("x", "y", "z")
	b.mustStep(t)
	a.membersChanged()
	a.mustStep(t)
	// a is alone with its set: it keeps both rows; b alone with its own
	// may own 3 but only z is free.
	if got := a.giveUp(t); len(got) != 0 {
		t.Errorf("a gave up %v", got)
	}
	if got := b.take(); !slices.Equal(got, rows("z", 0)) {
		t.Errorf("b granted %v, want z/0", got)
	}
}

// TestMembersSpreadAPartitionedTopic: two members of a group that
// subscribes to a topic of 4 partitions and two plain topics own 2
// partitions and 1 plain topic each, whoever held what before, and a
// third member that joins gets its part of the partitioned topic too.
func TestMembersSpreadAPartitionedTopic(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	store.counts["orders"] = 4
	split := func(ms ...*testMember) [][2]int {
		var out [][2]int
		for _, m := range ms {
			var orders, plain int
			for _, r := range store.ownedBy(m.g.id) {
				if r.topic == "orders" {
					orders++
				} else {
					plain++
				}
			}
			out = append(out, [2]int{orders, plain})
		}
		return out
	}
	a := newTestMember(store, 1)
	a.subscribe("orders", "x", "y")
	a.mustStep(t)
	a.take()
	b := newTestMember(store, 2)
	b.subscribe("orders", "x", "y")
	b.mustStep(t)
	a.membersChanged()
	a.mustStep(t)
	a.giveUp(t)
	b.mustStep(t)
	b.take()
	if got := split(a, b); !slices.Equal(got, [][2]int{{2, 1}, {2, 1}}) {
		t.Fatalf("(orders, plain) owned %v, want 2 and 1 each", got)
	}

	c := newTestMember(store, 3)
	c.subscribe("orders", "x", "y")
	for range 3 {
		for _, m := range []*testMember{c, a, b} {
			m.membersChanged()
			m.mustStep(t)
			m.giveUp(t)
			m.take()
		}
	}
	got := split(a, b, c)
	total := 0
	for i, s := range got {
		if s[0] < 1 || s[0] > 2 || s[0]+s[1] != 2 {
			t.Errorf("member %d owns %d of orders and %d plain, want 1 or 2 of orders and 2 rows in all", i, s[0], s[1])
		}
		total += s[0]
	}
	if total != 4 {
		t.Errorf("%d partitions of orders owned, want 4: %v", total, got)
	}
}

// TestMixedGroupTakesAFreeRowAfterTheGrace: a group of a member of an
// earlier release (protocol 1), which holds its share (2) as a total, and
// two of this one, on a topic of 4 partitions and one of one row. The old
// member holds orders/0 and s; the new ones hold their caps of orders (1
// each; the second ranked would also have s, which the old member holds):
// a partition of orders is in nobody's caps. It is left to the others
// for the grace, then taken as extra and kept while the group stays as
// it is. When the old member leaves, the extra row is counted again, and
// the two members split the rows by their caps: every row owned, once.
func TestMixedGroupTakesAFreeRowAfterTheGrace(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	store.counts["orders"] = 4
	topics := []string{"orders", "s"}
	all := append(rows("orders", 0, 1, 2, 3), rows("s", 0)...)
	old := uuid.UUID{9}
	oldSet := rowSet{}
	for _, r := range all {
		oldSet.add(r.topic, r.partition)
	}
	store.joinAs(old, 1)
	store.mu.Lock()
	store.sessions[old].set, store.sessions[old].size = oldSet.hash, oldSet.size
	for _, r := range append(rows("orders", 0), rows("s", 0)...) {
		store.owner[r] = old
	}
	store.mu.Unlock()

	a, b := newTestMember(store, 1), newTestMember(store, 2)
	a.subscribe(topics...)
	b.subscribe(topics...)
	stepAll := func() {
		for range 3 {
			for _, m := range []*testMember{a, b} {
				m.membersChanged()
				m.mustStep(t)
				m.giveUp(t)
				m.take()
			}
		}
	}
	freeRows := func() []rowKey {
		store.mu.Lock()
		defer store.mu.Unlock()
		var out []rowKey
		for _, r := range all {
			if store.owner[r] == uuid.Nil {
				out = append(out, r)
			}
		}
		return out
	}
	stepAll()
	if got := append(store.ownedBy(a.g.id), store.ownedBy(b.g.id)...); len(got) != 2 {
		t.Fatalf("the new members own %v, want one partition of orders each", got)
	}
	lone := freeRows()
	if len(lone) != 1 || lone[0].topic != "orders" {
		t.Fatalf("free rows %v before the grace, want one partition of orders", lone)
	}
	free := lone[0]

	// The grace passes: one of them takes it, and neither gives it up.
	for _, m := range []*testMember{a, b} {
		m.clock = m.clock.Add(testGrace)
	}
	stepAll()
	store.mu.Lock()
	owner := store.owner[free]
	store.mu.Unlock()
	if owner != a.g.id && owner != b.g.id {
		t.Fatalf("%v owned by %v after the grace, want a new member", free, owner)
	}
	for _, m := range []*testMember{a, b} {
		m.clock = m.clock.Add(time.Minute)
	}
	stepAll()
	store.mu.Lock()
	again := store.owner[free]
	store.mu.Unlock()
	if again != owner || len(store.released) != 0 {
		t.Fatalf("%v went from %v to %v (released %v): an extra row must stay while the group does", free, owner, again, store.released)
	}

	// The old member leaves, releasing its rows.
	store.mu.Lock()
	for _, r := range append(rows("orders", 0), rows("s", 0)...) {
		store.owner[r] = uuid.Nil
	}
	store.mu.Unlock()
	store.leave(old)
	stepAll()
	seen := map[rowKey]uuid.UUID{}
	for _, m := range []*testMember{a, b} {
		for _, r := range store.ownedBy(m.g.id) {
			seen[r] = m.g.id
		}
	}
	if len(seen) != 5 {
		t.Fatalf("after the old member left, %d of 5 rows owned: %v", len(seen), seen)
	}
	split := map[uuid.UUID]int{}
	for r, id := range seen {
		if r.topic == "orders" {
			split[id]++
		}
	}
	if split[a.g.id] != 2 || split[b.g.id] != 2 {
		t.Errorf("orders split %d and %d, want 2 each", split[a.g.id], split[b.g.id])
	}
}

// TestGroupOfOneVersionClaimsNothingBeyondItsCaps: in a group whose
// members all follow this release's rules, the caps add up to the rows,
// and a member never claims beyond its caps, grace or not: a row in the
// caps of a member that has not claimed it yet is left to it.
func TestGroupOfOneVersionClaimsNothingBeyondItsCaps(t *testing.T) {
	t.Parallel()
	store := newFakeGroupStore()
	store.counts["orders"] = 4
	a := newTestMember(store, 1)
	a.subscribe("orders")
	store.join(uuid.UUID{2}) // a member that has not published its set yet: another set
	a.mustStep(t)
	if got := a.take(); len(got) != 4 {
		t.Fatalf("a got %v, want every partition (alone in its set)", got)
	}
	// b, of the same set, joins; a gives up two, and time passes before b
	// claims: a takes none of them back.
	b := newTestMember(store, 3)
	b.subscribe("orders")
	b.mustStep(t) // publishes its set; every row is a's
	a.membersChanged()
	a.mustStep(t)
	if got := a.giveUp(t); len(got) != 2 {
		t.Fatalf("a gave up %v, want 2", got)
	}
	a.clock = a.clock.Add(time.Hour)
	a.membersChanged()
	a.mustStep(t)
	if got := a.take(); len(got) != 0 {
		t.Fatalf("a took %v back beyond its caps", got)
	}
	b.mustStep(t)
	if got := b.take(); len(got) != 2 {
		t.Fatalf("b got %v, want the 2 a gave up", got)
	}
}
