package pgsqltest

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

func uitoa(n uint64) string { return strconv.FormatUint(n, 10) }

// Positions below any test server's transaction counter (a fenced
// statement refuses others), in order.
var (
	pos1 = pgsql.Position{TransactionID: 5, Offset: 1}
	pos2 = pgsql.Position{TransactionID: 5, Offset: 2}
	pos3 = pgsql.Position{TransactionID: 6, Offset: 1}
)

// commit runs CommitOffset and fails on an error.
func (f *fixture) commit(p pgsql.OffsetParams) (string, bool) {
	f.t.Helper()
	v, written, err := f.Driver.CommitOffset(f.ctx, f.Pool, p)
	if err != nil {
		f.t.Fatalf("commit %v at epoch %d: %v", p.Position, p.Epoch, err)
	}
	return v, written
}

// testCommitFenced: a commit by another session, or by the owner with a
// stale epoch (the row was claimed again since), writes nothing; the
// owner's commit moves the position, and with HeadOut counts the
// delivery of the next message. On a single server the commit returns
// the version it wrote, which the next commit tries first; the hint
// never lets a stale commit through. On Citus there is no hint: the
// version is empty.
func testCommitFenced(t *testing.T, f *fixture) {
	const group, topic = "g", "commit"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = pos1

	stale := p
	stale.Epoch--
	if _, written := f.commit(stale); written {
		t.Fatal("a commit with a stale epoch was written")
	}
	foreign := p
	foreign.SessionID = other
	if _, written := f.commit(foreign); written {
		t.Fatal("another session's commit was written")
	}
	if r := f.row(group, topic, 0); r.Acked != (pgsql.Position{}) {
		t.Fatalf("refused commits moved the row to %v", r.Acked)
	}

	v, written := f.commit(p)
	if !written {
		t.Fatal("the owner's commit was refused")
	}
	if (v != "") == f.Citus {
		t.Fatalf("the commit's version = %q (Citus %t): want one on a single server, none on Citus", v, f.Citus)
	}
	if r := f.row(group, topic, 0); r.Acked != pos1 || r.HeadDeliveries != 0 {
		t.Fatalf("row after the commit: %+v, want at %v", r, pos1)
	}
	p.Position, p.Version, p.HeadOut = pos2, v, true
	v, written = f.commit(p)
	if !written {
		t.Fatal("the commit from the version hint was refused")
	}
	if r := f.row(group, topic, 0); r.Acked != pos2 || r.HeadDeliveries != 1 {
		t.Fatalf("row after the commit with HeadOut: %+v, want at %v, one delivery of the head", r, pos2)
	}

	// Claimed again (a retry): the epoch the commits held is stale, and
	// the version they read is no longer the row's.
	f.claimOne(owner, group, topic)
	p.Position, p.Version, p.HeadOut = pos3, v, false
	if _, written := f.commit(p); written {
		t.Fatal("a commit with the epoch before the claim was written")
	}
	if r := f.row(group, topic, 0); r.Acked != pos2 || r.Epoch != 2 {
		t.Fatalf("row after the stale commit: %+v, want at %v, epoch 2", r, pos2)
	}
}

// testCommitPositionChecks: a commit at a position ahead of the
// transaction counter (read on another history) is refused with
// ErrWentBack and writes nothing; a commit at or before the row's
// position is written (the fence holds) but never moves the position
// back, nor resets its delivery count.
func testCommitPositionChecks(t *testing.T, f *fixture) {
	const group, topic = "g", "positions"
	f.ensure(group, topic)
	owner := f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position, p.HeadOut = pos2, true
	if _, written := f.commit(p); !written {
		t.Fatal("commit refused")
	}
	p.HeadOut = false
	p.Position = pgsql.Position{TransactionID: ahead, Offset: 1}
	if _, _, err := f.Driver.CommitOffset(f.ctx, f.Pool, p); !isWentBack(err) {
		t.Fatalf("commit ahead of the counter: %v, want ErrWentBack", err)
	}
	for _, back := range []pgsql.Position{pos1, pos2} {
		p.Position = back
		f.commit(p)
		if r := f.row(group, topic, 0); r.Acked != pos2 || r.HeadDeliveries != 1 {
			t.Fatalf("after a commit at %v: %+v, want the row still at %v with its delivery count", back, r, pos2)
		}
	}
}

