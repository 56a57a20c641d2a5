package pgsqltest

import (
	"cmp"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// testEnsureOffsetsEarliest: the missing rows are created at the
// beginning of their partitions, free, at epoch 0; rows that exist are
// left as they are.
func testEnsureOffsetsEarliest(t *testing.T, f *fixture) {
	const group, topic = "g", "ensure"
	p := pgsql.OffsetsParams{ConsumerGroup: group, Topics: []string{topic, topic}, Partitions: []int32{0, 1}}
	rows, err := f.Driver.EnsureOffsets(f.ctx, f.Pool, p)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(rows, func(a, b pgsql.EnsuredRow) int { return cmp.Compare(a.Partition, b.Partition) })
	if len(rows) != 2 || rows[0].Partition != 0 || rows[1].Partition != 1 || rows[0].AckedTransactionID != 0 || rows[1].AckedTransactionID != 0 {
		t.Fatalf("EnsureOffsets = %+v, want partitions 0 and 1 at the beginning", rows)
	}
	session := f.session(group)
	f.claimOne(session, group, topic)
	if rows, err := f.Driver.EnsureOffsets(f.ctx, f.Pool, p); err != nil || len(rows) != 0 {
		t.Fatalf("EnsureOffsets of existing rows = %+v, %v; want none created", rows, err)
	}
	if r := f.row(group, topic, 0); r.Session == nil || *r.Session != session || r.Epoch != 1 {
		t.Fatalf("the claimed row after EnsureOffsets: %+v, want it unchanged", r)
	}
	if r := f.row(group, topic, 1); r.Session != nil || r.Epoch != 0 || r.Acked != (pgsql.Position{}) {
		t.Fatalf("a new row: %+v, want free at epoch 0 at the beginning", r)
	}
}

// testEnsureOffsetsLatest: with Latest, a group's first rows of a topic
// start where every message visible now counts as acknowledged (on Citus
// at the topic's worker's horizon); a row added later for a topic the
// group has rows of starts at the beginning, as does a group without
// Latest.
func testEnsureOffsetsLatest(t *testing.T, f *fixture) {
	const topic = "latest"
	f.publish(f.Pool, topic, "old")
	f.readSettled(f.selectParams(topic, 0, pgsql.Position{}))
	rows, err := f.Driver.EnsureOffsets(f.ctx, f.Pool, pgsql.OffsetsParams{ConsumerGroup: "new", Topics: []string{topic}, Latest: true})
	if err != nil || len(rows) != 1 || rows[0].AckedTransactionID == 0 {
		t.Fatalf("EnsureOffsets latest = %+v, %v; want a row after the messages", rows, err)
	}
	start := f.row("new", topic, 0).Acked
	if start.TransactionID != rows[0].AckedTransactionID {
		t.Fatalf("the row starts at %v, EnsureOffsets said %d", start, rows[0].AckedTransactionID)
	}
	if res := f.read(f.selectParams(topic, 0, start)); len(res.Messages) != 0 {
		t.Fatalf("after the latest position: %v, want nothing", uuidsOf(res.Messages))
	}
	f.publish(f.Pool, topic, "new")
	if got := uuidsOf(f.readSettled(f.selectParams(topic, 0, start)).Messages); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("after the latest position, once published: %v, want [new]", got)
	}
	rows, err = f.Driver.EnsureOffsets(f.ctx, f.Pool, pgsql.OffsetsParams{ConsumerGroup: "new", Topics: []string{topic},
		Partitions: []int32{1}, Latest: true})
	if err != nil || len(rows) != 1 || rows[0].AckedTransactionID != 0 {
		t.Fatalf("EnsureOffsets latest of a later partition = %+v, %v; want it at the beginning", rows, err)
	}
	rows, err = f.Driver.EnsureOffsets(f.ctx, f.Pool, pgsql.OffsetsParams{ConsumerGroup: "earliest", Topics: []string{topic}})
	if err != nil || len(rows) != 1 || rows[0].AckedTransactionID != 0 {
		t.Fatalf("EnsureOffsets earliest = %+v, %v; want it at the beginning", rows, err)
	}
}

