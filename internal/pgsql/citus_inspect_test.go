package pgsql

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// publish inserts n messages into topic, one statement.
func publish(t *testing.T, q Querier, tables *Tables, topic string, n int) {
	t.Helper()
	p := InsertMessagesParams{NotifyChannel: tables.NotifyChannel}
	for i := range n {
		p.Topics = append(p.Topics, topic)
		p.UUIDs = append(p.UUIDs, fmt.Sprintf("%s/%d", topic, i))
		p.Payloads = append(p.Payloads, []byte{byte(i)})
		p.Metadata = append(p.Metadata, "")
	}
	if err := NewCitus(tables).InsertMessages(context.Background(), q, p); err != nil {
		t.Fatal(err)
	}
}

// TestCitusInspectLag: the lag of each (group, topic) row is what was
// published minus what the group acknowledged, counted on the topic's
// worker; topics lie on both workers.
func TestCitusInspectLag(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topics := []string{"lag0", "lag1", "lag2", "lag3", "lag4", "lag5"}
	for i, topic := range topics {
		publish(t, pool, tables, topic, 5+i)
		if _, err := pool.Exec(ctx, `INSERT INTO `+tables.Offsets+` (consumer_group, topic, partition) VALUES ('g', $1, 0), ('h', $1, 0)`, topic); err != nil {
			t.Fatal(err)
		}
	}
	// Group h acknowledged the first two messages of each topic.
	for _, topic := range topics {
		res, err := NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 2, Here: "coordinator"})
		pgtest.WaitFor(t, 30*time.Second, topic+" visible", func() bool {
			res, err = NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 2, Here: "coordinator"})
			return err != nil || len(res.Messages) == 2
		})
		if err != nil {
			t.Fatal(err)
		}
		pos := res.Messages[1].Position
		if _, err := pool.Exec(ctx, `UPDATE `+tables.Offsets+` SET acked_transaction_id = $2::text::xid8, acked_offset = $3
WHERE consumer_group = 'h' AND topic = $1`, topic, formatXID8(pos.TransactionID), pos.Offset); err != nil {
			t.Fatal(err)
		}
	}
	var rows []LagRow
	pgtest.WaitFor(t, 30*time.Second, "every message below its worker's xmin", func() bool {
		var err error
		rows, err = NewCitus(tables).InspectLag(ctx, pool, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Pending {
				return false
			}
		}
		return true
	})
	if len(rows) != 2*len(topics) {
		t.Fatalf("InspectLag: %d rows, want %d", len(rows), 2*len(topics))
	}
	for i, r := range rows {
		group, k, acked := "g", i, 0
		if i >= len(topics) {
			group, k, acked = "h", i-len(topics), 2
		}
		topic, want := topics[k], int64(5+k-acked)
		if r.ConsumerGroup != group || r.Topic != topic || r.Lag != want || r.LagSeconds == nil {
			t.Errorf("row %d = %s/%s lag %d (age %v), want %s/%s lag %d", i, r.ConsumerGroup, r.Topic, r.Lag, r.LagSeconds, group, topic, want)
		}
	}
	one, err := NewCitus(tables).InspectLag(ctx, pool, []string{"h"}, []string{"lag3"})
	if err != nil || len(one) != 1 || one[0].Lag != 6 {
		t.Fatalf("InspectLag(h, lag3) = %+v, %v; want lag 6", one, err)
	}
}

// TestCitusInspectTopics: the topics with messages are found on every
// shard, with their newest message, beside those with settings or
// offset rows only.
func TestCitusInspectTopics(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 6 {
		publish(t, pool, tables, fmt.Sprintf("top%d", i), 2)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+tables.Offsets+` (consumer_group, topic, partition)
VALUES ('g', 'top1', 0), ('h', 'top1', 0), ('g', 'nomsg', 0)`); err != nil {
		t.Fatal(err)
	}
	rows, err := NewCitus(tables).InspectTopics(ctx, pool, len(tables.Migrations()))
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, r := range rows {
		got += fmt.Sprintf("%s:%d:%t ", r.Topic, r.Groups, r.NewestAt != nil)
	}
	if want := "nomsg:1:false top0:0:true top1:2:true top2:0:true top3:0:true top4:0:true top5:0:true "; got != want {
		t.Fatalf("InspectTopics = %q, want %q", got, want)
	}
}

