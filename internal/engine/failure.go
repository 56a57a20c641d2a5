package engine

// The failure policy (Settings.Retry): a nacked message waits for its next
// attempt with an exponential backoff, in the window, holding back only
// the later messages of its ordering key; its attempts, failures and
// next attempt's time are written, fenced, into its row's waiting column
// before it waits, so that a crash or a takeover hands the schedule to the
// next owner; after its last attempt it moves to the dead-letter topic in
// the transaction that moves the group past it. See
// docs/decisions/0010-failure-policy.md.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// RetrySettings are the root package's RetryConfig, with its defaults
// applied and validated.
type RetrySettings struct {
	// MaxAttempts is how many hand-outs a message gets before it moves to
	// DeadLetterTopic; 0: no limit.
	MaxAttempts int
	// MinBackoff is the wait after the first failure, doubling per
	// failure up to MaxBackoff; Jitter is the fraction of the wait, in
	// [0, 1], by which it varies either way, at random.
	MinBackoff, MaxBackoff time.Duration
	Jitter                 float64
	DeadLetterTopic        string
}

// The metadata keys of a message moved to its dead-letter topic (the root
// package exports them under the same names).
const (
	DeadLetterSourceTopicMetadata     = "_pglease_dead_letter_source_topic"
	DeadLetterSourcePartitionMetadata = "_pglease_dead_letter_source_partition"
	DeadLetterSourcePositionMetadata  = "_pglease_dead_letter_source_position"
	DeadLetterGroupMetadata           = "_pglease_dead_letter_group"
	DeadLetterAttemptsMetadata        = "_pglease_dead_letter_attempts"
	DeadLetterFirstFailureMetadata    = "_pglease_dead_letter_first_failure"
	DeadLetterLastFailureMetadata     = "_pglease_dead_letter_last_failure"
	DeadLetterReasonMetadata          = "_pglease_dead_letter_reason"
)

// maxFailureReason bounds the reason recorded with a failure (bytes, cut
// on a character boundary).
const maxFailureReason = 1024

// failurePolicy is a Subscriber's RetrySettings, with the source of its
// jitter (tests replace it).
type failurePolicy struct {
	RetrySettings
	random func() float64 // in [0, 1)
	// step, when set (tests only), is called at each step of an attempt
	// (FailureStep...) with the message's UUID and the attempt.
	step func(step, uuid string, attempt int)
}

// The steps of an attempt at which the failure policy calls a test's
// hook (Subscriber.SetFailureStepHook), in their order.
const (
	// FailureStepPick: the message is next to go out; nothing of this
	// hand-out is written yet.
	FailureStepPick = "pick"
	// FailureStepCounted: what is written before it goes out is written;
	// the handler does not hold it yet.
	FailureStepCounted = "counted"
	// FailureStepNacked: its handler nacked it; nothing of the failure is
	// written yet (nor, after the last attempt, of the move).
	FailureStepNacked = "nacked"
	// FailureStepRecorded: the failure is written; it waits for its next
	// attempt.
	FailureStepRecorded = "recorded"
)

// at calls the step hook, if any, for e.
func (p *failurePolicy) at(step string, e *windowEntry) {
	if p.step != nil {
		p.step(step, e.msg.uuid, e.attempt)
	}
}

func newFailurePolicy(s *RetrySettings) *failurePolicy {
	if s == nil {
		return nil
	}
	return &failurePolicy{RetrySettings: *s, random: rand.Float64}
}

// backoff is the wait after the failure of attempt n (from 1):
// MinBackoff·2^(n-1), at most MaxBackoff, varied by ±Jitter at random
// and kept within MaxBackoff.
func (p *failurePolicy) backoff(n int) time.Duration {
	d := p.MinBackoff
	for i := 1; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	if p.Jitter > 0 {
		d = time.Duration(float64(d) * (1 + p.Jitter*(2*p.random()-1)))
	}
	return max(min(d, p.MaxBackoff), 0)
}

// exhausted reports whether a message whose attempt n failed has had its
// last attempt.
func (p *failurePolicy) exhausted(n int) bool { return p.MaxAttempts > 0 && n >= p.MaxAttempts }

