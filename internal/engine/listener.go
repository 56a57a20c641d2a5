package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/svc"
)

// wakeHub routes wake-ups to the consumers of one Subscriber: from
// notifications, by topic, and from the idle poller. It is safe for
// concurrent use.
type wakeHub struct {
	member *groupMember
	maint  *maintainer // nil when maintenance is disabled
	group  string

	mu      sync.Mutex
	byTopic map[string][]*consumer
	// idle holds owners waiting for news, with the position they wait after.
	idle map[*consumer]Position
}

func newWakeHub(member *groupMember, maint *maintainer, group string) *wakeHub {
	return &wakeHub{member: member, maint: maint, group: group,
		byTopic: map[string][]*consumer{}, idle: map[*consumer]Position{}}
}

func (h *wakeHub) add(c *consumer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byTopic[c.topic] = append(h.byTopic[c.topic], c)
}

func (h *wakeHub) remove(c *consumer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs := slices.DeleteFunc(h.byTopic[c.topic], func(x *consumer) bool { return x == c }); len(cs) > 0 {
		h.byTopic[c.topic] = cs
	} else {
		delete(h.byTopic, c.topic)
	}
	delete(h.idle, c)
}

func (h *wakeHub) setIdle(c *consumer, after Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.idle[c] = after
}

func (h *wakeHub) clearIdle(c *consumer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.idle, c)
}

// notify handles one notification payload (pgsql.NotifyMessages and the
// other kinds): new messages wake the consumer of their partition; a
// release wakes the group member if it subscribes to the topic; a change
// of the group's sessions wakes the member; a raised partition count has
// the member start consumers for the new partitions; a reset of the
// group's offsets on a topic has the member of that group read its rows
// of the topic and give up those whose owner or epoch moved; the
// maintainer's row released, delayed messages stored and a retention
// changed wake the maintainer. The reset notification of earlier versions
// (an older pglease command or Inspector during a rolling upgrade) names
// no group: every member reads its rows of the topic. Any role of the
// database may notify on the channel, so every notification is a hint to
// look, never an order (see docs/security.md). A reset notified while the
// listener reconnects, or that an older Subscriber does not understand, is
// caught at the owner's next commit instead, which the reset's epoch bump
// refuses.
func (h *wakeHub) notify(payload string) {
	if payload == "" {
		return
	}
	kind, name := payload[0], payload[1:]
	switch kind {
	case pgsql.NotifyMessages, pgsql.NotifyPartition:
		var partition int32
		if kind == pgsql.NotifyPartition {
			p, topic, ok := strings.Cut(name, ":")
			n, err := strconv.ParseInt(p, 10, 32)
			if !ok || err != nil {
				return
			}
			partition, name = int32(n), topic
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		// Consumers that wait for a grant keep the wake-up: they read
		// once they own the row.
		for _, c := range h.byTopic[name] {
			if c.partition == partition {
				c.poke()
			}
		}
	case pgsql.NotifyReleased:
		h.member.released(name)
	case pgsql.NotifyGroup:
		if name == h.group {
			h.member.membersChanged()
		}
	case pgsql.NotifyPartitions:
		h.member.topicChanged(&name)
	case pgsql.NotifyReset:
		if group, topic, ok := pgsql.ParseResetNotification(name); ok && group == h.group {
			h.member.offsetsReset(topic)
		}
	case pgsql.NotifyResetAny:
		h.member.offsetsReset(name)
	case pgsql.NotifyMaintainer, pgsql.NotifyDelayed, pgsql.NotifyRetention:
		h.maint.notified(kind)
	}
}

// wakeAll wakes every owner and the group member, after notifications may
// have been missed; the member reads the partition counts again. Consumers
// that wait for their row learn from the claim whether a message waits.
func (h *wakeHub) wakeAll() {
	h.mu.Lock()
	for _, cs := range h.byTopic {
		for _, c := range cs {
			if c.owning.Load() {
				c.poke()
			}
		}
	}
	h.mu.Unlock()
	h.member.topicChanged(nil)
	h.member.membersChanged()
	h.maint.wakeAll()
}

// partitionPollTicks is how many PollIntervals apart a Subscriber that
// receives no notifications reads its topics' partition counts again.
const partitionPollTicks = 30

// partitionRefreshInterval is how often every Subscriber reads its topics'
// partition counts again, notifications or not: a raise whose notification
// was never sent (the topics table updated by hand) or
// lost is picked up this long after it at most. A variable, so that tests
// can shrink it.
var partitionRefreshInterval = 5 * time.Minute

// pollTick stands in, every PollInterval, for the notifications of a
// Subscriber that receives none (PollOnly, a listener that reconnects or
// refused a pooler): the member reads its group again while it waits for
// topics (another member may have released one, or left), the maintainer's
// candidates look at the row and the maintainer for delayed messages
// stored since, and every partitionPollTicks-th tick (tick counts from 1)
// the member reads the partition counts. New messages of idle topics are
// found by pollIdle, as when notifications arrive.
func (h *wakeHub) pollTick(tick int) {
	h.member.pollTick()
	h.maint.pollTick()
	if tick%partitionPollTicks == 0 {
		h.member.topicChanged(nil)
	}
}

func (h *wakeHub) idleSnapshot() ([]*consumer, pgsql.VisibleTopicsParams) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := make([]*consumer, 0, len(h.idle))
	p := pgsql.VisibleTopicsParams{
		Topics:     make([]string, 0, len(h.idle)),
		Partitions: make([]int32, 0, len(h.idle)),
		Positions:  make([]pgsql.Position, 0, len(h.idle)),
	}
	for c, pos := range h.idle {
		cs = append(cs, c)
		p.Topics = append(p.Topics, c.topic)
		p.Partitions = append(p.Partitions, c.partition)
		p.Positions = append(p.Positions, pgsql.Position(pos))
	}
	return cs, p
}

