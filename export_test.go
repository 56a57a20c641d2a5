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
