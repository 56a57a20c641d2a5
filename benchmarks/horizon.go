package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// The held-horizon workload: a read-only REPEATABLE
// READ transaction held open, what pg_dump or a long report does, does not
// delay delivery, but it stops vacuum: every version of a row that a
// heartbeat or an offset commit leaves behind stays until the transaction
// ends. Does consuming slow down as they pile up?
//
// cfg.horizonMembers Subscribers of one consumer group (default
// configuration, a pool of their own each) share horizonTopics topics.
// Publishers publish cfg.horizonRate messages per second in all, one per
// Publish call, round robin over the topics, on a fixed schedule. Once
// every topic has delivered, a connection opens the transaction and reads
// the offsets table (so that it holds a snapshot, and with it the vacuum
// horizon), and keeps it open while the load runs for cfg.horizonFor.
// Consume throughput is counted over the first and the last
// cfg.horizonWindow of that time (messages acked), with the latency from
// Publish to delivery; the sizes of the offsets and sessions tables
// (pg_total_relation_size: heap, indexes, TOAST) and their update counts
// (pg_stat_user_tables, HOT and not) are read when the transaction has
// just been opened and at the end.

const (
	// horizonTopics is the number of topics of the workload.
	horizonTopics = 100
	// horizonTopicFormat names them.
	horizonTopicFormat = "bench_horizon_%03d"
	// horizonPublishers publish the schedule between them: enough that
	// the schedule holds while a Publish call takes up to 30 ms.
	horizonPublishers = 32
	// horizonSetupTimeout bounds the set-up: the group's split and the
	// first delivery on every topic.
	horizonSetupTimeout = time.Minute
	// horizonTailTimeout bounds the wait for the messages published in
	// the window to be acked after it.
	horizonTailTimeout = time.Minute
	// sentAtKey is the metadata of a message's publish time (Unix
	// nanoseconds).
	sentAtKey = "bench_sent_at"
	kib       = 1 << 10
)

func horizonWorkload(cfg config) workload {
	prefix := fmt.Sprintf("held horizon: %d msg/s on %d topics, %s, %d Subscribers of a group",
		cfg.horizonRate, horizonTopics, cfg.horizonFor, cfg.horizonMembers)
	if !cfg.horizonHold {
		prefix += " (control: no transaction held)"
	}
	pg := func(m metric) metric { m.pgleaseOnly = true; return m }
	first, last := "the first "+cfg.horizonWindow.String(), "the last "+cfg.horizonWindow.String()
	return workload{
		id:          "held-horizon",
		pgleaseOnly: true,
		// The load runs for cfg.horizonFor, with its set-up and tail.
		timeout: cfg.horizonFor + horizonSetupTimeout + horizonTailTimeout + time.Minute,
		metrics: []metric{
			pg(metric{key: "horizon-start", label: prefix + ": consumed (acked) in " + first,
				short: "held horizon, consumed at the start", unit: "msg/s", better: higherIsBetter}),
			pg(metric{key: "horizon-end", label: prefix + ": consumed (acked) in " + last,
				short: "held horizon, consumed at the end", unit: "msg/s", better: higherIsBetter}),
			pg(metric{key: "horizon-ratio", label: "held horizon: consumed at the end ÷ at the start (same run)",
				short: "held horizon, end ÷ start", unit: "×", better: higherIsBetter,
				target: target{kind: pgleaseAtLeast, value: 0.8, text: "pglease ≥ 0.8"}}),
			pg(metric{key: "horizon-p99-start", label: "held horizon: latency p99 (Publish to delivery) in " + first,
				short: "held horizon, latency p99 at the start", unit: "ms", better: lowerIsBetter}),
			pg(metric{key: "horizon-p99-end", label: "held horizon: latency p99 (Publish to delivery) in " + last,
				short: "held horizon, latency p99 at the end", unit: "ms", better: lowerIsBetter}),
			pg(metric{key: "horizon-offsets-start", label: "held horizon: offsets table on disk when the transaction was opened",
				short: "held horizon, offsets table at the start", unit: "KiB", better: lowerIsBetter}),
			pg(metric{key: "horizon-offsets-end", label: "held horizon: offsets table on disk at the end",
				short: "held horizon, offsets table at the end", unit: "KiB", better: lowerIsBetter}),
			pg(metric{key: "horizon-sessions-start", label: "held horizon: sessions table on disk when the transaction was opened",
				short: "held horizon, sessions table at the start", unit: "KiB", better: lowerIsBetter}),
			pg(metric{key: "horizon-sessions-end", label: "held horizon: sessions table on disk at the end",
				short: "held horizon, sessions table at the end", unit: "KiB", better: lowerIsBetter}),
			pg(metric{key: "horizon-offsets-hot", label: "held horizon: offsets updates that were HOT (pg_stat_user_tables)",
				short: "held horizon, HOT offsets updates", unit: "%", better: higherIsBetter}),
			pg(metric{key: "horizon-sessions-hot", label: "held horizon: sessions updates that were HOT (pg_stat_user_tables)",
				short: "held horizon, HOT sessions updates", unit: "%", better: higherIsBetter}),
			pg(metric{key: "horizon-lag", label: "held horizon: messages published but not yet acked at the end",
				short: "held horizon, lag at the end", unit: "msg", better: lowerIsBetter}),
		},
		run: func(ctx context.Context, e *env, h handle) (map[string]float64, error) {
			return runHeldHorizon(ctx, e, h.(*pgleaseHandle))
		},
	}
}

