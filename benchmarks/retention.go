package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"
)

// The retention workload (per-topic retention): publishing and
// draining at full speed for minutes on a topic with a short retention
// keeps the messages table's size on disk bounded, and costs neither
// publish nor drain throughput more than 10 % next to the same run on a
// topic without retention.
//
// Each case runs in a schema of its own, created for it and dropped after
// it, so that its table holds nothing but its own messages: publishers
// (cfg.retentionPublishers goroutines, cfg.batchSize messages per Publish
// call) publish to one topic as fast as they can for cfg.retentionFor,
// while one Subscriber with the default configuration (the maintainer of
// its schema) drains it, acking each message. The publishers pause while
// more than cfg.retentionMaxLag messages are unacked: on a small machine
// the two compete for the same cores, and a drain left behind by more
// than the retention would have messages removed under it (skipped), so
// that the two cases would no longer do the same work; the pause keeps
// both cases at the rate the drain sustains. The total size on disk of
// the messages table (the partitioned parent and every partition, with
// indexes and TOAST) is sampled every few seconds. The two cases run one
// after the other in each round, in alternating order.

const (
	// retentionTopicName is the topic of both cases.
	retentionTopicName = "bench_retention"
	// retentionSetupTimeout bounds the set-up of a case: the maintainer's
	// election and first partitions, the warm-up's delivery.
	retentionSetupTimeout = 30 * time.Second
	// retentionTailTimeout bounds the wait after the window for the drain
	// to account for every message published (delivered, or skipped by
	// retention).
	retentionTailTimeout = 30 * time.Second
	// retentionBoundedMargin is how much the table may grow from the
	// first half of the window to the second for its size to count as
	// bounded (sizeGrowth). With a retention r, the table holds the
	// messages of about the last r plus a slot (plus the maintainer's lag)
	// and reaches that within seconds, well inside the first half; from
	// then on it moves only with the publish rate, which sizeGrowth
	// divides out. A table that keeps its messages grows with the time
	// that passed: about twice as large at the end as at the half (a
	// ratio of about 2), so 1.25 tells the two apart and leaves a quarter
	// for noise.
	retentionBoundedMargin = 1.25
	// retentionMaxFor is the longest -retention-for: both cases, with
	// their set-up and tail, must fit in runOne's 10-minute limit.
	retentionMaxFor = 4 * time.Minute
	// mib is a mebibyte.
	mib = 1 << 20
)

// retentionCase is one of the compared topics.
type retentionCase struct {
	name      string        // in metric keys and schema names
	retention time.Duration // 0: none
}

func retentionCases(ttl time.Duration) []retentionCase {
	return []retentionCase{{name: "ttl", retention: ttl}, {name: "none"}}
}

// retentionOrder is the order of the cases in the run-th run (from 1):
// the retention case first in odd runs, last in even ones.
func retentionOrder(ttl time.Duration, run int) []retentionCase {
	cases := retentionCases(ttl)
	if run%2 == 0 {
		cases[0], cases[1] = cases[1], cases[0]
	}
	return cases
}

func (c retentionCase) text() string {
	if c.retention == 0 {
		return "no retention"
	}
	return "retention " + c.retention.String()
}

func retentionKey(what, c string) string { return "retention-" + what + "-" + c }