// testReleaseFenced: a release by another session or with a stale epoch
// frees nothing; one at a position ahead of the counter is refused with
// ErrWentBack and writes nothing; the owner's release writes the
// position, frees the row and notifies; a release never moves the
// position back.
func testReleaseFenced(t *testing.T, f *fixture) {
	const group, topic = "g", "release"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = pos2
	release := func(p pgsql.OffsetParams) int64 {
		t.Helper()
		n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, p)
		if err != nil {
			t.Fatalf("release: %v", err)
		}
		return n
	}
	stale, foreign := p, p
	stale.Epoch--
	foreign.SessionID = other
	if release(stale) != 0 || release(foreign) != 0 {
		t.Fatal("a release with a stale epoch or by another session freed the row")
	}
	future := p
	future.Position = pgsql.Position{TransactionID: ahead}
	if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, future); !isWentBack(err) || n != 0 {
		t.Fatalf("release ahead of the counter: %d, %v; want ErrWentBack", n, err)
	}
	if r := f.row(group, topic, 0); r.Session == nil || *r.Session != owner || r.Acked != (pgsql.Position{}) {
		t.Fatalf("row after the refused releases: %+v, want the owner's, unmoved", r)
	}

	l := f.listen()
	p.NotifyChannel = f.Tables.NotifyChannel
	if n := release(p); n != 1 {
		t.Fatalf("the owner's release freed %d rows", n)
	}
	f.notified(l, string(rune(pgsql.NotifyReleased))+topic)
	if r := f.row(group, topic, 0); r.Session != nil || r.Acked != pos2 || r.Epoch != 1 {
		t.Fatalf("row after the release: %+v, want free at %v, epoch 1", r, pos2)
	}
	if release(p) != 0 {
		t.Fatal("a second release freed the row again")
	}

	p = f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position, p.HeadOut = pos1, true
	if release(p) != 1 {
		t.Fatal("release refused")
	}
	if r := f.row(group, topic, 0); r.Acked != pos2 || r.HeadDeliveries != 0 {
		t.Fatalf("row after a release at %v: %+v, want it still at %v", pos1, r, pos2)
	}
	p = f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position, p.HeadOut = pos3, true
	if release(p) != 1 {
		t.Fatal("release refused")
	}
	if r := f.row(group, topic, 0); r.Acked != pos3 || r.HeadDeliveries != 1 {
		t.Fatalf("row after a release with HeadOut: %+v, want at %v, one delivery", r, pos3)
	}
}

// testReleaseCarriesAckedAbove: a release adds the positions it is given
// above the one it writes to acked_above, and the next claim returns
// those after the row's position (not those at or before it); a later
// release keeps what lies after its own position.
func testReleaseCarriesAckedAbove(t *testing.T, f *fixture) {
	const group, topic = "g", "above"
	f.ensure(group, topic)
	session := f.session(group)
	r := f.claimOne(session, group, topic)
	if len(r.AckedAbove) != 0 {
		t.Fatalf("a new row carries %v", r.AckedAbove)
	}
	pos := pgsql.Position{TransactionID: 3, Offset: 1}
	above := []pgsql.Position{{TransactionID: 3, Offset: 0}, {TransactionID: 3, Offset: 4}, {TransactionID: 4, Offset: 0}}
	p := f.owned(session, group, r)
	p.Position, p.AckedAbove = pos, above
	if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, p); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	sortPositions := func(ps []pgsql.Position) []pgsql.Position {
		slices.SortFunc(ps, func(a, b pgsql.Position) int {
			return cmp.Or(cmp.Compare(a.TransactionID, b.TransactionID), cmp.Compare(a.Offset, b.Offset))
		})
		return ps
	}
	r = f.claimOne(session, group, topic)
	if want := above[1:]; !slices.Equal(sortPositions(r.AckedAbove), want) {
		t.Fatalf("claim after the release returned %v, want %v (the one at or before the position dropped)", r.AckedAbove, want)
	}
	p = f.owned(session, group, r)
	p.Position = pgsql.Position{TransactionID: 3, Offset: 5}
	if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, p); err != nil || n != 1 {
		t.Fatalf("second release: %d, %v", n, err)
	}
	if r = f.claimOne(session, group, topic); !slices.Equal(r.AckedAbove, above[2:]) {
		t.Fatalf("claim after the second release returned %v, want %v", r.AckedAbove, above[2:])
	}
}