// checkHorizonFlags validates the held-horizon workload's flags.
func checkHorizonFlags(c config) error {
	switch {
	case c.horizonFor <= 0 || c.horizonWindow <= 0:
		return errors.New("-horizon-for and -horizon-window must be positive")
	case 2*c.horizonWindow > c.horizonFor:
		return errors.New("-horizon-window must be at most half of -horizon-for")
	case c.horizonRate < 1 || c.horizonMembers < 1:
		return errors.New("-horizon-rate and -horizon-members must be at least 1")
	}
	return nil
}

// tableReading is what the workload reads of a table.
type tableReading struct {
	bytes, updates, hot int64
}

// readTables reads the size and update counts of the schema's offsets and
// sessions tables. The counts reach pg_stat_user_tables when the backends
// that made them report (within a second or so of their last statement).
func readTables(ctx context.Context, e *env, ns string) (offsets, sessions tableReading, err error) {
	rows, err := e.admin.Query(ctx, `SELECT relname::text, pg_total_relation_size(relid), n_tup_upd, n_tup_hot_upd
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname IN ($2, $3)`,
		ns, pglease.DefaultConsumerOffsetsTable, pglease.DefaultConsumerSessionsTable)
	if err != nil {
		return offsets, sessions, fmt.Errorf("read table statistics: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var r tableReading
		if err := rows.Scan(&name, &r.bytes, &r.updates, &r.hot); err != nil {
			return offsets, sessions, fmt.Errorf("read table statistics: %w", err)
		}
		if name == pglease.DefaultConsumerOffsetsTable {
			offsets = r
		} else {
			sessions = r
		}
	}
	return offsets, sessions, rows.Err()
}

// hotShare is the percentage of the updates between two readings that
// were HOT (0 without updates).
func hotShare(before, after tableReading) float64 {
	n := after.updates - before.updates
	if n <= 0 {
		return 0
	}
	return 100 * float64(after.hot-before.hot) / float64(n)
}

// windowCounter counts the deliveries that fall into the first and the
// last window of a run, and their latencies.
type windowCounter struct {
	mu         sync.Mutex
	start, end time.Time // of the run; zero until the run starts
	window     time.Duration
	counts     [2]int
	latencies  [2][]time.Duration
}

// open starts the run: the first window opens now.
func (w *windowCounter) open(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.start = time.Now()
	w.end = w.start.Add(d)
}

// add counts a delivery at now, published at sent.
func (w *windowCounter) add(now, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.start.IsZero() {
		return
	}
	i := -1
	switch {
	case !now.Before(w.start) && now.Before(w.start.Add(w.window)):
		i = 0
	case !now.Before(w.end.Add(-w.window)) && now.Before(w.end):
		i = 1
	}
	if i < 0 {
		return
	}
	w.counts[i]++
	if !sent.IsZero() {
		w.latencies[i] = append(w.latencies[i], now.Sub(sent))
	}
}

// rates returns the messages per second and the p99 latency of the two
// windows.
func (w *windowCounter) rates() (start, end float64, p99 [2]time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	secs := w.window.Seconds()
	for i := range p99 {
		p99[i] = percentile(w.latencies[i], 0.99)
	}
	return float64(w.counts[0]) / secs, float64(w.counts[1]) / secs, p99
}

func runHeldHorizon(ctx context.Context, e *env, h *pgleaseHandle) (map[string]float64, error) {
	cfg := e.cfg
	topics := topicNames(horizonTopicFormat, horizonTopics)
	if err := h.initTopic(ctx, topics[0]); err != nil { // the schema
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		acked     atomic.Int64
		published atomic.Int64
		seen      sync.Map // topic → struct{}: delivered at least once
		uuids     sync.Map // message UUID → struct{}: acked
		again     atomic.Int64
		subs      []*pglease.Subscriber
		counter   = &windowCounter{window: cfg.horizonWindow}
		members   groupMembers
		consumers sync.WaitGroup
	)
	defer func() {
		cancel()
		if err := members.close(); err != nil {
			e.log("held horizon: close: %v", err)
		}
		consumers.Wait()
	}()
	for range cfg.horizonMembers {
		sub, closeFn, err := h.member()
		if err != nil {
			return nil, err
		}
		members.closers = append(members.closers, closeFn)
		subs = append(subs, sub.(*pglease.Subscriber))
		err = parallel(ctx, 32, len(topics), func(i int) error {
			ch, err := sub.Subscribe(sctx, topics[i])
			if err != nil {
				return fmt.Errorf("subscribe to %s: %w", topics[i], err)
			}
			consumers.Add(1)
			go func() {
				defer consumers.Done()
				for msg := range ch {
					now := time.Now()
					var sent time.Time
					if ns, err := strconv.ParseInt(msg.Metadata.Get(sentAtKey), 10, 64); err == nil {
						sent = time.Unix(0, ns)
					}
					msg.Ack()
					if _, dup := uuids.LoadOrStore(msg.UUID, struct{}{}); dup {
						again.Add(1)
					}
					counter.add(now, sent)
					acked.Add(1)
					seen.Store(topics[i], struct{}{})
				}
			}()
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if _, err := waitSplit(ctx, e, h, fairSplit(cfg.horizonMembers, horizonTopics), horizonSetupTimeout); err != nil {
		return nil, err
	}

	pub, err := h.publisher()
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	// The schedule: message n is due at p0 + n/rate, to topic n mod the
	// number of topics; publisher k publishes the messages n ≡ k. A
	// publisher behind the schedule catches up at once.
	var (
		errs     firstError
		pubs     sync.WaitGroup
		stopPub  = make(chan struct{})
		p0       = time.Now()
		interval = time.Second / time.Duration(cfg.horizonRate)
	)
	for k := range horizonPublishers {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			for n := k; ; n += horizonPublishers {
				if d := time.Until(p0.Add(time.Duration(n) * interval)); d > 0 {
					select {
					case <-time.After(d):
					case <-stopPub:
						return
					case <-ctx.Done():
						return
					}
				}
				select {
				case <-stopPub:
					return
				default:
				}
				msg := message.NewMessage(watermill.NewUUID(), payload)
				msg.Metadata.Set(sentAtKey, strconv.FormatInt(time.Now().UnixNano(), 10))
				if err := pub.Publish(topics[n%len(topics)], msg); err != nil {
					errs.set(err)
					return
				}
				published.Add(1)
			}
		}()
	}
	stopPublishing := sync.OnceFunc(func() { close(stopPub); pubs.Wait() })
	defer stopPublishing()
	if err := waitFor(ctx, horizonSetupTimeout, "every topic to deliver", func() (bool, error) {
		n := 0
		seen.Range(func(any, any) bool { n++; return true })
		return n == len(topics), errs.get()
	}); err != nil {
		return nil, err
	}

	// The held transaction: it reads the offsets table, as pg_dump would,
	// so that it holds a snapshot from now on.
	held, err := holdHorizon(ctx, e, h)
	if err != nil {
		return nil, err
	}
	defer func() { _ = held.end() }()
	offsets0, sessions0, err := readTables(ctx, e, h.ns)
	if err != nil {
		return nil, err
	}
	counter.open(cfg.horizonFor)
	published0 := published.Load()
	e.log("held horizon: %s; offsets %s KiB, sessions %s KiB",
		held, formatValue(float64(offsets0.bytes)/kib), formatValue(float64(sessions0.bytes)/kib))

	// Progress: every minute, so that a long run shows how it goes.
	t0 := time.Now()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	lastAcked := acked.Load()
	lastAt := t0
	for deadline := t0.Add(cfg.horizonFor); time.Now().Before(deadline); {
		select {
		case <-tick.C:
			a, now := acked.Load(), time.Now()
			o, s, err := readTables(ctx, e, h.ns)
			if err != nil {
				return nil, err
			}
			e.log("held horizon: %s: %.0f msg/s acked over the last minute; offsets %s KiB, sessions %s KiB; %d not yet acked",
				now.Sub(t0).Round(time.Second), float64(a-lastAcked)/now.Sub(lastAt).Seconds(),
				formatValue(float64(o.bytes)/kib), formatValue(float64(s.bytes)/kib), published.Load()-(a-again.Load()))
			lastAcked, lastAt = a, now
		case <-time.After(time.Until(deadline)):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if err := errs.get(); err != nil {
			return nil, err
		}
	}
	lag := published.Load() - (acked.Load() - again.Load())
	offsets1, sessions1, err := readTables(ctx, e, h.ns)
	if err != nil {
		return nil, err
	}
	if err := held.end(); err != nil {
		return nil, err
	}
	stopPublishing()
	if err := errs.get(); err != nil {
		return nil, err
	}
	total := published.Load()
	tailErr := waitFor(ctx, horizonTailTimeout, "every message to be acked", func() (bool, error) {
		return acked.Load()-again.Load() >= total, nil
	})

	start, end, p99 := counter.rates()
	offered := float64(total-published0) / time.Since(t0).Seconds()
	e.log("held horizon: %.0f msg/s consumed at the start, %.0f at the end (%.2f×), %.0f published; latency p99 %s, then %s; offsets %s → %s KiB (%.0f%% of %s updates HOT), sessions %s → %s KiB (%.0f%% of %s HOT); %d not yet acked at the end",
		start, end, end/start, offered, fmtDur(p99[0]), fmtDur(p99[1]),
		formatValue(float64(offsets0.bytes)/kib), formatValue(float64(offsets1.bytes)/kib), hotShare(offsets0, offsets1), thousands(int(offsets1.updates-offsets0.updates)),
		formatValue(float64(sessions0.bytes)/kib), formatValue(float64(sessions1.bytes)/kib), hotShare(sessions0, sessions1), thousands(int(sessions1.updates-sessions0.updates)),
		lag)
	if tailErr != nil {
		e.log("held horizon: after the window: %v (%s of %s acked)", tailErr, thousands(int(acked.Load())), thousands(int(total)))
	}
	var st pglease.SubscriberStats
	for _, sub := range subs {
		s := sub.Stats()
		st.Claims += s.Claims
		st.Releases += s.Releases
		st.FencedWrites += s.FencedWrites
		st.SessionsLost += s.SessionsLost
	}
	e.log("held horizon: %d messages delivered again; the Subscribers claimed %d rows, released %d, had %d commits fenced and lost %d sessions",
		again.Load(), st.Claims, st.Releases, st.FencedWrites, st.SessionsLost)
	return map[string]float64{
		"horizon-start":          start,
		"horizon-end":            end,
		"horizon-ratio":          end / start,
		"horizon-p99-start":      ms(p99[0]),
		"horizon-p99-end":        ms(p99[1]),
		"horizon-offsets-start":  float64(offsets0.bytes) / kib,
		"horizon-offsets-end":    float64(offsets1.bytes) / kib,
		"horizon-sessions-start": float64(sessions0.bytes) / kib,
		"horizon-sessions-end":   float64(sessions1.bytes) / kib,
		"horizon-offsets-hot":    hotShare(offsets0, offsets1),
		"horizon-sessions-hot":   hotShare(sessions0, sessions1),
		"horizon-lag":            float64(lag),
	}, nil
}

// heldTx is the transaction that holds the vacuum horizon.
type heldTx struct {
	conn *pgxpool.Conn // nil: none (-horizon-hold=false)
	tx   pgx.Tx
	xmin string
	rows int
}

// holdHorizon opens the held transaction, unless -horizon-hold=false: a
// read-only REPEATABLE READ transaction that reads the offsets table, as
// pg_dump would, and so holds its snapshot, and with it the vacuum
// horizon, until end.
func holdHorizon(ctx context.Context, e *env, h *pgleaseHandle) (*heldTx, error) {
	if !e.cfg.horizonHold {
		return &heldTx{}, nil
	}
	conn, err := e.admin.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	held := &heldTx{conn: conn}
	if held.tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}); err != nil {
		conn.Release()
		return nil, err
	}
	var xmin *string
	err = held.tx.QueryRow(ctx, `SELECT count(*)::int, (SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid())
		FROM `+h.offsetsTable()).Scan(&held.rows, &xmin)
	if err == nil && xmin == nil {
		err = errors.New("it holds no snapshot")
	}
	if err != nil {
		_ = held.end()
		return nil, fmt.Errorf("open the held transaction: %w", err)
	}
	held.xmin = *xmin
	return held, nil
}

func (t *heldTx) String() string {
	if t.conn == nil {
		return "no transaction held (-horizon-hold=false)"
	}
	return fmt.Sprintf("transaction open (xmin %s, %d offset rows)", t.xmin, t.rows)
}

// end ends the transaction; it may be called again.
func (t *heldTx) end() error {
	if t.conn == nil {
		return nil
	}
	err := t.tx.Rollback(context.Background())
	t.conn.Release()
	t.conn = nil
	return err
}