func retentionWorkload(cfg config) workload {
	pace := "at full speed"
	if cfg.retentionMaxLag > 0 {
		pace = fmt.Sprintf("pausing while %s are unacked", thousands(cfg.retentionMaxLag))
	}
	prefix := fmt.Sprintf("%d publishers × batches of %d %s, 1 subscriber draining, %s", cfg.retentionPublishers, cfg.batchSize, pace, cfg.retentionFor)
	w := workload{id: "retention", pgleaseOnly: true}
	pg := func(m metric) metric { m.pgleaseOnly = true; return m }
	cases := retentionCases(cfg.retentionTTL)
	for _, c := range cases {
		w.metrics = append(w.metrics,
			pg(metric{key: retentionKey("publish", c.name), label: fmt.Sprintf("%s; %s: publish rate", prefix, c.text()),
				short: "publish, " + c.text(), unit: "msg/s", better: higherIsBetter}),
			pg(metric{key: retentionKey("drain", c.name), label: fmt.Sprintf("%s; %s: drain rate (acked in the window)", prefix, c.text()),
				short: "drain, " + c.text(), unit: "msg/s", better: higherIsBetter}))
	}
	w.metrics = append(w.metrics,
		pg(metric{key: "retention-publish-ratio", label: "publish rate with retention ÷ without (same round)",
			short: "publish, retention ÷ none", unit: "×", better: higherIsBetter,
			target: target{kind: pgleaseAtLeast, value: 0.9, text: "pglease ≥ 0.9"}}),
		pg(metric{key: "retention-drain-ratio", label: "drain rate with retention ÷ without (same round)",
			short: "drain, retention ÷ none", unit: "×", better: higherIsBetter,
			target: target{kind: pgleaseAtLeast, value: 0.9, text: "pglease ≥ 0.9"}}))
	for _, c := range cases {
		w.metrics = append(w.metrics,
			pg(metric{key: retentionKey("size-max", c.name), label: fmt.Sprintf("%s: messages table on disk, largest sample", c.text()),
				short: "table size max, " + c.text(), unit: "MiB", better: lowerIsBetter}),
			pg(metric{key: retentionKey("size-final", c.name), label: fmt.Sprintf("%s: messages table on disk at the end of the window", c.text()),
				short: "table size at the end, " + c.text(), unit: "MiB", better: lowerIsBetter}))
	}
	lookback := retentionLookback(cfg.retentionTTL, retentionSampleEvery(cfg.retentionFor))
	for _, c := range cases {
		m := metric{key: retentionKey("growth", c.name),
			label: fmt.Sprintf("%s: table size ÷ publish rate over the %s before, largest over the 2nd half of the window ÷ over the 1st (bounded: ≤ %.2f; a table that keeps every message gives ~2)",
				c.text(), lookback, retentionBoundedMargin),
			short: "table growth per publish rate, 2nd half ÷ 1st, " + c.text(), unit: "×", better: lowerIsBetter}
		if c.retention > 0 {
			m.target = target{kind: pgleaseAtMost, value: retentionBoundedMargin, text: fmt.Sprintf("pglease ≤ %.2f", retentionBoundedMargin)}
		}
		w.metrics = append(w.metrics, pg(m))
	}
	for _, c := range cases {
		w.metrics = append(w.metrics, pg(metric{key: retentionKey("raw-growth", c.name),
			label: fmt.Sprintf("%s: table size, largest over the 2nd half of the window ÷ over the 1st (moves with the publish rate)", c.text()),
			short: "table growth, 2nd half ÷ 1st, " + c.text(), unit: "×", better: lowerIsBetter}))
	}
	for _, c := range cases {
		w.metrics = append(w.metrics, pg(metric{key: retentionKey("lag", c.name),
			label: fmt.Sprintf("%s: messages published but not yet acked at the end of the window", c.text()),
			short: "drain lag, " + c.text(), unit: "msg", better: lowerIsBetter}))
	}
	w.metrics = append(w.metrics, pg(metric{key: "retention-skipped",
		label: fmt.Sprintf("%s: messages removed by retention before the drain acked them (Stats().RetentionSkipped)", cases[0].text()),
		short: "skipped by retention", unit: "msg", better: lowerIsBetter,
		target: target{kind: pgleaseAtMost, value: 0, text: "pglease = 0"}}))
	// w is copied by value, and every copy shares runs.
	runs := new(int)
	w.run = func(ctx context.Context, e *env, h handle) (map[string]float64, error) {
		*runs++
		return runRetention(ctx, e, h.(*pgleaseHandle), retentionOrder(e.cfg.retentionTTL, *runs))
	}
	return w
}

