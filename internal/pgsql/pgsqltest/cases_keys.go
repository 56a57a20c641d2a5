package pgsqltest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// keyed is one message of a keyed insert: its UUID (also its payload) and
// its idempotency key ("" for none).
type keyed struct{ id, key string }

// keyDigest stands for the digest the Publisher stores of a key: any UUID
// text does.
func keyDigest(key string) string {
	if key == "" {
		return ""
	}
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(key)).String()
}

// keyedParams are the parameters that publish msgs to topic.
func (f *fixture) keyedParams(topic string, msgs ...keyed) pgsql.InsertMessagesParams {
	p := pgsql.InsertMessagesParams{NotifyChannel: f.Tables.NotifyChannel}
	for _, m := range msgs {
		p.Topics = append(p.Topics, topic)
		p.UUIDs = append(p.UUIDs, m.id)
		p.Payloads = append(p.Payloads, []byte(m.id))
		p.Metadata = append(p.Metadata, "")
		p.Keys = append(p.Keys, keyDigest(m.key))
	}
	return p
}

// insertKeyed publishes msgs to topic on q and returns the indexes left
// out.
func (f *fixture) insertKeyed(q pgsql.Querier, topic string, msgs ...keyed) []int {
	f.t.Helper()
	skipped, err := f.Driver.InsertKeyed(f.ctx, q, f.keyedParams(topic, msgs...))
	if err != nil {
		f.t.Fatalf("insert keyed messages: %v", err)
	}
	return skipped
}

// keyedStatement is the pattern of pg_stat_activity.query of a keyed
// insert of this case's tables: the topics table, which its key class's
// part names within the first kilobyte (track_activity_query_size, 1024
// by default, cuts the query text; the keys table comes later).
func (f *fixture) keyedStatement() string {
	return "WITH m AS (%" + f.Tables.Topics + "%"
}

// stored returns the UUIDs stored in topic (partition 0), in order.
func (f *fixture) stored(topic string) []string {
	f.t.Helper()
	return uuidsOf(f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages)
}

