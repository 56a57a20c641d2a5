package pglease_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// Consumer-group tests. The process tests run real helper processes
// (process_test.go, modeRouter, one Subscriber per process) of one group
// on sets of topics. The split is read from the offsets table, each row
// counted for the process (the pid in the owner column) of the live
// session that owns it; the delivery guarantees are judged by
// history.verify, duplicates by where they come from (a takeover from a
// dead session, the unacknowledged window of a killed process), and
// exclusivity by the invariant checker. TestGroupConcurrentClaimsTakeEveryFreeRow
// drives Subscribers of the test process into colliding claims.

// numberedTopics returns the topics prefix<from> to prefix<to-1>, numbers
// written with three digits: prefix000, prefix001, ...
func numberedTopics(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%03d", prefix, i))
	}
	return out
}

// startStreams publishes to topics round-robin from n streams, each one
// message every interval, each starting at its own place in the list.
func startStreams(t *testing.T, pub *pglease.Publisher, topics []string, n int, every time.Duration) []*stream {
	t.Helper()
	var out []*stream
	for i := range n {
		k := i * len(topics) / n
		rotated := append(append([]string(nil), topics[k:]...), topics[:k]...)
		out = append(out, startRoundRobin(t, pub, rotated, every))
	}
	return out
}

// haltStreams stops the streams and returns every Publish call they made;
// each must have succeeded.
func haltStreams(t *testing.T, streams []*stream) []publishAttempt {
	t.Helper()
	var all []publishAttempt
	for _, st := range streams {
		st.halt()
		all = append(all, st.results()...)
	}
	for _, a := range all {
		require.NoError(t, a.err, "Publish failed although the database was fine")
	}
	return all
}

