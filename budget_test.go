package pglease_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// TestMaxBufferedBytes: 64 partitions with a backlog of 1 MB messages and a
// budget of 16 MB. While nobody reads the channel, every partition's
// consumer would read its backlog ahead (BatchSize 100: 3 messages each,
// 192 MB); with the budget the Subscriber holds 16 MB plus at most one
// message, and the Go heap grows by about that much. Then every message
// is delivered, in order per partition, and the bytes held never exceed
// the budget by more than one message.
func TestMaxBufferedBytes(t *testing.T) {
	const (
		partitions   = 64
		perPartition = 3
		payloadSize  = 1 << 20
		budget       = 16 << 20
		// slack covers what else the heap holds meanwhile: pgx's read
		// buffers, the goroutines, the test's own bookkeeping.
		slack = 16 << 20
	)
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "big", pglease.TopicConfig{Partitions: partitions,
		Tables: adapter, InitializeSchema: true}))
	// The Publisher on a pool of its own, closed before the heap is
	// measured: pgx keeps buffers as large as the messages it sent.
	pubPool := newPool(t, 4)
	pub, err := pglease.NewPublisher(pubPool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	keys := keyPerPartition("k", partitions)
	// Compressible: the server stores a few KB per message, the Subscriber
	// receives 1 MB.
	payload := bytes.Repeat([]byte("pglease "), payloadSize/8)
	for seq := range perPartition {
		for _, k := range keys {
			msg := message.NewMessage(watermill.NewUUID(), payload)
			msg.Metadata.Set(pglease.PartitionKeyMetadata, k)
			msg.Metadata.Set("seq", strconv.Itoa(seq))
			require.NoError(t, pub.Publish("big", msg))
		}
	}

	require.NoError(t, pub.Close())
	pubPool.Close()

	heapBefore := heapAfterGC()
	sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g", MaxBufferedBytes: budget})
	msgs, err := sub.Subscribe(ctx, "big")
	require.NoError(t, err)
	var peak atomic.Int64
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), sub.Stats().BufferedBytes))
			select {
			case <-stopSampling:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()

	// Nobody reads: the consumers fill the budget and wait.
	waitFor(t, 30*time.Second, "the budget to fill up", func() bool {
		return sub.Stats().BufferedBytes >= budget-2*payloadSize
	})
	held := int64(heapAfterGC()) - int64(heapBefore)
	t.Logf("budget full: %.1f MB buffered, Go heap grew by %.1f MB (budget %d MB, backlog %d MB); %s",
		float64(sub.Stats().BufferedBytes)/(1<<20), float64(held)/(1<<20), budget>>20,
		partitions*perPartition*payloadSize>>20, peakRSS())
	assert.LessOrEqual(t, held, int64(budget+payloadSize+slack), "Go heap while the budget is full")

	last := map[string]int{}
	for n := 0; n < partitions*perPartition; n++ {
		msg := receiveOne(t, msgs)
		key := msg.Metadata.Get(pglease.PartitionKeyMetadata)
		seq, err := strconv.Atoi(msg.Metadata.Get("seq"))
		require.NoError(t, err)
		prev, ok := last[key]
		if !ok {
			prev = -1
		}
		require.Equal(t, prev+1, seq, "key %s: message %d after %d", key, seq, prev)
		require.Equal(t, len(payload), len(msg.Payload))
		last[key] = seq
		msg.Ack()
	}
	for _, k := range keys {
		assert.Equal(t, perPartition-1, last[k], "key %s", k)
	}
	close(stopSampling)
	<-sampled
	// The metadata of a message is about 60 bytes of JSON.
	assert.LessOrEqual(t, peak.Load(), int64(budget+payloadSize+1024), "bytes held beyond the budget and one message")
	t.Logf("peak buffered %.2f MB of a %d MB budget", float64(peak.Load())/(1<<20), budget>>20)
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

// TestMaxBufferedBytesValidation: a negative budget is refused, naming the
// field.
func TestMaxBufferedBytesValidation(t *testing.T) {
	parallel(t)
	pool := newPool(t, 1)
	_, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{MaxBufferedBytes: -1}, nil)
	require.ErrorIs(t, err, pglease.ErrInvalidConfig)
	require.ErrorContains(t, err, "SubscriberConfig.MaxBufferedBytes")
}