// failureStore runs the failure policy's statements (offsetStore in
// production). Each returns ErrOwnershipLost when the row is no longer
// the claim's, an error wrapping pgsql.ErrWentBack when the database is
// not where the claim's session was made.
type failureStore interface {
	loadWaiting(ctx context.Context, cl *claim) ([]pgsql.WaitingRow, error)
	loadHandedOut(ctx context.Context, cl *claim) (mark Position, ok bool, err error)
	markHandedOut(ctx context.Context, cl *claim, pos Position) error
	recordWaiting(ctx context.Context, cl *claim, p pgsql.WaitingParams) (pgsql.WaitingRow, error)
	// deadLetter runs, in one transaction, the move of the group past
	// the message (pgsql.DeadLetterOffset) and the insert of its copy,
	// built by copyOf from the entry the move returns.
	deadLetter(ctx context.Context, cl *claim, p pgsql.WaitingParams,
		copyOf func(pgsql.WaitingRow) pgsql.InsertMessagesParams) (pgsql.WaitingRow, error)
}

// waitingState is a message's entry in its row's waiting column, as the
// owner knows it.
type waitingState struct {
	attempts int
}

// failureReason is what a handler said about its Nack (NackWithReason),
// carried by the delivery's context.
type failureReason struct{ atomic.Pointer[string] }

// SetNackReason records err as the reason of msg's next Nack, for the
// failure policy to write with the failure (and into the dead-letter
// copy). It reports false when msg was not delivered by a Subscriber.
func SetNackReason(msg *message.Message, err error) bool {
	if msg == nil || err == nil {
		return false
	}
	d, ok := deliveryOf(msg)
	if !ok {
		return false
	}
	s := abbreviateRaw(err.Error(), maxFailureReason)
	d.reason.Store(&s)
	return true
}

// reasonOf returns the reason recorded for msg's Nack ("" none).
func reasonOf(msg *message.Message) string {
	if d, ok := deliveryOf(msg); ok {
		if s := d.reason.Load(); s != nil {
			return *s
		}
	}
	return ""
}

// loadWaiting reads the claim's waiting messages before its first
// hand-out: each one not acknowledged already goes out with its next
// attempt when due. Entries of messages the row's position or
// acknowledgements passed are stale: dropped at the next write.
func (o *ownership) loadWaiting() outcome {
	c := o.c
	var rows []pgsql.WaitingRow
	res := c.fencedWrite(o.g, o.cl, "Cannot read the messages waiting for their next attempt, retrying",
		func(ctx context.Context) (err error) {
			if rows, err = c.failures.loadWaiting(ctx, o.cl); err != nil {
				return err
			}
			o.handedOut, o.marked, err = c.failures.loadHandedOut(ctx, o.cl)
			return err
		})
	if res != proceed {
		return res
	}
	now := time.Now()
	o.waiting = make(map[Position]*waitingState, len(rows))
	o.waitDue = make(map[Position]time.Time, len(rows))
	for _, r := range rows {
		pos := Position(r.Position)
		if !positionLess(o.cl.acked, pos) || o.cl.skips(pos) {
			o.drop = append(o.drop, pos)
			continue
		}
		o.waiting[pos] = &waitingState{attempts: int(r.Attempts)}
		if r.DueIn > 0 {
			o.waitDue[pos] = now.Add(r.DueIn)
		}
	}
	return proceed
}

// resume sets e, just read, to its next attempt if it waits: attempt
// after those counted, out once due. A message without an entry at or
// before the row's hand-out mark may have gone out from the previous
// owner, which died or lost the row before its outcome was written: that
// hand-out counts, and e goes out as attempt 2 (guessed).
func (o *ownership) resume(e *windowEntry) {
	ws := o.waiting[e.msg.pos]
	if ws == nil {
		if o.marked && !positionLess(o.handedOut, e.msg.pos) {
			e.attempt, e.guessed = 2, true
		}
		return
	}
	e.attempt = ws.attempts + 1
	if due, ok := o.waitDue[e.msg.pos]; ok {
		delete(o.waitDue, e.msg.pos)
		if time.Now().Before(due) {
			o.w.wait(e, due)
		}
	}
}

// reasonEnded is the reason of a message moved to its dead-letter topic
// before it went out again: its attempts were all counted, and the
// outcome of the last one was not recorded (its owner ended, or lost the
// row, while the message was out or before its dead-letter move
// committed).
const reasonEnded = "the last attempt ended without its outcome recorded (the Subscriber ended or lost the row while the message was out, or before its dead-letter move committed)"

