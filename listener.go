package pglease

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// notify handles one notification payload: "m" + topic (new messages in
// partition 0) and "n" + partition + ":" + topic (in another partition)
// wake the consumer of that partition, "r" + topic (released)
// the group member if it subscribes to the topic, "g" + group (a session of
// the group started, ended or changed its topics) the group member, "p" +
// topic (partition count raised) the member, to start consumers for the new
// partitions, "x" + topic (offsets reset by an operator) the member, to give
// its rows of the topic up and claim them again; "e" (the maintainer's row
// was released), "d" + due time (delayed messages stored) and "t" + topic
// (a retention changed) the maintainer. A reset notified while
// the listener reconnects is caught at the owner's next commit instead,
// which the reset's epoch bump refuses.
func (h *wakeHub) notify(payload string) {
	if payload == "" {
		return
	}
	kind, name := payload[0], payload[1:]
	switch kind {
	case 'm', 'n':
		var partition int32
		if kind == 'n' {
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
	case 'r':
		h.member.released(name)
	case 'g':
		if name == h.group {
			h.member.membersChanged()
		}
	case 'p':
		h.member.topicChanged(&name)
	case 'x':
		h.member.offsetsReset(name)
	case 'e', 'd', 't':
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

func (h *wakeHub) idleSnapshot() ([]*consumer, VisibleTopicsParams) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := make([]*consumer, 0, len(h.idle))
	p := VisibleTopicsParams{
		Topics:     make([]string, 0, len(h.idle)),
		Partitions: make([]int32, 0, len(h.idle)),
		Positions:  make([]Position, 0, len(h.idle)),
	}
	for c, pos := range h.idle {
		cs = append(cs, c)
		p.Topics = append(p.Topics, c.topic)
		p.Partitions = append(p.Partitions, c.partition)
		p.Positions = append(p.Positions, pos)
	}
	return cs, p
}

// listenerKey identifies a shared listener: Subscribers on the same pool
// and the same messages table share one LISTEN connection.
type listenerKey struct {
	pool    *pgxpool.Pool
	channel string
}

var (
	listenersMu sync.Mutex
	listeners   = map[listenerKey]*sharedListener{}
)

// sharedListener keeps one connection LISTENing on a channel for every
// Subscriber of the process that uses the same pool and tables, and passes
// each notification to their wake hubs. It runs while at least one
// Subscriber uses it. The connection is not the pool's (a LISTEN needs a
// connection of its own for as long as it runs); it is dialled the way the
// pool dials, with the pool's hooks (poolDialer).
type sharedListener struct {
	key          listenerKey
	dialer       poolDialer
	logger       watermill.LoggerAdapter
	closeTimeout time.Duration

	mu   sync.Mutex
	hubs map[*wakeHub]struct{}

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// acquireListener registers hub with the listener of (pool, channel),
// starting it if needed.
func acquireListener(pool *pgxpool.Pool, channel string, hub *wakeHub, logger watermill.LoggerAdapter, closeTimeout time.Duration) *sharedListener {
	key := listenerKey{pool: pool, channel: channel}
	listenersMu.Lock()
	defer listenersMu.Unlock()
	l := listeners[key]
	if l == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l = &sharedListener{
			key:          key,
			dialer:       newPoolDialer(pool),
			logger:       logger.With(watermill.LogFields{"channel": channel}),
			closeTimeout: closeTimeout,
			hubs:         map[*wakeHub]struct{}{},
			ctx:          ctx,
			cancel:       cancel,
			done:         make(chan struct{}),
		}
		listeners[key] = l
		go l.run()
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
		l.cancel()
	}
	listenersMu.Unlock()
	if last {
		<-l.done
	}
}

func (l *sharedListener) each(f func(*wakeHub)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for h := range l.hubs {
		f(h)
	}
}

// run keeps the connection LISTENing. After every (re)connect it wakes every
// consumer, since notifications may have been missed meanwhile; while it is
// disconnected, the idle pollers and the standbys' timed retries carry on.
func (l *sharedListener) run() {
	defer close(l.done)
	retry := newBackoff(100*time.Millisecond, maxRetryBackoff)
	for {
		err := l.listenOnce(retry.reset)
		if l.ctx.Err() != nil {
			return
		}
		l.logger.Error("Notification listener disconnected, reconnecting (idle topics are polled every PollInterval meanwhile)", err, nil)
		if !sleep(retry.delay(), l.ctx.Done(), nil) {
			return
		}
	}
}

func (l *sharedListener) listenOnce(connected func()) error {
	conn, err := l.dialer.dial(l.ctx)
	if err != nil {
		return err
	}
	defer l.dialer.close(conn, l.closeTimeout)
	if _, err := conn.Exec(l.ctx, "LISTEN "+pgx.Identifier{l.key.channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	l.each((*wakeHub).wakeAll)
	l.logger.Debug("Listening for notifications", nil)
	for {
		n, err := conn.WaitForNotification(l.ctx)
		if err != nil {
			return err
		}
		l.each(func(h *wakeHub) { h.notify(n.Payload) })
	}
}

// pollIdle is the fallback for missed notifications: every PollInterval it
// asks, in one statement for all idle topics of this Subscriber, which of
// them have messages after their position, and wakes those.
func (s *Subscriber) pollIdle() {
	defer s.background.Done()
	for sleep(s.config.PollInterval, s.ctx.Done(), nil) {
		consumers, params := s.hub.idleSnapshot()
		if len(consumers) == 0 {
			continue
		}
		if err := s.pollIdleOnce(consumers, params); err != nil && s.ctx.Err() == nil {
			s.logger.Error("Cannot poll idle topics, retrying", err, nil)
		}
	}
}

func (s *Subscriber) pollIdleOnce(consumers []*consumer, params VisibleTopicsParams) error {
	ctx, cancel := context.WithTimeout(s.ctx, s.config.SessionTTL)
	defer cancel()
	q := s.config.SchemaAdapter.VisibleTopics(params)
	conn, err := s.offsets.gate.acquire(ctx)
	if err != nil {
		return err
	}
	defer s.offsets.gate.release(conn)
	rows, err := conn.Query(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			return err
		}
		if n >= 1 && int(n) <= len(consumers) {
			consumers[n-1].poke()
		}
	}
	return rows.Err()
}
