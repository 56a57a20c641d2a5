package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// payloadSize is the size of every message payload. The payload is JSON
// because watermill-sql's default PostgreSQL schema stores payloads in a
// json column.
const payloadSize = 64

var payload = func() []byte {
	head := `{"bench":"pglease vs watermill-sql","pad":"`
	p := head + strings.Repeat("x", payloadSize-len(head)-2) + `"}`
	if len(p) != payloadSize {
		panic("payload size")
	}
	return []byte(p)
}()

func newMessages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
	}
	return msgs
}

// direction tells which way a metric improves.
type direction int

const (
	higherIsBetter direction = iota
	lowerIsBetter
)

type targetKind int

const (
	noTarget       targetKind = iota
	ratioAtLeast              // pglease ÷ watermill-sql ≥ value
	ratioAtMost               // pglease ÷ watermill-sql ≤ value
	pgleaseAtMost             // pglease's own value ≤ value
	pgleaseAtLeast            // pglease's own value ≥ value
)

type target struct {
	kind  targetKind
	value float64
	text  string
}

// metric is one row of the results table.
type metric struct {
	key    string
	label  string // in the table
	short  string // in the chart
	unit   string
	better direction
	target target
	// pgleaseOnly: watermill-sql has no counterpart to measure.
	pgleaseOnly bool
}

// workload is one measurement; run returns a value for each of its metrics.
type workload struct {
	id      string
	metrics []metric
	run     func(ctx context.Context, e *env, h handle) (map[string]float64, error)
	// pgleaseOnly workloads run on pglease alone.
	pgleaseOnly bool
	// pgbouncer workloads also run on pglease through PgBouncer, when
	// -pgbouncer is set (pgbouncer.go).
	pgbouncer bool
	// peers workloads also run on the brokers of -peers (peers.go).
	peers bool
	// alone, when set, is the one backend the workload runs on (the
	// limits of the server, limits.go); its metrics are not in the table
	// of pglease and watermill-sql.
	alone backend
	// timeout bounds one run of the workload; 0: defaultRunTimeout.
	timeout time.Duration
}

// defaultRunTimeout bounds one run of a workload that sets no timeout.
const defaultRunTimeout = 10 * time.Minute

func (w workload) describe(vals map[string]float64) string {
	var parts []string
	for _, m := range w.metrics {
		if v, ok := vals[m.key]; ok {
			parts = append(parts, fmt.Sprintf("%s %s %s", m.key, formatValue(v), m.unit))
		}
	}
	return strings.Join(parts, ", ")
}

