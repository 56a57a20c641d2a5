package pglease

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
// (futureHold.next), when to read the group again (readDue) and when to
// look again unwoken (standbyWait). groupMember applies them; they are
// table-tested in rebalance_internal_test.go.

// heldRow is a row the member owns under the generation in use and has
// not asked its consumer to give up.
type heldRow struct {
	row  rowKey
	idle bool // the consumer waits for news: its release is immediate
	// since is when the row was granted.
	since time.Time
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
	kept := map[string]int{}
	for _, h := range order {
		kept[bucket(h.row)]++
	}
	yielded := make([]bool, len(order))
	for i, h := range order {
		if b := bucket(h.row); kept[b] > capOf(b) {
			yielded[i] = true
			kept[b]--
			p.yield = append(p.yield, h.row)
		}
	}
	p.owned = len(order) - len(p.yield)
	for i, h := range order {
		if p.owned <= p.share {
			break
		}
		if !yielded[i] {
			kept[bucket(h.row)]--
			p.yield = append(p.yield, h.row)
			p.owned--
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
