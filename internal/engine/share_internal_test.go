package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

// These tests need no database.

func members(n int, set uint64, size int) []member {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := make([]member, n)
	for i := range ms {
		ms[i] = member{id: uuid.New(), createdAt: base.Add(time.Duration(i) * time.Second), set: set, size: size}
	}
	return ms
}

func TestShareCapsAddUpToTheRows(t *testing.T) {
	for _, tc := range []struct{ rows, members int }{
		{0, 1}, {1, 1}, {1, 2}, {1, 5}, {3, 2}, {7, 3}, {200, 4}, {200, 5}, {1000, 3}, {5, 8}, {100000, 7},
	} {
		t.Run(fmt.Sprintf("%d rows %d members", tc.rows, tc.members), func(t *testing.T) {
			ms := members(tc.members, 42, tc.rows)
			total, lo, hi := 0, tc.rows, 0
			for i, m := range ms {
				share := shareOf(ms, m)
				total += share
				lo, hi = min(lo, share), max(hi, share)
				// The older members take the extra rows.
				want := tc.rows / tc.members
				if i < tc.rows%tc.members {
					want++
				}
				if share != want {
					t.Errorf("member %d: share %d, want %d", i, share, want)
				}
			}
			if total != tc.rows {
				t.Errorf("caps add up to %d, want %d", total, tc.rows)
			}
			if tc.members <= tc.rows && (lo != tc.rows/tc.members || hi > (tc.rows+tc.members-1)/tc.members) {
				t.Errorf("shares between %d and %d, want floor and ceil of %d/%d", lo, hi, tc.rows, tc.members)
			}
		})
	}
}

func TestShareIgnoresOrderAndCountsMeWhenMissing(t *testing.T) {
	ms := members(3, 7, 10)
	reversed := []member{ms[2], ms[1], ms[0]}
	for i, m := range ms {
		if a, b := shareOf(ms, m), shareOf(reversed, m); a != b {
			t.Errorf("member %d: %d in one order, %d in another", i, a, b)
		}
	}
	// A member not yet in the list it read counts itself, last.
	newcomer := member{id: uuid.New(), createdAt: ms[2].createdAt.Add(time.Second), set: 7, size: 10}
	if got := shareOf(ms, newcomer); got != 2 {
		t.Errorf("newcomer's share %d, want 10/4 rounded down = 2 (it ranks last)", got)
	}
	// Ties on created_at are broken by id, the same way everywhere.
	a := member{id: uuid.MustParse("00000000-0000-0000-0000-000000000001"), set: 1, size: 3}
	b := member{id: uuid.MustParse("00000000-0000-0000-0000-000000000002"), set: 1, size: 3}
	if shareOf([]member{b, a}, a) != 2 || shareOf([]member{a, b}, b) != 1 {
		t.Error("ties on created_at are not broken by id")
	}
}

func TestShareCountsOnlyMembersOfTheSameSet(t *testing.T) {
	same := members(2, 1, 100)
	other := members(3, 2, 100)
	all := append(append([]member{}, other...), same...)
	if got := shareOf(all, same[0]); got != 50 {
		t.Errorf("share %d, want 50: members of another set do not split this one", got)
	}
	// Same hash, other size: another set (a hash collision is not enough).
	odd := member{id: uuid.New(), createdAt: same[0].createdAt.Add(-time.Hour), set: 1, size: 99}
	if got := shareOf(append(all, odd), same[0]); got != 50 {
		t.Errorf("share %d, want 50", got)
	}
	if got := shareOf(all, member{id: uuid.New(), set: 1}); got != 0 {
		t.Errorf("a member with no rows has share %d", got)
	}
}

func TestRowSetHashIsOrderFreeAndIncremental(t *testing.T) {
	var a, b rowSet
	for i := range 1000 {
		a.add(fmt.Sprintf("t%d", i), 0)
	}
	for i := 999; i >= 0; i-- {
		b.add(fmt.Sprintf("t%d", i), 0)
	}
	if a != b {
		t.Fatalf("the same rows added in another order give %+v and %+v", a, b)
	}
	b.add("extra", 0)
	if a == b {
		t.Fatal("one more row, same hash")
	}
	b.remove("extra", 0)
	if a != b {
		t.Fatal("adding and removing a row changed the set")
	}
	if rowHash("t", 0) == rowHash("t", 1) || rowHash("a", 0) == rowHash("b", 0) {
		t.Fatal("distinct rows hash alike")
	}
	// The hash must be the same in every process and release: a fixed value.
	if got := rowHash("orders", 0); got != 0xe80a6f002d5216db {
		t.Fatalf("rowHash changed: %#x", got)
	}
}

