package pgsqltest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// The cases of decision 0008: positions from a sequence, read below a
// bound that only the publishers of the same topic and partition hold
// back. Each race of the decision record is forced from a second
// connection: a lock the publisher's trigger needs, held by the case
// (an advisory key held exclusively, the sequence held by an open ALTER
// SEQUENCE), or a reader's two statements run apart. On Citus the same
// cases run against the topic's worker, where positions, registrations
// and bounds are; a case that holds the worker's sequence or keys from a
// connection of its own holds them there: on a connection straight to
// the worker that holds the topic's shard (f.node).

// positionsOnly marks a case of decision 0008, run by both drivers.
func (f *fixture) positionsOnly() { f.t.Helper() }

// positionsNode is where a topic's positions are taken and its bound is
// computed: the server on a single node, on Citus the worker that holds
// the topic's shard.
type positionsNode struct {
	f *fixture
	// Pool is a pool on the node: the case's pool on a single node, on
	// Citus a pool straight to the worker (PGLEASE_TEST_CITUS_WORKERS),
	// whose connections are no part of a distributed transaction.
	Pool *pgxpool.Pool
	// Rel is the relation whose oid keys the topic's registration: the
	// messages table on a single node, the topic's shard on Citus.
	Rel string
	// Waiting matches (LIKE) the text of a publisher's statement there
	// in pg_stat_activity: pglease's insert on a single node, on Citus
	// the statement the coordinator sends the worker, which names the
	// shard.
	Waiting string
}

// node returns the node where topic's positions are taken (on Citus, the
// case is skipped when PGLEASE_TEST_CITUS_WORKERS has no URL of the
// topic's worker).
func (f *fixture) node(topic string) positionsNode {
	f.t.Helper()
	if !f.Citus {
		return positionsNode{f: f, Pool: f.Pool, Rel: f.Tables.Messages, Waiting: insertWaiting}
	}
	var (
		host, shard string
		port        int
	)
	if err := f.Pool.QueryRow(f.ctx, `SELECT p.nodename, p.nodeport, pg_catalog.shard_name($1::regclass, p.shardid)
FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, f.Tables.Messages, topic).Scan(&host, &port, &shard); err != nil {
		f.t.Fatalf("the worker of topic %s: %v", topic, err)
	}
	for _, w := range strings.Fields(os.Getenv("PGLEASE_TEST_CITUS_WORKERS")) {
		if c, err := pgx.ParseConfig(w); err == nil && int(c.Port) == port {
			return positionsNode{f: f, Pool: pgtest.NewPool(f.t, w, 0), Rel: shard, Waiting: "%" + shard + "%"}
		}
	}
	f.t.Skipf("no URL of worker %s:%d (topic %s) in PGLEASE_TEST_CITUS_WORKERS", host, port, topic)
	return positionsNode{}
}

// begin starts a transaction on a connection of its own to the node,
// rolled back at the end of the case unless committed.
func (n positionsNode) begin() pgx.Tx {
	n.f.t.Helper()
	tx, err := n.Pool.Begin(n.f.ctx)
	if err != nil {
		n.f.t.Fatalf("begin on the node: %v", err)
	}
	n.f.t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(n.f.ctx)) })
	return tx
}

// exec runs sql on the node.
func (n positionsNode) exec(sql string, args ...any) {
	n.f.t.Helper()
	if _, err := n.Pool.Exec(n.f.ctx, sql, args...); err != nil {
		n.f.t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

// lastValue is the node's position sequence's last value.
func (n positionsNode) lastValue() uint64 {
	n.f.t.Helper()
	var v uint64
	if err := n.Pool.QueryRow(n.f.ctx, `SELECT last_value FROM `+n.f.Tables.PositionSequence()).Scan(&v); err != nil {
		n.f.t.Fatalf("read the sequence: %v", err)
	}
	return v
}

// waitPublisherBlocked waits until a publisher's statement waits for a
// lock on the node.
func (n positionsNode) waitPublisherBlocked() {
	n.f.t.Helper()
	n.waitBlocked(n.Waiting)
}

// waitBlocked waits until a statement of the node whose text is LIKE
// pattern waits for a lock.
func (n positionsNode) waitBlocked(pattern string) {
	n.f.t.Helper()
	pgtest.WaitFor(n.f.t, waitTimeout, fmt.Sprintf("a statement like %q to wait for a lock", pattern), func() bool {
		var got int
		if err := n.Pool.QueryRow(n.f.ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
	WHERE wait_event_type = 'Lock' AND datname = pg_catalog.current_database() AND query LIKE $1`, pattern).Scan(&got); err != nil {
			n.f.t.Fatalf("read the lock waits: %v", err)
		}
		return got >= 1
	})
}

// topicKeyHolders returns the backends of the node that hold the key of
// topic's partition 0 (the registration's lock): a prepared
// transaction's as 0.
func (n positionsNode) topicKeyHolders(topic string) []int32 {
	n.f.t.Helper()
	return n.topicKeyHoldersOf(topic, 0)
}

