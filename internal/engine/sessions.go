package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/svc"
)

// sessionGen is one consumer-session row as this process knows it. A
// generation is trusted until lost is closed: by self-fencing (no heartbeat
// succeeded for long enough that the server may have expired the row), by a
// heartbeat that found the row gone or expired, or by Close. A lost
// generation is never trusted again; the keeper opens a new one.
type sessionGen struct {
	id   uuid.UUID
	lost chan struct{}
	once sync.Once
	// trustUntil is the self-fencing deadline in monoNow units. isLost
	// checks it directly, so a process resumed after a long pause (SIGSTOP,
	// a VM freeze) cannot hand out a message before the fencing timer's
	// goroutine had a chance to run.
	trustUntil atomic.Int64
	// here is the identity of the server the row was made on
	// (pgsql.ClusterMark.Here): every statement decided under the
	// generation carries it, and one run elsewhere writes nothing and
	// reports it (elsewhere).
	here string
	// keeper is the keeper that made the generation (nil in tests of
	// the decisions).
	keeper *sessionKeeper
}

// elsewhere drops g after a statement decided under it found the database
// elsewhere than where g was made, or a position held in memory ahead of
// its transaction counter (pgsql.ErrWentBack); what names the statement.
func (g *sessionGen) elsewhere(what string) { g.elsewhereFor(what, nil) }

// elsewhereFor is elsewhere with the statement's error: a planned move
// of a topic's shard on Citus (a pgsql.ShardMovedError in err) is logged
// as that, once, instead of as the database going back.
func (g *sessionGen) elsewhereFor(what string, err error) {
	if g.keeper != nil {
		var moved *pgsql.ShardMovedError
		var worker *pgsql.WorkerWentBackError
		errors.As(err, &moved)
		errors.As(err, &worker)
		g.keeper.elsewhere(g, what, moved, worker)
	} else {
		g.markLost()
	}
}

// monoBase anchors monoNow; time.Since uses the monotonic clock.
var monoBase = time.Now()

// monoNow is the monotonic time since monoBase, in nanoseconds.
func monoNow() int64 { return int64(time.Since(monoBase)) }

func newSessionGen() *sessionGen {
	return &sessionGen{id: uuid.New(), lost: make(chan struct{})}
}

func (g *sessionGen) markLost() bool {
	marked := false
	g.once.Do(func() {
		close(g.lost)
		marked = true
	})
	return marked
}

func (g *sessionGen) isLost() bool {
	select {
	case <-g.lost:
		return true
	default:
		return monoNow() >= g.trustUntil.Load()
	}
}

// sessionKeeper keeps one consumer-session row alive for a Subscriber: it
// creates it, heartbeats it every interval with the server's clock,
// self-fences on the monotonic clock when heartbeats fail, opens a new
// session when the row was lost, and deletes the row on close. Those
// statements (liveness) run on the session connection (sessionConn),
// dialled outside the pool and shared by the keepers of the process that
// use one pool, so that the application's load on the pool cannot make a
// heartbeat late. The keeper's other statements are not liveness and run
// on the pool: recording the Subscriber's topics in the row
// (setSubscriptions), reading the group's members (groupMembers) and
// deleting the expired sessions of others (deleteExpired).
//
// Start it once with start; close is safe to call more than once and
// before start. Its methods are safe for concurrent use.
type sessionKeeper struct {
	pool     *pgxpool.Pool
	driver   *pgsql.Lazy
	logger   watermill.LoggerAdapter
	group    string
	owner    string
	ttl      time.Duration
	interval time.Duration // between heartbeats
	// trust is how long after a successful heartbeat was sent the session
	// is trusted locally: the TTL less a margin for clock-rate differences
	// and scheduling, so the process stops before the server expires it.
	trust time.Duration
	stats *subscriberStats

	mu      sync.Mutex
	conn    *sessionConn  // acquired by the first start, released by close
	cur     *sessionGen   // nil while no generation is trusted
	ready   chan struct{} // closed when cur becomes non-nil
	prevID  uuid.UUID     // the last generation's id, deleted with the next insert
	fence   *time.Timer   // self-fencing deadline of cur
	started bool
	stopped bool

	loop svc.Service // the heartbeat loop (run)

	// cleanup makes the keeper delete expired sessions of others now and
	// then (when no maintainer does).
	cleanup bool

	// onNewSession, when set, is called (under mu, so it must not block)
	// each time a session generation becomes current.
	onNewSession func()

	// setUp, when set, runs before the first session is made, until it
	// succeeds once (setUpDone, under mu): the schema's initialization
	// (SubscriberConfig.InitializeSchema).
	setUp     func(ctx context.Context) error
	setUpDone bool
	// outage logs the failures of the keeper's statements.
	outage *outageLog

	// mark is where the database was at the last heartbeat (under mu).
	mark clusterMark
	// detectedBy names the statement that found the current generation's
	// database elsewhere (see elsewhere), until the next session is
	// made; kick wakes the heartbeat loop to make it at once.
	detectedBy string
	// detectedMove is the planned shard move (Citus) that the statement
	// of detectedBy found, if that is what it found.
	detectedMove *pgsql.ShardMovedError
	// detectedWorker is the worker that went back (Citus), when that is
	// what the statement of detectedBy found.
	detectedWorker *pgsql.WorkerWentBackError
	kick           chan struct{}

	// ownMu guards own, the ids of every generation the keeper made: a
	// row claimed from one of them is claimed again after a new session
	// (a restart, a failover, a planned shard move), not taken over from
	// another Subscriber. Generations are made rarely: the set stays
	// small.
	ownMu sync.Mutex
	own   map[uuid.UUID]struct{}
}

