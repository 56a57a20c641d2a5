package pglease_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// This file holds what the failure tests record and how they judge it.
//
// The helper processes (process_test.go) write one row per processed
// message into processedTable. Triggers, installed in the test's schema by
// instrument, log every change of a consumer_offsets row and every insert,
// heartbeat and delete of a consumer_sessions row, with the database's
// clock. After a run, loadHistory reads it all back and verify checks the
// delivery guarantees against it: the checks are computed from the data,
// not from expected counts.

const (
	processedTable   = "test_processed"
	offsetsLogTable  = "test_offsets_log"
	sessionsLogTable = "test_sessions_log"
)

// ownershipLostText is the text of pglease.ErrOwnershipLost, which every log
// line about a lost claim or session carries.
var ownershipLostText = pglease.ErrOwnershipLost.Error()

// instrument creates the pglease tables in adapter's schema and, beside
// them, the table the helper processes record into and the trigger-filled
// logs of the offsets and sessions tables.
func instrument(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) {
	t.Helper()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true}, nil)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize("setup"))
	require.NoError(t, sub.Close())
	instrumentTables(t, pool, adapter)
}

// instrumentTables is instrument on pglease tables that exist already (of
// this release or an earlier one).
func instrumentTables(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables) {
	t.Helper()
	tbl := func(name string) string { return table(adapter, name) }
	ddl := []string{
		`CREATE TABLE ` + tbl(processedTable) + ` (
	id            bigserial PRIMARY KEY,
	proc          text NOT NULL,
	sub           int NOT NULL,
	pid           int NOT NULL,
	topic         text NOT NULL,
	uuid          text NOT NULL,
	received_at   timestamptz NOT NULL,
	recorded_at   timestamptz NOT NULL,
	owner_session uuid,
	owner_epoch   bigint
)`,
		`CREATE INDEX ON ` + tbl(processedTable) + ` (uuid)`,
		`CREATE TABLE ` + tbl(offsetsLogTable) + ` (
	id          bigserial PRIMARY KEY,
	at          timestamptz NOT NULL DEFAULT clock_timestamp(),
	op          text NOT NULL,
	topic       text NOT NULL,
	old_session uuid,
	new_session uuid,
	old_epoch   bigint,
	new_epoch   bigint,
	old_tx      text,
	old_offset  bigint,
	new_tx      text,
	new_offset  bigint
)`,
		`CREATE FUNCTION ` + tbl("test_log_offsets") + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO ` + tbl(offsetsLogTable) + ` (op, topic, new_session, new_epoch, new_tx, new_offset)
		VALUES ('INSERT', NEW.topic || CASE WHEN NEW.partition = 0 THEN '' ELSE '#' || NEW.partition END, NEW.session_id, NEW.epoch, NEW.acked_transaction_id::text, NEW.acked_offset);
	ELSE
		INSERT INTO ` + tbl(offsetsLogTable) + ` (op, topic, old_session, new_session, old_epoch, new_epoch,
			old_tx, old_offset, new_tx, new_offset)
		VALUES ('UPDATE', NEW.topic || CASE WHEN NEW.partition = 0 THEN '' ELSE '#' || NEW.partition END, OLD.session_id, NEW.session_id, OLD.epoch, NEW.epoch,
			OLD.acked_transaction_id::text, OLD.acked_offset, NEW.acked_transaction_id::text, NEW.acked_offset);
	END IF;
	RETURN NULL;
END $$`,
		`CREATE TRIGGER test_log_offsets AFTER INSERT OR UPDATE ON ` + tbl(pglease.DefaultConsumerOffsetsTable) +
			` FOR EACH ROW EXECUTE FUNCTION ` + tbl("test_log_offsets") + `()`,
		`CREATE TABLE ` + tbl(sessionsLogTable) + ` (
	id         bigserial PRIMARY KEY,
	at         timestamptz NOT NULL DEFAULT clock_timestamp(),
	op         text NOT NULL,
	session_id uuid NOT NULL,
	owner      text NOT NULL,
	expires_at timestamptz NOT NULL
)`,
		`CREATE FUNCTION ` + tbl("test_log_sessions") + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' THEN
		INSERT INTO ` + tbl(sessionsLogTable) + ` (op, session_id, owner, expires_at)
		VALUES ('DELETE', OLD.id, OLD.owner, OLD.expires_at);
	ELSE
		INSERT INTO ` + tbl(sessionsLogTable) + ` (op, session_id, owner, expires_at)
		VALUES (TG_OP, NEW.id, NEW.owner, NEW.expires_at);
	END IF;
	RETURN NULL;
END $$`,
		`CREATE TRIGGER test_log_sessions AFTER INSERT OR UPDATE OR DELETE ON ` + tbl(pglease.DefaultConsumerSessionsTable) +
			` FOR EACH ROW EXECUTE FUNCTION ` + tbl("test_log_sessions") + `()`,
	}
	for _, q := range ddl {
		_, err := pool.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
}

// recordSQL is the statement a helper process runs for each message it
// processes: besides who processed what and when, it stores the owner
// session and epoch of the claim row at that moment, as the database sees
// it.
func recordSQL(schema string) string {
	a := pglease.Tables{Schema: schema}
	return `INSERT INTO ` + table(a, processedTable) + `
	(proc, sub, pid, topic, uuid, received_at, recorded_at, owner_session, owner_epoch)
SELECT $1, $2, $3, $4, $5, $6, clock_timestamp(), o.session_id, o.epoch
FROM (VALUES (1)) v
LEFT JOIN ` + table(a, pglease.DefaultConsumerOffsetsTable) + ` o
	ON o.consumer_group = $7 AND o.topic = $8 AND o.partition = $9`
}

// streamName is how the history names the (topic, partition) row of a
// partition: the topic for partition 0, topic#p for the others. Order and
// ownership are judged per stream.
func streamName(topic string, partition int32) string {
	if partition == 0 {
		return topic
	}
	return fmt.Sprintf("%s#%d", topic, partition)
}

// streamSQL is streamName in SQL, over the columns topic and partition.
const streamSQL = `(topic || CASE WHEN partition = 0 THEN '' ELSE '#' || partition END)`

// ---------------------------------------------------------------- publishing

// publishAttempt is one Publish call of a stream and its outcome.
type publishAttempt struct {
	uuid  string
	topic string
	err   error
}

// stream publishes one message per Publish call until stopped, to one
// topic or to several in turn, remembering the outcome of every call.
type stream struct {
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}

	mu       sync.Mutex
	attempts []publishAttempt
}

