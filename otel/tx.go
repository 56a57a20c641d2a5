package otel

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	pglease "github.com/pglease/watermill-pglease"
)

// settleAttrs are the attributes of an operation that settles msg.
func settleAttrs(msg *message.Message, operation string) (topic string, attrs []attribute.KeyValue) {
	attrs = []attribute.KeyValue{
		semconv.MessagingSystemKey.String(System),
		semconv.MessagingOperationName(operation),
	}
	if d, ok := pglease.MessageDeliveryFromCtx(msg.Context()); ok {
		topic = d.Topic
		attrs = append(attrs, semconv.MessagingDestinationName(d.Topic),
			semconv.MessagingConsumerGroupName(d.ConsumerGroup),
			semconv.MessagingDestinationPartitionID(itoa32(d.Partition)))
	}
	return topic, attrs
}

// AckInTx is [pglease.AckInTx] in a CLIENT span "ack_in_tx <topic>" (a
// settle operation), a child of ctx: pass the context of the transaction's
// span, or the message's. Its duration is recorded in
// messaging.client.operation.duration. The options are read on every
// call.
func AckInTx(ctx context.Context, tx pgx.Tx, msg *message.Message, opts ...Option) error {
	return newTelemetry(opts).ackInTx(ctx, tx, msg)
}

func (t *telemetry) ackInTx(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	if msg == nil {
		return pglease.AckInTx(ctx, tx, msg)
	}
	start := time.Now()
	topic, attrs := settleAttrs(msg, operationAckInTx)
	ctx, span := t.tracer.Start(ctx, operationAckInTx+" "+topic, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrs...),
		trace.WithAttributes(semconv.MessagingOperationTypeSettle, semconv.MessagingMessageID(msg.UUID)))
	err := pglease.AckInTx(ctx, tx, msg)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(errorType(err))
	}
	span.End()
	t.recordOperation(ctx, time.Since(start), err, attrs...)
	return err
}

// TxHandler is [pglease.TxHandler] with its transaction in an INTERNAL
// span "tx_handler <topic>", a child of the message's span, from BEGIN
// to COMMIT or ROLLBACK (attribute pglease.tx.outcome): f runs with that
// span in its context, so its own spans and pgx's nest inside the
// transaction, and the messages f returns carry its trace context
// (unless they carry one already). Use it behind a Subscriber traced
// with [Instrument] or [WrapSubscriber], or behind [Middleware], as
// pglease.TxHandler.
func TxHandler(db pglease.TxBeginner, config pglease.TxHandlerConfig, f pglease.TxHandlerFunc, opts ...Option) message.NoPublishHandlerFunc {
	t := newTelemetry(opts)
	traced := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if tt, ok := tx.(*tracedTx); ok {
			ctx = trace.ContextWithSpan(ctx, tt.span)
		}
		out, err := f(ctx, tx, msg)
		if err != nil {
			return out, err
		}
		t.injectMissing(ctx, out)
		return out, nil
	}
	return pglease.TxHandler(&tracedBeginner{db: db, t: t}, config, traced)
}

// tracedBeginner begins transactions in a span.
type tracedBeginner struct {
	db pglease.TxBeginner
	t  *telemetry
}

// BeginTx implements [pglease.TxBeginner]. The span's name needs the
// message, which pglease.TxHandler does not pass: ctx is the message's
// context, which holds where the message comes from.
func (b *tracedBeginner) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	start := time.Now()
	topic := message.SubscribeTopicFromCtx(ctx)
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(System),
		semconv.MessagingOperationName(operationTxHandle),
	}
	if d, ok := pglease.MessageDeliveryFromCtx(ctx); ok {
		topic = d.Topic
		attrs = append(attrs, semconv.MessagingDestinationName(d.Topic),
			semconv.MessagingConsumerGroupName(d.ConsumerGroup),
			semconv.MessagingDestinationPartitionID(itoa32(d.Partition)))
	}
	spanCtx, span := b.t.tracer.Start(ctx, operationTxHandle+" "+topic, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...), trace.WithAttributes(semconv.MessagingOperationTypeSettle))
	tx, err := b.db.BeginTx(spanCtx, opts)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		b.t.recordOperation(ctx, time.Since(start), err, attrs...)
		return nil, err
	}
	return &tracedTx{Tx: tx, t: b.t, span: span, ctx: ctx, start: start, attrs: attrs}, nil
}

// tracedTx ends its span when the transaction ends.
type tracedTx struct {
	pgx.Tx
	t     *telemetry
	span  trace.Span
	ctx   context.Context
	start time.Time
	attrs []attribute.KeyValue
	once  sync.Once
}

// Commit implements pgx.Tx: it commits and ends the span.
func (tx *tracedTx) Commit(ctx context.Context) error {
	err := tx.Tx.Commit(ctx)
	tx.end("commit", err)
	return err
}

// Rollback implements pgx.Tx: it rolls back and ends the span (a
// Rollback after Commit changes nothing).
func (tx *tracedTx) Rollback(ctx context.Context) error {
	err := tx.Tx.Rollback(ctx)
	tx.end("rollback", nil)
	return err
}

func (tx *tracedTx) end(outcome string, err error) {
	tx.once.Do(func() {
		tx.span.SetAttributes(TxOutcomeKey.String(outcome))
		if err != nil {
			tx.span.SetStatus(codes.Error, err.Error())
		}
		tx.span.End()
		tx.t.recordOperation(tx.ctx, time.Since(tx.start), err, tx.attrs...)
	})
}

func itoa32(n int32) string { return strconv.Itoa(int(n)) }
