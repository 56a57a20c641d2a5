package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// The in-flight window's eviction under the failure policy: with
// MaxInFlight 2 and BatchSize 4 the window holds at most 8 messages not
// acknowledged, and the failing key's backlog (11 messages behind it) is
// larger.
const (
	evictInFlight = 2
	evictBatch    = 4
	evictBacklog  = 11
)

// evictWorkload publishes p1, then p2 to p12 of the same key, then q1 to
// q3 of another key, one transaction each; it returns the payloads of
// the failing key's backlog and of the other key.
func evictWorkload(t *testing.T, pub *pglease.Publisher, topic, first string) (backlog, others []string) {
	t.Helper()
	keys := map[string]string{first: "p"}
	payloads := []string{first}
	for i := range evictBacklog {
		p := "p" + strconv.Itoa(i+2)
		keys[p] = "p"
		backlog = append(backlog, p)
	}
	for i := range 3 {
		q := "q" + strconv.Itoa(i+1)
		keys[q] = "q"
		others = append(others, q)
	}
	payloads = append(payloads, backlog...)
	payloads = append(payloads, others...)
	publishPayloads(t, pub, topic, keys, payloads...)
	return backlog, others
}

// TestRetryWindowEvictsAWaitingKeysBacklog: p1 fails its first attempt
// and waits 2 s for its second, which succeeds. Its key's later messages
// fill the in-flight window (8 not acknowledged): they are evicted, and
// the other key's messages, read only after them, are delivered while p1
// waits (before eviction the window read nothing more until p1 was
// acknowledged). After p1's Ack its key's messages are read again by
// their positions and delivered in order, each once, as attempt 1: an
// evicted message is not counted as handed out.
func TestRetryWindowEvictsAWaitingKeysBacklog(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	pub := newPublisher(t, pool, tables)
	backlog, others := evictWorkload(t, pub, "in", "p1")
	retry := pglease.RetryConfig{MaxAttempts: 3, MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second, Jitter: -1,
		DeadLetterTopic: "in.dead"}
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry, MaxInFlight: evictInFlight,
		BatchSize: evictBatch})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	failed := false
	got := consumeRetrying(t, msgs, func(p string) bool {
		if p == "p1" && !failed {
			failed = true
			return true
		}
		return false
	}, errors.New("once"), func(got []handout) bool {
		return indexOf(got, backlog[len(backlog)-1], 0) >= 0 && indexOf(got, others[len(others)-1], 0) >= 0
	})

	require.Equal(t, 2, countOf(got, "p1"), "p1's hand-outs: %+v", got)
	retried := indexOf(got, "p1", 1)
	require.Equal(t, "2", got[retried].attempt)
	for _, q := range others {
		require.Equal(t, 1, countOf(got, q), "%s's hand-outs", q)
		require.Less(t, indexOf(got, q, 0), retried, "%s waited for p1's retry: the window did not read past p1's key: %+v", q, got)
	}
	last := retried
	for _, p := range backlog {
		i := indexOf(got, p, 0)
		require.Equal(t, 1, countOf(got, p), "%s's hand-outs", p)
		require.Greater(t, i, last, "%s out of its key's order: %+v", p, got)
		require.Equal(t, "1", got[i].attempt, "%s's attempt: evicted and read again, never handed out before", p)
		last = i
	}
	require.Greater(t, pglease.Evicted(sub), uint64(0), "nothing evicted")
	require.Greater(t, pglease.Rereads(sub), uint64(0), "nothing read again")
	waitFor(t, 10*time.Second, "the group's position past every message", func() bool {
		return ackedOffset(t, pool, tables, "", "in") == lastPosition(got)
	})
	require.Equal(t, 0, topicCount(t, pool, tables, "in.dead"))
}

// TestRetryWindowEvictsUntilTheMove: p1 always fails; its key's backlog is
// evicted while it waits, the other key goes on, and after p1's last
// attempt and its move to the dead-letter topic its key's messages are
// read again and delivered in order, each once, as attempt 1. The
// group's position never passes a message evicted and not delivered: it
// stays at p1's predecessor until the move, with q1 to q3 acknowledged
// above.
func TestRetryWindowEvictsUntilTheMove(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	retryWindowEvictsUntilTheMove(t, pool, tables, newPublisher(t, pool, tables))
}