// startStream publishes to topic every interval until stop is called (or
// the test ends).
func startStream(t *testing.T, pub *pglease.Publisher, topic string, every time.Duration) *stream {
	t.Helper()
	return startRoundRobin(t, pub, []string{topic}, every)
}

// startRoundRobin publishes to topics in turn, one message every interval,
// until stop is called (or the test ends).
func startRoundRobin(t *testing.T, pub *pglease.Publisher, topics []string, every time.Duration) *stream {
	t.Helper()
	s := &stream{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for seq := 0; ; seq++ {
			topic := topics[seq%len(topics)]
			msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(seq)))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			msg.SetContext(ctx)
			err := pub.Publish(topic, msg)
			cancel()
			s.mu.Lock()
			s.attempts = append(s.attempts, publishAttempt{uuid: msg.UUID, topic: topic, err: err})
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	t.Cleanup(s.halt)
	return s
}

// halt stops publishing and waits for the call under way. It is safe to
// call more than once.
func (s *stream) halt() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

func (s *stream) results() []publishAttempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]publishAttempt(nil), s.attempts...)
}

// publishHeld publishes one message that the helper process named proc
// holds (records, but does not ack) until it is told "go". Other processes
// handle it like any other.
func publishHeld(t *testing.T, pub *pglease.Publisher, topic, proc string) string {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte("held"))
	msg.Metadata.Set(holdMetadata, proc)
	require.NoError(t, pub.Publish(topic, msg))
	return msg.UUID
}

