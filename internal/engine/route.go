package engine

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Defaults of a Router.
const (
	// RouteRefreshInterval is how often a Router reads again where the
	// shards are (a shard moved since is still written to, through its
	// former worker, which forwards the statement: slower, not wrong).
	RouteRefreshInterval = 30 * time.Second
	// routeRetryAfter is how long a worker whose connection failed is
	// left out, its topics published through the coordinator.
	routeRetryAfter = 5 * time.Second
	// routeMaxTopics bounds the topics whose shard a Router remembers;
	// past it, it forgets them all and reads each again on its next use.
	routeMaxTopics = 100_000
)

// componentRoute is the component of the Router's outage lines.
const componentRoute = "publisher routing"

// ConnectFunc opens the connection pool of a Citus node, given its
// address in pg_dist_node.
type ConnectFunc func(ctx context.Context, host string, port int) (*pgxpool.Pool, error)

// DefaultConnect returns the ConnectFunc that opens a node's pool with
// coordinator's configuration (credentials, TLS, pool size, hooks), the
// host and port replaced by the node's; TLS verifies the node's name.
func DefaultConnect(coordinator *pgxpool.Pool) ConnectFunc {
	return func(ctx context.Context, host string, port int) (*pgxpool.Pool, error) {
		cfg := coordinator.Config()
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(port)
		cfg.ConnConfig.Fallbacks = nil
		if tls := cfg.ConnConfig.TLSConfig; tls != nil && tls.ServerName != "" {
			tls = tls.Clone()
			tls.ServerName = host
			cfg.ConnConfig.TLSConfig = tls
		}
		return pgxpool.NewWithConfig(ctx, cfg)
	}
}

// Router sends a Publisher's calls on a Citus cluster to the worker that
// holds each topic's shard (see pgsql.Routed), each worker's calls
// group-committed on a pool of its own, and says when a call is to go
// through the coordinator instead: the tables are not distributed, the
// topic's node is the coordinator or holds no metadata, or its pool
// could not connect (for routeRetryAfter, logged once). Where the shards
// are is read from the coordinator's catalog when first needed, then
// every RefreshInterval and after a worker's failure, by the call that
// finds it due (no goroutine of its own). Safe for concurrent use.
type Router struct {
	coordinator *pgxpool.Pool
	driver      *pgsql.Lazy
	connect     ConnectFunc
	logger      watermill.LoggerAdapter
	// RefreshInterval and RetryAfter: set before the first Publish.
	RefreshInterval time.Duration
	RetryAfter      time.Duration

	connectMu  sync.Mutex // held while a node's pool is opened
	mu         sync.Mutex
	topics     map[string]int64      // topic → shard
	shards     map[int64]*routeNode  // shard → its node
	nodes      map[string]*routeNode // by host:port
	refreshed  time.Time             // zero: due
	refreshing bool
	notCitus   bool // logged that the tables are not distributed
	closed     bool
}

// routeNode is a node of the cluster as the Router knows it; pool and
// group are made on the first call routed there.
type routeNode struct {
	host        string
	port        int
	coordinator bool // group 0: its topics need no routing
	metadata    bool
	noMetaSaid  bool
	pool        *pgxpool.Pool
	group       *GroupCommitter
	downUntil   time.Time
	outage      *outageLog
}

// NewRouter returns the Router of a Publisher on coordinator, which
// opens the workers' pools with connect (DefaultConnect when nil).
func NewRouter(coordinator *pgxpool.Pool, driver *pgsql.Lazy, connect ConnectFunc, logger watermill.LoggerAdapter) *Router {
	if connect == nil {
		connect = DefaultConnect(coordinator)
	}
	return &Router{coordinator: coordinator, driver: driver, connect: connect,
		logger:          logger.With(watermill.LogFields{"component": componentRoute}),
		RefreshInterval: RouteRefreshInterval, RetryAfter: routeRetryAfter,
		topics: map[string]int64{}, shards: map[int64]*routeNode{}, nodes: map[string]*routeNode{}}
}