// today is the slot (Unix day) of the database's clock.
func (f *fixture) today() int64 {
	f.t.Helper()
	var d int64
	if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.floor(extract(epoch FROM pg_catalog.now()) / `+
		strconv.Itoa(pgsql.KeySlotSeconds)+`)::bigint`).Scan(&d); err != nil {
		f.t.Fatal(err)
	}
	return d
}

// writeKey writes the rows a publisher whose transaction began in slot
// day writes for key of topic (that day's and the day before's), on q.
func (f *fixture) writeKey(q pgsql.Querier, topic, key string, day int64) {
	f.t.Helper()
	for _, slot := range []int64{day - 1, day} {
		if _, err := q.Exec(f.ctx, `INSERT INTO `+f.Tables.Keys+` (topic, key, slot, gen) VALUES ($1, $2::uuid, $3, $4)`,
			topic, keyDigest(key), slot, slot%4); err != nil {
			f.t.Fatalf("write the key of day %d: %v", day, err)
		}
	}
}

// testKeyedInsertStoresOnce: a message whose key its topic stored is left
// out, by a later statement or by an earlier message of the same one;
// messages without a key are always stored; a key is per topic.
func testKeyedInsertStoresOnce(t *testing.T, f *fixture) {
	const topic, other = "keyed", "keyed-other"
	l := f.listen()
	if got := f.insertKeyed(f.Pool, topic, keyed{"a", "k1"}, keyed{"b", "k2"}, keyed{"c", ""}, keyed{"d", "k1"}); !slices.Equal(got, []int{3}) {
		t.Fatalf("first insert left out %v, want [3] (d repeats a's key)", got)
	}
	f.notified(l, string(rune(pgsql.NotifyMessages))+topic)
	if got := f.insertKeyed(f.Pool, topic, keyed{"e", "k1"}, keyed{"f", "k3"}, keyed{"g", ""}, keyed{"h", "k2"}); !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("second insert left out %v, want [0 3] (k1 and k2 stored)", got)
	}
	if got := f.insertKeyed(f.Pool, other, keyed{"x", "k1"}); len(got) != 0 {
		t.Fatalf("k1 in another topic left out %v, want stored", got)
	}
	if got := f.stored(topic); !slices.Equal(got, []string{"a", "b", "c", "f", "g"}) {
		t.Fatalf("stored %v, want [a b c f g]", got)
	}
	if got := f.stored(other); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("stored in the other topic %v, want [x]", got)
	}
	// Without a channel to notify, the same.
	p := f.keyedParams(topic, keyed{"y", "k4"}, keyed{"z", "k4"})
	p.NotifyChannel = ""
	if got, err := f.Driver.InsertKeyed(f.ctx, f.Pool, p); err != nil || !slices.Equal(got, []int{1}) {
		t.Fatalf("insert without notifying left out %v, %v; want [1]", got, err)
	}
	// All left out: nothing stored, nothing fails.
	if got := f.insertKeyed(f.Pool, topic, keyed{"i", "k1"}, keyed{"j", "k3"}); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("third insert left out %v, want [0 1]", got)
	}
}

// testKeyedInsertWaitsForTheOther: a publisher whose key another
// transaction wrote and has not committed waits for it (the unique index
// of the keys table); once it commits, the publisher stores nothing and
// succeeds; once it rolls back, the publisher stores its message. The
// other transaction is held open from a connection of its own. The same
// with the other transaction one that began the day before (its rows for
// yesterday and the day before): the two share yesterday's slot.
func testKeyedInsertWaitsForTheOther(t *testing.T, f *fixture) {
	for _, c := range []struct {
		name      string
		yesterday bool
		commit    bool
	}{{"commit", false, true}, {"rollback", false, false}, {"yesterday commit", true, true}, {"yesterday rollback", true, false}} {
		topic := "race-" + c.name
		holder := f.begin()
		if c.yesterday {
			f.writeKey(holder, topic, "k", f.today()-1)
		} else if got := f.insertKeyed(holder, topic, keyed{"first", "k"}); len(got) != 0 {
			t.Fatalf("%s: the first publisher left out %v", c.name, got)
		}
		done := make(chan []int, 1)
		errs := make(chan error, 1)
		go func() {
			skipped, err := f.Driver.InsertKeyed(f.ctx, f.Pool, f.keyedParams(topic, keyed{"second", "k"}))
			if err != nil {
				errs <- err
				return
			}
			done <- skipped
		}()
		f.waitBlocked(1, f.keyedStatement(), "%keys%")
		select {
		case got := <-done:
			t.Fatalf("%s: the second publisher did not wait: left out %v", c.name, got)
		case err := <-errs:
			t.Fatalf("%s: the second publisher: %v", c.name, err)
		default:
		}
		var end error
		if c.commit {
			end = holder.Commit(f.ctx)
		} else {
			end = holder.Rollback(f.ctx)
		}
		if end != nil {
			t.Fatal(end)
		}
		var got []int
		select {
		case got = <-done:
		case err := <-errs:
			t.Fatalf("%s: the second publisher: %v", c.name, err)
		case <-time.After(waitTimeout):
			t.Fatalf("%s: the second publisher still waits", c.name)
		}
		want, stored := []int{}, []string{"second"}
		switch {
		case c.commit && c.yesterday:
			want, stored = []int{0}, nil
		case c.commit:
			want, stored = []int{0}, []string{"first"}
		}
		if !slices.Equal(append([]int{}, got...), want) {
			t.Fatalf("%s: the second publisher left out %v, want %v", c.name, got, want)
		}
		if s := f.stored(topic); !slices.Equal(s, stored) {
			t.Fatalf("%s: stored %v, want %v", c.name, s, stored)
		}
	}
}

// testKeyedInsertWindow: a key written by a publisher whose transaction
// began the day before is recognised (they share yesterday's slot); one
// written two days before is not (its rows are for two and three days
// ago), and the message is stored.
func testKeyedInsertWindow(t *testing.T, f *fixture) {
	const topic = "window"
	today := f.today()
	f.writeKey(f.Pool, topic, "yesterday", today-1)
	f.writeKey(f.Pool, topic, "two days ago", today-2)
	got := f.insertKeyed(f.Pool, topic, keyed{"a", "yesterday"}, keyed{"b", "two days ago"})
	if !slices.Equal(got, []int{0}) {
		t.Fatalf("left out %v, want [0]: yesterday's key recognised, the one of two days ago forgotten", got)
	}
	if s := f.stored(topic); !slices.Equal(s, []string{"b"}) {
		t.Fatalf("stored %v, want [b]", s)
	}
}

// testKeyedTransaction: in one transaction (the outbox), a key written by
// an earlier statement of the same transaction is recognised, without
// waiting; a rollback forgets it.
func testKeyedTransaction(t *testing.T, f *fixture) {
	const topic = "outbox"
	tx := f.begin()
	if got := f.insertKeyed(tx, topic, keyed{"a", "k"}); len(got) != 0 {
		t.Fatalf("first left out %v", got)
	}
	if got := f.insertKeyed(tx, topic, keyed{"b", "k"}, keyed{"c", "other"}); !slices.Equal(got, []int{0}) {
		t.Fatalf("second statement of the transaction left out %v, want [0]", got)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.insertKeyed(f.Pool, topic, keyed{"d", "k"}); len(got) != 0 {
		t.Fatalf("after the rollback left out %v, want stored", got)
	}
	if s := f.stored(topic); !slices.Equal(s, []string{"d"}) {
		t.Fatalf("stored %v, want [d]", s)
	}
}

// testKeyedDelayed: a delayed message with a key is stored once, moved
// once when due; its key also keeps out a message published at once.
func testKeyedDelayed(t *testing.T, f *fixture) {
	const topic = "keyed-delayed"
	p := f.keyedParams(topic, keyed{"d1", "k"}, keyed{"d2", "k"}, keyed{"d3", "k3"})
	p.DueAt = []time.Time{time.Now().Add(-time.Minute), time.Now().Add(-time.Minute), time.Now().Add(-time.Minute)}
	for i, want := range [][]int{{1}, {0, 1, 2}} {
		got, err := f.Driver.InsertDelayedKeyed(f.ctx, f.Pool, p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("delayed insert %d left out %v, want %v", i, got, want)
		}
	}
	if got := f.insertKeyed(f.Pool, topic, keyed{"now", "k3"}); !slices.Equal(got, []int{0}) {
		t.Fatalf("a message with the delayed one's key left out %v, want [0]", got)
	}
	moved, _, err := f.Driver.MoveDueMessages(f.ctx, f.Pool, pgsql.MoveDueParams{Limit: 10})
	if err != nil || moved != 2 {
		t.Fatalf("moved %d, %v; want 2", moved, err)
	}
	if s := f.stored(topic); !slices.Equal(s, []string{"d1", "d3"}) {
		t.Fatalf("stored %v, want [d1 d3]", s)
	}
}

// testForgetKeys: the maintainer's function empties the partition of the
// slot two days old (and counts it), leaves today's and yesterday's, and
// counts 0 when there is nothing to forget; the key forgotten can be
// published again.
func testForgetKeys(t *testing.T, f *fixture) {
	const topic = "forget"
	today := f.today()
	f.writeKey(f.Pool, topic, "old", today-1) // rows for yesterday and two days ago
	if got := f.insertKeyed(f.Pool, topic, keyed{"a", "new"}); len(got) != 0 {
		t.Fatalf("left out %v", got)
	}
	count := func() map[int64]int {
		rows, err := f.Pool.Query(f.ctx, `SELECT slot FROM `+f.Tables.Keys+` WHERE topic = $1`, topic)
		if err != nil {
			t.Fatal(err)
		}
		slots, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		out := map[int64]int{}
		for _, s := range slots {
			out[s-today]++
		}
		return out
	}
	if got := fmt.Sprint(count()); got != "map[-2:1 -1:2 0:1]" {
		t.Fatalf("rows by slot before = %s", got)
	}
	if n, err := f.Driver.ForgetKeys(f.ctx, f.Pool); err != nil || n != 1 {
		t.Fatalf("forget = %d, %v; want one partition emptied", n, err)
	}
	if got := fmt.Sprint(count()); got != "map[-1:2 0:1]" {
		t.Fatalf("rows by slot after = %s; want two days ago's gone", got)
	}
	if n, err := f.Driver.ForgetKeys(f.ctx, f.Pool); err != nil || n != 0 {
		t.Fatalf("second forget = %d, %v; want 0", n, err)
	}
	if got := f.insertKeyed(f.Pool, topic, keyed{"b", "new"}); !slices.Equal(got, []int{0}) {
		t.Fatalf("today's key after forgetting left out %v, want [0]", got)
	}
}

// testKeyedInsertsDoNotDeadlock: each statement writes its keys in one
// order (slot, topic, key digest), whatever the order of its messages,
// so that a statement that waits for a key holds none that comes after
// it. A transaction holds key lo (the lower digest of two); a second
// statement publishes [hi, lo] and waits for lo without having written
// hi; the first transaction then publishes hi without waiting, and
// commits; the second stores nothing. Written in the messages' order, the
// second would hold hi while it waits for lo, and the first's hi would
// close the cycle: PostgreSQL would fail one of them (deadlock_detected).
// (Two transactions that each publish several times, in opposite orders,
// can still deadlock, as any transactions writing the same unique keys:
// PostgreSQL fails one, and its publish is retried.)
func testKeyedInsertsDoNotDeadlock(t *testing.T, f *fixture) {
	const topic = "order"
	lo, hi := "a", "b"
	if keyDigest(hi) < keyDigest(lo) {
		lo, hi = hi, lo
	}
	first := f.begin()
	if got := f.insertKeyed(first, topic, keyed{"lo1", lo}); len(got) != 0 {
		t.Fatalf("left out %v", got)
	}
	type outcome struct {
		skipped []int
		err     error
	}
	done := make(chan outcome, 1)
	go func() {
		skipped, err := f.Driver.InsertKeyed(f.ctx, f.Pool, f.keyedParams(topic, keyed{"hi2", hi}, keyed{"lo2", lo}))
		done <- outcome{skipped, err}
	}()
	f.waitBlocked(1, f.keyedStatement(), "%keys%")
	if got := f.insertKeyed(first, topic, keyed{"hi1", hi}); len(got) != 0 {
		t.Fatalf("the first transaction's hi left out %v", got)
	}
	if err := first.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	var o outcome
	select {
	case o = <-done:
	case <-time.After(waitTimeout):
		t.Fatal("the second statement still waits")
	}
	if o.err != nil {
		t.Fatalf("the second statement: %v", o.err)
	}
	if !slices.Equal(o.skipped, []int{0, 1}) {
		t.Fatalf("the second statement left out %v, want [0 1]", o.skipped)
	}
	if s := f.stored(topic); !slices.Equal(s, []string{"lo1", "hi1"}) {
		t.Fatalf("stored %v, want [lo1 hi1]", s)
	}
}

// classSlot is the slot of key class k of the database's clock.
func (f *fixture) classSlot(k int) int64 {
	f.t.Helper()
	var s int64
	if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.floor(extract(epoch FROM pg_catalog.now()) / $1)::bigint`,
		pgsql.KeyClassSeconds(k)).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// writeClassKey writes the rows a publisher whose transaction began in
