package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/svc"
)

// maxDueWait caps how long the maintainer sleeps until the next delayed
// message is due: it looks again at least this often (a message stored
// meanwhile with an earlier due time notifies it anyway). The wait is
// computed from milliseconds, and a due time years away overflowed it
// into a negative wait: the maintainer ran its statement in a loop.
const maxDueWait = time.Hour

// dueWait is how long to wait for a message due in ms milliseconds.
func dueWait(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	if ms >= maxDueWait.Milliseconds() {
		return maxDueWait
	}
	return time.Duration(ms) * time.Millisecond
}

// maintenance batch sizes and bounds.
const (
	moveDueLimit        = 1000
	keptDeleteLimit     = 5000
	keptDeleteRounds    = 10
	maxPartitionsRound  = 64
	maintenanceStmtTime = 30 * time.Second
	maxSkipLogs         = 20
)

// maintainer runs for a Subscriber: a candidate while its session lives,
// the maintainer while it holds the maintainer's row.
type maintainer struct {
	maintainerDeps

	elect  chan struct{} // the row was released, or a new session opened
	due    chan struct{} // delayed messages were stored
	topics chan struct{} // a topic's retention changed

	active atomic.Bool
	// retained tells whether the last retention round found a topic with
	// a retention.
	retained atomic.Bool
	// delegated is set, once, before the first term, when the role does
	// not own the tables: partition DDL then goes through the owner's
	// functions (see decide).
	delegated bool
	// outage logs the failures of the maintenance's statements.
	outage *outageLog
	// settling holds, per retention class, the partitions publishers
	// wait for (usePartitions); only the retention rounds use it.
	settling map[int]pendingUse
	// keysSettling holds, per key class, the transactions that had the
	// keys table open when its partitions were attached
	// (keyClassRound); only the retention rounds use it.
	keysSettling map[int][]string

	loop svc.Service // run, started by the first Subscribe
}

// maintainerDeps is what a maintainer needs from its Subscriber, given
// explicitly so that the election runs against a fake store in tests.
type maintainerDeps struct {
	cfg        MaintenanceSettings
	sessionTTL time.Duration
	// stmtTimeout bounds each statement of the election (statementTimeout).
	stmtTimeout  time.Duration
	closeTimeout time.Duration
	logger       watermill.LoggerAdapter
	stats        *subscriberStats
	// store runs the election's and the housekeeping's statements;
	// session tells the generation to stand under.
	store   maintainerStore
	session sessionSource
	// pool and driver are where and how the retention rounds
	// (retention.go) run their statements and DDL.
	pool   *pgxpool.Pool
	driver *pgsql.Lazy
	// spread returns a random duration in [0, n], to spread the
	// candidates' claims (rand.N but in tests).
	spread func(n time.Duration) time.Duration
	// runUpkeep runs retention and housekeeping during a term
	// (maintainer.upkeep but in tests).
	runUpkeep func(ctx context.Context)
}

// maintainerStore runs the statements of the election, of delayed
// messages and of housekeeping (pgMaintainerStore in production). Not for
// implementing outside this package.
type maintainerStore interface {
	// access tells how the role can do the maintainer's work;
	// pgx.ErrNoRows: the messages table is missing.
	access(ctx context.Context) (pgsql.AccessRow, error)
	// holder reads who holds the maintainer's row, and claim takes it for
	// session if it is free (Epoch set when taken); pgx.ErrNoRows: the
	// row is missing.
	holder(ctx context.Context) (pgsql.HolderRow, error)
	claim(ctx context.Context, session uuid.UUID) (pgsql.HolderRow, error)
	// release frees the row if session holds it at epoch.
	release(ctx context.Context, session uuid.UUID, epoch int64) error
	// moveDue moves up to limit due delayed messages and says when the
	// next is due (nil: none waits).
	moveDue(ctx context.Context, limit int) (moved int64, nextMs *int64, err error)
	deleteExpiredSessions(ctx context.Context, ttl time.Duration) (int64, error)
	forgetKeys(ctx context.Context) (int, error)
	deleteIdleGroups(ctx context.Context, idleFor time.Duration) ([]pgsql.IdleGroupRow, error)
}