// testReleaseMany: ReleaseOffsets, the releases of a Subscriber's rows
// together (Close), gives each release the outcome ReleaseOffset gives
// it alone. The owner's rows are freed at their positions, never moved
// back, with their delivery counts and the positions acknowledged above,
// and each topic is notified; a stale epoch, another session's release
// in the same call, the second release of a row in the call and a topic
// without a row free nothing (0); a position ahead of the counter, or an
// identity that is not the server's (the topic's worker's on Citus), is
// refused with ErrWentBack and leaves the row as it was. On Citus the
// topics lie on both workers.
func testReleaseMany(t *testing.T, f *fixture) {
	const group = "g"
	owner, other := f.session(group), f.session(group)
	topics := make([]string, 12)
	owned := map[string]pgsql.OffsetParams{}
	for i := range topics {
		topics[i] = "many" + strconv.Itoa(i)
		f.ensure(group, topics[i])
		owned[topics[i]] = f.owned(owner, group, f.claimOne(owner, group, topics[i]))
	}
	if f.Citus {
		var workers int
		if err := f.Pool.QueryRow(f.ctx, `SELECT pg_catalog.count(DISTINCT p.groupid) FROM pg_catalog.unnest($2::text[]) t(topic)
		JOIN pg_catalog.pg_dist_placement p ON p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, t.topic)`,
			f.Tables.Offsets, topics).Scan(&workers); err != nil {
			t.Fatal(err)
		}
		if workers < 2 {
			t.Fatalf("the topics lie on %d workers; want them on several", workers)
		}
	}
	committed := owned["many0"]
	committed.Position = pos2
	if _, written := f.commit(committed); !written {
		t.Fatal("commit refused")
	}

	release := func(topic string, change func(p *pgsql.OffsetParams)) pgsql.OffsetParams {
		p := owned[topic]
		p.Position = pos2
		p.NotifyChannel = f.Tables.NotifyChannel
		if change != nil {
			change(&p)
		}
		return p
	}
	want := []struct {
		p        pgsql.OffsetParams
		released int64
		wentBack bool
	}{
		{p: release("many0", func(p *pgsql.OffsetParams) { p.Position = pos1 }), released: 1},
		{p: release("many1", func(p *pgsql.OffsetParams) { p.Position, p.HeadOut = pos3, true }), released: 1},
		{p: release("many2", func(p *pgsql.OffsetParams) { p.AckedAbove = []pgsql.Position{pos1, pos3} }), released: 1},
		{p: release("many3", func(p *pgsql.OffsetParams) { p.Epoch-- })},
		{p: release("many4", func(p *pgsql.OffsetParams) { p.SessionID = other })},
		{p: release("many5", func(p *pgsql.OffsetParams) { p.Position = pgsql.Position{TransactionID: ahead} }), wentBack: true},
		{p: release("many6", func(p *pgsql.OffsetParams) {
			if f.Citus {
				p.WorkerHere = "00000009:1:1"
			} else {
				p.Here = "00000009:1:1"
			}
		}), wentBack: true},
		{p: release("many7", nil), released: 1},
		{p: release("many7", nil)},
		{p: release("many3", func(p *pgsql.OffsetParams) { p.Topic = "nothing" })},
		{p: release("many8", nil), released: 1},
		{p: release("many9", nil), released: 1},
		{p: release("many10", nil), released: 1},
		{p: release("many11", nil), released: 1},
	}
	ps := make([]pgsql.OffsetParams, len(want))
	for i, w := range want {
		ps[i] = w.p
	}
	l := f.listen()
	results, err := f.Driver.ReleaseOffsets(f.ctx, f.Pool, ps, waitTimeout)
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if len(results) != len(ps) {
		t.Fatalf("%d results for %d releases", len(results), len(ps))
	}
	var notified []string
	for i, w := range want {
		r := results[i]
		if r.Released != w.released || isWentBack(r.Err) != w.wentBack || (r.Err != nil && !w.wentBack) {
			t.Errorf("release %d of %s (epoch %d, at %v): %d, %v; want %d, went back %t",
				i, w.p.Topic, w.p.Epoch, w.p.Position, r.Released, r.Err, w.released, w.wentBack)
		}
		if w.released == 1 {
			notified = append(notified, string(rune(pgsql.NotifyReleased))+w.p.Topic)
		}
	}
	f.notified(l, notified...)

	for _, topic := range []string{"many0", "many1", "many2", "many7", "many8", "many9", "many10", "many11"} {
		r := f.row(group, topic, 0)
		wantAcked, wantHead := pos2, int32(0)
		if topic == "many1" {
			wantAcked, wantHead = pos3, 1
		}
		if r.Session != nil || r.Acked != wantAcked || r.HeadDeliveries != wantHead {
			t.Errorf("row of %s after the releases: %+v, want free at %v with %d deliveries", topic, r, wantAcked, wantHead)
		}
		if topic == "many2" && !slices.Equal(r.AckedAbove, []string{pgsql.AboveEntry(pos3)}) {
			t.Errorf("row of %s carries %v above its position, want [%s]", topic, r.AckedAbove, pgsql.AboveEntry(pos3))
		}
	}
	for _, topic := range []string{"many3", "many4", "many5", "many6"} {
		if r := f.row(group, topic, 0); r.Session == nil || *r.Session != owner || r.Acked != (pgsql.Position{}) {
			t.Errorf("row of %s after releases that may not free it: %+v, want the owner's, unmoved", topic, r)
		}
	}
}

