package otel

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	pglease "github.com/pglease/watermill-pglease"
)

// consumptionKey is the context key of the consumption of a delivered
// message, set by Instrument's hook or a wrapped Subscriber and found by
// Middleware.
type consumptionKey struct{}

// consumption is the span and measurements of one delivery, with the
// message's context and the span's start options in the same allocation.
type consumption struct {
	t     *telemetry
	span  trace.Span
	ctx   consumptionCtx       // the message's context, with span
	start time.Time            // when process.duration is measured
	attrs []attribute.KeyValue // of the process measurements
	// watched: the span records or process.duration is measured, so
	// the settlement is worth waiting for.
	watched   bool
	startOpts [2]trace.SpanStartOption
}

// consumerKind is the start option of every consumer span, made once.
var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// consumptionOf returns the consumption Instrument or WrapSubscriber started for
// the message of ctx.
func consumptionOf(ctx context.Context) (*consumption, bool) {
	c, ok := ctx.Value(consumptionKey{}).(*consumption)
	return c, ok
}

// consumptionCtx is a message's context with its consumption.
type consumptionCtx struct {
	context.Context
	c *consumption
}

func (c *consumptionCtx) Value(key any) any {
	if key == (consumptionKey{}) {
		return c.c
	}
	return c.Context.Value(key)
}

// idle reports whether a consumer span of msg and its measurements would
// be nothing: a no-op tracer (its span is the parent's), no reader of
// the consumer metrics, and no producer's context to make the parent.
// Then the message is left as it is.
func (t *telemetry) idle(msg *message.Message) bool {
	return t.consumesIdle(msg.Context()) && (!t.parented || !t.carriesContext(msg.Metadata))
}

// consumesIdle reports whether the consumer spans and measurements are
// nothing whatever the message: a no-op tracer and no reader of the
// consumer metrics.
func (t *telemetry) consumesIdle(ctx context.Context) bool {
	return t.noop && !t.consumed.Enabled(ctx) && !t.processDuration.Enabled(ctx)
}

// startProcess starts the CONSUMER span "process <topic>" of a delivered
// message, linked to (or, WithProducerAsParent, a child of) the context
// stored in its metadata, and puts it into the message's context. It
// counts the message in messaging.client.consumed.messages.
func (t *telemetry) startProcess(msg *message.Message, topic string) *consumption {
	ctx := msg.Context()
	d, fromPglease := pglease.MessageDeliveryFromCtx(ctx)
	if fromPglease {
		topic = d.Topic
	}
	var producer trace.SpanContext
	if t.carriesContext(msg.Metadata) {
		producer = trace.SpanContextFromContext(t.prop.Extract(context.Background(), metadataCarrier(msg.Metadata)))
	}
	c := &consumption{t: t}
	opts := append(c.startOpts[:0], consumerKind)
	parent := ctx
	if producer.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: producer}))
		if t.parented {
			parent = trace.ContextWithRemoteSpanContext(ctx, producer)
		}
	}
	spanCtx, span := t.tracer.Start(parent, t.process.get(operationProcess, topic), opts...)
	c.span = span
	timed := t.processDuration.Enabled(ctx)
	if timed {
		c.start = time.Now()
	}
	measured := t.consumed.Enabled(ctx) || timed
	c.watched = span.IsRecording() || timed
	if span.IsRecording() || measured {
		attrs := make([]attribute.KeyValue, 0, 12)
		attrs = append(attrs,
			semconv.MessagingSystemKey.String(System),
			semconv.MessagingOperationName(operationProcess),
			semconv.MessagingDestinationName(topic))
		if fromPglease {
			attrs = append(attrs,
				semconv.MessagingConsumerGroupName(d.ConsumerGroup),
				semconv.MessagingDestinationPartitionID(itoa32(d.Partition)))
		}
		c.attrs = attrs
		if span.IsRecording() {
			span.SetAttributes(attrs...)
			span.SetAttributes(semconv.MessagingOperationTypeProcess, semconv.MessagingMessageID(msg.UUID))
			if fromPglease {
				span.SetAttributes(
					semconv.MessagingClientID(d.SessionID.String()),
					PositionTransactionIDKey.Int64(int64(d.Position.TransactionID)),
					PositionOffsetKey.Int64(d.Position.Offset),
					EpochKey.Int64(d.Epoch))
			}
			if n, err := strconv.Atoi(msg.Metadata.Get(pglease.DeliveryAttemptMetadata)); err == nil {
				span.SetAttributes(DeliveryAttemptKey.Int(n))
			}
		}
		if t.consumed.Enabled(ctx) {
			t.consumed.Add(ctx, 1, metric.WithAttributes(c.attrs...))
		}
	}
	c.ctx = consumptionCtx{Context: spanCtx, c: c}
	msg.SetContext(&c.ctx)
	return c
}

