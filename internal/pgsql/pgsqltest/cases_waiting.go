package pgsqltest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// The failure policy's statements: the waiting entries of a row and the
// dead-letter move.

// testWaitingFenced: RecordWaiting writes a message's entry only for the
// row's owner at its epoch: the attempts, the first failure kept across
// failures, the next attempt Delay after the server's now(), the reason;
// an attempt alone keeps the failure's times; Drop removes entries;
// LoadWaiting returns the entries to the owner only. A stale epoch or
// another session writes nothing (pgx.ErrNoRows), a position ahead of
// the counter is ErrWentBack; the entries stay with the row when another
// session takes it, and a reset of the group's offsets clears them.
func testWaitingFenced(t *testing.T, f *fixture) {
	const group, topic = "g", "waiting"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = pos3
	w := pgsql.WaitingParams{OffsetParams: p, Attempts: 1, Failed: true, Delay: time.Hour, Reason: "boom"}
	first, err := f.Driver.RecordWaiting(f.ctx, f.Pool, w)
	if err != nil || first.Attempts != 1 || first.Reason != "boom" || first.FirstFailure.IsZero() ||
		!first.FirstFailure.Equal(first.LastFailure) || first.DueIn < 59*time.Minute || first.DueIn > time.Hour {
		t.Fatalf("first failure = %+v, %v; want attempt 1, its time, due in an hour", first, err)
	}
	w.Attempts, w.Failed = 2, false
	if r, err := f.Driver.RecordWaiting(f.ctx, f.Pool, w); err != nil || r.Attempts != 2 || !r.LastFailure.Equal(first.LastFailure) {
		t.Fatalf("attempt = %+v, %v; want attempt 2, the failure's times kept", r, err)
	}
	f.exec(`SELECT pg_catalog.pg_sleep(0.01)`)
	w.Failed, w.Delay, w.Reason = true, 0, ""
	second, err := f.Driver.RecordWaiting(f.ctx, f.Pool, w)
	if err != nil || !second.FirstFailure.Equal(first.FirstFailure) || !second.LastFailure.After(first.LastFailure) ||
		second.DueIn != 0 || second.Reason != "" {
		t.Fatalf("second failure = %+v, %v; want the first failure kept, a later last one, due now, no reason", second, err)
	}
	other1 := w
	other1.Position, other1.Attempts = pos1, 1
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, other1); err != nil {
		t.Fatal(err)
	}
	rows, err := f.Driver.LoadWaiting(f.ctx, f.Pool, p)
	if err != nil || len(rows) != 2 {
		t.Fatalf("LoadWaiting = %+v, %v; want two entries", rows, err)
	}
	stale, foreign, future := w, w, w
	stale.Epoch--
	foreign.SessionID = other
	future.Position = pgsql.Position{TransactionID: ahead}
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, stale); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("record with a stale epoch: %v, want pgx.ErrNoRows", err)
	}
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, foreign); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("record by another session: %v, want pgx.ErrNoRows", err)
	}
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, future); !isWentBack(err) {
		t.Errorf("record ahead of the counter: %v, want ErrWentBack", err)
	}
	if rows, err := f.Driver.LoadWaiting(f.ctx, f.Pool, stale.OffsetParams); err != nil || len(rows) != 0 {
		t.Errorf("LoadWaiting at a stale epoch = %+v, %v; want nothing", rows, err)
	}
	w.Drop = []pgsql.Position{pos1}
	w.Failed = false
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, w); err != nil {
		t.Fatal(err)
	}
	// Taken over: the entry moves with the row.
	f.expire(owner)
	taker := f.session(group)
	q := f.owned(taker, group, f.claimOne(taker, group, topic))
	rows, err = f.Driver.LoadWaiting(f.ctx, f.Pool, q)
	if err != nil || len(rows) != 1 || rows[0].Position != pos3 || rows[0].Attempts != 2 ||
		!rows[0].FirstFailure.Equal(first.FirstFailure) {
		t.Fatalf("LoadWaiting of the next owner = %+v, %v; want %v's entry, 2 attempts (%v dropped)", rows, err, pos3, pos1)
	}
	// A reset starts the group over: the entries go with the old
	// position (the messages are delivered again as new ones).
	f.expire(taker)
	if _, err := f.reset(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "earliest"}); err != nil {
		t.Fatal(err)
	}
	last := f.session(group)
	r := f.owned(last, group, f.claimOne(last, group, topic))
	if rows, err := f.Driver.LoadWaiting(f.ctx, f.Pool, r); err != nil || len(rows) != 0 {
		t.Fatalf("LoadWaiting after a reset = %+v, %v; want nothing", rows, err)
	}
}

