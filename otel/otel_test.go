package otel_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/otel"
)

// testDSN is the database every test uses; each test works in a schema of
// its own.
var testDSN string

// consumerEnv, when set, makes the test binary the consumer process of
// TestTraceCrossesTheDatabase (runConsumer), with its consumerConfig as
// JSON.
const consumerEnv = "PGLEASE_OTEL_CONSUMER"

// TestMain finds the database as the core module's tests do
// (internal/pgtest), or runs the consumer process.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(consumerEnv); cfg != "" {
		os.Exit(runConsumer(cfg))
	}
	os.Exit(pgtest.Main(m, "otel", func(dsn string) { testDSN = dsn }))
}

const (
	topic       = "orders"
	poisonTopic = "orders.poison"
	group       = "billing"
	// poisonMetadata marks a message the consumer's handler fails on
	// until it was replayed from the poison topic.
	poisonMetadata = "test_poison"
)

// consumerConfig is what the consumer process runs.
type consumerConfig struct {
	DSN    string
	Schema string
	// Want is how many messages the handler must process successfully
	// (and see acked) before the process reports its spans and exits.
	Want int
	// Wrap traces with WrapSubscriber instead of Instrument.
	Wrap bool
}

// spanRecord is a span of the consumer process, as it reports it on its
// standard output (one JSON object a line).
type spanRecord struct {
	Name         string
	Kind         string
	TraceID      string
	SpanID       string
	ParentSpanID string
	Links        []linkRecord
	Attributes   map[string]string
	Events       []string
	Status       string
}

type linkRecord struct{ TraceID, SpanID string }

func record(s sdktrace.ReadOnlySpan) spanRecord {
	r := spanRecord{Name: s.Name(), Kind: s.SpanKind().String(), TraceID: s.SpanContext().TraceID().String(),
		SpanID: s.SpanContext().SpanID().String(), Attributes: map[string]string{}, Status: s.Status().Code.String()}
	if s.Parent().IsValid() {
		r.ParentSpanID = s.Parent().SpanID().String()
	}
	for _, l := range s.Links() {
		r.Links = append(r.Links, linkRecord{l.SpanContext.TraceID().String(), l.SpanContext.SpanID().String()})
	}
	for _, a := range s.Attributes() {
		r.Attributes[string(a.Key)] = a.Value.String()
	}
	for _, e := range s.Events() {
		r.Events = append(r.Events, e.Name)
	}
	return r
}

// runConsumer is the consumer process: a Watermill Router on a traced
// pglease Subscriber (Instrument, or WrapSubscriber) of its own pool, with a poison queue through a
// wrapped Publisher, tracing into an in-memory exporter of its own. Once
// Want messages were processed and acked it closes everything and writes
// its spans to stdout. Nothing crosses from the test to it but the
// database (and this configuration).
func runConsumer(raw string) int {
	var cfg consumerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "consumer config:", err)
		return 2
	}
	if err := consume(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	return 0
}