// beforeHandOut applies the policy to e before it goes out: a message
// handed out MaxAttempts times already (each time its owner ended while
// it was out) moves to the dead-letter topic at once (moved: the caller
// looks for the next message); a retry has its attempt counted first.
//
// A message after the row's hand-out mark moves the mark to the last
// message read first (one write per read, not per message): from then on
// a crash counts the hand-outs of every message read.
func (o *ownership) beforeHandOut(e *windowEntry) (res outcome, moved bool) {
	c := o.c
	if c.failurePolicy.exhausted(e.attempt-1) && !e.guessed {
		if !e.sent {
			c.budget.giveBack(&c.lease, e.msg.size)
		}
		return o.deadLetter(e, e.attempt-1, reasonEnded), true
	}
	if !o.marked || positionLess(o.handedOut, e.msg.pos) {
		if res := o.markHandedOut(); res != proceed {
			return res, false
		}
	}
	if res := o.countAttempt(e); res != proceed {
		return res, false
	}
	e.guessed = false // its attempt is written now
	return proceed, false
}

// markHandedOut moves the row's hand-out mark to the last message read.
func (o *ownership) markHandedOut() outcome {
	c, mark := o.c, o.after
	res := c.fencedWrite(o.g, o.cl, "Cannot mark the messages handed out, retrying", func(ctx context.Context) error {
		return c.failures.markHandedOut(ctx, o.cl, mark)
	})
	if res == proceed {
		o.handedOut, o.marked = mark, true
	}
	return res
}

// countAttempt writes e's attempt into its row before e goes out, when it
// is a retry (the attempt after a failure, or a message that an earlier
// claim handed out): a crash while it is out counts it.
func (o *ownership) countAttempt(e *windowEntry) outcome {
	ws := o.waiting[e.msg.pos]
	if e.attempt < 2 || ws != nil && ws.attempts >= e.attempt {
		return proceed
	}
	p := o.waitingParams(e)
	p.Attempts = int32(e.attempt)
	began := time.Now()
	if res := o.recordWaiting(p); res != proceed {
		return res
	}
	o.countTook(time.Since(began))
	if ws == nil {
		ws = &waitingState{}
		o.waiting[e.msg.pos] = ws
	}
	ws.attempts = e.attempt
	return proceed
}

// failed handles the Nack of e (out as attempt e.attempt, msg its
// delivery, nacked at nackedAt) under the policy: after the last attempt
// the message moves to the dead-letter topic (then it counts as
// acknowledged); otherwise the failure and the next attempt's time are
// written and it waits.
//
// The backoff counts from the Nack: the time the Nack waited for the
// delivery loop, and the write's time up to the server's now(), are
// taken out of the delay written. The message waits in the window until
// the row's next attempt's time less the time the count of its attempt
// is expected to take (countLead), so that it goes out at that time, not
// a write later.
func (o *ownership) failed(e *windowEntry, msg *message.Message, nackedAt time.Time) outcome {
	c, pol := o.c, o.c.failurePolicy
	pol.at(FailureStepNacked, e)
	reason := reasonOf(msg)
	if pol.exhausted(e.attempt) {
		return o.deadLetter(e, e.attempt, reason)
	}
	p := o.waitingParams(e)
	delay := pol.backoff(e.attempt)
	if !nackedAt.IsZero() {
		delay = max(delay-time.Since(nackedAt), 0)
	}
	p.Attempts, p.Failed, p.Delay, p.Reason = int32(e.attempt), true, delay, reason
	var row pgsql.WaitingRow
	res := c.fencedWrite(o.g, o.cl, "Cannot record the failure of a message, retrying", func(ctx context.Context) (err error) {
		row, err = c.failures.recordWaiting(ctx, o.cl, p)
		return err
	})
	if res != proceed {
		return res
	}
	o.drop = o.drop[:0]
	c.stats.retried.Add(1)
	ws := o.waiting[e.msg.pos]
	if ws == nil {
		ws = &waitingState{}
		o.waiting[e.msg.pos] = ws
	}
	ws.attempts = e.attempt
	o.w.nack(e, time.Now().Add(row.DueIn-o.countLead(row.DueIn)))
	pol.at(FailureStepRecorded, e)
	return proceed
}