// workloads lists the workloads in the order they run. The idle workloads
// run last: watermill-sql creates and drops two tables per topic there, and
// the catalog clean-up that follows would slow down whatever ran next.
func workloads(cfg config) []workload {
	ws := []workload{
		{
			id: "publish-concurrent",
			metrics: []metric{{
				key:    "publish-concurrent",
				label:  fmt.Sprintf("publish: %d goroutines, 1 message per call", cfg.publishers),
				short:  fmt.Sprintf("publish, %d goroutines × 1 message", cfg.publishers),
				unit:   "msg/s",
				better: higherIsBetter,
				target: target{kind: ratioAtLeast, value: 5, text: "≥ 5×"},
			}},
			run:       runPublishConcurrent,
			pgbouncer: true,
			peers:     true,
		},
		{
			id: "publish-batch",
			metrics: []metric{{
				key:    "publish-batch",
				label:  fmt.Sprintf("publish: batches of %d per call, 1 goroutine", cfg.batchSize),
				short:  fmt.Sprintf("publish, batches of %d", cfg.batchSize),
				unit:   "msg/s",
				better: higherIsBetter,
				target: target{kind: ratioAtLeast, value: 2, text: "≥ 2×"},
			}},
			run:       runPublishBatch,
			pgbouncer: true,
			peers:     true,
		},
		{
			id: "drain",
			metrics: []metric{{
				key:    "drain",
				label:  fmt.Sprintf("consume: drain a %s-message backlog, 1 subscriber", thousands(cfg.backlog)),
				short:  fmt.Sprintf("drain %s messages", thousands(cfg.backlog)),
				unit:   "msg/s",
				better: higherIsBetter,
				target: target{kind: ratioAtLeast, value: 4, text: "≥ 4×"},
			}},
			run:       runDrain,
			pgbouncer: true,
			peers:     true,
		},
		{
			id: "latency",
			metrics: []metric{
				{
					key:    "latency-p50",
					label:  fmt.Sprintf("latency p50: %d msg/s for %s, default configs", cfg.latencyRate, cfg.latencyFor),
					short:  "latency p50",
					unit:   "ms",
					better: lowerIsBetter,
				},
				{
					key:    "latency-p99",
					label:  fmt.Sprintf("latency p99: %d msg/s for %s, default configs", cfg.latencyRate, cfg.latencyFor),
					short:  "latency p99",
					unit:   "ms",
					better: lowerIsBetter,
					target: target{kind: pgleaseAtMost, value: 25, text: "pglease ≤ 25 ms"},
				},
			},
			run:   runLatency,
			peers: true,
		},
		{
			id: "router",
			metrics: []metric{{
				key:    "router",
				label:  fmt.Sprintf("Router: consume %s messages published beforehand", thousands(cfg.routerMessages)),
				short:  fmt.Sprintf("Router, %s messages", thousands(cfg.routerMessages)),
				unit:   "msg/s",
				better: higherIsBetter,
			}},
			run:   runRouter,
			peers: true,
		},
		{
			id: "idle",
			metrics: []metric{
				{
					key:    "idle-statements",
					label:  fmt.Sprintf("idle load: %s subscribed topics, statements/s (pg_stat_statements)", thousands(cfg.idleTopics)),
					short:  fmt.Sprintf("idle statements/s, %s topics", thousands(cfg.idleTopics)),
					unit:   "stmt/s",
					better: lowerIsBetter,
					target: target{kind: ratioAtMost, value: 1.0 / 50, text: "≤ 1/50"},
				},
				{
					key:    "idle-transactions",
					label:  fmt.Sprintf("idle load: %s subscribed topics, transactions/s (pg_stat_database; only without pg_stat_statements)", thousands(cfg.idleTopics)),
					short:  fmt.Sprintf("idle transactions/s, %s topics", thousands(cfg.idleTopics)),
					unit:   "xact/s",
					better: lowerIsBetter,
				},
			},
			run: runIdle,
		},
	}
	// The limits of the server (limits.go), the consumer-group workloads
	// (group.go), the partitioned group (partitions.go) and
	// the transactional handler (txhandler.go): the pglease-only ones
	// before the idle workloads, the idle group after them.
	idle := ws[len(ws)-1]
	ws = append(ws[:len(ws)-1], inflightWorkload(), limitsWorkload(cfg), balanceWorkload(), partitionsWorkload(), txHandlerWorkload(cfg), retentionWorkload(cfg), horizonWorkload(cfg))
	for _, n := range cfg.manyTopics {
		ws = append(ws, manyTopicsWorkload(n))
	}
	return append(ws, idle, groupIdleWorkload(cfg))
}

func workloadIDs(cfg config) []string {
	var ids []string
	for _, w := range workloads(cfg) {
		ids = append(ids, w.id)
	}
	return ids
}

func selectedWorkloads(cfg config) []workload {
	var out []workload
	for _, w := range workloads(cfg) {
		if len(cfg.only) == 0 || slices.Contains(cfg.only, w.id) {
			out = append(out, w)
		}
	}
	return out
}