// ------------------------------------------------------------------ waiting

// waitProcessed waits until every message stored for topics has been
// processed at least once. Query errors (during a restart) count as "not
// yet".
func waitProcessed(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, topics []string, timeout time.Duration) {
	t.Helper()
	waitDrained(t, pool, adapter, topics, timeout, timeout)
}

// waitDrained waits until every message stored on topics has been
// processed, failing when the number left has not gone down for stall or
// when limit has passed. A drain is a liveness check, not a speed target:
// where the consumers are slow (race detector, a saturated machine) it may
// take long, but a message that is never delivered stops its progress.
//
// The check reads every stored message: on a large run it takes a good
// part of a second of a core, so polling it every few milliseconds would
// take a core from the consumers it waits for. Between two checks it
// waits three times as long as the last one took (at least 5 ms): the
// check costs at most a quarter of a core.
func waitDrained(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, topics []string, stall, limit time.Duration) {
	t.Helper()
	began := time.Now()
	progressed := began
	best := -1
	var err error
	for {
		checked := time.Now()
		var left int
		left, err = countUnprocessed(pool, adapter, topics)
		if err == nil {
			if left == 0 {
				return
			}
			if best < 0 || left < best {
				best, progressed = left, time.Now()
			}
		}
		switch {
		case time.Since(progressed) > stall:
			t.Fatalf("waiting for every stored message to be processed: %d left, none processed for %s (last error: %v)",
				best, stall, err)
		case time.Since(began) > limit:
			t.Fatalf("timed out after %s waiting for every stored message to be processed: %d left (last error: %v)",
				limit, best, err)
		}
		time.Sleep(max(5*time.Millisecond, 3*time.Since(checked)))
	}
}

// countUnprocessed returns how many messages stored on topics have not
// been processed.
func countUnprocessed(pool *pgxpool.Pool, adapter pglease.Tables, topics []string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, pglease.DefaultMessagesTable)+` m
WHERE m.topic = ANY($1) AND NOT EXISTS (SELECT 1 FROM `+table(adapter, processedTable)+` p WHERE p.uuid = m.uuid)`,
		topics).Scan(&n)
	return n, err
}

// countProcessed returns how many messages proc processed after since.
func countProcessed(pool *pgxpool.Pool, adapter pglease.Tables, proc string, since time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, processedTable)+
		` WHERE proc = $1 AND received_at > $2`, proc, since).Scan(&n)
	return n, err
}

// waitProgress waits until proc processed at least n messages after since.
func waitProgress(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, proc string, since time.Time, n int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%s to process %d messages", proc, n), func() bool {
		got, err := countProcessed(pool, adapter, proc, since)
		return err == nil && got >= n
	})
}

// ownerPID returns the process id in the owner column of the session that
// owns (group, topic), or 0 when the topic is free or has no row yet.
func ownerPID(pool *pgxpool.Pool, adapter pglease.Tables, group, topic string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var owner string
	err := pool.QueryRow(ctx, `SELECT s.owner FROM `+table(adapter, pglease.DefaultConsumerOffsetsTable)+` o
JOIN `+table(adapter, pglease.DefaultConsumerSessionsTable)+` s ON s.id = o.session_id
WHERE o.consumer_group = $1 AND o.topic = $2`, group, topic).Scan(&owner)
	if err != nil {
		return 0
	}
	return pidOfOwner(owner)
}

// pidOfOwner parses the "host/pid" owner column of a session.
func pidOfOwner(owner string) int {
	i := strings.LastIndexByte(owner, '/')
	pid, err := strconv.Atoi(owner[i+1:])
	if err != nil {
		return 0
	}
	return pid
}

// sessionOpenedAfter reports whether a session of the process pid was
// created after since.
func sessionOpenedAfter(pool *pgxpool.Pool, adapter pglease.Tables, pid int, since time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table(adapter, sessionsLogTable)+
		` WHERE op = 'INSERT' AND owner LIKE '%/' || $1::text AND at > $2`, strconv.Itoa(pid), since).Scan(&n)
	return err == nil && n > 0
}

