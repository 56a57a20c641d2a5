package pgsql

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// routedWorker returns a connection to the worker that holds topic's
// shard, and the worker's address as EXPLAIN names it.
func routedWorker(t *testing.T, r Routed, coordinator Querier, cfg *pgx.ConnConfig, topic string) (*pgx.Conn, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shards, err := r.TopicShards(ctx, coordinator, []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := r.Placements(ctx, coordinator)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.ShardID != shards[0] {
			continue
		}
		if p.GroupID == 0 || !p.Metadata {
			t.Fatalf("topic %q lies on %+v: not a worker with the metadata", topic, p)
		}
		c := cfg.Copy()
		c.Host, c.Port, c.Fallbacks = p.Host, uint16(p.Port), nil
		conn, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn, "host=" + p.Host + " port=" + strconv.Itoa(p.Port)
	}
	t.Fatalf("no placement of topic %q's shard %d", topic, shards[0])
	return nil, ""
}

// TestCitusRoutedInsertIsRouterPlanned: on the topic's worker, each
// shape of the routed insert (one partition, the partitions from the
// keys' hashes, from the UUIDs) is a router insert: Citus's adaptive
// executor, one task, on the worker itself; not an INSERT ... SELECT
// (whose rows Citus pulls and copies to the shard as intermediate
// results). The placements' reads are one task too.
func TestCitusRoutedInsertIsRouterPlanned(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := Routed{d: NewCitus(tables).(citus)}
	const topic = "planned"
	if _, err := r.d.UpsertTopic(ctx, pool, TopicParams{Topic: "parts", Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	conn, here := routedWorker(t, r, pool, pool.Config().ConnConfig, topic)
	explain := func(s Stmt) string {
		t.Helper()
		rows, err := conn.Query(ctx, `EXPLAIN (COSTS OFF) `+s.SQL, s.Args...)
		if err != nil {
			t.Fatalf("EXPLAIN %s: %v", s.SQL, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	p := InsertMessagesParams{Topics: []string{topic, topic, topic}, UUIDs: []string{"a", "b", "c"},
		Payloads: [][]byte{[]byte("a"), nil, []byte("c")}, Metadata: []string{"", `{"k":"v"}`, ""}}
	pls, err := r.placements(ctx, conn, []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	three := pls[0]
	three.partitions = 3
	hashed := p
	hashed.PartitionHashes = []uint32{1, 2, 3}
	for _, c := range []struct {
		name string
		p    InsertMessagesParams
		pl   routedPlacement
		how  int
	}{{"one partition", p, pls[0], routedOnePartition}, {"hashes", hashed, three, routedHashes}, {"by UUID", p, three, routedByUUID}} {
		s, how := r.insertValuesStmt(c.p, topic, []int{0, 1, 2}, c.pl)
		if how != c.how {
			t.Fatalf("%s: the statement's shape is %d, want %d", c.name, how, c.how)
		}
		plan := explain(s)
		for _, want := range []string{"Custom Scan (Citus Adaptive)", "Task Count: 1", "Node: " + here, "Insert on "} {
			if !strings.Contains(plan, want) {
				t.Errorf("%s: the plan on the worker does not say %q:\n%s", c.name, want, plan)
			}
		}
		for _, not := range []string{"INSERT ... SELECT", "pull to coordinator", "repartition", "intermediate", "Subplan"} {
			if strings.Contains(plan, not) {
				t.Errorf("%s: the plan on the worker says %q:\n%s", c.name, not, plan)
			}
		}
	}
	for _, s := range []Stmt{r.topicsStmt([]string{topic, "parts"}), r.usableStmt([]int16{2, 3})} {
		if plan := explain(s); !strings.Contains(plan, "Task Count: 1") || strings.Contains(plan, "Subplan") {
			t.Errorf("the placements' plan on the worker:\n%s", plan)
		}
	}
}

// TestCitusRoutedInsertPlacesAsTheCoordinator: a routed insert of
// several topics' messages, run on a worker, stores each as the
// coordinator's statement places it (the partition from the key's hash
// or, without keys, from the UUID, modulo the topic's count; the
// retention class's partition when usable_until lies past now +
// retention, else the one kept forever), each topic's messages in the
// order given, and returns one notification per (topic, partition)
// written.
//
// Through the coordinator (insertThroughCoordinator, the default), the
// same statements store the same, and send those notifications.
func TestCitusRoutedInsertPlacesAsTheCoordinator(t *testing.T) {
	for _, way := range []string{"routed", "through the coordinator"} {
		t.Run(way, func(t *testing.T) { testInsertPlaces(t, way == "routed") })
	}
}

func testInsertPlaces(t *testing.T, routed bool) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := NewCitus(tables).(citus)
	r := Routed{d: d}
	const parts, kept, late, plain = "parts", "kept", "late", "plain"
	const keptClass, lateClass = 2, 3
	for _, tp := range []TopicParams{{Topic: parts, Partitions: 4},
		{Topic: kept, Partitions: 1, Retention: time.Hour, RetentionClass: keptClass},
		{Topic: late, Partitions: 1, Retention: time.Hour, RetentionClass: lateClass}} {
		if _, err := d.UpsertTopic(ctx, pool, tp); err != nil {
			t.Fatalf("upsert topic %s: %v", tp.Topic, err)
		}
	}
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := d.CreateRetentionPartition(ctx, pool, RetentionPartition{Class: keptClass, Start: start, End: start.Add(4 * time.Hour)}); err != nil {
		t.Fatalf("create the retention partition: %v", err)
	}
	if ok, err := d.SetUsableUntil(ctx, pool, keptClass, start.Add(4*time.Hour)); err != nil || !ok {
		t.Fatalf("set usable_until: %v, %v", ok, err)
	}
	// One worker runs the inserts of every topic: those whose shard lies
	// on the other, Citus forwards there.
	conn, _ := routedWorker(t, r, pool, pool.Config().ConnConfig, parts)
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if err := Listen(ctx, listener, tables.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	type msg struct {
		topic, uuid string
		hash        uint32
	}
	insert := func(hashes bool, msgs ...msg) []string {
		t.Helper()
		p := InsertMessagesParams{}
		for _, m := range msgs {
			p.Topics = append(p.Topics, m.topic)
			p.UUIDs = append(p.UUIDs, m.uuid)
			p.Payloads = append(p.Payloads, []byte(m.uuid))
			p.Metadata = append(p.Metadata, "")
			if hashes {
				p.PartitionHashes = append(p.PartitionHashes, m.hash)
			}
		}
		var payloads []string
		if routed {
			left, got, err := r.InsertKeyed(ctx, conn, p)
			if err != nil || len(left) != 0 {
				t.Fatalf("routed insert: %v, %v", left, err)
			}
			payloads = got
		} else {
			p.NotifyChannel = tables.NotifyChannel
			if err := d.InsertMessages(ctx, pool, p); err != nil {
				t.Fatalf("insert through the coordinator: %v", err)
			}
			payloads = notificationsUntilMarker(t, listener, pool, tables.NotifyChannel)
		}
		slices.Sort(payloads)
		return payloads
	}
	m, n := string(rune(NotifyMessages)), string(rune(NotifyPartition))
	storedFrom := time.Now().Truncate(time.Microsecond)
	got := insert(true, msg{plain, "a", 0}, msg{parts, "p1", 1}, msg{kept, "k1", 0}, msg{plain, "b", 0},
		msg{late, "l1", 0}, msg{parts, "p6", 6}, msg{kept, "k2", 0}, msg{parts, "p5", 5})
	if want := []string{m + kept, m + late, m + plain, n + "1:" + parts, n + "2:" + parts}; !slices.Equal(got, want) {
		t.Errorf("notifications of the insert with hashes = %q, want %q", got, want)
	}
	// Without keys, the partition of each message is the UUID's hash
	// modulo the count, as the coordinator's statement computes it.
	byUUID := []string{"u1", "u2", "u3", "u4", "u5", "u6"}
	var wantParts []int32
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.array_agg(((pg_catalog.hashtext(u)::bigint & 4294967295) % 4)::integer ORDER BY n)
		FROM unnest($1::text[]) WITH ORDINALITY AS x(u, n)`, byUUID).Scan(&wantParts); err != nil {
		t.Fatal(err)
	}
	var msgs []msg
	want := map[string]bool{m + plain: true}
	for i, u := range byUUID {
		msgs = append(msgs, msg{topic: parts, uuid: u})
		want[messagesPayloadOf(wantParts[i], parts)] = true
		if i == 2 {
			msgs = append(msgs, msg{topic: plain, uuid: "c"})
		}
	}
	got = insert(false, msgs...)
	storedUntil := time.Now()
	var wantPayloads []string
	for s := range want {
		wantPayloads = append(wantPayloads, s)
	}
	slices.Sort(wantPayloads)
	if !slices.Equal(got, wantPayloads) {
		t.Errorf("notifications of the insert by UUID = %q, want %q", got, wantPayloads)
	}

	rows, err := pool.Query(ctx, `SELECT topic, partition, uuid, retention_class, expires_at FROM `+tables.Messages+`
		ORDER BY topic, partition, transaction_id`)
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		topic     string
		partition int32
		uuid      string
		class     int16
		expires   pgtype.Timestamptz
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (stored, error) {
		var s stored
		err := row.Scan(&s.topic, &s.partition, &s.uuid, &s.class, &s.expires)
		return s, err
	})
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string][]string{}
	for _, s := range all {
		key := s.topic + "/" + strconv.Itoa(int(s.partition))
		placed[key] = append(placed[key], s.uuid)
		switch {
		case s.topic == kept:
			lo, hi := storedFrom.Add(time.Hour), storedUntil.Add(time.Hour)
			if s.class != keptClass || s.expires.Time.Before(lo) || s.expires.Time.After(hi) {
				t.Errorf("%s: class %d, expires %v; want %d, within [%v, %v]", s.uuid, s.class, s.expires, keptClass, lo, hi)
			}
		case s.class != 0 || s.expires.InfinityModifier != pgtype.Infinity:
			t.Errorf("%s: class %d, expires %v; want 0, infinity", s.uuid, s.class, s.expires)
		}
	}
	wantPlaced := map[string][]string{plain + "/0": {"a", "b", "c"}, kept + "/0": {"k1", "k2"}, late + "/0": {"l1"},
		parts + "/1": {"p1", "p5"}, parts + "/2": {"p6"}}
	for i, u := range byUUID {
		key := parts + "/" + strconv.Itoa(int(wantParts[i]))
		wantPlaced[key] = append(wantPlaced[key], u)
	}
	for key, uuids := range wantPlaced {
		if !slices.Equal(placed[key], uuids) {
			t.Errorf("%s holds %q in the order of their positions, want %q", key, placed[key], uuids)
		}
	}
	if len(placed) != len(wantPlaced) {
		t.Errorf("stored in %v, want %v", placed, wantPlaced)
	}
}

// notificationsUntilMarker sends a marker on channel through q, in a
// transaction of its own, and returns the payloads listener receives
// before it: the notifications of the transactions committed before.
func notificationsUntilMarker(t *testing.T, listener *pgxpool.Conn, q Querier, channel string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	marker := "marker " + uuid.NewString()
	if _, err := q.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, channel, marker); err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		n, err := listener.Conn().WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("waiting for the marker after %q: %v", out, err)
		}
		if n.Payload == marker {
			return out
		}
		out = append(out, n.Payload)
	}
}

// TestBefore: before compares two timestamptz values as PostgreSQL
// does, infinities included; NULL is never before nor after.
func TestBefore(t *testing.T) {
	at := func(s int64) pgtype.Timestamptz { return pgtype.Timestamptz{Time: time.Unix(s, 0), Valid: true} }
	inf := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	ninf := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for _, c := range []struct {
		a, b pgtype.Timestamptz
		want bool
	}{
		{at(1), at(2), true}, {at(2), at(1), false}, {at(1), at(1), false},
		{at(1), inf, true}, {inf, at(1), false}, {inf, inf, false},
		{ninf, at(1), true}, {at(1), ninf, false}, {ninf, ninf, false}, {ninf, inf, true},
		{at(1), pgtype.Timestamptz{}, false}, {pgtype.Timestamptz{}, at(1), false},
	} {
		if got := before(c.a, c.b); got != c.want {
			t.Errorf("before(%v, %v) = %t, want %t", c.a, c.b, got, c.want)
		}
	}
}

// TestCitusRoutedInsertIsAllOrNothing: a routed call of several topics,
// one of whose shards lies on the other worker (Citus forwards its
// insert there, as after a shard move until the Publisher reads the
// catalog again), stores nothing when a later topic's insert fails. A
// pipeline's implicit transaction is not enough: Citus sees no
// transaction block there and commits the forwarded insert as its
// statement ends (1 message stored without the transaction of the
// batch's own).
func TestCitusRoutedInsertIsAllOrNothing(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := NewCitus(tables).(citus)
	r := Routed{d: d}
	const local = "all-or-nothing-local"
	conn, _ := routedWorker(t, r, pool, pool.Config().ConnConfig, local)
	ps, err := r.Placements(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	nodeOf := map[int64]int{}
	for _, p := range ps {
		nodeOf[p.ShardID] = p.Port
	}
	names := []string{local}
	for i := range 64 {
		names = append(names, "all-or-nothing-"+strconv.Itoa(i))
	}
	shards, err := r.TopicShards(ctx, pool, names)
	if err != nil {
		t.Fatal(err)
	}
	remote := ""
	for i, name := range names[1:] {
		if nodeOf[shards[i+1]] != nodeOf[shards[0]] {
			remote = name
			break
		}
	}
	if remote == "" {
		t.Fatal("no topic among 64 names on the other worker")
	}
	// The empty topic's insert fails (the messages' check of the topic),
	// after the other two.
	p := InsertMessagesParams{Topics: []string{remote, local, ""}, UUIDs: []string{"r1", "l1", "bad"},
		Payloads: [][]byte{nil, nil, nil}, Metadata: []string{"", "", ""}}
	stored := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+tables.Messages+` WHERE topic = ANY($1)`,
			[]string{remote, local}).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, _, err := r.InsertKeyed(ctx, conn, p); err == nil {
		t.Fatal("routed insert with an empty topic: no error")
	}
	if n := stored(); n != 0 {
		t.Fatalf("routed: %d messages stored by a call that failed, want 0", n)
	}
	// The same call without the bad message stores both.
	p.Topics, p.UUIDs, p.Payloads, p.Metadata = p.Topics[:2], p.UUIDs[:2], p.Payloads[:2], p.Metadata[:2]
	if _, _, err := r.InsertKeyed(ctx, conn, p); err != nil {
		t.Fatal(err)
	}
	if n := stored(); n != 2 {
		t.Fatalf("%d messages stored, want 2", n)
	}

	// Through the coordinator (insertThroughCoordinator), the two
	// topics' inserts go to two workers: on a pool, and on a connection
	// outside a transaction block, a failed call stores nothing either.
	if _, err := pool.Exec(ctx, `DELETE FROM `+tables.Messages+` WHERE topic = ANY($1)`, []string{remote, local}); err != nil {
		t.Fatal(err)
	}
	bad := InsertMessagesParams{Topics: []string{remote, local, ""}, UUIDs: []string{"r1", "l1", "bad"},
		Payloads: [][]byte{nil, nil, nil}, Metadata: []string{"", "", ""}, NotifyChannel: tables.NotifyChannel}
	single, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close(context.Background())
	for _, q := range []struct {
		name string
		q    Querier
	}{{"a pool", pool}, {"a connection", single}} {
		if err := d.InsertMessages(ctx, q.q, bad); err == nil {
			t.Fatalf("%s: insert with an empty topic: no error", q.name)
		}
		if n := stored(); n != 0 {
			t.Fatalf("%s: %d messages stored by a call that failed, want 0", q.name, n)
		}
	}
	if status := single.PgConn().TxStatus(); status != 'I' {
		t.Fatalf("the connection is left in transaction status %q after the failed call", status)
	}
	if err := d.InsertMessages(ctx, single, p); err != nil {
		t.Fatal(err)
	}
	if n := stored(); n != 2 {
		t.Fatalf("through the coordinator: %d messages stored, want 2", n)
	}
}
