package pglease

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
	peers := []member{me}
	for _, m := range members {
		if m.id != me.id && m.set == me.set && m.size == me.size {
			peers = append(peers, m)
		}
	}
	slices.SortFunc(peers, memberBefore)
	rank := slices.IndexFunc(peers, func(m member) bool { return m.id == me.id })
	n := len(peers)
	share := me.size / n
	if rank < me.size%n {
		share++
	}
	return share
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