// checkRetentionFlags validates the retention workload's flags.
func checkRetentionFlags(c config) error {
	switch {
	case c.retentionFor <= 0 || c.retentionFor > retentionMaxFor:
		return fmt.Errorf("-retention-for must be positive and at most %s (both cases must fit in a run's 10 minutes)", retentionMaxFor)
	case c.retentionTTL < pglease.MinRetention || c.retentionTTL > pglease.MaxRetention:
		return fmt.Errorf("-retention must be between %s and %s", pglease.MinRetention, pglease.MaxRetention)
	case c.retentionPublishers < 1:
		return errors.New("-retention-publishers must be at least 1")
	case c.retentionMaxLag < 0:
		return errors.New("-retention-max-lag must not be negative")
	}
	return nil
}

// runRetention runs the cases in the given order and returns their
// values and the ratios between them.
func runRetention(ctx context.Context, e *env, h *pgleaseHandle, order []retentionCase) (map[string]float64, error) {
	vals := map[string]float64{}
	for _, c := range order {
		r, err := retentionRun(ctx, e, h, c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.text(), err)
		}
		vals[retentionKey("publish", c.name)] = r.publishRate()
		vals[retentionKey("drain", c.name)] = r.drainRate()
		vals[retentionKey("size-max", c.name)] = float64(maxSize(r.samples)) / mib
		vals[retentionKey("size-final", c.name)] = float64(r.samples[len(r.samples)-1].bytes) / mib
		vals[retentionKey("growth", c.name)] = sizeGrowth(r.samples, r.window, e.cfg.retentionTTL, r.every)
		vals[retentionKey("raw-growth", c.name)] = halvesGrowth(r.samples, r.window)
		vals[retentionKey("lag", c.name)] = float64(r.lag)
		if c.retention > 0 {
			vals["retention-skipped"] = float64(r.stats.RetentionSkipped)
		}
	}
	vals["retention-publish-ratio"] = vals[retentionKey("publish", "ttl")] / vals[retentionKey("publish", "none")]
	vals["retention-drain-ratio"] = vals[retentionKey("drain", "ttl")] / vals[retentionKey("drain", "none")]
	return vals, nil
}

// sizeSample is one reading of the messages table's size.
type sizeSample struct {
	at         time.Duration // since the window opened
	bytes      int64
	partitions int // attached partitions, the one kept forever included
	published  int64
	drained    int64
}

// retentionResult is what one case measured.
type retentionResult struct {
	window    time.Duration
	published int64         // in the window
	drained   int64         // acked in the window
	lag       int64         // published (warm-up included) but not acked at the window's end
	waited    time.Duration // per publisher, waiting for the drain (-retention-max-lag)
	samples   []sizeSample
	every     time.Duration           // between samples
	stats     pglease.SubscriberStats // after the tail
}

func (r retentionResult) publishRate() float64 { return float64(r.published) / r.window.Seconds() }
func (r retentionResult) drainRate() float64   { return float64(r.drained) / r.window.Seconds() }

// retentionSampleEvery is the interval between size samples: about 40 per
// window, at least a second and at most 5 s apart.
func retentionSampleEvery(window time.Duration) time.Duration {
	return min(max(window/40, time.Second), 5*time.Second)
}

func maxSize(samples []sizeSample) int64 {
	var m int64
	for _, s := range samples {
		m = max(m, s.bytes)
	}
	return m
}

// retentionLookback is the span over which sizeGrowth measures the
// publish rate that a sample's size is divided by: the longest a message
// of retention r can stay in the table without the maintainer's lag (r
// and a slot of at most r/4), and at least two sample intervals.
func retentionLookback(r time.Duration, every time.Duration) time.Duration {
	return max(r+r/4, 2*every)
}