// Publish writes params, the messages of one topic, on the topic's
// worker, and returns the indexes of those left out for their
// idempotency keys. routed false means it wrote nothing and the call is
// to go through the coordinator: then err is nil.
func (r *Router) Publish(ctx context.Context, params pgsql.InsertMessagesParams) (skipped []int, routed bool, err error) {
	d, err := r.driver.Get(ctx, r.coordinator)
	if err != nil {
		return nil, false, nil // the coordinator's call says why
	}
	rs, ok := pgsql.RoutedOf(d)
	if !ok {
		r.sayNotCitus()
		return nil, false, nil
	}
	n := r.node(ctx, rs, params.Topics[0])
	if n == nil {
		return nil, false, nil
	}
	g, err := r.group(ctx, rs, n)
	if err == nil {
		skipped, err = g.PublishKeyed(ctx, params)
	}
	if err == nil {
		n.outage.ok()
		return skipped, true, nil
	}
	if ctx.Err() == nil && nothingSent(err) {
		r.down(n, err)
		return nil, false, nil
	}
	return nil, true, err
}

// nothingSent reports whether err happened before anything of the
// statement reached the server: the call may go elsewhere without being
// stored twice.
func nothingSent(err error) bool {
	var (
		ce *pgconn.ConnectError
		cf connectFailed
	)
	return errors.As(err, &ce) || errors.As(err, &cf) || pgconn.SafeToRetry(err)
}

// down leaves n out for RetryAfter, and makes the next call read the
// catalog again (the node may have been replaced).
func (r *Router) down(n *routeNode, err error) {
	r.mu.Lock()
	n.downUntil = time.Now().Add(r.RetryAfter)
	r.refreshed = time.Time{}
	r.mu.Unlock()
	n.outage.failed(time.Now(), "Cannot reach the topic's Citus worker: publishing through the coordinator", err,
		watermill.LogFields{"node": net.JoinHostPort(n.host, strconv.Itoa(n.port)), "retry_after": r.RetryAfter.String()})
}

func (r *Router) sayNotCitus() {
	r.mu.Lock()
	said := r.notCitus
	r.notCitus = true
	r.mu.Unlock()
	if !said {
		r.logger.Info("RouteToWorkers has no effect: the messages table is not distributed by Citus", nil)
	}
}

