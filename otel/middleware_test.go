package otel_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	otelapi "go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/otel"
)

// routeOnce runs a Router with mw on a Go channel Pub/Sub (not pglease:
// Middleware alone makes the consumer spans), publishes msg to "in" and
// waits until handler returned nil; it returns after the Router closed.
// What the handler returns is published to "out" by out.
func routeOnce(t *testing.T, mw message.HandlerMiddleware, out func(message.Publisher) message.Publisher,
	msg *message.Message, pub func(message.Publisher) message.Publisher, handler message.HandlerFunc) {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	router.AddMiddleware(mw)
	done := make(chan struct{})
	router.AddHandler("h", "in", ps, "out", out(ps), func(m *message.Message) ([]*message.Message, error) {
		produced, err := handler(m)
		if err == nil {
			close(done)
		}
		return produced, err
	})
	outCh, err := ps.Subscribe(context.Background(), "out")
	require.NoError(t, err)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	require.NoError(t, pub(ps).Publish("in", msg))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not succeed")
	}
	select {
	case m := <-outCh:
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("the produced message was not published")
	}
	require.NoError(t, router.Close())
	require.NoError(t, ps.Close())
}

// TestMiddlewareAlone: behind a Subscriber that is not traced, the
// Middleware makes the consumer span itself: linked to the producer's
// span, in the handler's context, the error of a failed attempt
// recorded and the attempt ended as a nack, and the messages the handler
// returns published under it.
func TestMiddlewareAlone(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	opts := []otel.Option{otel.WithTracerProvider(tp), otel.WithPropagator(propagation.TraceContext{})}
	ctx, request := tp.Tracer("test").Start(context.Background(), "request")
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	msg.SetContext(ctx)

	var attempts atomic.Int32
	var handlerSpans []trace.SpanContext
	routeOnce(t, otel.Middleware(opts...), func(p message.Publisher) message.Publisher { return otel.WrapPublisher(p, opts...) },
		msg, func(p message.Publisher) message.Publisher { return otel.WrapPublisher(p, opts...) },
		func(m *message.Message) ([]*message.Message, error) {
			handlerSpans = append(handlerSpans, trace.SpanContextFromContext(m.Context()))
			if attempts.Add(1) == 1 {
				return nil, errors.New("first attempt fails")
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
		})
	request.End()

	spans := exp.GetSpans()
	var sends, processes []tracetest.SpanStub
	for _, s := range spans {
		switch s.Name {
		case "send in", "send out":
			sends = append(sends, s)
		case "process in":
			processes = append(processes, s)
		}
	}
	require.Len(t, sends, 2, "spans: %v", names(spans))
	require.Len(t, processes, 2, "one per attempt; spans: %v", names(spans))
	send := sends[0]
	if send.Name != "send in" {
		send = sends[1]
	}
	assert.Equal(t, request.SpanContext().SpanID(), send.Parent.SpanID(), "the publish is a child of the request")
	for i, p := range processes {
		assert.Equal(t, trace.SpanKindConsumer, p.SpanKind)
		require.Len(t, p.Links, 1)
		assert.Equal(t, send.SpanContext.SpanID(), p.Links[0].SpanContext.SpanID(), "linked to the producer's span")
		assert.Equal(t, send.SpanContext.TraceID(), p.Links[0].SpanContext.TraceID())
		assert.NotEqual(t, send.SpanContext.TraceID(), p.SpanContext.TraceID(), "a trace of its own by default")
		assert.True(t, p.SpanContext.Equal(handlerSpans[i]), "the handler's context holds the span")
		assert.Equal(t, "in", attrMap(p)["messaging.destination.name"])
		assert.Equal(t, otel.System, attrMap(p)["messaging.system"])
	}
	failed, ok := processes[0], processes[1]
	if !handlerSpans[0].Equal(failed.SpanContext) {
		failed, ok = ok, failed
	}
	assert.Equal(t, "Error", failed.Status.Code.String())
	assert.True(t, hasStubEvent(failed, "exception"), "the handler's error is recorded")
	assert.True(t, hasStubEvent(failed, "nack"))
	assert.True(t, hasStubEvent(ok, "ack"))
	out := sends[1]
	if out.Name != "send out" {
		out = sends[0]
	}
	assert.Equal(t, ok.SpanContext.SpanID(), out.Parent.SpanID(), "the produced message is published under the consumer span")
}

// TestDefaultPropagatorIsTraceContext: with no propagator given and none
// set globally, the wrappers write W3C trace context into the message and
// read it back, so the consumer span links to the producer's span.
func TestDefaultPropagatorIsTraceContext(t *testing.T) {
	if fields := otelapi.GetTextMapPropagator().Fields(); len(fields) != 0 {
		t.Skipf("a global propagator is set already (fields %v): an example ran before in this binary", fields)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	opts := []otel.Option{otel.WithTracerProvider(tp)}
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	var traceparent string
	routeOnce(t, otel.Middleware(opts...), func(p message.Publisher) message.Publisher { return p },
		msg, func(p message.Publisher) message.Publisher { return otel.WrapPublisher(p, opts...) },
		func(m *message.Message) ([]*message.Message, error) {
			traceparent = m.Metadata.Get("traceparent")
			return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
		})
	assert.NotEmpty(t, traceparent, "the published message carries a traceparent")
	send := sendSpan(t, exp, "send in")
	var process *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "process in" {
			process = &s
		}
	}
	require.NotNil(t, process, "spans: %v", names(exp.GetSpans()))
	require.Len(t, process.Links, 1, "the consumer span links to the producer's")
	assert.Equal(t, send.TraceID(), process.Links[0].SpanContext.TraceID())
	assert.Equal(t, send.SpanID(), process.Links[0].SpanContext.SpanID())
}

// TestProducerAsParent: WithProducerAsParent makes the consumer span a
// child of the producer's, in the producer's trace, still linked to it;
// with Instrument on pglease and with the Middleware alone.
func TestProducerAsParent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	opts := []otel.Option{otel.WithTracerProvider(tp), otel.WithPropagator(propagation.TraceContext{}), otel.WithProducerAsParent()}
	check := func(t *testing.T, producer trace.SpanContext, handlerSpan trace.SpanContext, name string) {
		t.Helper()
		var process *tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == name && s.SpanContext.Equal(handlerSpan) {
				process = &s
			}
		}
		require.NotNil(t, process, "no span %q of the handler's context", name)
		assert.Equal(t, producer.TraceID(), process.SpanContext.TraceID(), "in the producer's trace")
		assert.Equal(t, producer.SpanID(), process.Parent.SpanID(), "a child of the producer's span")
		assert.True(t, process.Parent.IsRemote())
		require.Len(t, process.Links, 1)
		assert.Equal(t, producer.SpanID(), process.Links[0].SpanContext.SpanID())
	}
	t.Run("Middleware", func(t *testing.T) {
		var handlerSpan trace.SpanContext
		routeOnce(t, otel.Middleware(opts...), func(p message.Publisher) message.Publisher { return p },
			message.NewMessage(watermill.NewUUID(), nil), func(p message.Publisher) message.Publisher { return otel.WrapPublisher(p, opts...) },
			func(m *message.Message) ([]*message.Message, error) {
				handlerSpan = trace.SpanContextFromContext(m.Context())
				return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
			})
		check(t, sendSpan(t, exp, "send in"), handlerSpan, "process in")
	})
	t.Run("Instrument", func(t *testing.T) {
		exp.Reset()
		handlerSpan := consumeOneWithPglease(t, otel.WrapPublisher, opts, otel.Instrument(pglease.SubscriberConfig{}, opts...))
		check(t, sendSpan(t, exp, "send t"), handlerSpan, "process t")
	})
}