// bound is the position bound of topic's partition 0, computed now. On a
// single node it is computed twice, and the two must agree: first by the
// statement a consumer's read sends (SelectMessagesBound's, which takes
// the fast path itself when the key is free), then by the bound function
// (Driver.PositionBounds), so that every case holds both to its
// interleaving.
func (f *fixture) bound(topic string) uint64 {
	f.t.Helper()
	var read int64 = -1
	if !f.Citus {
		s, _ := f.Tables.SelectMessagesBound(f.selectParams(topic, 0, pgsql.Position{}))
		var set string
		if err := f.Pool.QueryRow(f.ctx, s.SQL, s.Args...).Scan(&read, &set); err != nil {
			f.t.Fatalf("the read's bound of %s: %v", topic, err)
		}
	}
	b, err := f.Driver.PositionBounds(f.ctx, f.Pool, []string{topic}, []int32{0})
	if err != nil || len(b) != 1 {
		f.t.Fatalf("position bound of %s: %v, %v", topic, b, err)
	}
	if read >= 0 && uint64(read) != b[0] {
		f.t.Fatalf("position bound of %s: %d by the read's statement, %d by the function", topic, read, b[0])
	}
	return b[0]
}

// readBelow reads topic's partition 0 after a position with a bound
// computed earlier (the reader's second statement).
func (f *fixture) readBelow(topic string, after pgsql.Position, bound uint64) pgsql.SelectResult {
	f.t.Helper()
	p := f.selectParams(topic, 0, after)
	p.Bound = bound
	return f.read(p)
}

// drain reads topic's partition 0 from the beginning until nothing is
// pending and returns the UUIDs in the order read, each read from the
// last position of the one before, as a consumer does.
func (f *fixture) drain(topic string) []string {
	f.t.Helper()
	return f.drainFrom(topic, pgsql.Position{})
}

// drainFrom is drain from the position after.
func (f *fixture) drainFrom(topic string, after pgsql.Position) []string {
	f.t.Helper()
	var got []string
	for {
		res := f.read(f.selectParams(topic, 0, after))
		if res.WentBack || res.Future != nil {
			f.t.Fatalf("read of %s: %+v", topic, res)
		}
		got = append(got, uuidsOf(res.Messages)...)
		if len(res.Messages) > 0 {
			after = res.Messages[len(res.Messages)-1].Position
			continue
		}
		if !res.Pending {
			return got
		}
	}
}

// noneNeedRegistration fails the case when a row of topics stores
// needs_registration (a registered statement writes NULL, the trigger's
// function stores NULL).
func (f *fixture) noneNeedRegistration(topics ...string) {
	f.t.Helper()
	var flagged int
	if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.count(*) FROM `+f.Tables.Messages+
		` WHERE topic = ANY($1) AND needs_registration IS NOT NULL`, topics).Scan(&flagged); err != nil || flagged != 0 {
		f.t.Fatalf("rows of %v that store needs_registration: %d, %v; want none", topics, flagged, err)
	}
}

// async runs run from a goroutine and returns a channel that receives
// its error once it returns. A case that ends before (a failure) cancels
// run's context and waits for it, before the transaction run uses is
// rolled back.
func (f *fixture) async(run func(ctx context.Context) error) <-chan error {
	done, returned := make(chan error, 1), make(chan struct{})
	ctx, cancel := context.WithCancel(f.ctx)
	f.t.Cleanup(func() { cancel(); <-returned })
	go func() {
		defer close(returned)
		done <- run(ctx)
	}()
	return done
}

// publishAsync publishes uuids to topic in tx from a goroutine (async).
func (f *fixture) publishAsync(tx pgx.Tx, topic string, uuids ...string) <-chan error {
	p := f.insertParams(topic, uuids)
	return f.async(func(ctx context.Context) error { return f.Driver.InsertMessages(ctx, tx, p) })
}

// partitioned gives topic n partitions (above 1), every message f
// publishes to it placed in partition 0 (hash 0), where the cases read.
func (f *fixture) partitioned(topic string, n int) {
	f.t.Helper()
	if n <= 1 {
		return
	}
	if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: n}); err != nil {
		f.t.Fatalf("topic %s of %d partitions: %v", topic, n, err)
	}
	if f.inZero == nil {
		f.inZero = map[string]bool{}
	}
	f.inZero[topic] = true
}

// testUnrelatedWriterHoldsNothing: a writing transaction that published
// nothing delays no delivery (with xmin positions, it held every topic).
func testUnrelatedWriterHoldsNothing(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "unrelated"
	writer := f.begin()
	if _, err := writer.Exec(f.ctx, `CREATE TEMPORARY TABLE scratch (x integer) ON COMMIT DROP`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(f.ctx, `INSERT INTO scratch VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	f.publish(f.Pool, topic, "m1", "m2")
	res := f.read(f.selectParams(topic, 0, pgsql.Position{}))
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"m1", "m2"}) || res.Pending {
		t.Fatalf("while an unrelated writer runs: %v (pending %t), want [m1 m2]", got, res.Pending)
	}
}

