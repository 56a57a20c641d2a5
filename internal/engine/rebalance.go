package engine

import (
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file holds the decisions of a group member's step that need no
// database, as plain functions of what the member last read and what it
// holds: how many rows it keeps and which it gives up (planShare), which
// rows a claim may take (claimable) and in which statements
// (claimBuckets), what a failed claim means
// (claimOutcomeUnknown), how long a refused row is left alone
// (futureHold.next), when to read the group again (readDue), when to
// look again unwoken (standbyWait), and when to claim free rows beyond
// the caps (graceState). groupMember applies them; they are
// table-tested in rebalance_internal_test.go.

// heldRow is a row the member owns under the generation in use and has
// not asked its consumer to give up.
type heldRow struct {
	row  rowKey
	idle bool // the consumer waits for news: its release is immediate
	// since is when the row was granted.
	since time.Time
	// extra: the row was claimed beyond the member's caps, free after
	// the grace (see graceState), and the group has not changed since.
	extra bool
}

// sharePlan is what a member does with the rows it holds.
type sharePlan struct {
	share int      // how many rows it may own (shareOf)
	owned int      // how many it keeps
	yield []rowKey // the rows to give up, above its share
	want  int      // how many more it may claim
	// topics is how many more rows it may claim of each topic of more
	// than one row (every such topic of its set, 0 at its cap); singles
	// how many more topics of one row.
	topics  map[string]int
	singles int
}

// planShare decides, from the members of the last read (me among them or
// not), the shape of the member's set and the rows held, the member's
// share and its caps by topic (capsOf), and which rows above them to give
// up: of each topic, the rows above its cap, then any above the share;
// idle ones first (their release is immediate), then those held the
// shortest time (ties in row order). Below its caps, want, topics and
// singles say what it may claim.
//
// Rows held as extra are never given up: nobody took them within the
// grace, so no member's caps have room for them while the group stays
// as it is (a member whose caps had room would have claimed them at
// once). They count toward their topic's cap as far as the rows not
// extra leave it room (so nothing is claimed in their stead); what lies
// above the caps counts neither in owned nor against the share.
func planShare(members []member, me member, shape setShape, held []heldRow) sharePlan {
	caps := capsOf(members, me, shape)
	p := sharePlan{share: caps.total, topics: map[string]int{}}
	order := slices.Clone(held)
	slices.SortFunc(order, func(a, b heldRow) int {
		if a.idle != b.idle {
			if a.idle {
				return -1
			}
			return 1
		}
		if c := b.since.Compare(a.since); c != 0 {
			return c
		}
		return compareRows(a.row, b.row)
	})
	// The rows held of each topic of more than one row, and of the
	// others together (the key "" : a topic name is never empty).
	bucket := func(r rowKey) string {
		if _, ok := caps.topics[r.topic]; ok {
			return r.topic
		}
		return ""
	}
	capOf := func(b string) int {
		if b == "" {
			return caps.singles
		}
		return caps.topics[b]
	}
	// kept counts the rows held of each bucket, normal those not extra.
	kept, normal := map[string]int{}, map[string]int{}
	for _, h := range order {
		kept[bucket(h.row)]++
		if !h.extra {
			normal[bucket(h.row)]++
		}
	}
	yielded := make([]bool, len(order))
	for i, h := range order {
		if b := bucket(h.row); !h.extra && normal[b] > capOf(b) {
			yielded[i] = true
			kept[b]--
			normal[b]--
			p.yield = append(p.yield, h.row)
		}
	}
	// What a bucket holds above its cap now is extra: not counted.
	for b, k := range kept {
		p.owned += min(k, capOf(b))
	}
	for i, h := range order {
		if p.owned <= p.share {
			break
		}
		if !yielded[i] && !h.extra {
			b := bucket(h.row)
			if kept[b] <= capOf(b) {
				p.owned-- // else an extra row of the bucket counts instead
			}
			kept[b]--
			p.yield = append(p.yield, h.row)
		}
	}
	for t, c := range caps.topics {
		w := max(c-kept[t], 0)
		p.topics[t] = w
		p.want += w
	}
	p.singles = max(caps.singles-kept[""], 0)
	p.want = max(min(p.want+p.singles, p.share-p.owned), 0)
	return p
}

// claimBucket is rows that one claim may take up to want of.
type claimBucket struct {
	rows []rowKey
	want int
}

// claimBuckets groups rows, the claimable rows in row order, for claims
// that respect p's caps by topic: the rows of every topic (and of the
// topics of one row, together) that the member may claim all of go in one
// bucket, with a want of their number; each topic it may claim only some
// of the rows of gets a bucket of its own with its want, and so do the
// topics of one row when it may claim only some of them. Rows of topics
// at their cap are left out. The buckets keep row order.
func claimBuckets(rows []rowKey, p sharePlan) []claimBucket {
	count := map[string]int{}
	singles := 0
	for _, r := range rows {
		if _, ok := p.topics[r.topic]; ok {
			count[r.topic]++
		} else {
			singles++
		}
	}
	var whole claimBucket
	some := map[string]*claimBucket{}
	var somes []string
	for _, r := range rows {
		key, want, n := "", p.singles, singles
		if w, ok := p.topics[r.topic]; ok {
			key, want, n = r.topic, w, count[r.topic]
		}
		switch {
		case want <= 0:
		case want >= n:
			whole.rows = append(whole.rows, r)
			whole.want++
		default:
			b := some[key]
			if b == nil {
				b = &claimBucket{want: want}
				some[key] = b
				somes = append(somes, key)
			}
			b.rows = append(b.rows, r)
		}
	}
	var out []claimBucket
	if len(whole.rows) > 0 {
		out = append(out, whole)
	}
	for _, k := range somes {
		out = append(out, *some[k])
	}
	return out
}

// claimable returns the rows of waiting that a claim may try now, in row
// order (the order in which the claim statement locks rows, so that two
// claimers lock common rows in the same order): all but those refused
// for a position ahead of the transaction counter whose hold has not
// ended.
func claimable[C any](waiting map[rowKey]C, future map[rowKey]futureHold, now time.Time) []rowKey {
	rows := make([]rowKey, 0, len(waiting))
	for r := range waiting {
		if h, ok := future[r]; ok && now.Before(h.until) {
			continue
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, compareRows)
	return rows
}

// claimOutcomeUnknown reports whether a claim statement that failed with
// err may have committed without its reply: anything but a statement
// never sent or an error the server returned (the statement rolled back).
// Its rows are then claimed again first ("unsettled").
func claimOutcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.Is(err, errNotSent) && !errors.Is(err, ErrDatabaseWentBack) && !errors.As(err, &pgErr)
}

// futureHold is how long a row refused with ErrFuturePosition is left
// alone.
type futureHold struct {
	until time.Time
	wait  time.Duration
}

// next is the hold after one more refusal at now: the wait doubles from
// a second to a minute.
func (h futureHold) next(now time.Time) futureHold {
	h.wait = min(max(2*h.wait, time.Second), time.Minute)
	h.until = now.Add(h.wait)
	return h
}

// readDue reports whether the member reads the group's members again at
// now: they are stale (a notification, a poll tick, a failed read), the
// last read was not made under the generation gen (read is the id of
// the member found as itself), or another member's expiry it read has
// passed.
func readDue(stale bool, read uuid.UUID, members []member, gen uuid.UUID, now time.Time) bool {
	if stale || read != gen {
		return true
	}
	next, ok := nextExpiry(members, gen, time.Time{})
	return ok && !now.Before(next)
}

// standbyWait returns how long the member sleeps unless woken, 0 meaning
// until woken: nothing while no consumer waits for a row; otherwise until
// just after the earliest expiry of another member read (its rows may be
// free then), and at most poll while it holds fewer than its share.
func standbyWait(waiting bool, members []member, me member, gen uuid.UUID, owned int, poll time.Duration, now time.Time) time.Duration {
	if !waiting {
		return 0
	}
	var wait time.Duration
	if next, ok := nextExpiry(members, gen, time.Time{}); ok {
		// An expiry already past (the read was slow) is read again soon.
		wait = max(next.Sub(now), 0) + standbyMargin
	}
	if owned < shareOf(members, me) && (wait == 0 || poll < wait) {
		wait = poll
	}
	return wait
}

// graceState is a member's wait before it claims rows beyond its caps,
// in a group that has members of another version of its rules
// (groupProtocol). Members of one version split the rows so that their
// caps add up to them: a free row is in some member's caps, and that
// member claims it as soon as it learns that it is free (a release, a
// member that ended, a row just created). Members of another version
// split the rows another way, and a row may be in nobody's share. So in
// a mixed group a row its caps have no room for is left to the others
// for the grace; if it is still free then, any member that waits for it
// takes it, as extra (heldRow.extra). The wait starts at a hint that a
// row may be free; a hint during the wait starts another once it is
// over, so that every freed row gets its grace.
type graceState struct {
	at   time.Time // when the claim beyond the caps is due; zero: none
	hint bool      // a row may have been freed since the wait began
}

// step decides at now, for a member of a mixed group that waits for
// rows after claiming what its caps allow (waiting; false too in a group
// of one version), whether to claim the free rows it waits for beyond
// its caps now (claim), and the state after.
func (s graceState) step(waiting bool, now time.Time, grace time.Duration) (claim bool, next graceState) {
	if !waiting {
		return false, graceState{}
	}
	if s.at.IsZero() && s.hint {
		s.at, s.hint = now.Add(grace), false
	}
	if s.at.IsZero() || now.Before(s.at) {
		return false, s
	}
	s.at = time.Time{}
	if s.hint {
		s.at, s.hint = now.Add(grace), false
	}
	return true, s
}

// wait is how long after now the claim beyond the caps is due (0: none
// is).
func (s graceState) wait(now time.Time) time.Duration {
	if s.at.IsZero() {
		return 0
	}
	return max(s.at.Sub(now), time.Millisecond)
}

// freeRowGrace is the grace of a group whose sessions live ttl: half a
// heartbeat interval (ttl/3), so that a row free at the beginning of an
// interval has an owner before its end.
func freeRowGrace(ttl time.Duration) time.Duration { return ttl / 6 }

// sameGroup reports whether two reads of a group show the same members
// with the same sets and protocols (expiries aside).
func sameGroup(a, b []member) bool {
	if len(a) != len(b) {
		return false
	}
	type key struct {
		id       uuid.UUID
		set      uint64
		size     int
		protocol int
	}
	seen := make(map[key]bool, len(a))
	for _, m := range a {
		seen[key{m.id, m.set, m.size, m.protocol}] = true
	}
	for _, m := range b {
		if !seen[key{m.id, m.set, m.size, m.protocol}] {
			return false
		}
	}
	return true
}

// otherProtocols returns, in order, the protocol versions other than
// this release's (groupProtocol) among members.
func otherProtocols(members []member) []int {
	var out []int
	for _, m := range members {
		if m.protocol != groupProtocol && !slices.Contains(out, m.protocol) {
			out = append(out, m.protocol)
		}
	}
	slices.Sort(out)
	return out
}

// partitionRows returns the rows of topic's partitions from to n-1: the
// partitions a subscription started consumers for when it learnt that
// the topic has n.
func partitionRows(topic string, from, n int) []rowKey {
	var rows []rowKey
	for p := from; p < n; p++ {
		rows = append(rows, rowKey{topic: topic, partition: int32(p)})
	}
	return rows
}