// slot of key class k writes for key of topic (that slot's and the one
// before's), on q.
func (f *fixture) writeClassKey(q pgsql.Querier, topic, key string, k int, slot int64) {
	f.t.Helper()
	for _, s := range []int64{slot - 1, slot} {
		if _, err := q.Exec(f.ctx, `INSERT INTO `+f.Tables.Keys+` (topic, key, slot, gen) VALUES ($1, $2::uuid, $3, $4)`,
			topic, keyDigest(key), s, int64(4*k)+s%4); err != nil {
			f.t.Fatalf("write the key of slot %d of class %d: %v", s, k, err)
		}
	}
}

// keyRows returns the rows of topic's keys as "gen:slot-offset" (the slot
// relative to now's slot of class k), sorted.
func (f *fixture) keyRows(topic string, k int) []string {
	f.t.Helper()
	now := f.classSlot(k)
	rows, err := f.Pool.Query(f.ctx, `SELECT gen, slot FROM `+f.Tables.Keys+` WHERE topic = $1`, topic)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var gen int16
		var slot int64
		if err := rows.Scan(&gen, &slot); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d:%d", gen, slot-now))
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// testKeyedRetentionWindow: a topic whose retention is longer than a day
// keeps its keys for its retention, in slots of its retention class (3
// days: class 19, slots of 2^18 s, about 3.03 days; gens 76 to 79). A
// publish writes a key for now's slot and the one before; a key written
// by a publisher whose transaction began in the slot before is
// recognised (the two share that slot), one written two slots before is
// not, and neither are day rows (the class's partitions became usable
// more than two days before: its topics write no day rows any more). The
// maintainer's function then empties the class's partition two slots
// old, and the key of the slot before is still recognised by its row of
// that slot.
func testKeyedRetentionWindow(t *testing.T, f *fixture) {
	const topic, class = "long", 19
	if pgsql.KeyClassSeconds(class) < int64((72*time.Hour)/time.Second) {
		t.Fatalf("class %d's slots are shorter than 3 days", class)
	}
	if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: 1,
		Retention: 72 * time.Hour, RetentionClass: class}); err != nil {
		t.Fatal(err)
	}
	f.readyKeyClass(class, `pg_catalog.now() - interval '3 days'`) // past the two days of day rows
	if got := f.insertKeyed(f.Pool, topic, keyed{"a", "new"}); len(got) != 0 {
		t.Fatalf("left out %v", got)
	}
	now := f.classSlot(class)
	gen := func(back int64) string { return fmt.Sprintf("%d:%d", 4*class+(now-back)%4, -back) }
	if got, want := f.keyRows(topic, class), []string{gen(1), gen(0)}; !slices.Equal(got, want) {
		t.Fatalf("rows of a new key (gen:slot) = %v, want %v: now's slot of the class and the one before", got, want)
	}
	f.writeClassKey(f.Pool, topic, "slot before", class, now-1) // rows for now-2 and now-1
	f.writeClassKey(f.Pool, topic, "two slots before", class, now-2)
	f.writeKey(f.Pool, topic, "by day", f.today())
	got := f.insertKeyed(f.Pool, topic, keyed{"b", "slot before"}, keyed{"c", "two slots before"}, keyed{"d", "by day"}, keyed{"e", "new"})
	if !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("left out %v, want [0 3]: the key of the slot before and the new one", got)
	}
	// Forget: the class's partition of now-2 is emptied ("slot before"
	// keeps its row of now-1).
	if n, err := f.Driver.ForgetKeys(f.ctx, f.Pool); err != nil || n != 1 {
		t.Fatalf("forget = %d, %v; want one partition emptied", n, err)
	}
	if got := f.keyRows(topic, class); slices.Contains(got, gen(2)) || !slices.Contains(got, gen(1)) {
		t.Fatalf("rows after forgetting %v: want none of %s (the class's slot two slots old), %s kept", got, gen(2), gen(1))
	}
	got = f.insertKeyed(f.Pool, topic, keyed{"f", "slot before"}, keyed{"g", "new"}, keyed{"h", "two slots before"})
	if !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("after forgetting left out %v, want [0 1 2]: the keys of now's slot and the one before still recognised", got)
	}
	if s := f.stored(topic); !slices.Equal(s, []string{"a", "c", "d"}) {
		t.Fatalf("stored %v, want [a c d]", s)
	}
}

