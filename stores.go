package pglease

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// This file holds the production stores of the group member and the
// maintainer: thin types that run their statements (internal/pgsql)
// through the Subscriber's offset store, session keeper and pool. The
// decisions stay with the member and the maintainer, which tests run
// against fakes.

// pgGroupStore is the groupStore of a Subscriber.
type pgGroupStore struct {
	offsets *offsetStore
	session *sessionKeeper
	group   string
	// timeout bounds each statement once it has a connection
	// (SessionTTL); releaseCtx bounds a release's wait for its turn.
	timeout    time.Duration
	releaseCtx context.Context
}

var _ groupStore = pgGroupStore{}

func (p pgGroupStore) partitionCounts(ctx context.Context, topics []string) (map[string]int, error) {
	return p.offsets.partitionCounts(ctx, p.timeout, topics)
}

func (p pgGroupStore) ensureOffsets(ctx context.Context, rows []rowKey, latest bool) ([]createdRow, error) {
	return p.offsets.ensureMany(ctx, p.timeout, p.group, rows, latest)
}

func (p pgGroupStore) claimOffsets(ctx context.Context, rows []rowKey, session uuid.UUID, limit int) ([]claimedRow, error) {
	return p.offsets.claimMany(ctx, p.timeout, p.group, rows, session, limit)
}

func (p pgGroupStore) releaseOffset(c *claim) error {
	return p.offsets.release(p.releaseCtx, c)
}

func (p pgGroupStore) setSubscriptions(g *sessionGen, set rowSet) (bool, error) {
	return p.session.setSubscriptions(g, set)
}

func (p pgGroupStore) groupMembers() ([]member, error) {
	return p.session.groupMembers()
}
