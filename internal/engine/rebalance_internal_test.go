package engine

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// These tests need no database: the decisions of a group member's step
// (rebalance.go), as plain functions.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rows(topic string, partitions ...int32) []rowKey {
	var out []rowKey
	for _, p := range partitions {
		out = append(out, rowKey{topic: topic, partition: p})
	}
	return out
}

// ranked returns n members of one set of size rows, ranked in order.
func ranked(n, size int) []member {
	ms := make([]member, n)
	for i := range ms {
		id := uuid.UUID{byte(i + 1)}
		ms[i] = member{id: id, createdAt: t0.Add(time.Duration(i) * time.Second), set: 7, size: size}
	}
	return ms
}

func TestPlanShare(t *testing.T) {
	t.Parallel()
	held := func(n int) []heldRow {
		var hs []heldRow
		for i := range n {
			hs = append(hs, heldRow{row: rowKey{topic: fmt.Sprintf("t%02d", i)}, since: t0.Add(time.Duration(i) * time.Second)})
		}
		return hs
	}
	idle := func(hs []heldRow, idx ...int) []heldRow {
		for _, i := range idx {
			hs[i].idle = true
		}
		return hs
	}
	topics := func(rs []rowKey) []string {
		var ts []string
		for _, r := range rs {
			ts = append(ts, r.topic)
		}
		return ts
	}
	five := ranked(2, 5)
	seven := ranked(3, 7)
	other := append(ranked(1, 5), member{id: uuid.UUID{9}, createdAt: t0.Add(-time.Hour), set: 8, size: 5})
	for _, tc := range []struct {
		name    string
		members []member
		me      member
		held    []heldRow
		share   int
		owned   int
		want    int
		yield   []string
	}{
		{name: "alone, nothing held: claims every row", members: ranked(1, 4), me: ranked(1, 4)[0],
			share: 4, want: 4},
		{name: "uneven split, the older member takes the extra row", members: five, me: five[0], held: held(1),
			share: 3, owned: 1, want: 2},
		{name: "uneven split, the younger member", members: five, me: five[1], held: held(1),
			share: 2, owned: 1, want: 1},
		{name: "seven rows, three members, last ranked", members: seven, me: seven[2], held: held(2),
			share: 2, owned: 2},
		{name: "at its share: nothing to do", members: five, me: five[1], held: held(2),
			share: 2, owned: 2},
		{name: "a member joined: the rows held the shortest go", members: five, me: five[1], held: held(5),
			share: 2, owned: 2, yield: []string{"t04", "t03", "t02"}},
		{name: "idle rows go first", members: five, me: five[1], held: idle(held(5), 0, 2),
			share: 2, owned: 2, yield: []string{"t02", "t00", "t04"}},
		{name: "ties in row order", members: five, me: five[1],
			held:  []heldRow{{row: rowKey{"b", 1}, since: t0}, {row: rowKey{"b", 0}, since: t0}, {row: rowKey{"a", 0}, since: t0}},
			share: 2, owned: 2, yield: []string{"a"}},
		{name: "more members than rows: the last ranked has none", members: ranked(6, 5), me: ranked(6, 5)[5], held: held(1),
			share: 0, owned: 0, yield: []string{"t00"}},
		{name: "a member of another set does not count", members: other, me: other[0], held: held(2),
			share: 5, owned: 2, want: 3},
		{name: "me missing from the read (it was made before my session showed)", members: ranked(2, 4)[1:], me: ranked(2, 4)[0],
			share: 2, want: 2},
		{name: "the other member left", members: five[1:], me: five[1], held: held(2),
			share: 5, owned: 2, want: 3},
		{name: "subscribed to nothing", members: ranked(1, 0), me: ranked(1, 0)[0]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Topics of one row each.
			p := planShare(tc.members, tc.me, setShape{singles: tc.me.size}, tc.held)
			if p.share != tc.share || p.owned != tc.owned || p.want != tc.want {
				t.Errorf("share %d, owned %d, want %d; expected %d, %d, %d", p.share, p.owned, p.want, tc.share, tc.owned, tc.want)
			}
			if got := topics(p.yield); !slices.Equal(got, tc.yield) {
				t.Errorf("yield %v, expected %v", got, tc.yield)
			}
			if p.owned+len(p.yield) != len(tc.held) {
				t.Errorf("%d kept and %d given up of %d held", p.owned, len(p.yield), len(tc.held))
			}
		})
	}
}

