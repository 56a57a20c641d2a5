package pglease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// releaseBatchMax bounds the releases sent in one pipelined batch.
const releaseBatchMax = 1000

// releaseRequest is one release waiting to be written.
type releaseRequest struct {
	ctx   context.Context
	claim *claim
	query Query
	done  chan error // buffered: the worker never blocks on a caller
}

// releaser writes the releases of a Subscriber's consumers. A release that
// finds nothing else under way is written on its own. Releases that arrive
// while one is written (Close ending thousands of subscriptions at once)
// queue up, and one worker sends everything queued as one pipelined batch:
// one round trip and one transaction per releaseBatchMax releases, instead
// of one each.
type releaser struct {
	gate *dataGate

	mu      sync.Mutex
	pending []*releaseRequest
	running bool
	wg      sync.WaitGroup
}

func newReleaser(gate *dataGate) *releaser { return &releaser{gate: gate} }

// release writes q, the release statement of c, and reports its outcome:
// ErrOwnershipLost when the claim was already taken over.
func (r *releaser) release(ctx context.Context, c *claim, q Query) error {
	r.mu.Lock()
	if !r.running && len(r.pending) == 0 {
		r.running = true
		r.wg.Add(1)
		r.mu.Unlock()
		err := r.writeOne(ctx, c, q)
		r.mu.Lock()
		if len(r.pending) > 0 {
			go r.work() // carries on with what queued meanwhile
		} else {
			r.running = false
			r.wg.Done()
		}
		r.mu.Unlock()
		return err
	}
	req := &releaseRequest{ctx: ctx, claim: c, query: q, done: make(chan error, 1)}
	r.pending = append(r.pending, req)
	if !r.running {
		r.running = true
		r.wg.Add(1)
		go r.work()
	}
	r.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("release topic %q: %w", c.topic, ctx.Err())
	}
}

// wait returns once no worker runs.
func (r *releaser) wait() { r.wg.Wait() }

func (r *releaser) work() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		n := min(len(r.pending), releaseBatchMax)
		batch := slices.Clone(r.pending[:n])
		r.pending = slices.Delete(r.pending, 0, n)
		r.mu.Unlock()
		r.writeBatch(batch)
	}
}

func (r *releaser) writeOne(ctx context.Context, c *claim, q Query) error {
	return r.gate.execFenced(ctx, q, c, "release topic")
}

// writeBatch sends the releases as one batch. The batch is one implicit
// transaction: if any statement fails, none took effect, and each release
// is written on its own so that the error reaches only the releases it
// concerns.
func (r *releaser) writeBatch(reqs []*releaseRequest) {
	live := reqs[:0]
	for _, req := range reqs {
		if err := req.ctx.Err(); err != nil {
			req.done <- fmt.Errorf("release topic %q: %w", req.claim.topic, err)
			continue
		}
		live = append(live, req)
	}
	if len(live) == 0 {
		return
	}
	if len(live) == 1 {
		live[0].done <- r.writeOne(live[0].ctx, live[0].claim, live[0].query)
		return
	}
	// Rows are locked in one order whatever the order of the calls.
	slices.SortFunc(live, func(a, b *releaseRequest) int { return strings.Compare(a.claim.topic, b.claim.topic) })

	ctx, cancel := latestDeadline(live)
	defer cancel()
	affected, err := r.sendBatch(ctx, live)
	if err != nil {
		for _, req := range live {
			req.done <- r.writeOne(req.ctx, req.claim, req.query)
		}
		return
	}
	for i, req := range live {
		if affected[i] == 0 {
			req.done <- fmt.Errorf("release topic %q (epoch %d): %w", req.claim.topic, req.claim.epoch, ErrOwnershipLost)
			continue
		}
		req.done <- nil
	}
}

func (r *releaser) sendBatch(ctx context.Context, reqs []*releaseRequest) ([]int64, error) {
	conn, err := r.gate.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer r.gate.release(conn)
	batch := &pgx.Batch{}
	for _, req := range reqs {
		batch.Queue(req.query.SQL, req.query.Args...)
	}
	results := conn.SendBatch(ctx, batch)
	affected := make([]int64, len(reqs))
	var execErr error
	for i := range reqs {
		tag, err := results.Exec()
		if err != nil {
			execErr = err
			break
		}
		affected[i] = tag.RowsAffected()
	}
	if err := results.Close(); err != nil && execErr == nil {
		execErr = err
	}
	return affected, execErr
}

// latestDeadline returns a context that ends at the latest deadline of the
// requests' contexts (none if one of them has none), so that a batch runs
// as long as any of its callers waits.
func latestDeadline(reqs []*releaseRequest) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, req := range reqs {
		d, ok := req.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
