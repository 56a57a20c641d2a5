package pgsql

import (
	"cmp"
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

func TestNotifyAsText(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT 1`: `SELECT 1`,
		`SELECT pg_catalog.pg_notify($1, 'g' || x) FROM d`:                                               `SELECT pg_catalog.pg_notify($1, 'g' || x)::text FROM d`,
		`SELECT pg_catalog.pg_notify($2, (a || (b)::text)) UNION ALL SELECT pg_catalog.pg_notify($2, c)`: `SELECT pg_catalog.pg_notify($2, (a || (b)::text))::text UNION ALL SELECT pg_catalog.pg_notify($2, c)::text`,
	} {
		if got := notifyAsText(in); got != want {
			t.Errorf("notifyAsText(%q) = %q, want %q", in, got, want)
		}
	}
}

// citusTables returns a pool on the coordinator of the Citus cluster of
// `make test-citus` and tables in a schema of the test's own, migrated and
// distributed; without PGLEASE_TEST_CITUS the test is skipped.
func citusTables(t *testing.T) (*pgxpool.Pool, *Tables) {
	t.Helper()
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, os.Getenv("PGLEASE_TEST_DSN"), 0)
	schema := pgtest.NewSchema(t, pool, "pglease_citus_")
	tables := NewTables(Names{Schema: schema})
	if err := Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenDriver(ctx, pool, tables); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(singleNode); !ok {
		t.Fatalf("OpenDriver before the script = %T; want singleNode", d)
	}
	for range 2 { // the script may run twice
		if _, err := pool.Exec(ctx, tables.DistributeScript()); err != nil {
			t.Fatalf("distribute: %v", err)
		}
	}
	if d, err := OpenDriver(ctx, pool, tables); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(citus); !ok {
		t.Fatalf("OpenDriver = %T; want citus", d)
	}
	return pool, tables
}

// TestCitusLateCommit: a message whose transaction commits after a later
// one's is not skipped. Its transaction id is taken on the worker (the
// trigger of DistributeScript) and SelectMessages, routed to the worker
// whole, compares it with the worker's snapshot: while m1's transaction
// runs, m2 is pending; once it commits, both come, m1 first.
func TestCitusLateCommit(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "late"
	msg := func(uuid string) InsertMessagesParams {
		return InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{uuid}, Payloads: [][]byte{[]byte(uuid)},
			Metadata: []string{""}, NotifyChannel: tables.NotifyChannel}
	}
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(context.WithoutCancel(ctx)) }()
	if err := NewCitus(tables).InsertMessages(ctx, tx1, msg("m1")); err != nil {
		t.Fatal(err)
	}
	if err := NewCitus(tables).InsertMessages(ctx, pool, msg("m2")); err != nil {
		t.Fatal(err)
	}
	read := func() SelectResult {
		t.Helper()
		res, err := NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: "coordinator"})
		if err != nil {
			t.Fatal(err)
		}
		if res.WentBack || res.Future != nil {
			t.Fatalf("SelectMessages = %+v", res)
		}
		return res
	}
	if res := read(); len(res.Messages) != 0 || !res.Pending {
		t.Fatalf("while m1's transaction runs: %+v, want nothing and pending", res)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Until every transaction older than m1's ends on the worker (other
	// tests, Citus's own), the messages stay pending: read until they
	// are not.
	var res SelectResult
	pgtest.WaitFor(t, 30*time.Second, "m1 and m2 no longer pending", func() bool {
		res = read()
		return !res.Pending
	})
	var got []string
	for _, m := range res.Messages {
		got = append(got, m.UUID)
	}
	if len(got) != 2 || got[0] != "m1" || got[1] != "m2" || res.Pending {
		t.Fatalf("after m1's commit: %v (pending %t), want [m1 m2]", got, res.Pending)
	}
	// The next position is m2's: nothing more, nothing pending.
	after, err := NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: "coordinator",
		After: res.Messages[1].Position})
	if err != nil || len(after.Messages) != 0 || after.Pending || after.WentBack {
		t.Fatalf("after m2: %+v, %v", after, err)
	}
}

// TestCitusClaimWaitsForTheOwnersHeartbeat forces the interleaving that
// the claim's delete of an expired owner's session must get right on
// Citus, where the claim is several statements: the owner's session has
// expired when the claim reads the row, but its heartbeat (held open
// from a second connection) extends it before the claim's delete gets
// the session row. The delete then waits for the heartbeat, finds the
// session live, deletes nothing, and the row stays the owner's (reported
// lost). Once the session has expired for good, the same claim takes the
// row and bumps its epoch.
func TestCitusClaimWaitsForTheOwnersHeartbeat(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group, topic = "g", "t"
	owner, claimer := uuid.New(), uuid.New()
	here, err := Here(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{owner, claimer} {
		if _, err := NewCitus(tables).CreateSession(ctx, pool, SessionParams{SessionID: id, ConsumerGroup: group, Owner: id.String(), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewCitus(tables).EnsureOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	claim := func(id uuid.UUID) ClaimRow {
		t.Helper()
		rows, err := NewCitus(tables).ClaimOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic},
			SessionID: id, Here: here, Limit: 10})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v, %v", rows, err)
		}
		return rows[0]
	}
	if r := claim(owner); r.Kind != ClaimTaken || r.Epoch != 1 {
		t.Fatalf("first claim: %+v", r)
	}
	if rows, err := NewCitus(tables).ClaimOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic},
		SessionID: claimer, Here: here, Limit: 10}); err != nil || len(rows) != 0 {
		t.Fatalf("claim of a live owner's row: %v, %v; want no row", rows, err)
	}
	expire := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE `+tables.Sessions+` SET expires_at = pg_catalog.now() - interval '1 second' WHERE id = $1`, owner); err != nil {
			t.Fatal(err)
		}
	}
	expire()

	// The heartbeat, held open: it has the session row's lock.
	beat, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = beat.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := beat.Exec(ctx, `UPDATE `+tables.Sessions+` SET expires_at = pg_catalog.now() + interval '1 hour' WHERE id = $1`, owner); err != nil {
		t.Fatal(err)
	}
	done := make(chan ClaimRow, 1)
	go func() {
		rows, err := NewCitus(tables).ClaimOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic},
			SessionID: claimer, Here: here, Limit: 10})
		if err != nil || len(rows) != 1 {
			t.Errorf("claim: %v, %v", rows, err)
			rows = []ClaimRow{{}}
		}
		done <- rows[0]
	}()
	// The claim waits for the heartbeat's lock (its delete of the
	// expired session).
	pgtest.WaitFor(t, 30*time.Second, "the claim to wait for the heartbeat's lock", func() bool {
		select {
		case r := <-done:
			t.Fatalf("the claim did not wait for the heartbeat: %+v", r)
		default:
		}
		var waiting bool
		// citus_lock_waits: the waits of the cluster, on the workers too.
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.citus_lock_waits
			WHERE blocked_statement LIKE 'DELETE FROM %')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	if err := beat.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.Kind != ClaimLost {
		t.Fatalf("claim after the heartbeat won: %+v, want lost", r)
	}
	var session uuid.UUID
	var epoch int64
	if err := pool.QueryRow(ctx, `SELECT session_id, epoch FROM `+tables.Offsets+` WHERE consumer_group = $1 AND topic = $2`,
		group, topic).Scan(&session, &epoch); err != nil {
		t.Fatal(err)
	}
	if session != owner || epoch != 1 {
		t.Fatalf("row is %s at epoch %d, want the owner's at 1", session, epoch)
	}

	expire()
	if r := claim(claimer); r.Kind != ClaimTaken || r.Epoch != 2 || r.Previous != owner {
		t.Fatalf("claim of an expired owner's row: %+v", r)
	}
}