// firstError keeps the first error reported by any goroutine.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// runPublishConcurrent: cfg.publishers goroutines, each publishing one
// message per call to one topic, for cfg.publishFor. Each goroutine
// publishes once before the clock starts, so that both pools have their
// connections open.
func runPublishConcurrent(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	const topic = "bench_publish_concurrent"
	if err := h.initTopic(ctx, topic); err != nil {
		return nil, err
	}
	pub, err := h.publisher()
	if err != nil {
		return nil, err
	}
	defer pub.Close()

	var (
		ready, done sync.WaitGroup
		start       = make(chan struct{})
		deadline    time.Time // written before start is closed
		count       atomic.Int64
		errs        firstError
	)
	for range e.cfg.publishers {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			err := pub.Publish(topic, newMessages(1)...)
			ready.Done()
			if err != nil {
				errs.set(err)
				return
			}
			<-start
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := pub.Publish(topic, newMessages(1)...); err != nil {
					errs.set(err)
					return
				}
				count.Add(1)
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	deadline = t0.Add(e.cfg.publishFor)
	close(start)
	done.Wait()
	elapsed := time.Since(t0)
	if err := errs.get(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return map[string]float64{"publish-concurrent": float64(count.Load()) / elapsed.Seconds()}, nil
}

// runPublishBatch: one goroutine publishing cfg.batchSize messages per call
// for cfg.publishFor.
func runPublishBatch(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	const topic = "bench_publish_batch"
	if err := h.initTopic(ctx, topic); err != nil {
		return nil, err
	}
	pub, err := h.publisher()
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	if err := pub.Publish(topic, newMessages(e.cfg.batchSize)...); err != nil {
		return nil, err
	}
	count := 0
	t0 := time.Now()
	for time.Since(t0) < e.cfg.publishFor {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := pub.Publish(topic, newMessages(e.cfg.batchSize)...); err != nil {
			return nil, err
		}
		count += e.cfg.batchSize
	}
	return map[string]float64{"publish-batch": float64(count) / time.Since(t0).Seconds()}, nil
}

// prefill publishes n messages to topic the fastest way the Publisher API
// allows: 1,000 per call from 4 goroutines.
func prefill(ctx context.Context, h handle, topic string, n int) error {
	const chunk, workers = 1000, 4
	pub, err := h.publisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	calls := (n + chunk - 1) / chunk
	return parallel(ctx, workers, calls, func(i int) error {
		if err := pub.Publish(topic, newMessages(min(chunk, n-i*chunk))...); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		return nil
	})
}

// runDrain: a backlog of cfg.backlog messages, then one subscriber with
// the default configuration that acks each message. Timed from Subscribe
// to the Ack of the last message.
func runDrain(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	const topic = "bench_drain"
	if err := h.initTopic(ctx, topic); err != nil {
		return nil, err
	}
	if err := prefill(ctx, h, topic, e.cfg.backlog); err != nil {
		return nil, err
	}
	_, _ = e.admin.Exec(ctx, "CHECKPOINT")
	sub, err := h.subscriber()
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	seen := make(map[string]struct{}, e.cfg.backlog)
	dups := 0
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()

	t0 := time.Now()
	ch, err := sub.Subscribe(sctx, topic)
	if err != nil {
		return nil, err
	}
	for len(seen) < e.cfg.backlog {
		select {
		case msg, ok := <-ch:
			if !ok {
				return nil, fmt.Errorf("subscription closed after %d of %d messages", len(seen), e.cfg.backlog)
			}
			if _, dup := seen[msg.UUID]; dup {
				dups++
			}
			seen[msg.UUID] = struct{}{}
			msg.Ack()
		case <-timeout.C:
			return nil, fmt.Errorf("drained %d of %d messages in 5m", len(seen), e.cfg.backlog)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	elapsed := time.Since(t0)
	if dups > 0 {
		e.log("drain: %d messages were delivered more than once", dups)
	}
	return map[string]float64{"drain": float64(e.cfg.backlog) / elapsed.Seconds()}, nil
}

// runLatency: cfg.latencyRate messages per second for cfg.latencyFor, one
// per Publish call, to a subscriber with the default configuration.
// Latency runs from just before Publish to the handler receiving the
// message (monotonic clock, one process).
func runLatency(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	const topic = "bench_latency"
	if err := h.initTopic(ctx, topic); err != nil {
		return nil, err
	}
	pub, err := h.publisher()
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	sub, err := h.subscriber()
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(sctx, topic)
	if err != nil {
		return nil, err
	}

	total := int(float64(e.cfg.latencyRate) * e.cfg.latencyFor.Seconds())
	lat := newLatencyLog(total)
	anyIn := make(chan struct{}, 1)
	go func() {
		for msg := range ch {
			lat.arrived(msg.UUID)
			msg.Ack()
			select {
			case anyIn <- struct{}{}:
			default:
			}
		}
	}()

	// Warm up: publish until the subscriber is delivering, then give what
	// the warm-up left behind time to drain.
	warmUntil := time.Now().Add(30 * time.Second)
warmUp:
	for {
		if err := pub.Publish(topic, newMessages(1)...); err != nil {
			return nil, err
		}
		select {
		case <-anyIn:
			break warmUp
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if time.Now().After(warmUntil) {
			return nil, errors.New("the subscriber delivered nothing within 30s")
		}
	}
	if !sleepCtx(ctx, 1500*time.Millisecond) {
		return nil, ctx.Err()
	}

	t0 := time.Now()
	calls := make([]time.Duration, 0, total)
	err = paced(ctx, e.cfg.latencyRate, total, func(int) error {
		msg := message.NewMessage(watermill.NewUUID(), payload)
		lat.sent(msg.UUID)
		start := time.Now()
		err := pub.Publish(topic, msg)
		calls = append(calls, time.Since(start))
		return err
	})
	if err != nil {
		return nil, err
	}
	sent := time.Since(t0)
	if slip := sent - e.cfg.latencyFor; slip > e.cfg.latencyFor/10 {
		e.log("latency: publishing %d messages took %s instead of %s (Publish was slower than the rate)", total, sent.Round(time.Millisecond), e.cfg.latencyFor)
	}
	select {
	case <-lat.allIn:
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("received %d of %d messages within 30s of the last Publish", lat.arrivals(), total)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	e.log("latency: %d messages: p50 %s, p90 %s, p99 %s, p99.9 %s, max %s", total,
		fmtDur(lat.percentile(0.50)), fmtDur(lat.percentile(0.90)), fmtDur(lat.percentile(0.99)),
		fmtDur(lat.percentile(0.999)), fmtDur(lat.percentile(1)))
	e.log("latency: the Publish calls themselves: p50 %s, p99 %s", fmtDur(percentile(calls, 0.50)), fmtDur(percentile(calls, 0.99)))
	return map[string]float64{
		"latency-p50": ms(lat.percentile(0.50)),
		"latency-p99": ms(lat.percentile(0.99)),
	}, nil
}

// runIdle: one subscriber with the default configuration subscribed to
// cfg.idleTopics topics that get no messages. Once the load has settled,
// the statements (pg_stat_statements calls) that the server ran in this
// database during cfg.idleFor, per second; without pg_stat_statements, the
// transactions (pg_stat_database xact_commit + xact_rollback) instead.
func runIdle(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	topics := make([]string, e.cfg.idleTopics)
	for i := range topics {
		topics[i] = fmt.Sprintf("bench_idle_%05d", i)
	}
	// Tables first (one per topic for watermill-sql), so that creating them
	// does not compete with the polling of the topics subscribed first.
	t0 := time.Now()
	err := parallel(ctx, 4, len(topics), func(i int) error { return h.initTopic(ctx, topics[i]) })
	if err != nil {
		return nil, err
	}
	e.log("idle: tables of %d topics ready in %s", len(topics), time.Since(t0).Round(time.Millisecond))

	sub, err := h.subscriber()
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 = time.Now()
	err = parallel(ctx, 32, len(topics), func(i int) error {
		ch, err := sub.Subscribe(sctx, topics[i])
		if err != nil {
			return fmt.Errorf("subscribe to %s: %w", topics[i], err)
		}
		go func() {
			for msg := range ch {
				msg.Ack()
			}
		}()
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.log("idle: subscribed to %d topics in %s", len(topics), time.Since(t0).Round(time.Millisecond))
	if e.stats && e.database != "" {
		// Only the statements still running get entries again.
		_, err := e.admin.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
		if err != nil {
			e.log("idle: cannot reset pg_stat_statements for this database: %v", err)
		}
	}
	if err := settle(ctx, e); err != nil {
		return nil, err
	}

	before, err := takeLoad(ctx, e)
	if err != nil {
		return nil, err
	}
	if !sleepCtx(ctx, e.cfg.idleFor) {
		return nil, ctx.Err()
	}
	after, err := takeLoad(ctx, e)
	if err != nil {
		return nil, err
	}
	secs := after.at.Sub(before.at).Seconds()
	vals := map[string]float64{}
	if !e.stats {
		vals["idle-transactions"] = float64(after.transactions-before.transactions) / secs
	} else {
		if after.deallocs != before.deallocs {
			e.log("idle: pg_stat_statements evicted entries during the window; the statement count may be low (raise pg_stat_statements.max)")
		}
		vals["idle-statements"] = float64(after.statements.calls()-before.statements.calls()) / secs
		if e.cfg.statements {
			printTopStatements(os.Stderr, "idle window only", before.statements, after.statements, 8)
		}
	}
	return vals, nil
}

// settle waits at least cfg.idleSettle, then until the server's rate of
// statements (or transactions, without pg_stat_statements) over one second
// is close to that of the second before: subscriptions set themselves up
// asynchronously (pglease claims its topics after Subscribe returns), and
// the window must see only the steady state. It gives up waiting after a
// minute and says so.
func settle(ctx context.Context, e *env) error {
	t0 := time.Now()
	if !sleepCtx(ctx, e.cfg.idleSettle) {
		return ctx.Err()
	}
	count := func(l load) float64 {
		if e.stats {
			return float64(l.statements.calls())
		}
		return float64(l.transactions)
	}
	prev, err := takeLoad(ctx, e)
	if err != nil {
		return err
	}
	prevRate := -1.0
	for time.Since(t0) < time.Minute {
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
		cur, err := takeLoad(ctx, e)
		if err != nil {
			return err
		}
		rate := (count(cur) - count(prev)) / cur.at.Sub(prev.at).Seconds()
		if prevRate >= 0 && math.Abs(rate-prevRate) <= math.Max(0.2*prevRate, 5) {
			e.log("steady after %s (%.0f, then %.0f per second)", time.Since(t0).Round(time.Millisecond), prevRate, rate)
			return nil
		}
		prev, prevRate = cur, rate
	}
	e.log("the load did not settle within a minute; measuring anyway")
	return nil
}

// parallel runs fn(0..n-1) on the given number of goroutines and returns
// the first error; after an error no new call starts.
func parallel(ctx context.Context, workers, n int, fn func(i int) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs firstError
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && errs.get() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					errs.set(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errs.get(); err != nil {
		return err
	}
	return ctx.Err()
}

// runRouter: like Watermill's own Router benchmark: cfg.routerMessages
// messages are published beforehand, then a Router with one handler (an
// AddConsumerHandler that does nothing) consumes them. Timed from Run to
// the last message handled.
func runRouter(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	const topic = "bench_router"
	if err := h.initTopic(ctx, topic); err != nil {
		return nil, err
	}
	n := e.cfg.routerMessages
	if err := prefill(ctx, h, topic, n); err != nil {
		return nil, err
	}
	_, _ = e.admin.Exec(ctx, "CHECKPOINT")
	sub, err := h.subscriber()
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	var (
		count atomic.Int64
		end   time.Time // written before done is closed
		done  = make(chan struct{})
	)
	router.AddConsumerHandler("bench", topic, sub, func(*message.Message) error {
		if count.Add(1) == int64(n) {
			end = time.Now()
			close(done)
		}
		return nil
	})
	var timedOut atomic.Bool
	go func() {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			timedOut.Store(true)
		case <-ctx.Done():
		}
		_ = router.Close()
	}()
	t0 := time.Now()
	if err := router.Run(ctx); err != nil {
		return nil, err
	}
	select {
	case <-done:
	default:
		if timedOut.Load() {
			return nil, fmt.Errorf("the Router handled %d of %d messages in 5m", count.Load(), n)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("the Router stopped after %d of %d messages", count.Load(), n)
	}
	return map[string]float64{"router": float64(n) / end.Sub(t0).Seconds()}, nil
}

// percentile returns the nearest-rank p-quantile of ds (0 < p ≤ 1).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtDur(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }

// sleepCtx sleeps for d, or less when ctx ends; it reports whether it slept
// the whole time.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