func newMaintainer(deps maintainerDeps) *maintainer {
	if deps.cfg.Disabled {
		return nil
	}
	if deps.spread == nil {
		deps.spread = func(n time.Duration) time.Duration { return rand.N(n + 1) }
	}
	m := &maintainer{
		maintainerDeps: deps,
		outage:         newOutageLog(deps.logger, componentMaintain),
		elect:          make(chan struct{}, 1),
		due:            make(chan struct{}, 1),
		topics:         make(chan struct{}, 1),
	}
	if m.runUpkeep == nil {
		m.runUpkeep = m.upkeep
	}
	return m
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// notified handles the maintainer's notifications (nil-safe): the row
// was released, delayed messages stored, a retention changed.
func (m *maintainer) notified(kind byte) {
	if m == nil {
		return
	}
	switch kind {
	case pgsql.NotifyMaintainer:
		kick(m.elect)
	case pgsql.NotifyDelayed:
		kick(m.due)
	case pgsql.NotifyRetention:
		kick(m.topics)
	}
}

// pollTick stands in for notifications that do not arrive (nil-safe): a
// candidate looks at the maintainer's row (it may have been released), the
// maintainer for delayed messages stored since it last looked.
func (m *maintainer) pollTick() {
	if m == nil {
		return
	}
	if m.active.Load() {
		kick(m.due)
	} else {
		kick(m.elect)
	}
}

// wakeAll runs every task soon, after notifications may have been missed.
func (m *maintainer) wakeAll() {
	if m == nil {
		return
	}
	kick(m.elect)
	kick(m.due)
	kick(m.topics)
}

// run is the maintainer's loop (m.loop), until ctx, which ends with the
// Subscriber's, ends.
func (m *maintainer) run(ctx context.Context) {
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	decided := false
	for ctx.Err() == nil {
		g, ready := m.session.current()
		if g == nil {
			select {
			case <-ready:
			case <-ctx.Done():
			}
			continue
		}
		if !decided {
			stand, err := m.decide(ctx)
			if err != nil {
				if ctx.Err() == nil {
					m.logger.Info("Cannot read what the role may do as the maintainer, retrying", watermill.LogFields{"error": err.Error()})
				}
				sleep(retry.delay(), ctx.Done(), nil)
				continue
			}
			retry.reset()
			if !stand {
				return
			}
			decided = true
		}
		epoch, wait, err := m.claim(ctx, g)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				m.logger.Info("Cannot claim the maintainer's row, retrying", watermill.LogFields{"error": err.Error()})
			}
			wait = retry.delay()
		case epoch != nil:
			retry.reset()
			m.lead(ctx, g, *epoch)
			continue
		default:
			retry.reset()
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-m.elect:
		case <-g.lost:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// decide tells, once per Subscriber, whether it stands for maintainer and
// how it would do the partition DDL: itself, when its role has the
// privileges of the tables' owner (DETACH CONCURRENTLY needs them), else
// through the owner's SECURITY DEFINER functions, when the role has the
// grants of GrantSQL. A role that has neither is told so, once, at Error
// level, and does not stand: the Subscribers whose role can are elected.
// An error is a failure to find out, to be retried.
func (m *maintainer) decide(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, m.stmtTimeout)
	defer cancel()
	access, err := m.store.access(ctx)
	c, err := candidacyOf(access, err)
	if err != nil {
		return false, err
	}
	role, owner, missing := access.Role, access.Owner, c.missing
	switch c.kind {
	case standAsOwner:
		m.logger.Debug("Candidate for maintainer: the role has the owner's privileges", watermill.LogFields{"role": role})
		return true, nil
	case standDelegated:
		m.delegated = true
		m.logger.Debug("Candidate for maintainer: partition DDL through the owner's functions",
			watermill.LogFields{"role": role, "owner": owner})
		return true, nil
	}
	m.logger.Error("Not standing for maintainer: this role neither owns the tables nor may call the owner's functions "+
		"for the partition DDL. Subscribers whose role can are elected; with none, delayed messages wait and retention "+
		"removes nothing. Have the owner of the tables run pglease.GrantSQL for this role, or `pglease grant --role "+role+"`",
		ErrMaintenanceNotPermitted, watermill.LogFields{"role": role, "owner": owner, "missing": strings.Join(missing, "; ")})
	return false, nil
}

// claim tries to become the maintainer. When another session holds the
// row, wait is when to try again: just after that session expires unless
// it heartbeats. While a live session holds the row, the candidate only
// reads it: the compare-and-swap, whose plan costs more than the read's,
// runs when the row looks free.
func (m *maintainer) claim(ctx context.Context, g *sessionGen) (*int64, time.Duration, error) {
	// Not liveness: a claim that waits is better than one cancelled
	// (which costs the pool its connection).
	ctx, cancel := context.WithTimeout(ctx, m.stmtTimeout)
	defer cancel()
	row, err := m.store.holder(ctx)
	if err == nil && looksFree(row, g.id) {
		row, err = m.store.claim(ctx, g.id)
		if err == nil && row.Epoch != nil {
			return row.Epoch, 0, nil
		}
	}
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, 0, fmt.Errorf("the maintainer's row is missing (schema version 6 creates it)")
		}
		return nil, 0, check.MissingSchema(err)
	}
	// Every candidate learns the same expiry: spread their claims over a
	// tenth of the TTL, so that they do not all queue on the expired
	// session row's lock at once.
	return nil, candidateWait(row.ExpiresInMs, m.spread(m.sessionTTL/10)), nil
}

