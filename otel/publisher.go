package otel

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Publisher is a [message.Publisher] that traces and measures another
// one, a *pglease.Publisher as a rule. Make it with [WrapPublisher]. It is
// safe for concurrent use as far as the wrapped Publisher is.
type Publisher struct {
	pub message.Publisher
	t   *telemetry
}

var _ message.Publisher = (*Publisher)(nil)

// WrapPublisher returns pub traced and measured: each Publish call is a
// PRODUCER span "send <topic>", a child of the first message's context,
// that lasts until pub.Publish returns (for a *pglease.Publisher on a
// pool, the wait for the group commit), and the trace context of that
// span is written into the metadata of every message (W3C traceparent
// and tracestate with propagation.TraceContext), so that it is stored
// with the message. A message that carries a trace context already
// (a consumed message published again, a replay) keeps it: that context
// is where the message was created.
func WrapPublisher(pub message.Publisher, opts ...Option) *Publisher {
	return &Publisher{pub: pub, t: newTelemetry(opts)}
}

// Publish implements [message.Publisher]: it publishes msgs to topic
// with the wrapped Publisher, in a span. It writes to the messages'
// metadata.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return p.pub.Publish(topic, msgs...)
	}
	t := p.t
	ctx := msgs[0].Context()
	if t.noop && !t.opDuration.Enabled(ctx) && !t.sent.Enabled(ctx) {
		// The span would be the no-op tracer's, its context the first
		// message's, and nothing measured.
		t.injectMissing(ctx, msgs)
		return p.pub.Publish(topic, msgs...)
	}
	start := time.Now()
	base := [...]attribute.KeyValue{
		semconv.MessagingSystemKey.String(System),
		semconv.MessagingOperationName(operationSend),
		semconv.MessagingDestinationName(topic),
	}
	ctx, span := t.tracer.Start(ctx, t.send.get(operationSend, topic), producerKind)
	if span.IsRecording() {
		span.SetAttributes(base[:]...)
		span.SetAttributes(semconv.MessagingOperationTypeSend)
		if len(msgs) == 1 {
			span.SetAttributes(semconv.MessagingMessageID(msgs[0].UUID))
		} else {
			span.SetAttributes(semconv.MessagingBatchMessageCount(len(msgs)))
		}
	}
	t.injectMissing(ctx, msgs)

	err := p.pub.Publish(topic, msgs...)

	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(errorType(err))
	}
	span.End()
	t.recordOperation(ctx, time.Since(start), err, base[:]...)
	if t.sent.Enabled(ctx) {
		attrs := base[:]
		if err != nil {
			attrs = append(attrs, errorType(err))
		}
		t.sent.Add(ctx, int64(len(msgs)), metric.WithAttributes(attrs...))
	}
	return err
}

// producerKind is the start option of every producer span, made once.
var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

// Close closes the wrapped Publisher.
func (p *Publisher) Close() error { return p.pub.Close() }

// Unwrap returns the wrapped Publisher.
func (p *Publisher) Unwrap() message.Publisher { return p.pub }

// carriesContext tells whether md holds a field of the propagator.
func (t *telemetry) carriesContext(md message.Metadata) bool {
	for _, f := range t.fields {
		if _, ok := md[f]; ok {
			return true
		}
	}
	return false
}

// injectMissing writes the trace context of ctx into the metadata of each
// message that carries none.
func (t *telemetry) injectMissing(ctx context.Context, msgs []*message.Message) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	for _, m := range msgs {
		if m.Metadata == nil {
			m.Metadata = message.Metadata{}
		}
		if !t.carriesContext(m.Metadata) {
			t.prop.Inject(ctx, metadataCarrier(m.Metadata))
		}
	}
}

// metadataCarrier is a propagation.TextMapCarrier on a message's
// metadata.
type metadataCarrier message.Metadata

func (c metadataCarrier) Get(key string) string { return c[key] }
func (c metadataCarrier) Set(key, value string) { c[key] = value }
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
