package pglease

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
)

// wakeHub routes wake-ups to the consumers of one Subscriber: from
// notifications, by topic, and from the idle poller. It is safe for
// concurrent use.
type wakeHub struct {
	mu      sync.Mutex
	byTopic map[string]map[*consumer]struct{}
	// idle holds owners waiting for news, with the position they wait after.
	idle map[*consumer]Position
}

func newWakeHub() *wakeHub {
	return &wakeHub{byTopic: map[string]map[*consumer]struct{}{}, idle: map[*consumer]Position{}}
}

func (h *wakeHub) add(c *consumer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.byTopic[c.topic]
	if set == nil {
		set = map[*consumer]struct{}{}
		h.byTopic[c.topic] = set
	}
	set[c] = struct{}{}
}

func (h *wakeHub) remove(c *consumer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if set := h.byTopic[c.topic]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(h.byTopic, c.topic)
		}
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

// notify handles one notification payload: "m" + topic wakes the topic's
// owner, "r" + topic (released) wakes its standbys.
func (h *wakeHub) notify(payload string) {
	if payload == "" {
		return
	}
	kind, topic := payload[0], payload[1:]
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.byTopic[topic] {
		owner := c.owning.Load()
		if (kind == 'm' && owner) || (kind == 'r' && !owner) {
			c.poke()
		}
	}
}

// wakeAll wakes every consumer, after notifications may have been missed.
func (h *wakeHub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.byTopic {
		for c := range set {
			c.poke()
		}
	}
}

func (h *wakeHub) idleSnapshot() ([]*consumer, VisibleTopicsParams) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := make([]*consumer, 0, len(h.idle))
	p := VisibleTopicsParams{
		Topics:    make([]string, 0, len(h.idle)),
		Positions: make([]Position, 0, len(h.idle)),
	}
	for c, pos := range h.idle {
		cs = append(cs, c)
		p.Topics = append(p.Topics, c.topic)
		p.Positions = append(p.Positions, pos)
	}
	return cs, p
}

// listen keeps one connection LISTENing on the adapter's channel and wakes
// consumers on notifications. After every (re)connect it wakes all of them,
// since notifications may have been missed meanwhile; while it is
// disconnected, the idle poller and the standbys' timed retries carry on.
func (s *Subscriber) listen() {
	defer s.background.Done()
	retry := newBackoff(100*time.Millisecond, maxRetryBackoff)
	for {
		err := s.listenOnce(retry.reset)
		if s.ctx.Err() != nil {
			return
		}
		s.logger.Error("Notification listener disconnected, reconnecting (idle topics are polled every PollInterval meanwhile)", err, nil)
		if !sleep(retry.delay(), s.ctx.Done(), nil) {
			return
		}
	}
}

func (s *Subscriber) listenOnce(connected func()) error {
	conn, err := pgx.ConnectConfig(s.ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.config.CloseTimeout)
		defer cancel()
		_ = conn.Close(ctx)
	}()
	if _, err := conn.Exec(s.ctx, "LISTEN "+pgx.Identifier{s.config.SchemaAdapter.NotifyChannel()}.Sanitize()); err != nil {
		return err
	}
	connected()
	s.hub.wakeAll()
	s.logger.Debug("Listening for notifications", watermill.LogFields{"channel": s.config.SchemaAdapter.NotifyChannel()})
	for {
		n, err := conn.WaitForNotification(s.ctx)
		if err != nil {
			return err
		}
		s.hub.notify(n.Payload)
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
	rows, err := s.pool.Query(ctx, q.SQL, q.Args...)
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
