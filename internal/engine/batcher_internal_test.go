package engine

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
)

// TestBatcherCombinesCallersThatWriteAgain: callers that write in a loop
// go into the same combined writes, round after round, rather than the
// first one back writing alone and the others behind it. On one processor
// the order is forced: a combined write readies its callers, and only the
// worker's yield lets them write again before it takes the next write.
func TestBatcherCombinesCallersThatWriteAgain(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const callers, rounds = 8, 50
	var (
		mu    sync.Mutex
		sizes []int
	)
	record := func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
	}
	// A write parks its goroutine as a round trip to the server does.
	write := func() { time.Sleep(200 * time.Microsecond) }
	b := &batcher[int]{
		workers:  4,
		maxCount: 1000,
		one:      func(context.Context, int) error { record(1); write(); return nil },
		many: func(_ context.Context, items []int) ([]error, error) {
			record(len(items))
			write()
			return nil, nil
		},
		what:   "test",
		logger: watermill.NopLogger{},
	}
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := b.do(context.Background(), 1, 1, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.wait()

	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range sizes {
		total += n
	}
	require.Equal(t, callers*rounds, total)
	// Every caller writes rounds times; all of them together need at
	// least rounds writes. Alternating writes of one and of the rest
	// would take about twice as many.
	require.LessOrEqual(t, len(sizes), rounds+rounds/5,
		"%d writes for %d rounds of %d callers: %v", len(sizes), rounds, callers, sizes)
}