// TestCitusRetryWindowEvicts is TestRetryWindowEvictsUntilTheMove on
// Citus: the evicted messages are read again on the topic's worker.
func TestCitusRetryWindowEvicts(t *testing.T) {
	pool, tables := citusSchema(t, 10)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables}, nil)
	require.NoError(t, err)
	defer pub.Close()
	retryWindowEvictsUntilTheMove(t, pool, tables, pub)
}

func retryWindowEvictsUntilTheMove(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, pub *pglease.Publisher) {
	ctx := context.Background()
	backlog, others := evictWorkload(t, pub, "in", "p1")
	retry := pglease.RetryConfig{MaxAttempts: 2, MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second, Jitter: -1,
		DeadLetterTopic: "in.dead"}
	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry, MaxInFlight: evictInFlight,
		BatchSize: evictBatch, CommitBatch: 1})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	var (
		atOthers pglease.Position
		checked  bool
	)
	got := consumeRetrying(t, msgs, func(p string) bool { return p == "p1" }, errors.New("poison"),
		func(got []handout) bool {
			if !checked && indexOf(got, others[len(others)-1], 0) >= 0 {
				checked = true
				// Every other key's message acked, p1 waiting: the
				// committed position is still before p1.
				atOthers = ackedOffset(t, pool, tables, "", "in")
			}
			return indexOf(got, backlog[len(backlog)-1], 0) >= 0
		})
	require.True(t, checked)
	require.Equal(t, pglease.Position{}, atOthers, "the group's position passed p1 or its evicted key")
	require.Equal(t, 2, countOf(got, "p1"))
	moved := indexOf(got, "p1", 1)
	for _, q := range others {
		require.Less(t, indexOf(got, q, 0), moved, "%s waited for p1", q)
	}
	last := moved
	for _, p := range backlog {
		i := indexOf(got, p, 0)
		require.Equal(t, 1, countOf(got, p), "%s's hand-outs", p)
		require.Greater(t, i, last, "%s out of its key's order: %+v", p, got)
		require.Equal(t, "1", got[i].attempt, "%s's attempt", p)
		last = i
	}
	waitFor(t, 10*time.Second, "p1 in the dead-letter topic", func() bool { return sub.Stats().DeadLettered == 1 })
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"))
	waitFor(t, 10*time.Second, "the group's position past every message", func() bool {
		return ackedOffset(t, pool, tables, "", "in") == lastPosition(got)
	})
}