// ack runs AckOffset in a transaction of its own, committed.
func (f *fixture) ack(p pgsql.OffsetParams) (pgsql.AckRow, error) {
	f.t.Helper()
	var r pgsql.AckRow
	err := pgx.BeginFunc(f.ctx, f.Pool, func(tx pgx.Tx) error {
		var err error
		r, err = f.Driver.AckOffset(f.ctx, tx, p)
		return err
	})
	return r, err
}

// testAckOffsetFenced: AckInTx's statement moves the position only for
// the session and epoch that own the row, only forward, only below the
// transaction counter; it returns the row as it was before. A row that
// does not exist is pgx.ErrNoRows.
func testAckOffsetFenced(t *testing.T, f *fixture) {
	const group, topic = "g", "ack"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = pos2
	ack := func(p pgsql.OffsetParams) pgsql.AckRow {
		t.Helper()
		r, err := f.ack(p)
		if err != nil {
			t.Fatalf("AckOffset: %v", err)
		}
		return r
	}
	stale, foreign := p, p
	stale.Epoch--
	foreign.SessionID = other
	for _, q := range []pgsql.OffsetParams{stale, foreign} {
		if r := ack(q); r.Advanced || !r.OnHistory || r.SessionID == nil || *r.SessionID != owner || r.Epoch != p.Epoch {
			t.Fatalf("AckOffset by %s at epoch %d = %+v, want not advanced, the owner's row returned", q.SessionID, q.Epoch, r)
		}
	}
	future := p
	future.Position = pgsql.Position{TransactionID: ahead}
	if r := ack(future); r.Advanced || r.OnHistory {
		t.Fatalf("AckOffset ahead of the counter = %+v, want not on history, not advanced", r)
	}
	if r := f.row(group, topic, 0); r.Acked != (pgsql.Position{}) {
		t.Fatalf("refused acks moved the row to %v", r.Acked)
	}
	if r := ack(p); !r.Advanced || !r.OnHistory || r.Acked != (pgsql.Position{}) {
		t.Fatalf("the owner's AckOffset = %+v, want advanced from the beginning", r)
	}
	if r := f.row(group, topic, 0); r.Acked != pos2 {
		t.Fatalf("row after the ack: %+v, want at %v", r, pos2)
	}
	for _, back := range []pgsql.Position{pos1, pos2} {
		q := p
		q.Position = back
		if r := ack(q); r.Advanced || r.Acked != pos2 {
			t.Fatalf("AckOffset at %v = %+v, want not advanced (the row at %v)", back, r, pos2)
		}
	}
	missing := p
	missing.Topic = "no such topic"
	if _, err := f.ack(missing); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("AckOffset of a missing row: %v, want pgx.ErrNoRows", err)
	}
}