// lead runs the maintenance while g lives and ctx has not ended, then
// releases the row if the Subscriber is closing.
func (m *maintainer) lead(ctx context.Context, g *sessionGen, epoch int64) {
	m.stats.maintainerTerms.Add(1)
	m.active.Store(true)
	m.logger.Info("Elected the maintainer", watermill.LogFields{"session_id": g.id.String(), "epoch": epoch})

	// Retention and housekeeping run on a goroutine of their own: a
	// detach that waits for an old transaction must not hold back
	// delayed messages.
	var upkeep svc.Service
	upkeep.Start(ctx, m.runUpkeep)
	defer func() {
		upkeep.Stop()
		m.active.Store(false) // before the row is another's
		if releaseAtTermEnd(ctx.Err() != nil, g.isLost()) {
			m.release(g, epoch)
		}
	}()

	dueT := time.NewTimer(0)
	defer dueT.Stop()
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		if g.isLost() {
			m.logger.Info("No longer the maintainer: its session was lost", watermill.LogFields{"session_id": g.id.String()})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-g.lost:
			continue
		case <-m.elect:
			continue
		case <-m.due:
		case <-dueT.C:
		}
		sent := time.Now()
		next, err := m.moveDue(ctx)
		dueT.Stop()
		if err == nil {
			m.outage.ok()
		}
		switch {
		case err != nil:
			if ctx.Err() == nil {
				m.outage.failed(sent, "Moving due delayed messages failed, retrying", err, nil)
			}
			dueT.Reset(retry.delay())
		case next >= 0:
			retry.reset()
			dueT.Reset(next)
		default:
			retry.reset()
		}
	}
}