// TestCitusWorkerIdentityFences: a claim reads the identity of the
// topic's worker, and the statements of the claim routed there refuse to
// run with another one (as after a restart, a failover or a shard move),
// writing nothing; with the right one they run.
func TestCitusWorkerIdentityFences(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group, topic = "g", "t"
	session := uuid.New()
	here, err := Here(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewCitus(tables).CreateSession(ctx, pool, SessionParams{SessionID: session, ConsumerGroup: group, Owner: "o", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := NewCitus(tables).InsertMessages(ctx, pool, InsertMessagesParams{Topics: []string{topic}, UUIDs: []string{"m1"},
		Payloads: [][]byte{nil}, Metadata: []string{""}}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewCitus(tables).EnsureOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	rows, err := NewCitus(tables).ClaimOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic},
		SessionID: session, Here: here, Limit: 1})
	if err != nil || len(rows) != 1 || rows[0].Kind != ClaimTaken {
		t.Fatalf("claim: %+v, %v", rows, err)
	}
	worker := rows[0].WorkerHere
	if worker == "" || worker == here {
		t.Fatalf("the claim read the worker's identity %q (the coordinator's is %q)", worker, here)
	}
	var read SelectResult
	pgtest.WaitFor(t, 30*time.Second, "the message readable", func() bool {
		read, err = NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: here, WorkerHere: worker})
		if err != nil {
			t.Fatal(err)
		}
		return len(read.Messages) == 1
	})
	p := OffsetParams{ConsumerGroup: group, Topic: topic, SessionID: session, Epoch: rows[0].Epoch,
		Position: read.Messages[0].Position, Here: here}
	for _, other := range []string{"00000009:1", here} {
		p.WorkerHere = other
		if res, err := NewCitus(tables).SelectMessages(ctx, pool, SelectMessagesParams{Topic: topic, Limit: 10, Here: here, WorkerHere: other}); err != nil || !res.WentBack {
			t.Errorf("read with worker identity %q: %+v, %v; want WentBack", other, res, err)
		}
		if _, _, err := NewCitus(tables).CommitOffset(ctx, pool, p); !errors.Is(err, ErrWentBack) {
			t.Errorf("commit with worker identity %q: %v, want ErrWentBack", other, err)
		}
		if _, err := NewCitus(tables).CountHeadDelivery(ctx, pool, p); !errors.Is(err, ErrWentBack) {
			t.Errorf("delivery count with worker identity %q: %v, want ErrWentBack", other, err)
		}
		if r, err := NewCitus(tables).AckOffset(ctx, pool, p); err != nil || r.OnHistory || r.Advanced {
			t.Errorf("AckOffset with worker identity %q: %+v, %v; want not on history", other, r, err)
		}
		if n, err := NewCitus(tables).ReleaseOffset(ctx, pool, p); !errors.Is(err, ErrWentBack) || n != 0 {
			t.Errorf("release with worker identity %q: %d, %v; want nothing released, ErrWentBack", other, n, err)
		}
	}
	p.WorkerHere = worker
	if _, written, err := NewCitus(tables).CommitOffset(ctx, pool, p); err != nil || !written {
		t.Fatalf("commit with the worker's identity: %v, %v", written, err)
	}
	if n, err := NewCitus(tables).ReleaseOffset(ctx, pool, p); err != nil || n != 1 {
		t.Fatalf("release with the worker's identity: %d, %v", n, err)
	}
}

