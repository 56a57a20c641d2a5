package pgsql

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// workerBound computes the position bound of topic's partition 0 on its
// worker.
func workerBound(t *testing.T, q Querier, tables *Tables, topic string) uint64 {
	t.Helper()
	b, err := NewCitus(tables).PositionBounds(context.Background(), q, []string{topic}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b[0]
}

// TestCitusMaintainerMovesDueMessages: the due delayed messages of two
// topics are moved into the distributed messages table; their
// transaction ids are their workers' (below each worker's xmin once
// committed, and read by SelectMessages), and the Subscribers, which
// listen on the coordinator, are notified there.
func TestCitusMaintainerMovesDueMessages(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := Listen(ctx, conn, tables.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	topics := []string{"due-a", "due-b", "due-c", "due-d"}
	past := time.Now().Add(-time.Second)
	err = NewCitus(tables).InsertDelayed(ctx, pool, InsertMessagesParams{Topics: topics, UUIDs: []string{"a", "b", "c", "d"},
		Payloads: [][]byte{{1}, {2}, {3}, {4}}, Metadata: []string{"", "", "", ""},
		DueAt: []time.Time{past, past, past, time.Now().Add(time.Hour)}, NotifyChannel: tables.NotifyChannel})
	if err != nil {
		t.Fatal(err)
	}
	moved, nextMs, err := NewCitus(tables).MoveDueMessages(ctx, pool, MoveDueParams{Limit: 10, NotifyChannel: tables.NotifyChannel})
	if err != nil {
		t.Fatal(err)
	}
	if moved != 3 || nextMs == nil || *nextMs < 3_500_000 {
		t.Fatalf("MoveDueMessages = %d, next in %v ms; want 3, about an hour", moved, nextMs)
	}
	// The notifications of the three moved topics reach the coordinator.
	want := map[string]bool{"mdue-a": true, "mdue-b": true, "mdue-c": true}
	for len(want) > 0 {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("waiting for %v: %v", want, err)
		}
		delete(want, n.Payload)
	}
	for _, topic := range topics[:3] {
		var tx uint64
		if err := pool.QueryRow(ctx, `SELECT transaction_id::text FROM `+tables.Messages+` WHERE topic = $1`, topic).Scan((*xid8)(&tx)); err != nil {
			t.Fatal(err)
		}
		pgtest.WaitFor(t, 30*time.Second, "the move below "+topic+"'s position bound", func() bool {
			return tx < workerBound(t, pool, tables, topic)
		})
		res, err := NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: "coordinator"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) != 1 || res.Messages[0].UUID != strings.TrimPrefix(topic, "due-") || res.WentBack || res.Future != nil {
			t.Fatalf("SelectMessages(%s) = %+v", topic, res)
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+tables.Delayed).Scan(&left); err != nil || left != 1 {
		t.Fatalf("delayed rows left = %d, %v; want 1", left, err)
	}
}

// TestCitusMaintainerDeletesIdleGroups: the offsets of a group with no
// live session and no write for the idle time are deleted from every
// shard; a group with a live session, and one written lately, are kept.
func TestCitusMaintainerDeletesIdleGroups(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `INSERT INTO `+tables.Sessions+` (id, consumer_group, owner, expires_at)
VALUES ($1, 'live', 'test', pg_catalog.now() + interval '1 minute'), ($2, 'idle', 'test', pg_catalog.now() - interval '1 minute')`,
		uuid.New(), uuid.New())
	if err != nil {
		t.Fatal(err)
	}
	var batch pgx.Batch
	for _, topic := range []string{"t1", "t2", "t3", "t4", "t5", "t6"} {
		for _, g := range []string{"idle", "live"} {
			batch.Queue(`INSERT INTO `+tables.Offsets+` (consumer_group, topic, partition, updated_at)
VALUES ($1, $2, 0, pg_catalog.now() - interval '1 hour')`, g, topic)
		}
		batch.Queue(`INSERT INTO `+tables.Offsets+` (consumer_group, topic, partition) VALUES ('recent', $1, 0)`, topic)
	}
	if err := pool.SendBatch(ctx, &batch).Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := NewCitus(tables).DeleteIdleGroups(ctx, pool, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ConsumerGroup != "idle" || rows[0].Rows != 6 {
		t.Fatalf("DeleteIdleGroups = %+v, want idle: 6 rows", rows)
	}
	var groups []string
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.array_agg(DISTINCT consumer_group ORDER BY consumer_group) FROM `+tables.Offsets).Scan(&groups); err != nil {
		t.Fatal(err)
	}
	if strings.Join(groups, ",") != "live,recent" {
		t.Fatalf("groups left = %v, want live, recent", groups)
	}
	n, err := NewCitus(tables).DeleteExpiredSessions(ctx, pool, time.Second)
	if err != nil || n != 1 {
		t.Fatalf("DeleteExpiredSessions = %d, %v; want 1", n, err)
	}
}

// TestCitusMaintainerDeletesExpiredKept: the messages of a topic with a
// retention kept in the partition of messages kept forever are deleted
// once older than it, topic by topic on its worker, and those a group had
// not acknowledged are counted.
func TestCitusMaintainerDeletesExpiredKept(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A topic's settings, as CreateTopic writes them.
	_, err := pool.Exec(ctx, `INSERT INTO `+tables.Topics+` (topic, partitions, retention, retention_class)
VALUES ('kept1', 1, interval '1 minute', 7), ('kept2', 1, interval '1 minute', 7), ('forever', 1, interval '0', 0)`)
	if err != nil {
		t.Fatal(err)
	}
	var batch pgx.Batch
	for _, topic := range []string{"kept1", "kept2", "forever"} {
		for j := range 3 {
			// The first is new, the others an hour old (the trigger sets
			// the time of an insert: the owner backdates it after).
			batch.Queue(`INSERT INTO `+tables.Messages+` (topic, uuid) VALUES ($1, $2)`, topic, topic+string(rune('a'+j)))
			batch.Queue(`UPDATE `+tables.Messages+` SET created_at = pg_catalog.now() - $3::integer * interval '1 hour'
WHERE topic = $1 AND uuid = $2`, topic, topic+string(rune('a'+j)), min(j, 1))
		}
		batch.Queue(`INSERT INTO `+tables.Offsets+` (consumer_group, topic, partition) VALUES ('g', $1, 0)`, topic)
	}
	if err := pool.SendBatch(ctx, &batch).Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := NewCitus(tables).DeleteExpiredKept(ctx, pool, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].ConsumerGroup != nil || rows[0].Messages != 3 ||
		*rows[1].Topic != "kept1" || rows[1].Messages != 2 || *rows[2].Topic != "kept2" || rows[2].Messages != 1 {
		t.Fatalf("DeleteExpiredKept(limit 3) = %s, want 3 in all: kept1 2, kept2 1", skippedString(rows))
	}
	rows, err = NewCitus(tables).DeleteExpiredKept(ctx, pool, 3)
	if err != nil || len(rows) != 2 || rows[0].Messages != 1 || *rows[1].Topic != "kept2" {
		t.Fatalf("DeleteExpiredKept again = %s, %v; want kept2's last", skippedString(rows), err)
	}
	var left []string
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.array_agg(uuid ORDER BY uuid) FROM `+tables.Messages).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if strings.Join(left, ",") != "forevera,foreverb,foreverc,kept1a,kept2a" {
		t.Fatalf("messages left = %v", left)
	}
}

