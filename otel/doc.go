// Package otel traces and measures pglease with OpenTelemetry: one trace
// from the request that publishes a message, through PostgreSQL, to the
// handler that consumes it, and the messaging metrics. It is a module of
// its own (github.com/pglease/watermill-pglease/otel), so that the core
// module does not depend on OpenTelemetry.
//
// It follows the OpenTelemetry messaging semantic conventions of
// semconv v1.43.0 (go.opentelemetry.io/otel v1.47.0; the messaging
// conventions are still in development): messaging.system is "pglease".
//
// # Wiring
//
// Wrap the Publisher and pass the Subscriber's config through
// [Instrument]; everything else stays as it is:
//
//	otel.SetTextMapPropagator(propagation.TraceContext{}) // once, or otel.WithPropagator
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
// [WithMeterProvider] and [WithPropagator] set others. The global
// propagator propagates nothing until one is set: set
// propagation.TraceContext{} (W3C traceparent and tracestate).
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
// On no-op providers, [Instrument] adds 0.2 to 0.8 µs to a delivery, on
// the Subscriber's goroutine (three allocations: the span's context, its
// record, the settled func); [WrapSubscriber] adds 1 to 1.6 µs, most of
// it the hop through its goroutine; [WrapPublisher] adds 0.5 to 0.9 µs
// to a Publish call. Measured with BenchmarkWrapperConsume and
// BenchmarkWrapperPublish (instrumented or wrapped against bare, no I/O)
// on a shared 2-core machine under a load average of 4 to 6. Against
// PostgreSQL that is 1 to 2 % of a Publish (40 to 50 µs each under the
// group commit, BenchmarkPublish), and for a delivery in a tight loop
// that does nothing else (6 to 9 µs, BenchmarkConsume) 2 to 13 % with
// Instrument, 11 to 27 % with WrapSubscriber; BenchmarkConsume's own
// spread under that load (±25 %) is larger than the difference, and its
// medians put instrumented 12 to 16 % and wrapped 34 to 87 % above bare.
// Middleware alone costs no goroutine hop. When the span does not
// record and process.duration is not measured, Instrument returns no
// settled func and WrapSubscriber waits for no settlement.
//
//	go test -run '^$' -bench 'Wrapper|Publish|Consume' -count 5 ./otel
package otel
