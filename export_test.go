package pglease

// PendingPublishes is how many Publish calls of p wait in its group commit
// for a worker (tests only).
func PendingPublishes(p *Publisher) int {
	if p.group == nil {
		return 0
	}
	b := &p.group.batcher
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// SetAfterClaimHook makes every claim statement of s run hook after it
// committed, returning hook's error instead of its outcome, as if the reply
// had been lost (tests only). Set it before the first Subscribe.
func SetAfterClaimHook(s *Subscriber, hook func(topics []string) error) {
	s.offsets.afterClaim = hook
}

// PartitionName is the bare name of a partition (or of one of the
// maintainer's functions) of a's messages table (tests only).
func PartitionName(a DefaultSchemaAdapter, suffix string) string {
	return a.partitionName(suffix)
}
