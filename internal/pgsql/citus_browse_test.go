package pgsql

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"
)

// TestCitusBrowse: on Citus, the counts of named topics (one routed count
// each: duplicates once, an unknown topic 0, a capped one at the cap) and
// of every topic with messages (read on the shards); the estimate of the
// topic's worker; the pages of a topic of three partitions, merged newest
// first by position and paged without a gap or a repeat; the lookup by
// UUID in one topic and in all.
func TestCitusBrowse(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO `+tables.Topics+` (topic, partitions) VALUES ('parted', 3)`); err != nil {
		t.Fatal(err)
	}
	for range 4 { // four transactions
		publish(t, pool, tables, "parted", 3)
	}
	publish(t, pool, tables, "b0", 2)
	publish(t, pool, tables, "b1", 5)
	publish(t, pool, tables, "b2", 1)
	publish(t, pool, tables, "b2", 1) // "b2/0" twice in b2

	counts, err := NewCitus(tables).CountTopicMessages(ctx, pool, []string{"b1", "nope", "b0", "b1"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []TopicCountRow{{"b0", 2, false}, {"b1", 3, true}, {"nope", 0, false}}
	if !slices.Equal(counts, want) {
		t.Fatalf("CountTopicMessages = %v, want %v", counts, want)
	}
	counts, err = NewCitus(tables).CountTopicMessages(ctx, pool, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	want = []TopicCountRow{{"b0", 2, false}, {"b1", 5, false}, {"b2", 2, false}, {"parted", 12, false}}
	if !slices.Equal(counts, want) {
		t.Fatalf("CountTopicMessages(nil) = %v, want %v", counts, want)
	}
	if n, err := NewCitus(tables).EstimateTopicMessages(ctx, pool, "parted"); err != nil || n <= 0 {
		t.Fatalf("EstimateTopicMessages = %d, %v; want the worker's estimate, above 0", n, err)
	}

	var all []BrowseRow
	at := Position{TransactionID: math.MaxUint64, Offset: math.MaxInt64}
	parts := map[int32]int{}
	for {
		page, err := NewCitus(tables).MessagesNewestFirst(ctx, pool, BrowseParams{Topic: "parted", Partition: -1, At: at, Limit: 5, Preview: -1})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 5 {
			break
		}
		last := page[len(page)-1].Position
		at = Position{TransactionID: last.TransactionID, Offset: last.Offset - 1}
	}
	if len(all) != 12 {
		t.Fatalf("pages hold %d messages, want 12", len(all))
	}
	for i, r := range all {
		parts[r.Partition]++
		if i > 0 && !older(r.Position, all[i-1].Position) {
			t.Fatalf("message %d at %v is not older than %v", i, r.Position, all[i-1].Position)
		}
	}
	if len(parts) < 2 {
		t.Fatalf("the messages lie on partitions %v: want several", parts)
	}
	for p, n := range parts {
		page, err := NewCitus(tables).MessagesNewestFirst(ctx, pool, BrowseParams{Topic: "parted", Partition: p,
			At: Position{TransactionID: math.MaxUint64, Offset: math.MaxInt64}, Limit: 20, Preview: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) != n {
			t.Fatalf("partition %d: %d messages, want %d", p, len(page), n)
		}
	}

	found, err := NewCitus(tables).MessagesByUUID(ctx, pool, "b2", "b2/0", -1, -1)
	if err != nil || len(found) != 2 || !older(found[1].Position, found[0].Position) {
		t.Fatalf("MessagesByUUID(b2) = %v, %v; want both, newest first", found, err)
	}
	// A message of b3 with a later transaction id than b2's but stored
	// before them, as a message of a worker whose counter runs ahead:
	// ordered by storage time, it is the oldest.
	publish(t, pool, tables, "b3", 1)
	if _, err := pool.Exec(ctx, `UPDATE `+tables.Messages+` SET uuid = 'b2/0', created_at = $1
WHERE topic = 'b3'`, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	found, err = NewCitus(tables).MessagesByUUID(ctx, pool, "", "b2/0", 1, -1)
	if err != nil || len(found) != 3 || found[0].Topic != "b2" || found[1].Topic != "b2" || found[2].Topic != "b3" ||
		!older(found[1].Position, found[0].Position) {
		t.Fatalf("MessagesByUUID(all topics) = %v, %v; want b2's two, newest first, then b3's", found, err)
	}
	found, err = NewCitus(tables).MessagesByUUID(ctx, pool, "", "b2/0", 1, 1)
	if err != nil || len(found) != 1 || found[0].Topic != "b2" || len(found[0].Payload) != 1 {
		t.Fatalf("MessagesByUUID(all topics, limit 1) = %v, %v; want b2's newest", found, err)
	}
}

// older reports whether a lies before b.
func older(a, b Position) bool {
	return a.TransactionID < b.TransactionID || a.TransactionID == b.TransactionID && a.Offset < b.Offset
}

// TestCitusReplayTakesEachMessageOnce: on Citus, a replay whose rows a
// running replay locked waits for it, then takes the messages it did not
// take: the two together take each message once, oldest first.
func TestCitusReplayTakesEachMessageOnce(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	publish(t, pool, tables, "poison", 5)
	p := ReplayParams{Topic: "poison", Filter: []byte("{}"), OriginalTopicKeys: []string{"topic_poisoned", "_pglease_dead_letter_source_topic"}, Limit: 2}
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(ctx) }()
	took, err := NewCitus(tables).DeleteMessagesForReplay(ctx, first, p)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		rows []BrowseRow
		err  error
	}
	done := make(chan result, 1)
	go func() {
		p := p
		p.Limit = 10
		rows, err := NewCitus(tables).DeleteMessagesForReplay(ctx, pool, p)
		done <- result{rows, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the second replay did not wait for the first: %v, %v", r.rows, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	var ids []string
	for _, m := range append(took, r.rows...) {
		ids = append(ids, m.UUID)
	}
	if want := []string{"poison/0", "poison/1", "poison/2", "poison/3", "poison/4"}; !slices.Equal(ids, want) {
		t.Fatalf("the replays took %v, want %v", ids, want)
	}
	counts, err := NewCitus(tables).CountTopicMessages(ctx, pool, []string{"poison"}, 10)
	if err != nil || counts[0].Messages != 0 {
		t.Fatalf("poison holds %v, %v; want none", counts, err)
	}
}

// TestCitusDeleteGroupOffsets: on Citus, the group's rows of several
// topics are locked topic by topic and deleted; a row created after the
// lock is not deleted: the delete returns it and deletes nothing.
func TestCitusDeleteGroupOffsets(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	create := func(topic string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+tables.Offsets+` (consumer_group, topic, partition) VALUES ('g', $1, 0), ('h', $1, 0)`, topic); err != nil {
			t.Fatal(err)
		}
	}
	for _, topic := range []string{"d0", "d1", "d2", "d3"} {
		create(topic)
	}
	attempt := func(meanwhile string) DeleteGroupOffsetsResult {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		locked, err := NewCitus(tables).LockGroupOffsets(ctx, tx, "g")
		if err != nil {
			t.Fatal(err)
		}
		if owned, err := NewCitus(tables).GroupLiveOwners(ctx, tx, "g"); err != nil || len(owned) > 0 {
			t.Fatalf("GroupLiveOwners = %v, %v; want none", owned, err)
		}
		if meanwhile != "" {
			create(meanwhile)
		}
		res, err := NewCitus(tables).DeleteGroupOffsets(ctx, tx, "g", locked)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return res
	}
	rows := func(group string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+tables.Offsets+` WHERE consumer_group = $1`, group).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	res := attempt("d4")
	if res.Deleted != 0 || len(res.Others) != 1 || res.Others[0].Topic != "d4" {
		t.Fatalf("with a row created meanwhile: %+v; want it returned and nothing deleted", res)
	}
	if n := rows("g"); n != 5 {
		t.Fatalf("group g holds %d rows, want 5", n)
	}
	res = attempt("")
	if res.Deleted != 5 || len(res.Others) != 0 {
		t.Fatalf("delete: %+v; want 5 rows deleted", res)
	}
	if g, h := rows("g"), rows("h"); g != 0 || h != 5 {
		t.Fatalf("groups g and h hold %d and %d rows, want 0 and 5", g, h)
	}
}