// testHandedOutFenced: MarkHandedOut writes the row's hand-out mark only
// for the row's owner at its epoch (a stale epoch or another session
// writes nothing, pgx.ErrNoRows; a position ahead of the counter is
// ErrWentBack); LoadHandedOut returns it to the owner only; the mark moves
// with the row to the next owner, and a reset of the group's offsets
// clears it.
func testHandedOutFenced(t *testing.T, f *fixture) {
	const group, topic = "g", "handedout"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	if _, ok, err := f.Driver.LoadHandedOut(f.ctx, f.Pool, p); err != nil || ok {
		t.Fatalf("LoadHandedOut of a new row = %v, %v; want none", ok, err)
	}
	p.Position = pos1
	if err := f.Driver.MarkHandedOut(f.ctx, f.Pool, p); err != nil {
		t.Fatal(err)
	}
	p.Position = pos3
	if err := f.Driver.MarkHandedOut(f.ctx, f.Pool, p); err != nil {
		t.Fatal(err)
	}
	if mark, ok, err := f.Driver.LoadHandedOut(f.ctx, f.Pool, p); err != nil || !ok || mark != pos3 {
		t.Fatalf("LoadHandedOut = %v, %v, %v; want %v", mark, ok, err, pos3)
	}
	stale, foreign, future := p, p, p
	stale.Epoch--
	stale.Position = pos1
	foreign.SessionID = other
	foreign.Position = pos1
	future.Position = pgsql.Position{TransactionID: ahead}
	if err := f.Driver.MarkHandedOut(f.ctx, f.Pool, stale); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("mark with a stale epoch: %v, want pgx.ErrNoRows", err)
	}
	if err := f.Driver.MarkHandedOut(f.ctx, f.Pool, foreign); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("mark by another session: %v, want pgx.ErrNoRows", err)
	}
	if err := f.Driver.MarkHandedOut(f.ctx, f.Pool, future); !isWentBack(err) {
		t.Errorf("mark ahead of the counter: %v, want ErrWentBack", err)
	}
	if _, ok, err := f.Driver.LoadHandedOut(f.ctx, f.Pool, stale); err != nil || ok {
		t.Errorf("LoadHandedOut at a stale epoch = %v, %v; want none", ok, err)
	}
	// Taken over: the mark moves with the row, as written by its owner.
	f.expire(owner)
	taker := f.session(group)
	q := f.owned(taker, group, f.claimOne(taker, group, topic))
	if mark, ok, err := f.Driver.LoadHandedOut(f.ctx, f.Pool, q); err != nil || !ok || mark != pos3 {
		t.Fatalf("LoadHandedOut of the next owner = %v, %v, %v; want %v", mark, ok, err, pos3)
	}
	// A reset starts the group over: the messages are delivered again as
	// new ones.
	f.expire(taker)
	if _, err := f.reset(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "earliest"}); err != nil {
		t.Fatal(err)
	}
	last := f.session(group)
	r := f.owned(last, group, f.claimOne(last, group, topic))
	if _, ok, err := f.Driver.LoadHandedOut(f.ctx, f.Pool, r); err != nil || ok {
		t.Fatalf("LoadHandedOut after a reset = %v, %v; want none", ok, err)
	}
}