// TestPlanShareEveryRowOwnedOnce: members of one set that each keep what
// planShare lets them keep and claim what it lets them claim end with
// every row owned, none by two, whatever they held before.
func TestPlanShareEveryRowOwnedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ rows, members int }{{1, 1}, {5, 2}, {7, 3}, {10, 4}, {3, 5}, {100, 7}} {
		t.Run(fmt.Sprintf("%d rows %d members", tc.rows, tc.members), func(t *testing.T) {
			t.Parallel()
			ms := ranked(tc.members, tc.rows)
			// Member 0 held everything before the others joined.
			owner := map[rowKey]int{}
			var free []rowKey
			heldBy := func(i int) []heldRow {
				var hs []heldRow
				for r, o := range owner {
					if o == i {
						hs = append(hs, heldRow{row: r, since: t0})
					}
				}
				return hs
			}
			for i := range tc.rows {
				owner[rowKey{topic: fmt.Sprintf("t%03d", i)}] = 0
			}
			for i, m := range ms {
				p := planShare(ms, m, setShape{singles: tc.rows}, heldBy(i))
				for _, r := range p.yield {
					delete(owner, r)
					free = append(free, r)
				}
			}
			slices.SortFunc(free, compareRows)
			for i, m := range ms {
				p := planShare(ms, m, setShape{singles: tc.rows}, heldBy(i))
				if len(p.yield) > 0 {
					t.Fatalf("member %d yields again: %v", i, p.yield)
				}
				n := min(p.want, len(free))
				for _, r := range free[:n] {
					owner[r] = i
				}
				free = free[n:]
			}
			if len(owner) != tc.rows || len(free) != 0 {
				t.Fatalf("%d of %d rows owned, %d free", len(owner), tc.rows, len(free))
			}
			counts := make([]int, tc.members)
			for _, o := range owner {
				counts[o]++
			}
			if lo, hi := slices.Min(counts), slices.Max(counts); hi-lo > 1 {
				t.Errorf("owned per member %v: uneven by more than one", counts)
			}
		})
	}
}

