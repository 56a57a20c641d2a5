package pgsql

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestCitusReleasesInTwoStatements: ReleaseOffsets of 200 rows spread
// over both workers costs the coordinator two statements (the check on
// the workers, the UPDATE), whatever the number of rows, and frees
// every row; one release among them that fails the check (a position
// ahead of its worker's counter) adds the statements of its own
// release, which refuses it, and leaves its row alone.
func TestCitusReleasesInTwoStatements(t *testing.T) {
	pool, tables := citusTables(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := NewCitus(tables)
	const group, topics = "g", 200
	session := uuid.New()
	if _, err := d.CreateSession(ctx, pool, SessionParams{SessionID: session, ConsumerGroup: group, Owner: "test", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	claim := OffsetsParams{ConsumerGroup: group, SessionID: session, Limit: topics, Partitions: make([]int32, topics)}
	for i := range topics {
		claim.Topics = append(claim.Topics, fmt.Sprintf("release-%03d", i))
	}
	if _, err := d.EnsureOffsets(ctx, pool, claim); err != nil {
		t.Fatal(err)
	}
	if here, err := Here(ctx, pool); err != nil {
		t.Fatal(err)
	} else {
		claim.Here = here
	}
	rows, err := d.ClaimOffsets(ctx, pool, claim)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != topics {
		t.Fatalf("claimed %d rows of %d", len(rows), topics)
	}
	release := func(rows []ClaimRow) []OffsetParams {
		var ps []OffsetParams
		for _, r := range rows {
			ps = append(ps, OffsetParams{ConsumerGroup: group, Topic: r.Topic, Partition: r.Partition, SessionID: session,
				Epoch: r.Epoch, Position: Position{TransactionID: 5, Offset: 1}, Here: claim.Here, WorkerHere: r.WorkerHere,
				NotifyChannel: tables.NotifyChannel})
		}
		return ps
	}
	owned := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+tables.Offsets+` WHERE session_id = $1`, session).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	ps := release(rows[:topics/2])
	ps[7].Position.TransactionID = 1 << 50
	q := &countingQuerier{Pool: pool}
	results, err := d.ReleaseOffsets(ctx, q, ps, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if i == 7 {
			if !errors.Is(r.Err, ErrWentBack) || r.Released != 0 {
				t.Errorf("release ahead of the counter: %d, %v; want ErrWentBack", r.Released, r.Err)
			}
			continue
		}
		if r.Err != nil || r.Released != 1 {
			t.Errorf("release of %s: %d, %v", ps[i].Topic, r.Released, r.Err)
		}
	}
	alone := q.n.Load() - 2
	if alone < 1 {
		t.Errorf("%d statements for %d releases, one refused; want 2 and those of the refused one", q.n.Load(), len(ps))
	}
	if n := owned(); n != topics-len(ps)+1 {
		t.Errorf("%d rows owned after releasing %d of %d, one refused", n, len(ps)-1, topics)
	}

	q = &countingQuerier{Pool: pool}
	ps = release(rows[topics/2:])
	results, err = d.ReleaseOffsets(ctx, q, ps, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r.Err != nil || r.Released != 1 {
			t.Errorf("release of %s: %d, %v", ps[i].Topic, r.Released, r.Err)
		}
	}
	if n := q.n.Load(); n != 2 {
		t.Errorf("%d statements for %d releases; want 2 (%d for the refused one above)", n, len(ps), alone)
	}
	if n := owned(); n != 1 {
		t.Errorf("%d rows owned after releasing all but the refused one", n)
	}
}