// listenerKey identifies a shared listener: Subscribers on the same pool
// and the same messages table, with the same ListenConnConfig, share one
// LISTEN connection.
type listenerKey struct {
	pool    *pgxpool.Pool
	channel string
	direct  *pgx.ConnConfig // SubscriberConfig.ListenConnConfig; nil: the pool's
}

var (
	listenersMu sync.Mutex
	listeners   = map[listenerKey]*sharedListener{}
)

// The wake-up probe: while it listens, a listener sends itself a
// notification through the pool every listenerProbeInterval and expects it
// back within listenerProbeTimeout; otherwise its connection no longer
// receives (half-open, dropped by a proxy) and it reconnects. Variables,
// so that tests can shrink them.
var (
	listenerProbeInterval = 30 * time.Second
	listenerProbeTimeout  = 10 * time.Second
)

// errPooledConnection is returned when the connection dialled for LISTEN
// turns out to go through a connection pooler or proxy.
var errPooledConnection = errors.New("the connection goes through a connection pooler or proxy")

// sharedListener keeps one connection LISTENing on a channel for every
// Subscriber of the process that uses the same pool and tables, and passes
// each notification to their wake hubs. It runs while at least one
// Subscriber uses it. The connection is not the pool's (a LISTEN needs a
// connection of its own for as long as it runs); it is dialled the way the
// pool dials, with the pool's hooks (poolDialer), from ListenConnConfig
// when the Subscriber has one.
//
// It never LISTENs through a connection pooler: a notification that
// arrives on a server connection no client holds makes PgBouncer drop it
// (or, in transaction mode, crash). Every connection is checked first
// (checkDirect); one that goes through a pooler is closed, the Subscribers
// poll, and the listener says once what to set.
type sharedListener struct {
	key          listenerKey
	dialer       poolDialer
	logger       watermill.LoggerAdapter
	outage       *outageLog // reconnections: logged once per outage
	closeTimeout time.Duration

	mu   sync.Mutex
	hubs map[*wakeHub]struct{}

	// listening is true while the connection LISTENs and its last probe
	// came back: Subscribers rely on notifications and poll only as a
	// fallback. While it is false they poll for what notifications
	// would have told them.
	listening atomic.Bool

	probeMu    sync.Mutex
	probeToken string        // the probe awaited, "" if none
	probeBack  chan struct{} // closed when it arrives

	loop svc.Service // run: the connection, until the last hub is released
}

// acquireListener registers hub with the listener of (pool, channel,
// direct), starting it if needed.
func acquireListener(pool *pgxpool.Pool, channel string, direct *pgx.ConnConfig, hub *wakeHub, logger watermill.LoggerAdapter, closeTimeout time.Duration) *sharedListener {
	key := listenerKey{pool: pool, channel: channel, direct: direct}
	listenersMu.Lock()
	defer listenersMu.Unlock()
	l := listeners[key]
	if l == nil {
		dialer := newPoolDialer(pool)
		dialer.conn = direct
		l = &sharedListener{
			key:          key,
			dialer:       dialer,
			logger:       logger.With(watermill.LogFields{"channel": channel}),
			outage:       newOutageLog(logger.With(watermill.LogFields{"channel": channel}), componentListener),
			closeTimeout: closeTimeout,
			hubs:         map[*wakeHub]struct{}{},
		}
		listeners[key] = l
		l.loop.Start(context.Background(), l.run)
	}
	l.mu.Lock()
	l.hubs[hub] = struct{}{}
	l.mu.Unlock()
	return l
}