// upkeep runs the retention rounds, when they are due or a retention
// changed, and the housekeeping every Interval, until ctx ends.
func (m *maintainer) upkeep(ctx context.Context) {
	interval := m.cfg.Interval
	retT := time.NewTimer(0)
	// Housekeeping waits an Interval after the election: where
	// Subscribers come and go often, the role moves often, and each new
	// term need not start with it.
	houseT := time.NewTimer(interval)
	defer retT.Stop()
	defer houseT.Stop()
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	// A detach through the owner's function that gave up on its lock
	// (a transaction holds the messages table) made publishers and
	// readers wait up to its lock_timeout: it is retried less often.
	locked := newBackoff(time.Second, interval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.topics:
			retT.Reset(0)
		case <-retT.C:
			sent := time.Now()
			next, err := m.retentionRound(ctx)
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				m.outage.ok()
				retry.reset()
				locked.reset()
			case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
				next = locked.delay()
				if ctx.Err() == nil {
					m.logger.Error("Retention maintenance gave up waiting for the messages table (a transaction holds it); retrying later",
						err, watermill.LogFields{"retry_in": next.String()})
				}
			default:
				if ctx.Err() == nil {
					m.outage.failed(sent, "Retention maintenance failed, retrying", err, nil)
				}
				next = retry.delay()
			}
			if next <= 0 || next > interval {
				next = interval
			}
			retT.Reset(next)
		case <-houseT.C:
			m.housekeeping(ctx)
			m.dropDetached(ctx)
			houseT.Reset(interval)
		}
	}
}

func (m *maintainer) release(g *sessionGen, epoch int64) {
	ctx, cancel := context.WithTimeout(context.Background(), m.closeTimeout)
	defer cancel()
	if err := m.store.release(ctx, g.id, epoch); err != nil {
		m.logger.Info("Cannot release the maintainer's row; another Subscriber takes over when this session expires",
			watermill.LogFields{"error": err.Error()})
		return
	}
	m.logger.Debug("Released the maintainer's row", nil)
}

// moveDue moves due delayed messages into their topics and returns when
// the next one is due (-1: none waits).
func (m *maintainer) moveDue(ctx context.Context) (time.Duration, error) {
	for {
		sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
		moved, nextMs, err := m.store.moveDue(sctx, moveDueLimit)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("move due delayed messages: %w", check.MissingSchema(err))
		}
		m.stats.delayedMoved.Add(uint64(moved))
		if moved > 0 {
			m.logger.Trace("Moved due delayed messages", watermill.LogFields{"count": moved})
		}
		if moved >= moveDueLimit {
			continue
		}
		if nextMs == nil {
			return -1, nil
		}
		return dueWait(*nextMs), nil
	}
}

// housekeeping deletes expired sessions, forgets the idempotency keys
// two slots old and, if configured, removes idle groups.
func (m *maintainer) housekeeping(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
	defer cancel()
	if n, err := m.store.forgetKeys(sctx); err != nil {
		if ctx.Err() == nil {
			m.logger.Info("Cannot forget the idempotency keys two slots old, retrying at the next housekeeping", watermill.LogFields{"error": err.Error()})
		}
	} else if n > 0 {
		m.logger.Debug("Forgot the idempotency keys two slots old", watermill.LogFields{"partitions": n})
	}
	n, err := m.store.deleteExpiredSessions(sctx, m.sessionTTL)
	if err != nil {
		if ctx.Err() == nil {
			m.logger.Info("Cannot delete expired consumer sessions", watermill.LogFields{"error": err.Error()})
		}
	} else if n > 0 {
		m.stats.sessionsDeleted.Add(uint64(n))
		m.logger.Debug("Deleted expired consumer sessions", watermill.LogFields{"count": n})
	}
	if m.retained.Load() { // a topic had a retention at the last retention round
		sent := time.Now()
		if err := m.deleteExpiredKept(ctx); err != nil && ctx.Err() == nil {
			m.outage.failed(sent, "Cannot delete expired messages kept forever, retrying at the next housekeeping", err, nil)
		}
	}
	if m.cfg.RemoveIdleGroupsAfter <= 0 {
		return
	}
	groups, err := m.store.deleteIdleGroups(sctx, m.cfg.RemoveIdleGroupsAfter)
	if err != nil {
		if ctx.Err() == nil {
			m.logger.Info("Cannot remove idle consumer groups", watermill.LogFields{"error": err.Error()})
		}
		return
	}
	for _, g := range groups {
		m.stats.groupsRemoved.Add(1)
		m.logger.Info("Removed the offsets of an idle consumer group", watermill.LogFields{
			"idle_group": g.ConsumerGroup, "rows": g.Rows, "idle_for": m.cfg.RemoveIdleGroupsAfter.String()})
	}
}