// madeBy reports whether id is a generation this keeper made.
func (k *sessionKeeper) madeBy(id uuid.UUID) bool {
	k.ownMu.Lock()
	defer k.ownMu.Unlock()
	_, ok := k.own[id]
	return ok
}

// sessionHooks are what a sessionKeeper calls besides its statements.
type sessionHooks struct {
	// onNew is called (under the keeper's mu, so it must not block) when
	// a new session has been created.
	onNew func()
	// setUp runs before the first session is made, until it succeeds once:
	// the schema's initialization (InitializeSchema).
	setUp func(ctx context.Context) error
	// cleanup makes the keeper delete expired sessions of others now and
	// then (when no maintainer does).
	cleanup bool
}

func newSessionKeeper(pool *pgxpool.Pool, driver *pgsql.Lazy, group string, ttl time.Duration, stats *subscriberStats, logger watermill.LoggerAdapter, hooks sessionHooks) *sessionKeeper {
	host, _ := os.Hostname()
	return &sessionKeeper{
		pool:     pool,
		stats:    stats,
		driver:   driver,
		logger:   logger,
		group:    group,
		owner:    fmt.Sprintf("%s/%d", host, os.Getpid()),
		ttl:      ttl,
		interval: ttl / 3,
		trust:    ttl - ttl/10,
		ready:    make(chan struct{}),
		kick:     make(chan struct{}, 1),
		outage:   newOutageLog(logger, componentSession),

		onNewSession: hooks.onNew,
		setUp:        hooks.setUp,
		cleanup:      hooks.cleanup,
	}
}

// start sets up (setUp) and creates the first session row, and starts the
// heartbeat loop. An error that retrying cannot fix (setUpFailure: missing
// tables or database, permissions, authentication) is returned, as is
// ctx's; on any other (the database cannot be reached, is starting, or
// answers too slowly) the loop keeps trying in the background, with the
// backoff of later outages, and start succeeds. Calls after the first
// successful one do nothing.
func (k *sessionKeeper) start(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return ErrSubscriberClosed
	}
	if k.started {
		return nil
	}
	if k.conn == nil {
		k.conn = acquireSessionConn(k.pool)
	}
	sent := time.Now()
	if err := k.openLocked(ctx, k.ttl); err != nil {
		if setUpFailure(err) || ctx.Err() != nil {
			return err
		}
		k.outage.failed(sent, "Cannot open the consumer session yet (is the database up?), retrying in the background; "+
			"Subscribe returned its channel, delivery starts once the session is open", err, nil)
	}
	k.started = true
	// Not the caller's context: the loop lives until close.
	k.loop.Start(context.Background(), k.run)
	return nil
}

