// Package pgsqltest is the conformance suite of the statements of
// internal/pgsql: every guarantee a statement gives its callers (fencing by
// session and epoch, the position checks, the server's identity, claims
// under forced interleavings, sessions, topics, offsets, the maintainer's
// row) is a case, written once and run in each database mode the package
// supports, through the [pgsql.Driver] of each (single node, Citus), so
// that the two implementations of a statement are held to the same cases.
//
// [Exercise] runs every case as a subtest of t, each on an [Env] of its own
// (a schema of the case's own, migrated, and on Citus distributed) that
// the caller's open function returns. internal/pgsql/suite_test.go runs it
// twice: TestDriverSingleNode on the server of PGLEASE_TEST_DSN (part of
// `make test`), and TestCitusDriver on the cluster of `make test-citus`
// (skipped without PGLEASE_TEST_CITUS).
//
// To add a case, write a func(t *testing.T, f *fixture) in one of the
// cases_*.go files (the fixture holds the Env, a context and the
// server's identity, and the helpers the cases share) and list it in
// cases() under a name that says what it shows. A case forces the interleaving it is about (a row
// lock held from a second connection, a transaction held open) and waits
// on conditions with deadlines, never on time. Where the two modes
// legitimately differ (what a statement returns, which identity fences
// it), the case asserts each mode's behaviour under f.Env.Citus and says
// why in its comment.
//
// Nothing here is used outside tests.
package pgsqltest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// Env is what a case runs on.
type Env struct {
	// Pool is a pool on the database (on Citus, on the coordinator); a
	// case takes its second connections from it.
	Pool *pgxpool.Pool
	// Tables are the case's own tables, migrated, and on Citus
	// distributed.
	Tables *pgsql.Tables
	// Driver is the driver under test, on Tables.
	Driver pgsql.Driver
	// Citus says the tables are distributed by Citus: where the modes
	// differ, the case asserts what this one does.
	Citus bool
}

// testCase is one case of the suite.
type testCase struct {
	name string
	run  func(t *testing.T, f *fixture)
}