// testKeyedConfiguredWindow: a topic's key window (schema version 22) is
// the longer of its retention and its key_window. A topic kept forever
// with a window of 3 days, and one with a retention of 2 days and the
// same window, keep their keys in the rows of the window's class (19) as
// a topic with a retention of 3 days does; a topic whose retention is
// longer than its window keeps them in its retention's class, and one
// whose window is a day or less in day rows. KeyLanes names the window's
// class, not the shorter retention's. Set again without a window, the
// topic kept forever writes day rows.
func testKeyedConfiguredWindow(t *testing.T, f *fixture) {
	const class = 19
	topics := []pgsql.TopicParams{
		{Topic: "window", Partitions: 1, KeyWindow: 72 * time.Hour, KeyClass: class},
		{Topic: "window over retention", Partitions: 1, Retention: 36 * time.Hour, RetentionClass: 18, KeyWindow: 72 * time.Hour, KeyClass: class},
		{Topic: "retention over window", Partitions: 1, Retention: 72 * time.Hour, RetentionClass: class, KeyWindow: 2 * time.Hour, KeyClass: 14},
		{Topic: "short window", Partitions: 1, KeyWindow: 12 * time.Hour, KeyClass: 17},
	}
	for _, tp := range topics {
		if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, tp); err != nil {
			t.Fatal(err)
		}
	}
	lanes, err := f.Driver.KeyLanes(f.ctx, f.Pool)
	if err != nil || !slices.Equal(lanes, []pgsql.KeyLane{{Class: class, Ready: false}}) {
		t.Fatalf("key lanes = %v, %v; want class %d alone, not ready (not 18, the shorter retention's)", lanes, err, class)
	}
	f.readyKeyClass(class, `pg_catalog.now() - interval '3 days'`) // past the two days of day rows
	now, today := f.classSlot(class), f.today()
	gen := func(back int64) string { return fmt.Sprintf("%d:%d", 4*class+(now-back)%4, -back) }
	day := func(back int64) string { return fmt.Sprintf("%d:%d", (today-back)%4, -back) }
	for i, tp := range topics {
		if got := f.insertKeyed(f.Pool, tp.Topic, keyed{fmt.Sprint("a", i), "k"}); len(got) != 0 {
			t.Fatalf("%s: left out %v", tp.Topic, got)
		}
		want, k := []string{gen(1), gen(0)}, class
		if tp.Topic == "short window" {
			want, k = []string{day(1), day(0)}, 0
		}
		if got := f.keyRows(tp.Topic, k); !slices.Equal(got, want) && !slices.Equal(got, []string{want[1], want[0]}) {
			t.Fatalf("%s: rows of a new key (gen:slot) = %v, want %v", tp.Topic, got, want)
		}
	}
	// The window's slot before is recognised, two slots before is not.
	f.writeClassKey(f.Pool, "window", "slot before", class, now-1)
	f.writeClassKey(f.Pool, "window", "two slots before", class, now-2)
	got := f.insertKeyed(f.Pool, "window", keyed{"b", "slot before"}, keyed{"c", "two slots before"}, keyed{"d", "k"})
	if !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("left out %v, want [0 2]: the key of the window's slot before and the one stored above", got)
	}
	// Without its window again, the topic kept forever writes day rows.
	if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: "window", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if got := f.insertKeyed(f.Pool, "window", keyed{"e", "by day"}); len(got) != 0 {
		t.Fatalf("left out %v", got)
	}
	var days int
	if err := f.Pool.QueryRow(f.ctx, `SELECT count(*) FROM `+f.Tables.Keys+` WHERE topic = 'window' AND key = $1::uuid AND gen < 4`,
		keyDigest("by day")).Scan(&days); err != nil || days != 2 {
		t.Fatalf("day rows of a key after the window was unset = %d, %v; want 2", days, err)
	}
	if lanes, err := f.Driver.KeyLanes(f.ctx, f.Pool); err != nil || !slices.Equal(lanes, []pgsql.KeyLane{{Class: class, Ready: true}}) {
		t.Fatalf("key lanes = %v, %v; want class %d ready (the other topics still have it)", lanes, err, class)
	}
}

