package pgsql

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestCitusOtherWriterHoldsNoTopic: a transaction on a worker that keeps
// one INSERT (into a table of its own) open delays no topic placed there.
// With positions from the workers' transaction ids it held every topic of
// the worker until it ended; the test logs the delivery latency of a
// message published while it is open (PGLEASE_CITUS_HOLD sets how long
// it stays open, 3s by default; 20s for the figure of docs/guarantees.md).
func TestCitusOtherWriterHoldsNoTopic(t *testing.T) {
	pool, tables := citusTables(t)
	hold := 3 * time.Second
	if v := os.Getenv("PGLEASE_CITUS_HOLD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		hold = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), hold+time.Minute)
	defer cancel()
	d, err := OpenDriver(ctx, pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	const topic = "b"
	// The topic's worker, where the other writer runs.
	var host string
	var port int
	if err := pool.QueryRow(ctx, `SELECT p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, tables.Messages, topic).Scan(&host, &port); err != nil {
		t.Fatal(err)
	}
	var dsn string
	for _, w := range strings.Fields(os.Getenv("PGLEASE_TEST_CITUS_WORKERS")) {
		if c, err := pgx.ParseConfig(w); err == nil && int(c.Port) == port {
			dsn = w
		}
	}
	if dsn == "" {
		t.Skipf("no URL of worker %s:%d in PGLEASE_TEST_CITUS_WORKERS", host, port)
	}
	worker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close(context.WithoutCancel(ctx))
	if _, err := worker.Exec(ctx, `CREATE TABLE IF NOT EXISTS pglease_other_writer (x integer)`); err != nil {
		t.Fatal(err)
	}
	tx, err := worker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `INSERT INTO pglease_other_writer VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	opened, ended := time.Now(), false
	published := time.Now()
	if err := d.InsertMessages(ctx, pool, InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{"b1"},
		Payloads: [][]byte{nil}, Metadata: []string{""}}); err != nil {
		t.Fatal(err)
	}
	for {
		res, err := d.SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: "coordinator"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("never delivered")
		}
		if !ended && time.Since(opened) >= hold {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			ended = true
		}
		time.Sleep(10 * time.Millisecond)
	}
	latency := time.Since(published)
	t.Logf("other writer open on the topic's worker for %s: topic %s delivered %s after its publish", hold, topic, latency.Round(time.Millisecond))
	if ended {
		t.Fatalf("delivery took %s while another writer ran on the worker", latency)
	}
}

// TestCitusBoundHolder: BoundHolder names the publisher that holds a
// topic by its backend on the topic's worker and that worker (as Citus's
// node table names it); without the holder function (tables distributed
// by an earlier release, until `pglease migrate --citus` runs again) it
// reports only that the topic is held, without an error.
func TestCitusBoundHolder(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := OpenDriver(ctx, pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	const topic = "held"
	var node string
	if err := pool.QueryRow(ctx, `SELECT p.nodename || ':' || p.nodeport FROM pg_catalog.pg_dist_shard_placement p
		WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, tables.Messages, topic).Scan(&node); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := d.InsertMessages(ctx, tx, InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{"h1"},
		Payloads: [][]byte{nil}, Metadata: []string{""}}); err != nil {
		t.Fatal(err)
	}
	h, topicOnly, err := d.BoundHolder(ctx, pool, topic, 0)
	if err != nil || !topicOnly || h.PID == nil || h.Xmin == 0 || h.Node == nil || *h.Node != node {
		t.Fatalf("holder of %s: %+v, %t, %v; want a pid, its position and worker %s", topic, h, topicOnly, err, node)
	}
	if _, err := pool.Exec(ctx, `SET citus.enable_ddl_propagation = off; DROP FUNCTION `+tables.WorkerHolderFunction()+
		`(text, integer); RESET citus.enable_ddl_propagation`); err != nil {
		t.Fatal(err)
	}
	h, topicOnly, err = d.BoundHolder(ctx, pool, topic, 0)
	if err != nil || !topicOnly || h.PID != nil {
		t.Fatalf("holder of %s without the holder function: %+v, %t, %v; want held, none named", topic, h, topicOnly, err)
	}
}