// cases are the suite's cases, in the order they run.
func cases() []testCase {
	return []testCase{
		// topics and messages
		{"InsertAndSelectInOrder", testInsertAndSelectInOrder},
		{"InsertManyTopics", testInsertManyTopics},
		{"SelectLeavesOutLargePayloads", testSelectLeavesOutLargePayloads},
		{"SelectWaitsForAnOlderTransaction", testSelectWaitsForAnOlderTransaction},
		{"SelectRefusesAnotherHistory", testSelectRefusesAnotherHistory},
		{"SelectMessagesAt", testSelectMessagesAt},
		{"VisibleTopics", testVisibleTopics},
		{"UpsertTopicRaisesNeverLowers", testUpsertTopicRaisesNeverLowers},
		{"InsertPlacesByPartitionKey", testInsertPlacesByPartitionKey},
		{"DelayedMovedWhenDue", testDelayedMovedWhenDue},
		{"MoveDueSkipsLockedRows", testMoveDueSkipsLockedRows},
		// positions held back only by their topic's publishers (0008)
		{"UnrelatedWriterHoldsNothing", testUnrelatedWriterHoldsNothing},
		{"OpenPublisherHoldsOnlyItsTopic", testOpenPublisherHoldsOnlyItsTopic},
		{"OpenPublishersListed", testOpenPublishersListed},
		{"PublisherBetweenReadingVAndLocks", testPublisherBetweenReadingVAndLocks},
		{"PositionTakenBeforeRegistration", testPositionTakenBeforeRegistration},
		{"PublisherBetweenLocksAndPosition", testPublisherBetweenLocksAndPosition},
		{"PartitionedPublisherBetweenReadingVAndLocks", testPartitionedPublisherBetweenReadingVAndLocks},
		{"PartitionedPublisherBetweenLocksAndPosition", testPartitionedPublisherBetweenLocksAndPosition},
		{"ReaderBetweenItsStatements", testReaderBetweenItsStatements},
		{"ManyTopicsInOneTransaction", testManyTopicsInOneTransaction},
		{"PublishWaitPublishAgain", testPublishWaitPublishAgain},
		{"SavepointRolledBackAfterRegistration", testSavepointRolledBackAfterRegistration},
		{"BoundCountsOnlyWriters", testBoundCountsOnlyWriters},
		{"InsertsThatDidNotRegister", testInsertsThatDidNotRegister},
		{"ResetToTimeBoundBeforeSnapshot", testResetToTimeBoundBeforeSnapshot},
		{"KeyedInsertHoldsItsTopic", testKeyedInsertHoldsItsTopic},
		// idempotency keys
		{"KeyedInsertStoresOnce", testKeyedInsertStoresOnce},
		{"KeyedInsertWaitsForTheOther", testKeyedInsertWaitsForTheOther},
		{"KeyedInsertsDoNotDeadlock", testKeyedInsertsDoNotDeadlock},
		{"KeyedInsertWindow", testKeyedInsertWindow},
		{"KeyedTransaction", testKeyedTransaction},
		{"KeyedDelayed", testKeyedDelayed},
		{"ForgetKeys", testForgetKeys},
		{"KeyedRetentionWindow", testKeyedRetentionWindow},
		{"KeyedClassTransition", testKeyedClassTransition},
		{"KeyedConfiguredWindow", testKeyedConfiguredWindow},
		{"InspectTopicsKeyWindows", testInspectTopicsKeyWindows},
		{"InspectSettingsLastTheTransaction", testInspectSettingsLastTheTransaction},
		// sessions
		{"SessionCreateAndHeartbeat", testSessionCreateAndHeartbeat},
		{"SessionReplacesAnother", testSessionReplacesAnother},
		{"SetSubscriptionsAndGroupMembers", testSetSubscriptionsAndGroupMembers},
		{"DeleteExpiredSessions", testDeleteExpiredSessions},
		// offsets and claims
		{"EnsureOffsetsEarliest", testEnsureOffsetsEarliest},
		{"EnsureOffsetsLatest", testEnsureOffsetsLatest},
		{"ClaimTakesFreeRows", testClaimTakesFreeRows},
		{"ClaimRefusedWhileOwnerLive", testClaimRefusedWhileOwnerLive},
		{"ClaimTakesFromExpiredOrGoneOwner", testClaimTakesFromExpiredOrGoneOwner},
		{"ClaimWaitsForTheOwnersHeartbeat", testClaimWaitsForTheOwnersHeartbeat},
		{"ClaimWaitsForRowLockThenLoses", testClaimWaitsForRowLockThenLoses},
		{"ConcurrentClaimsOneOwner", testConcurrentClaimsOneOwner},
		{"ClaimLeavesFuturePosition", testClaimLeavesFuturePosition},
		{"ClaimRefusedElsewhere", testClaimRefusedElsewhere},
		// fenced statements
		{"CommitFenced", testCommitFenced},
		{"CommitPositionChecks", testCommitPositionChecks},
		{"ReleaseFenced", testReleaseFenced},
		{"ReleaseCarriesAckedAbove", testReleaseCarriesAckedAbove},
		{"ReleaseMany", testReleaseMany},
		{"AckOffsetFenced", testAckOffsetFenced},
		{"AckOffsetWaitsForAClaim", testAckOffsetWaitsForAClaim},
		{"AckOffsetAbove", testAckOffsetAbove},
		{"CountHeadDelivery", testCountHeadDelivery},
		{"IdentityFences", testIdentityFences},
		// the failure policy
		{"WaitingFenced", testWaitingFenced},
		{"HandedOutFenced", testHandedOutFenced},
		{"SkipMessage", testSkipMessage},
		{"DeadLetterFencedByATakeover", testDeadLetterFencedByATakeover},
		// operators and the maintainer
		{"ResetOffsets", testResetOffsets},
		{"ResetOffsetsLeavesChangedRows", testResetOffsetsLeavesChangedRows},
		{"MaintainerClaimRelease", testMaintainerClaimRelease},
	}
}