// current returns the trusted generation, or nil and a channel closed when
// one becomes available.
func (k *sessionKeeper) current() (*sessionGen, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cur != nil && k.cur.isLost() {
		// The trust window passed before the fencing timer ran.
		k.fenceLocked(k.cur)
	}
	if k.cur != nil {
		return k.cur, nil
	}
	return nil, k.ready
}

// openLocked runs setUp until it succeeded once, then createLocked. k.mu
// must be held.
func (k *sessionKeeper) openLocked(ctx context.Context, timeout time.Duration) error {
	if k.setUp != nil && !k.setUpDone {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		err := k.setUp(sctx)
		cancel()
		if err != nil {
			return err
		}
		k.setUpDone = true
	}
	return k.createLocked(ctx, timeout)
}

// setUpFailure reports whether err, from setting up or opening a session,
// is one that retrying cannot fix: the server said that the tables, the
// schema or the database are missing, that the role may not use them
// (syntax error or access rule violation), or that it may not log in. The
// rest (connections refused or cut, a server starting up or shutting down,
// timeouts, conflicts) is retried.
func setUpFailure(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "42", "28", "3D", "3F":
		return true
	}
	return false
}

// createLocked inserts a new session row (deleting the previous one of this
// keeper in the same statement) and makes it current. k.mu must be held;
// the statement runs under it so that no consumer sees a half-made
// generation.
func (k *sessionKeeper) createLocked(ctx context.Context, timeout time.Duration) error {
	g := newSessionGen()
	g.keeper = k
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sent := time.Now()
	p := pgsql.SessionParams{
		NotifyChannel:     k.driver.Tables().NotifyChannel,
		SessionID:         g.id,
		ReplacesSessionID: k.prevID,
		ConsumerGroup:     k.group,
		Owner:             k.owner,
		TTL:               k.ttl,
		Protocol:          groupProtocol,
	}
	var row pgsql.ClusterMark
	err := k.conn.run(ctx, func(q pgsql.Querier) (err error) {
		row, err = k.driver.CreateSession(ctx, q, p)
		return err
	})
	if err != nil {
		return fmt.Errorf("create consumer session: %w", check.MissingSchema(err))
	}
	k.prevID = g.id // deleted by the next insert, whatever happens now
	k.ownMu.Lock()
	if k.own == nil {
		k.own = make(map[uuid.UUID]struct{})
	}
	k.own[g.id] = struct{}{}
	k.ownMu.Unlock()
	// Where the database is when the session starts, read by the
	// statement that made it: every statement of its claims is fenced by
	// its identity, and the first heartbeat compares with it.
	mark, err := k.markOf(row)
	if err != nil {
		return fmt.Errorf("create consumer session: %w", err)
	}
	k.resynced(mark)
	g.here = mark.here
	k.cur = g
	close(k.ready)
	k.armFenceLocked(g, sent)
	k.logger.Debug("Consumer session created", watermill.LogFields{"session_id": g.id.String()})
	if k.onNewSession != nil {
		k.onNewSession()
	}
	return nil
}

// armFenceLocked (re)sets the self-fencing deadline of g to sent + trust.
func (k *sessionKeeper) armFenceLocked(g *sessionGen, sent time.Time) {
	until := sent.Add(k.trust)
	g.trustUntil.Store(int64(until.Sub(monoBase)))
	d := time.Until(until)
	if k.fence != nil {
		k.fence.Stop()
	}
	k.fence = time.AfterFunc(d, func() { k.selfFence(g) })
}

// selfFence stops trusting g: no heartbeat succeeded within the trust
// window, so the server may expire the row and another session may claim
// its topics.
func (k *sessionKeeper) selfFence(g *sessionGen) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fenceLocked(g)
}

func (k *sessionKeeper) fenceLocked(g *sessionGen) {
	if !k.loseLocked(g) {
		return
	}
	const msg = "Consumer session self-fenced: no heartbeat succeeded in time, delivery stopped until a new session is open"
	fields := watermill.LogFields{"session_id": g.id.String(), "trust_window": k.trust.String()}
	if k.outage.ongoing() {
		// What follows from an outage already logged at Error.
		k.logger.Info(msg, fields.Add(watermill.LogFields{"component": componentSession}))
		return
	}
	k.logger.Error(msg, ErrOwnershipLost, fields)
}

