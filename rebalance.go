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
// rows a claim may take (claimable), what a failed claim means
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
}

// planShare decides, from the members of the last read (me among them or
// not) and the rows held, the member's share, and which rows above it
// to give up: idle ones first (their release is immediate), then those
// held the shortest time (ties in row order). Below its share, want is
// what it may claim.
func planShare(members []member, me member, held []heldRow) sharePlan {
	p := sharePlan{share: shareOf(members, me), owned: len(held)}
	if p.owned <= p.share {
		p.want = p.share - p.owned
		return p
	}
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
	for _, h := range order[:p.owned-p.share] {
		p.yield = append(p.yield, h.row)
	}
	p.owned = p.share
	return p
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
