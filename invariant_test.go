package pglease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// This file holds the invariant checker: triggers on the offsets and
// sessions tables that judge every change of owner and every heartbeat
// against the committed state of the database at the moment the change is
// made, while the load runs. They record two kinds of violation of "one
// deliverer per (group, topic, partition)":
//
//	(a) "taken from a live session": the owner of an offsets row changed
//	    from one session to another while the previous owner's session was
//	    still alive: its row exists with expires_at > clock_timestamp(), and
//	    the row carries no lease override that has run out. A claimer that
//	    deletes the owner's session row in its own statement is judged by
//	    the row it deleted: deleting a live owner session to take its row is
//	    the same violation.
//	(b) "heartbeat after a loss": a heartbeat (an UPDATE that moves
//	    expires_at later) applied to a session that had already expired
//	    (OLD.expires_at <= clock_timestamp()) and had lost a row in
//	    between: an owner change away from it, committed and logged at or
//	    after OLD.expires_at. The old owner then trusts its session again
//	    while another one owns the row.
//
// The trigger functions are VOLATILE plpgsql, so in READ COMMITTED (the
// isolation pglease runs in) each query in them takes a fresh snapshot:
// they see every transaction committed by then, plus their own
// transaction's changes, whatever snapshot the statement that fired them
// decided on. (Under REPEATABLE READ or SERIALIZABLE they would see the
// transaction's snapshot instead.) Times are clock_timestamp(), the moment
// of the check, not now(), the start of the transaction.
//
// A check at the moment of a change cannot see a conflicting change that
// commits after it: a heartbeat whose trigger ran before a concurrent
// takeover committed, while that takeover's trigger ran before the
// heartbeat committed, escapes both (a) and (b). The logs close that gap
// after the run: revivedInHindsight finds every heartbeat that moved a
// session's expiry from at or before a takeover of one of its rows to
// after it, whatever the order of commits.

const (
	invOwnershipTable  = "inv_ownership"  // every change of owner or epoch of an offsets row
	invSessionsTable   = "inv_sessions"   // every insert, heartbeat and delete of a session row
	invViolationsTable = "inv_violations" // (a) and (b), with what the check saw
)