// testDeadLetterFencedByATakeover: DeadLetterOffset records the message's
// position in acked_above and removes its entry, in the caller's
// transaction, returning the entry as it was; once recorded it writes
// nothing again. Forced: with the row locked by a takeover (a second
// connection that moves the owner and epoch), the old owner's move waits
// for it and then writes nothing (pgx.ErrNoRows), so the transaction that
// would have written the dead-letter copy rolls back.
func testDeadLetterFencedByATakeover(t *testing.T, f *fixture) {
	const group, topic = "g", "deadletter"
	f.ensure(group, topic)
	owner, claimer := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = pos3
	w := pgsql.WaitingParams{OffsetParams: p, Attempts: 3, Failed: true, Reason: "boom"}
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, w); err != nil {
		t.Fatal(err)
	}
	holder := f.lockRows(group, topic)
	if _, err := holder.Exec(f.ctx, `UPDATE `+f.Tables.Offsets+` SET session_id = $3, epoch = epoch + 1
WHERE consumer_group = $1 AND topic = $2`, group, topic, claimer); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		tx, err := f.Pool.Begin(f.ctx)
		if err != nil {
			done <- err
			return
		}
		defer func() { _ = tx.Rollback(f.ctx) }()
		if _, err := f.Driver.DeadLetterOffset(f.ctx, tx, w); err != nil {
			done <- err
			return
		}
		copyOf := pgsql.InsertMessagesParams{Topics: []string{topic + ".dead"}, UUIDs: []string{"copy"},
			Payloads: [][]byte{[]byte("copy")}, Metadata: []string{""}}
		if err := f.Driver.InsertMessages(f.ctx, tx, copyOf); err != nil {
			done <- err
			return
		}
		done <- tx.Commit(f.ctx)
	}()
	f.waitBlocked(1, "WITH here AS%", "SELECT %acked_above)%")
	select {
	case err := <-done:
		t.Fatalf("the move did not wait for the takeover: %v", err)
	default:
	}
	if err := holder.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("the old owner's move after the takeover: %v, want pgx.ErrNoRows", err)
	}
	if row := f.row(group, topic, 0); len(row.AckedAbove) != 0 || *row.Session != claimer {
		t.Fatalf("row %+v, want the claimer's, nothing recorded", row)
	}
	if n := f.count(topic + ".dead"); n != 0 {
		t.Fatalf("%d dead-letter copies after the fenced move, want 0", n)
	}
	// The new owner moves it once.
	w.SessionID, w.Epoch = claimer, p.Epoch+1
	tx := f.begin()
	r, err := f.Driver.DeadLetterOffset(f.ctx, tx, w)
	if err != nil || r.Attempts != 3 || r.Reason != "boom" || r.FirstFailure.IsZero() {
		t.Fatalf("the new owner's move = %+v, %v; want the entry of 3 attempts", r, err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	row := f.row(group, topic, 0)
	if !slices.Equal(row.AckedAbove, []string{pgsql.AboveEntry(pos3)}) {
		t.Fatalf("acked_above %v, want %v", row.AckedAbove, pos3)
	}
	if rows, err := f.Driver.LoadWaiting(f.ctx, f.Pool, w.OffsetParams); err != nil || len(rows) != 0 {
		t.Fatalf("entries after the move: %+v, %v; want none", rows, err)
	}
	if _, err := f.Driver.DeadLetterOffset(f.ctx, f.Pool, w); !errors.Is(err, pgsql.ErrRecorded) {
		t.Fatalf("a second move: %v, want ErrRecorded", err)
	}
}

// count is the number of messages of topic.
func (f *fixture) count(topic string) int {
	f.t.Helper()
	var n int
	if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.count(*) FROM `+f.Tables.Messages+` WHERE topic = $1`, topic).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// testSkipMessage: SkipMessage records one position above the row's
// position in acked_above, drops its waiting entry and bumps the epoch;
// a live owner is left alone unless forced (then fenced, the session
// kept); a position at or before the row's, one already recorded, or one
// without a message changes nothing; a group without a row reports it.
func testSkipMessage(t *testing.T, f *fixture) {
	const group, topic = "g", "skip"
	f.ensure(group, topic)
	f.publish(f.Pool, topic, "a", "b", "c")
	msgs := f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages
	if len(msgs) != 3 {
		t.Fatalf("read %d messages, want 3", len(msgs))
	}
	owner := f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = msgs[1].Position
	if _, err := f.Driver.RecordWaiting(f.ctx, f.Pool, pgsql.WaitingParams{OffsetParams: p, Attempts: 1, Failed: true}); err != nil {
		t.Fatal(err)
	}
	skip := func(params pgsql.SkipParams) pgsql.SkipRow {
		t.Helper()
		var r pgsql.SkipRow
		err := pgx.BeginFunc(f.ctx, f.Pool, func(tx pgx.Tx) error {
			var err error
			r, err = pgsql.SkipMessage(f.ctx, tx, f.Tables, params)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	s := pgsql.SkipParams{ConsumerGroup: group, Topic: topic, Position: msgs[1].Position}
	if r := skip(s); !r.RowFound || !r.MessageFound || r.LiveOwner == nil || r.Applied || r.AlreadyPast {
		t.Fatalf("skip under a live owner = %+v; want it found and left alone", r)
	}
	before := f.row(group, topic, 0)
	s.Force = true
	if r := skip(s); !r.Applied {
		t.Fatalf("forced skip = %+v; want it applied", r)
	}
	after := f.row(group, topic, 0)
	if after.Epoch != before.Epoch+1 || after.Session == nil || *after.Session != owner ||
		!slices.Equal(after.AckedAbove, []string{pgsql.AboveEntry(msgs[1].Position)}) || after.Acked != before.Acked {
		t.Fatalf("row after the skip = %+v (before %+v); want the epoch bumped, the session kept, the position above", after, before)
	}
	if rows, err := f.Driver.LoadWaiting(f.ctx, f.Pool, pgsql.OffsetParams{ConsumerGroup: group, Topic: topic,
		SessionID: owner, Epoch: after.Epoch}); err != nil || len(rows) != 0 {
		t.Fatalf("waiting after the skip = %+v, %v; want nothing", rows, err)
	}
	if r := skip(s); !r.AlreadyPast || r.Applied {
		t.Errorf("skip again = %+v; want already past", r)
	}
	s.Position = pgsql.Position{}
	if r := skip(s); r.MessageFound {
		t.Errorf("skip of a position without a message = %+v", r)
	}
	s.Position, s.ConsumerGroup = msgs[2].Position, "nobody"
	if r := skip(s); r.RowFound {
		t.Errorf("skip for a group without a row = %+v", r)
	}
}
