package pgsql

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Routing a Publisher's statements to the topic's worker (Citus 11 and
// later, the workers holding Citus's metadata): a worker with the
// metadata plans a statement on a distributed table as the coordinator
// would, and runs the part on its own shards locally, without a
// connection to another node. The coordinator then neither plans nor
// relays the insert, which is where its CPU went while publishing.
//
// Three things differ from the statements sent to the coordinator:
//
//   - The insert's shape. The coordinator's statement is an INSERT ...
//     SELECT from the unnested arrays, joined to the topics and retention
//     tables; Citus plans that on a worker as on the coordinator: it runs
//     the SELECT, pulls its rows and copies them into the shards as
//     intermediate results, a few milliseconds of the worker's CPU per
//     statement whatever its rows (BenchmarkCitusRoutedInsertCPU). The
//     routed insert reads the placements of the call's topics instead
//     (placements: the partition count, the retention class and the
//     expiry, read from the worker's copies of the reference tables by
//     statements of Citus's fast path, decided as citusPlacement decides
//     them), then,
//     in one batch (one transaction), an INSERT ... VALUES per topic
//     with the topic a parameter (insertValuesStmt), which Citus plans as
//     a router insert into the topic's shard, run locally
//     (TestCitusRoutedInsertIsRouterPlanned).
//   - The notification. pg_notify in a routed statement would notify
//     on the worker, where no Subscriber listens (they LISTEN on the
//     coordinator). The routed insert computes the payloads instead
//     (from the partitions written), and the Publisher sends them to the
//     coordinator once the insert committed ([Routed.Notify]). A
//     notification is a hint: one lost (the coordinator unreachable
//     after the commit) delays the message until the Subscribers' next
//     poll.
//   - Nothing else: the same columns stored, the trigger taking the
//     position on the worker that stores the row (which is the one the
//     statement runs on, or, when the shard moved since the Publisher
//     read the catalog, the one Citus forwards it to), each row in
//     turn, in the order of the call.

// Routed runs a Publisher's statements on a Citus worker. Get it from
// the Citus Driver with [RoutedOf]. Safe for concurrent use.
type Routed struct{ d citus }

// RoutedOf returns the routed statements of d, and false when d is not
// the Citus driver (nothing to route: a single server).
func RoutedOf(d Driver) (Routed, bool) {
	c, ok := d.(citus)
	return Routed{d: c}, ok
}

// ShardPlacement is a shard of the messages table and the node that
// holds it (pg_dist_placement, pg_dist_node).
type ShardPlacement struct {
	ShardID int64
	// GroupID is the node's group: 0 is the coordinator.
	GroupID int32
	Host    string
	Port    int
	// Metadata: the node holds Citus's metadata, synced (hasmetadata and
	// metadatasynced): it can plan a statement on the distributed tables.
	Metadata bool
}

// Placements reads where the shards of the messages table are: one row
// per shard and active primary node that holds a placement of it (one
// per shard, the messages table not being replicated).
func (r Routed) Placements(ctx context.Context, q Querier) ([]ShardPlacement, error) {
	rows, err := q.Query(ctx, `SELECT s.shardid, n.groupid, n.nodename, n.nodeport, n.hasmetadata AND n.metadatasynced
FROM pg_catalog.pg_dist_shard s
JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
JOIN pg_catalog.pg_dist_node n ON n.groupid = p.groupid
WHERE s.logicalrelid = pg_catalog.to_regclass($1::text) AND n.noderole = 'primary' AND n.isactive
ORDER BY s.shardid, n.nodeid`, r.d.t.Messages)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ShardPlacement, error) {
		var p ShardPlacement
		err := row.Scan(&p.ShardID, &p.GroupID, &p.Host, &p.Port, &p.Metadata)
		return p, err
	})
}

// TopicShards reads the shard of the messages table that holds each of
// topics (get_shard_id_for_distribution_column), in the order of topics.
func (r Routed) TopicShards(ctx context.Context, q Querier, topics []string) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT pg_catalog.get_shard_id_for_distribution_column($1::text::regclass, t.topic)
FROM unnest($2::text[]) WITH ORDINALITY AS t(topic, n) ORDER BY t.n`, r.d.t.Messages, topics)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// routedPlacement is where one topic's messages go: the topic's
// partition count and its messages' retention class and expiry, decided
// as citusPlacement decides them, by [Routed.placements].
type routedPlacement struct {
	partitions int32
	class      int16
	expires    pgtype.Timestamptz
}

// topicsStmt reads the rows of topics from the worker's copy of the
// topics table, with the expiry of a message stored now (the
// statement's start): a query of one reference table, filtered, which
// Citus plans by its fast path and runs on the worker itself (a join
// with the retention table, or with the unnested topics, costs the
// worker three times as much: its router planner). Args: topics.
func (r Routed) topicsStmt(topics []string) Stmt {
	return Stmt{
		SQL: `SELECT tp.topic, tp.partitions, tp.retention_class, pg_catalog.statement_timestamp() + tp.retention