func TestNextExpiry(t *testing.T) {
	now := time.Now()
	me := uuid.New()
	ms := []member{
		{id: me, expiresAt: now.Add(time.Second)},
		{id: uuid.New(), expiresAt: now.Add(5 * time.Second)},
		{id: uuid.New(), expiresAt: now.Add(3 * time.Second)},
		{id: uuid.New(), expiresAt: now.Add(-time.Second)},
	}
	next, ok := nextExpiry(ms, me, now)
	if !ok || !next.Equal(now.Add(3*time.Second)) {
		t.Errorf("next expiry %v %v, want in 3s (not mine, not past)", next.Sub(now), ok)
	}
	if _, ok := nextExpiry(ms[:1], me, now); ok {
		t.Error("only my own session: no expiry to wait for")
	}
}

// shapeOf returns the shape of a set of topics of partitions[topic] rows.
func shapeOf(partitions map[string]int) setShape {
	var s setShape
	for t, n := range partitions {
		for range n {
			s.add(t)
		}
	}
	return s
}

// TestCapsSpreadEachTopic: the caps of a member add up to its share, the
// caps of a topic over the members to its partitions, and each member may
// own floor or ceil of a topic's partitions over the members: a
// partitioned topic is split evenly whatever other topics the set holds.
func TestCapsSpreadEachTopic(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions map[string]int
		members    int
		// want, when set, is each rank's cap of "orders".
		want []int
	}{
		{name: "orders of 4 and two topics, 2 members", partitions: map[string]int{"orders": 4, "a": 1, "b": 1},
			members: 2, want: []int{2, 2}},
		{name: "8 partitions and three topics, 4 members", partitions: map[string]int{"orders": 8, "a": 1, "b": 1, "c": 1},
			members: 4, want: []int{2, 2, 2, 2}},
		{name: "odd partitions", partitions: map[string]int{"orders": 5, "x": 3, "a": 1},
			members: 2, want: []int{3, 2}},
		{name: "two topics of 3, 2 members: one extra each", partitions: map[string]int{"orders": 3, "p": 3},
			members: 2, want: []int{2, 1}},
		{name: "more members than partitions", partitions: map[string]int{"orders": 2, "p": 3, "a": 1, "b": 1},
			members: 5, want: []int{1, 1, 0, 0, 0}},
		{name: "topics of one row only", partitions: map[string]int{"a": 1, "b": 1, "c": 1}, members: 2},
		{name: "many", partitions: map[string]int{"orders": 16, "p": 7, "q": 9, "r": 2, "a": 1, "b": 1, "c": 1, "d": 1},
			members: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := 0
			for _, n := range tc.partitions {
				size += n
			}
			shape := shapeOf(tc.partitions)
			ms := members(tc.members, 1, size)
			byTopic := map[string]int{}
			singles := 0
			for i, m := range ms {
				c := capsOf(ms, m, shape)
				sum := c.singles
				for topic, n := range c.topics {
					sum += n
					byTopic[topic] += n
					p := tc.partitions[topic]
					if n < p/tc.members || n > (p+tc.members-1)/tc.members {
						t.Errorf("member %d: cap %d of %s's %d partitions, want floor or ceil of %d/%d",
							i, n, topic, p, p, tc.members)
					}
				}
				singles += c.singles
				if sum != c.total || c.total != shareOf(ms, m) {
					t.Errorf("member %d: caps add up to %d, share %d (shareOf %d)", i, sum, c.total, shareOf(ms, m))
				}
				if tc.want != nil && c.topics["orders"] != tc.want[i] {
					t.Errorf("member %d: cap of orders %d, want %d", i, c.topics["orders"], tc.want[i])
				}
			}
			for topic, p := range tc.partitions {
				if p > 1 && byTopic[topic] != p {
					t.Errorf("caps of %s add up to %d, want %d", topic, byTopic[topic], p)
				}
			}
			if singles != shape.singles {
				t.Errorf("caps of the topics of one row add up to %d, want %d", singles, shape.singles)
			}
		})
	}
}

func TestSetShapeAddRemove(t *testing.T) {
	var s setShape
	for _, topic := range []string{"a", "b", "b", "c", "c", "c"} {
		s.add(topic)
	}
	if s.singles != 1 || s.multi["b"] != 2 || s.multi["c"] != 3 || len(s.multi) != 2 {
		t.Fatalf("after adds: singles %d, multi %v", s.singles, s.multi)
	}
	s.remove("b")
	s.remove("c")
	s.remove("a")
	s.remove("a") // not there: nothing
	if s.singles != 1 || s.multi["c"] != 2 || len(s.multi) != 1 {
		t.Fatalf("after removes: singles %d, multi %v", s.singles, s.multi)
	}
}
