package pglease_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestManyTopicsInOneProcess subscribes one Subscriber to many topics at
// once (PGLEASE_TEST_TOPICS, default 10,000; `make scale` runs 100,000) and
// measures how long until all are claimed, the Go heap per subscribed idle
// topic after GC, the statements per second while idle, and how long Close
// takes.
func TestManyTopicsInOneProcess(t *testing.T) {
	topics := 10000
	if v := os.Getenv("PGLEASE_TEST_TOPICS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		topics = n
	}
	pool := newPool(t, 20)
	adapter := newSchema(t, pool)
	ctx := context.Background()
	stats := newStatements(t, pool, adapter)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "g",
		SessionTTL:       3 * time.Second,
		InitializeSchema: true,
		SchemaAdapter:    adapter,
	}, testLogger())
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize("warm-up"))

	heapBefore := heapAfterGC()
	began := time.Now()
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := 0; i < topics; i++ {
		_, err := sub.Subscribe(subCtx, fmt.Sprintf("many-%06d", i))
		require.NoError(t, err)
	}
	subscribed := time.Since(began)
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	waitFor(t, 5*time.Minute, fmt.Sprintf("%d topics to be claimed", topics), func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, testQuery+"SELECT count(*) FROM "+offsets+" WHERE session_id IS NOT NULL").Scan(&n))
		return n == topics
	})
	claimed := time.Since(began)
	heapHeld := heapAfterGC()
	perTopic := float64(int64(heapHeld)-int64(heapBefore)) / float64(topics)

	statsBefore := stats.snapshot(t)
	start := time.Now()
	time.Sleep(11 * time.Second) // a window that catches every timer: measured, not asserted on timing
	elapsed := time.Since(start)
	statsAfter := stats.snapshot(t)
	d := statsAfter.minus(statsBefore)

	closeStart := time.Now()
	require.NoError(t, sub.Close())
	t.Logf("%d topics: Subscribe calls %s, all claimed after %s; Go heap %.0f bytes per topic (%d goroutines); idle: %d statements in %s (%.2f/s, %.1f ms/s of server time); Close %s",
		topics, subscribed.Round(time.Millisecond), claimed.Round(time.Millisecond), perTopic, runtime.NumGoroutine(),
		d.calls, elapsed.Round(time.Millisecond), float64(d.calls)/elapsed.Seconds(), d.execMs/elapsed.Seconds(),
		time.Since(closeStart).Round(time.Millisecond))
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}