// TestNoopProviders: with no-op providers a delivery through Instrument
// leaves the message's context as it was (nothing to record);
// WithProducerAsParent, with Instrument or the Middleware, still continues the producer's trace in
// the handler's context, as the no-op tracer's spans carry their
// parent's context, so that what the handler publishes is in that trace.
func TestNoopProviders(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	publishing := []otel.Option{otel.WithTracerProvider(sdk), otel.WithPropagator(propagation.TraceContext{})}
	noop := []otel.Option{otel.WithTracerProvider(tracenoop.NewTracerProvider()),
		otel.WithMeterProvider(metricnoop.NewMeterProvider()), otel.WithPropagator(propagation.TraceContext{})}

	t.Run("Instrument", func(t *testing.T) {
		span := consumeOneWithPglease(t, otel.WrapPublisher, publishing, otel.Instrument(pglease.SubscriberConfig{}, noop...))
		assert.False(t, span.IsValid(), "no span in the handler's context: %v", span)
	})
	parented := slices.Concat(noop, []otel.Option{otel.WithProducerAsParent()})
	t.Run("InstrumentProducerAsParent", func(t *testing.T) {
		span := consumeOneWithPglease(t, otel.WrapPublisher, publishing, otel.Instrument(pglease.SubscriberConfig{}, parented...))
		assert.True(t, span.IsValid(), "the producer's context in the handler's")
		assert.True(t, span.IsRemote())
	})
	t.Run("WrapSubscriber", func(t *testing.T) {
		span := consumeOneWithPglease(t, otel.WrapPublisher, publishing, pglease.SubscriberConfig{}, noop...)
		assert.False(t, span.IsValid(), "no span in the handler's context: %v", span)
	})
	t.Run("WrapSubscriberProducerAsParent", func(t *testing.T) {
		span := consumeOneWithPglease(t, otel.WrapPublisher, publishing, pglease.SubscriberConfig{}, parented...)
		assert.True(t, span.IsValid(), "the producer's context in the handler's")
	})
	t.Run("MiddlewareProducerAsParent", func(t *testing.T) {
		var handlerSpan trace.SpanContext
		routeOnce(t, otel.Middleware(parented...), func(p message.Publisher) message.Publisher { return p },
			message.NewMessage(watermill.NewUUID(), nil), func(p message.Publisher) message.Publisher { return otel.WrapPublisher(p, publishing...) },
			func(m *message.Message) ([]*message.Message, error) {
				handlerSpan = trace.SpanContextFromContext(m.Context())
				return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
			})
		assert.Equal(t, sendSpan(t, exp, "send in").SpanID(), handlerSpan.SpanID(), "the producer's context in the handler's")
	})
}

