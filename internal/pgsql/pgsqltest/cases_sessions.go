package pgsqltest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// testSessionCreateAndHeartbeat: a new session's row says where the
// database is (its identity is the server's, on Citus the
// coordinator's); a heartbeat extends a live session and says where the
// database is; a heartbeat of an expired or unknown session updates
// nothing (the session is lost: a heartbeat never revives it); a
// heartbeat of uuid.Nil only reads where the database is.
func testSessionCreateAndHeartbeat(t *testing.T, f *fixture) {
	const group = "beats"
	l := f.listen()
	id := uuid.New()
	m, err := f.Driver.CreateSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: id, ConsumerGroup: group,
		Owner: "me", TTL: time.Hour, NotifyChannel: f.Tables.NotifyChannel, Protocol: 2})
	if err != nil {
		t.Fatal(err)
	}
	if m.Here != f.here || m.Xmax == 0 || len(m.Timeline) != 8 || m.LSN == "" {
		t.Fatalf("CreateSession's mark = %+v; want the identity %q, a counter, a timeline and a WAL position", m, f.here)
	}
	f.notified(l, string(rune(pgsql.NotifyGroup))+group)

	// Shorten the session, then beat: the expiry moves back to an hour.
	f.exec(`UPDATE `+f.Tables.Sessions+` SET expires_at = pg_catalog.now() + interval '10 seconds' WHERE id = $1`, id)
	beat := func(id uuid.UUID) pgsql.HeartbeatRow {
		t.Helper()
		r, err := f.Driver.HeartbeatSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: id, TTL: time.Hour})
		if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if r.Here != f.here || r.Xmax < m.Xmax || len(r.Timeline) != 8 {
			t.Fatalf("heartbeat's mark = %+v, want the identity %q and a counter not below %d", r.ClusterMark, f.here, m.Xmax)
		}
		return r
	}
	if r := beat(id); r.Updated != 1 {
		t.Fatalf("heartbeat of a live session updated %d rows", r.Updated)
	}
	members, err := f.Driver.GroupMembers(f.ctx, f.Pool, group)
	if err != nil || len(members) != 1 || members[0].ExpiresInMs < 50*60*1000 {
		t.Fatalf("members after the heartbeat = %+v, %v; want the session, expiring in about an hour", members, err)
	}

	f.expire(id)
	if r := beat(id); r.Updated != 0 {
		t.Fatalf("heartbeat of an expired session updated %d rows, want 0", r.Updated)
	}
	if members, err := f.Driver.GroupMembers(f.ctx, f.Pool, group); err != nil || len(members) != 0 {
		t.Fatalf("members after a heartbeat of an expired session = %+v, %v; want none", members, err)
	}
	if r := beat(uuid.New()); r.Updated != 0 {
		t.Fatalf("heartbeat of an unknown session updated %d rows", r.Updated)
	}
	if r := beat(uuid.Nil); r.Updated != 0 {
		t.Fatalf("heartbeat of uuid.Nil updated %d rows", r.Updated)
	}
}

// testSessionReplacesAnother: a session made to replace an older one of
// the same Subscriber deletes it in the same statement; DeleteSession
// deletes a session and notifies its group.
func testSessionReplacesAnother(t *testing.T, f *fixture) {
	const group = "replace"
	old := f.session(group)
	id := uuid.New()
	if _, err := f.Driver.CreateSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: id, ConsumerGroup: group,
		Owner: "me", TTL: time.Hour, ReplacesSessionID: old}); err != nil {
		t.Fatal(err)
	}
	if f.sessionExists(old) || !f.sessionExists(id) {
		t.Fatalf("after the replacement: old exists %t, new exists %t; want only the new", f.sessionExists(old), f.sessionExists(id))
	}
	l := f.listen()
	if err := f.Driver.DeleteSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: id, NotifyChannel: f.Tables.NotifyChannel}); err != nil {
		t.Fatal(err)
	}
	f.notified(l, string(rune(pgsql.NotifyGroup))+group)
	if f.sessionExists(id) {
		t.Fatal("the deleted session exists")
	}
}