func sortClaims(rows []pgsql.ClaimRow) {
	slices.SortFunc(rows, func(a, b pgsql.ClaimRow) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
}

// testClaimTakesFreeRows: a claim takes the free rows asked for, bumping
// their epochs, reports a row that does not exist as missing, takes at
// most the limit, and may take again a row the session owns (a retry of
// a claim whose outcome was lost), bumping the epoch again. HasNext says
// whether a message follows the position on a single server; on Citus
// the claim does not read it and it is always true.
func testClaimTakesFreeRows(t *testing.T, f *fixture) {
	const group, topic = "g", "free"
	if _, err := f.Driver.UpsertTopic(f.ctx, f.Pool, pgsql.TopicParams{Topic: topic, Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	if err := f.Driver.InsertMessages(f.ctx, f.Pool, pgsql.InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{"m"},
		Payloads: [][]byte{nil}, Metadata: []string{""}, PartitionHashes: []uint32{0}}); err != nil {
		t.Fatal(err)
	}
	f.ensure(group, topic, 0, 1, 2)
	session := f.session(group)
	rows := f.claim(session, group, topic, 0, 1, 2, 3)
	sortClaims(rows)
	if len(rows) != 4 {
		t.Fatalf("claim = %s, want 4 rows", claimsString(rows))
	}
	for i, r := range rows[:3] {
		if r.Kind != pgsql.ClaimTaken || r.Partition != int32(i) || r.Epoch != 1 || r.Previous != uuid.Nil || r.PreviousOwner != "" ||
			r.Acked != (pgsql.Position{}) || len(r.AckedAbove) != 0 {
			t.Errorf("row %d: %+v, want taken at epoch 1 from nobody", i, r)
		}
		if want := i == 0 || f.Citus; r.HasNext != want {
			t.Errorf("row %d: HasNext %t, want %t", i, r.HasNext, want)
		}
		if o := f.row(group, topic, int32(i)); o.Session == nil || *o.Session != session || o.Epoch != 1 {
			t.Errorf("row %d in the table: %+v", i, o)
		}
	}
	if r := rows[3]; r.Kind != pgsql.ClaimMissing || r.Partition != 3 {
		t.Errorf("the row not ensured: %+v, want missing", r)
	}
	again := f.claim(session, group, topic, 0)
	if len(again) != 1 || again[0].Kind != pgsql.ClaimTaken || again[0].Epoch != 2 || again[0].Previous != uuid.Nil {
		t.Fatalf("the owner's claim again = %s, want taken at epoch 2", claimsString(again))
	}

	f.ensure("limited", topic, 0, 1, 2)
	p := f.claimParams(f.session("limited"), "limited", topic, 0, 1, 2)
	p.Limit = 2
	limited, err := f.Driver.ClaimOffsets(f.ctx, f.Pool, p)
	if err != nil {
		t.Fatal(err)
	}
	sortClaims(limited)
	if len(limited) != 2 || limited[0].Partition != 0 || limited[1].Partition != 1 {
		t.Fatalf("claim with limit 2 = %s, want partitions 0 and 1", claimsString(limited))
	}
	if r := f.row("limited", topic, 2); r.Session != nil || r.Epoch != 0 {
		t.Fatalf("the row beyond the limit: %+v, want free", r)
	}
}

// testClaimRefusedWhileOwnerLive: a row whose owner's session lives is
// not taken (and not reported): the owner and epoch stay.
func testClaimRefusedWhileOwnerLive(t *testing.T, f *fixture) {
	const group, topic = "g", "live"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	f.claimOne(owner, group, topic)
	if rows := f.claim(other, group, topic); len(rows) != 0 {
		t.Fatalf("claim of a live owner's row = %s, want no row", claimsString(rows))
	}
	if r := f.row(group, topic, 0); r.Session == nil || *r.Session != owner || r.Epoch != 1 {
		t.Fatalf("row %+v, want the owner's at epoch 1", r)
	}
	if !f.sessionExists(owner) {
		t.Fatal("the claim deleted a live session")
	}
}

// testClaimTakesFromExpiredOrGoneOwner: a row whose owner's session has
// expired is taken with the next epoch, the expired session deleted; so
// is a row whose owner's session row is gone. The claim says whom it took
// the row from.
func testClaimTakesFromExpiredOrGoneOwner(t *testing.T, f *fixture) {
	const group = "g"
	claimer := f.session(group)
	for _, gone := range []bool{false, true} {
		topic := "expired"
		if gone {
			topic = "gone"
		}
		f.ensure(group, topic)
		owner := f.session(group)
		f.claimOne(owner, group, topic)
		if gone {
			if err := f.Driver.DeleteSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: owner}); err != nil {
				t.Fatal(err)
			}
		} else {
			f.expire(owner)
		}
		r := f.claimOne(claimer, group, topic)
		wantOwner := "owner-" + owner.String()[:8]
		if gone {
			wantOwner = ""
		}
		if r.Epoch != 2 || r.Previous != owner || r.PreviousOwner != wantOwner {
			t.Errorf("%s: claim = %+v, want epoch 2 from %s (%q)", topic, r, owner, wantOwner)
		}
		if o := f.row(group, topic, 0); o.Session == nil || *o.Session != claimer || o.Epoch != 2 {
			t.Errorf("%s: row %+v, want the claimer's at epoch 2", topic, o)
		}
		if f.sessionExists(owner) {
			t.Errorf("%s: the expired owner's session exists after the claim", topic)
		}
	}
}