func skippedString(rows []SkippedRow) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Topic != nil {
			fmt.Fprintf(&b, "%s/%s/%d: ", *r.ConsumerGroup, *r.Topic, *r.Partition)
		}
		fmt.Fprintf(&b, "%d; ", r.Messages)
	}
	return b.String()
}

// TestCitusMaintainerDetachesPartitions: a retention partition added to
// the distributed messages table is distributed with it, and is detached
// (Citus refuses CONCURRENTLY: in a transaction) and dropped.
func TestCitusMaintainerDetachesPartitions(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now().Truncate(time.Second).Add(-time.Minute)
	p := RetentionPartition{Class: 3, Start: start, End: start.Add(time.Second)}
	if err := NewCitus(tables).CreateRetentionPartition(ctx, pool, p); err != nil {
		t.Fatal(err)
	}
	var distributed bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = pg_catalog.to_regclass($1))`,
		tables.retentionPartition(p)).Scan(&distributed); err != nil || !distributed {
		t.Fatalf("partition distributed = %t, %v", distributed, err)
	}
	parts, err := NewCitus(tables).RetentionPartitions(ctx, pool)
	if err != nil || len(parts) != 1 || parts[0].DetachPending {
		t.Fatalf("RetentionPartitions = %+v, %v", parts, err)
	}
	if err := NewCitus(tables).DetachRetentionPartition(ctx, pool, p, false); err != nil {
		t.Fatal(err)
	}
	if parts, err = NewCitus(tables).RetentionPartitions(ctx, pool); err != nil || len(parts) != 0 {
		t.Fatalf("RetentionPartitions after the detach = %+v, %v", parts, err)
	}
	detached, err := NewCitus(tables).DetachedRetentionPartitions(ctx, pool)
	if err != nil || len(detached) != 1 {
		t.Fatalf("DetachedRetentionPartitions = %+v, %v", detached, err)
	}
	if err := NewCitus(tables).DropRetentionPartition(ctx, pool, p); err != nil {
		t.Fatal(err)
	}
	if detached, err = NewCitus(tables).DetachedRetentionPartitions(ctx, pool); err != nil || len(detached) != 0 {
		t.Fatalf("DetachedRetentionPartitions after the drop = %+v, %v", detached, err)
	}
}

// TestCitusMaintainerClaimIsGated: while another candidate holds the
// gate, a claim returns at once, not claimed, without waiting for the
// reference tables' locks; forced with a second transaction that holds
// Citus's lock on the sessions table (a session row updated, not
// committed), which an ungated claim would wait for. Once both end, the
// claim succeeds, and a second claim of the same session keeps it.
func TestCitusMaintainerClaimIsGated(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := NewCitus(tables)
	me, other := uuid.New(), uuid.New()
	for _, id := range []uuid.UUID{me, other} {
		if _, err := d.CreateSession(ctx, pool, SessionParams{SessionID: id, ConsumerGroup: "g", Owner: "test", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	gate, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gate.Rollback(ctx) }()
	g := d.(citus).maintainerGateStmt()
	var held bool
	if err := gate.QueryRow(ctx, g.SQL, g.Args...).Scan(&held); err != nil || !held {
		t.Fatalf("taking the gate: %v, %v", held, err)
	}
	sessions, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sessions.Rollback(ctx) }()
	if _, err := sessions.Exec(ctx, `UPDATE `+tables.Sessions+` SET owner = owner WHERE id = $1`, other); err != nil {
		t.Fatal(err)
	}

	// Gated: not claimed, at once (an ungated claim waits for the
	// sessions' lock until claimCtx ends).
	claimCtx, claimCancel := context.WithTimeout(ctx, 10*time.Second)
	r, err := d.ClaimMaintainer(claimCtx, pool, MaintainerParams{SessionID: me})
	claimCancel()
	if err != nil {
		t.Fatalf("a gated claim: %v (it waited instead of returning)", err)
	}
	if r.Epoch != nil {
		t.Fatalf("a gated claim claimed epoch %d", *r.Epoch)
	}
	if h, err := d.MaintainerHolder(ctx, pool); err != nil || h.Holder != nil {
		t.Fatalf("holder after a gated claim: %v, %v; want none", h.Holder, err)
	}

	if err := sessions.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := gate.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r, err = d.ClaimMaintainer(ctx, pool, MaintainerParams{SessionID: me})
	if err != nil || r.Epoch == nil {
		t.Fatalf("claim with the gate open: %v, %v; want an epoch", r.Epoch, err)
	}
	first := *r.Epoch
	r, err = d.ClaimMaintainer(ctx, pool, MaintainerParams{SessionID: other})
	if err != nil || r.Epoch != nil || r.Holder == nil || uuid.UUID(*r.Holder) != me {
		t.Fatalf("another's claim of a held row: epoch %v, holder %v, %v; want none, %s", r.Epoch, r.Holder, err, me)
	}
	if h, err := d.MaintainerHolder(ctx, pool); err != nil || h.Holder == nil || uuid.UUID(*h.Holder) != me {
		t.Fatalf("holder: %v, %v; want %s (epoch %d)", h.Holder, err, me, first)
	}
}