// consumeOneWithPglease publishes one message to "t" through
// wrap(a pglease Publisher, pubOpts...) in a request span of its own
// provider, consumes it with a pglease Subscriber of cfg and returns the
// span context of the handler's message; through WrapSubscriber with
// subOpts when given.
func consumeOneWithPglease(t *testing.T, wrap func(message.Publisher, ...otel.Option) *otel.Publisher, pubOpts []otel.Option,
	cfg pglease.SubscriberConfig, subOpts ...otel.Option) trace.SpanContext {
	t.Helper()
	pool := pgtest.NewPool(t, testDSN, 0)
	tables := pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_otel_test_")}
	rawPub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	pub := wrap(rawPub, pubOpts...)
	defer func() { assert.NoError(t, pub.Close()) }()
	msg := message.NewMessage(watermill.NewUUID(), nil)
	require.NoError(t, pub.Publish("t", msg))
	require.NotEmpty(t, msg.Metadata.Get("traceparent"), "the publisher stored a trace context")

	cfg.Tables = tables
	raw, err := pglease.NewSubscriber(pool, cfg, nil)
	require.NoError(t, err)
	var sub message.Subscriber = raw
	if subOpts != nil {
		sub = otel.WrapSubscriber(raw, subOpts...)
	}
	defer func() { assert.NoError(t, sub.Close()) }()
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	select {
	case m := <-ch:
		defer m.Ack()
		return trace.SpanContextFromContext(m.Context())
	case <-time.After(30 * time.Second):
		t.Fatal("no message")
		return trace.SpanContext{}
	}
}

func sendSpan(t *testing.T, exp *tracetest.InMemoryExporter, name string) trace.SpanContext {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			return s.SpanContext
		}
	}
	t.Fatalf("no span %q", name)
	return trace.SpanContext{}
}

func names(spans tracetest.SpanStubs) []string {
	var n []string
	for _, s := range spans {
		n = append(n, s.Name)
	}
	return n
}

func hasStubEvent(s tracetest.SpanStub, name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}
