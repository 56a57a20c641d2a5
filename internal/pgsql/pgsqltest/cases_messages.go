package pgsqltest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// testInsertAndSelectInOrder: messages inserted by one statement come
// back in the order given, with their payloads and metadata, after the
// position asked, at most the limit; the insert notifies its topic.
func testInsertAndSelectInOrder(t *testing.T, f *fixture) {
	const topic = "orders"
	l := f.listen()
	if err := f.Driver.InsertMessages(f.ctx, f.Pool, pgsql.InsertMessagesParams{
		Topics:        []string{topic, topic, topic},
		UUIDs:         []string{"a", "b", "c"},
		Payloads:      [][]byte{[]byte("a"), []byte("b"), []byte("c")},
		Metadata:      []string{`{"k":"v"}`, "", ""},
		NotifyChannel: f.Tables.NotifyChannel,
	}); err != nil {
		t.Fatal(err)
	}
	f.notified(l, string(rune(pgsql.NotifyMessages))+topic)
	res := f.readSettled(f.selectParams(topic, 0, pgsql.Position{}))
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("read %v, want [a b c]", got)
	}
	for i, m := range res.Messages {
		if string(m.Payload) != m.UUID || m.Size < int64(len(m.Payload)) {
			t.Errorf("message %s: payload %q, size %d", m.UUID, m.Payload, m.Size)
		}
		if i > 0 && !before(res.Messages[i-1].Position, m.Position) {
			t.Errorf("positions out of order: %v then %v", res.Messages[i-1].Position, m.Position)
		}
	}
	if md := res.Messages[0].Metadata; !strings.Contains(md, `"k"`) || !strings.Contains(md, `"v"`) {
		t.Errorf("metadata of a = %q", md)
	}
	if md := res.Messages[1].Metadata; md != "" {
		t.Errorf("metadata of b = %q, want none", md)
	}

	p := f.selectParams(topic, 0, pgsql.Position{})
	p.Limit = 2
	if got := uuidsOf(f.read(p).Messages); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("limit 2: %v, want [a b]", got)
	}
	if got := uuidsOf(f.read(f.selectParams(topic, 0, res.Messages[1].Position)).Messages); !slices.Equal(got, []string{"c"}) {
		t.Errorf("after b: %v, want [c]", got)
	}
	if after := f.read(f.selectParams(topic, 0, res.Messages[2].Position)); len(after.Messages) != 0 || after.Pending || after.WentBack {
		t.Errorf("after c: %+v, want nothing", after)
	}
}