// testClaimWaitsForTheOwnersHeartbeat forces the interleaving that the
// claim's delete of an expired owner's session must get right: the
// owner's session has expired when the claim reads the row, but its
// heartbeat (held open from a second connection) extends it before the
// claim's delete gets the session row. The delete then waits for the
// heartbeat, finds the session live, deletes nothing, and the row stays
// the owner's (reported lost). Once the session has expired for good, the
// same claim takes the row and bumps its epoch.
func testClaimWaitsForTheOwnersHeartbeat(t *testing.T, f *fixture) {
	const group, topic = "g", "beat"
	owner, claimer := f.session(group), f.session(group)
	f.ensure(group, topic)
	f.claimOne(owner, group, topic)
	f.expire(owner)

	beat := f.begin()
	if _, err := beat.Exec(f.ctx, `UPDATE `+f.Tables.Sessions+` SET expires_at = pg_catalog.now() + interval '1 hour' WHERE id = $1`, owner); err != nil {
		t.Fatal(err)
	}
	done := f.claimAsync(claimer, group, topic)
	// Single server: the claim is one statement (WITH here AS ...); on
	// Citus its delete of the expired session is a statement of its own.
	f.waitBlocked(1, "WITH here AS%", "DELETE FROM %")
	f.notYet(done, "the heartbeat")
	if err := beat.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.awaitClaim(done); len(r) != 1 || r[0].Kind != pgsql.ClaimLost {
		t.Fatalf("claim after the heartbeat won = %s, want lost", claimsString(r))
	}
	if r := f.row(group, topic, 0); r.Session == nil || *r.Session != owner || r.Epoch != 1 {
		t.Fatalf("row %+v, want the owner's at epoch 1", r)
	}
	f.expire(owner)
	if r := f.claimOne(claimer, group, topic); r.Epoch != 2 || r.Previous != owner {
		t.Fatalf("claim of the expired owner's row = %+v", r)
	}
}

// claimResult is the outcome of a claim run by claimAsync.
type claimResult struct {
	rows []pgsql.ClaimRow
	err  error
}