// TestCitusReleaseCarriesAckedAbove: a release adds the positions it is
// given above the one it writes to acked_above, and the next claim
// returns those after the row's position (not those at or before it).
func TestCitusReleaseCarriesAckedAbove(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group, topic = "g", "t"
	session := uuid.New()
	here, err := Here(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewCitus(tables).CreateSession(ctx, pool, SessionParams{SessionID: session, ConsumerGroup: group, Owner: "o", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewCitus(tables).EnsureOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	claim := func() ClaimRow {
		t.Helper()
		rows, err := NewCitus(tables).ClaimOffsets(ctx, pool, OffsetsParams{ConsumerGroup: group, Topics: []string{topic},
			SessionID: session, Here: here, Limit: 1})
		if err != nil || len(rows) != 1 || rows[0].Kind != ClaimTaken {
			t.Fatalf("claim: %+v, %v", rows, err)
		}
		return rows[0]
	}
	r := claim()
	if len(r.AckedAbove) != 0 {
		t.Fatalf("a new row carries %v", r.AckedAbove)
	}
	// Positions below the worker's counter (a release refuses others).
	pos := Position{TransactionID: 3, Offset: 1}
	above := []Position{{TransactionID: 3, Offset: 0}, {TransactionID: 3, Offset: 4}, {TransactionID: 4, Offset: 0}}
	p := OffsetParams{ConsumerGroup: group, Topic: topic, SessionID: session, Epoch: r.Epoch, Position: pos, Here: here,
		WorkerHere: r.WorkerHere, AckedAbove: above}
	if n, err := NewCitus(tables).ReleaseOffset(ctx, pool, p); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	r = claim()
	slices.SortFunc(r.AckedAbove, func(a, b Position) int {
		return cmp.Or(cmp.Compare(a.TransactionID, b.TransactionID), cmp.Compare(a.Offset, b.Offset))
	})
	if want := above[1:]; !slices.Equal(r.AckedAbove, want) {
		t.Fatalf("claim after the release returned %v, want %v (the one at or before the position dropped)", r.AckedAbove, want)
	}
	// A release with nothing new keeps what lies after its position.
	p.Epoch, p.WorkerHere, p.AckedAbove, p.Position = r.Epoch, r.WorkerHere, nil, Position{TransactionID: 3, Offset: 5}
	if n, err := NewCitus(tables).ReleaseOffset(ctx, pool, p); err != nil || n != 1 {
		t.Fatalf("second release: %d, %v", n, err)
	}
	if r = claim(); !slices.Equal(r.AckedAbove, above[2:]) {
		t.Fatalf("claim after the second release returned %v, want %v", r.AckedAbove, above[2:])
	}
}
