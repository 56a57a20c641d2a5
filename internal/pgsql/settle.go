package pgsql

import (
	"context"
	"time"
)

// A partition attached to the messages table is seen by a transaction
// only from the next time it locks the table: one that already had the
// table open keeps routing by the partitions it saw, and a row for the
// new partition finds none (an error that aborts it). Publishers place
// messages by usable_until, which the maintainer raises to covered_until
// only once every transaction that held a lock on the messages table
// after the partitions were attached has ended ([Driver.MessagesLockHolders],
// [LockHoldersRunning], [Driver.SetUsableUntil]).

// messagesLockHolders is the statement of [Driver.MessagesLockHolders].
func (t *Tables) messagesLockHolders() Stmt {
	return Stmt{SQL: `SELECT COALESCE(pg_catalog.array_agg(DISTINCT l.virtualtransaction), '{}')
FROM pg_catalog.pg_locks l
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
	AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
	AND l.relation = pg_catalog.to_regclass($1::text)::oid`, Args: []any{t.Messages}}
}

// MessagesLockHolders returns the virtual transaction ids of the other
// transactions that hold a lock on the messages table (its parent: every
// statement on messages locks it), read after the partitions were
// attached.
func (d singleNode) MessagesLockHolders(ctx context.Context, q Querier) ([]string, error) {
	s := d.t.messagesLockHolders()
	var vxids []string
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&vxids)
	return vxids, err
}

// LockHoldersRunning reports whether any of the transactions vxids still
// runs (each holds the lock of its own virtual transaction id until it
// ends).
func LockHoldersRunning(ctx context.Context, q Querier, vxids []string) (bool, error) {
	if len(vxids) == 0 {
		return false, nil
	}
	var running bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
	WHERE l.virtualtransaction = ANY($1::text[]))`, vxids).Scan(&running)
	return running, err
}

// setUsableUntil is the statement of [Driver.SetUsableUntil].
func (t *Tables) setUsableUntil(class int, until time.Time) Stmt {
	return Stmt{SQL: `UPDATE ` + t.Retention + ` SET usable_until = $2
WHERE retention_class = $1 AND usable_until < $2 AND covered_until >= $2`, Args: []any{int16(class), until}}
}

// SetUsableUntil raises the usable_until of class to until, never past
// its covered_until, and reports whether it moved.
func (d singleNode) SetUsableUntil(ctx context.Context, q Querier, class int, until time.Time) (bool, error) {
	n, err := exec(ctx, q, d.t.setUsableUntil(class, until))
	return n > 0, err
}