// ------------------------------------------------------------------ history

// storedMsg is one row of the messages table.
type storedMsg struct {
	uuid string
	pos  pglease.Position
}

// processed is one row of processedTable.
type processed struct {
	id           int64
	proc         string
	sub          int
	pid          int
	topic        string
	uuid         string
	received     time.Time
	recorded     time.Time
	ownerSession *uuid.UUID
	ownerEpoch   *int64
	idx          int // position of uuid in its topic's delivery order
}

// deliverer names one Subscriber of one process.
func (p processed) deliverer() string { return fmt.Sprintf("%s/%d", p.proc, p.sub) }

// offsetChange is one row of offsetsLogTable.
type offsetChange struct {
	id                     int64
	at                     time.Time
	op                     string
	topic                  string
	oldSession, newSession *uuid.UUID
	oldEpoch, newEpoch     int64
	oldPos, newPos         pglease.Position
}

// isClaim reports whether the change is a claim: a new epoch with an owner.
func (c offsetChange) isClaim() bool {
	return c.op == "UPDATE" && c.newEpoch > c.oldEpoch && c.newSession != nil
}

// isRelease reports whether the change freed the claim.
func (c offsetChange) isRelease() bool {
	return c.op == "UPDATE" && c.oldSession != nil && c.newSession == nil
}

// sessionChange is one row of sessionsLogTable.
type sessionChange struct {
	at      time.Time
	op      string
	id      uuid.UUID
	pid     int
	expires time.Time
}

// claimInfo is one claim of a topic, from the offsets log.
type claimInfo struct {
	offsetChange
	startIdx int // index of the first message the new owner is to deliver
	pid      int // process of the claiming session
}

// history is everything recorded in one test's schema.
type history struct {
	group    string
	messages map[string][]storedMsg // topic -> messages in delivery order
	where    map[string]msgRef      // uuid -> place
	records  []processed            // by id
	offsets  []offsetChange         // by id
	sessions []sessionChange        // by id
	pids     map[uuid.UUID]int      // session -> process
	claims   map[string][]claimInfo // topic -> claims in order
}

type msgRef struct {
	topic string
	idx   int
}

func posLess(a, b pglease.Position) bool {
	if a.TransactionID != b.TransactionID {
		return a.TransactionID < b.TransactionID
	}
	return a.Offset < b.Offset
}

