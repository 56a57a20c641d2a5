// Package otel traces and measures pglease with OpenTelemetry: one trace
// from the request that publishes a message, through PostgreSQL, to the
// handler that consumes it, and the messaging metrics. It is a module of
// its own (github.com/pglease/watermill-pglease/otel), so that the core
// module does not depend on OpenTelemetry.
//
// It follows the OpenTelemetry messaging semantic conventions of
// semconv v1.43.0 (go.opentelemetry.io/otel v1.46.0; the messaging
// conventions are still in development): messaging.system is "pglease".
//
// # Wiring
//
// Wrap the Publisher and pass the Subscriber's config through
// [Instrument]; everything else stays as it is:
//
//	pub := pgleaseotel.WrapPublisher(publisher)
//	sub, err := pglease.NewSubscriber(pool, pgleaseotel.Instrument(pglease.SubscriberConfig{ConsumerGroup: "billing"}), logger)
//
// Instrument sets the config's OnDelivery hook, which the Subscriber
// calls on its own goroutine as it hands each message out and as it sees
// the message's Ack or Nack. For a Subscriber made elsewhere,
// [WrapSubscriber] does the same from outside, at the cost of a
// goroutine that forwards each message (see "Cost").
//
// By default the wrappers take the global TracerProvider, MeterProvider
// and propagator (read when the wrapper is made); [WithTracerProvider],
// [WithMeterProvider] and [WithPropagator] set others. When no global
// propagator was set (OpenTelemetry's global default propagates nothing),
// the wrappers use W3C trace context (propagation.TraceContext:
// traceparent and tracestate), so that consumer spans link to the
// producer's without any set-up.
//
// # Publishing
//
// Each Publish call is a PRODUCER span "send <topic>", a child of the
// first message's context (msg.SetContext(r.Context()) in an HTTP
// handler), that lasts as long as the wrapped Publish: for a Publisher
// on a pool, until the group commit that holds the messages committed.
// It carries messaging.operation.name and .type "send",
// messaging.destination.name (the topic), and messaging.message.id (one
// message) or messaging.batch.message_count (several). The span's
// context is written into every message's metadata (traceparent,
// tracestate), so it is stored with the message: it survives a restart,
// a delay (Watermill's components/delay metadata), a poison queue and a
// replay (admin.Inspector.Replay). A message that carries a context
// already keeps it: a consumed message that a handler or the PoisonQueue
// middleware publishes again stays linked to where it was created.
//
// # Consuming
//
// Each delivery is a CONSUMER span "process <topic>" with a link to the
// producer's span, in a trace of its own (the conventions' advice: a
// message may wait long, be consumed by many groups and be delivered
// again); [WithProducerAsParent] makes it a child of the producer's span
// instead. The span is put into the message's context, so the handler's
// own spans, and those of a pgx pool traced with otelpgx, nest under it.
// It carries messaging.operation.name and .type "process",
// messaging.destination.name, messaging.destination.partition.id,
// messaging.consumer.group.name, messaging.message.id (the UUID),
// messaging.client.id (the Subscriber's session id), and pglease's
// pglease.position.transaction_id, pglease.position.offset, pglease.epoch
// (the claim's fencing token) and pglease.delivery.attempt. The span
// ends when the message is settled: an event "ack" or "nack" (operation
// type settle; a Nack sets the status to error), or "unsettled" when the
// delivery ended first, with pglease.unsettled.reason: the subscription
// ended, the topic's ownership was lost, or it was handed over to
// another member of the group.
//
// [Middleware] is the Router's side: behind a traced Subscriber it
// records the handler's error on the span; behind any other Subscriber it
// makes the span itself, around the handler. Either way, messages the
// handler returns without a span get the message's, so the Router's
// publishing of them (through a wrapped Publisher) is part of the trace.
//
// [TxHandler] is pglease.TxHandler with its transaction in a span
// "tx_handler <topic>" from BEGIN to COMMIT or ROLLBACK, the handler's
// statements inside it; [AckInTx] is pglease.AckInTx in a span
// "ack_in_tx <topic>".
//
// # Metrics
//
// Of the conventions, with their names, units and advised buckets:
//
//	messaging.client.operation.duration  s          send (a Publish call), ack_in_tx, tx_handler
//	messaging.client.sent.messages       {message}  messages of Publish calls
//	messaging.client.consumed.messages   {message}  deliveries
//	messaging.process.duration           s          from delivery to Ack or Nack (error.type "nack"
//	                                                 or "unsettled"); with Middleware alone, the handler
//
// Failed operations carry error.type. [RegisterInspector] adds the gauges
// the metrics module exports to Prometheus, from the same
// admin.Inspector queries: pglease.consumer_group.lag,
// pglease.consumer_group.lag.age, pglease.xmin_horizon.age and
// pglease.xmin_horizon.age_known.
//
// # Cost
//
// With OpenTelemetry's no-op tracer provider (trace/noop) and no reader
// of the consumer metrics there is nothing to record: [Instrument]'s hook
// and the [Middleware] leave the message as it is, [WrapSubscriber]
// returns the wrapped Subscriber's channel, and [WrapPublisher] only
// writes the trace context of the first message's span, if it has one,
// into the metadata. [WithProducerAsParent] still puts the producer's
// context into the handler's (the no-op tracer's spans carry their
// parent's context), at the cost of one span context per delivery.
// Measured by make bench-otel (BenchmarkOverhead: 30 rounds, each
// consuming 20,000 stored messages and publishing 20,000 one per call
// from 8 goroutines with and without the module, on PostgreSQL with
// fsync on, the median of the rounds' ratios) on a 2-core machine: a
// delivery +0.8 % with Instrument, +2.4 % with WrapSubscriber; a Publish
// −0.3 % (noise) with WrapPublisher; the process's CPU time per message
// +1.5 %, −2.2 % and −0.1 %. Within a round both sides see the same
// load; a single round's ratio still spreads by ±20 %.
//
// With a tracer that records, each delivery through Instrument costs a
// span: about 3 µs and 14 allocations with the SDK sampling every span
// into no exporter, most of it the SDK's; WrapSubscriber adds about 1 µs
// more, the hop through its goroutine, so prefer Instrument when you
// make the *pglease.Subscriber. The global provider of an application
// that installed none is a no-op too but cannot be told from a real one:
// 0.45 µs and 4 allocations per delivery; pass
// WithTracerProvider(noop.NewTracerProvider()) to pay nothing. Measured
// by BenchmarkWrapperConsume (no I/O; variants -global and -recording).
//
//	make bench-otel
//	go test -run '^$' -bench 'Wrapper' -count 5 ./otel
package otel
