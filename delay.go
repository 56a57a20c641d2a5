package pglease

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// MaxDelay bounds how far ahead a message may be delayed (Watermill's
// delay metadata): a later time is refused with [ErrInvalidMessage] and
// nothing of that Publish call is stored. Ten years, as [MaxRetention].
const MaxDelay = 10 * 365 * 24 * time.Hour

// messageDue returns the time a message is delayed until, from Watermill's
// delay metadata (delay.DelayedUntilKey, set by delay.Message, the
// DelayOnError middleware and the requeuer's users), and whether it is
// still ahead. A time that has passed, by this process's clock (the clock
// that computed it), means no delay: the message is stored at once.
func messageDue(msgMeta map[string]string, now time.Time) (time.Time, bool, error) {
	v, ok := msgMeta[delay.DelayedUntilKey]
	if !ok || v == "" {
		return time.Time{}, false, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("%w: metadata %s is not an RFC 3339 time: %q", ErrInvalidMessage, delay.DelayedUntilKey, v)
	}
	if t.Sub(now) > MaxDelay {
		return time.Time{}, false, fmt.Errorf("%w: metadata %s is more than %s ahead (pglease.MaxDelay): %q",
			ErrInvalidMessage, delay.DelayedUntilKey, MaxDelay, v)
	}
	return t, t.After(now), nil
}

// splitDelayed splits params into the messages stored now and those
// delayed (params.DueAt set for them); either may be empty. Order is kept
// within each part; nowAt and laterAt are the indexes in params of each
// part's messages.
func splitDelayed(params pgsql.InsertMessagesParams) (now, later pgsql.InsertMessagesParams, nowAt, laterAt []int) {
	if params.DueAt == nil {
		return params, pgsql.InsertMessagesParams{}, nil, nil
	}
	now = pgsql.InsertMessagesParams{NotifyChannel: params.NotifyChannel}
	later = pgsql.InsertMessagesParams{NotifyChannel: params.NotifyChannel}
	keyed := params.PartitionHashes != nil
	for i := range params.UUIDs {
		part, at := &now, &nowAt
		if !params.DueAt[i].IsZero() {
			part, at = &later, &laterAt
			part.DueAt = append(part.DueAt, params.DueAt[i])
		}
		*at = append(*at, i)
		part.Topics = append(part.Topics, params.Topics[i])
		part.UUIDs = append(part.UUIDs, params.UUIDs[i])
		part.Payloads = append(part.Payloads, params.Payloads[i])
		part.Metadata = append(part.Metadata, params.Metadata[i])
		if keyed {
			part.PartitionHashes = append(part.PartitionHashes, params.PartitionHashes[i])
		}
		if params.Keys != nil {
			part.Keys = append(part.Keys, params.Keys[i])
		}
	}
	return now, later, nowAt, laterAt
}

// insertStatements returns the statements that store params, to be
// queued in a batch: the messages due now in the messages table, the
// delayed ones in the delayed table.
func insertStatements(t *pgsql.Tables, params pgsql.InsertMessagesParams) []pgsql.Stmt {
	now, later, _, _ := splitDelayed(params)
	var qs []pgsql.Stmt
	if len(now.UUIDs) > 0 {
		qs = append(qs, t.InsertKeyed(now))
	}
	if len(later.UUIDs) > 0 {
		qs = append(qs, t.InsertDelayedKeyed(later))
	}
	return qs
}

// execDelayed stores params, some of them delayed: with one statement, or
// with two in one transaction (a savepoint on a pgx.Tx), so that the call
// stores all of its messages or none. It returns the indexes of the
// messages left out, their idempotency keys stored already.
func execDelayed(ctx context.Context, db DB, d pgsql.Driver, params pgsql.InsertMessagesParams) ([]int, error) {
	now, later, nowAt, laterAt := splitDelayed(params)
	var skipped []int
	collect := func(part []int, at []int) {
		for _, i := range part {
			skipped = append(skipped, at[i])
		}
	}
	var err error
	switch {
	case len(later.UUIDs) == 0:
		var s []int
		s, err = d.InsertKeyed(ctx, db, now)
		collect(s, nowAt)
	case len(now.UUIDs) == 0:
		var s []int
		s, err = d.InsertDelayedKeyed(ctx, db, later)
		collect(s, laterAt)
	default:
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			skipped = skipped[:0]
			s, err := d.InsertKeyed(ctx, tx, now)
			if err != nil {
				return err
			}
			collect(s, nowAt)
			s, err = d.InsertDelayedKeyed(ctx, tx, later)
			collect(s, laterAt)
			return err
		})
	}
	if err != nil {
		return nil, wrapMissingSchema(err)
	}
	slices.Sort(skipped)
	return skipped, nil
}