// installInvariantChecker creates the checker's tables and triggers in
// adapter's schema. The pglease tables must exist already (see instrument);
// the checker's triggers are independent of instrument's and may be
// installed with or without them.
func installInvariantChecker(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) {
	t.Helper()
	tbl := func(name string) string { return table(adapter, name) }
	offsets := tbl(pglease.DefaultConsumerOffsetsTable)
	sessions := tbl(pglease.DefaultConsumerSessionsTable)
	ownership, sessLog, violations := tbl(invOwnershipTable), tbl(invSessionsTable), tbl(invViolationsTable)

	ddl := []string{
		`CREATE TABLE ` + ownership + ` (
	id             bigserial PRIMARY KEY,
	at             timestamptz NOT NULL,
	tx             xid8 NOT NULL DEFAULT pg_current_xact_id(),
	app            text NOT NULL DEFAULT current_setting('application_name'),
	consumer_group text NOT NULL,
	topic          text NOT NULL,
	partition      integer NOT NULL,
	old_session    uuid,
	new_session    uuid,
	old_epoch      bigint NOT NULL,
	new_epoch      bigint NOT NULL,
	-- The previous owner's expiry in the committed state at "at"; NULL when
	-- there was no previous owner or its session row was gone.
	old_expires_at timestamptz
)`,
		`CREATE INDEX ON ` + ownership + ` (old_session)`,
		`CREATE TABLE ` + sessLog + ` (
	id             bigserial PRIMARY KEY,
	at             timestamptz NOT NULL,
	tx             xid8 NOT NULL DEFAULT pg_current_xact_id(),
	app            text NOT NULL DEFAULT current_setting('application_name'),
	-- HEARTBEAT moves expires_at later, SHORTEN earlier.
	op             text NOT NULL CHECK (op IN ('INSERT', 'HEARTBEAT', 'SHORTEN', 'DELETE')),
	session_id     uuid NOT NULL,
	old_expires_at timestamptz, -- NULL for INSERT
	new_expires_at timestamptz  -- NULL for DELETE
)`,
		`CREATE INDEX ON ` + sessLog + ` (session_id)`,
		`CREATE TABLE ` + violations + ` (
	id             bigserial PRIMARY KEY,
	at             timestamptz NOT NULL,
	tx             xid8 NOT NULL DEFAULT pg_current_xact_id(),
	app            text NOT NULL DEFAULT current_setting('application_name'),
	kind           text NOT NULL CHECK (kind IN ('a', 'b')),
	reason         text NOT NULL,
	consumer_group text,
	topic          text,
	partition      integer,
	victim         uuid NOT NULL, -- the session that lost the row
	taker          uuid,          -- the session that took it
	epoch          bigint,        -- the epoch of the takeover
	victim_expires timestamptz,   -- (a): the victim's expiry seen; (b): OLD.expires_at
	extended_to    timestamptz,   -- (b): NEW.expires_at
	takeover_at    timestamptz    -- (b): when the row was taken
)`,

		// (a), and the log of every change of owner or epoch.
		`CREATE FUNCTION ` + tbl("inv_check_offsets") + `() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	t       timestamptz;
	exp     timestamptz;
	takeover boolean := OLD.session_id IS NOT NULL AND NEW.session_id IS NOT NULL AND OLD.session_id <> NEW.session_id;
	deleted ` + sessLog + `%ROWTYPE;
BEGIN
	IF takeover THEN
		-- A fresh snapshot: every committed session, and this transaction's
		-- own changes (a session row it deleted is gone).
		SELECT s.expires_at INTO exp FROM ` + sessions + ` s WHERE s.id = OLD.session_id;
	END IF;
	t := clock_timestamp(); -- after the snapshot: an expiry in between counts as expired
	INSERT INTO ` + ownership + ` (at, consumer_group, topic, partition, old_session, new_session, old_epoch, new_epoch, old_expires_at)
	VALUES (t, NEW.consumer_group, NEW.topic, NEW.partition, OLD.session_id, NEW.session_id, OLD.epoch, NEW.epoch, exp);
	IF NOT takeover OR (OLD.lease_expires_at IS NOT NULL AND OLD.lease_expires_at <= t) THEN
		RETURN NULL; -- a claim of a free row, a release, or a lease override that ran out
	END IF;
	IF exp > t THEN
		INSERT INTO ` + violations + ` (at, kind, reason, consumer_group, topic, partition, victim, taker, epoch, victim_expires)
		VALUES (t, 'a', 'taken from a live session', NEW.consumer_group, NEW.topic, NEW.partition,
			OLD.session_id, NEW.session_id, NEW.epoch, exp);
	ELSIF exp IS NULL THEN
		-- Gone: if this transaction deleted it, it must have been expired.
		-- (When the delete's trigger runs after this one, it does this check.)
		SELECT * INTO deleted FROM ` + sessLog + ` d
		WHERE d.op = 'DELETE' AND d.session_id = OLD.session_id AND d.tx = pg_current_xact_id()
			AND d.old_expires_at > d.at
		LIMIT 1;
		IF FOUND THEN
			INSERT INTO ` + violations + ` (at, kind, reason, consumer_group, topic, partition, victim, taker, epoch, victim_expires)
			VALUES (t, 'a', 'the taker deleted the live owner session', NEW.consumer_group, NEW.topic, NEW.partition,
				OLD.session_id, NEW.session_id, NEW.epoch, deleted.old_expires_at);
		END IF;
	END IF;
	RETURN NULL;
END $$`,
		`CREATE TRIGGER inv_check_offsets AFTER UPDATE ON ` + offsets + ` FOR EACH ROW
	WHEN (OLD.session_id IS DISTINCT FROM NEW.session_id OR OLD.epoch IS DISTINCT FROM NEW.epoch)
	EXECUTE FUNCTION ` + tbl("inv_check_offsets") + `()`,

		// (b), the other half of (a) for deleted owners, and the log of
		// sessions: inserts, heartbeats and deletes.
		`CREATE FUNCTION ` + tbl("inv_check_sessions") + `() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	t timestamptz := clock_timestamp();
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO ` + sessLog + ` (at, op, session_id, new_expires_at) VALUES (t, 'INSERT', NEW.id, NEW.expires_at);
		RETURN NULL;
	END IF;
	IF TG_OP = 'DELETE' THEN
		INSERT INTO ` + sessLog + ` (at, op, session_id, old_expires_at) VALUES (t, 'DELETE', OLD.id, OLD.expires_at);
		IF OLD.expires_at > t THEN
			-- A live session deleted by a transaction that took its rows.
			INSERT INTO ` + violations + ` (at, kind, reason, consumer_group, topic, partition, victim, taker, epoch, victim_expires)
			SELECT t, 'a', 'the taker deleted the live owner session', o.consumer_group, o.topic, o.partition,
				o.old_session, o.new_session, o.new_epoch, OLD.expires_at
			FROM ` + ownership + ` o
			WHERE o.old_session = OLD.id AND o.new_session <> OLD.id AND o.tx = pg_current_xact_id()
				AND o.old_expires_at IS NULL;
		END IF;
		RETURN NULL;
	END IF;
	IF NEW.expires_at IS NOT DISTINCT FROM OLD.expires_at THEN
		RETURN NULL;
	END IF;
	IF NEW.expires_at < OLD.expires_at THEN
		INSERT INTO ` + sessLog + ` (at, op, session_id, old_expires_at, new_expires_at)
		VALUES (t, 'SHORTEN', NEW.id, OLD.expires_at, NEW.expires_at);
		RETURN NULL;
	END IF;
	INSERT INTO ` + sessLog + ` (at, op, session_id, old_expires_at, new_expires_at)
	VALUES (t, 'HEARTBEAT', NEW.id, OLD.expires_at, NEW.expires_at);
	IF OLD.expires_at <= t THEN
		-- Expired before this heartbeat: did another session take one of its
		-- rows since then? (A fresh snapshot: every committed takeover.)
		INSERT INTO ` + violations + ` (at, kind, reason, consumer_group, topic, partition, victim, taker, epoch,
			victim_expires, extended_to, takeover_at)
		SELECT t, 'b', 'heartbeat after a loss', o.consumer_group, o.topic, o.partition,
			o.old_session, o.new_session, o.new_epoch, OLD.expires_at, NEW.expires_at, o.at
		FROM ` + ownership + ` o
		WHERE o.old_session = OLD.id AND o.new_session <> OLD.id AND o.at >= OLD.expires_at;
	END IF;
	RETURN NULL;
END $$`,
		`CREATE TRIGGER inv_check_sessions AFTER INSERT OR UPDATE OR DELETE ON ` + sessions + ` FOR EACH ROW
	EXECUTE FUNCTION ` + tbl("inv_check_sessions") + `()`,
	}
	for _, q := range ddl {
		_, err := pool.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
}

// invariantCounts is what the checker recorded.
type invariantCounts struct {
	takenFromLive      int // (a)
	revivedAfterLoss   int // (b), at the moment of the heartbeat
	revivedInHindsight int // (b) judged from the logs after the run, whatever the order of commits
	ownerChanges       int // every change of owner of an offsets row: claims, takeovers, releases
	claims             int // changes that gave a row to a session (from nobody, another session or itself)
	takeovers          int // changes of owner from one session directly to another
}

func (c invariantCounts) String() string {
	return fmt.Sprintf("(a) taken from a live session: %d; (b) heartbeat after a loss: %d (in hindsight: %d); "+
		"%d owner changes: %d claims, %d takeovers from another session",
		c.takenFromLive, c.revivedAfterLoss, c.revivedInHindsight, c.ownerChanges, c.claims, c.takeovers)
}

// revivedInHindsightSQL finds, from the logs, every heartbeat that moved a
// session's expiry from at or before a takeover of one of its rows to after
// it, unless another transaction had deleted the session by the takeover
// (then the heartbeat came before the delete, and the row was free). The
// session was then trusted by its owner past the moment another session
// took the row: the conflict (b) looks for, caught here whichever of the
// two committed first.
func revivedInHindsightSQL(adapter pglease.Tables) string {
	return `SELECT o.id, o.at, o.topic, o.old_session, o.new_session, o.new_epoch, o.app,
	h.id, h.at, h.old_expires_at, h.new_expires_at, h.app
FROM ` + table(adapter, invOwnershipTable) + ` o
JOIN ` + table(adapter, invSessionsTable) + ` h ON h.session_id = o.old_session AND h.op = 'HEARTBEAT'
WHERE o.new_session <> o.old_session
	AND h.old_expires_at <= o.at AND o.at < h.new_expires_at
	AND NOT EXISTS (SELECT 1 FROM ` + table(adapter, invSessionsTable) + ` d
		WHERE d.op = 'DELETE' AND d.session_id = o.old_session AND d.at <= o.at AND d.tx <> o.tx)
ORDER BY o.id, h.id`
}

// readInvariantCounts returns what the checker recorded so far.
func readInvariantCounts(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) invariantCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c invariantCounts
	require.NoError(t, pool.QueryRow(ctx, `SELECT
	count(*) FILTER (WHERE kind = 'a'), count(*) FILTER (WHERE kind = 'b')
FROM `+table(adapter, invViolationsTable)).Scan(&c.takenFromLive, &c.revivedAfterLoss))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM (`+revivedInHindsightSQL(adapter)+`) v`).Scan(&c.revivedInHindsight))
	require.NoError(t, pool.QueryRow(ctx, `SELECT
	count(*) FILTER (WHERE old_session IS DISTINCT FROM new_session),
	count(*) FILTER (WHERE new_session IS NOT NULL AND new_epoch > old_epoch),
	count(*) FILTER (WHERE new_session <> old_session)
FROM `+table(adapter, invOwnershipTable)).Scan(&c.ownerChanges, &c.claims, &c.takeovers))
	return c
}

// logInvariantViolations logs every violation the checker recorded, with
// the log of each victim session, at most limit of each kind.
func logInvariantViolations(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, limit int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	victims := map[uuid.UUID]bool{}
	ts := func(p *time.Time) string {
		if p == nil {
			return "-"
		}
		return p.Format("15:04:05.000000")
	}

	rows, err := pool.Query(ctx, `SELECT * FROM (
	SELECT *, row_number() OVER (PARTITION BY kind ORDER BY id) AS n FROM `+table(adapter, invViolationsTable)+`
) v WHERE n <= $1 ORDER BY id`, limit)
	require.NoError(t, err)
	for rows.Next() {
		var (
			id, n                             int64
			at                                time.Time
			tx, app, kind, reason             string
			group, topic                      *string
			partition                         *int32
			victim                            uuid.UUID
			taker                             *uuid.UUID
			epoch                             *int64
			victimExp, extendedTo, takeoverAt *time.Time
		)
		require.NoError(t, rows.Scan(&id, &at, &tx, &app, &kind, &reason, &group, &topic, &partition,
			&victim, &taker, &epoch, &victimExp, &extendedTo, &takeoverAt, &n))
		victims[victim] = true
		fmt.Fprintf(&b, "violation %d (%s) %s at %s by tx %s (%s): topic %q epoch %v: session %s lost it to %v; "+
			"victim's expiry %s, extended to %s, taken at %s\n",
			id, kind, reason, ts(&at), tx, app, deref(topic), deref(epoch), victim, deref(taker),
			ts(victimExp), ts(extendedTo), ts(takeoverAt))
	}
	require.NoError(t, rows.Err())

	rows, err = pool.Query(ctx, revivedInHindsightSQL(adapter)+` LIMIT $1`, limit)
	require.NoError(t, err)
	for rows.Next() {
		var (
			oid, hid, epoch        int64
			oat, hat, hOld, hNew   time.Time
			topic, oApp, hApp      string
			oldSession, newSession uuid.UUID
		)
		require.NoError(t, rows.Scan(&oid, &oat, &topic, &oldSession, &newSession, &epoch, &oApp,
			&hid, &hat, &hOld, &hNew, &hApp))
		victims[oldSession] = true
		fmt.Fprintf(&b, "in hindsight: topic %q taken from %s by %s (epoch %d) at %s (ownership log %d, %s); "+
			"heartbeat at %s (%s) moved the expiry from %s to %s (sessions log %d)\n",
			topic, oldSession, newSession, epoch, ts(&oat), oid, oApp, ts(&hat), hApp, ts(&hOld), ts(&hNew), hid)
	}
	require.NoError(t, rows.Err())

	for v := range victims {
		fmt.Fprintf(&b, "session %s:\n", v)
		rows, err := pool.Query(ctx, `SELECT at, 'ownership' AS what, format('%s -> %s epoch %s topic %s (%s)',
		old_session, new_session, new_epoch, topic, app) FROM `+table(adapter, invOwnershipTable)+`
	WHERE old_session = $1 OR new_session = $1
UNION ALL
SELECT at, op, format('expires %s -> %s (%s)', to_char(old_expires_at, 'HH24:MI:SS.US'),
		to_char(new_expires_at, 'HH24:MI:SS.US'), app) FROM `+table(adapter, invSessionsTable)+`
	WHERE session_id = $1
ORDER BY 1`, v)
		require.NoError(t, err)
		for rows.Next() {
			var (
				at         time.Time
				what, text string
			)
			require.NoError(t, rows.Scan(&at, &what, &text))
			fmt.Fprintf(&b, "  %s %-9s %s\n", ts(&at), what, text)
		}
		require.NoError(t, rows.Err())
	}
	if b.Len() > 0 {
		t.Logf("invariant violations:\n%s", b.String())
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// ------------------------------------------------------------------ tests

// TestInvariantCheckerCatchesViolations forces each violation with plain SQL
// on the tables and checks that the checker counts it, once; then that
// clean takeovers count nothing.
func TestInvariantCheckerCatchesViolations(t *testing.T) {
	pool := newPool(t, 4)
	ctx := context.Background()

	// setup returns a schema with the pglease tables and the checker, and
	// an exec that fails the test on error.
	setup := func(t *testing.T) (pglease.Tables, func(q string, args ...any)) {
		adapter := newSchema(t, pool)
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true}, nil)
		require.NoError(t, err)
		require.NoError(t, sub.SubscribeInitialize("setup"))
		require.NoError(t, sub.Close())
		installInvariantChecker(t, pool, adapter)
		return adapter, func(q string, args ...any) {
			t.Helper()
			_, err := pool.Exec(ctx, q, args...)
			require.NoError(t, err, q)
		}
	}
	// Statements on the pglease tables, as plain SQL.
	type tables struct{ sessions, offsets string }
	names := func(a pglease.Tables) tables {
		return tables{table(a, pglease.DefaultConsumerSessionsTable), table(a, pglease.DefaultConsumerOffsetsTable)}
	}
	// session creates a session row expiring after d (negative: expired).
	session := func(exec func(string, ...any), tb tables, d time.Duration) uuid.UUID {
		id := uuid.New()
		exec(`INSERT INTO `+tb.sessions+` (id, consumer_group, owner, expires_at)
VALUES ($1, 'g', 'test/0', clock_timestamp() + $2::bigint * interval '1 microsecond')`, id, d.Microseconds())
		return id
	}
	// owned creates the offsets row of topic, owned by s (uuid.Nil: free).
	owned := func(exec func(string, ...any), tb tables, topic string, s uuid.UUID) {
		var owner any
		if s != uuid.Nil {
			owner = s
		}
		exec(`INSERT INTO `+tb.offsets+` (consumer_group, topic, session_id, epoch) VALUES ('g', $1, $2, 1)`, topic, owner)
	}
	take := func(exec func(string, ...any), tb tables, topic string, s uuid.UUID) {
		exec(`UPDATE `+tb.offsets+` SET session_id = $2, epoch = epoch + 1 WHERE consumer_group = 'g' AND topic = $1`, topic, s)
	}
	heartbeat := func(exec func(string, ...any), tb tables, s uuid.UUID) {
		exec(`UPDATE `+tb.sessions+` SET expires_at = now() + interval '10 seconds' WHERE id = $1`, s)
	}
	check := func(t *testing.T, adapter pglease.Tables, want invariantCounts) {
		t.Helper()
		got := readInvariantCounts(t, pool, adapter)
		if !assert.Equal(t, want, got) {
			logInvariantViolations(t, pool, adapter, 10)
		}
	}

	t.Run("taken from a live session", func(t *testing.T) {
		adapter, exec := setup(t)
		tb := names(adapter)
		owner, taker := session(exec, tb, time.Hour), session(exec, tb, time.Hour)
		owned(exec, tb, "t", owner)
		take(exec, tb, "t", taker)
		check(t, adapter, invariantCounts{takenFromLive: 1, ownerChanges: 1, claims: 1, takeovers: 1})
	})

	t.Run("the taker deletes the live owner session", func(t *testing.T) {
		adapter, exec := setup(t)
		tb := names(adapter)
		owner1, owner2, taker := session(exec, tb, time.Hour), session(exec, tb, time.Hour), session(exec, tb, time.Hour)
		owned(exec, tb, "t1", owner1)
		owned(exec, tb, "t2", owner2)
		// One statement deletes the live owner's row and takes its topic:
		// whichever of the two triggers runs second sees the other's log.
		exec(`WITH gone AS (DELETE FROM `+tb.sessions+` WHERE id = $1 RETURNING id)
UPDATE `+tb.offsets+` o SET session_id = $2, epoch = o.epoch + 1
WHERE o.topic = 't1' AND o.session_id = (SELECT id FROM gone)`, owner1, taker)
		check(t, adapter, invariantCounts{takenFromLive: 1, ownerChanges: 1, claims: 1, takeovers: 1})

		// The delete first, the takeover in a later statement of the same
		// transaction.
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `DELETE FROM `+tb.sessions+` WHERE id = $1`, owner2)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `UPDATE `+tb.offsets+` SET session_id = $2, epoch = epoch + 1 WHERE topic = 't2' AND session_id = $1`, owner2, taker)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		check(t, adapter, invariantCounts{takenFromLive: 2, ownerChanges: 2, claims: 2, takeovers: 2})
	})

	t.Run("heartbeat after a loss", func(t *testing.T) {
		adapter, exec := setup(t)
		tb := names(adapter)
		owner, taker := session(exec, tb, -time.Second), session(exec, tb, time.Hour)
		owned(exec, tb, "t", owner)
		take(exec, tb, "t", taker) // the owner had expired: a clean takeover
		check(t, adapter, invariantCounts{ownerChanges: 1, claims: 1, takeovers: 1})
		heartbeat(exec, tb, owner)
		check(t, adapter, invariantCounts{revivedAfterLoss: 1, revivedInHindsight: 1, ownerChanges: 1, claims: 1, takeovers: 1})
	})

	t.Run("heartbeat that commits after a takeover it ran before", func(t *testing.T) {
		// The heartbeat's trigger runs before the takeover exists; the
		// takeover's trigger sees the expiry from before the heartbeat,
		// which has not committed. Neither trigger can see the conflict;
		// the logs show it after the fact.
		adapter, exec := setup(t)
		tb := names(adapter)
		owner, taker := session(exec, tb, -time.Second), session(exec, tb, time.Hour)
		owned(exec, tb, "t", owner)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `UPDATE `+tb.sessions+` SET expires_at = clock_timestamp() + interval '10 seconds' WHERE id = $1`, owner)
		require.NoError(t, err)
		take(exec, tb, "t", taker)
		require.NoError(t, tx.Commit(ctx))
		check(t, adapter, invariantCounts{revivedInHindsight: 1, ownerChanges: 1, claims: 1, takeovers: 1})
	})

	t.Run("clean changes of owner", func(t *testing.T) {
		adapter, exec := setup(t)
		tb := names(adapter)
		expired, gone, live := session(exec, tb, -time.Second), session(exec, tb, time.Hour), session(exec, tb, time.Hour)
		owned(exec, tb, "expired", expired)
		owned(exec, tb, "gone", gone)
		owned(exec, tb, "free", uuid.Nil)
		owned(exec, tb, "released", live)
		owned(exec, tb, "override", live)
		// From an expired session whose row the claimer deletes in the same
		// statement (the fixed claim's shape).
		exec(`WITH gone AS (DELETE FROM `+tb.sessions+` WHERE id = $1 AND expires_at < now() RETURNING id)
UPDATE `+tb.offsets+` o SET session_id = $2, epoch = o.epoch + 1
WHERE o.topic = 'expired' AND o.session_id = (SELECT id FROM gone)`, expired, live)
		// From a session that was deleted (closed) before.
		exec(`DELETE FROM `+tb.sessions+` WHERE id = $1`, gone)
		take(exec, tb, "gone", live)
		// A free row.
		take(exec, tb, "free", live)
		// A release, then a claim of the freed row by another session.
		other := session(exec, tb, time.Hour)
		exec(`UPDATE ` + tb.offsets + ` SET session_id = NULL WHERE topic = 'released'`)
		take(exec, tb, "released", other)
		// A row whose lease override ran out although its owner lives.
		exec(`UPDATE ` + tb.offsets + ` SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE topic = 'override'`)
		take(exec, tb, "override", other)
		// A session re-claiming its own row, heartbeats of live sessions, an
		// expiry moved earlier (not a heartbeat) and an offset commit (no
		// change of owner).
		take(exec, tb, "override", other)
		heartbeat(exec, tb, live)
		heartbeat(exec, tb, other)
		exec(`UPDATE `+tb.sessions+` SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1`, live)
		exec(`UPDATE ` + tb.offsets + ` SET acked_offset = 7 WHERE topic = 'free'`)
		check(t, adapter, invariantCounts{ownerChanges: 6, claims: 6, takeovers: 3})
		var logged int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, invOwnershipTable)).Scan(&logged))
		assert.Equal(t, 7, logged, "every change of owner or epoch is logged, the re-claim too")
	})
}

// ------------------------------------------------------------ under load

// installServerJitter makes the database slow at the worst moments, the
// way a loaded server is: with probability p, a heartbeat (an UPDATE of a
// session row) holds the row for a random time up to maxDelay after its
// now() was fixed, and an UPDATE of the offsets table (a claim, commit or
// release) waits a random time up to maxDelay after its snapshot was taken,
// before it reads any row. That widens the windows of the races the checker
// looks for; a correct protocol does not depend on the server's speed.
func installServerJitter(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, p float64, maxDelay time.Duration) {
	t.Helper()
	fn := table(adapter, "inv_jitter")
	args := fmt.Sprintf("%g, %g", p, maxDelay.Seconds())
	for _, q := range []string{
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	IF random() < TG_ARGV[0]::float8 THEN
		PERFORM pg_sleep(random() * TG_ARGV[1]::float8);
	END IF;
	IF TG_LEVEL = 'ROW' THEN
		RETURN NEW;
	END IF;
	RETURN NULL;
END $$`,
		`CREATE TRIGGER inv_jitter BEFORE UPDATE ON ` + table(adapter, pglease.DefaultConsumerSessionsTable) +
			` FOR EACH ROW EXECUTE FUNCTION ` + fn + `(` + args + `)`,
		`CREATE TRIGGER inv_jitter BEFORE UPDATE ON ` + table(adapter, pglease.DefaultConsumerOffsetsTable) +
			` FOR EACH STATEMENT EXECUTE FUNCTION ` + fn + `(` + args + `)`,
	} {
		_, err := pool.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
}

