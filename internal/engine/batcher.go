package engine

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"
)

// batcher runs writes that callers wait for, and combines the writes that
// arrive together: the group commit of Publish calls and the releases of
// topics at Close.
//
// A write that finds nothing running or waiting runs in the caller's
// goroutine, on its own (no goroutine switch). Writes arriving while others
// run queue up; a worker takes everything queued, up to maxCount units and
// maxBytes bytes, and writes it with one call of many. No write waits for a
// timer: writes combine only while earlier ones run. One worker runs while
// one combined write can take everything queued; a further one starts only
// for what it cannot take, up to workers, because writes side by side into
// the same rows and pages cost the server more than one larger write.
// After a combined write the worker lets the goroutines it released run
// first (gather), so that callers writing in a loop join the next combined
// write. Workers end as soon as nothing waits, so an idle batcher runs no
// goroutine.
//
// If many fails with a *pgconn.PgError, the server rejected the combined
// write and nothing of it took effect: each item is written again on its
// own, so that the error reaches only the callers it concerns. Other errors
// (a connection lost mid-write) leave the outcome unknown and go to every
// caller of the combined write.
type batcher[T any] struct {
	workers  int
	maxCount int
	maxBytes int // 0: no limit
	// one writes a single item, on the caller's context.
	one func(ctx context.Context, item T) error
	// many writes two or more items together and returns each item's
	// outcome (nil: all succeeded), or an error for the whole write.
	many func(ctx context.Context, items []T) ([]error, error)
	// what names the combined write in logs.
	what   string
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	pending []*batchRequest[T]
	count   int // units in pending
	bytes   int // bytes in pending
	running int
	wg      sync.WaitGroup
}

type batchRequest[T any] struct {
	ctx   context.Context
	item  T
	count int
	bytes int
	done  chan error // buffered: a worker never blocks on a caller
}

// do writes item, which weighs count units and bytes bytes, and returns its
// outcome, or the context's error if ctx ends first (the item may then be
// written or not).
func (b *batcher[T]) do(ctx context.Context, item T, count, bytes int) error {
	b.mu.Lock()
	if b.running == 0 && len(b.pending) == 0 {
		// The call takes a worker's slot; writes arriving meanwhile queue
		// for the goroutine that takes the slot over when it is done.
		b.running++
		b.wg.Add(1)
		b.mu.Unlock()
		err := b.one(ctx, item)
		b.mu.Lock()
		if len(b.pending) > 0 {
			go b.work() // carries on with the slot
		} else {
			b.running--
			b.wg.Done()
		}
		b.mu.Unlock()
		return err
	}
	req := &batchRequest[T]{ctx: ctx, item: item, count: count, bytes: bytes, done: make(chan error, 1)}
	b.pending = append(b.pending, req)
	b.count += count
	b.bytes += bytes
	if b.running < b.workers && (b.running == 0 || b.count > b.running*b.maxCount ||
		(b.maxBytes > 0 && b.bytes > b.running*b.maxBytes)) {
		b.running++
		b.wg.Add(1)
		go b.work()
	}
	b.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns once no worker runs.
func (b *batcher[T]) wait() { b.wg.Wait() }

func (b *batcher[T]) work() {
	defer b.wg.Done()
	for {
		batch := b.take()
		if batch == nil {
			return
		}
		b.write(batch)
		if len(batch) > 1 {
			b.gather()
		}
	}
}

// gatherYields bounds how often a worker yields after a combined write.
const gatherYields = 5

// gather lets the callers that the last combined write released run before
// the worker takes the next write. Callers that publish in a loop write
// again at once; without this, the first one back would find the queue
// empty and the worker gone and write alone, and the others would queue
// behind it, so that the combined writes alternate between a few items and
// the rest, each paying a round trip and a commit. It yields the processor
// while the queue grows, at most gatherYields times. No timer: a yield
// returns at once when no other goroutine is ready to run.
func (b *batcher[T]) gather() {
	n := -1
	for range gatherYields {
		runtime.Gosched()
		b.mu.Lock()
		m := len(b.pending)
		b.mu.Unlock()
		if m == n {
			return
		}
		n = m
	}
}

// take removes the next combined write from the queue, or ends the worker
// (nil) when nothing waits.
func (b *batcher[T]) take() []*batchRequest[T] {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) == 0 {
		b.running--
		return nil
	}
	n, size, i := 0, 0, 0
	for i < len(b.pending) && (i == 0 || (n < b.maxCount && (b.maxBytes == 0 || size < b.maxBytes))) {
		n += b.pending[i].count
		size += b.pending[i].bytes
		i++
	}
	b.count -= n
	b.bytes -= size
	batch := append([]*batchRequest[T](nil), b.pending[:i]...)
	b.pending = append(b.pending[:0], b.pending[i:]...)
	return batch
}

func (b *batcher[T]) write(batch []*batchRequest[T]) {
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
		live[0].done <- b.one(live[0].ctx, live[0].item)
		return
	}
	items := make([]T, len(live))
	for i, req := range live {
		items[i] = req.item
	}
	ctx, cancel := latestDeadline(live)
	defer cancel()
	errs, err := b.many(ctx, items)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		b.logger.Debug(b.what+" rejected, writing its items one by one", watermill.LogFields{
			"items": len(live), "error": err.Error()})
		for _, req := range live {
			req.done <- b.one(req.ctx, req.item)
		}
		return
	}
	for i, req := range live {
		if err == nil && errs != nil {
			req.done <- errs[i]
			continue
		}
		req.done <- err
	}
}

// latestDeadline returns a context that ends at the latest deadline of the
// requests' contexts (none if one of them has none), so that a combined
// write runs as long as any of its callers waits.
func latestDeadline[T any](reqs []*batchRequest[T]) (context.Context, context.CancelFunc) {
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