// rateNormalized returns, for each sample but the first, its size divided
// by the publish rate (messages per second) over the span back to the
// earliest sample at most lookback before it: for a table that holds the
// messages of the last d seconds, about d times the bytes per message,
// whatever the rate. Samples with no messages published over their span
// are left out.
func rateNormalized(samples []sizeSample, lookback time.Duration) []sizeSample {
	var out []sizeSample
	for i, s := range samples {
		j := 0
		for j < i && samples[j].at < s.at-lookback {
			j++
		}
		if j == i {
			continue
		}
		n, d := s.published-samples[j].published, (s.at - samples[j].at).Seconds()
		if n <= 0 || d <= 0 {
			continue
		}
		out = append(out, sizeSample{at: s.at, bytes: int64(float64(s.bytes) / (float64(n) / d))})
	}
	return out
}

// sizeGrowth tells whether the table's size stayed bounded: the samples
// are first divided by the publish rate (rateNormalized, with
// retentionLookback), so that a change of rate is not taken for growth;
// then the largest over the second half of the window is divided by the
// largest over the first half (the samples at or before window/2). It is
// 0 when either half has no sample or the first half's largest is 0.
func sizeGrowth(samples []sizeSample, window, retention, every time.Duration) float64 {
	return halvesGrowth(rateNormalized(samples, retentionLookback(retention, every)), window)
}

// halvesGrowth is the largest value over the second half of the window
// divided by the largest over the first half (see sizeGrowth).
func halvesGrowth(samples []sizeSample, window time.Duration) float64 {
	var first, second int64
	var inFirst, inSecond bool
	for _, s := range samples {
		if s.at <= window/2 {
			first, inFirst = max(first, s.bytes), true
		} else {
			second, inSecond = max(second, s.bytes), true
		}
	}
	if !inFirst || !inSecond || first == 0 {
		return 0
	}
	return float64(second) / float64(first)
}