// deadLetter moves e, whose last attempt failed, to the dead-letter topic
// in the transaction that records it acknowledged in its row, fenced by
// the claim's session and epoch; then it is acknowledged in the window.
func (o *ownership) deadLetter(e *windowEntry, attempts int, reason string) outcome {
	c := o.c
	p := o.waitingParams(e)
	p.Attempts, p.Reason = int32(attempts), reason
	m := e.msg
	copyOf := func(r pgsql.WaitingRow) pgsql.InsertMessagesParams {
		return c.deadLetterCopy(o.cl, m, r, reason)
	}
	recorded := false
	res := c.fencedWrite(o.g, o.cl, "Cannot move a message to its dead-letter topic, retrying", func(ctx context.Context) error {
		_, err := c.failures.deadLetter(ctx, o.cl, p, copyOf)
		if errors.Is(err, pgsql.ErrRecorded) {
			recorded, err = true, nil
		}
		return err
	})
	if res != proceed {
		return res
	}
	delete(o.waiting, m.pos)
	if recorded {
		// Acknowledged in a transaction that committed (AckInTx), though
		// its handler nacked it: its effects are there, it is not moved.
		c.logger.Info("Message not moved to its dead-letter topic: it was acknowledged in a transaction", watermill.LogFields{
			"partition": c.partition, "uuid": m.uuid, "attempts": attempts})
		return o.acked(e)
	}
	o.drop = o.drop[:0]
	c.stats.deadLettered.Add(1)
	c.logger.Info("Message moved to its dead-letter topic after its last attempt", watermill.LogFields{
		"partition": c.partition, "uuid": m.uuid, "attempts": attempts,
		"position":          strconv.FormatUint(m.pos.TransactionID, 10) + ":" + strconv.FormatInt(m.pos.Offset, 10),
		"dead_letter_topic": c.failurePolicy.DeadLetterTopic, "reason": reason})
	return o.acked(e)
}

// acknowledgedWaiting notes that e, acknowledged, had an entry: it is
// dropped at the next write.
func (o *ownership) acknowledgedWaiting(e *windowEntry) {
	if _, ok := o.waiting[e.msg.pos]; ok {
		delete(o.waiting, e.msg.pos)
		o.drop = append(o.drop, e.msg.pos)
	}
}

// countLeadMax bounds how early a retry starts the count of its attempt
// before its time: at most this, and at most a tenth of its wait.
const countLeadMax = 50 * time.Millisecond

// countLead is how long before its time a retry that waits wait starts
// the count of its attempt: the time the last counts took (a moving
// average), within countLeadMax and a tenth of wait.
func (o *ownership) countLead(wait time.Duration) time.Duration {
	return min(o.countAvg, countLeadMax, wait/10)
}

// countTook adds the time a count of an attempt took to the moving
// average countLead uses.
func (o *ownership) countTook(d time.Duration) {
	if o.countAvg == 0 {
		o.countAvg = d
		return
	}
	o.countAvg += (d - o.countAvg) / 4
}

func (o *ownership) recordWaiting(p pgsql.WaitingParams) outcome {
	c := o.c
	res := c.fencedWrite(o.g, o.cl, "Cannot count a delivery attempt, retrying", func(ctx context.Context) error {
		_, err := c.failures.recordWaiting(ctx, o.cl, p)
		return err
	})
	if res == proceed {
		o.drop = o.drop[:0]
	}
	return res
}

// waitingParams are the parameters of a write of e's entry, with the
// entries to drop.
func (o *ownership) waitingParams(e *windowEntry) pgsql.WaitingParams {
	return pgsql.WaitingParams{OffsetParams: o.cl.params(e.msg.pos), Drop: positionsOf(o.drop)}
}

func positionsOf(ps []Position) []pgsql.Position {
	out := make([]pgsql.Position, len(ps))
	for i, p := range ps {
		out[i] = pgsql.Position(p)
	}
	return out
}

// deadLetterCopy is the insert of m's copy into the dead-letter topic:
// its UUID, payload and metadata, and the metadata that says where it
// comes from and how it failed (r: its entry at the move). It keeps its
// partition key, so that a topic of several partitions keeps its order
// per key.
func (c *consumer) deadLetterCopy(cl *claim, m storedMessage, r pgsql.WaitingRow, reason string) pgsql.InsertMessagesParams {
	md, _ := decodeMetadata([]byte(m.metadata)) // decoded already when it went out
	if md == nil {
		md = map[string]string{}
	}
	delete(md, DeliveryAttemptMetadata)
	md[DeadLetterSourceTopicMetadata] = c.topic
	md[DeadLetterSourcePartitionMetadata] = strconv.Itoa(int(c.partition))
	md[DeadLetterSourcePositionMetadata] = pgsql.AboveEntry(pgsql.Position(m.pos))
	md[DeadLetterGroupMetadata] = cl.group
	md[DeadLetterAttemptsMetadata] = strconv.Itoa(int(r.Attempts))
	md[DeadLetterFirstFailureMetadata] = r.FirstFailure.UTC().Format(time.RFC3339Nano)
	md[DeadLetterLastFailureMetadata] = r.LastFailure.UTC().Format(time.RFC3339Nano)
	if reason != "" {
		md[DeadLetterReasonMetadata] = reason
	} else {
		delete(md, DeadLetterReasonMetadata)
	}
	raw, _ := json.Marshal(md) // a map of strings
	p := pgsql.InsertMessagesParams{Topics: []string{c.failurePolicy.DeadLetterTopic}, UUIDs: []string{m.uuid},
		Payloads: [][]byte{m.payload}, Metadata: []string{string(raw)}}
	if key, ok := md[PartitionKeyMetadata]; ok {
		p.PartitionHashes = []uint32{KeyHash(key)}
	}
	return p
}

