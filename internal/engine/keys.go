package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// keyClassRound makes the partitions of the key classes in use (those of
// the topics whose retention is longer than a day: see pgsql's keys.go)
// and lets their publishers use them once no transaction that had the
// keys table open when they were attached still runs: such a transaction
// would route a row for them to none, an error that aborts it. Until
// then, and whenever the maintainer does not run, publishers keep the
// topic's keys in the day's rows: nothing fails, keys are only kept for
// a day. It reports whether a class waits for such transactions.
func (m *maintainer) keyClassRound(ctx context.Context) (bool, error) {
	sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
	defer cancel()
	lanes, err := m.driver.KeyLanes(sctx, m.pool)
	if err != nil {
		return false, fmt.Errorf("read the key classes in use: %w", err)
	}
	if m.keysSettling == nil {
		m.keysSettling = map[int][]string{}
	}
	var errs []error
	for _, l := range lanes {
		class := int(l.Class)
		if l.Ready {
			delete(m.keysSettling, class)
			continue
		}
		holders, pending := m.keysSettling[class]
		if !pending {
			made, err := m.driver.AddKeyPartitions(sctx, m.pool, class)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
				// On Citus, making a partition waits for every transaction
				// that has the keys table open: the function gave up after
				// its lock_timeout. Keys stay in the day's rows meanwhile.
				m.logger.Info("Cannot make the key partitions of a retention class yet (a transaction holds the keys table); retrying at the next round",
					watermill.LogFields{"class": class})
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("make the key partitions of class %d: %w", class, err))
				continue
			}
			if made {
				m.logger.Debug("Made the key partitions of a retention class", watermill.LogFields{"class": class})
			}
			// Read after the attach committed: a transaction that locks
			// the keys table later sees the partitions.
			if holders, err = m.driver.KeysLockHolders(sctx, m.pool); err != nil {
				errs = append(errs, fmt.Errorf("read the transactions that have the keys table open: %w", err))
				continue
			}
		} else {
			running, err := pgsql.LockHoldersRunning(sctx, m.pool, holders)
			if err != nil {
				errs = append(errs, fmt.Errorf("read the transactions that had the keys table open: %w", err))
				continue
			}
			if running {
				continue
			}
			holders = nil
		}
		if len(holders) > 0 {
			m.keysSettling[class] = holders
			continue
		}
		if _, err := m.driver.SetKeysSince(sctx, m.pool, class); err != nil {
			errs = append(errs, fmt.Errorf("let publishers use the key partitions of class %d: %w", class, err))
			continue
		}
		delete(m.keysSettling, class)
		m.logger.Debug("Publishers keep the keys of a retention class for its retention", watermill.LogFields{"class": class})
	}
	return len(m.keysSettling) > 0, errors.Join(errs...)
}