// retentionRun runs one case in a schema of its own (see the top of the
// file). After the window, it waits a while for the drain to account for
// every message published: delivered, or counted as skipped by retention.
func retentionRun(ctx context.Context, e *env, h *pgleaseHandle, c retentionCase) (retentionResult, error) {
	var r retentionResult
	schema := h.ns + "_" + c.name
	if err := dropSchema(ctx, e.admin, schema); err != nil {
		return r, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := dropSchema(dctx, e.admin, schema); err != nil {
			e.log("retention: drop schema %s: %v", schema, err)
		}
	}()
	tables := pglease.Tables{Schema: schema}
	if err := pglease.CreateTopic(ctx, h.pool, retentionTopicName, pglease.TopicConfig{
		Retention: c.retention, Tables: tables, InitializeSchema: true,
	}); err != nil {
		return r, err
	}
	messages := pgx.Identifier{schema, pglease.DefaultMessagesTable}.Sanitize()
	_, _ = e.admin.Exec(ctx, "CHECKPOINT")

	sub, err := pglease.NewSubscriber(h.pool, pglease.SubscriberConfig{ConsumerGroup: consumerGroup, Tables: tables}, e.logger)
	if err != nil {
		return r, err
	}
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(sctx, retentionTopicName)
	if err != nil {
		return r, err
	}
	var drained atomic.Int64
	drainDone := make(chan struct{})
	go func() {
		defer close(drainDone)
		for msg := range ch {
			msg.Ack()
			drained.Add(1)
		}
	}()
	defer func() {
		cancel()
		<-drainDone
	}()

	// The Subscriber must be the maintainer and, with a retention, have
	// partitions ready for the messages published from now on: otherwise
	// they go to the partition kept forever and are deleted row by row.
	setup := time.Now()
	if err := waitFor(ctx, retentionSetupTimeout, "the Subscriber to be the maintainer", func() (bool, error) {
		return sub.Stats().Maintainer, nil
	}); err != nil {
		return r, err
	}
	if c.retention > 0 {
		covered := `SELECT COALESCE(bool_and(l.covered_until > now() + t.retention + interval '1 second'), false)
			FROM ` + pgx.Identifier{schema, pglease.DefaultTopicsTable}.Sanitize() + ` t
			JOIN ` + pgx.Identifier{schema, pglease.DefaultRetentionTable}.Sanitize() + ` l USING (retention_class)
			WHERE t.topic = $1`
		if err := waitFor(ctx, retentionSetupTimeout, "retention partitions covering the next messages", func() (bool, error) {
			if sub.Stats().RetentionPartitionsCreated == 0 {
				return false, nil
			}
			var ok bool
			err := e.admin.QueryRow(ctx, covered, retentionTopicName).Scan(&ok)
			return ok, err
		}); err != nil {
			return r, err
		}
	}

	pub, err := pglease.NewPublisher(h.pool, pglease.PublisherConfig{Tables: tables}, e.logger)
	if err != nil {
		return r, err
	}
	defer pub.Close()
	var (
		ready, done sync.WaitGroup
		start       = make(chan struct{})
		deadline    time.Time // written before start is closed
		published   atomic.Int64
		errs        firstError
		batch       = e.cfg.batchSize
		warm        = int64(e.cfg.retentionPublishers * batch)
		maxLag      = int64(e.cfg.retentionMaxLag)
		waited      atomic.Int64 // nanoseconds the publishers spent waiting for the drain
	)
	for range e.cfg.retentionPublishers {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			err := pub.Publish(retentionTopicName, newMessages(batch)...)
			ready.Done()
			if err != nil {
				errs.set(err)
				return
			}
			<-start
			for time.Now().Before(deadline) && ctx.Err() == nil && errs.get() == nil {
				if maxLag > 0 && warm+published.Load()-drained.Load() > maxLag {
					w0 := time.Now()
					for warm+published.Load()-drained.Load() > maxLag && time.Now().Before(deadline) && ctx.Err() == nil {
						time.Sleep(time.Millisecond)
					}
					waited.Add(int64(time.Since(w0)))
					continue
				}
				if err := pub.Publish(retentionTopicName, newMessages(batch)...); err != nil {
					errs.set(err)
					return
				}
				published.Add(int64(batch))
			}
		}()
	}
	ready.Wait()
	if err := errs.get(); err != nil {
		close(start)
		done.Wait()
		return r, fmt.Errorf("warm-up: %w", err)
	}
	if err := waitFor(ctx, retentionSetupTimeout, "the warm-up messages to be drained", func() (bool, error) {
		return drained.Load() >= warm, nil
	}); err != nil {
		close(start)
		done.Wait()
		return r, err
	}
	e.log("retention, %s: set up in %s", c.text(), time.Since(setup).Round(time.Millisecond))

	size := func(ctx context.Context) (int64, int, error) {
		var bytes int64
		var parts int
		err := e.admin.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)
				+ COALESCE(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint, count(*)::int
			FROM pg_inherits i WHERE i.inhparent = $1::regclass`, messages).Scan(&bytes, &parts)
		if err != nil {
			return 0, 0, fmt.Errorf("size of %s: %w", messages, err)
		}
		return bytes, parts, nil
	}
	var (
		samplesMu sync.Mutex
		samples   []sizeSample
	)
	t0 := time.Now()
	take := func(ctx context.Context) error {
		p, d := published.Load(), drained.Load()
		bytes, parts, err := size(ctx)
		if err != nil {
			return err
		}
		samplesMu.Lock()
		samples = append(samples, sizeSample{at: time.Since(t0), bytes: bytes, partitions: parts, published: p, drained: d})
		samplesMu.Unlock()
		return nil
	}
	// With -statements, the busiest statements of each case's window.
	var before statSnapshot
	statements := e.cfg.statements && e.stats
	if statements {
		var err error
		if before, err = takeStatements(ctx, e.admin); err != nil {
			close(start)
			done.Wait()
			return r, err
		}
	}
	drained0 := drained.Load()
	if err := take(ctx); err != nil {
		close(start)
		done.Wait()
		return r, err
	}
	t0 = time.Now()
	deadline = t0.Add(e.cfg.retentionFor)
	close(start)

	every := retentionSampleEvery(e.cfg.retentionFor)
	r.every = every
	samplerDone := make(chan struct{})
	stopSampler := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if err := take(ctx); err != nil {
					errs.set(err)
					return
				}
			case <-stopSampler:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	done.Wait()
	r.window = time.Since(t0)
	r.drained = drained.Load() - drained0
	r.published = published.Load()
	r.lag = warm + r.published - drained.Load()
	r.waited = time.Duration(waited.Load()) / time.Duration(e.cfg.retentionPublishers)
	close(stopSampler)
	<-samplerDone
	if err := errs.get(); err != nil {
		return r, err
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if err := take(ctx); err != nil {
		return r, err
	}
	r.samples = samples
	if statements {
		after, err := takeStatements(ctx, e.admin)
		if err != nil {
			return r, err
		}
		printTopStatements(os.Stderr, "retention, "+c.text()+", the window", before, after, 8)
	}

	// The tail: every message published is delivered, or skipped by
	// retention (counted when its partition is dropped, up to the
	// retention and a slot later).
	total := warm + r.published
	tail := retentionTailTimeout + 2*c.retention
	tailErr := waitFor(ctx, tail, "the drain to account for every message", func() (bool, error) {
		return drained.Load()+int64(sub.Stats().RetentionSkipped) >= total, nil
	})
	if tailErr != nil && ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.stats = sub.Stats()

	last := r.samples[len(r.samples)-1]
	e.log("retention, %s: %s published in %s (%.0f/s), %s acked in the window (%.0f/s), %s not yet acked at its end; the publishers waited for the drain %.0f%% of the time",
		c.text(), thousands(int(r.published)), r.window.Round(time.Millisecond), r.publishRate(),
		thousands(int(r.drained)), r.drainRate(), thousands(int(r.lag)), 100*r.waited.Seconds()/r.window.Seconds())
	e.log("retention, %s: table %.1f MiB at most, %.1f MiB at the end (%d partitions), growth 2nd half ÷ 1st %.2f× (%.2f× before dividing by the publish rate); maintainer: %d partitions created, %d dropped, %d rows deleted, %d messages skipped",
		c.text(), float64(maxSize(r.samples))/mib, float64(last.bytes)/mib, last.partitions,
		sizeGrowth(r.samples, r.window, e.cfg.retentionTTL, every), halvesGrowth(r.samples, r.window),
		r.stats.RetentionPartitionsCreated, r.stats.RetentionPartitionsDropped, r.stats.RetentionRowsDeleted, r.stats.RetentionSkipped)
	e.log("retention, %s: samples every %s (s: MiB/partitions/published/acked): %s", c.text(), every, sampleSeries(r.samples))
	if tailErr != nil {
		e.log("retention, %s: after the window: %v (%s of %s messages acked, %d skipped)", c.text(), tailErr,
			thousands(int(drained.Load())), thousands(int(total)), r.stats.RetentionSkipped)
	} else if n := drained.Load() + int64(r.stats.RetentionSkipped) - total; n > 0 {
		e.log("retention, %s: %d messages more than published were acked or counted as skipped (redeliveries, or acked as they were counted)", c.text(), n)
	}
	return r, nil
}

// sampleSeries formats the samples for the log.
func sampleSeries(samples []sizeSample) string {
	var parts []string
	for _, s := range samples {
		parts = append(parts, fmt.Sprintf("%.0f: %.1f/%d/%d/%d", s.at.Seconds(), float64(s.bytes)/mib, s.partitions, s.published, s.drained))
	}
	return strings.Join(parts, ", ")
}

// waitFor polls cond every 10 ms until it holds, and fails after timeout.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s for %s in vain", timeout, what)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
}