// loseLocked marks g lost and, if it is current, clears it.
func (k *sessionKeeper) loseLocked(g *sessionGen) bool {
	marked := g.markLost()
	if marked {
		k.stats.sessionsLost.Add(1)
	}
	if k.cur == g {
		k.cur = nil
		k.ready = make(chan struct{})
		if k.fence != nil {
			k.fence.Stop()
		}
	}
	return marked
}

// run is the heartbeat loop, until ctx ends. A statement under way when
// it ends is not cut short: it has its own timeout.
func (k *sessionKeeper) run(ctx context.Context) {
	retry := newBackoff(50*time.Millisecond, k.interval)
	// Expired sessions of others are deleted every cleanupEvery successful
	// heartbeats, from a random phase so that Subscribers spread it out.
	const cleanupEvery = 10
	beats := rand.N(cleanupEvery)
	wait := k.interval
	if g, _ := k.current(); g == nil {
		wait = 0 // the first session is not open yet
	}
	for {
		if !sleep(wait, ctx.Done(), k.kick) && ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		g := k.cur
		k.mu.Unlock()

		if g == nil {
			sent := time.Now()
			k.mu.Lock()
			err := k.openLocked(context.Background(), k.stmtTimeout())
			k.mu.Unlock()
			if err != nil {
				k.outage.failed(sent, "Cannot open a new consumer session, retrying", err, nil)
				wait = retry.delay()
				continue
			}
			k.outage.ok()
			retry.reset()
			wait = k.interval
			continue
		}

		sent := time.Now()
		ok, err := k.heartbeat(g)
		if err == nil {
			k.outage.ok()
		}
		switch {
		case err != nil:
			k.outage.failed(sent, "Consumer session heartbeat failed, retrying", err,
				watermill.LogFields{"session_id": g.id.String()})
			wait = retry.delay()
		case !ok:
			k.mu.Lock()
			k.loseLocked(g)
			k.mu.Unlock()
			k.logger.Error("Consumer session lost (expired or deleted), opening a new one", ErrOwnershipLost,
				watermill.LogFields{"session_id": g.id.String()})
			wait = 0
		case g.isLost():
			// Dropped while the heartbeat ran: the database went back
			// (backInTime), or the trust window passed. The next
			// session opens at once: until it does, nothing of this
			// Subscriber can claim.
			retry.reset()
			wait = 0
		default:
			retry.reset()
			beats++
			if k.cleanup && beats%cleanupEvery == 0 {
				k.deleteExpired()
			}
			// The next heartbeat is due an interval after this one was
			// sent, however long the clean-up took: it runs on the pool
			// and may wait for a connection up to its timeout.
			wait = max(0, k.interval-time.Since(sent))
		}
	}
}

// stmtTimeout bounds the keeper's statements: half the TTL, so that a
// heartbeat or a new session that succeeds still leaves most of the trust
// window, which starts when the statement was sent.
func (k *sessionKeeper) stmtTimeout() time.Duration { return k.ttl / 2 }

// heartbeat extends g's row. It reports false when the row is gone or had
// expired: the session is lost. It also reads where the database is, and
// when the database went back in time since the last heartbeat (a failover
// to a standby that lagged, a restore), it drops g and every position held
// in memory with it (backInTime) and reports true: the keeper's next turn,
// at once, opens a new session, whose claims read the positions this
// database has.
func (k *sessionKeeper) heartbeat(g *sessionGen) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), k.stmtTimeout())
	defer cancel()
	sent := time.Now()
	updated, mark, err := k.beat(ctx, g.id)
	if err != nil {
		return false, fmt.Errorf("heartbeat consumer session: %w", err)
	}
	if k.backInTime(g, mark) {
		return true, nil
	}
	if updated == 0 {
		return false, nil
	}
	k.stats.heartbeat(time.Since(sent))
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cur != g {
		// Self-fenced while the heartbeat was under way: the generation
		// stays lost (consumers already dropped its claims) and the loop
		// opens a new one at once.
		return true, nil
	}
	k.armFenceLocked(g, sent)
	return true, nil
}

