package main

// The limits of the PostgreSQL server itself, measured in the
// same run as the backends: how fast the server takes the benchmark's rows
// without any Pub/Sub around them. Every limit writes 64-byte payloads
// into pglease's messages table (created by pglease's schema
// initialization: the same columns, primary key and partitioning the
// Publisher writes to), each into a topic of its own:
//
//   - COPY: cfg.backlog rows in one binary COPY (one statement, one
//     commit);
//   - INSERT … SELECT: the same rows again, read from the table, in one
//     statement;
//   - COPY by 100: 100 rows per COPY, each its own transaction, from one
//     client for cfg.publishFor: what publishing in batches of 100 could at
//     best do with one commit per call;
//   - commits: cfg.publishers clients, each on a connection of its own,
//     inserting one row per transaction for cfg.publishFor, as pgbench
//     would with a one-INSERT script: what publishing one message per call
//     from that many goroutines could at best do with one commit per call;
//   - notify latency: cfg.latencyRate single-row INSERTs per second for
//     cfg.latencyFor, each notifying in its transaction; a LISTEN
//     connection hears each, and the newest row of the topic is then read
//     on a pooled connection: from just before the INSERT to the read's
//     result. What a design of LISTEN/NOTIFY and a read on this server
//     could at best deliver at that rate.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// limitsName is the backend name of the limits.
const limitsName = "PostgreSQL"

// The metric keys of the limits.
const (
	limitCopy         = "limit-copy"
	limitInsertSelect = "limit-insert-select"
	limitCopy100      = "limit-copy-100"
	limitCommits      = "limit-commits"
	limitLatencyP50   = "limit-latency-p50"
	limitLatencyP99   = "limit-latency-p99"
)

// limitsBackend is the server alone: a pglease schema, written to without
// pglease.
type limitsBackend struct{}

func (limitsBackend) name() string  { return limitsName }
func (limitsBackend) short() string { return "pg" }

func (limitsBackend) open(ctx context.Context, e *env, ns string) (handle, error) {
	return pgleaseBackend{}.open(ctx, e, ns)
}

func limitsWorkload(cfg config) workload {
	return workload{
		id:    "limits",
		alone: limitsBackend{},
		run:   runLimits,
		metrics: []metric{
			{
				key:    limitCopy,
				label:  fmt.Sprintf("COPY of %s rows into the messages table, one statement", thousands(cfg.backlog)),
				short:  "COPY, one statement",
				unit:   "rows/s",
				better: higherIsBetter,
			},
			{
				key:    limitInsertSelect,
				label:  "INSERT … SELECT of the same rows, one statement",
				short:  "INSERT … SELECT",
				unit:   "rows/s",
				better: higherIsBetter,
			},
			{
				key:    limitCopy100,
				label:  fmt.Sprintf("COPY of %d rows per statement and transaction, 1 client", cfg.batchSize),
				short:  fmt.Sprintf("COPY by %d", cfg.batchSize),
				unit:   "rows/s",
				better: higherIsBetter,
			},
			{
				key:    limitCommits,
				label:  fmt.Sprintf("%d clients, one single-row INSERT per transaction (pgbench-style)", cfg.publishers),
				short:  fmt.Sprintf("%d clients × 1 row per commit", cfg.publishers),
				unit:   "commits/s",
				better: higherIsBetter,
			},
			{
				key:    limitLatencyP50,
				label:  fmt.Sprintf("INSERT + NOTIFY → LISTEN → read the row, p50 at %d msg/s", cfg.latencyRate),
				short:  "INSERT+NOTIFY→read p50",
				unit:   "ms",
				better: lowerIsBetter,
			},
			{
				key:    limitLatencyP99,
				label:  fmt.Sprintf("INSERT + NOTIFY → LISTEN → read the row, p99 at %d msg/s", cfg.latencyRate),
				short:  "INSERT+NOTIFY→read p99",
				unit:   "ms",
				better: lowerIsBetter,
			},
		},
	}
}

// limitRows are n rows of the limits: topic, a fresh UUID, the payload, no
// metadata.
func limitRows(topic string, n int) [][]any {
	rows := make([][]any, n)
	for i := range rows {
		rows[i] = []any{topic, watermill.NewUUID(), payload, nil}
	}
	return rows
}

// limitColumns are the columns the limits write; the others take their
// defaults, as with pglease's Publisher.
var limitColumns = []string{"topic", "uuid", "payload", "metadata"}

func runLimits(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	ph := h.(*pgleaseHandle)
	if err := h.initTopic(ctx, "bench_limits"); err != nil { // the schema
		return nil, err
	}
	table := pgx.Identifier{ph.ns, pglease.DefaultMessagesTable}
	vals := map[string]float64{}
	steps := []struct {
		key string
		run func() (float64, error)
	}{
		{limitCopy, func() (float64, error) { return limitCopyOnce(ctx, ph.pool, table, e.cfg.backlog) }},
		{limitInsertSelect, func() (float64, error) { return limitInsertSelectOnce(ctx, ph.pool, table) }},
		{limitCopy100, func() (float64, error) {
			return limitCopyBatches(ctx, ph.pool, table, e.cfg.batchSize, e.cfg.publishFor)
		}},
		{limitCommits, func() (float64, error) { return limitSingleRowCommits(ctx, e, table) }},
		{limitLatencyP50, func() (float64, error) {
			p50, p99, err := limitNotifyLatency(ctx, e, ph.pool, table)
			vals[limitLatencyP99] = p99
			return p50, err
		}},
	}
	for _, s := range steps {
		// Each starts with no dirty buffers left over from the one before.
		if _, err := e.admin.Exec(ctx, "CHECKPOINT"); err != nil {
			return nil, err
		}
		v, err := s.run()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.key, err)
		}
		vals[s.key] = v
	}
	return vals, nil
}

