package pgsql

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/pgtest"
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

// BenchmarkCitusKeyedInsert measures a keyed publish on the Citus
// cluster of `make test-citus`, on one connection (a pool of one),
// batches of 1 and of 100 messages of one topic with new keys (each
// message's UUID), in alternating rounds; it reports each shape's msgs/s
// and its rate as a percentage of the insert without keys (plain). The
// shapes: plain, the insert without keys (insertMessagesStmt); one_stmt,
// the one-statement keyed insert (insertKeyed, tolerant: what the Citus
// driver ran before, opening a transaction on every worker); keyed,
// what it runs now (citusInsertKeyed: a pool's call, the strict batch).
//
//	go run ./internal/cmd/localcitus -- go test -run '^$' -bench CitusKeyedInsert -benchtime 1x ./internal/pgsql
//
// b.N is ignored.
func BenchmarkCitusKeyedInsert(b *testing.B) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		b.Skip("needs a Citus cluster: run `make test-citus`")
	}
	for _, perBatch := range []int{1, 100} {
		b.Run(fmt.Sprint("batch", perBatch), func(b *testing.B) {
			const rounds = 6
			batches := 2000 / perBatch
			if batches > 100 {
				batches = 100
			}
			ctx := context.Background()
			_, tables := citusTables(b)
			pool := pgtest.NewPool(b, os.Getenv("PGLEASE_TEST_DSN"), 1)
			d := NewCitus(tables).(citus)
			shapes := []struct {
				name string
				do   func(p InsertMessagesParams) error
			}{
				{"plain", func(p InsertMessagesParams) error { p.Keys = nil; return d.InsertMessages(ctx, pool, p) }},
				{"one_stmt", func(p InsertMessagesParams) error {
					_, err := skipped(ctx, pool, d.t.insertKeyed(p, false, noRegistration))
					return err
				}},
				{"keyed", func(p InsertMessagesParams) error { _, err := d.InsertKeyed(ctx, pool, p); return err }},
			}
			params := func() InsertMessagesParams {
				p := InsertMessagesParams{NotifyChannel: tables.NotifyChannel}
				for range perBatch {
					id := uuid.NewString()
					p.Topics = append(p.Topics, "bench")
					p.UUIDs = append(p.UUIDs, id)
					p.Payloads = append(p.Payloads, []byte(`{"bench":"pglease","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`))
					p.Metadata = append(p.Metadata, "")
					p.Keys = append(p.Keys, id)
				}
				return p
			}
			batchesOf := func(do func(InsertMessagesParams) error, n int) {
				for range n {
					if err := do(params()); err != nil {
						b.Fatal(err)
					}
				}
			}
			for _, s := range shapes {
				batchesOf(s.do, batches/4)
			}
			spent := make([]time.Duration, len(shapes))
			b.ResetTimer()
			for r := range rounds {
				for i := range shapes {
					i = (i + r) % len(shapes) // each round starts with another shape
					start := time.Now()
					batchesOf(shapes[i].do, batches)
					spent[i] += time.Since(start)
				}
			}
			b.StopTimer()
			for i, s := range shapes {
				rate := float64(rounds*batches*perBatch) / spent[i].Seconds()
				b.ReportMetric(rate, s.name+"_msgs/s")
				if i > 0 {
					plain := float64(rounds*batches*perBatch) / spent[0].Seconds()
					b.ReportMetric(100*rate/plain, s.name+"_%_of_plain")
				}
			}
		})
	}
}

func TestRepeatedKeysAndLeftIn(t *testing.T) {
	const k1, k2 = "11111111-2222-3333-4444-555555555555", "66666666-2222-3333-4444-555555555555"
	p := InsertMessagesParams{
		Topics:          []string{"a", "a", "b", "a", "a", "a"},
		UUIDs:           []string{"u0", "u1", "u2", "u3", "u4", "u5"},
		Payloads:        [][]byte{{0}, {1}, {2}, {3}, {4}, {5}},
		Metadata:        []string{"m0", "m1", "m2", "m3", "m4", "m5"},
		PartitionHashes: []uint32{0, 1, 2, 3, 4, 5},
		// The same key in two topics; the same UUID in another spelling;
		// no key; another key.
		Keys:          []string{k1, "", k1, "{" + strings.ToUpper(k1) + "}", k2, ""},
		NotifyChannel: "ch",
	}
	dup := repeatedKeys(p)
	if !slices.Equal(dup, []int{3}) {
		t.Fatalf("repeatedKeys = %v; want [3]", dup)
	}
	rest, ok := leftIn(p, []int{0, 3, 5})
	if !ok || !slices.Equal(rest.UUIDs, []string{"u1", "u2", "u4"}) || !slices.Equal(rest.Topics, []string{"a", "b", "a"}) ||
		!slices.Equal(rest.Metadata, []string{"m1", "m2", "m4"}) || !slices.Equal(rest.PartitionHashes, []uint32{1, 2, 4}) ||
		len(rest.Payloads) != 3 || rest.Payloads[2][0] != 4 || rest.Keys != nil || rest.NotifyChannel != "ch" {
		t.Fatalf("leftIn = %+v, %t", rest, ok)
	}
	p.PartitionHashes = nil
	if rest, ok := leftIn(p, []int{0, 1, 2, 3, 4, 5}); ok || rest.PartitionHashes != nil || len(rest.UUIDs) != 0 {
		t.Fatalf("leftIn of every message = %+v, %t", rest, ok)
	}
}