func TestClaimable(t *testing.T) {
	t.Parallel()
	now := t0
	waiting := map[rowKey]bool{}
	for _, r := range append(rows("b", 1, 0), rows("a", 2, 0, 1)...) {
		waiting[r] = true
	}
	for _, tc := range []struct {
		name   string
		future map[rowKey]futureHold
		want   []rowKey
	}{
		{name: "in row order", want: append(rows("a", 0, 1, 2), rows("b", 0, 1)...)},
		{name: "a held row is left alone until its hold ends",
			future: map[rowKey]futureHold{{"a", 1}: {until: now.Add(time.Second)}, {"b", 0}: {until: now}},
			want:   append(rows("a", 0, 2), rows("b", 0, 1)...)},
		{name: "a hold on a row not waited for changes nothing",
			future: map[rowKey]futureHold{{"c", 0}: {until: now.Add(time.Hour)}},
			want:   append(rows("a", 0, 1, 2), rows("b", 0, 1)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := claimable(waiting, tc.future, now); !slices.Equal(got, tc.want) {
				t.Errorf("claimable = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestClaimOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		unknown bool
	}{
		{"no connection before the wait ended: not sent", fmt.Errorf("claim topics: %w: %w", errNotSent, errors.New("context canceled")), false},
		{"the server's error: rolled back", fmt.Errorf("claim topics: %w", &pgconn.PgError{Code: "40P01"}), false},
		{"a timeout after sending", fmt.Errorf("claim topics: %w", errors.New("timeout: context deadline exceeded")), true},
		{"a connection lost mid-statement", errors.New("unexpected EOF"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := claimOutcomeUnknown(tc.err); got != tc.unknown {
				t.Errorf("claimOutcomeUnknown(%v) = %v, want %v", tc.err, got, tc.unknown)
			}
		})
	}
}

func TestFutureHoldDoubles(t *testing.T) {
	t.Parallel()
	var h futureHold
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	now := t0
	for i, w := range want {
		h = h.next(now)
		if h.wait != w*time.Second || !h.until.Equal(now.Add(w*time.Second)) {
			t.Fatalf("refusal %d: wait %s until +%s, want %s", i+1, h.wait, h.until.Sub(now), w*time.Second)
		}
		now = h.until
	}
}

func TestReadDue(t *testing.T) {
	t.Parallel()
	me, other := uuid.UUID{1}, uuid.UUID{2}
	ms := []member{{id: me, expiresAt: t0.Add(time.Hour)}, {id: other, expiresAt: t0.Add(time.Second)}}
	for _, tc := range []struct {
		name    string
		stale   bool
		read    uuid.UUID
		members []member
		now     time.Time
		due     bool
	}{
		{name: "fresh read, nobody expired", read: me, members: ms, now: t0},
		{name: "stale", stale: true, read: me, members: ms, now: t0, due: true},
		{name: "never read", members: nil, now: t0, due: true},
		{name: "read under an older session", read: other, members: ms, now: t0, due: true},
		{name: "another member's expiry passed", read: me, members: ms, now: t0.Add(time.Second), due: true},
		{name: "only my own expiry passed", read: me, members: ms[:1], now: t0.Add(2 * time.Hour)},
		{name: "alone", read: me, members: ms[:1], now: t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := readDue(tc.stale, tc.read, tc.members, me, tc.now); got != tc.due {
				t.Errorf("readDue = %v, want %v", got, tc.due)
			}
		})
	}
}

func TestStandbyWait(t *testing.T) {
	t.Parallel()
	const poll = time.Second
	ms := ranked(2, 4)
	me := ms[0]
	soon, late, past := ms[1], ms[1], ms[1]
	soon.expiresAt = t0.Add(300 * time.Millisecond)
	late.expiresAt = t0.Add(5 * time.Second)
	past.expiresAt = t0.Add(-time.Second)
	for _, tc := range []struct {
		name    string
		waiting bool
		members []member
		owned   int
		wait    time.Duration
	}{
		{name: "nothing waits: only when woken", members: []member{me, soon}, owned: 0, wait: 0},
		{name: "alone at its share: only when woken", waiting: true, members: []member{me}, owned: 4, wait: 0},
		{name: "below its share, no expiry: every poll", waiting: true, members: []member{me}, owned: 1, wait: poll},
		{name: "at its share: just after the other's expiry", waiting: true, members: []member{me, late}, owned: 2, wait: 5*time.Second + standbyMargin},
		{name: "below its share: the poll comes before a late expiry", waiting: true, members: []member{me, late}, owned: 1, wait: poll},
		{name: "below its share: an expiry before the poll", waiting: true, members: []member{me, soon}, owned: 1, wait: 300*time.Millisecond + standbyMargin},
		{name: "an expiry already past: read again soon", waiting: true, members: []member{me, past}, owned: 2, wait: standbyMargin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := standbyWait(tc.waiting, tc.members, me, me.id, tc.owned, poll, t0); got != tc.wait {
				t.Errorf("standbyWait = %s, want %s", got, tc.wait)
			}
		})
	}
}

func TestPartitionRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		from, n int
		want    []rowKey
	}{
		{0, 1, rows("t", 0)},
		{0, 3, rows("t", 0, 1, 2)},
		{2, 4, rows("t", 2, 3)},
		{4, 4, nil}, // the count did not grow
	} {
		if got := partitionRows("t", tc.from, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("partitionRows(%d, %d) = %v, want %v", tc.from, tc.n, got, tc.want)
		}
	}
}

// TestPlanShareSpreadsEachTopic: a member that holds a partitioned topic
// and other topics gives up the partitions above its cap of the topic,
// not merely rows above its share, and claims what its caps allow.
func TestPlanShareSpreadsEachTopic(t *testing.T) {
	t.Parallel()
	shape := shapeOf(map[string]int{"orders": 4, "x": 1, "y": 1})
	two := ranked(2, 6)
	heldOf := func(rs ...rowKey) []heldRow {
		var hs []heldRow
		for _, r := range rs {
			hs = append(hs, heldRow{row: r, since: t0})
		}
		return hs
	}
	all := append(append(rows("orders", 0, 1, 2, 3), rows("x", 0)...), rows("y", 0)...)

	// The older member held everything: it gives up two partitions of
	// orders and one topic of one row (ties in row order).
	p := planShare(two, two[0], shape, heldOf(all...))
	if want := append(rows("orders", 0, 1), rows("x", 0)...); !slices.Equal(p.yield, want) {
		t.Errorf("yield %v, want %v", p.yield, want)
	}
	if p.share != 3 || p.owned != 3 || p.want != 0 {
		t.Errorf("share %d, owned %d, want %d; expected 3, 3, 0", p.share, p.owned, p.want)
	}
	// At its share but with three partitions of orders: it gives one up
	// and may claim a topic of one row instead.
	p = planShare(two, two[1], shape, heldOf(rows("orders", 0, 1, 2)...))
	if !slices.Equal(p.yield, rows("orders", 0)) || p.owned != 2 || p.want != 1 || p.singles != 1 || p.topics["orders"] != 0 {
		t.Errorf("yield %v, owned %d, want %d (orders %d, singles %d); expected [orders/0], 2, 1 (0, 1)",
			p.yield, p.owned, p.want, p.topics["orders"], p.singles)
	}
	// Holding nothing: two of orders and one other topic.
	p = planShare(two, two[1], shape, nil)
	if p.want != 3 || p.topics["orders"] != 2 || p.singles != 1 {
		t.Errorf("want %d (orders %d, singles %d), expected 3 (2, 1)", p.want, p.topics["orders"], p.singles)
	}
	// Stickiness: at its caps it keeps what it holds, whichever rows.
	p = planShare(two, two[0], shape, heldOf(append(rows("orders", 1, 3), rows("y", 0)...)...))
	if len(p.yield) != 0 || p.want != 0 {
		t.Errorf("at its caps: yield %v, want %d", p.yield, p.want)
	}
}