// loadWaiting reads cl's waiting entries (see pgsql.Driver.LoadWaiting).
func (s offsetStore) loadWaiting(ctx context.Context, cl *claim) ([]pgsql.WaitingRow, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the waiting messages of topic %q: %w", cl.topic, err)
	}
	defer conn.Release()
	rows, err := s.driver.LoadWaiting(ctx, conn, cl.params(cl.committed))
	if err != nil {
		return nil, fmt.Errorf("read the waiting messages of topic %q: %w", cl.topic, check.MissingSchema(err))
	}
	return rows, nil
}

// loadHandedOut reads cl's hand-out mark (see pgsql.Driver.LoadHandedOut).
func (s offsetStore) loadHandedOut(ctx context.Context, cl *claim) (Position, bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Position{}, false, fmt.Errorf("read the hand-out mark of topic %q: %w", cl.topic, err)
	}
	defer conn.Release()
	mark, ok, err := s.driver.LoadHandedOut(ctx, conn, cl.params(cl.committed))
	if err != nil {
		return Position{}, false, fmt.Errorf("read the hand-out mark of topic %q: %w", cl.topic, check.MissingSchema(err))
	}
	return Position(mark), ok, nil
}

// markHandedOut writes cl's hand-out mark at pos (see
// pgsql.Driver.MarkHandedOut).
func (s offsetStore) markHandedOut(ctx context.Context, cl *claim, pos Position) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("mark the messages handed out of topic %q: %w", cl.topic, err)
	}
	defer conn.Release()
	return s.fenced(cl, "mark the messages handed out of topic", s.driver.MarkHandedOut(ctx, conn, cl.params(pos)))
}

// recordWaiting writes a message's entry (see pgsql.Driver.RecordWaiting).
func (s offsetStore) recordWaiting(ctx context.Context, cl *claim, p pgsql.WaitingParams) (pgsql.WaitingRow, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return pgsql.WaitingRow{}, fmt.Errorf("record a failure in topic %q: %w", cl.topic, err)
	}
	defer conn.Release()
	r, err := s.driver.RecordWaiting(ctx, conn, p)
	return r, s.fenced(cl, "record a failure in topic", err)
}

// deadLetter moves a message to its dead-letter topic (see
// failureStore.deadLetter).
func (s offsetStore) deadLetter(ctx context.Context, cl *claim, p pgsql.WaitingParams,
	copyOf func(pgsql.WaitingRow) pgsql.InsertMessagesParams) (pgsql.WaitingRow, error) {
	const what = "move a message to its dead-letter topic from topic"
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return pgsql.WaitingRow{}, fmt.Errorf("%s %q: %w", what, cl.topic, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	r, err := s.driver.DeadLetterOffset(ctx, tx, p)
	if err != nil {
		return pgsql.WaitingRow{}, s.fenced(cl, what, err)
	}
	if hook := s.beforeDeadLetterCopy; hook != nil {
		hook()
	}
	cp := copyOf(r)
	cp.NotifyChannel = s.driver.Tables().NotifyChannel
	if err := s.driver.InsertMessages(ctx, tx, cp); err != nil {
		return pgsql.WaitingRow{}, fmt.Errorf("%s %q: %w", what, cl.topic, check.MissingSchema(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return pgsql.WaitingRow{}, fmt.Errorf("%s %q: %w", what, cl.topic, err)
	}
	return r, nil
}

// fenced turns the error of a fenced statement of the failure policy into
// the consumer's: ErrOwnershipLost for no row written, ErrDatabaseWentBack
// (the session dropped) for another history.
func (s offsetStore) fenced(cl *claim, what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		s.stats.fenced.Add(1)
		return ownershipLost(what, cl)
	default:
		return cl.wentBack(fmt.Errorf("%s %q: %w", what, cl.topic, check.MissingSchema(err)), what)
	}
}