// claimAsync runs a claim in a goroutine; its outcome comes on the
// channel (read it with awaitClaim). The goroutine ends by itself at the
// latest when the case's context does.
func (f *fixture) claimAsync(session uuid.UUID, group, topic string, partitions ...int32) <-chan claimResult {
	done := make(chan claimResult, 1)
	p := f.claimParams(session, group, topic, partitions...)
	go func() {
		rows, err := f.Driver.ClaimOffsets(f.ctx, f.Pool, p)
		done <- claimResult{rows, err}
	}()
	return done
}

// awaitClaim waits for the claim of claimAsync and fails on its error.
func (f *fixture) awaitClaim(done <-chan claimResult) []pgsql.ClaimRow {
	f.t.Helper()
	r := <-done
	if r.err != nil {
		f.t.Fatalf("claim: %v", r.err)
	}
	return r.rows
}

// notYet fails if the claim of claimAsync has returned: it should wait.
func (f *fixture) notYet(done <-chan claimResult, what string) {
	f.t.Helper()
	select {
	case r := <-done:
		f.t.Fatalf("the claim did not wait for %s: %s, %v", what, claimsString(r.rows), r.err)
	default:
	}
}

// lockRows locks the group's rows of topic from a transaction of its own
// (SELECT ... FOR UPDATE), as a concurrent claim or commit holds them.
func (f *fixture) lockRows(group, topic string) pgx.Tx {
	f.t.Helper()
	tx := f.begin()
	if _, err := tx.Exec(f.ctx, `SELECT 1 FROM `+f.Tables.Offsets+` WHERE consumer_group = $1 AND topic = $2 FOR UPDATE`, group, topic); err != nil {
		f.t.Fatalf("lock the rows: %v", err)
	}
	return tx
}

// testClaimWaitsForRowLockThenLoses: a claim of a row locked by another
// transaction waits for it (it does not skip it); when that transaction
// commits a new owner (as a concurrent claim that came first), the claim
// takes nothing and reports the row lost, since the compare-and-swap on
// (session_id, epoch) fails; when it rolls back, the claim takes the row.
func testClaimWaitsForRowLockThenLoses(t *testing.T, f *fixture) {
	const group, topic = "g", "locked"
	f.ensure(group, topic)
	claimer, first := f.session(group), f.session(group)
	for _, commit := range []bool{true, false} {
		holder := f.lockRows(group, topic)
		if commit {
			if _, err := holder.Exec(f.ctx, `UPDATE `+f.Tables.Offsets+` SET session_id = $3, epoch = epoch + 1
WHERE consumer_group = $1 AND topic = $2`, group, topic, first); err != nil {
				t.Fatal(err)
			}
		}
		done := f.claimAsync(claimer, group, topic)
		f.waitBlocked(1, "WITH here AS%", "UPDATE %")
		f.notYet(done, "the row lock")
		if commit {
			if err := holder.Commit(f.ctx); err != nil {
				t.Fatal(err)
			}
			if r := f.awaitClaim(done); len(r) != 1 || r[0].Kind != pgsql.ClaimLost {
				t.Fatalf("claim after a concurrent owner committed = %s, want lost", claimsString(r))
			}
			if r := f.row(group, topic, 0); r.Session == nil || *r.Session != first || r.Epoch != 1 {
				t.Fatalf("row %+v, want the first owner's at epoch 1", r)
			}
			// Free it again for the second round.
			if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, pgsql.OffsetParams{ConsumerGroup: group, Topic: topic,
				SessionID: first, Epoch: 1, Here: f.here}); err != nil || n != 1 {
				t.Fatalf("release: %d, %v", n, err)
			}
			continue
		}
		if err := holder.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		if r := f.awaitClaim(done); len(r) != 1 || r[0].Kind != pgsql.ClaimTaken || r[0].Epoch != 2 {
			t.Fatalf("claim after the lock was given up = %s, want taken at epoch 2", claimsString(r))
		}
	}
}