FROM ` + r.d.t.Topics + ` tp WHERE tp.topic = ANY($1::text[])`,
		Args: []any{topics},
	}
}

// usableStmt reads until when the retention partitions of classes are
// usable (usable_until), from the worker's copy of the retention table,
// by Citus's fast path too. Args: classes.
func (r Routed) usableStmt(classes []int16) Stmt {
	return Stmt{
		SQL: `SELECT l.retention_class, l.usable_until FROM ` + r.d.t.Retention + ` l
WHERE l.retention_class = ANY($1::smallint[])`,
		Args: []any{classes},
	}
}

// placements reads the placement of each of topics (in their order) on
// q: topicsStmt, then, when a topic has a retention, usableStmt. The
// decision is citusPlacement's: a topic without a row has one partition
// and keeps its messages forever; one with a retention class stores
// them in that class's partitions, expiring a retention after the
// topics' read, when that lies before its class's usable_until, else
// keeps them forever. The expiry counts from the read, a round trip
// before the insert: a message's expiry lies that much earlier, within
// the partitions the maintainer keeps (see citusPlacement).
func (r Routed) placements(ctx context.Context, q Querier, topics []string) ([]routedPlacement, error) {
	s := r.topicsStmt(topics)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	type topicRow struct {
		partitions int32
		class      int16
		expires    pgtype.Timestamptz
	}
	found := map[string]topicRow{}
	var classes []int16
	var topic string
	var tr topicRow
	_, err = pgx.ForEachRow(rows, []any{&topic, &tr.partitions, &tr.class, &tr.expires}, func() error {
		found[topic] = tr
		if tr.class > 0 && !slices.Contains(classes, tr.class) {
			classes = append(classes, tr.class)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	usable := map[int16]pgtype.Timestamptz{}
	if len(classes) > 0 {
		s := r.usableStmt(classes)
		rows, err := q.Query(ctx, s.SQL, s.Args...)
		if err != nil {
			return nil, err
		}
		var class int16
		var until pgtype.Timestamptz
		if _, err := pgx.ForEachRow(rows, []any{&class, &until}, func() error {
			usable[class] = until
			return nil
		}); err != nil {
			return nil, err
		}
	}
	out := make([]routedPlacement, len(topics))
	for i, t := range topics {
		pl := routedPlacement{partitions: 1, expires: pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}}
		if tr, ok := found[t]; ok {
			pl.partitions = max(tr.partitions, 1)
			if tr.class > 0 && before(tr.expires, usable[tr.class]) {
				pl.class, pl.expires = tr.class, tr.expires
			}
		}
		out[i] = pl
	}
	return out, nil
}

// before reports whether a < b as PostgreSQL compares two timestamptz
// values, NULL (not Valid) false.
func before(a, b pgtype.Timestamptz) bool {
	rank := func(t pgtype.Timestamptz) int {
		switch t.InfinityModifier {
		case pgtype.NegativeInfinity:
			return -1
		case pgtype.Infinity:
			return 1
		}
		return 0
	}
	switch {
	case !a.Valid || !b.Valid:
		return false
	case rank(a) != rank(b):
		return rank(a) < rank(b)
	case rank(a) != 0:
		return false
	}
	return a.Time.Before(b.Time)
}

// routedMaxRows is the most rows of one routed insert: a topic's
// messages past it go in more statements of the same batch (a statement
// takes at most 65,535 parameters, a routed insert four a row).
const routedMaxRows = 1000

// How the partitions of a routed insert's rows are given.
const (
	// routedOnePartition: the topic has one partition: 0.
	routedOnePartition = iota
	// routedHashes: each row's partition is a parameter, its hash
	// modulo the topic's partition count, computed here as the
	// statement computes it.
	routedHashes
	// routedByUUID: no message has a partition key: the statement
	// computes each row's partition from its UUID (hashtext, as the
	// coordinator's statement does) and returns it.
	routedByUUID
)

// routedPartition is the partition of p's message i placed by pl, from
// its hash as the coordinator's statement computes it (hashesOf: 0 for
// a message without one).
func routedPartition(p InsertMessagesParams, i int, pl routedPlacement) int32 {
	var h uint32
	if i < len(p.PartitionHashes) {
		h = p.PartitionHashes[i]
	}
	return int32(uint64(h) % uint64(pl.partitions))
}

// insertValuesStmt is the routed insert of the messages of p at rows, all
// of topic, placed by pl: one INSERT ... VALUES with the distribution
// column a parameter, which Citus plans as a router insert into the
// topic's shard (no INSERT ... SELECT, no intermediate result), its
// values evaluated on the worker. The statement's text depends only on
// the number of rows and on how their partitions are given (the
// routed... constants), so that a connection prepares a few of them.
// With routedByUUID it returns each row's partition. Args: the topic, the
// class, the expiry, with routedByUUID the partition count, then each
// row's UUID, payload, metadata and, with routedHashes, partition.
func (r Routed) insertValuesStmt(p InsertMessagesParams, topic string, rows []int, pl routedPlacement) (Stmt, int) {
	how := routedOnePartition
	switch {
	case pl.partitions <= 1:
	case p.PartitionHashes != nil:
		how = routedHashes
	default:
		how = routedByUUID
	}
	per := 3
	if how == routedHashes {
		per = 4
	}
	first := 4
	args := make([]any, 0, first+per*len(rows))
	args = append(args, topic, pl.class, pl.expires)
	if how == routedByUUID {
		args = append(args, pl.partitions)
		first = 5
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + r.d.t.Messages + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at) VALUES`)
	for j, i := range rows {
		n := first + per*j
		u, pay, meta := "$"+strconv.Itoa(n), "$"+strconv.Itoa(n+1), "$"+strconv.Itoa(n+2)
		var part string
		switch how {
		case routedOnePartition:
			part = "0"
		case routedHashes:
			part = "$" + strconv.Itoa(n+3) + "::integer"
		case routedByUUID:
			part = `((pg_catalog.hashtext(` + u + `::text)::bigint & 4294967295) % $4::bigint)::integer`
		}
		if j > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n($1::text, " + part + ", " + u + "::text, " + pay + "::bytea, NULLIF(" + meta + "::text, '')::jsonb, $2::smallint, $3::timestamptz)")
		args = append(args, p.UUIDs[i], p.Payloads[i], p.Metadata[i])
		if how == routedHashes {
			args = append(args, routedPartition(p, i, pl))
		}
	}
	if how == routedByUUID {
		b.WriteString("\nRETURNING partition")
	}
	return Stmt{SQL: b.String(), Args: args}, how
}