func TestClaimBuckets(t *testing.T) {
	t.Parallel()
	waiting := append(append(append(rows("a", 0), rows("orders", 0, 1, 2, 3)...), rows("p", 0, 1)...), rows("z", 0)...)
	for _, tc := range []struct {
		name string
		plan sharePlan
		want []claimBucket
	}{
		{name: "alone: everything in one bucket",
			plan: sharePlan{want: 8, topics: map[string]int{"orders": 4, "p": 2}, singles: 2},
			want: []claimBucket{{rows: waiting, want: 8}}},
		{name: "two of orders: a bucket of its own",
			plan: sharePlan{want: 5, topics: map[string]int{"orders": 2, "p": 2}, singles: 2},
			want: []claimBucket{
				{rows: append(append(rows("a", 0), rows("p", 0, 1)...), rows("z", 0)...), want: 4},
				{rows: rows("orders", 0, 1, 2, 3), want: 2},
			}},
		{name: "one topic of one row, none of p",
			plan: sharePlan{want: 3, topics: map[string]int{"orders": 2, "p": 0}, singles: 1},
			want: []claimBucket{
				{rows: append(rows("a", 0), rows("z", 0)...), want: 1},
				{rows: rows("orders", 0, 1, 2, 3), want: 2},
			}},
		{name: "nothing", plan: sharePlan{topics: map[string]int{"orders": 0, "p": 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := claimBuckets(waiting, tc.plan)
			if !slices.EqualFunc(got, tc.want, func(a, b claimBucket) bool {
				return a.want == b.want && slices.Equal(a.rows, b.rows)
			}) {
				t.Errorf("buckets %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPlanShareKeepsExtraRows: a member of a group of three that
// subscribes to a topic of 4 partitions and one of one row (the third
// ranked: caps 1 of orders and none of the other) keeps the rows it
// claimed beyond its caps after the grace (extra), counts them only up to
// its caps, and claims nothing in their stead; rows not held as extra
// above its caps go as before.
func TestPlanShareKeepsExtraRows(t *testing.T) {
	t.Parallel()
	shape := shapeOf(map[string]int{"orders": 4, "s": 1})
	three := ranked(3, 5)
	me := three[2]
	held := func(r rowKey, extra bool, age int) heldRow {
		return heldRow{row: r, extra: extra, since: t0.Add(-time.Duration(age) * time.Second)}
	}
	o := func(p int32) rowKey { return rowKey{topic: "orders", partition: p} }
	s := rowKey{topic: "s"}
	for _, tc := range []struct {
		name  string
		held  []heldRow
		owned int
		want  int
		yield []rowKey
	}{
		{name: "at its cap with an extra row of the topic: keeps both",
			held: []heldRow{held(o(1), false, 2), held(o(3), true, 1)}, owned: 1},
		{name: "the same row not extra: given up",
			held: []heldRow{held(o(1), false, 2), held(o(3), false, 1)}, owned: 1, yield: []rowKey{o(3)}},
		{name: "an extra row alone fills the cap: nothing more to claim",
			held: []heldRow{held(o(3), true, 1)}, owned: 1},
		{name: "an extra row of a topic its caps leave out: kept, not counted",
			held: []heldRow{held(o(1), false, 2), held(s, true, 1)}, owned: 1},
		{name: "above its cap with rows not extra: those go, the extra one stays",
			held: []heldRow{held(o(1), false, 3), held(o(2), false, 2), held(o(3), true, 1)}, owned: 1,
			yield: []rowKey{o(2)}},
		{name: "nothing held: claims its cap", want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := planShare(three, me, shape, tc.held)
			if p.share != 1 || p.owned != tc.owned || p.want != tc.want {
				t.Errorf("share %d, owned %d, want %d; expected 1, %d, %d", p.share, p.owned, p.want, tc.owned, tc.want)
			}
			if !slices.Equal(p.yield, tc.yield) {
				t.Errorf("yield %v, expected %v", p.yield, tc.yield)
			}
		})
	}
}

func TestGraceState(t *testing.T) {
	t.Parallel()
	const grace = 500 * time.Millisecond
	at := t0.Add
	for _, tc := range []struct {
		name    string
		state   graceState
		waiting bool
		now     time.Time
		claim   bool
		next    graceState
		wait    time.Duration
	}{
		{name: "a hint arms the wait", state: graceState{hint: true}, waiting: true, now: t0,
			next: graceState{at: at(grace)}, wait: grace},
		{name: "no hint, no wait: nothing", waiting: true, now: t0},
		{name: "during the wait: nothing yet", state: graceState{at: at(grace)}, waiting: true, now: at(grace / 5),
			next: graceState{at: at(grace)}, wait: grace * 4 / 5},
		{name: "a hint during the wait waits for its end", state: graceState{at: at(grace), hint: true}, waiting: true,
			now: at(grace / 5), next: graceState{at: at(grace), hint: true}, wait: grace * 4 / 5},
		{name: "the wait is over: claim", state: graceState{at: at(grace)}, waiting: true, now: at(grace), claim: true},
		{name: "over, with a hint since: claim, and wait again for the rows that hint freed",
			state: graceState{at: at(grace), hint: true}, waiting: true, now: at(2 * grace), claim: true,
			next: graceState{at: at(3 * grace)}, wait: grace},
		{name: "waiting for nothing (or a group of one version): forget",
			state: graceState{at: at(grace), hint: true}, waiting: false, now: at(2 * grace)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			claim, next := tc.state.step(tc.waiting, tc.now, grace)
			if claim != tc.claim || next != tc.next {
				t.Errorf("claim %v, next %+v; want %v, %+v", claim, next, tc.claim, tc.next)
			}
			if w := next.wait(tc.now); w != tc.wait {
				t.Errorf("wait %s, want %s", w, tc.wait)
			}
		})
	}
	// Without a grace a hint claims at once.
	if claim, next := (graceState{hint: true}).step(true, t0, 0); !claim || next != (graceState{}) {
		t.Errorf("no grace: claim %v, next %+v; want true, none", claim, next)
	}
}

func TestSameGroupAndOtherProtocols(t *testing.T) {
	t.Parallel()
	a := member{id: uuid.UUID{1}, set: 7, size: 5, protocol: groupProtocol, expiresAt: t0}
	b := member{id: uuid.UUID{2}, set: 7, size: 5, protocol: 1, expiresAt: t0}
	later := a
	later.expiresAt = t0.Add(time.Minute)
	resized, upgraded := a, b
	resized.size = 6
	upgraded.protocol = groupProtocol
	for _, tc := range []struct {
		name string
		x, y []member
		same bool
	}{
		{name: "same members in another order, other expiries", x: []member{a, b}, y: []member{b, later}, same: true},
		{name: "one more", x: []member{a}, y: []member{a, b}},
		{name: "another set", x: []member{a, b}, y: []member{resized, b}},
		{name: "another protocol", x: []member{a, b}, y: []member{a, upgraded}},
		{name: "both empty", same: true},
	} {
		if got := sameGroup(tc.x, tc.y); got != tc.same {
			t.Errorf("%s: sameGroup %v, want %v", tc.name, got, tc.same)
		}
	}
	future := member{id: uuid.UUID{3}, protocol: groupProtocol + 1}
	if got := otherProtocols([]member{future, a, b, b}); !slices.Equal(got, []int{1, groupProtocol + 1}) {
		t.Errorf("otherProtocols %v, want [1 %d]", got, groupProtocol+1)
	}
	if got := otherProtocols([]member{a, upgraded}); len(got) != 0 {
		t.Errorf("otherProtocols of one version %v, want none", got)
	}
}