// testSetSubscriptionsAndGroupMembers: a session records what it
// subscribes to; the group's members are its live sessions, with what
// they recorded and the protocol they follow; the subscriptions of a
// session that is gone are refused.
func testSetSubscriptionsAndGroupMembers(t *testing.T, f *fixture) {
	const group = "members"
	a, b, expired := uuid.New(), uuid.New(), uuid.New()
	for i, id := range []uuid.UUID{a, b, expired} {
		if _, err := f.Driver.CreateSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: id, ConsumerGroup: group,
			Owner: "owner" + string(rune('a'+i)), TTL: time.Hour, Protocol: 1 + i}); err != nil {
			t.Fatal(err)
		}
	}
	f.session("another group")
	f.expire(expired)
	l := f.listen()
	if ok, err := f.Driver.SetSubscriptions(f.ctx, f.Pool, pgsql.SessionParams{SessionID: a, SubscriptionHash: 42,
		SubscriptionSize: 3, NotifyChannel: f.Tables.NotifyChannel}); err != nil || !ok {
		t.Fatalf("set subscriptions = %t, %v", ok, err)
	}
	f.notified(l, string(rune(pgsql.NotifyGroup))+group)
	members, err := f.Driver.GroupMembers(f.ctx, f.Pool, group)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(members, func(x, y pgsql.MemberRow) int { return int(x.Protocol) - int(y.Protocol) })
	if len(members) != 2 || members[0].ID != a || members[1].ID != b {
		t.Fatalf("members = %+v, want a and b (not the expired session, not another group's)", members)
	}
	if m := members[0]; m.SubscriptionHash != 42 || m.SubscriptionSize != 3 || m.Owner != "ownera" || m.Protocol != 1 ||
		m.ExpiresInMs <= 0 || m.CreatedAt.IsZero() {
		t.Errorf("member a = %+v", m)
	}
	if m := members[1]; m.SubscriptionHash != 0 || m.SubscriptionSize != 0 || m.Protocol != 2 {
		t.Errorf("member b = %+v", m)
	}
	if err := f.Driver.DeleteSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: b}); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.Driver.SetSubscriptions(f.ctx, f.Pool, pgsql.SessionParams{SessionID: b, SubscriptionHash: 1}); err != nil || ok {
		t.Fatalf("set subscriptions of a deleted session = %t, %v; want false", ok, err)
	}
}

// testDeleteExpiredSessions deletes the sessions expired for longer than
// the TTL given, and only those.
func testDeleteExpiredSessions(t *testing.T, f *fixture) {
	live, recent, old := f.session("g"), f.session("g"), f.session("g")
	f.expire(recent)
	f.exec(`UPDATE `+f.Tables.Sessions+` SET expires_at = pg_catalog.now() - interval '2 hours' WHERE id = $1`, old)
	if n, err := f.Driver.DeleteExpiredSessions(f.ctx, f.Pool, time.Hour); err != nil || n != 1 {
		t.Fatalf("delete sessions expired for an hour = %d, %v; want 1", n, err)
	}
	if f.sessionExists(old) || !f.sessionExists(recent) {
		t.Fatal("the session expired for two hours exists, or the one expired a second ago does not")
	}
	if n, err := f.Driver.DeleteExpiredSessions(f.ctx, f.Pool, 0); err != nil || n != 1 {
		t.Fatalf("delete expired sessions = %d, %v; want 1", n, err)
	}
	if !f.sessionExists(live) || f.sessionExists(recent) {
		t.Fatal("the live session is gone, or the expired one exists")
	}
}

// testInspectSettingsLastTheTransaction: the inspector's settings hold in
// the transaction they are made in, and only there: JIT off, and on Citus
// one connection per worker for a multi-shard statement, whose listing
// still reads every worker's rows.
func testInspectSettingsLastTheTransaction(t *testing.T, f *fixture) {
	conn, err := f.Pool.Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	show := func(q pgsql.Querier, name string) string {
		t.Helper()
		var v string
		if err := q.QueryRow(f.ctx, "SELECT COALESCE(pg_catalog.current_setting($1, true), '')", name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// One offsets row per topic: on Citus, topics spread over the workers.
	const topics = 16
	for i := range topics {
		f.ensure("g", fmt.Sprintf("inspect-%02d", i))
	}
	jitBefore, poolBefore := show(conn, "jit"), show(conn, "citus.max_adaptive_executor_pool_size")
	tx, err := conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(f.ctx) }()
	if err := f.Driver.InspectSettings(f.ctx, tx); err != nil {
		t.Fatal(err)
	}
	if got := show(tx, "jit"); got != "off" {
		t.Errorf("jit in the inspector's transaction = %q, want off", got)
	}
	if got := show(tx, "citus.max_adaptive_executor_pool_size"); f.Citus && got != "1" {
		t.Errorf("citus.max_adaptive_executor_pool_size in the inspector's transaction = %q, want 1", got)
	}
	// A listing over every shard still reads them all.
	rows, err := f.Driver.InspectLag(f.ctx, tx, []string{"g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != topics {
		t.Errorf("InspectLag with the inspector's settings: %d rows, want %d", len(rows), topics)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := show(conn, "jit"); got != jitBefore {
		t.Errorf("jit after the transaction = %q, want %q as before", got, jitBefore)
	}
	if got := show(conn, "citus.max_adaptive_executor_pool_size"); got != poolBefore {
		t.Errorf("citus.max_adaptive_executor_pool_size after the transaction = %q, want %q as before", got, poolBefore)
	}
}