// freezer stops random helper processes with SIGSTOP for a random time in
// [minFreeze, maxFreeze] and continues them with SIGCONT, until halted.
// Each of its workers waits a random time up to gapMax between freezes; a
// process is frozen by one worker at a time.
type freezer struct {
	procs                []*helperProc
	gapMax               time.Duration
	minFreeze, maxFreeze time.Duration

	stopOnce sync.Once
	stop     chan struct{}
	done     sync.WaitGroup

	mu      sync.Mutex
	frozen  map[*helperProc]bool
	freezes int
	longest time.Duration
	errs    []error
}

func startFreezer(t *testing.T, procs []*helperProc, workers int, gapMax, minFreeze, maxFreeze time.Duration) *freezer {
	t.Helper()
	f := &freezer{procs: procs, gapMax: gapMax, minFreeze: minFreeze, maxFreeze: maxFreeze,
		stop: make(chan struct{}), frozen: map[*helperProc]bool{}}
	for range workers {
		f.done.Add(1)
		go f.work()
	}
	t.Cleanup(f.halt) // before the helpers are killed: cleanups run last first
	return f
}

func (f *freezer) work() {
	defer f.done.Done()
	for {
		select {
		case <-f.stop:
			return
		case <-time.After(rand.N(f.gapMax)):
		}
		p := f.pick()
		if p == nil {
			continue
		}
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			f.fail(p, fmt.Errorf("SIGSTOP to %s: %w", p.cfg.Name, err))
			continue
		}
		began := time.Now()
		select {
		case <-f.stop:
		case <-time.After(f.minFreeze + rand.N(f.maxFreeze-f.minFreeze+1)):
		}
		err := p.cmd.Process.Signal(syscall.SIGCONT)
		took := time.Since(began)
		f.mu.Lock()
		delete(f.frozen, p)
		f.freezes++
		f.longest = max(f.longest, took)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("SIGCONT to %s: %w", p.cfg.Name, err))
		}
		f.mu.Unlock()
	}
}