// peakRSS reads the process's peak resident set size (Linux).
func peakRSS() string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "peak RSS unknown"
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return fmt.Sprintf("peak RSS of the test process %s", strings.TrimSpace(v))
		}
	}
	return "peak RSS unknown"
}

// TestMessagesLargerThanAReadAreDelivered: a message larger than what one
// read reserves (an eighth of the budget: 8 MiB by default), or than the
// whole budget, is delivered, in order, and its partition goes on after
// it: the consumer learns its size from a first read and reserves exactly
// that much for a second one.
func TestMessagesLargerThanAReadAreDelivered(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64 // 0: DefaultMaxBufferedBytes
		sizes  []int
	}{
		{name: "default budget", sizes: []int{9 << 20, 100, 20 << 20, 100}},
		{name: "larger than the budget", budget: 1 << 20, sizes: []int{3 << 20, 100, 2 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t, 10)
			adapter := newSchema(t, pool)
			// The Publisher on a pool of its own: pgx keeps buffers as
			// large as the messages it sent.
			pubPool := newPool(t, 2)
			pub := newPublisher(t, pubPool, adapter)
			var ids []string
			for _, size := range tc.sizes {
				// Compressible: the server stores a few KB, the
				// Subscriber receives size bytes.
				msg := message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("p"), size))
				require.NoError(t, pub.Publish("big", msg))
				ids = append(ids, msg.UUID)
			}
			sub := newTestSubscriber(t, pool, adapter, pglease.SubscriberConfig{ConsumerGroup: "g",
				MaxBufferedBytes: tc.budget})
			msgs, err := sub.Subscribe(ctx, "big")
			require.NoError(t, err)
			for i, size := range tc.sizes {
				msg := receiveWithin(t, msgs, 10*time.Second, "message %d of %d bytes", i, size)
				require.Equal(t, ids[i], msg.UUID, "message %d", i)
				require.Len(t, msg.Payload, size, "message %d", i)
				msg.Ack()
			}
			// The partition goes on after them.
			after := publishN(t, pub, "big", 1)
			msg := receiveWithin(t, msgs, 10*time.Second, "a message published after the large ones")
			require.Equal(t, after[0], msg.UUID)
			msg.Ack()
			require.NoError(t, sub.Close())
			assert.Zero(t, sub.Stats().BufferedBytes, "bytes held after Close")
		})
	}
	assertNoLeakedGoroutines(t)
}

// receiveWithin returns the next message, or fails the test, naming what it
// waited for, when none arrives within timeout.
func receiveWithin(t *testing.T, msgs <-chan *message.Message, timeout time.Duration, what string, args ...any) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(timeout):
		t.Fatalf("no message within %s: %s", timeout, fmt.Sprintf(what, args...))
		return nil
	}
}

// TestSelectMessagesTakesAnyBound: the read's bound on the size of a
// message sent whole is a bigint: no bound (math.MaxInt64) and a bound past
// 2 GiB are accepted, and a message within the bound comes whole.
func TestSelectMessagesTakesAnyBound(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 2)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), make([]byte, 100))))
	read := func(bound int64) (pgsql.SelectResult, error) {
		return driverOf(adapter).SelectMessages(ctx, pool, pgsql.SelectMessagesParams{
			Topic: "t", Limit: 10, MaxMessageBytes: bound, Here: serverHere(t, pool)})
	}
	// The message is read once no older transaction runs on the server
	// (the parallel tests run theirs): wait until it is, then read it
	// with each bound.
	waitFor(t, 30*time.Second, "the message to be readable", func() bool {
		res, err := read(0)
		return err == nil && len(res.Messages) == 1
	})
	for _, bound := range []int64{0, 3 << 30, 50} {
		res, err := read(bound)
		require.NoError(t, err, "bound %d", bound)
		require.False(t, res.WentBack, "bound %d", bound)
		require.Len(t, res.Messages, 1, "bound %d", bound)
		whole := bound != 50
		assert.Equal(t, whole, res.Messages[0].Payload != nil, "bound %d: payload sent", bound)
	}
}