// readyKeyClass makes the partitions of key class k and sets its
// keys_since to since (an SQL expression), as the maintainer does.
func (f *fixture) readyKeyClass(k int, since string) {
	f.t.Helper()
	if _, err := f.Driver.AddKeyPartitions(f.ctx, f.Pool, k); err != nil {
		f.t.Fatalf("make the partitions of key class %d: %v", k, err)
	}
	if _, err := f.Pool.Exec(f.ctx, `UPDATE `+f.Tables.Retention+` SET keys_since = `+since+` WHERE retention_class = $1`, k); err != nil {
		f.t.Fatal(err)
	}
}

// testKeyedClassTransition: a topic whose retention is longer than a day
// keeps its keys in the day's rows until its class's partitions may be
// used (KeyLanes: not ready); the maintainer's steps make them (once),
// read the transactions that have the keys table open (one held from
// another connection; on Citus, where making them waits for such a
// transaction and gives up after its lock_timeout, one held after), and
// set keys_since. For two days after it the
// topic's keys take both the class's rows and the day's: a key stored
// before in day rows (by this release before, or by a release before
// schema version 21, which writes nothing else) is recognised, and a
// publisher of a release before meets the keys this one writes. Once
// the two days have passed (keys_since set back, as they would), a key
// takes its class rows alone.
func testKeyedClassTransition(t *testing.T, f *fixture) {
	const topic, class = "upgraded", 19
	if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: 1,
		Retention: 72 * time.Hour, RetentionClass: class}); err != nil {
		t.Fatal(err)
	}
	lanes, err := f.Driver.KeyLanes(f.ctx, f.Pool)
	if err != nil || !slices.Equal(lanes, []pgsql.KeyLane{{Class: class, Ready: false}}) {
		t.Fatalf("key lanes = %v, %v; want class %d, not ready", lanes, err, class)
	}
	today := f.today()
	if got := f.insertKeyed(f.Pool, topic, keyed{"a", "stored before"}); len(got) != 0 {
		t.Fatalf("left out %v", got)
	}
	day := func(back int64) string { return fmt.Sprintf("%d:%d", (today-back)%4, -back) }
	if rows := f.keyRows(topic, 0); !slices.Equal(rows, []string{day(1), day(0)}) && !slices.Equal(rows, []string{day(0), day(1)}) {
		t.Fatalf("rows before the class is ready = %v, want the day rows %s and %s", rows, day(1), day(0))
	}
	holder := f.begin()
	if _, err := holder.Exec(f.ctx, `SELECT count(*) FROM `+f.Tables.Keys); err != nil {
		t.Fatal(err)
	}
	if f.Citus {
		// On Citus a partition is made by CREATE TABLE ... PARTITION OF,
		// whose lock on the parent waits for every transaction that has
		// it open: the function gives up after its lock_timeout, and the
		// maintainer tries again at its next round.
		_, err := f.Driver.AddKeyPartitions(f.ctx, f.Pool, class)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
			t.Fatalf("add key partitions while a transaction has the keys table open: %v; want lock_not_available", err)
		}
		if err := holder.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []bool{true, false} {
		made, err := f.Driver.AddKeyPartitions(f.ctx, f.Pool, class)
		if err != nil || made != want {
			t.Fatalf("add key partitions, call %d = %t, %v; want %t", i, made, err, want)
		}
	}
	if f.Citus {
		holder = f.begin()
		if _, err := holder.Exec(f.ctx, `SELECT count(*) FROM `+f.Tables.Keys); err != nil {
			t.Fatal(err)
		}
	}
	holders, err := f.Driver.KeysLockHolders(f.ctx, f.Pool)
	if err != nil || len(holders) != 1 {
		t.Fatalf("keys table lock holders = %v, %v; want the transaction held open", holders, err)
	}
	if err := holder.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if running, err := pgsql.LockHoldersRunning(f.ctx, f.Pool, holders); err != nil || running {
		t.Fatalf("holders running = %t, %v; want ended", running, err)
	}
	for i, want := range []bool{true, false} {
		if set, err := f.Driver.SetKeysSince(f.ctx, f.Pool, class); err != nil || set != want {
			t.Fatalf("set keys_since, call %d = %t, %v; want %t", i, set, err, want)
		}
	}
	if lanes, err := f.Driver.KeyLanes(f.ctx, f.Pool); err != nil || !slices.Equal(lanes, []pgsql.KeyLane{{Class: class, Ready: true}}) {
		t.Fatalf("key lanes = %v, %v; want class %d ready", lanes, err, class)
	}
	got := f.insertKeyed(f.Pool, topic, keyed{"b", "stored before"}, keyed{"c", "new"})
	if !slices.Equal(got, []int{0}) {
		t.Fatalf("left out %v, want [0]: the key stored before in day rows", got)
	}
	rows := f.keyRows(topic, 0)
	if len(rows) != 4+4 {
		t.Fatalf("rows %v: want 8 (two day and two class rows of each key: the one stored before gets the class rows it lacked)", rows)
	}
	// A publisher of a release before writes "new"'s day rows: they are
	// there, so it stores nothing.
	tag, err := f.Pool.Exec(f.ctx, `INSERT INTO `+f.Tables.Keys+` (topic, key, slot, gen) VALUES ($1, $2::uuid, $3, $4) ON CONFLICT DO NOTHING`,
		topic, keyDigest("new"), today, today%4)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("the day row of the key published now: %v, %v rows new; want 0", err, tag.RowsAffected())
	}
	f.readyKeyClass(class, `pg_catalog.now() - interval '2 days' - interval '1 microsecond'`)
	if got := f.insertKeyed(f.Pool, topic, keyed{"d", "later"}); len(got) != 0 {
		t.Fatalf("left out %v", got)
	}
	if got := len(f.keyRows(topic, 0)); got != 8+2 {
		t.Fatalf("%d rows, want 10: two days after keys_since, a key takes its two class rows only", got)
	}
}

