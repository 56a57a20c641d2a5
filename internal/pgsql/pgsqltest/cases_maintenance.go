package pgsqltest

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// reset runs ResetOffsets in a transaction of its own on q (the caller's
// transaction on Citus, as the admin runs it), committed.
func (f *fixture) reset(p pgsql.ResetParams) ([]pgsql.ResetRow, error) {
	var rows []pgsql.ResetRow
	err := pgx.BeginFunc(f.ctx, f.Pool, func(tx pgx.Tx) error {
		var err error
		rows, err = f.Driver.ResetOffsets(f.ctx, tx, p)
		return err
	})
	return rows, err
}

// resetResult is what an asynchronous reset returned.
type resetResult struct {
	rows []pgsql.ResetRow
	err  error
}

// resetAsync runs f.reset from a goroutine, and returns a channel that
// receives its result.
func (f *fixture) resetAsync(p pgsql.ResetParams) <-chan resetResult {
	done := make(chan resetResult, 1)
	go func() {
		rows, err := f.reset(p)
		done <- resetResult{rows, err}
	}()
	return done
}

// testResetOffsets: a reset moves a free row to the beginning or to the
// latest position and bumps its epoch; a row whose owner lives is left
// alone without force, and with force keeps its owner but bumps the
// epoch, so that the owner's commits under the old one are refused; a
// reset that writes notifies the group's Subscribers.
func testResetOffsets(t *testing.T, f *fixture) {
	const group, topic = "g", "reset"
	f.publish(f.Pool, topic, "m1", "m2")
	msgs := f.readSettled(f.selectParams(topic, 0, pgsql.Position{})).Messages
	f.ensure(group, topic)
	owner := f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = msgs[1].Position
	if _, written := f.commit(p); !written {
		t.Fatal("commit refused")
	}
	if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, p); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	l := f.listen()
	note := pgsql.ResetNotification(group, topic)
	rows, err := f.reset(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "earliest", Notification: note})
	if err != nil || len(rows) != 1 || !rows[0].Applied || rows[0].Changed || rows[0].From != msgs[1].Position || rows[0].To != (pgsql.Position{}) {
		t.Fatalf("reset to earliest = %+v, %v; want applied from m2's position to the beginning", rows, err)
	}
	f.notified(l, note)
	if r := f.row(group, topic, 0); r.Acked != (pgsql.Position{}) || r.Epoch != 2 || r.Session != nil {
		t.Fatalf("row after the reset: %+v, want free at the beginning, epoch 2", r)
	}
	rows, err = f.reset(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "latest"})
	if err != nil || len(rows) != 1 || !rows[0].Applied || !before(msgs[1].Position, rows[0].To) {
		t.Fatalf("reset to latest = %+v, %v; want applied after m2", rows, err)
	}
	if res := f.read(f.selectParams(topic, 0, rows[0].To)); len(res.Messages) != 0 {
		t.Fatalf("after the latest position: %v, want nothing", uuidsOf(res.Messages))
	}

	p = f.owned(owner, group, f.claimOne(owner, group, topic))
	rows, err = f.reset(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "earliest"})
	if err != nil || len(rows) != 1 || rows[0].Applied || rows[0].LiveOwner == nil || rows[0].SessionID == nil || *rows[0].SessionID != owner {
		t.Fatalf("reset of a live owner's row = %+v, %v; want left alone, the owner named", rows, err)
	}
	if r := f.row(group, topic, 0); r.Epoch != p.Epoch || r.Acked == (pgsql.Position{}) {
		t.Fatalf("row after the reset without force: %+v, want it unchanged", r)
	}
	rows, err = f.reset(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "earliest", Force: true})
	if err != nil || len(rows) != 1 || !rows[0].Applied {
		t.Fatalf("forced reset = %+v, %v; want applied", rows, err)
	}
	if r := f.row(group, topic, 0); r.Session == nil || *r.Session != owner || r.Epoch != p.Epoch+1 || r.Acked != (pgsql.Position{}) {
		t.Fatalf("row after the forced reset: %+v, want the owner's at epoch %d at the beginning", r, p.Epoch+1)
	}
	p.Position = msgs[0].Position
	if _, written := f.commit(p); written {
		t.Fatal("the owner's commit under the epoch before the reset was written")
	}
}

