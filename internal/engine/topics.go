package engine

import (
	"context"
	"fmt"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Insert stores the messages of params with d, on db: a pool, a
// connection or a transaction.
func Insert(ctx context.Context, db pgsql.Querier, d pgsql.Driver, params pgsql.InsertMessagesParams) error {
	if err := d.InsertMessages(ctx, db, params); err != nil {
		return check.MissingSchema(err)
	}
	return nil
}

// InsertKeyed is Insert, and returns the indexes of the messages left out
// because their idempotency keys were stored already.
func InsertKeyed(ctx context.Context, db pgsql.Querier, d pgsql.Driver, params pgsql.InsertMessagesParams) ([]int, error) {
	skipped, err := d.InsertKeyed(ctx, db, params)
	if err != nil {
		return nil, check.MissingSchema(err)
	}
	return skipped, nil
}

// TopicPartitions reads the partition counts of topics.
func TopicPartitions(ctx context.Context, db pgsql.Querier, t pgsql.Driver, topics []string) (map[string]int, error) {
	out, err := t.TopicPartitions(ctx, db, topics)
	if err != nil {
		return nil, fmt.Errorf("read partition counts: %w", check.MissingSchema(err))
	}
	return out, nil
}