// topicOwners returns, for each of topics (stream names: see streamName)
// that a live session owns, the pid of that session's process. A row whose owner session has expired,
// is gone, or whose lease override has run out counts as not owned.
func topicOwners(s failureSetup, topics []string) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT `+streamSQL+`, s.owner
FROM `+table(s.adapter, pglease.DefaultConsumerOffsetsTable)+` o
JOIN `+table(s.adapter, pglease.DefaultConsumerSessionsTable)+` s ON s.id = o.session_id
WHERE o.consumer_group = $1 AND `+streamSQL+` = ANY($2)
	AND s.expires_at > now() AND (o.lease_expires_at IS NULL OR o.lease_expires_at > now())`,
		s.cfg.Group, topics)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	owners := map[string]int{}
	for rows.Next() {
		var topic, owner string
		if err := rows.Scan(&topic, &owner); err != nil {
			return nil, err
		}
		owners[topic] = pidOfOwner(owner)
	}
	return owners, rows.Err()
}

// splitOf counts the topics each process owns.
func splitOf(owners map[string]int) map[int]int {
	split := map[int]int{}
	for _, pid := range owners {
		split[pid]++
	}
	return split
}

// describeSplit names each process's count, as "p0=50 p1=50 (free 0)".
func describeSplit(owners map[string]int, topics int, procs []*helperProc) string {
	split := splitOf(owners)
	var parts []string
	for _, p := range procs {
		parts = append(parts, fmt.Sprintf("%s=%d", p.cfg.Name, split[p.pid()]))
		delete(split, p.pid())
	}
	for pid, n := range split {
		parts = append(parts, fmt.Sprintf("pid %d=%d", pid, n))
	}
	return fmt.Sprintf("%s (free %d)", strings.Join(parts, " "), topics-len(owners))
}

// waitSplit waits until every one of topics is owned by a live session of
// one of procs and each of procs owns want±tolerance of them, and returns
// how long that took from since. It fails with the last split it read.
func waitSplit(t *testing.T, s failureSetup, topics []string, procs []*helperProc, want, tolerance int,
	since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		owners, err := topicOwners(s, topics)
		if err == nil {
			split := splitOf(owners)
			ok := len(owners) == len(topics) && len(split) == len(procs)
			for _, p := range procs {
				n, in := split[p.pid()]
				ok = ok && in && n >= want-tolerance && n <= want+tolerance
			}
			if ok {
				return time.Since(since)
			}
			last = describeSplit(owners, len(topics), procs)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %d processes to own %d±%d of %d topics each; last split: %s",
				timeout, len(procs), want, tolerance, len(topics), last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// movesBetween counts, from the offsets log, the changes of owner of
// topics logged in [from, to): releases of a row by its owner, and
// claims that took a row from another (expired or gone) session.
func movesBetween(h *history, topics []string, from, to time.Time) (releases, takeovers int) {
	in := map[string]bool{}
	for _, t := range topics {
		in[t] = true
	}
	for _, c := range h.offsets {
		if !in[c.topic] || c.at.Before(from) || !c.at.Before(to) {
			continue
		}
		if c.isRelease() {
			releases++
		}
		if c.isClaim() && c.oldSession != nil && *c.oldSession != *c.newSession {
			takeovers++
		}
	}
	return releases, takeovers
}

// killWindow returns the messages the killed process victim processed
// after the last position it committed: for each topic, its records at or
// after the first message of the first claim of the topic after killedAt.
// They are the only messages a kill may have processed twice.
func killWindow(h *history, topics []string, victim string, killedAt time.Time) []string {
	var out []string
	for _, topic := range topics {
		start := -1
		for _, c := range h.claims[topic] {
			if c.at.After(killedAt) {
				start = c.startIdx
				break
			}
		}
		if start < 0 {
			continue
		}
		for _, r := range h.records {
			if r.proc == victim && r.topic == topic && r.idx >= start {
				out = append(out, r.uuid)
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// lastExpiry returns the last expiry that a session of the process pid
// had, from the sessions log.
func lastExpiry(h *history, pid int) time.Time {
	var last time.Time
	for _, c := range h.sessions {
		if c.pid == pid && c.op != "DELETE" {
			last = c.expires
		}
	}
	return last
}

// takeoverSpan returns when the first and the last row were taken from a
// session of the process pid after since.
func takeoverSpan(h *history, topics []string, pid int, since time.Time) (first, last time.Time) {
	for _, topic := range topics {
		for _, c := range h.claims[topic] {
			if !c.at.After(since) || c.oldSession == nil || h.pids[*c.oldSession] != pid {
				continue
			}
			if first.IsZero() || c.at.Before(first) {
				first = c.at
			}
			if c.at.After(last) {
				last = c.at
			}
		}
	}
	return first, last
}

// sessionsOpened returns how many sessions each process opened, from
// the sessions log: one per Subscriber, unless a session was lost (a
// heartbeat came too late) and replaced.
func sessionsOpened(h *history) map[int]int {
	opened := map[int]int{}
	for _, c := range h.sessions {
		if c.op == "INSERT" {
			opened[c.pid]++
		}
	}
	return opened
}

// assertDuplicatesFollowTakeovers checks that every message processed more
// than once was processed again after a claim that took its row from a
// dead session (expired or gone): only a session that died leaves
// processed messages uncommitted. A row given up by a live member is
// released with its acknowledged position, so nothing is processed twice
// across a rebalance. The takeover need not be the claim the message was
// processed again under: a member that took the row of a killed process
// may hand it on (a release, to a member that joined) before it got to the
// messages the killed one had processed, and the next owner processes them
// again under a claim of a free row. So the takeover is looked for among
// the row's claims after the message's previous processing, up to and
// including the one it was processed again under.
func assertDuplicatesFollowTakeovers(t *testing.T, h *history) {
	t.Helper()
	last := map[string]processed{}
	for _, r := range h.records {
		prev, seen := last[r.uuid]
		last[r.uuid] = r
		if !seen {
			continue
		}
		var claim *claimInfo
		for i, c := range h.claims[r.topic] {
			if r.ownerEpoch != nil && c.newEpoch == *r.ownerEpoch {
				claim = &h.claims[r.topic][i]
			}
		}
		if !assert.NotNil(t, claim, "topic %q: %s processed again (record %d) under epoch %v, which no claim made",
			r.topic, r.uuid, r.id, deref(r.ownerEpoch)) {
			continue
		}
		prevEpoch := int64(0) // processed while free: reported by verify
		if prev.ownerEpoch != nil {
			prevEpoch = *prev.ownerEpoch
		}
		if takenFromDeadBetween(h.claims[r.topic], prevEpoch, claim.newEpoch) {
			continue
		}
		from := "a free row"
		if claim.oldSession != nil {
			from = "its own session"
		}
		assert.Fail(t, "processed again without a takeover",
			"topic %q: %s processed again by %s (record %d) under epoch %d, claimed from %s, with no takeover from a dead session since its processing by %s (record %d) under epoch %d",
			r.topic, r.uuid, r.deliverer(), r.id, claim.newEpoch, from, prev.deliverer(), prev.id, deref(prev.ownerEpoch))
	}
}

// takenFromDeadBetween reports whether one of claims with an epoch in
// (after, upTo] took the row from another session, which can only be a
// dead one (the invariant checker fails the test otherwise).
func takenFromDeadBetween(claims []claimInfo, after, upTo int64) bool {
	for _, c := range claims {
		if c.newEpoch > after && c.newEpoch <= upTo && c.oldSession != nil && c.newSession != nil && *c.oldSession != *c.newSession {
			return true
		}
	}
	return false
}

// assertNoInvariantViolations reads the invariant checker's counts and
// fails on any violation, logging them.
func assertNoInvariantViolations(t *testing.T, s failureSetup) invariantCounts {
	t.Helper()
	counts := readInvariantCounts(t, s.pool, s.adapter)
	assert.Zero(t, counts.takenFromLive, "(a) a row was taken from a live session")
	assert.Zero(t, counts.revivedAfterLoss, "(b) a heartbeat revived a session after one of its rows was taken")
	assert.Zero(t, counts.revivedInHindsight, "(b, from the logs) a heartbeat revived a session past a takeover of one of its rows")
	if counts.takenFromLive+counts.revivedAfterLoss+counts.revivedInHindsight > 0 {
		logInvariantViolations(t, s.pool, s.adapter, 10)
	}
	return counts
}

// TestGroupSplitsTopicsEvenly runs processes of one group on the same 200
// topics while messages stream to all of them: four processes own exactly
// 50 each; a fifth that joins brings everyone to 40 within seconds, moving
// no more rows than it takes; a process killed with SIGKILL has its rows
// spread over the other four (50 each) once its session expires. Nothing
// is lost or reordered, no topic ever has two deliverers, the only
// duplicates are the killed process's unacknowledged window, and the
// invariant checker finds no row taken from a live session.
func TestGroupSplitsTopicsEvenly(t *testing.T) {
	const (
		ttl     = 2 * time.Second
		nTopics = 200
	)
	began := time.Now()
	topics := numberedTopics("g", 0, nTopics)
	s := newFailureSetup(t, ttl, topics...)
	installInvariantChecker(t, s.pool, s.adapter)
	cfg := s.cfg
	cfg.NoKeepalive = true // the same set of topics in every process
	streams := startStreams(t, s.pub, topics, 4, 10*time.Millisecond)

	// Four processes, started together.
	var cfgs []helperConfig
	for i := range 4 {
		cfgs = append(cfgs, cfg.named(fmt.Sprintf("p%d", i)))
	}
	four := startHelpers(t, cfgs...)
	readyFour := time.Now()
	splitFour := waitSplit(t, s, topics, four, nTopics/4, 0, readyFour, time.Minute)
	t.Logf("4 processes: exact split (50 each) %s after all were ready (startup %s)",
		splitFour.Round(time.Millisecond), readyFour.Sub(began).Round(time.Millisecond))

	// A fifth joins.
	launched := time.Now()
	p4 := launchHelper(t, cfg.named("p4"))
	p4.waitLine(t, "ready", time.Minute)
	readyFive := time.Now()
	five := append(append([]*helperProc(nil), four...), p4)
	joinWithin1 := waitSplit(t, s, topics, five, nTopics/5, 1, readyFive, time.Minute)
	joinExact := waitSplit(t, s, topics, five, nTopics/5, 0, readyFive, time.Minute)
	balancedFive := time.Now()
	waitProgress(t, s.pool, s.adapter, "p4", readyFive, 20, 30*time.Second)
	t.Logf("join: 40±1 each %s after the fifth was ready (%s after its launch), exactly 40 each after %s",
		joinWithin1.Round(time.Millisecond), (readyFive.Sub(launched) + joinWithin1).Round(time.Millisecond),
		joinExact.Round(time.Millisecond))

	// One is killed: its rows go to the other four once its session expires.
	victim := four[1]
	survivors := []*helperProc{four[0], four[2], four[3], p4}
	victim.signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	killWithin1 := waitSplit(t, s, topics, survivors, nTopics/4, 1, killedAt, time.Minute)
	killExact := waitSplit(t, s, topics, survivors, nTopics/4, 0, killedAt, time.Minute)
	balancedFour := time.Now()
	for _, p := range survivors {
		waitProgress(t, s.pool, s.adapter, p.cfg.Name, balancedFour, 10, 30*time.Second)
	}
	t.Logf("kill: 50±1 each %s after SIGKILL, exactly 50 each after %s (SessionTTL %s)",
		killWithin1.Round(time.Millisecond), killExact.Round(time.Millisecond), ttl)

	attempts := haltStreams(t, streams)
	waitProcessed(t, s.pool, s.adapter, topics, time.Minute)
	for _, p := range survivors {
		p.close(t)
	}

	h := loadHistory(t, s.pool, s.adapter, s.cfg.Group)
	sum := h.verify(t, topics)
	failed, _ := h.verifyPublishes(t, attempts)
	assert.Zero(t, failed)

	// A process whose heartbeat comes too late (a CPU starved for over
	// SessionTTL/3) loses its session and opens a new one; its rows then
	// move by takeover, and its uncommitted messages are processed again.
	opened, lostSessions := sessionsOpened(h), 0
	for _, p := range five {
		assert.Positive(t, opened[p.pid()], "%s opened no session", p.cfg.Name)
		if n := opened[p.pid()]; n > 1 {
			lostSessions += n - 1
			t.Logf("%s lost its session %d times and opened a new one (the machine is too slow for SessionTTL %s): "+
				"timings and exact counts of moves and duplicates are not checked", p.cfg.Name, n-1, ttl)
		}
	}

	joinReleases, joinTakeovers := movesBetween(h, topics, readyFive, balancedFive)
	killReleases, killTakeovers := movesBetween(h, topics, killedAt, balancedFour)
	deadRows := 0
	for _, topic := range topics {
		for _, c := range h.claims[topic] {
			if c.at.After(killedAt) && c.oldSession != nil && h.pids[*c.oldSession] == victim.pid() {
				deadRows++
			}
		}
	}
	expired := lastExpiry(h, victim.pid())
	first, last := takeoverSpan(h, topics, victim.pid(), killedAt)
	t.Logf("kill: the dead session expired %s after SIGKILL; its rows were taken from %s to %s after its expiry",
		expired.Sub(killedAt).Round(time.Millisecond), first.Sub(expired).Round(time.Millisecond),
		last.Sub(expired).Round(time.Millisecond))
	// The timings and exact counts hold while every session lives: a lost
	// one moves rows by takeover, after its expiry.
	if lostSessions == 0 {
		assert.Less(t, joinWithin1, 5*time.Second, "the fifth process must get its share within seconds")
		// The dead session expires at most SessionTTL after the kill, and
		// the members wake at that expiry. But a member whose claim then
		// loses the race for the dead rows to another member's claim is not
		// woken again: it retries at its next poll, and may lose again to
		// another loser polling at the same moment; each round lets at
		// least one member through (TestGroupConcurrentClaimsTakeEveryFreeRow
		// shows it). Until the library claims again at once, the bound
		// allows a PollInterval per surviving member.
		bound := ttl + time.Duration(len(survivors))*s.cfg.PollInterval + 500*time.Millisecond
		assert.Less(t, killWithin1, bound, "the dead process's rows must be shared soon after its session expires")
		// Sticky: the join moved only the 40 rows the new process took,
		// each released by its owner (nothing taken from a session, live
		// or not); the kill moved only the dead process's 40 rows, each
		// taken from its expired session (no live process gave a row to
		// another).
		assert.Equal(t, nTopics/5, joinReleases, "rows released while the fifth process joined")
		assert.Zero(t, joinTakeovers, "rows taken from another session while the fifth process joined")
		assert.Zero(t, killReleases, "rows released by live processes after the kill")
		assert.Equal(t, nTopics/5, deadRows, "rows taken over from the killed process's session")
		assert.Equal(t, deadRows, killTakeovers, "takeovers after the kill")
	}

	// Duplicates: only after a takeover from a dead session; with no
	// session lost but the killed one's, exactly what the killed process
	// processed after its last committed positions, each processed twice.
	assertDuplicatesFollowTakeovers(t, h)
	window := killWindow(h, topics, victim.cfg.Name, killedAt)
	if lostSessions == 0 {
		assert.Equal(t, window, h.duplicates(), "duplicates must be exactly what the killed process processed after its last commits")
		for id, n := range h.counts() {
			assert.LessOrEqual(t, n, 2, "message %s processed %d times", id, n)
		}
	}

	counts := assertNoInvariantViolations(t, s)
	t.Logf("group split: %d messages (%d processed, %d more than once), %d claims; "+
		"join moved %d rows (%d releases, %d takeovers), kill moved %d rows (%d takeovers, %d releases); %d sessions lost; "+
		"invariants: %s; whole run %s",
		sum.messages, sum.records, sum.duplicates, sum.claims, joinReleases+joinTakeovers, joinReleases, joinTakeovers,
		deadRows, killTakeovers, killReleases, lostSessions, counts, time.Since(began).Round(time.Millisecond))
}

// TestGroupOverlappingTopicSets runs members of one group that subscribe
// to different, overlapping sets of topics: A and D on o000..o099, B on
// o050..o149, C on o000..o149. Each set is split among the members that
// subscribe to that same set (A and D: 50 each at most), and every topic
// is owned by a live member that wants it: once A, B and D have started;
// still after C joins (nobody takes a row from a live member, and C, alone
// on its set, may own any free row); and again after the one of A and D
// that owns more is killed with SIGKILL, when its rows go to the others
// that want them (its partner on the set may now own all 100). Every
// message is delivered, with the guarantees of history.verify, the only
// duplicates after the kill.
func TestGroupOverlappingTopicSets(t *testing.T) {
	const ttl = 2 * time.Second
	began := time.Now()
	all := numberedTopics("o", 0, 150)
	s := newFailureSetup(t, ttl, all...)
	installInvariantChecker(t, s.pool, s.adapter)
	cfg := s.cfg
	cfg.NoKeepalive = true
	named := func(name string, topics []string) helperConfig {
		c := cfg.named(name)
		c.Topics = topics
		return c
	}
	streams := startStreams(t, s.pub, all, 3, 10*time.Millisecond)

	// covered waits until every topic is owned by a live one of procs that
	// subscribes to it, and each of procs owns at most its cap; it returns
	// how long that took from since.
	covered := func(what string, procs []*helperProc, caps map[*helperProc]int, since time.Time) time.Duration {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			owners, err := topicOwners(s, all)
			var desc string
			if err == nil {
				byPID := map[int]*helperProc{}
				for _, p := range procs {
					byPID[p.pid()] = p
				}
				var wrong []string
				for _, topic := range all {
					if pid, owned := owners[topic]; owned {
						if p := byPID[pid]; p == nil || !slices.Contains(p.cfg.Topics, topic) {
							wrong = append(wrong, fmt.Sprintf("%s by pid %d", topic, pid))
						}
					}
				}
				split := splitOf(owners)
				ok := len(owners) == len(all) && len(wrong) == 0
				for _, p := range procs {
					ok = ok && split[p.pid()] <= caps[p]
				}
				desc = describeSplit(owners, len(all), procs)
				if len(wrong) > 0 {
					desc += "; owned by a process that does not want it: " + strings.Join(wrong, ", ")
				}
				if ok {
					took := time.Since(since)
					t.Logf("%s: every topic owned by a member that wants it %s after %s", what, desc, took.Round(time.Millisecond))
					return took
				}
			} else {
				desc = err.Error()
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out waiting for every topic to be owned by a member that wants it, each within its cap; last: %s",
					what, desc)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	procs := startHelpers(t, named("A", numberedTopics("o", 0, 100)), named("B", numberedTopics("o", 50, 150)),
		named("D", numberedTopics("o", 0, 100)))
	a, b, d := procs[0], procs[1], procs[2]
	caps := map[*helperProc]int{a: 50, b: 100, d: 50}
	covered("A, B, D", []*helperProc{a, b, d}, caps, time.Now())

	c := startHelper(t, named("C", all))
	caps[c] = 150
	covered("C joined", []*helperProc{a, b, c, d}, caps, time.Now())
	owners, err := topicOwners(s, all)
	require.NoError(t, err)
	split := splitOf(owners)
	for _, p := range []*helperProc{a, b, c, d} {
		if split[p.pid()] > 0 {
			waitProgress(t, s.pool, s.adapter, p.cfg.Name, began, 10, 30*time.Second)
		}
	}

	victim, partner := a, d
	if split[d.pid()] > split[a.pid()] {
		victim, partner = d, a
	}
	require.Positive(t, split[victim.pid()])
	victim.signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	rest := []*helperProc{partner, b, c}
	caps[partner] = 100 // alone on its set now
	afterKill := covered("after SIGKILL of "+victim.cfg.Name, rest, caps, killedAt)

	attempts := haltStreams(t, streams)
	waitProcessed(t, s.pool, s.adapter, all, time.Minute)
	covered("at the end", rest, caps, time.Now())
	for _, p := range rest {
		p.close(t)
	}

	h := loadHistory(t, s.pool, s.adapter, s.cfg.Group)
	sum := h.verify(t, all)
	failed, _ := h.verifyPublishes(t, attempts)
	assert.Zero(t, failed)
	// Nobody processed a topic it does not subscribe to.
	for _, r := range h.records {
		for _, p := range []*helperProc{a, b, c, d} {
			if r.proc == p.cfg.Name {
				assert.True(t, slices.Contains(p.cfg.Topics, r.topic), "%s processed %s of topic %s, which it does not subscribe to",
					r.proc, r.uuid, r.topic)
			}
		}
	}
	assertDuplicatesFollowTakeovers(t, h)
	lostSessions := 0
	for _, n := range sessionsOpened(h) {
		lostSessions += n - 1
	}
	if lostSessions == 0 {
		window := killWindow(h, all, victim.cfg.Name, killedAt)
		assert.Equal(t, window, h.duplicates(), "duplicates must be exactly what the killed process processed after its last commits")
		// A PollInterval per surviving member: see TestGroupSplitsTopicsEvenly.
		assert.Less(t, afterKill, ttl+time.Duration(len(rest))*s.cfg.PollInterval+500*time.Millisecond,
			"the dead process's rows must be owned again soon after its session expires")
	}
	counts := assertNoInvariantViolations(t, s)
	t.Logf("overlapping sets: %s killed with %d rows, all owned again %s after SIGKILL (SessionTTL %s); %d sessions lost; "+
		"%d messages (%d processed, %d more than once), %d claims; invariants: %s; whole run %s",
		victim.cfg.Name, split[victim.pid()], afterKill.Round(time.Millisecond), ttl, lostSessions, sum.messages, sum.records,
		sum.duplicates, sum.claims, counts, time.Since(began).Round(time.Millisecond))
}

// TestGroupConcurrentClaimsTakeEveryFreeRow checks that when free rows
// appear and several members below their cap claim them at the same
// moment, every free row is owned again soon, whichever claim commits
// first.
//
// Three Subscribers of one process, each on the group's 30 topics (caps of
// 10 each), split 15 of them; the other 15 belong to a dead member: a
// session row with no process behind it, as a SIGKILLed process leaves (it
// subscribes to no set of theirs, so it does not change their caps). At
// least two of the three are below their cap. Then the dead member's rows
// become free, and the members below their cap all claim at once; to make
// their statements overlap every time, as they do in some runs by
// themselves, the test holds a row lock that every claim needs until each
// of them waits for it, then lets them go.
//
//   - ExpiredSession: the dead session expires (its expiry is brought to a
//     second from now and announced, as a heartbeat would be); the claims
//     wait for its row lock, to delete it. The first deletes it and takes
//     the rows it asked for; the others, whose snapshot still showed the
//     session, find it deleted and take none of its rows, not even those
//     the first left.
//   - DeletedSession: the dead session's row is deleted (announced); the
//     claims wait for the lock of the first free offsets row. They all
//     picked the same rows, the first free ones in topic order: the first
//     takes them, the others lose every row they share with it.
//
// In both, a member whose claim took fewer rows than it asked for is not
// woken again before its next poll or the next expiry of a live member
// (long here: PollInterval 30s, SessionTTL 6s), so free rows stay without
// an owner for seconds. With the defaults that is up to a PollInterval
// (1s) per round of colliding claims; TestGroupSplitsTopicsEvenly sees up
// to about 2s between a killed process's session expiry and its last row
// taken, in processes, without the lock.
//
// This test fails until the library claims again at once when a claim
// took fewer rows than it asked for while free rows remain.
func TestGroupConcurrentClaimsTakeEveryFreeRow(t *testing.T) {
	t.Run("ExpiredSession", func(t *testing.T) { runConcurrentClaims(t, true) })
	t.Run("DeletedSession", func(t *testing.T) { runConcurrentClaims(t, false) })
}

func runConcurrentClaims(t *testing.T, expire bool) {
	const (
		group = "g"
		ttl   = 6 * time.Second
		poll  = 30 * time.Second
		share = 10
	)
	pool := newPool(t, 20)
	adapter := newSchema(t, pool)
	createTables(t, pool, adapter)
	ctx := context.Background()
	topics := numberedTopics("d", 0, 30)
	sessions, offsets := table(adapter, pglease.DefaultConsumerSessionsTable), table(adapter, pglease.DefaultConsumerOffsetsTable)

	dead := uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO `+sessions+` (id, consumer_group, owner, expires_at)
VALUES ($1, $2, 'dead/1', now() + interval '1 hour')`, dead, group)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, partition, session_id, epoch)
SELECT $1, t, 0, $2, 1 FROM unnest($3::text[]) t`, group, dead, topics[:15])
	require.NoError(t, err)

	// Every claim statement of each Subscriber: when it returned and how
	// many rows its session owned then.
	type claimStmt struct {
		sub   int
		at    time.Time
		owned int
	}
	var (
		mu    sync.Mutex
		stmts []claimStmt
		ids   = map[int]uuid.UUID{}
	)
	ownedBy := func() map[uuid.UUID]int {
		rows, err := pool.Query(ctx, `SELECT o.session_id FROM `+offsets+` o JOIN `+sessions+` s ON s.id = o.session_id