// release unregisters hub; the last one stops the listener and waits for
// its goroutine to end.
func (l *sharedListener) release(hub *wakeHub) {
	listenersMu.Lock()
	l.mu.Lock()
	delete(l.hubs, hub)
	last := len(l.hubs) == 0
	l.mu.Unlock()
	if last {
		delete(listeners, l.key)
	}
	listenersMu.Unlock()
	if last {
		l.loop.Stop()
	}
}

func (l *sharedListener) each(f func(*wakeHub)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for h := range l.hubs {
		f(h)
	}
}

// Listening reports whether notifications reach the Subscribers (nil-safe:
// a Subscriber without a listener polls).
func (l *sharedListener) Listening() bool {
	return l != nil && l.listening.Load()
}

// run keeps the connection LISTENing. After every (re)connect it wakes every
// consumer, since notifications may have been missed meanwhile; while it is
// disconnected, the Subscribers poll. A connection that goes through a
// pooler ends the attempts: the Subscribers poll for as long as they run.
func (l *sharedListener) run(ctx context.Context) {
	retry := newBackoff(100*time.Millisecond, maxRetryBackoff)
	for {
		sent := time.Now()
		err := l.listenOnce(ctx, func() {
			retry.reset()
			l.outage.ok()
		})
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errPooledConnection) {
			setting := "set SubscriberConfig.ListenConnConfig to a direct connection to the primary (not through the pooler)"
			if l.key.direct != nil {
				setting = "point SubscriberConfig.ListenConnConfig at the primary itself, not at a pooler"
			}
			l.logger.Error("Not listening for notifications: "+setting+
				", or set SubscriberConfig.PollOnly to poll without this message. Messages, hand-overs and group changes are found by polling every PollInterval meanwhile",
				err, nil)
			<-ctx.Done()
			return
		}
		l.outage.failed(sent, "Notification listener disconnected, reconnecting (the Subscribers poll every PollInterval meanwhile)", err, nil)
		if !sleep(retry.delay(), ctx.Done(), nil) {
			return
		}
	}
}

func (l *sharedListener) listenOnce(lctx context.Context, connected func()) error {
	conn, err := l.dialer.dial(lctx)
	if err != nil {
		return err
	}
	defer l.dialer.close(conn, l.closeTimeout)
	if err := checkDirect(lctx, conn); err != nil {
		return err
	}
	if err := pgsql.Listen(lctx, conn, l.key.channel); err != nil {
		return err
	}
	connected()
	l.listening.Store(true)
	defer l.listening.Store(false)
	l.each((*wakeHub).wakeAll)
	l.logger.Debug("Listening for notifications", nil)

	ctx, cancel := context.WithCancel(lctx)
	defer cancel()
	probeErr := make(chan error, 1)
	var prober svc.Service
	prober.Start(ctx, func(ctx context.Context) {
		if err := l.probe(ctx); err != nil {
			probeErr <- err
			cancel()
		}
	})
	// Stopped (cancelled, then waited for) whatever ended the wait: a
	// connection that failed must not wait for the probe's next round.
	defer prober.Stop()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			select {
			case perr := <-probeErr:
				return perr
			default:
				return err
			}
		}
		if len(n.Payload) > 0 && n.Payload[0] == pgsql.NotifyProbe { // wake hubs never see it
			l.probeArrived(n.Payload[1:])
			continue
		}
		l.each(func(h *wakeHub) { h.notify(n.Payload) })
	}
}

