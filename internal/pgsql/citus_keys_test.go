package pgsql

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestCitusKeyedInsertTouchesItsWorkers: a keyed insert of one topic
// sends commands to that topic's worker only, whether the call owns its
// transaction (a connection outside one, the strict batch; again with
// its keys stored, the tolerant path) or runs in the caller's; one of
// two topics on different workers, to both. The nodes are read from the
// commands Citus logs (citus.log_remote_commands: a notice per command,
// naming its node).
func TestCitusKeyedInsertTouchesItsWorkers(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := NewCitus(tables)
	// A topic on each of two workers.
	byPort := map[string]string{}
	for _, topic := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		var port string
		if err := pool.QueryRow(ctx, `SELECT p.nodeport::text FROM pg_catalog.pg_dist_shard_placement p
			WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, tables.Messages, topic).Scan(&port); err != nil {
			t.Fatal(err)
		}
		if _, ok := byPort[port]; !ok {
			byPort[port] = topic
		}
	}
	if len(byPort) < 2 {
		t.Skipf("the topics lie on %d worker(s); want two", len(byPort))
	}

	var (
		mu    sync.Mutex
		nodes = map[string]bool{}
	)
	node := regexp.MustCompile(`:(\d+) connectionId`)
	cfg, err := pgx.ParseConfig(os.Getenv("PGLEASE_TEST_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if m := node.FindStringSubmatch(n.Detail); m != nil {
			mu.Lock()
			nodes[m[1]] = true
			mu.Unlock()
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SET citus.log_remote_commands = on"); err != nil {
		t.Fatal(err)
	}
	n := 0
	params := func(topics ...string) InsertMessagesParams {
		var p InsertMessagesParams
		for _, tp := range topics {
			n++
			p.Topics = append(p.Topics, tp)
			p.UUIDs = append(p.UUIDs, fmt.Sprint("u", n))
			p.Payloads = append(p.Payloads, nil)
			p.Metadata = append(p.Metadata, "")
			p.Keys = append(p.Keys, fmt.Sprintf("00000000-0000-0000-0000-%012d", n))
		}
		p.NotifyChannel = "ch"
		return p
	}
	// touched runs insert and returns the ports of the nodes Citus sent
	// commands to meanwhile.
	touched := func(insert func() ([]int, error), want []int) []string {
		t.Helper()
		mu.Lock()
		clear(nodes)
		mu.Unlock()
		got, err := insert()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("left out %v; want %v", got, want)
		}
		mu.Lock()
		defer mu.Unlock()
		var ports []string
		for p := range nodes {
			ports = append(ports, p)
		}
		slices.Sort(ports)
		return ports
	}
	for port, topic := range byPort {
		p := params(topic, topic)
		if got := touched(func() ([]int, error) { return d.InsertKeyed(ctx, conn, p) }, nil); !slices.Equal(got, []string{port}) {
			t.Errorf("a keyed insert into %s (on port %s), its own transaction: commands to %v", topic, port, got)
		}
		if got := touched(func() ([]int, error) { return d.InsertKeyed(ctx, conn, p) }, []int{0, 1}); !slices.Equal(got, []string{port}) {
			t.Errorf("a keyed insert into %s (on port %s) of keys stored: commands to %v", topic, port, got)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		q := params(topic)
		if got := touched(func() ([]int, error) { return d.InsertKeyed(ctx, tx, q) }, nil); !slices.Equal(got, []string{port}) {
			t.Errorf("a keyed insert into %s (on port %s) in a transaction: commands to %v", topic, port, got)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var both []string
	var topics []string
	for port, topic := range byPort {
		both = append(both, port)
		topics = append(topics, topic)
	}
	slices.Sort(both)
	if got := touched(func() ([]int, error) { return d.InsertKeyed(ctx, conn, params(topics...)) }, nil); !slices.Equal(got, both) {
		t.Errorf("a keyed insert into %v: commands to %v; want %v", topics, got, both)
	}
}
