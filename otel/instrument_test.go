package otel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/otel"
)

// TestInstrumentKeepsTheHook: a hook the config had is called after
// Instrument's, with the span in the message's context, and its settled
// func before the span ends; a message still out at Close ends its span
// with the event "unsettled" and the reason.
func TestInstrumentKeepsTheHook(t *testing.T) {
	pool := pgtest.NewPool(t, testDSN, 0)
	tables := pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_otel_test_")}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
	require.NoError(t, pub.Close())

	var (
		sawSpan  bool
		settled  = make(chan error, 1)
		endedYet bool
	)
	own := func(msg *message.Message) func(error) {
		sawSpan = trace.SpanFromContext(msg.Context()).IsRecording()
		return func(err error) {
			endedYet = len(exp.GetSpans()) > 0
			settled <- err
		}
	}
	// DrainTimeout -1: Close does not wait for the message left out.
	cfg := otel.Instrument(pglease.SubscriberConfig{Tables: tables, OnDelivery: own, DrainTimeout: -1},
		otel.WithTracerProvider(tp))
	sub, err := pglease.NewSubscriber(pool, cfg, nil)
	require.NoError(t, err)
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	select {
	case <-ch: // neither acked nor nacked
	case <-time.After(30 * time.Second):
		t.Fatal("no message")
	}
	require.NoError(t, sub.Close())

	var ownErr error
	select {
	case ownErr = <-settled:
	default:
		t.Fatal("the hook's settled func was not called before Close returned")
	}
	assert.True(t, errors.Is(ownErr, pglease.ErrDeliveryEnded), "settled with %v", ownErr)
	assert.True(t, sawSpan, "the hook sees Instrument's span in the message's context")
	assert.False(t, endedYet, "the hook's settled func runs before the span ends")

	spans := exp.GetSpans()
	require.Len(t, spans, 1)
	require.Len(t, spans[0].Events, 1)
	ev := spans[0].Events[0]
	assert.Equal(t, "unsettled", ev.Name)
	require.Len(t, ev.Attributes, 1)
	assert.Equal(t, otel.UnsettledReasonKey, ev.Attributes[0].Key)
	assert.Equal(t, ownErr.Error(), ev.Attributes[0].Value.AsString())
}