// probe sends the listener a notification through the pool every
// listenerProbeInterval and returns an error when one does not come back
// within listenerProbeTimeout. A probe that cannot be sent (the pool's
// server is unreachable) proves nothing and is skipped.
func (l *sharedListener) probe(ctx context.Context) error {
	for sleep(listenerProbeInterval, ctx.Done(), nil) {
		token := uuid.NewString()
		back := make(chan struct{})
		l.probeMu.Lock()
		l.probeToken, l.probeBack = token, back
		l.probeMu.Unlock()
		sctx, cancel := context.WithTimeout(ctx, listenerProbeTimeout)
		sent := time.Now()
		err := pgsql.Notify(sctx, l.key.pool, l.key.channel, string(rune(pgsql.NotifyProbe))+token)
		if err == nil {
			select {
			case <-back:
			case <-sctx.Done():
				if ctx.Err() == nil {
					err = fmt.Errorf("%w: a notification sent through the pool %s ago has not arrived", errListenerDeaf,
						time.Since(sent).Round(time.Millisecond))
				}
			}
		} else {
			err = nil
		}
		cancel()
		l.probeMu.Lock()
		l.probeToken, l.probeBack = "", nil
		l.probeMu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// errListenerDeaf is why a listener that stopped receiving reconnects.
var errListenerDeaf = errors.New("the notification listener receives nothing (a half-open connection, or a proxy or pooler between it and the server)")

func (l *sharedListener) probeArrived(token string) {
	l.probeMu.Lock()
	defer l.probeMu.Unlock()
	if l.probeBack != nil && token == l.probeToken {
		close(l.probeBack)
		l.probeBack = nil
	}
}

// checkDirect tells whether conn reaches the PostgreSQL backend it
// LISTENs on for as long as it lives, and returns errPooledConnection when
// it may not: when the backend's process id differs from the one the
// server announced at login (PgBouncer, RDS Proxy, Supavisor and other
// poolers announce their own, even in session mode), when it changes
// between two statements, or when a LISTEN is not seen by the next
// statement (the statements ran on different server connections).
func checkDirect(ctx context.Context, conn *pgx.Conn) error {
	pid, err := pgsql.BackendPID(ctx, conn)
	if err != nil {
		return fmt.Errorf("check the listener's connection: %w", err)
	}
	if announced := conn.PgConn().PID(); uint32(pid) != announced {
		return fmt.Errorf("%w: its backend's process id is %d, the one announced at login %d", errPooledConnection, pid, announced)
	}
	probe := "pglease_probe_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	if err := pgsql.Listen(ctx, conn, probe); err != nil {
		return fmt.Errorf("check the listener's connection: %w", err)
	}
	pid2, seen, err := pgsql.ListeningOn(ctx, conn, probe)
	if err != nil {
		return fmt.Errorf("check the listener's connection: %w", err)
	}
	if err := pgsql.Unlisten(ctx, conn, probe); err != nil {
		return fmt.Errorf("check the listener's connection: %w", err)
	}
	if pid2 != pid || !seen {
		return fmt.Errorf("%w: a LISTEN was not seen by the next statement on the same connection (backend %d, then %d)",
			errPooledConnection, pid, pid2)
	}
	return nil
}

// pollIdle is the fallback for missed notifications: every PollInterval it
// asks, in one statement for all idle topics of this Subscriber, which of
// them have messages after their position, and wakes those.
//
// While no notifications arrive (s.listener.Listening is false), each
// round also polls for what they would have told (wakeHub.pollTick).
// Whether they arrive or not, the partition counts of all topics are read
// again every partitionRefreshInterval (at the first round after it): a
// raise that was never notified is picked up all the same.
func (s *Subscriber) pollIdle(ctx context.Context) {
	deaf := 0
	refreshed := time.Now()
	for sleep(s.settings.PollInterval, ctx.Done(), nil) {
		if s.listener.Listening() {
			deaf = 0
		} else {
			deaf++
			s.hub.pollTick(deaf)
		}
		if time.Since(refreshed) >= s.partitionRefresh {
			refreshed = time.Now()
			s.member.topicChanged(nil)
		}
		consumers, params := s.hub.idleSnapshot()
		if len(consumers) == 0 {
			continue
		}
		sent := time.Now()
		if err := s.pollIdleOnce(consumers, params); err != nil {
			if ctx.Err() == nil {
				s.pollOutage.failed(sent, "Cannot poll idle topics, retrying", err, nil)
			}
		} else {
			s.pollOutage.ok()
		}
	}
}

func (s *Subscriber) pollIdleOnce(consumers []*consumer, params pgsql.VisibleTopicsParams) error {
	ctx, cancel := context.WithTimeout(s.ctx, s.stmtTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	visible, err := s.offsets.driver.VisibleTopics(ctx, conn, params)
	if err != nil {
		return err
	}
	for _, n := range visible {
		if n >= 1 && int(n) <= len(consumers) {
			consumers[n-1].poke()
		}
	}
	return nil
}