// InsertKeyed is [Driver.InsertKeyed] run on q, a worker's pool (or a
// connection to it), without notifying: it returns the 0-based indexes
// of the messages left out for their idempotency keys, and the payloads
// of the notifications to send on the coordinator once it returned
// ([Routed.Notify]). A keyed call is the keys' statement and the insert
// of the others in one transaction on the worker, as on the coordinator
// (citusInsertKeyedIn).
func (r Routed) InsertKeyed(ctx context.Context, q interface {
	BatchQuerier
	Beginner
}, p InsertMessagesParams) (left []int, payloads []string, err error) {
	if !keyed(p) {
		// A pool's connection, or a connection outside a transaction
		// block, is in no transaction: the batch makes its own.
		own := false
		switch c := q.(type) {
		case *pgxpool.Pool:
			own = true
		case *pgx.Conn:
			own = c.PgConn().TxStatus() == 'I'
		}
		payloads, err = r.insertReturning(ctx, q, p, own)
		if c, ok := q.(*pgx.Conn); ok && err != nil && own {
			rollbackFailed(ctx, c)
		}
		return nil, payloads, err
	}
	err = pgx.BeginFunc(ctx, q, func(tx pgx.Tx) error {
		out, err := skipped(ctx, tx, r.d.citusKeysStmt(p, false))
		if err != nil {
			return err
		}
		left, payloads = out, nil
		if rest, ok := leftIn(p, out); ok {
			payloads, err = r.insertReturning(ctx, tx, rest, false)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return left, payloads, nil
}

// insertReturning stores p's messages on q, the worker: it reads their
// topics' placements (placements), then sends an insertValuesStmt per
// topic (per routedMaxRows of its messages) in one batch, and returns the
// payloads of the notifications of the partitions written. The batch
// runs in q's transaction, or, with own (q a pool, whose connection is in
// none), in one of its own: BEGIN and COMMIT in the batch when it has
// more than one statement. Not the pipeline's implicit transaction: Citus
// sees no transaction block there, and an insert it forwards to another
// worker (the shard moved since the route was read) would be committed
// there as its statement ends, whatever a later statement does.
func (r Routed) insertReturning(ctx context.Context, q BatchQuerier, p InsertMessagesParams, own bool) ([]string, error) {
	qs, err := r.inserts(ctx, q, p)
	if err != nil {
		return nil, err
	}
	own = own && len(qs) > 1
	b := &pgx.Batch{}
	if own {
		b.Queue("BEGIN")
	}
	for _, c := range qs {
		b.Queue(c.s.SQL, c.s.Args...)
	}
	if own {
		b.Queue("COMMIT")
	}
	br := q.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if own {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	var payloads payloadSet
	for _, c := range qs {
		if payloads.addKnown(p, c) {
			if _, err := br.Exec(); err != nil {
				return nil, err
			}
			continue
		}
		rows, _ := br.Query()
		parts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return nil, err
		}
		for _, part := range parts {
			payloads.add(c.topic, part)
		}
	}
	if own {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	return payloads.list, nil
}

// payloadSet is the payloads of a routed call's notifications, each
// once, in the order of their first message.
type payloadSet struct {
	seen map[string]bool
	list []string
}

// add adds the payload of topic's partition.
func (s *payloadSet) add(topic string, partition int32) {
	pl := messagesPayloadOf(partition, topic)
	if s.seen[pl] {
		return
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[pl] = true
	s.list = append(s.list, pl)
}

// addKnown adds the payloads of the partitions c writes when they are
// known before it runs (one partition, or its messages' hashes), and
// reports whether they were: with routedByUUID the insert computes them
// and returns them.
func (s *payloadSet) addKnown(p InsertMessagesParams, c routedInsert) bool {
	switch c.how {
	case routedByUUID:
		return false
	case routedHashes:
		for _, i := range c.rows {
			s.add(c.topic, routedPartition(p, i, c.pl))
		}
	default:
		s.add(c.topic, 0)
	}
	return true
}

// routedInsert is one INSERT ... VALUES of a routed call: its
// statement (insertValuesStmt), for the messages of p at rows, all of
// topic, placed by pl, their partitions given as how says.
type routedInsert struct {
	topic string
	rows  []int
	pl    routedPlacement
	s     Stmt
	how   int
}

// inserts reads the placements of p's topics on q and returns the
// inserts of p's messages: one per topic, in the order of its first
// message, or more for a topic of more than routedMaxRows messages.
func (r Routed) inserts(ctx context.Context, q Querier, p InsertMessagesParams) ([]routedInsert, error) {
	topics, rowsOf := messagesByTopic(p.Topics)
	pls, err := r.placements(ctx, q, topics)
	if err != nil {
		return nil, err
	}
	var out []routedInsert
	for k, topic := range topics {
		for rows := range slices.Chunk(rowsOf[k], routedMaxRows) {
			s, how := r.insertValuesStmt(p, topic, rows, pls[k])
			out = append(out, routedInsert{topic, rows, pls[k], s, how})
		}
	}
	return out, nil
}

// messagesByTopic returns the distinct topics of topics, in the order of their
// first message, and the indexes of each one's messages, in order.
func messagesByTopic(topics []string) ([]string, [][]int) {
	var distinct []string
	var rows [][]int
	at := map[string]int{}
	for i, t := range topics {
		k, ok := at[t]
		if !ok {
			k = len(distinct)
			at[t] = k
			distinct = append(distinct, t)
			rows = append(rows, nil)
		}
		rows[k] = append(rows[k], i)
	}
	return distinct, rows
}

// Notify sends the notifications payloads (from [Routed.InsertKeyed]) on
// channel, one statement on q, the coordinator, which reads no table.
func (r Routed) Notify(ctx context.Context, q Querier, channel string, payloads []string) error {
	if channel == "" || len(payloads) == 0 {
		return nil
	}
	_, err := exec(ctx, q, notifyPayloadsStmt(channel, payloads))
	return err
}

// notifyPayloadsStmt sends the notifications payloads on channel, from
// the node it runs on, reading no table.
func notifyPayloadsStmt(channel string, payloads []string) Stmt {
	return Stmt{SQL: `SELECT pg_catalog.pg_notify($1::text, p.payload) FROM pg_catalog.unnest($2::text[]) AS p(payload)`,
		Args: []any{channel, payloads}}
}
