package engine

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Reading a Subscriber's messages on the topic's Citus worker.
//
// The reads of a claim's messages (SelectMessages with its bound's
// statement, SelectMessagesAt) are statements that Citus routes to the
// topic's worker whole: through the coordinator, the worker evaluates
// all of them, the bound, the counter and the worker's identity
// (WorkerHere) included, and the coordinator only plans and relays
// them. A worker that holds the cluster's metadata (Citus 11 and later)
// plans them the same way and runs them on its own shard, in the same
// kind of implicit transaction with a snapshot of its own: what a read
// sees, and what it checks, is the same wherever it was sent. When the
// shard is no longer on the worker a read reaches (moved since the
// ReadRouter read the catalog), that worker forwards the statement to
// the shard's node, as the coordinator would: its identity check then
// compares the claim's worker with the one that holds the shard now,
// as through the coordinator.
//
// What a routed read never decides alone: a read that found the
// database elsewhere (went back, the shard moved) is made again through
// the coordinator, whose answer the consumer acts on, and the
// ReadRouter reads the catalog again. A worker whose map is stale (a
// failover the Router has not read yet) can then only cost a read more;
// the acknowledgements, claims and heartbeats, which decide positions
// and ownership, go through the coordinator.

// componentReadRoute is the component of a ReadRouter's log lines.
const componentReadRoute = "subscriber routing"

// routeAcquireTimeout bounds the wait for a connection to a worker
// (its dial included): past it the read goes through the coordinator
// and the worker is left out for RetryAfter. A routed read's statement
// then has the statement timeout.
const routeAcquireTimeout = 5 * time.Second

// ReadRouter sends a Subscriber's reads of messages to the worker that
// holds each topic's shard, on a pool of its own per worker, and says
// when a read is to go through the coordinator instead: as a Router
// does for a Publisher (whose map of the shards it keeps, a Router of
// its own), and after any failure of a routed read, which is then made
// through the coordinator (a read changes nothing: it can be made
// again). Safe for concurrent use.
type ReadRouter struct {
	r *Router

	connectMu sync.Mutex // held while a node's pool is opened
	mu        sync.Mutex
	pools     map[*routeNode]*pgxpool.Pool
	closed    bool
}

// NewReadRouter returns the ReadRouter of a Subscriber on coordinator,
// which opens the workers' pools with connect (DefaultConnect when nil).
func NewReadRouter(coordinator *pgxpool.Pool, driver *pgsql.Lazy, connect ConnectFunc, logger watermill.LoggerAdapter) *ReadRouter {
	return &ReadRouter{r: newRouter(coordinator, driver, connect, logger, componentReadRoute, "read"),
		pools: map[*routeNode]*pgxpool.Pool{}}
}

// readFunc runs a read on q, within ctx.
type readFunc func(ctx context.Context, q pgsql.Querier) (pgsql.SelectResult, error)

// Read runs read on the worker that holds topic's shard, timeout
// bounding its statements once it has a connection. routed false means
// its result is not to be used: the read is to be made through the
// coordinator (err is then nil). routed true with an error: ctx ended.
func (rr *ReadRouter) Read(ctx context.Context, timeout time.Duration, topic string, read readFunc) (res pgsql.SelectResult, routed bool, err error) {
	r := rr.r
	n := rr.node(ctx, timeout, topic)
	if n == nil {
		return pgsql.SelectResult{}, false, nil
	}
	pool, err := rr.pool(ctx, n)
	if err != nil {
		rr.down(ctx, n, err)
		return pgsql.SelectResult{}, false, nil
	}
	actx, cancel := context.WithTimeout(ctx, min(timeout, routeAcquireTimeout))
	conn, err := pool.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return pgsql.SelectResult{}, true, ctx.Err()
		}
		rr.down(ctx, n, err)
		return pgsql.SelectResult{}, false, nil
	}
	defer conn.Release()
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err = read(sctx, conn)
	switch {
	case err != nil && ctx.Err() != nil:
		return pgsql.SelectResult{}, true, ctx.Err()
	case errors.Is(err, pgsql.ErrWentBack), err == nil && res.WentBack:
		// The coordinator decides; the map may be stale: n is left out
		// until RetryAfter, and the next read looks where the shards are.
		rr.leaveOut(n)
		fields := watermill.LogFields{"topic": topic, "node": net.JoinHostPort(n.host, strconv.Itoa(n.port))}
		if err != nil {
			fields["error"] = err.Error()
		}
		r.logger.Debug("A read on the topic's Citus worker found the database elsewhere: reading through the coordinator", fields)
		return pgsql.SelectResult{}, false, nil
	case err != nil:
		rr.down(ctx, n, err)
		return pgsql.SelectResult{}, false, nil
	}
	n.outage.ok()
	return res, true, nil
}