// handlerError records the error a handler returned on the span.
func (c *consumption) handlerError(err error) {
	c.span.RecordError(err)
	c.span.SetStatus(codes.Error, err.Error())
}

// settle ends the span with the delivery's outcome, as
// SubscriberConfig.OnDelivery reports it: nil for an Ack,
// pglease.ErrNacked for a Nack, otherwise why the delivery ended first.
// It records messaging.process.duration, from delivery to settlement.
func (c *consumption) settle(err error) {
	operation := operationOf(err)
	if c.span.IsRecording() {
		if operation == "" {
			c.span.AddEvent(eventUnsettled, trace.WithAttributes(UnsettledReasonKey.String(err.Error())))
		} else {
			c.span.AddEvent(operation, trace.WithAttributes(semconv.MessagingOperationTypeSettle,
				semconv.MessagingOperationName(operation)))
		}
		if operation == operationNack {
			c.span.SetStatus(codes.Error, "nacked")
		}
	}
	c.span.End()
	if ctx := &c.ctx; !c.start.IsZero() && c.t.processDuration.Enabled(ctx) {
		d := time.Since(c.start)
		attrs := c.attrs
		if operation != operationAck {
			attrs = append(attrs[:len(attrs):len(attrs)], semconv.ErrorTypeKey.String(unsettledOr(operation)))
		}
		c.t.processDuration.Record(ctx, seconds(d), metric.WithAttributes(attrs...))
	}
}

// operationOf is the settlement operation of a delivery that ended with
// err: "ack", "nack", or "" when it ended unsettled.
func operationOf(err error) string {
	switch {
	case err == nil:
		return operationAck
	case errors.Is(err, pglease.ErrNacked):
		return operationNack
	default:
		return ""
	}
}

func unsettledOr(operation string) string {
	if operation == "" {
		return eventUnsettled
	}
	return operation
}

// Middleware returns a Router middleware that traces and measures the
// handler. Behind a Subscriber traced with [Instrument] or
// [WrapSubscriber], it records the handler's error on the message's span
// and nothing more. Behind any other Subscriber it makes the CONSUMER
// span "process <topic>" itself, linked to the producer's, around the
// handler (the message's Ack or Nack then comes after the span, and
// messaging.process.duration is the handler's). Either way, messages the
// handler returns without a span in their context get the message's
// span, so that the Router's publishing of them nests under it and
// carries its context.
//
//	router.AddMiddleware(otel.Middleware())
func Middleware(opts ...Option) message.HandlerMiddleware {
	t := newTelemetry(opts)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			c, wrapped := consumptionOf(msg.Context())
			if !wrapped && t.idle(msg) {
				produced, err := h(msg)
				withSpanOf(msg, produced)
				return produced, err
			}
			if !wrapped {
				c = t.startProcess(msg, message.SubscribeTopicFromCtx(msg.Context()))
			}
			produced, err := h(msg)
			if err != nil {
				c.handlerError(err)
			}
			withSpan(produced, c.span)
			if !wrapped {
				if err != nil {
					c.settle(pglease.ErrNacked)
				} else {
					c.settle(nil)
				}
			}
			return produced, err
		}
	}
}

// withSpan puts span into the context of the produced messages that have
// no span in theirs.
func withSpan(produced []*message.Message, span trace.Span) {
	for _, m := range produced {
		if m != nil && !trace.SpanContextFromContext(m.Context()).IsValid() {
			m.SetContext(trace.ContextWithSpan(m.Context(), span))
		}
	}
}

// withSpanOf puts the span of msg's context, if valid, into the context
// of the produced messages that have no span in theirs.
func withSpanOf(msg *message.Message, produced []*message.Message) {
	if span := trace.SpanFromContext(msg.Context()); span.SpanContext().IsValid() {
		withSpan(produced, span)
	}
}