// pick returns a random process that is not frozen, marked frozen, or nil.
func (f *freezer) pick() *helperProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	var free []*helperProc
	for _, p := range f.procs {
		if !f.frozen[p] {
			free = append(free, p)
		}
	}
	if len(free) == 0 {
		return nil
	}
	p := free[rand.N(len(free))]
	f.frozen[p] = true
	return p
}

func (f *freezer) fail(p *helperProc, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.frozen, p)
	f.errs = append(f.errs, err)
}

// halt stops freezing and continues every frozen process. It is safe to
// call more than once.
func (f *freezer) halt() {
	f.stopOnce.Do(func() { close(f.stop) })
	f.done.Wait()
}

// frozenChurn is one run of the churn under freezes.
type frozenChurn struct {
	procs, subs, slots int           // processes, Subscribers per process, subscriptions per Subscriber
	topics             int           // topics in the set the subscriptions pick from
	run                time.Duration // how long messages are published and processes frozen
	publishEvery       time.Duration // per topic
	freezers           int           // processes frozen at once, at most
	freezeGapMax       time.Duration // between the freezes of one freezer
	renewMax           time.Duration // the lifetime of a Subscriber, at most
	// The drain processes what is left once publishing stopped: it
	// fails when no message was processed for drainStall, or after
	// drainLimit.
	drainStall, drainLimit time.Duration
	minClaims              int // claims the run must exercise
	// jitter, when set, is the probability of a delay of up to jitterMax
	// in heartbeats and offsets statements (see installServerJitter).
	jitter    float64
	jitterMax time.Duration
}

