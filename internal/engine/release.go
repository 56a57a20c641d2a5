package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// releaseBatchMax bounds the releases sent in one pipelined batch.
const releaseBatchMax = 1000

// release is one claim's release: the parameters of its statement.
type release struct {
	claim  *claim
	params pgsql.OffsetParams
}

// releaser writes the releases of a Subscriber's consumers. Releases that
// come together (Close ending thousands of subscriptions at once) are sent
// as one pipelined batch (see batcher): one round trip and one transaction
// per releaseBatchMax releases, instead of one each.
type releaser struct {
	pool   *pgxpool.Pool
	driver *pgsql.Lazy
	// timeout bounds each statement (or batch) once it is sent; the wait
	// in the queue before it is bounded by the caller's context only, so
	// that Close of 100,000 subscriptions does not time out the releases
	// queued behind the first batches.
	timeout time.Duration
	batcher batcher[release]
}

func newReleaser(pool *pgxpool.Pool, driver *pgsql.Lazy, timeout time.Duration, logger watermill.LoggerAdapter) *releaser {
	r := &releaser{pool: pool, driver: driver, timeout: timeout}
	r.batcher = batcher[release]{
		workers:  1,
		maxCount: releaseBatchMax,
		one:      r.releaseOne,
		many:     r.releaseMany,
		what:     "Release batch",
		logger:   logger,
	}
	return r
}

// release runs the release statement of c with p: ErrOwnershipLost when
// the claim was already taken over, an error wrapping pgsql.ErrWentBack
// when the statement ran elsewhere than c's session was made.
func (r *releaser) release(ctx context.Context, c *claim, p pgsql.OffsetParams) error {
	return r.batcher.do(ctx, release{claim: c, params: p}, 1, 0)
}

// wait returns once no worker runs.
func (r *releaser) wait() { r.batcher.wait() }

func (r *releaser) releaseOne(ctx context.Context, rel release) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return execFenced(ctx, r.pool, func(q pgsql.Querier) (int64, error) {
		return r.driver.ReleaseOffset(ctx, q, rel.params)
	}, rel.claim, "release topic")
}

// releaseMany runs the releases on one connection (see
// pgsql.Driver.ReleaseOffsets: one pipelined batch, which is one implicit
// transaction, on a single node), the rows in (topic, partition) order
// whatever the order of the calls.
func (r *releaser) releaseMany(ctx context.Context, rels []release) ([]error, error) {
	order := make([]int, len(rels))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareRows(rels[a].claim.row(), rels[b].claim.row()) })

	actx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	conn, err := r.pool.Acquire(actx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	params := make([]pgsql.OffsetParams, len(order))
	for k, i := range order {
		params[k] = rels[i].params
	}
	results, err := r.driver.ReleaseOffsets(ctx, conn, params, r.timeout)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(rels))
	for k, i := range order {
		switch res := results[k]; {
		case res.Err != nil:
			errs[i] = fmt.Errorf("release topic %q: %w", rels[i].claim.topic, res.Err)
		case res.Released == 0:
			errs[i] = ownershipLost("release topic", rels[i].claim)
		}
	}
	return errs, nil
}
