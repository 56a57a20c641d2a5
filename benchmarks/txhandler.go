package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"
)

// The tx-handler workload: what exactly-once (pglease.TxHandler, built on
// AckInTx) costs next to the plain at-least-once handler. One topic gets
// cfg.txMessages messages beforehand; then three consumer groups, one
// after the other, each consume all of them through a Router whose handler
// writes one effect row per message:
//
//   - plain: the row is inserted by a statement of its own on the pool and
//     the handler returns nil; the Router acks (at least once: the effect is
//     not atomic with the position);
//   - ack: TxHandler; the row is inserted with the transaction, and AckInTx
//     commits the group's position in it (exactly once);
//   - publish: as ack, and the handler returns one derived message, which
//     TxHandler publishes in the same transaction (consume-transform-
//     produce).
//
// The groups run in a rotating order from round to round, so that noise
// from other work on the machine falls on each alike.

const (
	// txTopic is the input topic; txDerivedTopic gets the publish
	// variant's derived messages.
	txTopic        = "bench_tx_in"
	txDerivedTopic = "bench_tx_out"
	// txEffectsTable is the effect table, in the run's schema.
	txEffectsTable = "bench_effects"
	// txSourceMetadata is the metadata key of a derived message's source
	// message UUID.
	txSourceMetadata = "bench_source"
	// txTimeout bounds each variant's consumption.
	txTimeout = 5 * time.Minute
	// txPlain is the variant the others are compared to.
	txPlain = "plain"
)

// txVariant is one way of handling the messages.
type txVariant struct {
	name  string // in metric keys and logs
	label string // in the table
	short string // in the chart and logs
}

var txVariants = []txVariant{
	{name: txPlain, label: "plain handler: effect INSERT on the pool, Router acks (at least once)", short: "plain"},
	{name: "ack", label: "TxHandler: effect INSERT + AckInTx in one transaction (exactly once)", short: "TxHandler, effect + AckInTx"},
	{name: "publish", label: "TxHandler: effect INSERT + 1 derived message + AckInTx in one transaction", short: "TxHandler, effect + derived message + AckInTx"},
}

// group is the variant's consumer group: a fresh one, so that it starts at
// the beginning of the topic.
func (v txVariant) group() string { return consumerGroup + "-" + v.name }

func txKey(variant, what string) string { return fmt.Sprintf("tx-%s-%s", variant, what) }

func txHandlerWorkload(cfg config) workload {
	prefix := fmt.Sprintf("Router, %s messages published beforehand, 1 effect row each", thousands(cfg.txMessages))
	w := workload{id: "tx-handler", pgleaseOnly: true}
	for _, v := range txVariants {
		w.metrics = append(w.metrics, metric{
			key:         txKey(v.name, "rate"),
			label:       fmt.Sprintf("%s; %s: messages/s", prefix, v.label),
			short:       v.short + ", msg/s",
			unit:        "msg/s",
			better:      higherIsBetter,
			pgleaseOnly: true,
		})
	}
	for _, v := range txVariants[1:] {
		w.metrics = append(w.metrics, metric{
			key:         txKey(v.name, "ratio"),
			label:       fmt.Sprintf("%s ÷ plain, messages/s (same round)", v.short),
			short:       v.short + " ÷ plain",
			unit:        "×",
			better:      higherIsBetter,
			pgleaseOnly: true,
		})
	}
	for _, v := range txVariants {
		w.metrics = append(w.metrics, metric{
			key:         txKey(v.name, "server"),
			label:       fmt.Sprintf("%s: server execution time per message (pg_stat_statements)", v.short),
			short:       v.short + ", server time per message",
			unit:        "µs",
			better:      lowerIsBetter,
			pgleaseOnly: true,
		})
	}
	for _, v := range txVariants {
		w.metrics = append(w.metrics, metric{
			key:         txKey(v.name, "statements"),
			label:       fmt.Sprintf("%s: statements per message (pg_stat_statements)", v.short),
			short:       v.short + ", statements per message",
			unit:        "stmt",
			better:      lowerIsBetter,
			pgleaseOnly: true,
		})
	}
	// w is copied by value, and every copy shares runs.
	runs := new(int)
	w.run = func(ctx context.Context, e *env, h handle) (map[string]float64, error) {
		*runs++
		return runTxHandler(ctx, e, h.(*pgleaseHandle), txOrder(*runs), *runs == 1)
	}
	return w
}