func consume(cfg consumerConfig) error {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	opts := []otel.Option{otel.WithTracerProvider(tp), otel.WithPropagator(propagation.TraceContext{})}
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables := pglease.Tables{Schema: cfg.Schema}
	subCfg := pglease.SubscriberConfig{ConsumerGroup: group, Tables: tables,
		CommitBatch: 1, PollInterval: 20 * time.Millisecond, NackResendDelay: time.Millisecond}
	if !cfg.Wrap {
		subCfg = otel.Instrument(subCfg, opts...)
	}
	sub, err := pglease.NewSubscriber(pool, subCfg, nil)
	if err != nil {
		return err
	}
	var wsub message.Subscriber = sub
	if cfg.Wrap {
		wsub = otel.WrapSubscriber(sub, opts...)
	}
	defer func() { _ = wsub.Close() }()
	rawPub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables}, nil)
	if err != nil {
		return err
	}
	pub := otel.WrapPublisher(rawPub, opts...)
	defer func() { _ = pub.Close() }()

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	poison, err := middleware.PoisonQueue(pub, poisonTopic)
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, otel.Middleware(opts...))
	tracer := tp.Tracer("consumer")
	router.AddConsumerHandler("billing", topic, wsub, func(msg *message.Message) error {
		_, span := tracer.Start(msg.Context(), "handle")
		defer span.End()
		if msg.Metadata.Get(poisonMetadata) != "" && msg.Metadata.Get(admin.PoisonedTopicKey) == "" {
			return fmt.Errorf("poison message %s", msg.UUID)
		}
		return nil
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(runCtx) }()

	acked := func() int {
		n := 0
		for _, s := range exp.GetSpans() {
			if s.Name == "process "+topic && s.SpanKind == trace.SpanKindConsumer && hasEvent(s.Events, "ack") &&
				s.Status.Code.String() != "Error" {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(time.Minute)
	for acked() < cfg.Want {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %d acked messages, got %d", cfg.Want, acked())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-runErr; err != nil {
		return err
	}
	if err := wsub.Close(); err != nil {
		return err
	}
	// Shutdown empties the exporter: read it first.
	if err := tp.ForceFlush(ctx); err != nil {
		return err
	}
	snapshots := exp.GetSpans().Snapshots()
	if err := tp.Shutdown(ctx); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for _, s := range snapshots {
		if err := enc.Encode(record(s)); err != nil {
			return err
		}
	}
	return nil
}

func hasEvent(events []sdktrace.Event, name string) bool {
	for _, e := range events {
		if e.Name == name {
			return true
		}
	}
	return false
}

// TestTraceCrossesTheDatabase publishes three messages in an HTTP-like
// request span (one plain, one delayed with Watermill's delay metadata,
// one the handler fails on) and consumes them through a Router in a
// child process: the trace context crosses only through the database.
// Each process span the consumer makes is linked to the send span of its
// message, with the messaging attributes; the poisoned message, sent to
// the poison queue and replayed with admin.Inspector.Replay, keeps its
// link; the handler's span nests under the process span. The consumer
// traces its Subscriber with Instrument, then with WrapSubscriber.
func TestTraceCrossesTheDatabase(t *testing.T) {
	t.Run("Instrument", func(t *testing.T) { testTraceCrossesTheDatabase(t, false) })
	t.Run("WrapSubscriber", func(t *testing.T) { testTraceCrossesTheDatabase(t, true) })
}

func testTraceCrossesTheDatabase(t *testing.T, wrap bool) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, testDSN, 0)
	tables := pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_otel_test_")}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	rawPub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	pub := otel.WrapPublisher(rawPub, otel.WithTracerProvider(tp), otel.WithPropagator(propagation.TraceContext{}))
	t.Cleanup(func() { assert.NoError(t, pub.Close()) })

	reqCtx, req := tp.Tracer("http").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	newMsg := func(payload string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		m.SetContext(reqCtx)
		return m
	}
	plain, delayed, poisoned := newMsg("plain"), newMsg("delayed"), newMsg("poisoned")
	// delay.Until stores whole seconds: take a time that is one.
	due := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
	delay.Message(delayed, delay.Until(due))
	poisoned.Metadata.Set(poisonMetadata, "1")
	for _, m := range []*message.Message{plain, delayed, poisoned} {
		require.NoError(t, pub.Publish(topic, m))
		require.NotEmpty(t, m.Metadata.Get("traceparent"), "the context is stored with the message")
	}
	req.End()

	// The send spans, children of the request.
	sends := map[string]tracetest.SpanStub{} // by message id
	for _, s := range exp.GetSpans() {
		if s.Name == "send "+topic {
			assert.Equal(t, trace.SpanKindProducer, s.SpanKind)
			assert.Equal(t, req.SpanContext().SpanID(), s.Parent.SpanID(), "send is a child of the request")
			attrs := attrMap(s)
			assert.Equal(t, "pglease", attrs["messaging.system"])
			assert.Equal(t, "send", attrs["messaging.operation.name"])
			assert.Equal(t, "send", attrs["messaging.operation.type"])
			assert.Equal(t, topic, attrs["messaging.destination.name"])
			sends[attrs["messaging.message.id"]] = s
		}
	}
	require.Len(t, sends, 3)

	// The consumer process.
	cfg, err := json.Marshal(consumerConfig{DSN: testDSN, Schema: tables.Schema, Want: 3, Wrap: wrap})
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), consumerEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan []string, 1)
	go func() {
		var out []string
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			out = append(out, sc.Text())
		}
		lines <- out
	}()

	// The poisoned message reaches the poison queue; replay it.
	insp, err := admin.NewInspector(pool, tables)
	require.NoError(t, err)
	pgtest.WaitFor(t, time.Minute, "the poisoned message in the poison topic", func() bool {
		n, err := insp.TopicMessages(ctx, admin.TopicMessagesParams{Topics: []string{poisonTopic}})
		return err == nil && len(n) == 1 && n[0].Messages == 1
	})
	replayed, err := insp.Replay(ctx, admin.ReplayParams{From: poisonTopic, ToOriginal: true})
	require.NoError(t, err)
	require.Len(t, replayed, 1)
	require.Equal(t, poisoned.UUID, replayed[0].UUID)

	var out []string
	select {
	case out = <-lines:
	case <-time.After(2 * time.Minute):
		t.Fatal("the consumer process did not finish")
	}
	require.NoError(t, cmd.Wait(), "the consumer process failed")
	require.False(t, time.Now().Before(due), "the consumer finished before the delayed message was due")

	t.Logf("consumer: %d spans", len(out))
	var spans []spanRecord
	for _, l := range out {
		var r spanRecord
		require.NoError(t, json.Unmarshal([]byte(l), &r), l)
		spans = append(spans, r)
	}
	byID := map[string]spanRecord{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	processes := map[string][]spanRecord{} // by message id
	for _, s := range spans {
		if s.Name == "process "+topic {
			processes[s.Attributes["messaging.message.id"]] = append(processes[s.Attributes["messaging.message.id"]], s)
		}
	}
	for _, m := range []*message.Message{plain, delayed, poisoned} {
		send := sends[m.UUID]
		ps := processes[m.UUID]
		wantDeliveries := 1
		if m == poisoned {
			wantDeliveries = 2 // failed, then replayed
		}
		require.Len(t, ps, wantDeliveries, "process spans of %s", m.Payload)
		for _, p := range ps {
			assert.Equal(t, "consumer", p.Kind)
			require.Len(t, p.Links, 1, "process span of %s", m.Payload)
			assert.Equal(t, linkRecord{send.SpanContext.TraceID().String(), send.SpanContext.SpanID().String()}, p.Links[0],
				"the process span of %s links to its send span", m.Payload)
			assert.NotEqual(t, send.SpanContext.TraceID().String(), p.TraceID, "a trace of its own by default")
			a := p.Attributes
			assert.Equal(t, "pglease", a["messaging.system"])
			assert.Equal(t, "process", a["messaging.operation.name"])
			assert.Equal(t, "process", a["messaging.operation.type"])
			assert.Equal(t, topic, a["messaging.destination.name"])
			assert.Equal(t, "0", a["messaging.destination.partition.id"])
			assert.Equal(t, group, a["messaging.consumer.group.name"])
			_, err := uuid.Parse(a["messaging.client.id"])
			assert.NoError(t, err, "messaging.client.id is the session id")
			assert.NotEmpty(t, a["pglease.position.transaction_id"])
			assert.NotEmpty(t, a["pglease.position.offset"])
			assert.NotEqual(t, "0", a["pglease.epoch"])
			assert.NotEmpty(t, a["pglease.epoch"])
			assert.Contains(t, p.Events, "ack", "settled: acked (into the poison queue for the failed delivery)")

			// The handler's span nests under it.
			var handle *spanRecord
			for _, s := range spans {
				if s.Name == "handle" && s.ParentSpanID == p.SpanID {
					handle = &s
				}
			}
			assert.NotNil(t, handle, "the handler's span is a child of the process span of %s", m.Payload)
		}
	}
	// The failed delivery: its error recorded by the middleware, its
	// poison-queue publish a send span under it that kept the original
	// context in the message.
	var failed spanRecord
	for _, p := range processes[poisoned.UUID] {
		if p.Status == "Error" {
			failed = p
		}
	}
	require.NotEmpty(t, failed.SpanID, "the failed delivery's span has status Error")
	var poisonSend *spanRecord
	for _, s := range spans {
		if s.Name == "send "+poisonTopic {
			poisonSend = &s
		}
	}
	require.NotNil(t, poisonSend)
	assert.Equal(t, failed.SpanID, poisonSend.ParentSpanID, "the poison queue's publish nests under the failed delivery")
	assert.Equal(t, "producer", poisonSend.Kind)
}

func attrMap(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes {
		m[string(a.Key)] = a.Value.String()
	}
	return m
}