// testConcurrentClaimsOneOwner: two sessions claim the same rows at the
// same time (both held behind a row lock until they are waiting, then let
// go together): each row is taken by exactly one of them, at epoch 1, and
// the other reports it lost; the table agrees.
func testConcurrentClaimsOneOwner(t *testing.T, f *fixture) {
	const group, topic = "g", "race"
	parts := []int32{0, 1, 2, 3}
	f.ensure(group, topic, parts...)
	a, b := f.session(group), f.session(group)
	holder := f.lockRows(group, topic)
	doneA := f.claimAsync(a, group, topic, parts...)
	doneB := f.claimAsync(b, group, topic, parts...)
	f.waitBlocked(2, "WITH here AS%", "UPDATE %")
	if err := holder.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	rowsA, rowsB := f.awaitClaim(doneA), f.awaitClaim(doneB)
	winner := map[int32]uuid.UUID{}
	for _, c := range []struct {
		id   uuid.UUID
		rows []pgsql.ClaimRow
	}{{a, rowsA}, {b, rowsB}} {
		for _, r := range c.rows {
			switch r.Kind {
			case pgsql.ClaimTaken:
				if w, ok := winner[r.Partition]; ok {
					t.Errorf("partition %d taken by %s and %s", r.Partition, w, c.id)
				}
				winner[r.Partition] = c.id
				if r.Epoch != 1 {
					t.Errorf("partition %d taken at epoch %d, want 1", r.Partition, r.Epoch)
				}
			case pgsql.ClaimLost:
			default:
				t.Errorf("partition %d: kind %c", r.Partition, r.Kind)
			}
		}
	}
	for _, part := range parts {
		w, ok := winner[part]
		if !ok {
			t.Errorf("partition %d taken by neither claim (a: %s, b: %s)", part, claimsString(rowsA), claimsString(rowsB))
			continue
		}
		if r := f.row(group, topic, part); r.Session == nil || *r.Session != w || r.Epoch != 1 {
			t.Errorf("partition %d in the table: %+v, want %s's at epoch 1", part, r, w)
		}
	}
	if n := len(rowsA) + len(rowsB); n != 2*len(parts) {
		t.Errorf("the claims reported %d rows, want %d (each row by each claim)", n, 2*len(parts))
	}
}

// testClaimLeavesFuturePosition: a row whose position lies ahead of the
// transaction counter (copied from another cluster) is not claimed and
// is reported as such.
func testClaimLeavesFuturePosition(t *testing.T, f *fixture) {
	const group, topic = "g", "future"
	f.ensure(group, topic)
	f.exec(`UPDATE `+f.Tables.Offsets+` SET acked_transaction_id = $3::text::xid8 WHERE consumer_group = $1 AND topic = $2`,
		group, topic, uitoa(ahead))
	rows := f.claim(f.session(group), group, topic)
	if len(rows) != 1 || rows[0].Kind != pgsql.ClaimFuture {
		t.Fatalf("claim = %s, want the row reported ahead of the counter", claimsString(rows))
	}
	if r := f.row(group, topic, 0); r.Session != nil || r.Epoch != 0 {
		t.Fatalf("row %+v, want it unclaimed", r)
	}
}

// testClaimRefusedElsewhere: a claim made with another server's identity
// (the session was made before a failover, a restore, or on another
// server behind a pooler) claims nothing and says so. On Citus the
// identity is the coordinator's, as the session's.
func testClaimRefusedElsewhere(t *testing.T, f *fixture) {
	const group, topic = "g", "elsewhere"
	f.ensure(group, topic)
	p := f.claimParams(f.session(group), group, topic)
	p.Here = "00000009:1:1"
	rows, err := f.Driver.ClaimOffsets(f.ctx, f.Pool, p)
	if err != nil || len(rows) != 1 || rows[0].Kind != pgsql.ClaimWentBack {
		t.Fatalf("claim elsewhere = %s, %v; want one row, went back", claimsString(rows), err)
	}
	if r := f.row(group, topic, 0); r.Session != nil || r.Epoch != 0 {
		t.Fatalf("row %+v, want it unclaimed", r)
	}
}