// TestRetryWindowEvictedSurviveACrash: a process holds the row while its
// failing message waits for its next attempt and that key's backlog is
// evicted (the other key's messages are processed, which they are only
// once the backlog is evicted); it is killed with SIGKILL. The next
// owner delivers the waiting message as its next attempt and every
// evicted message, in order, once each, numbered by the rules of the
// hand-out mark (2 for a message at or before the row's mark, which the
// dead owner may have handed out; 1 after it): an evicted message is
// neither lost nor counted twice. The other key's messages, acknowledged
// above the unacknowledged head and never committed, are delivered once
// more (at least once, as after any crash).
func TestRetryWindowEvictedSurviveACrash(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	instrument(t, pool, tables)
	pub := newPublisher(t, pool, tables)
	backlog, others := evictWorkload(t, pub, "in", "poison")
	retry := pglease.RetryConfig{MaxAttempts: 3, MinBackoff: time.Minute, MaxBackoff: time.Minute, Jitter: -1,
		DeadLetterTopic: "in.dead"}
	h := startHelper(t, helperConfig{Name: "evict", Schema: tables.Schema, Topics: []string{"in"}, Mode: modeRetry,
		SessionTTL: time.Second, PollInterval: 50 * time.Millisecond, MaxInFlight: evictInFlight, BatchSize: evictBatch,
		Retry: retry})
	deadline := time.After(30 * time.Second)
	for out := false; !out; {
		select {
		case line, ok := <-h.lines:
			require.True(t, ok, "the helper exited")
			f := strings.Fields(line)
			out = len(f) == 3 && f[0] == "out" && f[2] == "1"
		case <-deadline:
			t.Fatal("the poison message not handed out within 30s")
		}
	}
	processed := func(payloads []string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT p.uuid) FROM `+table(tables, processedTable)+` p
JOIN `+table(tables, pglease.DefaultMessagesTable)+` m ON m.uuid = p.uuid WHERE convert_from(m.payload, 'UTF8') = ANY($1)`,
			payloads).Scan(&n))
		return n
	}
	waitFor(t, 30*time.Second, "the other key processed while the poison message waits", func() bool {
		return processed(others) == len(others)
	})
	require.Equal(t, 0, processed(backlog), "the failing key's backlog processed while its first message waits")
	h.signal(t, syscall.SIGKILL)
	<-h.exited

	// The row as the dead owner left it: the entry of the waiting
	// message (its next attempt a minute away: made due now, so that the
	// test need not wait) and the hand-out mark.
	var pos pglease.Position
	require.NoError(t, pool.QueryRow(ctx, `SELECT transaction_id::text::int8, "offset" FROM `+
		table(tables, pglease.DefaultMessagesTable)+` WHERE topic = 'in' AND payload = 'poison'`).Scan(&pos.TransactionID, &pos.Offset))
	attempts, _, ok := waitingEntry(t, pool, tables, "", "in", pos)
	require.True(t, ok, "no waiting entry for the poison message")
	require.Equal(t, 1, attempts)
	key := strconv.FormatUint(pos.TransactionID, 10) + ":" + strconv.FormatInt(pos.Offset, 10)
	offsets := table(tables, pglease.DefaultConsumerOffsetsTable)
	_, err := pool.Exec(ctx, `UPDATE `+offsets+` SET waiting = jsonb_set(waiting, ARRAY[$1, 'n'],
	to_jsonb((extract(epoch FROM clock_timestamp()) * 1000)::int8)) WHERE consumer_group = '' AND topic = 'in'`, key)
	require.NoError(t, err)
	var mark *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT handed_out FROM `+offsets+` WHERE consumer_group = '' AND topic = 'in'`).Scan(&mark))
	require.NotNil(t, mark, "no hand-out mark")
	var markPos pglease.Position
	_, err = fmt.Sscanf(*mark, "%d:%d", &markPos.TransactionID, &markPos.Offset)
	require.NoError(t, err)
	before := func(a, b pglease.Position) bool {
		return a.TransactionID < b.TransactionID || a.TransactionID == b.TransactionID && a.Offset <= b.Offset
	}

	sub := newTestSubscriber(t, pool, tables, pglease.SubscriberConfig{Retry: retry, MaxInFlight: evictInFlight,
		BatchSize: evictBatch})
	msgs, err := sub.Subscribe(ctx, "in")
	require.NoError(t, err)
	all := slices.Concat(backlog, others)
	got := consumeRetrying(t, msgs, func(string) bool { return false }, nil, func(got []handout) bool {
		for _, p := range all {
			if indexOf(got, p, 0) < 0 {
				return false
			}
		}
		return indexOf(got, "poison", 0) >= 0
	})
	first := indexOf(got, "poison", 0)
	require.Equal(t, "2", got[first].attempt, "the waiting message's attempt after the one counted")
	last := first
	for _, p := range backlog {
		i := indexOf(got, p, 0)
		require.Equal(t, 1, countOf(got, p), "%s's hand-outs", p)
		require.Greater(t, i, last, "%s out of its key's order: %+v", p, got)
		want := "1"
		if before(got[i].pos, markPos) {
			want = "2"
		}
		require.Equal(t, want, got[i].attempt, "%s's attempt (at %v, the mark at %v)", p, got[i].pos, markPos)
		last = i
	}
	for _, q := range others {
		require.Equal(t, 1, countOf(got, q), "%s's hand-outs by the new owner", q)
	}
	require.Equal(t, 0, topicCount(t, pool, tables, "in.dead"))
}

// lastPosition is the highest position of got.
func lastPosition(got []handout) pglease.Position {
	var last pglease.Position
	for _, h := range got {
		if h.pos.TransactionID > last.TransactionID || h.pos.TransactionID == last.TransactionID && h.pos.Offset > last.Offset {
			last = h.pos
		}
	}
	return last
}
