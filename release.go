package pglease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
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
	tables *pgsql.Tables
	// timeout bounds each statement (or batch) once it is sent; the wait
	// in the queue before it is bounded by the caller's context only, so
	// that Close of 100,000 subscriptions does not time out the releases
	// queued behind the first batches.
	timeout time.Duration
	batcher batcher[release]
}

func newReleaser(pool *pgxpool.Pool, tables *pgsql.Tables, timeout time.Duration, logger watermill.LoggerAdapter) *releaser {
	r := &releaser{pool: pool, tables: tables, timeout: timeout}
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
		return pgsql.ReleaseOffset(ctx, q, r.tables, rel.params)
	}, rel.claim, "release topic")
}

// releaseMany sends the releases as one batch, which is one implicit
// transaction, the rows updated in (topic, partition) order whatever the order of the
// calls.
func (r *releaser) releaseMany(ctx context.Context, rels []release) ([]error, error) {
	if r.tables.OnCitus() {
		// A release is two statements there (see pgsql.ReleaseOffset).
		errs := make([]error, len(rels))
		for i, rel := range rels {
			errs[i] = r.releaseOne(ctx, rel)
		}
		return errs, nil
	}
	order := make([]int, len(rels))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareRows(rels[a].claim.row(), rels[b].claim.row()) })

	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	batch := &pgx.Batch{}
	for _, i := range order {
		r.tables.ReleaseOffset(rels[i].params).Queue(batch)
	}
	results := conn.SendBatch(ctx, batch)
	errs := make([]error, len(rels))
	for _, i := range order {
		released, err := pgsql.ScanRelease(results.QueryRow())
		switch {
		case errors.Is(err, pgsql.ErrWentBack):
			errs[i] = fmt.Errorf("release topic %q: %w", rels[i].claim.topic, err)
		case err != nil:
			_ = results.Close()
			return nil, err
		case released == 0:
			errs[i] = ownershipLost("release topic", rels[i].claim)
		}
	}
	if err := results.Close(); err != nil {
		return nil, err
	}
	return errs, nil
}
