package pglease

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Limits of one group-committed statement.
const (
	groupMaxMessages = 1000
	groupMaxBytes    = 8 << 20
	groupMaxWorkers  = 4
)

// publishRequest is one Publish call waiting in a group commit.
type publishRequest struct {
	ctx    context.Context
	params InsertMessagesParams
	bytes  int
	done   chan error // buffered: the worker never blocks on a caller
}

// groupCommitter writes concurrent Publish calls on a pool together. A
// worker takes every call waiting (up to groupMaxMessages / groupMaxBytes)
// and writes them with one INSERT, so no call waits for a timer: calls
// batch up only while earlier statements run. One worker runs while one
// statement can take everything that waits; a further worker starts only
// for what one statement cannot take (up to a limit), because statements
// writing side by side into one table and index cost the server more per
// message than one larger statement. Workers start on demand and end as
// soon as nothing waits, so an idle Publisher runs no goroutine. A call
// that finds nothing running or waiting is its own worker, for its own
// messages only.
type groupCommitter struct {
	pool    *pgxpool.Pool
	adapter SchemaAdapter
	logger  watermill.LoggerAdapter
	workers int

	mu      sync.Mutex
	pending []*publishRequest
	queued  int // messages in pending
	qbytes  int // payload bytes in pending
	running int
	wg      sync.WaitGroup
}

func newGroupCommitter(pool *pgxpool.Pool, adapter SchemaAdapter, logger watermill.LoggerAdapter) *groupCommitter {
	workers := int(pool.Config().MaxConns) / 2
	workers = max(1, min(groupMaxWorkers, workers))
	return &groupCommitter{pool: pool, adapter: adapter, logger: logger, workers: workers}
}

// publish queues params and waits for the statement that writes them.
func (g *groupCommitter) publish(ctx context.Context, params InsertMessagesParams) error {
	g.mu.Lock()
	if g.running == 0 && len(g.pending) == 0 {
		// Nothing to group with: write in the caller's goroutine, which
		// saves two goroutine switches per call. The call takes a worker's
		// slot; calls arriving meanwhile queue for the goroutine that takes
		// the slot over when it is done.
		g.running++
		g.wg.Add(1)
		g.mu.Unlock()
		err := execInsert(ctx, g.pool, g.adapter, params)
		g.mu.Lock()
		if len(g.pending) > 0 {
			go g.work() // carries on with the slot
		} else {
			g.running--
			g.wg.Done()
		}
		g.mu.Unlock()
		return err
	}
	req := &publishRequest{ctx: ctx, params: params, done: make(chan error, 1)}
	for _, b := range params.Payloads {
		req.bytes += len(b)
	}
	g.pending = append(g.pending, req)
	g.queued += len(params.UUIDs)
	g.qbytes += req.bytes
	if g.running < g.workers && (g.running == 0 ||
		g.queued > g.running*groupMaxMessages || g.qbytes > g.running*groupMaxBytes) {
		g.running++
		g.wg.Add(1)
		go g.work()
	}
	g.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns once no worker runs; the Publisher calls it after the last
// Publish call returned.
func (g *groupCommitter) wait() { g.wg.Wait() }

func (g *groupCommitter) work() {
	defer g.wg.Done()
	for {
		batch := g.take()
		if batch == nil {
			return
		}
		g.write(batch)
	}
}

// take removes the next batch from the queue, or ends the worker (nil)
// when nothing waits.
func (g *groupCommitter) take() []*publishRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) == 0 {
		g.running--
		return nil
	}
	n, size, i := 0, 0, 0
	for i < len(g.pending) && (i == 0 || (n < groupMaxMessages && size < groupMaxBytes)) {
		n += len(g.pending[i].params.UUIDs)
		size += g.pending[i].bytes
		i++
	}
	g.queued -= n
	g.qbytes -= size
	batch := append([]*publishRequest(nil), g.pending[:i]...)
	g.pending = append(g.pending[:0], g.pending[i:]...)
	return batch
}

// write runs one statement for the batch. If the server rejects it, no
// message of the batch was stored, and each call is written on its own so
// that the error reaches only the calls it concerns. Other errors (a
// connection lost mid-statement) leave the outcome unknown and go to every
// call of the batch.
func (g *groupCommitter) write(batch []*publishRequest) {
	live := batch[:0]
	for _, req := range batch {
		if err := req.ctx.Err(); err != nil {
			req.done <- err
			continue
		}
		live = append(live, req)
	}
	if len(live) == 0 {
		return
	}
	if len(live) == 1 {
		live[0].done <- execInsert(live[0].ctx, g.pool, g.adapter, live[0].params)
		return
	}
	combined := InsertMessagesParams{NotifyChannel: live[0].params.NotifyChannel}
	for _, req := range live {
		combined.Topics = append(combined.Topics, req.params.Topics...)
		combined.UUIDs = append(combined.UUIDs, req.params.UUIDs...)
		combined.Payloads = append(combined.Payloads, req.params.Payloads...)
		combined.Metadata = append(combined.Metadata, req.params.Metadata...)
	}
	err := execInsert(context.Background(), g.pool, g.adapter, combined)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) {
		g.logger.Debug("Group commit rejected, writing its calls one by one", watermill.LogFields{
			"calls": len(live), "error": err.Error()})
		for _, req := range live {
			req.done <- execInsert(req.ctx, g.pool, g.adapter, req.params)
		}
		return
	}
	for _, req := range live {
		req.done <- err
	}
}