// limitCopyOnce copies n rows in one COPY and returns rows per second.
func limitCopyOnce(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier, n int) (float64, error) {
	rows := limitRows("bench_limits_copy", n)
	t0 := time.Now()
	copied, err := pool.CopyFrom(ctx, table, limitColumns, pgx.CopyFromRows(rows))
	elapsed := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if copied != int64(n) {
		return 0, fmt.Errorf("copied %d rows, not %d", copied, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// limitInsertSelectOnce inserts the rows limitCopyOnce copied again, under
// another topic, in one statement, and returns rows per second.
func limitInsertSelectOnce(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier) (float64, error) {
	t := table.Sanitize()
	t0 := time.Now()
	tag, err := pool.Exec(ctx, `INSERT INTO `+t+` (topic, uuid, payload, metadata)
		SELECT 'bench_limits_insert_select', uuid, payload, metadata FROM `+t+` WHERE topic = 'bench_limits_copy'`)
	elapsed := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if tag.RowsAffected() == 0 {
		return 0, fmt.Errorf("no rows to insert (the COPY before wrote none)")
	}
	return float64(tag.RowsAffected()) / elapsed.Seconds(), nil
}

// limitCopyBatches copies batch rows per COPY, one after another, for d,
// and returns rows per second.
func limitCopyBatches(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier, batch int, d time.Duration) (float64, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	rows := limitRows("bench_limits_copy_batches", batch)
	if _, err := conn.CopyFrom(ctx, table, limitColumns, pgx.CopyFromRows(rows)); err != nil {
		return 0, err
	}
	count := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		rows := limitRows("bench_limits_copy_batches", batch)
		if _, err := conn.CopyFrom(ctx, table, limitColumns, pgx.CopyFromRows(rows)); err != nil {
			return 0, err
		}
		count += batch
	}
	return float64(count) / time.Since(t0).Seconds(), nil
}

// limitSingleRowCommits: cfg.publishers clients, each with a connection of
// its own, insert one row per transaction (an INSERT outside a
// transaction block) for cfg.publishFor; commits per second. Each inserts
// once before the clock starts, so that every connection is open and its
// statement prepared.
func limitSingleRowCommits(ctx context.Context, e *env, table pgx.Identifier) (float64, error) {
	pool, err := e.pgleasePool(e.cfg.publishers)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	insert := `INSERT INTO ` + table.Sanitize() + ` (topic, uuid, payload) VALUES ($1, $2, $3)`
	const topic = "bench_limits_commits"
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
			conn, err := pool.Acquire(ctx)
			if err == nil {
				defer conn.Release()
				_, err = conn.Exec(ctx, insert, topic, watermill.NewUUID(), payload)
			}
			ready.Done()
			if err != nil {
				errs.set(err)
				return
			}
			<-start
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if _, err := conn.Exec(ctx, insert, topic, watermill.NewUUID(), payload); err != nil {
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
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(count.Load()) / elapsed.Seconds(), nil
}

// limitNotifyLatency: e.cfg.latencyRate single-row INSERTs per second for
// e.cfg.latencyFor, each with a pg_notify in its statement (so in its
// transaction); a connection of its own LISTENs, and each notification is
// followed by a read of the topic's newest row on pool, as a Subscriber
// reads after a wake-up. Latency runs from just before the INSERT to the
// read's result; p50 and p99 in milliseconds.
func limitNotifyLatency(ctx context.Context, e *env, pool *pgxpool.Pool, table pgx.Identifier) (p50, p99 float64, err error) {
	const topic, channel = "bench_limits_latency", "bench_limits_latency"
	cc, err := e.connConfig()
	if err != nil {
		return 0, 0, err
	}
	listen, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = listen.Close(context.Background()) }()
	if _, err := listen.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return 0, 0, err
	}
	insert := `WITH i AS (INSERT INTO ` + table.Sanitize() + ` (topic, uuid, payload) VALUES ($1, $2, $3))
SELECT pg_notify($4, $2)`
	read := `SELECT uuid, payload FROM ` + table.Sanitize() + ` WHERE topic = $1 AND partition = 0
ORDER BY transaction_id DESC, "offset" DESC LIMIT 1`

	total := int(float64(e.cfg.latencyRate) * e.cfg.latencyFor.Seconds())
	const warm = 10
	lat := newLatencyLog(total)
	lctx, cancel := context.WithCancel(ctx)
	readErr := make(chan error, 1)
	listened := make(chan struct{})
	// Runs before the connection's Close (deferred earlier): a pgx.Conn
	// is not to be used by two goroutines at once.
	defer func() {
		cancel()
		<-listened
	}()
	go func() {
		defer close(listened)
		for {
			n, err := listen.WaitForNotification(lctx)
			if err != nil {
				return
			}
			// The row notified is committed, so the read sees it, or a
			// newer one when the next INSERT committed meanwhile.
			var uuid string
			var body []byte
			if err := pool.QueryRow(lctx, read, topic).Scan(&uuid, &body); err != nil {
				readErr <- err
				return
			}
			lat.arrived(n.Payload)
		}
	}()
	err = paced(ctx, e.cfg.latencyRate, warm+total, func(i int) error {
		id := watermill.NewUUID()
		if i >= warm {
			lat.sent(id)
		}
		_, err := pool.Exec(ctx, insert, topic, id, payload, channel)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	select {
	case <-lat.allIn:
	case err := <-readErr:
		return 0, 0, err
	case <-time.After(30 * time.Second):
		return 0, 0, fmt.Errorf("heard and read %d of %d rows within 30s of the last INSERT", lat.arrivals(), total)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	return ms(lat.percentile(0.50)), ms(lat.percentile(0.99)), nil
}