WHERE o.consumer_group = $1 AND s.expires_at > now() AND s.id <> $2`, group, dead)
		require.NoError(t, err)
		defer rows.Close()
		out := map[uuid.UUID]int{}
		for rows.Next() {
			var id uuid.UUID
			require.NoError(t, rows.Scan(&id))
			out[id]++
		}
		require.NoError(t, rows.Err())
		return out
	}
	for i := range 3 {
		sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: group, SessionTTL: ttl, PollInterval: poll})
		pglease.SetAfterClaimHook(sub, func([]string) error {
			mu.Lock()
			id, ok := ids[i]
			k := len(stmts)
			stmts = append(stmts, claimStmt{sub: i, at: time.Now(), owned: -1})
			mu.Unlock()
			owned := -1
			if ok {
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+offsets+` WHERE session_id = $1`, id).Scan(&owned)
			}
			mu.Lock()
			stmts[k].owned = owned
			mu.Unlock()
			return nil
		})
		for _, topic := range topics {
			_, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
		}
		waitFor(t, 10*time.Second, "the session of Subscriber "+strconv.Itoa(i), func() bool {
			mu.Lock()
			known := []string{dead.String()}
			for _, id := range ids {
				known = append(known, id.String())
			}
			mu.Unlock()
			var id uuid.UUID
			if err := pool.QueryRow(ctx, `SELECT id FROM `+sessions+` WHERE id <> ALL($1::uuid[]) LIMIT 1`, known).Scan(&id); err != nil {
				return false
			}
			mu.Lock()
			ids[i] = id
			mu.Unlock()
			return true
		})
	}
	waitFor(t, 20*time.Second, "the live Subscribers to own the 15 free topics, each within its cap", func() bool {
		n := 0
		for _, c := range ownedBy() {
			if c > share {
				return false
			}
			n += c
		}
		return n == 15
	})
	before := ownedBy()
	below := 0
	for i := range 3 {
		if before[ids[i]] < share {
			below++
		}
	}

	// Free the dead member's rows with the lock every claim needs held.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	var freed time.Time
	if expire {
		require.NoError(t, pool.QueryRow(ctx, `WITH u AS (
	UPDATE `+sessions+` SET expires_at = now() + interval '1 second' WHERE id = $1 RETURNING expires_at
)
SELECT u.expires_at FROM u, pg_notify($2, 'g' || $3::text)`, dead, tablesOf(adapter).NotifyChannel, group).Scan(&freed))
		_, err = lock.Exec(ctx, `SELECT 1 FROM `+sessions+` WHERE id = $1 FOR UPDATE`, dead)
		require.NoError(t, err)
	} else {
		_, err = lock.Exec(ctx, `SELECT 1 FROM `+offsets+` WHERE consumer_group = $1 AND topic = $2 FOR UPDATE`, group, topics[0])
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `WITH d AS (DELETE FROM `+sessions+` WHERE id = $1)
SELECT now() FROM pg_notify($2, 'g' || $3::text)`, dead, tablesOf(adapter).NotifyChannel, group).Scan(&freed))
	}
	// The claim is found by text from its first 1,024 bytes: what
	// pg_stat_activity keeps of a query (track_activity_query_size).
	waitFor(t, 3*ttl, fmt.Sprintf("the claims of the %d members below their cap to wait for the lock", below), func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%AS missing%' AND query LIKE '%' || $1 || '%'`,
			adapter.Schema).Scan(&n))
		return n == below
	})
	require.NoError(t, lock.Rollback(ctx))
	released := time.Now()
	var took time.Duration
	waitFor(t, 3*ttl, "the dead member's rows to be owned again", func() bool {
		n := 0
		for _, c := range ownedBy() {
			n += c
		}
		took = time.Since(freed)
		return n == len(topics)
	})

	after := ownedBy()
	var split, timeline []string
	for i := range 3 {
		split = append(split, fmt.Sprintf("sub %d: %d -> %d", i, before[ids[i]], after[ids[i]]))
	}
	mu.Lock()
	for _, st := range stmts {
		if st.at.After(freed.Add(-time.Second)) {
			timeline = append(timeline, fmt.Sprintf("sub %d %+dms (then owning %d)", st.sub, st.at.Sub(freed).Milliseconds(), st.owned))
		}
	}
	mu.Unlock()
	t.Logf("the dead member's 15 rows were all owned %s after they became free (SessionTTL %s, PollInterval %s); "+
		"the lock was let go %+dms after; rows owned %s; claim statements returned (from the time the rows became free): %s",
		took.Round(time.Millisecond), ttl, poll, released.Sub(freed).Milliseconds(), strings.Join(split, ", "),
		strings.Join(timeline, ", "))
	assert.Less(t, took, time.Second, "the dead member's rows must all be owned soon after they became free")
}
