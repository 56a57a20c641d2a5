package pglease

import (
	"os"
	"time"

	"github.com/pglease/watermill-pglease/internal/engine"
)

// PendingPublishes is how many Publish calls of p wait in its group commit
// for a worker (tests only).
func PendingPublishes(p *Publisher) int {
	if p.group == nil {
		return 0
	}
	return p.group.PendingPublishes()
}

// SetAfterClaimHook makes every claim statement of s run hook after it
// committed, returning hook's error instead of its outcome, as if the reply
// had been lost (tests only). Set it before the first Subscribe.
func SetAfterClaimHook(s *Subscriber, hook func(topics []string) error) {
	s.engine.SetAfterClaimHook(hook)
}

// SetListenerProbe sets how often listeners probe their connection and how
// long a probe may take, until the returned function restores the defaults
// (tests only; not while a listener runs).
func SetListenerProbe(interval, timeout time.Duration) (restore func()) {
	return engine.SetListenerProbe(interval, timeout)
}

// SetZeroDrainTimeout sets what a zero SubscriberConfig.DrainTimeout
// means (tests only: the package's tests hold messages at Close without
// waiting, but those of the wait, which set it, and the helper processes).
func SetZeroDrainTimeout(d time.Duration) {
	zeroDrainTimeout = d
}

// CheckDirect is checkDirect: nil when conn reaches its backend directly,
// an error wrapping ErrPooledConnection otherwise (tests only).
var CheckDirect = engine.CheckDirect

// ErrPooledConnection is errPooledConnection (tests only).
var ErrPooledConnection = engine.ErrPooledConnection

// Listening reports whether s receives notifications (tests only).
func Listening(s *Subscriber) bool {
	return s.engine.Listening()
}

// SetAfterMembersReadHook makes s call hook, with the number of members,
// after each read of its group (tests only). Set it before the first
// Subscribe.
func SetAfterMembersReadHook(s *Subscriber, hook func(members int)) {
	s.engine.SetAfterMembersReadHook(hook)
}

// PartitionName is the bare name of a partition (or of one of the
// maintainer's functions) of a's messages table (tests only).
func PartitionName(a Tables, suffix string) string {
	return a.tables().PartitionName(suffix)
}

// SetPartitionRefresh sets how often Subscribers read their topics'
// partition counts again, until the returned function restores the default
// (tests only; not while a Subscriber runs).
func SetPartitionRefresh(interval time.Duration) (restore func()) {
	return engine.SetPartitionRefresh(interval)
}

// Reads is how many reads of messages s's consumers have run (tests only).
func Reads(s *Subscriber) uint64 { return s.engine.Reads() }

// Stalls is how many times s's consumers found committed messages held back
// behind an older transaction for longer than pendingFastFor and slowed
// their re-polls to PollInterval (tests only).
func Stalls(s *Subscriber) uint64 { return s.engine.Stalls() }

// Evicted is how many messages s's in-flight windows evicted while their
// key waited (tests only).
func Evicted(s *Subscriber) uint64 { return s.engine.Evicted() }

// Rereads is how many reads of s's consumers read evicted messages again
// (tests only).
func Rereads(s *Subscriber) uint64 { return s.engine.Rereads() }

// KeyDigest is what the keys table stores of an idempotency key.
var KeyDigest = keyDigest

// SetBeforeDeadLetterCopyHook makes every dead-letter move of s call hook
// inside its transaction, between the move of the group past the message
// and the copy's insert (tests only). Set it before the first Subscribe.
func SetBeforeDeadLetterCopyHook(s *Subscriber, hook func()) {
	s.engine.SetBeforeDeadLetterCopyHook(hook)
}

// The steps of an attempt at which a failure-step hook is called (see
// SetFailureStepHook), and the one inside a dead-letter move's
// transaction (SetBeforeDeadLetterCopyHook).
const (
	FailureStepPick     = engine.FailureStepPick
	FailureStepCounted  = engine.FailureStepCounted
	FailureStepNacked   = engine.FailureStepNacked
	FailureStepRecorded = engine.FailureStepRecorded
)

// SetFailureStepHook makes the failure policy of s call hook at each step
// of an attempt, with the message's UUID and the attempt, on the
// consumer's goroutine (tests only). Set it before the first Subscribe.
func SetFailureStepHook(s *Subscriber, hook func(step, uuid string, attempt int)) {
	s.engine.SetFailureStepHook(hook)
}

func init() { routeForTests = os.Getenv("PGLEASE_TEST_CITUS_ROUTE") != "" }

// RefreshRoutes makes p read where the shards are on its next routed Publish
// (tests only).
func RefreshRoutes(p *Publisher) {
	if p.router != nil {
		p.router.Invalidate()
	}
}

// Routing reports whether p routes its calls to the Citus workers
// (tests only).
func Routing(p *Publisher) bool { return p.router != nil }