// testOpenPublisherHoldsOnlyItsTopic: a transaction that published to A
// and stays open holds back A's later messages, not B's, and BoundHolder
// names it (on Citus, its backend on A's worker, and the worker); once it
// commits, A's messages come in position order, its own first.
func testOpenPublisherHoldsOnlyItsTopic(t *testing.T, f *fixture) {
	f.positionsOnly()
	tx := f.begin()
	f.publish(tx, "a", "a1")
	f.publish(f.Pool, "a", "a2")
	f.publish(f.Pool, "b", "b1")
	if res := f.read(f.selectParams("b", 0, pgsql.Position{})); !slices.Equal(uuidsOf(res.Messages), []string{"b1"}) {
		t.Fatalf("b while a's publisher runs: %v, want [b1]", uuidsOf(res.Messages))
	}
	if res := f.read(f.selectParams("a", 0, pgsql.Position{})); len(res.Messages) != 0 || !res.Pending {
		t.Fatalf("a while its publisher runs: %v (pending %t), want nothing, pending", uuidsOf(res.Messages), res.Pending)
	}
	// The publisher's backend: on Citus, the one of the topic's worker
	// that its transaction registered in.
	var pid int32
	if err := tx.QueryRow(f.ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if f.Citus {
		held := f.node("a").topicKeyHolders("a")
		if len(held) != 1 {
			t.Fatalf("holders of a's key on its worker: %v; want the publisher's", held)
		}
		pid = held[0]
	}
	h, topicOnly, err := f.Driver.BoundHolder(f.ctx, f.Pool, "a", 0)
	if err != nil || !topicOnly || h.PID == nil || *h.PID != pid || h.Xmin == 0 || (h.Node != nil) != f.Citus {
		t.Fatalf("holder of a: %+v, %t, %v; want pid %d and its position (and, on Citus, the worker)", h, topicOnly, err, pid)
	}
	if h, _, err := f.Driver.BoundHolder(f.ctx, f.Pool, "b", 0); err != nil || h.PID != nil {
		t.Fatalf("holder of b: %+v, %v; want none", h, err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.drain("a"); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("a after the commit: %v, want [a1 a2]", got)
	}
}

// release rolls holder back, so that the publisher it held goes on,
// waits for that publisher's insert (done) and commits its transaction q.
func (f *fixture) release(holder, q pgx.Tx, done <-chan error) {
	f.t.Helper()
	if err := holder.Rollback(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	if err := <-done; err != nil {
		f.t.Fatalf("q's insert: %v", err)
	}
	if err := q.Commit(f.ctx); err != nil {
		f.t.Fatal(err)
	}
}

// insertWaiting matches the text of pglease's insert statement on a
// single node in pg_stat_activity, which keeps only its first 1024 bytes
// (track_activity_query_size): the statement registers in them (the
// setting pglease.registered, written out for a topic of one partition,
// else the registration function's name), and names the messages table
// only after.
const insertWaiting = `WITH %pglease.registered%`

// testPublisherBetweenReadingVAndLocks: a publisher that read v but holds
// no lock yet is not among the holders; the bound a reader computes then
// is passed by no position the publisher takes after (they are taken
// after its locks). The publisher is held there by an exclusive lock on
// the tagged key of v, which the case takes first.
func testPublisherBetweenReadingVAndLocks(t *testing.T, f *fixture) {
	publisherBetweenReadingVAndLocks(t, f, "between-v-and-locks", 1)
}

// testPartitionedPublisherBetweenReadingVAndLocks is
// testPublisherBetweenReadingVAndLocks on a topic of two partitions
// (every message in partition 0): pglease's statement registers there by
// the registration function, not by the steps it writes out for a topic
// of one partition.
func testPartitionedPublisherBetweenReadingVAndLocks(t *testing.T, f *fixture) {
	publisherBetweenReadingVAndLocks(t, f, "between-v-and-locks-partitioned", 2)
}

func publisherBetweenReadingVAndLocks(t *testing.T, f *fixture, topic string, partitions int) {
	f.positionsOnly()
	f.partitioned(topic, partitions)
	n := f.node(topic)
	f.publish(f.Pool, topic, "m0")
	holder := n.begin()
	v := n.lastValue()
	// The key of v, and of v + 1: a publisher that took its position
	// before it read v (the order this case guards) would wait there.
	if _, err := holder.Exec(f.ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1::bigint), pg_catalog.pg_advisory_xact_lock($1::bigint + 1)`,
		int64(0x70<<56|v)); err != nil {
		t.Fatal(err)
	}
	q := f.begin()
	done := f.publishAsync(q, topic, "q1")
	n.waitPublisherBlocked()
	// Moved on, so that p1's publisher reads another v than the keys held.
	n.exec(`SELECT pg_catalog.nextval($1::text::regclass), pg_catalog.nextval($1::text::regclass)`, f.Tables.PositionSequence())
	f.publish(f.Pool, topic, "p1")
	b := f.bound(topic)
	res := f.readBelow(topic, pgsql.Position{}, b)
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"m0", "p1"}) {
		t.Fatalf("read below the bound while q waits before its locks: %v, want [m0 p1]", got)
	}
	passed := res.Messages[1].Position
	f.release(holder, q, done)
	if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, passed)).Messages); !slices.Equal(got, []string{"q1"}) {
		t.Fatalf("after the position passed: %v, want [q1] (not skipped)", got)
	}
}

// testPositionTakenBeforeRegistration: a plain INSERT (an application's
// own, a release before 18) gets a value for its position before its
// trigger registers: on a single node the column's default takes one
// from the sequence, on Citus the coordinator evaluates the default (its
// own transaction id, a number the worker's readers know nothing of).
// Held between that value and its registration (by an exclusive lock on
// the tagged key of the v it reads), it is not among the holders, so a
// reader passes positions above that value; the row does not keep it:
// its trigger takes its position after the registration, above what the
// reader passed, and it is read after.
func testPositionTakenBeforeRegistration(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "position-before-registration"
	n := f.node(topic)
	f.publish(f.Pool, topic, "m0")
	holder := n.begin()
	v0 := n.lastValue()
	// The key of v0 (on Citus, the v the trigger reads) and of v0 + 1
	// (on a single node, where the default took v0 + 1 first).
	if _, err := holder.Exec(f.ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1::bigint), pg_catalog.pg_advisory_xact_lock($1::bigint + 1)`,
		int64(0x70<<56|v0)); err != nil {
		t.Fatal(err)
	}
	q := f.begin()
	done := f.async(func(ctx context.Context) error {
		_, err := q.Exec(ctx, `INSERT INTO `+f.Tables.Messages+` (topic, uuid, payload) VALUES ($1, 'q1', 'q1')`, topic)
		return err
	})
	waiting := "INSERT INTO " + f.Tables.Messages + "%"
	if f.Citus {
		waiting = n.Waiting
	}
	n.waitBlocked(waiting)
	if held := n.topicKeyHolders(topic); len(held) != 0 {
		t.Fatalf("holders of %s while q waits before its registration: %v; want none", topic, held)
	}
	// On a single node q's default took v0 + 1 already; on Citus nothing
	// was taken from the worker's sequence.
	taken := v0
	if !f.Citus {
		taken = v0 + 1
	}
	if v := n.lastValue(); v != taken {
		t.Fatalf("sequence while q waits: %d, want %d", v, taken)
	}
	n.exec(`SELECT pg_catalog.nextval($1::text::regclass), pg_catalog.nextval($1::text::regclass)`, f.Tables.PositionSequence())
	f.publish(f.Pool, topic, "p1")
	b := f.bound(topic)
	if b <= taken {
		t.Fatalf("bound %d while q waits, want above the value q's default took (%d)", b, taken)
	}
	res := f.readBelow(topic, pgsql.Position{}, b)
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"m0", "p1"}) {
		t.Fatalf("read below the bound while q waits before its registration: %v, want [m0 p1]", got)
	}
	passed := res.Messages[1].Position
	f.release(holder, q, done)
	if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, passed)).Messages); !slices.Equal(got, []string{"q1"}) {
		t.Fatalf("after the position passed: %v, want [q1] (not skipped)", got)
	}
}