// testInspectTopicsKeyWindows: the Inspector's topic rows carry each
// topic's key_window and whether the partitions of its key class (that
// of the longer of its retention and its key window) may be used, as
// publishers choose the class (keysWritten); the statements for the
// schemas of earlier releases read the columns those have: before
// version 22 no key_window (the retention's class), before 21 no key
// classes.
func testInspectTopicsKeyWindows(t *testing.T, f *fixture) {
	const class = 19
	for _, tp := range []pgsql.TopicParams{
		{Topic: "window", Partitions: 1, KeyWindow: 72 * time.Hour, KeyClass: class},
		{Topic: "retention over window", Partitions: 1, Retention: 72 * time.Hour, RetentionClass: class, KeyWindow: 2 * time.Hour, KeyClass: 14},
		{Topic: "short window", Partitions: 1, KeyWindow: 12 * time.Hour, KeyClass: 17},
		{Topic: "neither", Partitions: 1},
	} {
		if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, tp); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(schema int) string {
		t.Helper()
		all, err := f.Driver.InspectTopics(f.ctx, f.Pool, schema)
		if err != nil {
			t.Fatalf("InspectTopics on schema %d: %v", schema, err)
		}
		page, err := f.Driver.InspectTopicsPage(f.ctx, f.Pool, pgsql.TopicsPageParams{Schema: schema, First: true, Limit: 10})
		if err != nil {
			t.Fatalf("InspectTopicsPage on schema %d: %v", schema, err)
		}
		var got, paged []string
		for _, r := range all {
			got = append(got, fmt.Sprintf("%s:%s:%t", r.Topic, time.Duration(r.KeyWindowUs)*time.Microsecond, r.KeyClassReady))
		}
		for _, r := range page {
			paged = append(paged, fmt.Sprintf("%s:%s:%t", r.Topic, time.Duration(r.KeyWindowUs)*time.Microsecond, r.KeyClassReady))
		}
		if !slices.Equal(got, paged) {
			t.Fatalf("schema %d: InspectTopics %v, its page %v", schema, got, paged)
		}
		return strings.Join(got, " ")
	}
	latest := len(f.Tables.Migrations())
	for _, c := range []struct {
		schema int
		want   string
	}{
		{latest, "neither:0s:false retention over window:2h0m0s:false short window:12h0m0s:false window:72h0m0s:false"},
		{pgsql.KeyWindowVersion - 1, "neither:0s:false retention over window:0s:false short window:0s:false window:0s:false"},
	} {
		if got := rows(c.schema); got != c.want {
			t.Fatalf("before the class's partitions, schema %d: %s, want %s", c.schema, got, c.want)
		}
	}
	f.readyKeyClass(class, `pg_catalog.now()`)
	for _, c := range []struct {
		schema int
		want   string
	}{
		// The class of the window, or of the retention longer than it.
		{latest, "neither:0s:false retention over window:2h0m0s:true short window:12h0m0s:false window:72h0m0s:true"},
		// Schema 21: the retention's class alone.
		{pgsql.KeyWindowVersion - 1, "neither:0s:false retention over window:0s:true short window:0s:false window:0s:false"},
		// Schema 20: no classes.
		{pgsql.KeyClassesVersion - 1, "neither:0s:false retention over window:0s:false short window:0s:false window:0s:false"},
	} {
		if got := rows(c.schema); got != c.want {
			t.Fatalf("once the class's partitions may be used, schema %d: %s, want %s", c.schema, got, c.want)
		}
	}
}