// testInsertManyTopics: one statement with the messages of several
// topics (the Publisher's group commit of concurrent calls) keeps each
// topic's order, places each message as a statement of its topic alone
// would (the partition from the topic's count, 0 without a topics row;
// the retention class's partition when usable_until lies past now +
// retention, else the partition kept forever), notifies each (topic,
// partition) written once, and stores all of its messages or none.
func testInsertManyTopics(t *testing.T, f *fixture) {
	const topic, other, parts, kept, late = "many", "other", "parts", "kept", "late"
	const keptClass, lateClass = 2, 3
	for _, tp := range []pgsql.TopicParams{{Topic: parts, Partitions: 4},
		{Topic: kept, Partitions: 1, Retention: time.Hour, RetentionClass: keptClass},
		{Topic: late, Partitions: 1, Retention: time.Hour, RetentionClass: lateClass}} {
		if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, tp); err != nil {
			t.Fatalf("upsert topic %s: %v", tp.Topic, err)
		}
	}
	// The kept class has a partition covering the next hours, usable;
	// the late class has none (usable_until stays -infinity).
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := f.Driver.CreateRetentionPartition(f.ctx, f.Pool, pgsql.RetentionPartition{Class: keptClass, Start: start, End: start.Add(4 * time.Hour)}); err != nil {
		t.Fatalf("create the retention partition: %v", err)
	}
	if ok, err := f.Driver.SetUsableUntil(f.ctx, f.Pool, keptClass, start.Add(4*time.Hour)); err != nil || !ok {
		t.Fatalf("set usable_until: %v, %v", ok, err)
	}
	type msg struct {
		topic, uuid string
		hash        uint32
	}
	insert := func(channel string, msgs ...msg) error {
		p := pgsql.InsertMessagesParams{NotifyChannel: channel, PartitionHashes: []uint32{}}
		for _, m := range msgs {
			p.Topics = append(p.Topics, m.topic)
			p.UUIDs = append(p.UUIDs, m.uuid)
			p.Payloads = append(p.Payloads, []byte(m.uuid))
			p.Metadata = append(p.Metadata, "")
			p.PartitionHashes = append(p.PartitionHashes, m.hash)
		}
		return f.Driver.InsertMessages(f.ctx, f.Pool, p)
	}
	storedFrom := time.Now().Truncate(time.Microsecond)
	if err := insert("", msg{topic, "a", 0}, msg{other, "x", 0}, msg{parts, "p1", 1}, msg{topic, "b", 0},
		msg{kept, "k1", 0}, msg{late, "l1", 0}, msg{other, "y", 0}, msg{parts, "p2", 2}, msg{kept, "k2", 0}, msg{parts, "p5", 5}); err != nil {
		t.Fatalf("insert without notification: %v", err)
	}
	l := f.listen()
	if err := insert(f.Tables.NotifyChannel, msg{topic, "c", 0}, msg{other, "z", 0}, msg{parts, "p6", 6},
		msg{kept, "k3", 0}, msg{parts, "p3", 3}, msg{parts, "p7", 7}); err != nil {
		t.Fatalf("insert with notification: %v", err)
	}
	storedUntil := time.Now()
	m, p := string(rune(pgsql.NotifyMessages)), string(rune(pgsql.NotifyPartition))
	f.notified(l, m+topic, m+other, m+kept, p+"2:"+parts, p+"3:"+parts)
	for _, c := range []struct {
		topic     string
		partition int32
		want      []string
	}{{topic, 0, []string{"a", "b", "c"}}, {other, 0, []string{"x", "y", "z"}},
		{parts, 0, []string{}}, {parts, 1, []string{"p1", "p5"}}, {parts, 2, []string{"p2", "p6"}}, {parts, 3, []string{"p3", "p7"}},
		{kept, 0, []string{"k1", "k2", "k3"}}, {late, 0, []string{"l1"}}} {
		if got := uuidsOf(f.readSettled(f.selectParams(c.topic, c.partition, pgsql.Position{})).Messages); !slices.Equal(got, c.want) {
			t.Errorf("read %v of %s partition %d, want %v", got, c.topic, c.partition, c.want)
		}
	}
	rows, err := f.Pool.Query(f.ctx, `SELECT topic, uuid, retention_class, expires_at FROM `+f.Tables.Messages)
	if err != nil {
		t.Fatal(err)
	}
	type placed struct {
		topic, uuid string
		class       int16
		expires     time.Time
		infinity    bool
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (placed, error) {
		var p placed
		var at pgtype.Timestamptz
		err := r.Scan(&p.topic, &p.uuid, &p.class, &at)
		p.expires, p.infinity = at.Time, at.InfinityModifier == pgtype.Infinity
		return p, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 16 {
		t.Fatalf("%d messages stored, want 16", len(stored))
	}
	for _, s := range stored {
		switch {
		case s.topic == kept:
			if s.class != keptClass || s.expires.Before(storedFrom.Add(time.Hour)) || s.expires.After(storedUntil.Add(time.Hour)) {
				t.Errorf("%s: class %d, expires %v; want class %d, expiring an hour after it was stored (%v to %v)",
					s.uuid, s.class, s.expires, keptClass, storedFrom.Add(time.Hour), storedUntil.Add(time.Hour))
			}
		case s.class != 0 || !s.infinity:
			t.Errorf("%s of %s: class %d, expires %v (infinity %v); want kept forever", s.uuid, s.topic, s.class, s.expires, s.infinity)
		}
	}

	// All or none: a message refused (an empty topic breaks the topic's
	// limits) leaves nothing of the others.
	if err := insert("", msg{topic, "d", 0}, msg{kept, "k4", 0}, msg{parts, "p9", 1}, msg{"", "bad", 0}); err == nil {
		t.Fatal("insert with an empty topic: no error")
	}
	var n int
	if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.count(*) FROM `+f.Tables.Messages).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 16 {
		t.Fatalf("%d messages stored after the refused insert, want 16", n)
	}
}

func before(a, b pgsql.Position) bool {
	return a.TransactionID < b.TransactionID || a.TransactionID == b.TransactionID && a.Offset < b.Offset
}

// testSelectLeavesOutLargePayloads: with MaxMessageBytes, a larger
// message comes in its place without its payload, its size given.
func testSelectLeavesOutLargePayloads(t *testing.T, f *fixture) {
	const topic = "sizes"
	big := strings.Repeat("x", 1000)
	if err := f.Driver.InsertMessages(f.ctx, f.Pool, pgsql.InsertMessagesParams{Topics: []string{topic, topic},
		UUIDs: []string{"small", "big"}, Payloads: [][]byte{[]byte("small"), []byte(big)}, Metadata: []string{"", ""}}); err != nil {
		t.Fatal(err)
	}
	p := f.selectParams(topic, 0, pgsql.Position{})
	p.MaxMessageBytes = 100
	res := f.readSettled(p)
	if len(res.Messages) != 2 {
		t.Fatalf("read %v, want [small big]", uuidsOf(res.Messages))
	}
	if s := res.Messages[0]; string(s.Payload) != "small" || s.Size != 5 {
		t.Errorf("small: payload %q size %d", s.Payload, s.Size)
	}
	if b := res.Messages[1]; b.UUID != "big" || b.Payload != nil || b.Size != 1000 {
		t.Errorf("big: uuid %s, payload of %d bytes, size %d; want no payload, size 1000", b.UUID, len(b.Payload), b.Size)
	}
}

// testSelectWaitsForAnOlderTransaction: a message committed while an
// older transaction that inserted into the partition still runs is not
// returned (that transaction's message would sort before it, and a
// consumer would skip it), and the read reports it pending; once the
// older one commits, both come, the older first. On Citus the
// transaction ids and the snapshot are the topic's worker's.
func testSelectWaitsForAnOlderTransaction(t *testing.T, f *fixture) {
	const topic = "late"
	tx1 := f.begin()
	f.publish(tx1, topic, "m1")
	f.publish(f.Pool, topic, "m2")
	if res := f.read(f.selectParams(topic, 0, pgsql.Position{})); len(res.Messages) != 0 || !res.Pending || res.WentBack {
		t.Fatalf("while m1's transaction runs: %v (pending %t), want nothing and pending", uuidsOf(res.Messages), res.Pending)
	}
	if err := tx1.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	res := f.readSettled(f.selectParams(topic, 0, pgsql.Position{}))
	if got := uuidsOf(res.Messages); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("after m1's commit: %v, want [m1 m2]", got)
	}
	if after := f.read(f.selectParams(topic, 0, res.Messages[1].Position)); len(after.Messages) != 0 || after.Pending {
		t.Fatalf("after m2: %+v, want nothing", after)
	}
}

// testSelectRefusesAnotherHistory: a read after a position ahead of the
// transaction counter, or on another server than the identity given,
// reports WentBack and returns nothing. The identity that fences a read
// differs between the modes: on a single server it is the session's
// (p.Here); on Citus the read runs on the topic's worker, and it is that
// worker's identity read by the claim (p.WorkerHere), the coordinator's
// being checked by the claim itself.
func testSelectRefusesAnotherHistory(t *testing.T, f *fixture) {
	const group, topic = "g", "history"
	f.publish(f.Pool, topic, "m1")
	f.ensure(group, topic)
	r := f.claimOne(f.session(group), group, topic)
	p := f.selectParams(topic, 0, pgsql.Position{})
	p.WorkerHere = r.WorkerHere
	if res := f.readSettled(p); len(res.Messages) != 1 {
		t.Fatalf("read with the right identities: %v", uuidsOf(res.Messages))
	}

	fromAhead := p
	fromAhead.After = pgsql.Position{TransactionID: ahead}
	if res := f.read(fromAhead); !res.WentBack || len(res.Messages) != 0 {
		t.Errorf("read after a position ahead of the counter: %+v, want WentBack", res)
	}
	elsewhere := p
	if f.Citus {
		elsewhere.WorkerHere = "00000009:1:1"
	} else {
		elsewhere.Here = "00000009:1:1"
	}
	if res := f.read(elsewhere); !res.WentBack || len(res.Messages) != 0 {
		t.Errorf("read with another server's identity: %+v, want WentBack", res)
	}
	if f.Citus {
		// The coordinator's identity does not fence a read routed to a
		// worker (the claim checked it).
		coordinator := p
		coordinator.Here = "00000009:1:1"
		if res := f.read(coordinator); res.WentBack || len(res.Messages) != 1 {
			t.Errorf("Citus: read with another coordinator identity: %+v, want the message", res)
		}
	}
}

// testSelectMessagesAt: the messages at the positions asked for come
// back whole, in delivery order, and no other (not those between, nor a
// position made of one message's transaction and another's offset, nor
// those of another partition); a position whose message is gone is left
// out; the read is refused (WentBack) elsewhere, or for a position ahead
// of the counter.
func testSelectMessagesAt(t *testing.T, f *fixture) {
	const group, topic = "g", "at"
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		f.publish(f.Pool, topic, id) // a transaction each
	}
	f.ensure(group, topic)
	r := f.claimOne(f.session(group), group, topic)
	all := f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages
	if got := uuidsOf(all); !slices.Equal(got, []string{"a1", "a2", "a3", "a4"}) {
		t.Fatalf("read %v, want [a1 a2 a3 a4]", got)
	}
	at := func(p pgsql.SelectMessagesAtParams) pgsql.SelectResult {
		t.Helper()
		res, err := f.Driver.SelectMessagesAt(f.ctx, f.Pool, p)
		if err != nil {
			t.Fatalf("select messages at %v: %v", p.Positions, err)
		}
		return res
	}
	p := pgsql.SelectMessagesAtParams{Topic: topic, Here: f.here, WorkerHere: r.WorkerHere,
		Positions: []pgsql.Position{all[3].Position, all[0].Position, all[2].Position,
			{TransactionID: all[1].Position.TransactionID, Offset: all[3].Position.Offset}}}
	res := at(p)
	if got := uuidsOf(res.Messages); res.WentBack || !slices.Equal(got, []string{"a1", "a3", "a4"}) {
		t.Fatalf("at a4, a1, a3 and a2's transaction with a4's offset: %v (%+v), want [a1 a3 a4]", got, res)
	}
	for i, m := range res.Messages {
		want := all[[]int{0, 2, 3}[i]]
		if string(m.Payload) != m.UUID || m.Position != want.Position || m.Size != want.Size {
			t.Errorf("message %s: payload %q at %v size %d, want at %v size %d", m.UUID, m.Payload, m.Position,
				m.Size, want.Position, want.Size)
		}
	}
	one := p
	one.Positions = []pgsql.Position{all[1].Position}
	if got := uuidsOf(at(one).Messages); !slices.Equal(got, []string{"a2"}) {
		t.Errorf("at a2: %v", got)
	}
	one.Partition = 1
	if res := at(one); len(res.Messages) != 0 || res.WentBack {
		t.Errorf("at a2 in partition 1: %+v, want nothing", res)
	}
	f.exec(`DELETE FROM `+f.Tables.Messages+` WHERE topic = $1 AND uuid = 'a3'`, topic)
	if got := uuidsOf(at(p).Messages); !slices.Equal(got, []string{"a1", "a4"}) {
		t.Errorf("at a4, a1, a3 after a3 was deleted: %v, want [a1 a4]", got)
	}

	fromAhead := p
	fromAhead.Positions = append(slices.Clone(p.Positions), pgsql.Position{TransactionID: ahead})
	if res := at(fromAhead); !res.WentBack || len(res.Messages) != 0 {
		t.Errorf("at a position ahead of the counter: %+v, want WentBack", res)
	}
	elsewhere := p
	if f.Citus {
		elsewhere.WorkerHere = "00000009:1:1"
	} else {
		elsewhere.Here = "00000009:1:1"
	}
	if res := at(elsewhere); !res.WentBack || len(res.Messages) != 0 {
		t.Errorf("at with another server's identity: %+v, want WentBack", res)
	}
}

// testVisibleTopics: the idle poll returns the (1-based) index of each
// row that has a message visible after its position, and only those.
func testVisibleTopics(t *testing.T, f *fixture) {
	f.publish(f.Pool, "va", "a1")
	f.publish(f.Pool, "vc", "c1")
	c1 := f.readSettled(f.selectParams("vc", 0, pgsql.Position{})).Messages[0].Position
	f.readSettled(f.selectParams("va", 0, pgsql.Position{}))
	p := pgsql.VisibleTopicsParams{Topics: []string{"va", "vb", "vc"}, Positions: []pgsql.Position{{}, {}, c1}}
	got, err := f.Driver.VisibleTopics(f.ctx, f.Pool, p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int64{1}) {
		t.Fatalf("VisibleTopics = %v, want [1] (vb has no message, vc none after its position)", got)
	}
	p.Positions[2] = pgsql.Position{}
	p.Partitions = []int32{0, 0, 1}
	if got, err = f.Driver.VisibleTopics(f.ctx, f.Pool, p); err != nil || !slices.Equal(got, []int64{1}) {
		t.Fatalf("VisibleTopics with vc's partition 1 = %v, %v; want [1]", got, err)
	}
	p.Partitions = nil
	if got, err = f.Driver.VisibleTopics(f.ctx, f.Pool, p); err != nil || !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("VisibleTopics from the beginning = %v, %v; want [1 3]", got, err)
	}
}

// testUpsertTopicRaisesNeverLowers: a topic's partition count is
// created, raised (notified), and never lowered; a topic without a row
// has one partition; a change of retention is written and notified.
func testUpsertTopicRaisesNeverLowers(t *testing.T, f *fixture) {
	const topic = "parts"
	l := f.listen()
	upsert := func(n int, retention time.Duration, class int) pgsql.UpsertTopicResult {
		t.Helper()
		r, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: n,
			Retention: retention, RetentionClass: class, NotifyChannel: f.Tables.NotifyChannel})
		if err != nil {
			t.Fatalf("upsert topic with %d partitions: %v", n, err)
		}
		return r
	}
	partitions := func() int {
		t.Helper()
		m, err := f.Driver.TopicPartitions(f.ctx, f.Pool, []string{topic, "never-created"})
		if err != nil {
			t.Fatal(err)
		}
		if m["never-created"] != 1 {
			t.Errorf("partitions of a topic without settings = %d, want 1", m["never-created"])
		}
		return m[topic]
	}
	if r := upsert(2, 0, 0); r.OldPartitions != nil || r.NewPartitions == nil || *r.NewPartitions != 2 || r.Notified != 1 {
		t.Fatalf("create: %s", upsertString(r))
	}
	f.notified(l, string(rune(pgsql.NotifyPartitions))+topic)
	if r := upsert(4, 0, 0); r.OldPartitions == nil || *r.OldPartitions != 2 || r.NewPartitions == nil || *r.NewPartitions != 4 || r.Notified != 1 {
		t.Fatalf("raise: %s", upsertString(r))
	}
	if r := upsert(3, 0, 0); r.OldPartitions == nil || *r.OldPartitions != 4 || r.NewPartitions != nil || r.Notified != 0 {
		t.Fatalf("lower: %s, want nothing written", upsertString(r))
	}
	if r := upsert(4, 0, 0); r.NewPartitions != nil || r.Notified != 0 {
		t.Fatalf("same count: %s, want nothing written", upsertString(r))
	}
	if n := partitions(); n != 4 {
		t.Fatalf("partitions = %d, want 4", n)
	}
	if r := upsert(4, time.Hour, 1); r.NewPartitions == nil || *r.NewPartitions != 4 || r.Notified != 1 {
		t.Fatalf("set a retention: %s, want written and notified", upsertString(r))
	}
	f.notified(l, string(rune(pgsql.NotifyRetention))+topic)
}

func upsertString(r pgsql.UpsertTopicResult) string {
	s := func(p *int32) string {
		if p == nil {
			return "nil"
		}
		return strconv.Itoa(int(*p))
	}
	return fmt.Sprintf("old %s, new %s, notified %d", s(r.OldPartitions), s(r.NewPartitions), r.Notified)
}

// testInsertPlacesByPartitionKey: a message with a partition key's hash
// goes to partition hash mod the topic's count, read by the statement,
// and each partition written is notified.
func testInsertPlacesByPartitionKey(t *testing.T, f *fixture) {
	const topic = "keyed"
	if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	l := f.listen()
	if err := f.Driver.InsertMessages(f.ctx, f.Pool, pgsql.InsertMessagesParams{
		Topics: []string{topic, topic, topic, topic}, UUIDs: []string{"h5", "h6", "h7", "h9"},
		Payloads: [][]byte{nil, nil, nil, nil}, Metadata: []string{"", "", "", ""},
		PartitionHashes: []uint32{5, 6, 7, 9}, NotifyChannel: f.Tables.NotifyChannel,
	}); err != nil {
		t.Fatal(err)
	}
	f.notified(l, string(rune(pgsql.NotifyPartition))+"1:"+topic)
	for part, want := range [][]string{{}, {"h5", "h9"}, {"h6"}, {"h7"}} {
		if got := uuidsOf(f.readSettled(f.selectParams(topic, int32(part), pgsql.Position{})).Messages); !slices.Equal(got, want) {
			t.Errorf("partition %d: %v, want %v", part, got, want)
		}
	}
}

// testDelayedMovedWhenDue: delayed messages are stored (the earliest due
// time notified) and moved into the messages table once due, the others
// left, with the time until the next one.
func testDelayedMovedWhenDue(t *testing.T, f *fixture) {
	const topic = "delayed"
	l := f.listen()
	due := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if err := f.Driver.InsertDelayed(f.ctx, f.Pool, pgsql.InsertMessagesParams{
		Topics: []string{topic, topic}, UUIDs: []string{"later", "due"}, Payloads: [][]byte{nil, nil},
		Metadata: []string{"", ""}, DueAt: []time.Time{time.Now().Add(time.Hour), due}, NotifyChannel: f.Tables.NotifyChannel,
	}); err != nil {
		t.Fatal(err)
	}
	f.notified(l, string(rune(pgsql.NotifyDelayed))+strconv.FormatInt(due.UnixMilli(), 10))
	moved, next, err := f.Driver.MoveDueMessages(f.ctx, f.Pool, pgsql.MoveDueParams{Limit: 10, NotifyChannel: f.Tables.NotifyChannel})
	if err != nil || moved != 1 || next == nil || *next <= 50*60*1000 || *next > 60*60*1000 {
		t.Fatalf("move due = %d, %v, %v; want 1 moved, the next due in about an hour", moved, ptrString(next), err)
	}
	f.notified(l, string(rune(pgsql.NotifyMessages))+topic)
	if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages); !slices.Equal(got, []string{"due"}) {
		t.Fatalf("read %v, want [due]", got)
	}
	if moved, _, err := f.Driver.MoveDueMessages(f.ctx, f.Pool, pgsql.MoveDueParams{Limit: 10}); err != nil || moved != 0 {
		t.Fatalf("second move = %d, %v; want nothing", moved, err)
	}
}

// testMoveDueSkipsLockedRows: a due row locked by another transaction (a
// concurrent mover) is not moved twice. On a single server the mover
// skips it (SKIP LOCKED) and moves it once the lock is gone. On Citus the
// delayed table is a reference table, and Citus serialises the
// transactions that lock or write its rows by a lock on its shard, taken
// on every node (lock_shard_resources): the mover waits for the other
// transaction instead of skipping the row, and then moves both rows.
func testMoveDueSkipsLockedRows(t *testing.T, f *fixture) {
	const topic = "skip"
	if err := f.Driver.InsertDelayed(f.ctx, f.Pool, pgsql.InsertMessagesParams{
		Topics: []string{topic, topic}, UUIDs: []string{"d1", "d2"}, Payloads: [][]byte{nil, nil}, Metadata: []string{"", ""},
		DueAt: []time.Time{time.Now().Add(-2 * time.Minute), time.Now().Add(-time.Minute)},
	}); err != nil {
		t.Fatal(err)
	}
	holder := f.begin()
	if _, err := holder.Exec(f.ctx, `SELECT id FROM `+f.Tables.Delayed+` WHERE uuid = 'd1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	move := func() int64 {
		t.Helper()
		moved, _, err := f.Driver.MoveDueMessages(f.ctx, f.Pool, pgsql.MoveDueParams{Limit: 10})
		if err != nil {
			t.Fatalf("move due: %v", err)
		}
		return moved
	}
	if f.Citus {
		type result struct {
			moved int64
			err   error
		}
		done := make(chan result, 1)
		go func() {
			moved, _, err := f.Driver.MoveDueMessages(f.ctx, f.Pool, pgsql.MoveDueParams{Limit: 10})
			done <- result{moved, err}
		}()
		f.waitBlocked(1, "WITH due AS%", "WITH due AS%")
		select {
		case r := <-done:
			t.Fatalf("Citus: the move did not wait for the locked row (moved %d, %v)", r.moved, r.err)
		default:
		}
		if err := holder.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || r.moved != 2 {
			t.Fatalf("Citus: move after the lock = %d, %v; want both rows", r.moved, r.err)
		}
		if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages); !slices.Equal(got, []string{"d1", "d2"}) {
			t.Fatalf("read %v, want [d1 d2] (in the order due)", got)
		}
		return
	}
	if n := move(); n != 1 {
		t.Fatalf("move while d1 is locked = %d; want d2 moved", n)
	}
	if err := holder.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := move(); n != 1 {
		t.Fatalf("move after the lock = %d; want d1 moved", n)
	}
	if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages); !slices.Equal(got, []string{"d2", "d1"}) {
		t.Fatalf("read %v, want [d2 d1] (in the order moved)", got)
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatInt(*p, 10)
}
