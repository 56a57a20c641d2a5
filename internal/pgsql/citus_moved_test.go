package pgsql

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// TestCitusShardMoveToldFromGoingBack: the statements of a claim on Citus
// tell a planned move of the topic's shard from the worker going back,
// run by a role with the runtime grants only (GrantScript). The claim
// keeps the node group of the topic's placement with the worker's
// identity. A statement that finds another identity on the same group (a
// worker failed over, restarted, replaced by a copy) reports ErrWentBack
// and no move; after the shard moved to the other worker, its position
// sequence raised first (PrepareShardMoveScript), the statements report a
// ShardMovedError naming the topic, the shard and both workers (an
// ErrWentBack too: the claim is made again); after a move that did not
// raise the target's sequence, with the position at or above its counter,
// they report ErrWentBack alone: that move lost the topic's order, and
// says so at Error.
func TestCitusShardMoveToldFromGoingBack(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic, group = "moved", "g"

	// A role with the runtime grants only, on a connection of its own.
	role := "pglease_mover_" + strings.ToLower(strings.ReplaceAll(uuid.NewString()[:8], "-", ""))
	if _, err := pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{role}.Sanitize()+`; DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	if _, err := pool.Exec(ctx, tables.GrantScript(role)); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), `RESET ROLE`)
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, `SET ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	q := conn.Conn()
	d, err := OpenDriver(ctx, q, tables)
	if err != nil {
		t.Fatal(err)
	}

	// Published by the role too (GrantScript's USAGE on the offset
	// column's sequence, which Citus's INSERT ... SELECT needs).
	if err := d.InsertMessages(ctx, q, InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{"m1"},
		Payloads: [][]byte{nil}, Metadata: []string{""}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.EnsureOffsets(ctx, q, OffsetsParams{ConsumerGroup: group, Topics: []string{topic}, Partitions: []int32{0}}); err != nil {
		t.Fatal(err)
	}
	session := uuid.New()
	mark, err := d.CreateSession(ctx, q, SessionParams{SessionID: session, ConsumerGroup: group, Owner: "mover", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := d.ClaimOffsets(ctx, q, OffsetsParams{ConsumerGroup: group, Topics: []string{topic}, Partitions: []int32{0},
		SessionID: session, Here: mark.Here})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Kind != ClaimTaken {
		t.Fatalf("claim: %+v", rows)
	}
	claimed := rows[0]
	_, claimedGroup := splitWorkerHere(claimed.WorkerHere)
	if claimedGroup == 0 {
		t.Fatalf("the claim kept no node group: WorkerHere %q", claimed.WorkerHere)
	}
	read := SelectMessagesParams{Topic: topic, Limit: 10, Here: mark.Here, WorkerHere: claimed.WorkerHere}
	res, err := d.SelectMessages(ctx, q, read)
	if err != nil || res.WentBack || len(res.Messages) != 1 {
		t.Fatalf("read on the claim's worker: %+v, %v", res, err)
	}
	owned := OffsetParams{ConsumerGroup: group, Topic: topic, Partition: 0, SessionID: session, Epoch: claimed.Epoch,
		Here: mark.Here, WorkerHere: claimed.WorkerHere, Position: res.Messages[0].Position}
	wantMoved := func(what string, err error) *ShardMovedError {
		t.Helper()
		var moved *ShardMovedError
		if !errors.As(err, &moved) || !errors.Is(err, ErrWentBack) {
			t.Fatalf("%s: %v, want a ShardMovedError", what, err)
		}
		return moved
	}
	wantWentBack := func(what string, err error) {
		t.Helper()
		var moved *ShardMovedError
		if !errors.Is(err, ErrWentBack) || errors.As(err, &moved) {
			t.Fatalf("%s: %v, want ErrWentBack and no move", what, err)
		}
	}

	// Another identity, the same group: the worker went back.
	other := owned
	other.WorkerHere = "00000009:1:1" + workerGroupMark + strconv.FormatInt(claimedGroup, 10)
	_, _, err = d.CommitOffset(ctx, q, other)
	wantWentBack("commit on a worker that went back", err)
	otherRead := read
	otherRead.WorkerHere = other.WorkerHere
	res, err = d.SelectMessages(ctx, q, otherRead)
	if err != nil || !res.WentBack {
		t.Fatalf("read on a worker that went back: %+v, %v (want WentBack)", res, err)
	}
	// It says what the worker was and is (the log names them).
	var back *WorkerWentBackError
	if !errors.As(res.Elsewhere, &back) || back.Topic != topic || back.Before != "00000009:1:1" || back.Now == "" || back.Counter == 0 {
		t.Fatalf("read on a worker that went back: %#v, want a WorkerWentBackError naming the identities", res.Elsewhere)
	}

	// The planned move, as pglease move-shard makes it.
	type node struct {
		host string
		port int
	}
	var (
		shard    int64
		src, dst node
	)
	placement := func() (n node) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT p.shardid, p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
			WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, tables.Messages, topic).
			Scan(&shard, &n.host, &n.port); err != nil {
			t.Fatal(err)
		}
		return n
	}
	src = placement()
	if err := pool.QueryRow(ctx, `SELECT nodename, nodeport FROM pg_catalog.pg_dist_node
		WHERE groupid > 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1`, src.port).Scan(&dst.host, &dst.port); err != nil {
		t.Fatal(err)
	}
	addr := func(n node) string { return n.host + ":" + strconv.Itoa(n.port) }
	moveTo := func(from, to node, prepare bool) {
		t.Helper()
		if prepare {
			if _, err := pool.Exec(ctx, PrepareShardMoveScript(from.host, from.port, to.host, to.port, 0)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
			shard, from.host, from.port, to.host, to.port); err != nil {
			t.Fatal(err)
		}
	}
	moveTo(src, dst, true)
	t.Cleanup(func() {
		// The source's placement, dropped now rather than later by
		// Citus's background cleaner, while the next test starts.
		_, _ = pool.Exec(context.Background(), `CALL pg_catalog.citus_cleanup_orphaned_resources()`)
	})
	readAt := SelectMessagesAtParams{Topic: topic, Positions: []Position{owned.Position}, Here: mark.Here, WorkerHere: claimed.WorkerHere}
	checks := []struct {
		what string
		run  func(OffsetParams) error
	}{
		{"read", func(OffsetParams) error {
			res, err := d.SelectMessages(ctx, q, read)
			if err == nil && res.WentBack {
				return ErrWentBack
			}
			return err
		}},
		{"read at", func(OffsetParams) error {
			res, err := d.SelectMessagesAt(ctx, q, readAt)
			if err == nil && res.WentBack {
				return ErrWentBack
			}
			return err
		}},
		{"commit", func(p OffsetParams) error { _, _, err := d.CommitOffset(ctx, q, p); return err }},
		{"count", func(p OffsetParams) error { _, err := d.CountHeadDelivery(ctx, q, p); return err }},
		{"release", func(p OffsetParams) error { _, err := d.ReleaseOffset(ctx, q, p); return err }},
	}
	for _, c := range checks {
		moved := wantMoved(c.what+" after the move", c.run(owned))
		if moved.Topic != topic || moved.Shard != shard || moved.From != addr(src) || moved.To != addr(dst) {
			t.Errorf("%s: %+v, want topic %s shard %d from %s to %s", c.what, moved, topic, shard, addr(src), addr(dst))
		}
	}
	// A position at or above the new worker's counter (a move that did
	// not raise its sequence: its new messages would sort below the
	// group's position) is no planned move.
	ahead := owned
	ahead.Position = Position{TransactionID: 1 << 62}
	_, _, err = d.CommitOffset(ctx, q, ahead)
	wantWentBack("commit of a position ahead of the new worker's counter", err)

	// Claimed again, on the new worker: the statements run there.
	rows, err = d.ClaimOffsets(ctx, q, OffsetsParams{ConsumerGroup: group, Topics: []string{topic}, Partitions: []int32{0},
		SessionID: session, Here: mark.Here})
	if err != nil || len(rows) != 1 || rows[0].Kind != ClaimTaken {
		t.Fatalf("claim after the move: %+v, %v", rows, err)
	}
	if _, g := splitWorkerHere(rows[0].WorkerHere); g == claimedGroup || g == 0 {
		t.Fatalf("claimed after the move with group %d (was %d)", g, claimedGroup)
	}
	owned.Epoch, owned.WorkerHere = rows[0].Epoch, rows[0].WorkerHere
	if _, ok, err := d.CommitOffset(ctx, q, owned); err != nil || !ok {
		t.Fatalf("commit on the new worker: %v, %v", ok, err)
	}
}