// beat runs the heartbeat statement for session id and returns the rows
// it updated and where the database is. For uuid.Nil it updates nothing
// and only reads the mark.
func (k *sessionKeeper) beat(ctx context.Context, id uuid.UUID) (int64, clusterMark, error) {
	var (
		row  pgsql.HeartbeatRow
		mark clusterMark
	)
	err := k.conn.run(ctx, func(q pgsql.Querier) (err error) {
		row, err = k.driver.HeartbeatSession(ctx, q, pgsql.SessionParams{SessionID: id, TTL: k.ttl})
		return err
	})
	if err != nil {
		return 0, mark, err
	}
	mark, err = k.markOf(row.ClusterMark)
	return row.Updated, mark, err
}

// markOf is the mark of a row read on the session connection.
func (k *sessionKeeper) markOf(row pgsql.ClusterMark) (clusterMark, error) {
	mark := clusterMark{systemID: k.conn.serverID(), timeline: row.Timeline, here: row.Here, xmax: row.Xmax}
	var err error
	if mark.lsn, err = strconv.ParseUint(row.LSN, 10, 64); err != nil {
		return mark, fmt.Errorf("WAL position %q: %w", row.LSN, err)
	}
	return mark, nil
}

// clusterMark is where the database was at a heartbeat: which cluster, on
// which timeline, which run of its server, how far its WAL and its
// transaction counter were.
type clusterMark struct {
	systemID string // "" when unknown
	timeline string
	here     string // timeline, postmaster start, statistics reset (see pgsql.Here)
	lsn      uint64
	xmax     uint64
}

// wentBack tells why the database at cur cannot be the one read at prev,
// later in the same history: "" when it can (or prev is the zero mark, no
// earlier reading). A promoted standby starts a new timeline; a copy
// started as it is (a restore, a standby started without promotion) has
// its WAL position or transaction counter behind what was read before, or
// a postmaster started since; crash recovery may send the counter back
// (commits not flushed yet are lost) and always resets the statistics;
// another cluster has another system identifier. restarted is true when
// the only sign is a changed identity (pgsql.Here): a restart of the same
// server, crash recovery that lost nothing visible, or a copy of it
// started as it is that has already gone past what was read before. They
// cannot be told apart; all are handled as the database going back.
func wentBack(prev, cur clusterMark) (why string, restarted bool) {
	switch {
	case prev.timeline == "":
		return "", false
	case prev.systemID != "" && cur.systemID != "" && prev.systemID != cur.systemID:
		return fmt.Sprintf("another cluster (system identifier %s, was %s)", cur.systemID, prev.systemID), false
	case cur.timeline != prev.timeline:
		return fmt.Sprintf("a new timeline (%s, was %s)", strings.TrimLeft(cur.timeline, "0"), strings.TrimLeft(prev.timeline, "0")), false
	case cur.lsn < prev.lsn:
		return fmt.Sprintf("its WAL went back %d bytes", prev.lsn-cur.lsn), false
	case cur.xmax < prev.xmax:
		return fmt.Sprintf("its transaction counter went back %d", prev.xmax-cur.xmax), false
	case cur.here != prev.here:
		return "its server was restarted or recovered from a crash, or a copy of it started", true
	}
	return "", false
}

// backInTime records mark and, when the database went back in time since
// the last mark (wentBack), logs it and drops g: consumers stop, acknowledged
// positions not committed yet are dropped (they may name transaction ids
// this database hands out again), and the next session claims every row
// again from the position this database has. It reports whether it did.
func (k *sessionKeeper) backInTime(g *sessionGen, mark clusterMark) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	prev := k.mark
	why, restarted := wentBack(prev, mark)
	if why == "" {
		k.mark = mark
		return false
	}
	if k.loseLocked(g) {
		k.mark = mark
		k.stats.resyncs.Add(1)
		k.logResync(prev, mark, why, restarted, "the heartbeat", g.id)
	}
	// Else a statement found it first (elsewhere counted it): the mark
	// stays the one before, so that the next session (resynced) compares
	// it with where the database is then and logs what happened, a
	// restart at Info, not a generic going back at Error.
	return true
}