// testAckOffsetWaitsForAClaim: AckInTx's statement locks the row; when a
// claim by another session holds it, the statement waits, then decides on
// the row the claim committed: the epoch moved, nothing is written, and
// the row it returns names the new owner.
func testAckOffsetWaitsForAClaim(t *testing.T, f *fixture) {
	const group, topic = "g", "ackwait"
	f.ensure(group, topic)
	owner, claimer := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position = pos1
	holder := f.lockRows(group, topic)
	if _, err := holder.Exec(f.ctx, `UPDATE `+f.Tables.Offsets+` SET session_id = $3, epoch = epoch + 1
WHERE consumer_group = $1 AND topic = $2`, group, topic, claimer); err != nil {
		t.Fatal(err)
	}
	type result struct {
		row pgsql.AckRow
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := f.ack(p)
		done <- result{r, err}
	}()
	// Single server: one statement (WITH here AS ...); on Citus the row
	// is locked on the worker by a SELECT of its own.
	f.waitBlocked(1, "WITH here AS%", "SELECT session_id, epoch%")
	select {
	case r := <-done:
		t.Fatalf("AckOffset did not wait for the claim: %+v, %v", r.row, r.err)
	default:
	}
	if err := holder.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.row.Advanced || r.row.SessionID == nil || *r.row.SessionID != claimer || r.row.Epoch != p.Epoch+1 {
		t.Fatalf("AckOffset after the claim = %+v, %v; want not advanced, the claimer's row at epoch %d", r.row, r.err, p.Epoch+1)
	}
	if row := f.row(group, topic, 0); row.Acked != (pgsql.Position{}) || *row.Session != claimer {
		t.Fatalf("row %+v, want the claimer's, unmoved", row)
	}
}

// testAckOffsetAbove: with Above, AckOffset records the position in
// acked_above instead of moving the row's position, and a second
// acknowledgement of it finds it recorded.
func testAckOffsetAbove(t *testing.T, f *fixture) {
	const group, topic = "g", "ackabove"
	f.ensure(group, topic)
	owner := f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	p.Position, p.Above = pos3, true
	r, err := f.ack(p)
	if err != nil || !r.Advanced || r.Recorded {
		t.Fatalf("AckOffset above = %+v, %v; want advanced", r, err)
	}
	if row := f.row(group, topic, 0); row.Acked != (pgsql.Position{}) || !slices.Equal(row.AckedAbove, []string{pgsql.AboveEntry(pos3)}) {
		t.Fatalf("row after the ack above: %+v, want its position unmoved, %v recorded", row, pos3)
	}
	if r, err = f.ack(p); err != nil || r.Advanced || !r.Recorded {
		t.Fatalf("AckOffset above again = %+v, %v; want recorded, not advanced", r, err)
	}
}