// node returns the node to send topic's reads to, or nil for the
// coordinator; its reads of the coordinator's catalog (when due) are
// bounded by timeout.
func (rr *ReadRouter) node(ctx context.Context, timeout time.Duration, topic string) *routeNode {
	r := rr.r
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d, err := r.driver.Get(ctx, r.coordinator)
	if err != nil {
		return nil // the coordinator's read says why
	}
	rs, ok := pgsql.RoutedOf(d)
	if !ok {
		r.sayNotCitus()
		return nil
	}
	return r.node(ctx, rs, topic)
}

// down leaves n out for RetryAfter after a read there failed with err,
// and makes the next read look where the shards are.
func (rr *ReadRouter) down(ctx context.Context, n *routeNode, err error) {
	if ctx.Err() != nil {
		return
	}
	r := rr.r
	rr.leaveOut(n)
	n.outage.failed(time.Now(), "A read on the topic's Citus worker failed: reading through the coordinator", err,
		watermill.LogFields{"node": net.JoinHostPort(n.host, strconv.Itoa(n.port)), "retry_after": r.RetryAfter.String()})
}

// leaveOut sends n's reads through the coordinator for RetryAfter, and
// makes the next read look where the shards are.
func (rr *ReadRouter) leaveOut(n *routeNode) {
	r := rr.r
	r.mu.Lock()
	n.downUntil = time.Now().Add(r.RetryAfter)
	r.refreshed = time.Time{}
	r.mu.Unlock()
}

// pool returns n's pool, opening it on first use.
func (rr *ReadRouter) pool(ctx context.Context, n *routeNode) (*pgxpool.Pool, error) {
	rr.connectMu.Lock() // a hook may take its time: rr.mu is not held meanwhile
	defer rr.connectMu.Unlock()
	rr.mu.Lock()
	p, closed := rr.pools[n], rr.closed
	rr.mu.Unlock()
	switch {
	case p != nil:
		return p, nil
	case closed:
		return nil, errReadRouterClosed
	}
	p, err := rr.r.connect(ctx, n.host, n.port)
	if err != nil {
		return nil, connectFailed{err}
	}
	rr.mu.Lock()
	rr.pools[n] = p
	rr.mu.Unlock()
	return p, nil
}

// errReadRouterClosed: a read routed after Close (the Subscriber's
// consumers have ended before).
var errReadRouterClosed = errors.New("pglease: the subscriber's router is closed")

// SetRefreshInterval sets how often the ReadRouter reads where the
// shards are, and RetryAfter how long a worker whose read failed is left
// out. Call it before the first read.
func (rr *ReadRouter) SetRefreshInterval(refresh, retryAfter time.Duration) {
	if refresh > 0 {
		rr.r.RefreshInterval = refresh
	}
	if retryAfter > 0 {
		rr.r.RetryAfter = retryAfter
	}
}

// Invalidate makes the next read look where the shards are.
func (rr *ReadRouter) Invalidate() { rr.r.Invalidate() }

// Close closes the pools the ReadRouter opened. Call it once no read
// runs; it is idempotent.
func (rr *ReadRouter) Close() {
	rr.connectMu.Lock()
	rr.mu.Lock()
	rr.closed = true
	pools := rr.pools
	rr.pools = map[*routeNode]*pgxpool.Pool{}
	rr.mu.Unlock()
	rr.connectMu.Unlock()
	for _, p := range pools {
		p.Close()
	}
}