// elsewhere drops g (see sessionGen.elsewhere) and has the heartbeat loop
// make a new session at once, which logs the resynchronisation with what
// the database then is.
func (k *sessionKeeper) elsewhere(g *sessionGen, what string, moved *pgsql.ShardMovedError, worker *pgsql.WorkerWentBackError) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.loseLocked(g) {
		return // already dropped: by another statement, or the heartbeat
	}
	k.stats.resyncs.Add(1)
	k.detectedBy, k.detectedMove, k.detectedWorker = what, moved, worker
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// resynced records mark, read by the statement that made a new session,
// and logs the resynchronisation when a statement found the last
// generation's database elsewhere (elsewhere), or when the database went
// back while no session was open. k.mu must be held.
func (k *sessionKeeper) resynced(mark clusterMark) {
	prev, by, moved, worker := k.mark, k.detectedBy, k.detectedMove, k.detectedWorker
	k.mark, k.detectedBy, k.detectedMove, k.detectedWorker = mark, "", nil, nil
	why, restarted := wentBack(prev, mark)
	switch {
	case by != "" && why == "" && moved != nil:
		k.logMove(moved, by, k.prevID)
	case by != "" && why == "" && worker != nil:
		k.logWorkerWentBack(worker, by, k.prevID)
	case by != "":
		if why == "" {
			why = "a statement found the database elsewhere than where the session was made, or a position " +
				"held in memory ahead of its transaction counter"
		}
		k.logResync(prev, mark, why, restarted, by, k.prevID)
	case why != "":
		k.stats.resyncs.Add(1)
		k.logResync(prev, mark, why, restarted, "a new session", k.prevID)
	}
}

// logResync logs that the database went back (or restarted): the
// positions held in memory are dropped and every row claimed again from
// the positions committed in the database. A restart alone is logged at
// Info (routine, and nothing is lost either way); the rest at Error.
func (k *sessionKeeper) logResync(prev, cur clusterMark, why string, restarted bool, by string, session uuid.UUID) {
	fields := watermill.LogFields{
		"why":             why,
		"detected_by":     by,
		"session_id":      session.String(),
		"counter_before":  prev.xmax,
		"counter_now":     cur.xmax,
		"wal_before":      prev.lsn,
		"wal_now":         cur.lsn,
		"timeline_before": strings.TrimLeft(prev.timeline, "0"),
		"timeline_now":    strings.TrimLeft(cur.timeline, "0"),
	}
	if restarted {
		k.logger.Info("The database server restarted (or a copy of it was started): claiming every topic again "+
			"from the positions committed in the database; messages acknowledged since are delivered again", fields)
		return
	}
	k.logger.Error("The database went back in time (a failover to a standby that lagged, or a restore): "+
		"dropping the positions held in memory and claiming every topic again from the positions committed in the "+
		"database; messages acknowledged since are delivered again", ErrDatabaseWentBack, fields)
}

// logWorkerWentBack logs, at Error, that a statement found a topic's
// worker of a Citus cluster gone back (the coordinator, whose marks the
// session keeps, did not): what the worker was and is, and the position
// held against the worker's counter.
func (k *sessionKeeper) logWorkerWentBack(w *pgsql.WorkerWentBackError, by string, session uuid.UUID) {
	k.logger.Error(fmt.Sprintf("The worker of topic %q went back in time (a failover to a standby that lagged, or a "+
		"restore): dropping the positions held in memory and claiming every topic again from the positions committed "+
		"in the database; messages acknowledged since are delivered again", w.Topic), ErrDatabaseWentBack, watermill.LogFields{
		"topic":          w.Topic,
		"worker_before":  w.Before,
		"worker_now":     w.Now,
		"position":       w.Position,
		"worker_counter": w.Counter,
		"detected_by":    by,
		"session_id":     session.String(),
	})
}