// Exercise runs every case of the suite as a subtest of t, each on the Env
// that open returns for it (called once per case, with the subtest's t:
// its clean-ups run when the case ends).
func Exercise(t *testing.T, open func(t *testing.T) Env) {
	t.Helper()
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			env := open(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			t.Cleanup(cancel)
			here, err := pgsql.Here(ctx, env.Pool)
			if err != nil {
				t.Fatalf("read the server's identity: %v", err)
			}
			c.run(t, &fixture{t: t, ctx: ctx, Env: env, here: here})
		})
	}
}

// waitTimeout bounds every wait of a case on a condition.
const waitTimeout = 30 * time.Second

// ahead is a position far above any test server's counter (the
// transaction counter, or the position sequence, which starts 2^40 above
// it): a position read on another history.
const ahead = uint64(1) << 50

// fixture is a case's environment and the helpers its cases share. Its
// helpers fail the test on an error they do not expect.
type fixture struct {
	Env
	t    *testing.T
	ctx  context.Context
	here string // the identity of the server (the coordinator on Citus)
	// inZero holds the topics of f.partitioned.
	inZero map[string]bool
}

// session creates a live session of group (TTL one hour).
func (f *fixture) session(group string) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	if _, err := f.Driver.CreateSession(f.ctx, f.Pool, pgsql.SessionParams{SessionID: id, ConsumerGroup: group,
		Owner: "owner-" + id.String()[:8], TTL: time.Hour}); err != nil {
		f.t.Fatalf("create session: %v", err)
	}
	return id
}