// txOrder is the order of the variants in the run-th run (from 1): each
// round starts one further along, so that each variant comes first, in the
// middle and last equally often.
func txOrder(run int) []txVariant {
	n := len(txVariants)
	out := make([]txVariant, n)
	for i := range out {
		out[i] = txVariants[(run-1+i)%n]
	}
	return out
}

// runTxHandler publishes cfg.txMessages messages to txTopic, then consumes
// them once with each variant, in the given order, and returns the rates,
// the ratios to plain of the same run and, with pg_stat_statements, the
// server's execution time and statements per message of each.
func runTxHandler(ctx context.Context, e *env, h *pgleaseHandle, order []txVariant, first bool) (map[string]float64, error) {
	if err := h.initTopic(ctx, txTopic); err != nil {
		return nil, err
	}
	n := e.cfg.txMessages
	if err := prefill(ctx, h, txTopic, n); err != nil {
		return nil, err
	}
	effects := pgx.Identifier{h.ns, txEffectsTable}.Sanitize()
	if _, err := e.admin.Exec(ctx, "CREATE TABLE "+effects+" (uuid text NOT NULL)"); err != nil {
		return nil, fmt.Errorf("create the effect table: %w", err)
	}
	vals := map[string]float64{}
	for _, v := range order {
		r, err := txConsume(ctx, e, h, v, first)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		vals[txKey(v.name, "rate")] = float64(n) / r.took.Seconds()
		if r.statements >= 0 {
			vals[txKey(v.name, "server")] = r.execMs * 1000 / float64(n)
			vals[txKey(v.name, "statements")] = float64(r.statements) / float64(n)
		}
		e.log("tx-handler, %s: %s messages in %s (%.0f/s)%s", v.name, thousands(n), r.took.Round(time.Millisecond),
			float64(n)/r.took.Seconds(), r.serverText(n))
	}
	for _, v := range txVariants[1:] {
		vals[txKey(v.name, "ratio")] = vals[txKey(v.name, "rate")] / vals[txKey(txPlain, "rate")]
	}
	return vals, nil
}

// txResult is what one variant's consumption took.
type txResult struct {
	took       time.Duration
	statements int64   // -1 without pg_stat_statements
	execMs     float64 // the statements' execution time
}

func (r txResult) serverText(n int) string {
	if r.statements < 0 {
		return ""
	}
	return fmt.Sprintf("; server: %.1f statements, %.0f µs per message", float64(r.statements)/float64(n), r.execMs*1000/float64(n))
}