// TestCitusInspectHorizon: a transaction held open from a second
// connection, that wrote to a topic, holds back the horizon of that
// topic's worker; InspectWorkers names that worker, the session on the
// coordinator whose transaction holds it, and, in the same call, the
// transaction as the topic's open publisher.
func TestCitusInspectHorizon(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "held"
	var port int32
	if err := pool.QueryRow(ctx, `SELECT p.nodeport FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::text::regclass, $2::text)`, tables.Messages, topic).Scan(&port); err != nil {
		t.Fatal(err)
	}
	d := NewCitus(tables)
	if _, err := d.UpsertTopic(ctx, pool, TopicParams{Topic: topic, Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	publish(t, tx, tables, topic, 1)
	var (
		xid uint64
		pid int32
	)
	if err := tx.QueryRow(ctx, `SELECT transaction_id::text FROM `+tables.Messages+` WHERE topic = $1`, topic).Scan((*xid8)(&xid)); err != nil {
		t.Fatal(err)
	}
	// On its own: in the statement above Citus would run it on the worker.
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	w, ok, err := d.InspectWorkers(ctx, pool)
	if err != nil || !ok || len(w.Horizons) != 2 || !w.PerTopic {
		t.Fatalf("InspectWorkers = %+v, %t, %v; want 2 workers, positions per topic", w, ok, err)
	}
	if len(w.Publishers) != 1 || len(w.Publishers[0].Topics) != 1 || w.Publishers[0].Topics[0] != topic ||
		w.Publishers[0].Client == nil || *w.Publishers[0].Client.PID != pid {
		t.Fatalf("InspectWorkers' publishers = %+v; want %s's, by the session pid %d", w.Publishers, topic, pid)
	}
	for _, r := range w.Horizons {
		if r.Port != port {
			continue
		}
		if r.Xmin > xid || r.PID == nil || r.AgeSeconds == nil {
			t.Fatalf("worker %s:%d: xmin %d, holder %v; want at most %d, held", r.Node, r.Port, r.Xmin, r.PID, xid)
		}
		if r.GlobalPID == nil || r.Client == nil || r.Client.PID == nil || *r.Client.PID != pid {
			t.Fatalf("worker %s:%d: holder's session %v (global pid %v); want the coordinator's pid %d", r.Node, r.Port,
				r.Client, r.GlobalPID, pid)
		}
		return
	}
	t.Fatalf("no horizon of the topic's worker (port %d) in %+v", port, w.Horizons)
}

// TestCitusOpenPublishersEarlierRelease: on tables distributed by an
// earlier release, OpenPublishers reads what the workers have: without
// the workers' bound and holder functions (distributed before they
// existed) it still lists an open publisher, named, with its worker and
// its session on the coordinator; where the position trigger is not
// pglease's (positions from the workers' transaction ids), it lists
// nothing and says so (ok false), for status to show the horizon.
func TestCitusOpenPublishersEarlierRelease(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := NewCitus(tables)
	for _, fn := range []string{tables.WorkerHolderFunction() + "(text, integer)", tables.WorkerBoundFunction() + "(text, integer[])"} {
		var failed int
		if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.run_command_on_workers($1) WHERE NOT success`,
			"DROP FUNCTION "+fn).Scan(&failed); err != nil || failed > 0 {
			t.Fatalf("drop %s on the workers: %v (%d failed)", fn, err, failed)
		}
	}
	const topic = "earlier"
	if _, err := d.UpsertTopic(ctx, pool, TopicParams{Topic: topic, Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	publish(t, tx, tables, topic, 1)
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if h, topicOnly, err := d.BoundHolder(ctx, pool, topic, 0); err != nil || !topicOnly || h.PID != nil {
		t.Fatalf("BoundHolder without the workers' function = %+v, %t, %v; want held, no holder named", h, topicOnly, err)
	}
	rows, ok, err := d.OpenPublishers(ctx, pool)
	if err != nil || !ok || len(rows) != 1 {
		t.Fatalf("OpenPublishers = %+v, %t, %v; want the publisher", rows, ok, err)
	}
	if r := rows[0]; len(r.Topics) != 1 || r.Topics[0] != topic || r.Node == nil || r.PID == nil ||
		r.Client == nil || r.Client.PID == nil || *r.Client.PID != pid {
		t.Fatalf("OpenPublishers = %+v (client %+v); want %s on its worker, its session pid %d", r, r.Client, topic, pid)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Positions from the workers' transaction ids: another trigger.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL citus.enable_unsafe_triggers = on`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DROP TRIGGER `+pgx.Identifier{tables.partitionName("transaction_id")}.Sanitize()+` ON `+tables.Messages)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if rows, ok, err := d.OpenPublishers(ctx, pool); err != nil || ok || rows != nil {
		t.Fatalf("OpenPublishers without the position trigger = %+v, %t, %v; want nothing, not per topic", rows, ok, err)
	}
}
