package pglease

// PendingPublishes is how many Publish calls of p wait in its group commit
// for a worker (tests only).
func PendingPublishes(p *Publisher) int {
	if p.group == nil {
		return 0
	}
	p.group.mu.Lock()
	defer p.group.mu.Unlock()
	return len(p.group.pending)
}