// node returns the node to send topic's calls to, or nil for the
// coordinator.
func (r *Router) node(ctx context.Context, rs pgsql.Routed, topic string) *routeNode {
	r.refreshIfDue(ctx, rs)
	r.mu.Lock()
	shard, known := r.topics[topic]
	r.mu.Unlock()
	if !known {
		ids, err := rs.TopicShards(ctx, r.coordinator, []string{topic})
		if err != nil || len(ids) != 1 {
			return nil
		}
		shard = ids[0]
		r.mu.Lock()
		if len(r.topics) >= routeMaxTopics {
			r.topics = map[string]int64{}
		}
		r.topics[topic] = shard
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.shards[shard]
	switch {
	case n == nil:
		r.refreshed = time.Time{} // a shard made since the last read (a split)
		return nil
	case n.coordinator || !n.metadata || time.Now().Before(n.downUntil):
		return nil
	}
	return n
}

// refreshIfDue reads where the shards are when it is due and no other
// call is reading it; the others go on with what was read before.
func (r *Router) refreshIfDue(ctx context.Context, rs pgsql.Routed) {
	r.mu.Lock()
	due := !r.refreshing && (r.refreshed.IsZero() || time.Since(r.refreshed) >= r.RefreshInterval)
	if due {
		r.refreshing = true
	}
	r.mu.Unlock()
	if !due {
		return
	}
	ps, err := rs.Placements(ctx, r.coordinator)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshing = false
	if err != nil {
		r.logger.Debug("Reading the shards' placements failed", watermill.LogFields{"error": err.Error()})
		return
	}
	r.apply(ps)
}

// apply takes the placements read from the catalog (r.mu held).
func (r *Router) apply(ps []pgsql.ShardPlacement) {
	shards := make(map[int64]*routeNode, len(ps))
	for _, p := range ps {
		if _, ok := shards[p.ShardID]; ok {
			continue
		}
		key := net.JoinHostPort(p.Host, strconv.Itoa(p.Port))
		n := r.nodes[key]
		if n == nil {
			n = &routeNode{host: p.Host, port: p.Port, outage: newOutageLog(r.logger, componentRoute)}
			r.nodes[key] = n
		}
		n.coordinator, n.metadata = p.GroupID == 0, p.Metadata
		if !n.metadata && !n.coordinator && !n.noMetaSaid {
			n.noMetaSaid = true
			r.logger.Info("Citus worker without synced metadata: its topics are published through the coordinator",
				watermill.LogFields{"node": key, "hint": "start_metadata_sync_to_node, or citus_add_node on Citus 11 and later"})
		}
		shards[p.ShardID] = n
	}
	for id := range r.shards {
		if _, ok := shards[id]; !ok { // split or distributed again: the topics' shards changed
			r.topics = map[string]int64{}
			break
		}
	}
	r.shards = shards
	r.refreshed = time.Now()
}

// group returns n's group commit, opening its pool on first use.
func (r *Router) group(ctx context.Context, rs pgsql.Routed, n *routeNode) (*GroupCommitter, error) {
	r.connectMu.Lock() // a hook may take its time: r.mu is not held meanwhile
	defer r.connectMu.Unlock()
	r.mu.Lock()
	g, closed := n.group, r.closed
	r.mu.Unlock()
	switch {
	case g != nil:
		return g, nil
	case closed:
		return nil, errRouterClosed
	}
	pool, err := r.connect(ctx, n.host, n.port)
	if err != nil {
		return nil, connectFailed{err}
	}
	g = newGroupCommitter(pool, func(ctx context.Context, p pgsql.InsertMessagesParams) ([]int, error) {
		skipped, payloads, err := rs.InsertKeyed(ctx, pool, p)
		if err != nil {
			return nil, err
		}
		if err := rs.Notify(ctx, r.coordinator, p.NotifyChannel, payloads); err != nil {
			// Stored: the Subscribers find the messages by their poll.
			r.logger.Error("Notifying the Subscribers of messages stored on a Citus worker", err,
				watermill.LogFields{"node": net.JoinHostPort(n.host, strconv.Itoa(n.port))})
		}
		return skipped, nil
	}, r.logger)
	r.mu.Lock()
	n.pool, n.group = pool, g
	r.mu.Unlock()
	return g, nil
}

// errRouterClosed: a call routed after Close (the Publisher refuses
// those before).
var errRouterClosed = errors.New("pglease: the publisher's router is closed")

// connectFailed is the error of a ConnectFunc: nothing was sent.
type connectFailed struct{ err error }

func (e connectFailed) Error() string { return "open the worker's pool: " + e.err.Error() }
func (e connectFailed) Unwrap() error { return e.err }

// Invalidate makes the next call read where the shards are.
func (r *Router) Invalidate() {
	r.mu.Lock()
	r.refreshed = time.Time{}
	r.mu.Unlock()
}

// Close waits for the calls under way and closes the pools the Router
// opened. Call it once no Publish runs.
func (r *Router) Close() {
	r.connectMu.Lock()
	r.mu.Lock()
	r.closed = true
	var opened []*routeNode
	for _, n := range r.nodes {
		if n.group != nil {
			opened = append(opened, n)
		}
	}
	r.mu.Unlock()
	r.connectMu.Unlock()
	for _, n := range opened {
		n.group.Wait()
		n.pool.Close()
	}
}