// expire makes the session's row expired (a second ago), as a session
// whose heartbeats stopped.
func (f *fixture) expire(id uuid.UUID) {
	f.t.Helper()
	f.exec(`UPDATE `+f.Tables.Sessions+` SET expires_at = pg_catalog.now() - interval '1 second' WHERE id = $1`, id)
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.Pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// ensure creates the group's offset rows of topic's partitions (partition
// 0 when none is given), at the beginning.
func (f *fixture) ensure(group, topic string, partitions ...int32) {
	f.t.Helper()
	p := pgsql.OffsetsParams{ConsumerGroup: group}
	if len(partitions) == 0 {
		partitions = []int32{0}
	}
	for _, part := range partitions {
		p.Topics = append(p.Topics, topic)
		p.Partitions = append(p.Partitions, part)
	}
	if _, err := f.Driver.EnsureOffsets(f.ctx, f.Pool, p); err != nil {
		f.t.Fatalf("ensure offsets: %v", err)
	}
}

// claimParams are the parameters of a claim by session of group's rows
// of topic's partitions (partition 0 when none is given), limit 100.
func (f *fixture) claimParams(session uuid.UUID, group, topic string, partitions ...int32) pgsql.OffsetsParams {
	if len(partitions) == 0 {
		partitions = []int32{0}
	}
	p := pgsql.OffsetsParams{ConsumerGroup: group, SessionID: session, Here: f.here, Limit: 100}
	for _, part := range partitions {
		p.Topics = append(p.Topics, topic)
		p.Partitions = append(p.Partitions, part)
	}
	return p
}

// claim runs a claim of claimParams on the pool.
func (f *fixture) claim(session uuid.UUID, group, topic string, partitions ...int32) []pgsql.ClaimRow {
	f.t.Helper()
	rows, err := f.Driver.ClaimOffsets(f.ctx, f.Pool, f.claimParams(session, group, topic, partitions...))
	if err != nil {
		f.t.Fatalf("claim: %v", err)
	}
	return rows
}

// claimOne claims the group's row of topic's partition 0 for session and
// fails unless it is taken.
func (f *fixture) claimOne(session uuid.UUID, group, topic string) pgsql.ClaimRow {
	f.t.Helper()
	rows := f.claim(session, group, topic)
	if len(rows) != 1 || rows[0].Kind != pgsql.ClaimTaken {
		f.t.Fatalf("claim of %s/%s: %s, want it taken", group, topic, claimsString(rows))
	}
	return rows[0]
}

// owned returns the parameters of the fenced statements on the row r
// that session claimed: its epoch, the identities it was claimed under.
func (f *fixture) owned(session uuid.UUID, group string, r pgsql.ClaimRow) pgsql.OffsetParams {
	return pgsql.OffsetParams{ConsumerGroup: group, Topic: r.Topic, Partition: r.Partition, SessionID: session,
		Epoch: r.Epoch, Here: f.here, WorkerHere: r.WorkerHere}
}

func claimsString(rows []pgsql.ClaimRow) string {
	var b strings.Builder
	b.WriteString("[")
	for i, r := range rows {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%c %s/%d epoch %d", r.Kind, r.Topic, r.Partition, r.Epoch)
	}
	b.WriteString("]")
	return b.String()
}

// offsetRow is an offsets row as the table holds it.
type offsetRow struct {
	Session        *uuid.UUID
	Epoch          int64
	Acked          pgsql.Position
	HeadDeliveries int32
	AckedAbove     []string
}

// row reads the group's row of topic's partition.
func (f *fixture) row(group, topic string, partition int32) offsetRow {
	f.t.Helper()
	var r offsetRow
	var tx string
	err := f.Pool.QueryRow(f.ctx, `SELECT session_id, epoch, acked_transaction_id::text, acked_offset, head_deliveries, acked_above
FROM `+f.Tables.Offsets+` WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, group, topic, partition).
		Scan(&r.Session, &r.Epoch, &tx, &r.Acked.Offset, &r.HeadDeliveries, &r.AckedAbove)
	if err != nil {
		f.t.Fatalf("read the row of %s/%s/%d: %v", group, topic, partition, err)
	}
	if _, err := fmt.Sscan(tx, &r.Acked.TransactionID); err != nil {
		f.t.Fatalf("parse %q: %v", tx, err)
	}
	return r
}

// sessionExists reports whether the session's row exists.
func (f *fixture) sessionExists(id uuid.UUID) bool {
	f.t.Helper()
	var ok bool
	if err := f.Pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT 1 FROM `+f.Tables.Sessions+` WHERE id = $1)`, id).Scan(&ok); err != nil {
		f.t.Fatal(err)
	}
	return ok
}

// publish inserts one message per UUID (its payload the UUID) into topic,
// in one statement.
func (f *fixture) publish(q pgsql.Querier, topic string, uuids ...string) {
	f.t.Helper()
	p := f.insertParams(topic, uuids)
	if err := f.Driver.InsertMessages(f.ctx, q, p); err != nil {
		f.t.Fatalf("insert messages: %v", err)
	}
}

// insertParams are the parameters of an insert of messages uuids to
// topic, each its UUID as payload; to a topic of f.partitioned, placed in
// partition 0.
func (f *fixture) insertParams(topic string, uuids []string) pgsql.InsertMessagesParams {
	p := pgsql.InsertMessagesParams{NotifyChannel: f.Tables.NotifyChannel}
	for _, id := range uuids {
		p.Topics = append(p.Topics, topic)
		p.UUIDs = append(p.UUIDs, id)
		p.Payloads = append(p.Payloads, []byte(id))
		p.Metadata = append(p.Metadata, "")
		if f.inZero[topic] {
			p.PartitionHashes = append(p.PartitionHashes, 0)
		}
	}
	return p
}

// selectParams reads topic's partition after a position, as a consumer
// that claimed under f.here does.
func (f *fixture) selectParams(topic string, partition int32, after pgsql.Position) pgsql.SelectMessagesParams {
	return pgsql.SelectMessagesParams{Topic: topic, Partition: partition, After: after, Limit: 100, Here: f.here}
}

// read runs SelectMessages once.
func (f *fixture) read(p pgsql.SelectMessagesParams) pgsql.SelectResult {
	f.t.Helper()
	res, err := f.Driver.SelectMessages(f.ctx, f.Pool, p)
	if err != nil {
		f.t.Fatalf("select messages: %v", err)
	}
	return res
}

// readSettled reads until nothing is pending: until every transaction
// older than the messages' ends, on the server or the topic's worker
// (other sessions' transactions hold the horizon too).
func (f *fixture) readSettled(p pgsql.SelectMessagesParams) pgsql.SelectResult {
	f.t.Helper()
	var res pgsql.SelectResult
	pgtest.WaitFor(f.t, waitTimeout, "the messages of "+p.Topic+" no longer pending", func() bool {
		res = f.read(p)
		return !res.Pending
	})
	if res.WentBack || res.Future != nil {
		f.t.Fatalf("select messages: %+v", res)
	}
	return res
}

func uuidsOf(ms []pgsql.MessageRow) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.UUID)
	}
	return out
}