// runFrozenChurn runs helper processes in modeRoam, one consumer group,
// SessionTTL 1s, while messages are published to every topic and random
// processes are frozen with SIGSTOP for 0.7 to 1.3 s, longer than the TTL
// or about it, and, with jitter set, the server is slow at random moments
// (installServerJitter). The invariant checker must find no violation: no row taken
// from a live session, no heartbeat that revived a session after one of
// its rows was taken. Every published message is processed (duplicates are
// allowed: a frozen owner's unacknowledged and uncommitted messages go to
// the next one), and the run exercised at least minClaims claims.
func runFrozenChurn(t *testing.T, c frozenChurn) {
	const ttl = time.Second
	began := time.Now()
	var topics []string
	for i := range c.topics {
		topics = append(topics, fmt.Sprintf("f%02d", i))
	}
	s := newFailureSetup(t, ttl, topics...)
	installInvariantChecker(t, s.pool, s.adapter)
	if c.jitter > 0 {
		installServerJitter(t, s.pool, s.adapter, c.jitter, c.jitterMax)
	}
	cfg := s.cfg
	cfg.Mode = modeRoam
	cfg.Subscribers = c.subs
	cfg.Slots = c.slots
	cfg.ChurnMin, cfg.ChurnMax = 1, 20
	cfg.HoldMax = time.Second
	cfg.RenewMax = c.renewMax
	cfg.PollInterval = 250 * time.Millisecond

	var helpers []*helperProc
	for i := range c.procs {
		helpers = append(helpers, startHelper(t, cfg.named(fmt.Sprintf("p%d", i))))
	}
	startedIn := time.Since(began)

	var streams []*stream
	for _, topic := range topics {
		streams = append(streams, startStream(t, s.pub, topic, c.publishEvery))
	}
	frz := startFreezer(t, helpers, c.freezers, c.freezeGapMax, 700*time.Millisecond, 1300*time.Millisecond)
	time.Sleep(c.run) // the load's schedule, not a wait for a result
	frz.halt()
	published := 0
	for _, st := range streams {
		st.halt()
		for _, a := range st.results() {
			require.NoError(t, a.err, "Publish failed although the database was fine")
			published++
		}
	}
	require.Empty(t, frz.errs)
	drainBegan := time.Now()
	left, err := countUnprocessed(s.pool, s.adapter, topics)
	require.NoError(t, err)
	waitDrained(t, s.pool, s.adapter, topics, c.drainStall, c.drainLimit)
	drained := time.Since(drainBegan)
	for _, h := range helpers {
		require.True(t, h.alive(), "helper %s exited during the run", h.cfg.Name)
		h.close(t)
	}

	counts := readInvariantCounts(t, s.pool, s.adapter)
	var duplicates, sessions int
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT uuid FROM `+
		table(s.adapter, processedTable)+` GROUP BY uuid HAVING count(*) > 1) d`).Scan(&duplicates))
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
		table(s.adapter, invSessionsTable)+` WHERE op = 'INSERT'`).Scan(&sessions))
	selfFenced, lost := 0, 0
	for _, h := range helpers {
		selfFenced += strings.Count(h.logs(), "self-fenced")
		lost += strings.Count(h.logs(), "Consumer session lost")
	}
	t.Logf("frozen churn: %d processes x %d Subscribers x %d subscriptions on %d topics, started in %s; "+
		"%s of load: %d messages published, %d freezes (longest %s); %d left, drained in %s (%.0f/s); whole run %s; "+
		"%d sessions opened (%d self-fenced, %d found lost by a heartbeat); %d messages processed more than once; %s",
		c.procs, c.subs, c.slots, c.topics, startedIn.Round(time.Millisecond), c.run, published, frz.freezes,
		frz.longest.Round(time.Millisecond), left, drained.Round(time.Millisecond), float64(left)/drained.Seconds(),
		time.Since(began).Round(time.Millisecond),
		sessions, selfFenced, lost, duplicates, counts)

	assert.Zero(t, counts.takenFromLive, "(a) a row was taken from a live session")
	assert.Zero(t, counts.revivedAfterLoss, "(b) a heartbeat revived a session after one of its rows was taken")
	assert.Zero(t, counts.revivedInHindsight, "(b, from the logs) a heartbeat revived a session past a takeover of one of its rows")
	if counts.takenFromLive+counts.revivedAfterLoss+counts.revivedInHindsight > 0 {
		logInvariantViolations(t, s.pool, s.adapter, 10)
	}
	assert.GreaterOrEqual(t, counts.claims, c.minClaims, "ownership hardly moved: the run did not test much")
	assert.Positive(t, counts.takeovers, "no row was ever taken from an expired or lost session")
}

// TestFrozenChurnInvariants is the short run of runFrozenChurn; `make
// stress` runs TestStressFrozenChurn, a longer one with more of everything.
// The server jitter makes the races of the two known holes likely enough to
// be caught in most short runs of a library that has them (without it, in
// about one run in ten).
func TestFrozenChurnInvariants(t *testing.T) {
	runFrozenChurn(t, frozenChurn{
		procs: 3, subs: 2, slots: 2, topics: 6,
		run:          12 * time.Second,
		publishEvery: 25 * time.Millisecond,
		freezers:     2,
		freezeGapMax: 800 * time.Millisecond,
		renewMax:     4 * time.Second,
		drainStall:   30 * time.Second,
		drainLimit:   5 * time.Minute,
		minClaims:    100,
		jitter:       0.3,
		jitterMax:    50 * time.Millisecond,
	})
}
