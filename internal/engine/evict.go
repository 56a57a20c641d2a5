package engine

// Eviction from the in-flight window: a keyed window full of messages that
// wait for their key (behind a message nacked, waiting for its next
// attempt) drops their payloads, keeps them in place as their positions,
// reads on for the other keys, and reads the evicted messages again by
// their positions (pgsql.Driver.SelectMessagesAt) once their key may go
// on. The read position (ownership.after) never goes back: the window
// still holds every message up to it, whole or as a position, so the
// order per key, the acknowledged prefix and the hand-out mark are those
// of a window that kept them whole. See docs/decisions/0010-failure-policy.md.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// readAtParams are the parameters of consumerStore.readAt.
type readAtParams struct {
	row        rowKey
	positions  []Position
	here       string
	workerHere string
}

// evict evicts the window's messages held back by their waiting keys
// (inflightWindow.evictWaiting), giving their bytes back to the budget;
// it reports whether any was.
func (o *ownership) evict() bool {
	c := o.c
	bytes, n := o.w.evictWaiting(c.budget.reserveWant())
	if n == 0 {
		return false
	}
	c.budget.giveBack(&c.lease, bytes)
	c.stats.evicted.Add(uint64(n))
	return true
}

// readEvicted reads again the evicted messages that may go out once read
// (inflightWindow.rereadable), as many as the window has room for and the
// byte budget has free now (it never waits for it: without room or bytes
// it looks again after an Ack or retryFirst). A message no longer stored
// (retention removed it) is skipped as if acknowledged. again: the loop
// starts over.
func (o *ownership) readEvicted() (res outcome, again bool) {
	c, s, w := o.c, &o.c.settings, &o.w
	es := w.rereadable(min(s.batchSize, s.windowCap-w.waiting()))
	if len(es) == 0 {
		return proceed, false
	}
	var want int64
	for _, e := range es {
		want += e.msg.size
	}
	before := c.lease.n
	if !c.budget.tryReserve(&c.lease, want) {
		w.rereadDue = true
		resetTimer(&o.reread, s.retryFirst)
		return proceed, false
	}
	got, fit, used := c.lease.n-before, 0, int64(0)
	for fit < len(es) && used+es[fit].msg.size <= got {
		used += es[fit].msg.size
		fit++
	}
	c.budget.giveBack(&c.lease, got-used)
	if fit == 0 {
		w.rereadDue = true
		resetTimer(&o.reread, s.retryFirst)
		return proceed, false
	}
	if fit < len(es) {
		w.rereadDue = true
		es = es[:fit]
	}
	ps := make([]Position, len(es))
	for i, e := range es {
		ps[i] = e.msg.pos
	}
	sent := time.Now()
	rows, err := c.store.readAt(c.ctx, readAtParams{row: c.row(), positions: ps, here: c.here, workerHere: c.workerHere})
	if err != nil {
		c.budget.giveBack(&c.lease, used)
		w.rereadDue = true
		if c.ctx.Err() != nil {
			return proceed, true
		}
		if errors.Is(o.cl.wentBack(err, "read evicted messages of topic"), ErrDatabaseWentBack) {
			return lost, false
		}
		c.outage.failed(sent, "Cannot read evicted messages again, retrying", err,
			watermill.LogFields{"topic": c.topic, "partition": c.partition})
		w.rereadDue = false // until the timer fires
		resetTimer(&o.reread, o.retry.delay())
		return proceed, false
	}
	c.outage.ok()
	c.stats.rereads.Add(1)
	byPos := make(map[Position]storedMessage, len(rows))
	for _, m := range rows {
		byPos[m.pos] = m
	}
	for _, e := range es {
		if m, ok := byPos[e.msg.pos]; ok {
			w.restore(e, m)
			continue
		}
		c.budget.giveBack(&c.lease, e.msg.size)
		c.logger.Error("Evicted message no longer stored, skipped", nil, watermill.LogFields{
			"partition": c.partition, "uuid": e.msg.uuid,
			"position": strconv.FormatUint(e.msg.pos.TransactionID, 10) + ":" + strconv.FormatInt(e.msg.pos.Offset, 10)})
		if res := o.acked(e); res != proceed {
			return res, false
		}
	}
	return proceed, true
}

// readAt reads the messages at p.positions whole (see
// pgsql.Driver.SelectMessagesAt): it waits for a connection while ctx
// lasts, then gives the statement timeout.
func (s offsetStore) readAt(ctx context.Context, timeout time.Duration, p readAtParams) ([]storedMessage, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read evicted messages of topic %q: %w", p.row.topic, err)
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s.stats.reads.Add(1)
	ps := make([]pgsql.Position, len(p.positions))
	for i, pos := range p.positions {
		ps[i] = pgsql.Position(pos)
	}
	res, err := s.driver.SelectMessagesAt(ctx, conn, pgsql.SelectMessagesAtParams{Topic: p.row.topic,
		Partition: p.row.partition, Positions: ps, Here: p.here, WorkerHere: p.workerHere})
	if err != nil {
		return nil, fmt.Errorf("read evicted messages of topic %q: %w", p.row.topic, check.MissingSchema(err))
	}
	if res.WentBack {
		return nil, fmt.Errorf("read evicted messages of topic %q: %w", p.row.topic, wentBackError(res))
	}
	rows := make([]storedMessage, len(res.Messages))
	for i, m := range res.Messages {
		rows[i] = storedMessage{uuid: m.UUID, payload: m.Payload, metadata: m.Metadata, size: m.Size, whole: true,
			pos: Position(m.Position)}
	}
	return rows, nil
}
