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
	pool    *pgxpool.Pool
	driver  *pgsql.Lazy
	batcher batcher[pgsql.InsertMessagesParams]
}

// NewGroupCommitter returns the group commit of a Publisher on pool.
func NewGroupCommitter(pool *pgxpool.Pool, driver *pgsql.Lazy, logger watermill.LoggerAdapter) *GroupCommitter {
	g := &GroupCommitter{pool: pool, driver: driver}
	g.batcher = batcher[pgsql.InsertMessagesParams]{
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
	bytes := 0
	for _, p := range params.Payloads {
		bytes += len(p)
	}
	return g.batcher.do(ctx, params, len(params.UUIDs), bytes)
}

// Wait returns once no worker runs; the Publisher calls it after the last
// Publish call returned.
func (g *GroupCommitter) Wait() { g.batcher.wait() }

func (g *GroupCommitter) insert(ctx context.Context, params pgsql.InsertMessagesParams) error {
	return Insert(ctx, g.pool, g.driver, params)
}

// insertMany writes the calls with one statement: all of them are stored,
// or none.
func (g *GroupCommitter) insertMany(ctx context.Context, calls []pgsql.InsertMessagesParams) ([]error, error) {
	combined := pgsql.InsertMessagesParams{NotifyChannel: calls[0].NotifyChannel}
	keyed := false
	for _, p := range calls {
		keyed = keyed || p.PartitionHashes != nil
	}
	for _, p := range calls {
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
	return nil, Insert(ctx, g.pool, g.driver, combined)
}
