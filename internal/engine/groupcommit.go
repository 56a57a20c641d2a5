package engine

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Limits of one group-committed statement.
const (
	groupMaxMessages = 1000
	groupMaxBytes    = 8 << 20
	groupMaxWorkers  = 4
)

// GroupCommitter writes concurrent Publish calls on a pool together: calls
// that arrive while earlier statements run share the next INSERT (see
// batcher). Up to groupMaxWorkers statements, and half the pool's
// connections, run side by side.
type GroupCommitter struct {
	// write stores the messages of one statement and returns the
	// indexes of those left out for their idempotency keys.
	write   func(ctx context.Context, p pgsql.InsertMessagesParams) ([]int, error)
	batcher batcher[groupCall]
}

// groupCall is one Publish call of a group commit.
type groupCall struct {
	params pgsql.InsertMessagesParams
	// skipped receives the indexes of the call's messages left out
	// because their idempotency keys were stored already; the worker
	// sets it before it reports the call's outcome.
	skipped *[]int
}

// NewGroupCommitter returns the group commit of a Publisher on pool.
func NewGroupCommitter(pool *pgxpool.Pool, driver *pgsql.Lazy, logger watermill.LoggerAdapter) *GroupCommitter {
	return newGroupCommitter(pool, func(ctx context.Context, p pgsql.InsertMessagesParams) ([]int, error) {
		return InsertKeyed(ctx, pool, driver, p)
	}, logger)
}

// newGroupCommitter returns a group commit on pool that writes with write.
func newGroupCommitter(pool *pgxpool.Pool, write func(context.Context, pgsql.InsertMessagesParams) ([]int, error),
	logger watermill.LoggerAdapter) *GroupCommitter {
	g := &GroupCommitter{write: write}
	g.batcher = batcher[groupCall]{
		workers:  max(1, min(groupMaxWorkers, int(pool.Config().MaxConns)/2)),
		maxCount: groupMaxMessages,
		maxBytes: groupMaxBytes,
		one:      g.insert,
		many:     g.insertMany,
		what:     "Group commit",
		logger:   logger,
	}
	return g
}

// Publish writes params, alone or with other calls, and returns once they
// are committed or failed.
func (g *GroupCommitter) Publish(ctx context.Context, params pgsql.InsertMessagesParams) error {
	_, err := g.PublishKeyed(ctx, params)
	return err
}

// PublishKeyed is Publish, and returns the indexes of the messages of
// params left out because their idempotency keys were stored already (by
// an earlier statement, or by a call written before this one in the same
// statement).
func (g *GroupCommitter) PublishKeyed(ctx context.Context, params pgsql.InsertMessagesParams) ([]int, error) {
	bytes := 0
	for _, p := range params.Payloads {
		bytes += len(p)
	}
	var skipped []int
	if err := g.batcher.do(ctx, groupCall{params: params, skipped: &skipped}, len(params.UUIDs), bytes); err != nil {
		return nil, err
	}
	return skipped, nil
}

// Wait returns once no worker runs; the Publisher calls it after the last
// Publish call returned.
func (g *GroupCommitter) Wait() { g.batcher.wait() }

func (g *GroupCommitter) insert(ctx context.Context, c groupCall) error {
	skipped, err := g.write(ctx, c.params)
	*c.skipped = skipped
	return err
}

// insertMany writes the calls with one statement: all of them are stored,
// or none.
func (g *GroupCommitter) insertMany(ctx context.Context, groupCalls []groupCall) ([]error, error) {
	calls := make([]pgsql.InsertMessagesParams, len(groupCalls))
	for i, c := range groupCalls {
		calls[i] = c.params
	}
	keyed, withKeys, n := false, false, 0
	for _, p := range calls {
		keyed = keyed || p.PartitionHashes != nil
		withKeys = withKeys || p.Keys != nil
		n += len(p.UUIDs)
	}
	// Sized once: the calls' messages are appended, not grown into.
	combined := pgsql.InsertMessagesParams{NotifyChannel: calls[0].NotifyChannel, Topics: make([]string, 0, n),
		UUIDs: make([]string, 0, n), Payloads: make([][]byte, 0, n), Metadata: make([]string, 0, n)}
	if keyed {
		combined.PartitionHashes = make([]uint32, 0, n)
	}
	if withKeys {
		combined.Keys = make([]string, 0, n)
	}
	for _, p := range calls {
		if withKeys { // "": no idempotency key
			combined.Keys = append(combined.Keys, p.Keys...)
			combined.Keys = append(combined.Keys, make([]string, len(p.UUIDs)-len(p.Keys))...)
		}
		combined.Topics = append(combined.Topics, p.Topics...)
		combined.UUIDs = append(combined.UUIDs, p.UUIDs...)
		combined.Payloads = append(combined.Payloads, p.Payloads...)
		combined.Metadata = append(combined.Metadata, p.Metadata...)
		switch {
		case !keyed:
		case p.PartitionHashes != nil:
			combined.PartitionHashes = append(combined.PartitionHashes, p.PartitionHashes...)
		default: // a call without keys next to one with: placed by UUID here
			for _, u := range p.UUIDs {
				combined.PartitionHashes = append(combined.PartitionHashes, KeyHash(u))
			}
		}
	}
	skipped, err := g.write(ctx, combined)
	if err != nil {
		return nil, err
	}
	// The indexes in combined, in order, back to each call's own.
	start := 0
	for _, c := range groupCalls {
		end := start + len(c.params.UUIDs)
		for len(skipped) > 0 && skipped[0] < end {
			*c.skipped = append(*c.skipped, skipped[0]-start)
			skipped = skipped[1:]
		}
		start = end
	}
	return nil, nil
}
