package pgsql

import (
	"context"
	"fmt"
)

// Migrate applies the migrations (oldest first) that the version table
// does not record yet. It is idempotent and safe to run from many
// goroutines and processes at once: everything runs in one transaction
// holding an advisory lock, so set-ups serialize and each later one finds
// the work done.
//
// Most calls find the schema current, where Subscribers come and go: they
// read the recorded version first, without the lock, and stop there. Only
// a schema that is missing or behind waits for the lock (which a paused
// process may hold for as long as it is paused).
func Migrate(ctx context.Context, db Beginner, t *Tables, migrations []Migration) error {
	latest := 0
	for _, m := range migrations {
		latest = max(latest, m.Version)
	}
	if schemaIsCurrent(ctx, db, t, latest) {
		return nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("initialize schema: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// The guard among Prepare's statements sets the transaction's
	// search_path; a caller's transaction (db a pgx.Tx) gets its own back.
	var searchPath string
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.current_setting('search_path')`).Scan(&searchPath); err != nil {
		return fmt.Errorf("initialize schema: read search_path: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1::text, 0::bigint))`, t.LockKey); err != nil {
		return fmt.Errorf("initialize schema: lock: %w", err)
	}
	for _, s := range t.Prepare() {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("initialize schema: %w", err)
		}
	}
	current, err := SchemaVersion(ctx, tx, t)
	if err != nil {
		return fmt.Errorf("initialize schema: read version: %w", err)
	}
	for _, m := range migrations {
		if m.Version <= current {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("initialize schema: migration %d (%s): %w", m.Version, m.Description, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+t.Version+` (version, description) VALUES ($1, $2)`,
			m.Version, m.Description); err != nil {
			return fmt.Errorf("initialize schema: record version %d: %w", m.Version, err)
		}
	}
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('search_path', $1::text, true)`, searchPath); err != nil {
		return fmt.Errorf("initialize schema: restore search_path: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("initialize schema: commit: %w", err)
	}
	return nil
}

// SchemaVersion reads the highest version the version table records (0
// when it records none).
func SchemaVersion(ctx context.Context, q Querier, t *Tables) (int, error) {
	var current int
	err := q.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM `+t.Version).Scan(&current)
	return current, err
}

// schemaIsCurrent tells whether the version table records latest: false
// too when it cannot be read or the guard refuses the schema (then the
// locked path creates it or reports why not). It reads in a transaction
// of its own, a savepoint on a pgx.Tx, which a missing table aborts and
// which is rolled back, the guard's search_path with it.
func schemaIsCurrent(ctx context.Context, db Beginner, t *Tables, latest int) bool {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, t.Guard()); err != nil {
		return false
	}
	current, err := SchemaVersion(ctx, tx, t)
	return err == nil && current >= latest
}