// txConsume consumes txTopic with variant v's handler in a fresh consumer
// group, through a Router with the default configuration: timed from Run
// to the last message handled, with the server's statements
// (pg_stat_statements) over the same span. Then it checks that the effect
// table holds one row per message, each message's once (and, for the
// publish variant, that txDerivedTopic got one derived message per
// message), and empties the table again. With -statements, it prints the
// busiest statements of the first run's variants.
func txConsume(ctx context.Context, e *env, h *pgleaseHandle, v txVariant, first bool) (txResult, error) {
	n := e.cfg.txMessages
	effects := pgx.Identifier{h.ns, txEffectsTable}.Sanitize()
	insert := "INSERT INTO " + effects + " (uuid) VALUES ($1)"
	pub := pglease.PublisherConfig{Tables: h.tables}
	var handler message.NoPublishHandlerFunc
	switch v.name {
	case txPlain:
		handler = func(msg *message.Message) error {
			_, err := h.pool.Exec(msg.Context(), insert, msg.UUID)
			return err
		}
	case "ack":
		handler = pglease.TxHandler(h.pool, pglease.TxHandlerConfig{Publisher: pub},
			func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				_, err := tx.Exec(ctx, insert, msg.UUID)
				return nil, err
			})
	case "publish":
		handler = pglease.TxHandler(h.pool, pglease.TxHandlerConfig{PublishTopic: txDerivedTopic, Publisher: pub},
			func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				if _, err := tx.Exec(ctx, insert, msg.UUID); err != nil {
					return nil, err
				}
				derived := message.NewMessage(watermill.NewUUID(), msg.Payload)
				derived.Metadata.Set(txSourceMetadata, msg.UUID)
				return []*message.Message{derived}, nil
			})
	default:
		return txResult{}, fmt.Errorf("unknown variant %q", v.name)
	}

	_, _ = e.admin.Exec(ctx, "CHECKPOINT")
	sub, err := pglease.NewSubscriber(h.pool, pglease.SubscriberConfig{ConsumerGroup: v.group(), Tables: h.tables}, e.logger)
	if err != nil {
		return txResult{}, err
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return txResult{}, err
	}
	defer router.Close()
	var (
		handled = newTxTally(n)
		failed  atomic.Int64
		errs    firstError
	)
	router.AddConsumerHandler(v.group(), txTopic, sub, func(msg *message.Message) error {
		if err := handler(msg); err != nil {
			failed.Add(1)
			errs.set(err)
			return err
		}
		handled.add(msg.UUID)
		return nil
	})

	r := txResult{statements: -1}
	var before statSnapshot
	if e.stats {
		if before, err = takeStatements(ctx, e.admin); err != nil {
			return r, err
		}
	}
	runErr := make(chan error, 1)
	t0 := time.Now()
	go func() { runErr <- router.Run(ctx) }()
	timeout := time.NewTimer(txTimeout)
	defer timeout.Stop()
	select {
	case <-handled.done:
	case err := <-runErr:
		return r, fmt.Errorf("the Router stopped after %d of %d messages: %v", handled.count(), n, err)
	case <-timeout.C:
		return r, fmt.Errorf("the Router handled %d of %d messages in %s (%d attempts failed, first: %v)",
			handled.count(), n, txTimeout, failed.Load(), errs.get())
	case <-ctx.Done():
		return r, ctx.Err()
	}
	r.took = handled.end.Sub(t0)
	if e.stats {
		after, err := takeStatements(ctx, e.admin)
		if err != nil {
			return r, err
		}
		r.statements = after.calls() - before.calls()
		r.execMs = after.execTime() - before.execTime()
		if e.cfg.statements && first {
			printTopStatements(os.Stderr, "tx-handler, "+v.name, before, after, 10)
		}
	}
	if err := router.Close(); err != nil {
		return r, fmt.Errorf("close the Router: %w", err)
	}
	if err := <-runErr; err != nil {
		return r, fmt.Errorf("the Router: %w", err)
	}
	if err := sub.Close(); err != nil {
		return r, fmt.Errorf("close the Subscriber: %w", err)
	}
	if f := failed.Load(); f > 0 {
		e.log("tx-handler, %s: %d handler attempts failed (the messages were delivered again), first: %v", v.name, f, errs.get())
	}

	var rows, distinct int
	if err := e.admin.QueryRow(ctx, "SELECT count(*), count(DISTINCT uuid) FROM "+effects).Scan(&rows, &distinct); err != nil {
		return r, fmt.Errorf("count the effect rows: %w", err)
	}
	if rows != n || distinct != n {
		return r, fmt.Errorf("%d effect rows of %d messages, want %d of %d", rows, distinct, n, n)
	}
	if v.name == "publish" {
		messages := pgx.Identifier{h.ns, pglease.DefaultMessagesTable}.Sanitize()
		if err := e.admin.QueryRow(ctx, "SELECT count(*), count(DISTINCT metadata->>$2) FROM "+messages+" WHERE topic = $1",
			txDerivedTopic, txSourceMetadata).Scan(&rows, &distinct); err != nil {
			return r, fmt.Errorf("count the derived messages: %w", err)
		}
		if rows != n || distinct != n {
			return r, fmt.Errorf("%d derived messages of %d source messages, want %d of %d", rows, distinct, n, n)
		}
	}
	if _, err := e.admin.Exec(ctx, "TRUNCATE "+effects); err != nil {
		return r, fmt.Errorf("empty the effect table: %w", err)
	}
	return r, nil
}

// txTally counts the distinct messages handled; done is closed, and end
// set, when it reaches its total. It is safe for concurrent use.
type txTally struct {
	mu    sync.Mutex
	total int
	seen  map[string]struct{}
	end   time.Time // written before done is closed
	done  chan struct{}
}

func newTxTally(total int) *txTally {
	return &txTally{total: total, seen: make(map[string]struct{}, total), done: make(chan struct{})}
}

func (t *txTally) add(uuid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.seen[uuid]; ok {
		return
	}
	t.seen[uuid] = struct{}{}
	if len(t.seen) == t.total {
		t.end = time.Now()
		close(t.done)
	}
}

func (t *txTally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.seen)
}
