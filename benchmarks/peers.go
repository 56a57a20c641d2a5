package main

// The peers: what a team choosing a Watermill backend weighs
// pglease against. watermill-sql (backend.go) runs in every workload that
// has a counterpart for it, as before; the brokers of -peers, NATS
// JetStream (nats.go) and Redis Streams (redis.go), run in the workloads
// marked peers (publish, drain, latency, Router), side by side with
// pglease in the same rounds; the limits of the PostgreSQL server itself
// (limits.go) run as a workload of their own. The report gives every
// backend's durability next to its numbers (report_peers.go).

import (
	"fmt"
	"slices"
	"strings"
)

// peer is a broker that -peers can name.
type peer struct {
	id      string // in -peers
	backend backend
	// durability says what an acknowledged Publish survives; short is the
	// chart's version of it.
	durability, short string
}

// peers are the brokers in the order the report shows them.
var peers = []peer{
	{
		id:         "nats",
		backend:    natsBackend{},
		durability: "fsync every 2 min (JetStream's default sync_interval): an acknowledged message may be in the page cache only; one server, no replicas",
		short:      "fsync every 2 min",
	},
	{
		id:         "nats-sync",
		backend:    natsBackend{syncAlways: true},
		durability: "fsync per write (JetStream SyncAlways, `sync_interval: always`); one server, no replicas",
		short:      "fsync per write",
	},
	{
		id:         "redis",
		backend:    redisBackend{},
		durability: "fsync once per second (AOF, `appendfsync everysec`): up to about a second of acknowledged writes lost if the machine fails; RDB snapshots off",
		short:      "fsync once per second",
	},
	{
		id:      "pglease-async",
		backend: pgleaseBackend{asyncCommit: true},
		durability: "WAL flushed within 0.6 s, in the background (synchronous_commit=off on the pool's connections, fsync=on): " +
			"an acknowledged Publish may be lost for up to 3 × wal_writer_delay (600 ms by default) if the server fails, " +
			"the durability class of Redis's AOF everysec",
		short: "WAL flushed within 0.6 s",
	},
}

// peerIDs are the ids -peers knows, in order.
func peerIDs() []string {
	var ids []string
	for _, p := range peers {
		ids = append(ids, p.id)
	}
	return ids
}

// peerByID returns the peer of id.
func peerByID(id string) (peer, bool) {
	for _, p := range peers {
		if p.id == id {
			return p, true
		}
	}
	return peer{}, false
}

// peerByName returns the peer whose backend is called name.
func peerByName(name string) (peer, bool) {
	for _, p := range peers {
		if p.backend.name() == name {
			return p, true
		}
	}
	return peer{}, false
}

// parsePeers reads -peers: comma-separated ids, in any order; empty: none.
// The result is in the order of peers, without duplicates.
func parsePeers(s string) ([]string, error) {
	var want []string
	for _, id := range strings.Split(s, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		if _, ok := peerByID(id); !ok {
			return nil, fmt.Errorf("-peers: unknown peer %q (known: %s)", id, strings.Join(peerIDs(), ", "))
		}
		want = append(want, id)
	}
	var out []string
	for _, id := range peerIDs() {
		if slices.Contains(want, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// roundOrder is the backends that run workload w in the given round, in
// the order they run: pglease, pglease through PgBouncer (for the
// workloads that have it, with -pgbouncer), watermill-sql, then the peers
// of -peers (for the workloads that have them); reversed in every other
// round, so that noise from other work on the machine falls on all alike.
// A workload with a backend of its own (alone) runs on that one only.
func roundOrder(w workload, cfg config, round int) []backend {
	var order []backend
	switch {
	case w.alone != nil:
		return []backend{w.alone}
	case w.pgleaseOnly:
		order = []backend{pgleaseBackend{}}
	default:
		order = []backend{pgleaseBackend{}, watermillSQLBackend{}}
	}
	if w.pgbouncer && cfg.pgbouncerDSN != "" {
		order = slices.Insert(order, 1, backend(pgleasePgBouncerBackend{}))
	}
	if w.peers {
		for _, id := range cfg.peers {
			p, _ := peerByID(id)
			order = append(order, p.backend)
		}
	}
	if round%2 == 0 {
		slices.Reverse(order)
	}
	return order
}

// postgresDurability says what a commit survives on a PostgreSQL server
// with these settings (SHOW fsync, SHOW synchronous_commit), and the
// chart's short version of it.
func postgresDurability(fsync, synchronousCommit string) (long, short string) {
	switch {
	case fsync == "" || synchronousCommit == "":
		return "unknown (the server's fsync and synchronous_commit could not be read)", "unknown"
	case fsync != "on":
		return "none: the server runs with fsync=off (a crash of the machine may lose or corrupt anything)", "no fsync"
	case synchronousCommit == "off":
		return "fsync in the background (synchronous_commit=off): a commit may be lost for up to 3 × wal_writer_delay if the server fails", "WAL flushed in the background"
	default:
		return fmt.Sprintf("fsync per commit (fsync=on, synchronous_commit=%s): COMMIT returns once the WAL is on disk; one server, no replicas", synchronousCommit), "fsync per commit"
	}
}

// durable reports whether a server with these settings fsyncs every
// commit before it returns, as the performance goals assume.
func durable(fsync, synchronousCommit string) bool {
	return fsync == "on" && synchronousCommit != "" && synchronousCommit != "off"
}