// begin starts a transaction on a connection of its own, rolled back at
// the end of the case unless committed.
func (f *fixture) begin() pgx.Tx {
	f.t.Helper()
	tx, err := f.Pool.Begin(f.ctx)
	if err != nil {
		f.t.Fatalf("begin: %v", err)
	}
	f.t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(f.ctx)) })
	return tx
}

// conn returns a connection of the pool held for the case.
func (f *fixture) conn() *pgxpool.Conn {
	f.t.Helper()
	c, err := f.Pool.Acquire(f.ctx)
	if err != nil {
		f.t.Fatalf("acquire: %v", err)
	}
	f.t.Cleanup(c.Release)
	return c
}

// waitBlocked waits until n statements wait for a lock: on a single
// server, statements of the database whose text is LIKE single
// (pg_stat_activity); on Citus, where a statement waits on the topic's
// worker (or, on a reference table, on every node), statements whose
// text is LIKE citus (citus_lock_waits, the waits of the whole cluster).
func (f *fixture) waitBlocked(n int, single, citus string) {
	f.t.Helper()
	q, pattern := `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
	WHERE wait_event_type = 'Lock' AND datname = pg_catalog.current_database() AND query LIKE $1`, single
	if f.Citus {
		q, pattern = `SELECT pg_catalog.count(DISTINCT waiting_gpid) FROM pg_catalog.citus_lock_waits WHERE blocked_statement LIKE $1`, citus
	}
	pgtest.WaitFor(f.t, waitTimeout, fmt.Sprintf("%d statements like %q to wait for a lock", n, pattern), func() bool {
		var got int
		if err := f.Pool.QueryRow(f.ctx, q, pattern).Scan(&got); err != nil {
			f.t.Fatalf("read the lock waits: %v", err)
		}
		return got >= n
	})
}

// listen returns a connection that listens on the tables' channel.
func (f *fixture) listen() *pgxpool.Conn {
	f.t.Helper()
	c := f.conn()
	if err := pgsql.Listen(f.ctx, c, f.Tables.NotifyChannel); err != nil {
		f.t.Fatalf("listen: %v", err)
	}
	return c
}

// notified waits for a notification with each of payloads on c, in any
// order (others are passed over).
func (f *fixture) notified(c *pgxpool.Conn, payloads ...string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, waitTimeout)
	defer cancel()
	var got []string
	for len(payloads) > 0 {
		n, err := c.Conn().WaitForNotification(ctx)
		if err != nil {
			f.t.Fatalf("waiting for notifications %q (got %q): %v", payloads, got, err)
		}
		got = append(got, n.Payload)
		if i := slices.Index(payloads, n.Payload); i >= 0 {
			payloads = slices.Delete(payloads, i, i+1)
		}
	}
}

// isWentBack reports whether err says the statement ran on another
// history.
func isWentBack(err error) bool { return errors.Is(err, pgsql.ErrWentBack) }
