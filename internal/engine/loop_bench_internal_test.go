package engine

import (
	"bytes"
	"context"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// benchLoopStore is an endless partition of n messages of 64 bytes, made
// as they are read, and an offset row that takes every commit: the
// delivery loop's cost without a database.
type benchLoopStore struct {
	n       int64
	payload []byte
	keys    int // ordering keys, "k0".."k{keys-1}" in turn; 0: none
}

func (s *benchLoopStore) read(_ context.Context, p readParams) ([]storedMessage, bool, error) {
	var rows []storedMessage
	for off := p.after.Offset + 1; off <= s.n && len(rows) < p.limit; off++ {
		m := storedMessage{pos: Position{TransactionID: 1, Offset: off}, uuid: strconv.FormatInt(off, 10),
			payload: s.payload, size: int64(len(s.payload)), whole: true}
		if s.keys > 0 {
			m.metadata = `{"` + PartitionKeyMetadata + `":"k` + strconv.FormatInt(off%int64(s.keys), 10) + `"}`
		}
		rows = append(rows, m)
	}
	return rows, false, nil
}

func (*benchLoopStore) readAt(context.Context, readAtParams) ([]storedMessage, error) {
	return nil, nil
}

func (*benchLoopStore) countHead(context.Context, *claim) (int, error) { return 1, nil }

func (*benchLoopStore) commit(_ context.Context, cl *claim) error {
	cl.committed = cl.acked
	return nil
}

func (*benchLoopStore) release(*claim) error { return nil }

type benchLoopHub struct{ idle chan struct{} }

func (h benchLoopHub) setIdle(*consumer, Position) {
	select {
	case h.idle <- struct{}{}:
	default:
	}
}
func (benchLoopHub) clearIdle(*consumer) {}
func (benchLoopHub) remove(*consumer)    {}

// BenchmarkOwnLoop measures the delivery loop of one claim alone, against
// an in-memory partition: b.N messages handed out and acked by one
// handler goroutine, with the default settings (MaxInFlight 1,
// prefetching) and with MaxInFlight 8 (16 ordering keys).
func BenchmarkOwnLoop(b *testing.B) {
	for _, tc := range []struct {
		name        string
		maxInFlight int
		keys        int
	}{{"default", 1, 0}, {"inflight8", 8, 16}} {
		b.Run(tc.name, func(b *testing.B) {
			// The root package's defaults.
			cfg := Settings{BatchSize: 100, CommitBatch: 100,
				CommitInterval: 100 * time.Millisecond, PollInterval: time.Second, MaxInFlight: tc.maxInFlight}
			store := &benchLoopStore{n: int64(b.N), payload: bytes.Repeat([]byte{'x'}, 64), keys: tc.keys}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &sessionGen{id: uuid.New(), lost: make(chan struct{})}
			g.trustUntil.Store(math.MaxInt64)
			cl := &claim{group: "g", topic: "t", sessionID: g.id, g: g, epoch: 1}
			hub := benchLoopHub{idle: make(chan struct{}, 1)}
			c := &consumer{
				consumerDeps: &consumerDeps{settings: newConsumerSettings(cfg), budget: newByteBudget(64 << 20),
					store: store, hub: hub, host: fakeConsumerHost{}, stats: newSubscriberStats(nil),
					outage: newOutageLog(watermill.NopLogger{}, componentConsumers), driver: pgsql.NewLazy(pgsql.NewTables(pgsql.Names{})),
					goroutines: &sync.WaitGroup{}, prefetch: true},
				topic: "t", ctx: ctx, out: make(chan *message.Message), wake: make(chan struct{}, 1),
				yield: make(chan struct{}), logger: watermill.NopLogger{},
			}
			res := make(chan outcome, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { res <- c.own(g, cl, true) }()
			for range b.N {
				(<-c.out).Ack()
			}
			<-hub.idle // everything acked and committed
			b.StopTimer()
			cancel()
			<-res
			c.goroutines.Wait()
		})
	}
}
