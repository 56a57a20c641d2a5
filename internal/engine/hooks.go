package engine

import "time"

// The hooks and counters the root package's tests reach the engine
// through (its export_test.go). Nothing else calls them.

// PendingPublishes is how many Publish calls wait in g for a worker.
func (g *GroupCommitter) PendingPublishes() int {
	g.batcher.mu.Lock()
	defer g.batcher.mu.Unlock()
	return len(g.batcher.pending)
}

// SetAfterClaimHook makes every claim statement of s run hook after it
// committed, returning hook's error instead of its outcome, as if the
// reply had been lost. Set it before the first Subscribe.
func (s *Subscriber) SetAfterClaimHook(hook func(topics []string) error) { s.offsets.afterClaim = hook }

// SetBeforeDeadLetterCopyHook makes every dead-letter move of s call hook
// inside its transaction, after the move of the group past the message
// and before the insert of its copy. Set it before the first Subscribe.
func (s *Subscriber) SetBeforeDeadLetterCopyHook(hook func()) { s.offsets.beforeDeadLetterCopy = hook }

// SetFailureStepHook makes the failure policy of s (Settings.Retry) call
// hook at each step of an attempt (FailureStepPick, FailureStepCounted,
// FailureStepNacked, FailureStepRecorded) with the message's UUID and
// the attempt. It runs on the consumer's goroutine, which waits for it.
// Set it before the first Subscribe; without a policy it is never called.
func (s *Subscriber) SetFailureStepHook(hook func(step, uuid string, attempt int)) {
	if p := s.consumerDeps.failurePolicy; p != nil {
		p.step = hook
	}
}

// SetAfterMembersReadHook makes s call hook, with the number of members,
// after each read of its group. Set it before the first Subscribe.
func (s *Subscriber) SetAfterMembersReadHook(hook func(members int)) { s.member.afterRead = hook }

// Listening reports whether s receives notifications.
func (s *Subscriber) Listening() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listener.Listening()
}

// Reads is how many reads of messages s's consumers have run.
func (s *Subscriber) Reads() uint64 { return s.stats.reads.Load() }

// Stalls is how many times s's consumers found committed messages held
// back behind an older transaction for longer than pendingFastFor and
// slowed their re-polls to PollInterval.
func (s *Subscriber) Stalls() uint64 { return s.stats.stalls.Load() }

// Evicted is how many messages s's in-flight windows evicted while their
// key waited (tests only).
func (s *Subscriber) Evicted() uint64 { return s.stats.evicted.Load() }

// Rereads is how many reads of s's consumers read evicted messages again
// (tests only).
func (s *Subscriber) Rereads() uint64 { return s.stats.rereads.Load() }

// SetListenerProbe sets how often listeners probe their connection and how
// long a probe may take, until the returned function restores the
// defaults (not while a listener runs).
func SetListenerProbe(interval, timeout time.Duration) (restore func()) {
	oldInterval, oldTimeout := listenerProbeInterval, listenerProbeTimeout
	listenerProbeInterval, listenerProbeTimeout = interval, timeout
	return func() { listenerProbeInterval, listenerProbeTimeout = oldInterval, oldTimeout }
}

// SetPartitionRefresh sets how often Subscribers read their topics'
// partition counts again, until the returned function restores the
// default (not while a Subscriber runs).
func SetPartitionRefresh(interval time.Duration) (restore func()) {
	old := partitionRefreshInterval
	partitionRefreshInterval = interval
	return func() { partitionRefreshInterval = old }
}

// CheckDirect is checkDirect: nil when conn reaches its backend directly,
// an error wrapping ErrPooledConnection otherwise.
var CheckDirect = checkDirect

// ErrPooledConnection is errPooledConnection.
var ErrPooledConnection = errPooledConnection
