package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestCommitOffsetVersionHint: the tuple id CommitOffset returns is only a
// hint for the next commit. A commit whose hint no longer names the row's
// latest version decides as a lookup by the key does: whether another
// transaction replaced that version before the commit, or while the
// commit waited for the row, and whether it kept the owner or not.
func TestCommitOffsetVersionHint(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.Migrate(ctx, pool, adapter))
	offsets := table(adapter, pglease.DefaultConsumerOffsetsTable)
	me, other := uuid.New(), uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, topic, session_id, epoch)
		VALUES ('g', 't', $1, 1), ('g', 'u', $1, 1)`, me)
	require.NoError(t, err)

	commit := func(epoch, offset int64, version string) (string, bool, error) {
		q := adapter.CommitOffset(pglease.OffsetParams{ConsumerGroup: "g", Topic: "t", SessionID: me, Epoch: epoch,
			Position: pglease.Position{TransactionID: 1, Offset: offset}, Version: version})
		rows, err := pool.Query(ctx, q.SQL, q.Args...)
		if err != nil {
			return "", false, err
		}
		written, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(written) == 0 {
			return "", false, err
		}
		if len(written) > 1 {
			return "", false, fmt.Errorf("%d rows written", len(written))
		}
		return written[0], true, nil
	}
	mustCommit := func(epoch, offset int64, version string) (string, bool) {
		t.Helper()
		v, ok, err := commit(epoch, offset, version)
		require.NoError(t, err)
		return v, ok
	}
	// latest reads row t: its version, acknowledged offset and epoch.
	latest := func(topic string) (version string, offset, epoch int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT ctid::text, acked_offset, epoch FROM `+offsets+`
			WHERE consumer_group = 'g' AND topic = $1`, topic).Scan(&version, &offset, &epoch))
		return version, offset, epoch
	}
	check := func(version string, ok bool, wantOK bool, wantOffset int64) {
		t.Helper()
		require.Equal(t, wantOK, ok)
		v, offset, _ := latest("t")
		require.Equal(t, wantOffset, offset)
		if ok {
			require.Equal(t, v, version, "the version returned is the row's latest")
		}
	}

	v, ok := mustCommit(1, 1, "")
	check(v, ok, true, 1)
	v, ok = mustCommit(1, 2, v)
	check(v, ok, true, 2)

	// Replaced before the commit, owner kept (a delivery count, AckInTx).
	_, err = pool.Exec(ctx, `UPDATE `+offsets+` SET head_deliveries = head_deliveries + 1 WHERE topic = 't'`)
	require.NoError(t, err)
	v, ok = mustCommit(1, 3, v)
	check(v, ok, true, 3)

	// A hint that names another row's version (after VACUUM FULL moved the
	// rows, say): row t is written, row u is not.
	vu, _, _ := latest("u")
	v, ok = mustCommit(1, 4, vu)
	check(v, ok, true, 4)
	_, offsetU, _ := latest("u")
	require.Zero(t, offsetU)

	// waitedFor replaces the row's version (change, with args) in a
	// transaction that holds it while a commit with the hint v waits for
	// the row, then commits.
	waitedFor := func(v string, epoch, offset int64, change string, args ...any) (string, bool) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `UPDATE `+offsets+` SET `+change+` WHERE topic = 't'`, args...)
		require.NoError(t, err)
		type result struct {
			v   string
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			v, ok, err := commit(epoch, offset, v)
			done <- result{v, ok, err}
		}()
		waitFor(t, 10*time.Second, "the commit to wait for the row", func() bool {
			var waiting bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%hinted%')`).Scan(&waiting))
			return waiting
		})
		require.NoError(t, tx.Commit(ctx))
		r := <-done
		require.NoError(t, r.err)
		return r.v, r.ok
	}

	// Replaced while the commit waited, owner kept.
	v, ok = waitedFor(v, 1, 5, `head_deliveries = head_deliveries + 1`)
	check(v, ok, true, 5)

	// Taken over while the commit waited: nothing written.
	v, ok = waitedFor(v, 1, 6, `session_id = $1, epoch = epoch + 1`, other)
	check(v, ok, false, 5)

	// Taken over before the commit: nothing written.
	v, _, epoch := latest("t")
	require.Equal(t, int64(2), epoch)
	v, ok = mustCommit(1, 7, v)
	check(v, ok, false, 5)
}