// testResetOffsetsLeavesChangedRows: a row whose owner or epoch changes
// between the reset's snapshot and its lock (a claim that commits while
// the reset waits for the row) is left alone and reported changed, for
// the caller to run the reset again.
func testResetOffsetsLeavesChangedRows(t *testing.T, f *fixture) {
	const group, topic = "g", "resetrace"
	f.ensure(group, topic)
	claimer := f.session(group)
	holder := f.lockRows(group, topic)
	if _, err := holder.Exec(f.ctx, `UPDATE `+f.Tables.Offsets+` SET session_id = $3, epoch = epoch + 1
WHERE consumer_group = $1 AND topic = $2`, group, topic, claimer); err != nil {
		t.Fatal(err)
	}
	done := f.resetAsync(pgsql.ResetParams{ConsumerGroup: group, Topic: topic, To: "earliest", Force: true})
	// Single server: one statement (WITH snap AS ...); on Citus the rows
	// are locked by a statement of their own.
	f.waitBlocked(1, "WITH snap AS%", "SELECT partition, session_id%")
	if err := holder.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || len(res.rows) != 1 || !res.rows[0].Changed || res.rows[0].Applied {
		t.Fatalf("reset while a claim committed = %+v, %v; want the row reported changed, not applied", res.rows, res.err)
	}
	if r := f.row(group, topic, 0); r.Session == nil || *r.Session != claimer || r.Epoch != 1 {
		t.Fatalf("row %+v, want the claimer's at epoch 1", r)
	}
}

// testMaintainerClaimRelease: the maintainer's row is claimed by one
// session at a time (a second claim is refused and told who holds it),
// claimed again by its holder with the next epoch, released only by its
// holder at its epoch (notified), and taken from a holder whose session
// expired or is gone.
func testMaintainerClaimRelease(t *testing.T, f *fixture) {
	if h, err := f.Driver.MaintainerHolder(f.ctx, f.Pool); err != nil || h.Holder != nil {
		t.Fatalf("holder of a new row = %+v, %v; want none", h, err)
	}
	a, b := f.session("m"), f.session("m")
	claim := func(id uuid.UUID) pgsql.HolderRow {
		t.Helper()
		h, err := f.Driver.ClaimMaintainer(f.ctx, f.Pool, pgsql.MaintainerParams{SessionID: id})
		if err != nil {
			t.Fatalf("claim the maintainer: %v", err)
		}
		return h
	}
	holds := func(h pgsql.HolderRow, id uuid.UUID) bool { return h.Holder != nil && *h.Holder == [16]byte(id) }
	if h := claim(a); h.Epoch == nil || *h.Epoch != 1 {
		t.Fatalf("first claim = %+v, want epoch 1", h)
	}
	if h := claim(b); h.Epoch != nil || !holds(h, a) || h.ExpiresInMs == nil || *h.ExpiresInMs <= 0 {
		t.Fatalf("a second claim = %+v; want refused, held by a, live", h)
	}
	if h := claim(a); h.Epoch == nil || *h.Epoch != 2 {
		t.Fatalf("the holder's claim again = %+v, want epoch 2", h)
	}
	l := f.listen()
	release := func(id uuid.UUID, epoch int64) {
		t.Helper()
		if err := f.Driver.ReleaseMaintainer(f.ctx, f.Pool, pgsql.MaintainerParams{SessionID: id, Epoch: epoch,
			NotifyChannel: f.Tables.NotifyChannel}); err != nil {
			t.Fatal(err)
		}
	}
	release(a, 1)
	release(b, 2)
	if h, err := f.Driver.MaintainerHolder(f.ctx, f.Pool); err != nil || !holds(h, a) {
		t.Fatalf("holder after releases by a stale epoch and another session = %+v, %v; want a", h, err)
	}
	release(a, 2)
	f.notified(l, string(rune(pgsql.NotifyMaintainer)))
	if h, err := f.Driver.MaintainerHolder(f.ctx, f.Pool); err != nil || h.Holder != nil {
		t.Fatalf("holder after the release = %+v, %v; want none", h, err)
	}

	if h := claim(a); h.Epoch == nil || *h.Epoch != 3 {
		t.Fatalf("claim of the free row = %+v, want epoch 3", h)
	}
	f.expire(a)
	if h := claim(b); h.Epoch == nil || *h.Epoch != 4 || !holds(h, a) {
		t.Fatalf("claim from an expired holder = %+v, want epoch 4, taken from a", h)
	}
	if f.sessionExists(a) {
		t.Fatal("the expired holder's session exists after the claim")
	}
	if err := f.Driver.DeleteSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: b}); err != nil {
		t.Fatal(err)
	}
	if h := claim(f.session("m")); h.Epoch == nil || *h.Epoch != 5 {
		t.Fatalf("claim from a gone holder = %+v, want epoch 5", h)
	}
}