// loadHistory reads the run back. The pool may have been through a
// restart: it is reset first.
func loadHistory(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group string) *history {
	t.Helper()
	pool.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &history{
		group:    group,
		messages: map[string][]storedMsg{},
		where:    map[string]msgRef{},
		pids:     map[uuid.UUID]int{},
		claims:   map[string][]claimInfo{},
	}

	rows, err := pool.Query(ctx, `SELECT `+streamSQL+`, uuid, transaction_id::text AS tx_text, "offset"
FROM `+table(adapter, pglease.DefaultMessagesTable)+` m
ORDER BY m.topic, m.partition, m.transaction_id, m."offset"`)
	require.NoError(t, err)
	for rows.Next() {
		var (
			topic, id, tx string
			off           int64
		)
		require.NoError(t, rows.Scan(&topic, &id, &tx, &off))
		_, dup := h.where[id]
		require.False(t, dup, "message %s stored twice", id)
		h.where[id] = msgRef{topic: topic, idx: len(h.messages[topic])}
		h.messages[topic] = append(h.messages[topic], storedMsg{uuid: id, pos: parsePos(tx, off)})
	}
	require.NoError(t, rows.Err())

	rows, err = pool.Query(ctx, `SELECT at, op, session_id, owner, expires_at FROM `+table(adapter, sessionsLogTable)+` ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var (
			c     sessionChange
			owner string
		)
		require.NoError(t, rows.Scan(&c.at, &c.op, &c.id, &owner, &c.expires))
		c.pid = pidOfOwner(owner)
		h.pids[c.id] = c.pid
		h.sessions = append(h.sessions, c)
	}
	require.NoError(t, rows.Err())

	rows, err = pool.Query(ctx, `SELECT id, at, op, topic, old_session, new_session,
	COALESCE(old_epoch, 0), new_epoch, COALESCE(old_tx, '0'), COALESCE(old_offset, 0), new_tx, new_offset
FROM `+table(adapter, offsetsLogTable)+` ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var (
			c            offsetChange
			oldTx, newTx string
			oldOff, nOff int64
		)
		require.NoError(t, rows.Scan(&c.id, &c.at, &c.op, &c.topic, &c.oldSession, &c.newSession,
			&c.oldEpoch, &c.newEpoch, &oldTx, &oldOff, &newTx, &nOff))
		c.oldPos, c.newPos = parsePos(oldTx, oldOff), parsePos(newTx, nOff)
		h.offsets = append(h.offsets, c)
		if c.isClaim() {
			h.claims[c.topic] = append(h.claims[c.topic], claimInfo{
				offsetChange: c,
				startIdx:     h.startIndex(c.topic, c.newPos),
				pid:          h.pids[*c.newSession],
			})
		}
	}
	require.NoError(t, rows.Err())

	rows, err = pool.Query(ctx, `SELECT id, proc, sub, pid, topic, uuid, received_at, recorded_at, owner_session, owner_epoch
FROM `+table(adapter, processedTable)+` ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var p processed
		require.NoError(t, rows.Scan(&p.id, &p.proc, &p.sub, &p.pid, &p.topic, &p.uuid, &p.received, &p.recorded,
			&p.ownerSession, &p.ownerEpoch))
		ref, ok := h.where[p.uuid]
		require.True(t, ok, "processed message %s was never stored", p.uuid)
		require.Equal(t, ref.topic, p.topic, "message %s processed on the wrong topic", p.uuid)
		p.idx = ref.idx
		h.records = append(h.records, p)
	}
	require.NoError(t, rows.Err())
	return h
}

// startIndex is the index of the first message of topic after pos.
func (h *history) startIndex(topic string, pos pglease.Position) int {
	msgs := h.messages[topic]
	return sort.Search(len(msgs), func(i int) bool { return posLess(pos, msgs[i].pos) })
}

// recordsOf returns the records of proc, in processing order.
func (h *history) recordsOf(proc string) []processed {
	var out []processed
	for _, r := range h.records {
		if r.proc == proc {
			out = append(out, r)
		}
	}
	return out
}

// claimsBy returns the claims of topic made by sessions of the process pid.
func (h *history) claimsBy(topic string, pid int) []claimInfo {
	var out []claimInfo
	for _, c := range h.claims[topic] {
		if c.pid == pid {
			out = append(out, c)
		}
	}
	return out
}

// firstClaimAfter returns the first claim of topic by the process pid made
// after since.
func (h *history) firstClaimAfter(t *testing.T, topic string, pid int, since time.Time) claimInfo {
	t.Helper()
	for _, c := range h.claimsBy(topic, pid) {
		if c.at.After(since) {
			return c
		}
	}
	t.Fatalf("no claim of topic %q by process %d after %s", topic, pid, since.Format(time.RFC3339Nano))
	return claimInfo{}
}

// releasesBy returns the releases of topic by sessions of the process pid.
func (h *history) releasesBy(topic string, pid int) []offsetChange {
	var out []offsetChange
	for _, c := range h.offsets {
		if c.topic == topic && c.isRelease() && h.pids[*c.oldSession] == pid {
			out = append(out, c)
		}
	}
	return out
}

// counts returns how many times each message was processed.
func (h *history) counts() map[string]int {
	n := map[string]int{}
	for _, r := range h.records {
		n[r.uuid]++
	}
	return n
}

// duplicates returns the messages processed more than once.
func (h *history) duplicates() []string {
	var out []string
	for id, n := range h.counts() {
		if n > 1 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// verifySummary is what verify measured.
type verifySummary struct {
	messages   int
	records    int
	duplicates int
	claims     int
}

// verify checks the guarantees that hold in every run, whatever the faults:
//
//   - every stored message of topics was processed (no loss);
//   - no acknowledged position ever moved backwards;
//   - a claim took a topic from another session only once that session had
//     expired or was gone (as the database saw it, from the logs);
//   - every record was made while the claim row named a session of the
//     recording process, and the records made under one claim (epoch) come
//     from one Subscriber, start with the first message after the position
//     the claim started from, and go on in order (a message may repeat, as
//     after a failed record, but nothing is skipped);
//   - the first processing of the messages of a topic follows their order;
//   - the processing intervals of two Subscribers on one topic never
//     overlap: at any moment a topic has at most one deliverer.
func (h *history) verify(t *testing.T, topics []string) verifySummary {
	t.Helper()
	var sum verifySummary
	counts := h.counts()
	for _, topic := range topics {
		msgs := h.messages[topic]
		require.NotEmpty(t, msgs, "no messages stored for topic %q", topic)
		sum.messages += len(msgs)
		var lost []string
		for _, m := range msgs {
			if counts[m.uuid] == 0 {
				lost = append(lost, m.uuid)
			}
		}
		assert.Empty(t, lost, "topic %q: %d of %d stored messages were never processed", topic, len(lost), len(msgs))
	}
	for _, n := range counts {
		sum.records += n
		if n > 1 {
			sum.duplicates++
		}
	}

	h.verifyOffsets(t)
	h.verifyClaims(t)
	for _, topic := range topics {
		sum.claims += len(h.claims[topic])
		h.verifyTopicRecords(t, topic)
	}
	return sum
}

// verifyOffsets: acknowledged positions and epochs never go down, neither
// within one update nor from one logged change of a row to the next.
func (h *history) verifyOffsets(t *testing.T) {
	t.Helper()
	last := map[string]offsetChange{}
	for _, c := range h.offsets {
		if c.op == "UPDATE" {
			assert.False(t, posLess(c.newPos, c.oldPos),
				"topic %q: acknowledged position moved backwards from %+v to %+v (log id %d)", c.topic, c.oldPos, c.newPos, c.id)
			assert.GreaterOrEqual(t, c.newEpoch, c.oldEpoch, "topic %q: epoch went down (log id %d)", c.topic, c.id)
		}
		if prev, ok := last[c.topic]; ok {
			assert.False(t, posLess(c.newPos, prev.newPos),
				"topic %q: acknowledged position moved backwards between log ids %d and %d", c.topic, prev.id, c.id)
		}
		last[c.topic] = c
	}
}

// verifyClaims: a claim took a row from another session only when that
// session had expired or was deleted.
func (h *history) verifyClaims(t *testing.T) {
	t.Helper()
	for _, cs := range h.claims {
		for _, c := range cs {
			if c.oldSession == nil || *c.oldSession == *c.newSession {
				continue
			}
			var state *sessionChange
			for i := range h.sessions {
				s := &h.sessions[i]
				if s.id == *c.oldSession && !s.at.After(c.at) {
					state = s
				}
			}
			if state == nil || state.op == "DELETE" {
				continue
			}
			assert.True(t, state.expires.Before(c.at),
				"topic %q: claimed at %s by session %s (pid %d) from session %s (pid %d), which was valid until %s",
				c.topic, c.at.Format(time.RFC3339Nano), c.newSession, c.pid, c.oldSession, h.pids[*c.oldSession],
				state.expires.Format(time.RFC3339Nano))
		}
	}
}

func (h *history) verifyTopicRecords(t *testing.T, topic string) {
	t.Helper()
	claims := map[int64]claimInfo{}
	for _, c := range h.claims[topic] {
		claims[c.newEpoch] = c
	}
	byEpoch := map[int64][]processed{}
	var epochs []int64
	seen := map[string]bool{}
	next := 0 // index of the next message to be processed for the first time
	var recs []processed
	for _, r := range h.records {
		if r.topic != topic {
			continue
		}
		recs = append(recs, r)
		if !seen[r.uuid] {
			seen[r.uuid] = true
			assert.Equal(t, next, r.idx, "topic %q: message %d (%s) was first processed before message %d (by %s, record %d)",
				topic, r.idx, r.uuid, next, r.deliverer(), r.id)
			next = max(next, r.idx) + 1
		}
		if r.ownerSession == nil || r.ownerEpoch == nil {
			assert.Fail(t, "processed while the topic was free",
				"topic %q: record %d of %s by %s made while the claim row had no owner", topic, r.id, r.uuid, r.deliverer())
			continue
		}
		if pid := h.pids[*r.ownerSession]; pid != r.pid {
			assert.Fail(t, "processed by a process that did not own the topic",
				"topic %q: record %d of %s by %s (pid %d) made while session %s of pid %d owned the topic (epoch %d)",
				topic, r.id, r.uuid, r.deliverer(), r.pid, r.ownerSession, pid, *r.ownerEpoch)
		}
		if _, ok := byEpoch[*r.ownerEpoch]; !ok {
			epochs = append(epochs, *r.ownerEpoch)
		}
		byEpoch[*r.ownerEpoch] = append(byEpoch[*r.ownerEpoch], r)
	}
	for _, e := range epochs {
		rs := byEpoch[e]
		c, ok := claims[e]
		if !assert.True(t, ok, "topic %q: records under epoch %d, which no claim in the log made", topic, e) {
			continue
		}
		assert.Equal(t, c.startIdx, rs[0].idx,
			"topic %q epoch %d: the claim started after message %d, but its first record is message %d (%s by %s)",
			topic, e, c.startIdx, rs[0].idx, rs[0].uuid, rs[0].deliverer())
		for i := 1; i < len(rs); i++ {
			assert.Equal(t, rs[0].deliverer(), rs[i].deliverer(),
				"topic %q epoch %d: two Subscribers processed under one claim (records %d and %d)", topic, e, rs[0].id, rs[i].id)
			if d := rs[i].idx - rs[i-1].idx; d != 0 && d != 1 {
				assert.Fail(t, "out of order within a claim",
					"topic %q epoch %d: %s processed message %d after message %d (records %d, %d)",
					topic, e, rs[i].deliverer(), rs[i].idx, rs[i-1].idx, rs[i-1].id, rs[i].id)
			}
		}
	}

	// At most one deliverer at any moment: sweep the intervals by start,
	// keeping those that have not ended yet.
	sort.Slice(recs, func(i, j int) bool { return recs[i].received.Before(recs[j].received) })
	var active []processed
	for _, r := range recs {
		kept := active[:0]
		for _, p := range active {
			if p.recorded.After(r.received) {
				kept = append(kept, p)
			}
		}
		active = kept
		for _, p := range active {
			if p.deliverer() != r.deliverer() {
				assert.Fail(t, "two deliverers at once",
					"topic %q: %s processed %s from %s to %s while %s processed %s from %s to %s",
					topic, p.deliverer(), p.uuid, p.received.Format("15:04:05.000000"), p.recorded.Format("15:04:05.000000"),
					r.deliverer(), r.uuid, r.received.Format("15:04:05.000000"), r.recorded.Format("15:04:05.000000"))
			}
		}
		active = append(active, r)
	}
}

// verifyPublishes checks that every Publish that returned nil stored its
// message, and returns how many calls failed and how many of those stored
// their message anyway (their commit went through but its reply was lost).
func (h *history) verifyPublishes(t *testing.T, attempts []publishAttempt) (failed, failedButStored int) {
	t.Helper()
	for _, a := range attempts {
		_, stored := h.where[a.uuid]
		if a.err == nil {
			assert.True(t, stored, "Publish of %s returned nil but the message is not stored", a.uuid)
			continue
		}
		failed++
		if stored {
			failedButStored++
		}
	}
	return failed, failedButStored
}
