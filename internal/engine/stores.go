package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// This file holds the production stores of the group member, the
// consumers and the maintainer: thin types that run their statements
// (internal/pgsql) through the Subscriber's offset store, session keeper
// and pool. The decisions stay with the member, the consumers and the
// maintainer, which tests run against fakes.

// pgGroupStore is the groupStore of a Subscriber.
type pgGroupStore struct {
	offsets *offsetStore
	session *sessionKeeper
	group   string
	// timeout bounds each statement once it has a connection
	// (statementTimeout); releaseCtx bounds a release's wait for its turn.
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

func (p pgGroupStore) claimOffsets(ctx context.Context, rows []rowKey, g *sessionGen, limit int) ([]claimedRow, error) {
	return p.offsets.claimMany(ctx, p.timeout, p.group, rows, g, limit)
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

func (p pgGroupStore) offsetOwners(ctx context.Context, topics []string) (map[rowKey]rowOwner, error) {
	return p.offsets.owners(ctx, p.timeout, p.group, topics)
}

// pgConsumerStore is the consumerStore of a Subscriber.
type pgConsumerStore struct {
	offsets *offsetStore
	// timeout bounds each statement (statementTimeout): a read's once it
	// has a connection, a commit's with its wait for one. releaseCtx
	// bounds a release's wait for its turn.
	timeout    time.Duration
	releaseCtx context.Context
}

var _ consumerStore = pgConsumerStore{}

func (p pgConsumerStore) read(ctx context.Context, rp readParams) ([]storedMessage, bool, error) {
	return p.offsets.read(ctx, p.timeout, rp)
}

func (p pgConsumerStore) readAt(ctx context.Context, rp readAtParams) ([]storedMessage, error) {
	return p.offsets.readAt(ctx, p.timeout, rp)
}

func (p pgConsumerStore) countHead(ctx context.Context, c *claim) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return p.offsets.countHead(ctx, c)
}

func (p pgConsumerStore) commit(ctx context.Context, c *claim) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return p.offsets.commit(ctx, c)
}

func (p pgConsumerStore) release(c *claim) error {
	return p.offsets.release(p.releaseCtx, c)
}

// pgMaintainerStore is the maintainerStore of a Subscriber: the
// statements on its pool.
type pgMaintainerStore struct {
	pool   *pgxpool.Pool
	driver *pgsql.Lazy
}

var _ maintainerStore = pgMaintainerStore{}

func (p pgMaintainerStore) access(ctx context.Context) (pgsql.AccessRow, error) {
	return p.driver.MaintainerAccess(ctx, p.pool)
}

func (p pgMaintainerStore) holder(ctx context.Context) (pgsql.HolderRow, error) {
	return p.driver.MaintainerHolder(ctx, p.pool)
}

func (p pgMaintainerStore) claim(ctx context.Context, session uuid.UUID) (pgsql.HolderRow, error) {
	return p.driver.ClaimMaintainer(ctx, p.pool, pgsql.MaintainerParams{SessionID: session})
}

func (p pgMaintainerStore) release(ctx context.Context, session uuid.UUID, epoch int64) error {
	return p.driver.ReleaseMaintainer(ctx, p.pool,
		pgsql.MaintainerParams{SessionID: session, Epoch: epoch, NotifyChannel: p.driver.Tables().NotifyChannel})
}

func (p pgMaintainerStore) moveDue(ctx context.Context, limit int) (int64, *int64, error) {
	return p.driver.MoveDueMessages(ctx, p.pool, pgsql.MoveDueParams{Limit: limit, NotifyChannel: p.driver.Tables().NotifyChannel})
}

func (p pgMaintainerStore) deleteExpiredSessions(ctx context.Context, ttl time.Duration) (int64, error) {
	return p.driver.DeleteExpiredSessions(ctx, p.pool, ttl)
}

func (p pgMaintainerStore) forgetKeys(ctx context.Context) (int, error) {
	return p.driver.ForgetKeys(ctx, p.pool)
}

func (p pgMaintainerStore) deleteIdleGroups(ctx context.Context, idleFor time.Duration) ([]pgsql.IdleGroupRow, error) {
	return p.driver.DeleteIdleGroups(ctx, p.pool, idleFor)
}
