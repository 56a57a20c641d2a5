package otel

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the tracer and the meter this
// package takes from its providers.
const ScopeName = "github.com/pglease/watermill-pglease/otel"

// System is the value of messaging.system on every span and measurement.
const System = "pglease"

// Attribute keys of pglease's own, beside the messaging conventions'.
const (
	// PositionTransactionIDKey and PositionOffsetKey are the message's
	// position in its partition ([pglease.Position]).
	PositionTransactionIDKey = attribute.Key("pglease.position.transaction_id")
	PositionOffsetKey        = attribute.Key("pglease.position.offset")
	// EpochKey is the fencing token of the claim under which the message
	// was delivered ([pglease.MessageDelivery].Epoch).
	EpochKey = attribute.Key("pglease.epoch")
	// DeliveryAttemptKey is the delivery attempt the Subscriber counted
	// ([pglease.DeliveryAttemptMetadata]).
	DeliveryAttemptKey = attribute.Key("pglease.delivery.attempt")
	// TxOutcomeKey says how the transaction of a [TxHandler] ended:
	// "commit" or "rollback".
	TxOutcomeKey = attribute.Key("pglease.tx.outcome")
	// UnsettledReasonKey, on the event "unsettled" of a consumer span,
	// says why the delivery ended before its message was acked or nacked
	// (the error SubscriberConfig.OnDelivery reports).
	UnsettledReasonKey = attribute.Key("pglease.unsettled.reason")
)

// Operation names (messaging.operation.name) beside the conventional
// send and process.
const (
	operationSend     = "send"
	operationProcess  = "process"
	operationAck      = "ack"
	operationNack     = "nack"
	operationAckInTx  = "ack_in_tx"
	operationTxHandle = "tx_handler"

	// eventUnsettled names the event of a delivery that ended before its
	// message was acked or nacked, and is its error.type.
	eventUnsettled = "unsettled"
)

// durationBuckets are the bucket bounds, in seconds, that the messaging
// conventions advise for their duration histograms.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Option configures [WrapPublisher], [Instrument], [WrapSubscriber],
// [Middleware], [TxHandler], [AckInTx] and [RegisterInspector].
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	prop     propagation.TextMapPropagator
	parented bool
}

// WithTracerProvider sets the provider of the tracer. Default: the global
// one (otel.GetTracerProvider), read when the wrapper is made.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the provider of the meter. Default: the global
// one (otel.GetMeterProvider), read when the wrapper is made.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets the propagator that writes the trace context into
// each published message's metadata and reads it back on delivery.
// Default: the global one (otel.GetTextMapPropagator), read when the
// wrapper is made; when none was set globally (OpenTelemetry's global
// default propagates nothing), propagation.TraceContext{}: W3C
// traceparent and tracestate. Set Baggage (a composite propagator) here
// or globally if wanted.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithProducerAsParent makes each consumer span a child of the producer's
// span (one trace from the publishing request to the handler) instead of
// the root of a trace of its own that links to it, the default, which
// the messaging conventions recommend: a message may be consumed long
// after, many times, by many groups. The link is there either way.
func WithProducerAsParent() Option {
	return func(c *config) { c.parented = true }
}

// telemetry is what the options make: the tracer, the propagator and the
// instruments. Safe for concurrent use.
type telemetry struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	fields   []string // prop.Fields(), read once
	parented bool
	// process and send are the span names "process <topic>" and
	// "send <topic>".
	process, send spanNames
	// noop: tracer is OpenTelemetry's no-op tracer, whose spans are
	// their parent's span context and record nothing.
	noop bool

	meter           metric.Meter
	opDuration      metric.Float64Histogram
	sent            metric.Int64Counter
	consumed        metric.Int64Counter
	processDuration metric.Float64Histogram
}

func newTelemetry(opts []Option) *telemetry {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otelapi.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otelapi.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = otelapi.GetTextMapPropagator()
		if len(c.prop.Fields()) == 0 {
			// No global propagator was set: the global one writes and
			// reads nothing, which would leave every consumer span
			// without its link to the producer's span.
			c.prop = propagation.TraceContext{}
		}
	}
	t := &telemetry{
		tracer:   c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:     c.prop,
		fields:   c.prop.Fields(),
		parented: c.parented,
		meter:    c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
	}
	_, t.noop = t.tracer.(tracenoop.Tracer)
	// On error the constructors return a no-op instrument; the error goes
	// to the global error handler, as OpenTelemetry's instrumentations do.
	buckets := metric.WithExplicitBucketBoundaries(durationBuckets...)
	opDuration, err := messagingconv.NewClientOperationDuration(t.meter, buckets)
	handle(err)
	sent, err := messagingconv.NewClientSentMessages(t.meter)
	handle(err)
	consumed, err := messagingconv.NewClientConsumedMessages(t.meter)
	handle(err)
	processDuration, err := messagingconv.NewProcessDuration(t.meter, buckets)
	handle(err)
	t.opDuration, t.sent, t.consumed, t.processDuration = opDuration.Inst(), sent.Inst(), consumed.Inst(), processDuration.Inst()
	return t
}

func handle(err error) {
	if err != nil {
		otelapi.Handle(err)
	}
}

// maxCachedSpanNames bounds spanNames: a Subscriber of more topics than
// that makes the names of the others for each delivery.
const maxCachedSpanNames = 4096

// spanNames caches "<operation> <topic>" per topic, so that a delivery
// does not make its span's name (an allocation in the path of every
// message, even for a no-op tracer).
type spanNames struct {
	m sync.Map // topic → name
	n atomic.Int32
}

func (s *spanNames) get(operation, topic string) string {
	if name, ok := s.m.Load(topic); ok {
		return name.(string)
	}
	name := operation + " " + topic
	if s.n.Load() < maxCachedSpanNames {
		if _, loaded := s.m.LoadOrStore(topic, name); !loaded {
			s.n.Add(1)
		}
	}
	return name
}

// seconds is d in seconds, as the duration histograms take it.
func seconds(d time.Duration) float64 { return d.Seconds() }

// errorType is error.type of a failed operation.
func errorType(err error) attribute.KeyValue { return semconv.ErrorType(err) }

// recordOperation records messaging.client.operation.duration of one
// operation, when a reader wants it.
func (t *telemetry) recordOperation(ctx context.Context, d time.Duration, err error, attrs ...attribute.KeyValue) {
	if !t.opDuration.Enabled(ctx) {
		return
	}
	if err != nil {
		attrs = append(attrs, errorType(err))
	}
	t.opDuration.Record(ctx, seconds(d), metric.WithAttributes(attrs...))
}