// logMove logs, at Info, that a statement found a topic's shard moved to
// another worker by a planned move (Citus: citus_move_shard_placement,
// pglease move-shard or rebalance), which the Subscriber handles as the
// database going back, without loss: the positions held in memory are
// dropped and every row claimed again from the positions committed (which
// moved with the shard). One line per move found: the statements of the
// generation that find it after the first do not log.
func (k *sessionKeeper) logMove(moved *pgsql.ShardMovedError, by string, session uuid.UUID) {
	k.logger.Info(fmt.Sprintf("Shard of topic %q moved from worker %s to worker %s (a planned shard move): claiming "+
		"the topics again from the positions committed in the database; messages acknowledged and not committed yet "+
		"are delivered again", moved.Topic, moved.From, moved.To), watermill.LogFields{
		"topic":       moved.Topic,
		"shard":       moved.Shard,
		"from_worker": moved.From,
		"to_worker":   moved.To,
		"detected_by": by,
		"session_id":  session.String(),
	})
}

// deleteExpired removes session rows of others that expired more than a
// TTL ago. Their claims are free either way; this only keeps the table small.
// It is not liveness, so it runs on the pool, not on the session connection
// that the heartbeats of every Subscriber of the process share.
func (k *sessionKeeper) deleteExpired() {
	ctx, cancel := context.WithTimeout(context.Background(), k.stmtTimeout())
	defer cancel()
	n, err := k.driver.DeleteExpiredSessions(ctx, k.pool, k.ttl)
	if err != nil {
		k.logger.Info("Cannot delete expired consumer sessions", watermill.LogFields{"error": err.Error()})
		return
	}
	if n > 0 {
		k.logger.Debug("Deleted expired consumer sessions", watermill.LogFields{"count": n})
	}
}

// close stops the heartbeat loop, marks the current generation lost,
// deletes its row and releases the session connection (the last keeper of
// the pool to close closes it). Consumers must have released their claims
// before.
func (k *sessionKeeper) close(timeout time.Duration) error {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return nil
	}
	k.stopped = true
	started := k.started
	conn := k.conn
	k.mu.Unlock()
	if conn != nil {
		defer conn.release(timeout)
	}
	if !started {
		return nil
	}
	k.loop.Stop()

	k.mu.Lock()
	g := k.cur
	id := k.prevID
	if g != nil {
		k.loseLocked(g)
	}
	k.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p := pgsql.SessionParams{SessionID: id, NotifyChannel: k.driver.Tables().NotifyChannel}
	if err := conn.run(ctx, func(q pgsql.Querier) error { return k.driver.DeleteSession(ctx, q, p) }); err != nil {
		return fmt.Errorf("delete consumer session %s: %w", id, err)
	}
	k.logger.Debug("Consumer session deleted", watermill.LogFields{"session_id": id.String()})
	return nil
}

// setSubscriptions records the hash and size of set in g's session row and
// notifies the group. It reports false when the row is gone. It runs on the
// pool: it is not liveness.
func (k *sessionKeeper) setSubscriptions(g *sessionGen, set rowSet) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), k.stmtTimeout())
	defer cancel()
	ok, err := k.driver.SetSubscriptions(ctx, k.pool, pgsql.SessionParams{SessionID: g.id,
		NotifyChannel: k.driver.Tables().NotifyChannel, SubscriptionHash: int64(set.hash), SubscriptionSize: set.size})
	if err != nil {
		return false, fmt.Errorf("record the topics of consumer session %s: %w", g.id, err)
	}
	return ok, nil
}

// groupMembers reads the live sessions of the keeper's group.
func (k *sessionKeeper) groupMembers() ([]member, error) {
	ctx, cancel := context.WithTimeout(context.Background(), k.stmtTimeout())
	defer cancel()
	rows, err := k.driver.GroupMembers(ctx, k.pool, k.group)
	if err != nil {
		return nil, fmt.Errorf("read the members of consumer group %q: %w", k.group, err)
	}
	// Expiries count from when the answer came, not from when the query
	// was sent (it may have waited for a pool connection): a member wakes
	// after another's expiry on the server, never before.
	read := time.Now()
	var members []member
	for _, r := range rows {
		members = append(members, member{id: r.ID, createdAt: r.CreatedAt, set: uint64(r.SubscriptionHash),
			size: r.SubscriptionSize, expiresAt: read.Add(time.Duration(r.ExpiresInMs) * time.Millisecond), owner: r.Owner,
			protocol: r.Protocol})
	}
	return members, nil
}