// testPublisherBetweenLocksAndPosition: a publisher that holds its locks
// but has no position yet holds the bound at or below v + 1, v the last
// value handed out when it registered, and takes its position above it.
// The publisher is held before nextval by an open ALTER SEQUENCE of the
// case (which holds every nextval, so the bound is v + 1 for any topic).
func testPublisherBetweenLocksAndPosition(t *testing.T, f *fixture) {
	publisherBetweenLocksAndPosition(t, f, "between-locks-and-nextval", 1)
}

// testPartitionedPublisherBetweenLocksAndPosition is
// testPublisherBetweenLocksAndPosition on a topic of two partitions (see
// testPartitionedPublisherBetweenReadingVAndLocks).
func testPartitionedPublisherBetweenLocksAndPosition(t *testing.T, f *fixture) {
	publisherBetweenLocksAndPosition(t, f, "between-locks-and-nextval-partitioned", 2)
}

func publisherBetweenLocksAndPosition(t *testing.T, f *fixture, topic string, partitions int) {
	f.positionsOnly()
	f.partitioned(topic, partitions)
	n := f.node(topic)
	f.publish(f.Pool, topic, "m0")
	holder := n.begin()
	// On a worker, the sequence is the worker's own: not a change Citus
	// would propagate.
	if _, err := holder.Exec(f.ctx, `SELECT pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true)
WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(f.ctx, `ALTER SEQUENCE `+f.Tables.PositionSequence()+` CACHE 1`); err != nil {
		t.Fatal(err)
	}
	v := n.lastValue()
	q := f.begin()
	done := f.publishAsync(q, topic, "q1")
	n.waitPublisherBlocked()
	// Blocked after its registration, not before (reading v must not
	// wait for what nextval waits for).
	if h, _, err := f.Driver.BoundHolder(f.ctx, f.Pool, topic, 0); err != nil || h.PID == nil {
		t.Fatalf("holder of %s while q waits for nextval: %+v, %v; want q", topic, h, err)
	}
	b := f.bound(topic)
	if b > v+1 {
		t.Fatalf("bound %d while q holds its locks without a position, want at most v + 1 = %d", b, v+1)
	}
	if res := f.readBelow(topic, pgsql.Position{}, b); !slices.Equal(uuidsOf(res.Messages), []string{"m0"}) {
		t.Fatalf("read below the bound: %v, want [m0]", uuidsOf(res.Messages))
	}
	f.release(holder, q, done)
	if got := f.drain(topic); !slices.Equal(got, []string{"m0", "q1"}) {
		t.Fatalf("after q's commit: %v, want [m0 q1]", got)
	}
}

// testReaderBetweenItsStatements: a reader computes its bound, then
// publishers commit, abort or register before its read; the read below
// that bound returns only what lay below it, and the next read (a new
// bound) the rest: nothing is skipped, nothing read twice.
func testReaderBetweenItsStatements(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "reader-between"
	f.publish(f.Pool, topic, "m0")
	committing := f.begin()
	f.publish(committing, topic, "c1")
	aborting := f.begin()
	f.publish(aborting, topic, "x1")
	b := f.bound(topic)
	// Between the reader's two statements: one publisher commits, one
	// aborts, a third registers, publishes and commits.
	if err := committing.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := aborting.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.publish(f.Pool, topic, "n1")
	res := f.readBelow(topic, pgsql.Position{}, b)
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"m0"}) || !res.Pending {
		t.Fatalf("read below the bound computed before: %v (pending %t), want [m0], pending", got, res.Pending)
	}
	if got := f.drain(topic); !slices.Equal(got, []string{"m0", "c1", "n1"}) {
		t.Fatalf("read again: %v, want [m0 c1 n1]", got)
	}
}

// testManyTopicsInOneTransaction: a transaction that publishes to two
// topics in one statement holds back both, and a third not at all.
func testManyTopicsInOneTransaction(t *testing.T, f *fixture) {
	f.positionsOnly()
	tx := f.begin()
	p := pgsql.InsertMessagesParams{NotifyChannel: f.Tables.NotifyChannel,
		Topics: []string{"many-a", "many-b"}, UUIDs: []string{"a1", "b1"}, Payloads: [][]byte{nil, nil}, Metadata: []string{"", ""}}
	if err := f.Driver.InsertMessages(f.ctx, tx, p); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"many-a", "many-b", "many-c"} {
		f.publish(f.Pool, topic, topic+"-later")
	}
	for _, topic := range []string{"many-a", "many-b"} {
		if res := f.read(f.selectParams(topic, 0, pgsql.Position{})); len(res.Messages) != 0 || !res.Pending {
			t.Fatalf("%s while the publisher runs: %v, want nothing, pending", topic, uuidsOf(res.Messages))
		}
	}
	if got := uuidsOf(f.read(f.selectParams("many-c", 0, pgsql.Position{})).Messages); !slices.Equal(got, []string{"many-c-later"}) {
		t.Fatalf("many-c while the publisher runs: %v, want [many-c-later]", got)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.drain("many-a"); !slices.Equal(got, []string{"a1", "many-a-later"}) {
		t.Fatalf("many-a: %v", got)
	}
	if got := f.drain("many-b"); !slices.Equal(got, []string{"b1", "many-b-later"}) {
		t.Fatalf("many-b: %v", got)
	}
}

// testPublishWaitPublishAgain: a transaction that publishes, waits while
// others publish and commit, and publishes again holds the topic from its
// first registration to its end; its messages and the others' come in
// position order, none skipped.
func testPublishWaitPublishAgain(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "again"
	tx := f.begin()
	f.publish(tx, topic, "q1")
	f.publish(f.Pool, topic, "p1")
	if res := f.read(f.selectParams(topic, 0, pgsql.Position{})); len(res.Messages) != 0 {
		t.Fatalf("while q runs: %v, want nothing", uuidsOf(res.Messages))
	}
	f.publish(tx, topic, "q2")
	f.publish(f.Pool, topic, "p2")
	if res := f.read(f.selectParams(topic, 0, pgsql.Position{})); len(res.Messages) != 0 {
		t.Fatalf("while q runs, after its second insert: %v, want nothing", uuidsOf(res.Messages))
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.drain(topic); !slices.Equal(got, []string{"q1", "p1", "q2", "p2"}) {
		t.Fatalf("after q's commit: %v, want [q1 p1 q2 p2]", got)
	}
}

// testSavepointRolledBackAfterRegistration: a savepoint rolled back after
// the registration releases its locks and forgets it (the setting reverts
// with them), so the topic is no longer held; a later insert in the same
// transaction registers again, above what readers passed meanwhile.
func testSavepointRolledBackAfterRegistration(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "savepoint"
	n := f.node(topic)
	tx := f.begin()
	if _, err := tx.Exec(f.ctx, `SAVEPOINT s`); err != nil {
		t.Fatal(err)
	}
	f.publish(tx, topic, "gone")
	if _, err := tx.Exec(f.ctx, `ROLLBACK TO SAVEPOINT s`); err != nil {
		t.Fatal(err)
	}
	if held := n.topicKeyHolders(topic); len(held) != 0 {
		t.Fatalf("holders of %s's key after the rollback to the savepoint: %v; want none", topic, held)
	}
	f.publish(f.Pool, topic, "p1")
	res := f.read(f.selectParams(topic, 0, pgsql.Position{}))
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"p1"}) {
		t.Fatalf("after the rollback to the savepoint: %v, want [p1]", got)
	}
	f.publish(tx, topic, "q1")
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, res.Messages[0].Position)).Messages); !slices.Equal(got, []string{"q1"}) {
		t.Fatalf("after p1: %v, want [q1]", got)
	}
}

// testBoundCountsOnlyWriters: a transaction that takes a topic's key and a
// tagged key itself, without a lock on the messages table (what a role
// that may not write it can do), does not lower the bound; the bound
// refuses to run where its read would share its snapshot.
func testBoundCountsOnlyWriters(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "forged"
	n := f.node(topic)
	f.publish(f.Pool, topic, "m0")
	forger := n.begin()
	// The relation's oid from its name, not from pg_class: Citus hides
	// the shards there from a client's connection to a worker.
	if _, err := forger.Exec(f.ctx, `SELECT pg_catalog.pg_advisory_xact_lock_shared(
	(r.oid - CASE WHEN r.oid >= 2147483648 THEN 4294967296 ELSE 0 END)::integer,
	pg_catalog.hashtext($2::text || ':0')),
	pg_catalog.pg_advisory_xact_lock_shared(8070450532247928832 | 1)
FROM (SELECT $1::text::regclass::oid::bigint AS oid) r`, n.Rel, topic); err != nil {
		t.Fatal(err)
	}
	if held := n.topicKeyHolders(topic); len(held) != 1 {
		t.Fatalf("holders of %s's key: %v; want the forger", topic, held)
	}
	v := n.lastValue()
	if b := f.bound(topic); b != v+1 {
		t.Fatalf("bound with a holder that may not write: %d, want %d", b, v+1)
	}
	rr, err := f.Pool.BeginTx(f.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rr.Rollback(context.WithoutCancel(f.ctx)) }()
	// On Citus the worker's transaction is at the coordinator's level:
	// the worker's function refuses too.
	if _, err := f.Driver.PositionBounds(f.ctx, rr, []string{topic}, []int32{0}); err == nil ||
		!strings.Contains(err.Error(), "needs READ COMMITTED") {
		t.Fatalf("the bound in a REPEATABLE READ transaction: %v; want its refusal", err)
	}
}

// testInsertsThatDidNotRegister: since schema version 18 pglease's
// statement registers its partitions itself and its rows skip the
// trigger's per-row test of the registration mark; a plain INSERT in the
// same transaction (an application's own, or a release before 18), for
// a topic the statement did not register, is still registered by the
// trigger: it holds its topic back until it commits, and is not skipped.
// A registered statement's rows and the trigger's store
// needs_registration NULL alike.
func testInsertsThatDidNotRegister(t *testing.T, f *fixture) {
	f.positionsOnly()
	tx := f.begin()
	f.publish(tx, "registered", "r1")
	if _, err := tx.Exec(f.ctx, `INSERT INTO `+f.Tables.Messages+` (topic, uuid, payload) VALUES ('plain', 'p1', 'p1')`); err != nil {
		t.Fatal(err)
	}
	f.publish(f.Pool, "plain", "p2")
	f.publish(f.Pool, "registered", "r2")
	for _, topic := range []string{"registered", "plain"} {
		if res := f.read(f.selectParams(topic, 0, pgsql.Position{})); len(res.Messages) != 0 {
			t.Fatalf("%s while its publisher's transaction is open: %v, want nothing", topic, uuidsOf(res.Messages))
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.drain("plain"); !slices.Equal(got, []string{"p1", "p2"}) {
		t.Fatalf("plain after the commit: %v, want [p1 p2]", got)
	}
	if got := f.drain("registered"); !slices.Equal(got, []string{"r1", "r2"}) {
		t.Fatalf("registered after the commit: %v, want [r1 r2]", got)
	}
	f.noneNeedRegistration("registered", "plain")
}

// testResetToTimeBoundBeforeSnapshot: a reset to a time reads the
// partition's bound in a statement before its own, as a reader does. The
// reset's statement is held after its snapshot (by the offset row's lock,
// which it waits for) while a publisher that had published after the time
// commits: with the bound read in the same statement (after that
// snapshot, the publisher gone from pg_locks, its row not in the
// snapshot), the group moved past the publisher's message; with the bound
// read before, the group starts below it.
func testResetToTimeBoundBeforeSnapshot(t *testing.T, f *fixture) {
	f.positionsOnly()
	const group, topic = "g", "reset-time"
	f.ensure(group, topic)
	var at time.Time
	if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.now() - interval '1 millisecond'`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	r := f.begin()
	f.publish(r, topic, "r1")
	f.publish(f.Pool, topic, "f1")
	locker := f.lockRows(group, topic)
	done := f.resetAsync(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "time", At: at})
	f.waitBlocked(1, "%FOR UPDATE%", "%FOR UPDATE%")
	if err := r.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := locker.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || len(res.rows) != 1 || !res.rows[0].Applied {
		t.Fatalf("reset to the time: %+v, %v; want applied", res.rows, res.err)
	}
	if got := f.drainFrom(topic, res.rows[0].To); !slices.Equal(got, []string{"r1", "f1"}) {
		t.Fatalf("after the reset to a time before both: %v, want [r1 f1] (the message committed during the reset not skipped)", got)
	}
}

