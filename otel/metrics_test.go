package otel_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/otel"
)

// TestMetrics publishes and consumes through the wrappers (the
// Subscriber's config through Instrument, or the Subscriber through
// WrapSubscriber) and reads the conventions' instruments and the
// Inspector's gauges; after Close no goroutine is left.
func TestMetrics(t *testing.T) {
	t.Run("Instrument", func(t *testing.T) { testMetrics(t, false) })
	t.Run("WrapSubscriber", func(t *testing.T) { testMetrics(t, true) })
}

func testMetrics(t *testing.T, wrap bool) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, testDSN, 0)
	tables := pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_otel_test_")}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	opts := []otel.Option{otel.WithMeterProvider(mp), otel.WithTracerProvider(tp)}

	rawPub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	pub := otel.WrapPublisher(rawPub, opts...)
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil), message.NewMessage(watermill.NewUUID(), nil)))
	require.NoError(t, pub.Close())

	before := runtime.NumGoroutine()
	subCfg := pglease.SubscriberConfig{ConsumerGroup: "g", Tables: tables, CommitBatch: 1}
	if !wrap {
		subCfg = otel.Instrument(subCfg, opts...)
	}
	rawSub, err := pglease.NewSubscriber(pool, subCfg, nil)
	require.NoError(t, err)
	var sub message.Subscriber = rawSub
	if wrap {
		sub = otel.WrapSubscriber(rawSub, opts...)
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(subCtx, "t")
	require.NoError(t, err)
	for range 2 {
		select {
		case m := <-ch:
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("no message")
		}
	}
	insp, err := admin.NewInspector(pool, tables)
	require.NoError(t, err)
	reg, err := otel.RegisterInspector(insp, otel.InspectorConfig{}, opts...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, reg.Unregister()) }()

	var rm metricdata.ResourceMetrics
	pgtest.WaitFor(t, 10*time.Second, "both process durations", func() bool {
		require.NoError(t, reader.Collect(ctx, &rm))
		return sumOf(rm, "messaging.process.duration") == 2
	})
	assert.Equal(t, int64(2), sumOf(rm, "messaging.client.sent.messages"))
	assert.Equal(t, int64(2), sumOf(rm, "messaging.client.consumed.messages"))
	assert.Equal(t, int64(1), sumOf(rm, "messaging.client.operation.duration"), "one Publish call")
	assert.True(t, has(rm, otel.LagMetric), "the lag gauge")
	assert.True(t, has(rm, otel.HorizonAgeKnownMetric), "the horizon gauge")

	require.NoError(t, sub.Close())
	pgtest.WaitFor(t, 10*time.Second, "the goroutines to end after Close", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// sumOf is the sum of a counter, or the count of a histogram.
func sumOf(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					n += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					n += int64(p.Count)
				}
			}
		}
	}
	return n
}

func has(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}