// testCountHeadDelivery: the delivery count of the message after the
// row's position grows by one per call of its owner at its epoch (not of
// another session, not at a stale epoch), while
// the position is still the one given; otherwise pgx.ErrNoRows (the
// ownership or the head moved); a position ahead of the counter is
// ErrWentBack.
func testCountHeadDelivery(t *testing.T, f *fixture) {
	const group, topic = "g", "count"
	f.ensure(group, topic)
	owner, other := f.session(group), f.session(group)
	p := f.owned(owner, group, f.claimOne(owner, group, topic))
	for want := int32(1); want <= 2; want++ {
		if n, err := f.Driver.CountHeadDelivery(f.ctx, f.Pool, p); err != nil || n != want {
			t.Fatalf("count = %d, %v; want %d", n, err, want)
		}
	}
	stale, foreign, moved, future := p, p, p, p
	stale.Epoch--
	foreign.SessionID = other
	moved.Position = pos1
	future.Position = pgsql.Position{TransactionID: ahead}
	if _, err := f.Driver.CountHeadDelivery(f.ctx, f.Pool, stale); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("count with a stale epoch: %v, want pgx.ErrNoRows", err)
	}
	if _, err := f.Driver.CountHeadDelivery(f.ctx, f.Pool, foreign); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("count by another session: %v, want pgx.ErrNoRows", err)
	}
	if _, err := f.Driver.CountHeadDelivery(f.ctx, f.Pool, moved); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("count at another position: %v, want pgx.ErrNoRows", err)
	}
	if _, err := f.Driver.CountHeadDelivery(f.ctx, f.Pool, future); !isWentBack(err) {
		t.Errorf("count ahead of the counter: %v, want ErrWentBack", err)
	}
	if r := f.row(group, topic, 0); r.HeadDeliveries != 2 {
		t.Fatalf("head deliveries = %d, want 2", r.HeadDeliveries)
	}
}

// testIdentityFences: every statement that reads or writes by a position
// the session holds refuses to run on another server than the one the
// position was read on, writing nothing; with the right identity they
// run. On a single server that identity is the session's (Here); on Citus
// these statements run on the topic's worker and it is the worker's,
// read by the claim (WorkerHere), which differs from the coordinator's.
func testIdentityFences(t *testing.T, f *fixture) {
	const group, topic = "g", "identity"
	f.publish(f.Pool, topic, "m1")
	f.ensure(group, topic)
	session := f.session(group)
	r := f.claimOne(session, group, topic)
	if f.Citus && (r.WorkerHere == "" || r.WorkerHere == f.here) {
		t.Fatalf("the claim read the worker's identity %q (the coordinator's is %q)", r.WorkerHere, f.here)
	}
	read := f.selectParams(topic, 0, pgsql.Position{})
	read.WorkerHere = r.WorkerHere
	msgs := f.readSettled(read).Messages
	if len(msgs) != 1 {
		t.Fatalf("read %v, want [m1]", uuidsOf(msgs))
	}
	p := f.owned(session, group, r)
	p.Position = msgs[0].Position
	const other = "00000009:1:1"
	if f.Citus {
		p.WorkerHere, read.WorkerHere = other, other
	} else {
		p.Here, read.Here = other, other
	}
	if res := f.read(read); !res.WentBack {
		t.Errorf("read elsewhere: %+v, want WentBack", res)
	}
	if _, _, err := f.Driver.CommitOffset(f.ctx, f.Pool, p); !isWentBack(err) {
		t.Errorf("commit elsewhere: %v, want ErrWentBack", err)
	}
	if _, err := f.Driver.CountHeadDelivery(f.ctx, f.Pool, p); !isWentBack(err) {
		t.Errorf("delivery count elsewhere: %v, want ErrWentBack", err)
	}
	if a, err := f.ack(p); err != nil || a.OnHistory || a.Advanced {
		t.Errorf("AckOffset elsewhere: %+v, %v; want not on history", a, err)
	}
	if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, p); !isWentBack(err) || n != 0 {
		t.Errorf("release elsewhere: %d, %v; want ErrWentBack", n, err)
	}
	if o := f.row(group, topic, 0); o.Session == nil || *o.Session != session || o.Acked != (pgsql.Position{}) || o.HeadDeliveries != 0 {
		t.Fatalf("row after the statements elsewhere: %+v, want it untouched", o)
	}

	p = f.owned(session, group, r)
	p.Position = msgs[0].Position
	if _, written, err := f.Driver.CommitOffset(f.ctx, f.Pool, p); err != nil || !written {
		t.Fatalf("commit with the right identity: %t, %v", written, err)
	}
	if n, err := f.Driver.ReleaseOffset(f.ctx, f.Pool, p); err != nil || n != 1 {
		t.Fatalf("release with the right identity: %d, %v", n, err)
	}
}