// testKeyedInsertHoldsItsTopic: a keyed publish registers its partitions
// as the plain one does (its statement, or the trigger where the
// statement does not): while its transaction is open, a later message of
// its topic is not read, and after the commit both come in order; its
// row stores needs_registration NULL.
func testKeyedInsertHoldsItsTopic(t *testing.T, f *fixture) {
	f.positionsOnly()
	const topic = "keyed-holds"
	tx := f.begin()
	if skipped := f.insertKeyed(tx, topic, keyed{"k1", "key-1"}); len(skipped) != 0 {
		t.Fatalf("keyed insert left out %v", skipped)
	}
	f.publish(f.Pool, topic, "p2")
	if res := f.read(f.selectParams(topic, 0, pgsql.Position{})); len(res.Messages) != 0 {
		t.Fatalf("%s while the keyed publisher's transaction is open: %v, want nothing", topic, uuidsOf(res.Messages))
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.drain(topic); !slices.Equal(got, []string{"k1", "p2"}) {
		t.Fatalf("%s after the commit: %v, want [k1 p2]", topic, got)
	}
	f.noneNeedRegistration(topic)
}

// testOpenPublishersListed: a transaction that published and stays open
// is listed by OpenPublishers with the partition it published to, its
// backend and the position it registered; on Citus one topic on each of
// two workers, each transaction listed with its backend on the topic's
// worker, the worker, and the coordinator's session whose transaction it
// runs. A transaction that wrote something else there is not listed;
// once the publishers commit, none is.
func testOpenPublishersListed(t *testing.T, f *fixture) {
	f.positionsOnly()
	topics := f.topicsApart(2)
	// Partitions are named when they have settings (or offset rows): the
	// first topic has 1 partition, the second 3, its message in
	// partition 2.
	want := map[string]int32{topics[0]: 0, topics[1]: 2}
	for k, topic := range topics {
		if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: 1 + 2*k}); err != nil {
			t.Fatal(err)
		}
	}
	type publisher struct {
		tx     pgx.Tx
		client int32 // the session's backend (on Citus, the coordinator's)
		pid    int32 // the backend holding the key (on Citus, the worker's)
		node   positionsNode
	}
	pubs := map[string]publisher{}
	for _, topic := range topics {
		p := publisher{tx: f.begin(), node: f.node(topic)}
		if err := p.tx.QueryRow(f.ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&p.client); err != nil {
			t.Fatal(err)
		}
		params := f.insertParams(topic, []string{topic + "-1"})
		params.PartitionHashes = []uint32{uint32(want[topic])}
		if err := f.Driver.InsertMessages(f.ctx, p.tx, params); err != nil {
			t.Fatal(err)
		}
		p.pid = p.client
		if f.Citus {
			held := p.node.topicKeyHoldersOf(topic, want[topic])
			if len(held) != 1 {
				t.Fatalf("holders of %s's key on its worker: %v; want the publisher's", topic, held)
			}
			p.pid = held[0]
		}
		pubs[topic] = p
	}
	// A writer of the same node that published nothing.
	writer := pubs[topics[0]].node.begin()
	if _, err := writer.Exec(f.ctx, `CREATE TEMPORARY TABLE scratch (x integer) ON COMMIT DROP`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(f.ctx, `INSERT INTO scratch VALUES (1)`); err != nil {
		t.Fatal(err)
	}

	rows, ok, err := f.Driver.OpenPublishers(f.ctx, f.Pool)
	if err != nil || !ok {
		t.Fatalf("OpenPublishers: %v, ok %t", err, ok)
	}
	// Other cases' publishers may run at the same time on the cluster:
	// only this case's partitions count.
	listed := map[string]pgsql.PublisherRow{}
	for _, r := range rows {
		for k, topic := range r.Topics {
			if _, ours := want[topic]; ours {
				if _, twice := listed[topic]; twice {
					t.Fatalf("%s listed twice: %+v", topic, rows)
				}
				if r.Partitions[k] != want[topic] {
					t.Fatalf("%s: partition %d, want %d", topic, r.Partitions[k], want[topic])
				}
				listed[topic] = r
			}
		}
	}
	for _, topic := range topics {
		r, found := listed[topic]
		p := pubs[topic]
		if !found {
			t.Fatalf("%s's publisher not listed: %+v", topic, rows)
		}
		if r.PID == nil || *r.PID != p.pid || r.Xmin == 0 || r.Held != 1 || len(r.Topics) != 1 || r.AgeSeconds == nil {
			t.Fatalf("%s's publisher: %+v; want pid %d, a position, one partition held", topic, r, p.pid)
		}
		if !f.Citus {
			if r.Node != nil || r.Client != nil || r.GlobalPID != nil {
				t.Fatalf("%s's publisher on a single node: %+v; want no worker, no client", topic, r)
			}
			continue
		}
		var worker string
		if err := f.Pool.QueryRow(f.ctx, `SELECT p.nodename || ':' || p.nodeport FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, f.Tables.Messages, topic).Scan(&worker); err != nil {
			t.Fatal(err)
		}
		if r.Node == nil || *r.Node != worker {
			t.Fatalf("%s's publisher: worker %v, want %s", topic, r.Node, worker)
		}
		if r.GlobalPID == nil || r.Client == nil || r.Client.PID == nil || *r.Client.PID != p.client ||
			r.Client.XactStart == nil || r.Client.Query == nil || !strings.Contains(*r.Client.Query, "INSERT") {
			t.Fatalf("%s's publisher: client %+v (global pid %v); want the coordinator's pid %d, its transaction and query",
				topic, r.Client, r.GlobalPID, p.client)
		}
	}
	if !f.Citus {
		// On Citus the second topic lies on another worker; on a single
		// node both are one server's, one transaction each.
		if listed[topics[0]].PID == listed[topics[1]].PID {
			t.Fatalf("two transactions listed as one: %+v", rows)
		}
	}
	var writerPID int32
	if err := writer.QueryRow(f.ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&writerPID); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.PID != nil && *r.PID == writerPID && (!f.Citus || r.Node != nil && *r.Node == *listed[topics[0]].Node) {
			t.Fatalf("a writer that published nothing listed: %+v", r)
		}
	}

	for _, topic := range topics {
		if err := pubs[topic].tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	rows, _, err = f.Driver.OpenPublishers(f.ctx, f.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		for _, topic := range r.Topics {
			if _, ours := want[topic]; ours {
				t.Fatalf("%s still listed after its publisher committed: %+v", topic, r)
			}
		}
	}
}

// topicsApart returns n topic names: on Citus each on a worker of its
// own (the case is skipped on a cluster of fewer workers), on a single
// node any n.
func (f *fixture) topicsApart(n int) []string {
	f.t.Helper()
	var out []string
	seen := map[string]bool{}
	for i := 0; len(out) < n && i < 1000; i++ {
		topic := fmt.Sprintf("apart-%d", i)
		where := topic
		if f.Citus {
			if err := f.Pool.QueryRow(f.ctx, `SELECT p.nodename || ':' || p.nodeport FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`, f.Tables.Messages, topic).Scan(&where); err != nil {
				f.t.Fatalf("the worker of %s: %v", topic, err)
			}
		}
		if !seen[where] {
			seen[where] = true
			out = append(out, topic)
		}
	}
	if len(out) < n {
		f.t.Skipf("no %d workers to place topics on", n)
	}
	return out
}

// topicKeyHoldersOf returns the backends of the node that hold the key
// of topic's partition: a prepared transaction's as 0.
func (n positionsNode) topicKeyHoldersOf(topic string, partition int32) []int32 {
	n.f.t.Helper()
	var pids []int32
	if err := n.Pool.QueryRow(n.f.ctx, `SELECT COALESCE(pg_catalog.array_agg(COALESCE(l.pid, 0) ORDER BY l.pid), '{}')
FROM pg_catalog.pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
	AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
	AND l.classid = $1::text::regclass::oid AND l.objid::bigint = (pg_catalog.hashtext($2::text || ':' || $3::integer)::bigint & 4294967295)`,
		n.Rel, topic, partition).Scan(&pids); err != nil {
		n.f.t.Fatalf("read the holders of %s/%d: %v", topic, partition, err)
	}
	return pids
}
