package engine

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"time"

	"github.com/google/uuid"
)

// This file holds the arithmetic of fair share, which needs no database:
// which live sessions of a group share a set of rows, and how many rows each
// of them may own.

// groupProtocol is the version of the group's rules that this release
// follows, recorded in its sessions (the protocol column): 2, shares
// capped by topic, and a free row taken by any member that waits for it
// after a grace (graceState). Sessions of releases that do not record it
// read as 1: the share as a total or by topic, and a free row taken only
// by a member below its share. Members of different versions work
// together (docs/guarantees.md, "Rolling deploys"); a member logs when
// its group has members of another version.
const groupProtocol = 2

// member is one live session of a consumer group as the sessions table
// showed it.
type member struct {
	id        uuid.UUID
	createdAt time.Time // the server's clock: only compared with each other
	// expiresAt is when the session expires unless extended, on this
	// process's clock: the time of the read plus what the server said was
	// left.
	expiresAt time.Time
	// set identifies the rows the member subscribes to (setHash); size
	// counts them.
	set  uint64
	size int
	// owner is the session's owner (host/pid), for the logs.
	owner string
	// protocol is the version of the group's rules the session follows
	// (groupProtocol for this release's; 1 for releases that do not
	// record it).
	protocol int
}

// memberBefore orders members by age, then id: a member that joins ranks
// after those already there, so a join changes no one's rank.
func memberBefore(a, b member) int {
	if c := a.createdAt.Compare(b.createdAt); c != 0 {
		return c
	}
	return slices.Compare(a.id[:], b.id[:])
}

// shareOf returns how many rows member me may own. The members that share
// its set of rows (same set hash) split those rows: ranked by memberBefore,
// the first size mod n get size/n + 1 rows and the others size/n, so that
// the caps add up to exactly size. Members that subscribe to other sets do
// not count: each set is split among its own subscribers (docs/architecture.md,
// "Fair share"). me is counted even when members, read before its session
// was visible, lack it. Expired members must be left out by the caller.
func shareOf(members []member, me member) int {
	if me.size == 0 {
		return 0
	}
	rank, n := rankOf(members, me)
	share := me.size / n
	if rank < me.size%n {
		share++
	}
	return share
}

// rankOf returns me's rank among the members that share its set of rows
// (me counted when missing), and how many they are.
func rankOf(members []member, me member) (rank, n int) {
	peers := []member{me}
	for _, m := range members {
		if m.id != me.id && m.set == me.set && m.size == me.size {
			peers = append(peers, m)
		}
	}
	slices.SortFunc(peers, memberBefore)
	return slices.IndexFunc(peers, func(m member) bool { return m.id == me.id }), len(peers)
}

// setShape is how a member's set of rows falls into topics: the number of
// rows of each topic it subscribes to more than one partition of, and the
// number of topics it subscribes to one row of. Members of one set have
// the same shape. Not safe for concurrent use.
type setShape struct {
	topics  map[string]int // every topic's rows
	multi   map[string]int // topics of more than one row
	singles int            // topics of one row
}

func (s *setShape) add(topic string) {
	if s.topics == nil {
		s.topics, s.multi = map[string]int{}, map[string]int{}
	}
	n := s.topics[topic] + 1
	s.topics[topic] = n
	switch n {
	case 1:
		s.singles++
	case 2:
		s.singles--
		s.multi[topic] = n
	default:
		s.multi[topic] = n
	}
}

func (s *setShape) remove(topic string) {
	n := s.topics[topic] - 1
	switch {
	case n < 0:
		return
	case n == 0:
		delete(s.topics, topic)
		s.singles--
	case n == 1:
		s.topics[topic] = n
		delete(s.multi, topic)
		s.singles++
	default:
		s.topics[topic] = n
		s.multi[topic] = n
	}
}

// shareCaps is a member's share split by topic.
type shareCaps struct {
	total   int            // the share (shareOf)
	topics  map[string]int // the cap of each topic of more than one row
	singles int            // the cap of the topics of one row, together
}

// capsOf splits me's share by topic, so that the members of a set spread
// each topic's partitions evenly as well as the rows: each of the n
// members may own floor(P/n) or floor(P/n)+1 of the P rows of a topic.
// The extra rows (P mod n of each topic, in topic order, then the topics
// of one row, which are spread as one pool) go to the members in rank
// order, round-robin, each topic starting at the rank after the last
// extra row of the one before: rank r gets floor(T/n)+1 extra-inclusive
// rows exactly when r < T mod n, so the caps of a member add up to its
// share and the caps of a topic to its rows. Where shape does not add
// up to me.size (the set changed since it was published), the caps
// follow shape and the total stays shareOf.
func capsOf(members []member, me member, shape setShape) shareCaps {
	c := shareCaps{total: shareOf(members, me), topics: make(map[string]int, len(shape.multi))}
	if me.size == 0 {
		for t := range shape.multi {
			c.topics[t] = 0
		}
		return c
	}
	rank, n := rankOf(members, me)
	topics := make([]string, 0, len(shape.multi))
	for t := range shape.multi {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	// extra reports whether rank gets one of the extra rows numbered
	// from..from+k-1 round-robin.
	extra := func(from, k int) bool { return (rank-from%n+n)%n < k }
	next := 0 // the rank the next extra row goes to
	for _, t := range topics {
		p := shape.multi[t]
		c.topics[t] = p / n
		if extra(next, p%n) {
			c.topics[t]++
		}
		next = (next + p%n) % n
	}
	c.singles = shape.singles / n
	if extra(next, shape.singles%n) {
		c.singles++
	}
	return c
}

// rowHash hashes one (topic, partition) row for setHash: FNV-1a over the
// topic, a NUL (topics hold none) and the partition, then a finalizer that
// spreads the bits, so that the XOR of many rows stays uniform.
func rowHash(topic string, partition int32) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(topic))
	var p [5]byte
	binary.BigEndian.PutUint32(p[1:], uint32(partition))
	_, _ = h.Write(p[:])
	return mix64(h.Sum64())
}

// mix64 is the finalizer of SplitMix64.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// rowSet is a set of rows kept with its hash: the XOR of the rows' hashes,
// the same in every process for the same rows, whatever the order they were
// added in, and updated in O(1). Not safe for concurrent use.
type rowSet struct {
	hash uint64
	size int
}

func (s *rowSet) add(topic string, partition int32) {
	s.hash ^= rowHash(topic, partition)
	s.size++
}

func (s *rowSet) remove(topic string, partition int32) {
	s.hash ^= rowHash(topic, partition)
	s.size--
}

// nextExpiry returns the earliest expiry among members other than me that
// is after now, and false if there is none: when the group may have to be
// split again.
func nextExpiry(members []member, me uuid.UUID, now time.Time) (time.Time, bool) {
	var next time.Time
	found := false
	for _, m := range members {
		if m.id == me || !m.expiresAt.After(now) {
			continue
		}
		if !found || m.expiresAt.Before(next) {
			next, found = m.expiresAt, true
		}
	}
	return next, found
}
