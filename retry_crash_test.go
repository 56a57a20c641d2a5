package pglease_test

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// retryCrashStep is a step of an attempt, or of the dead-letter move, at
// which TestRetryCrashAtEveryStep kills the process that has the poison
// message there, and the hand-outs the message gets in all (their
// attempt numbers, in order) when the first two processes are killed
// there and the third runs to the end, with MaxAttempts 3.
type retryCrashStep struct {
	step string
	want []string
	// maxAttempts, kills and deadAttempts, when set, replace MaxAttempts
	// 3, the two processes killed and the attempts the dead-letter copy
	// counts (MaxAttempts).
	maxAttempts, kills, deadAttempts int
}

func (s retryCrashStep) name() string {
	if s.maxAttempts == 0 {
		return s.step
	}
	return s.step + "-max" + strconv.Itoa(s.maxAttempts)
}

// retryCrashSteps are every step of an attempt and of the move.
//
// The poison message is never the first unacknowledged message of its row
// (the Acks before it are not committed: CommitInterval is long), so the
// delivery count of the claims never sees it: its hand-outs are counted
// by the row's hand-out mark (written before the first message of a read
// goes out, covering the read) and by its waiting entry (written before a
// retry goes out). A kill after its hand-out is counted and before its
// handler holds it costs it that hand-out (the stated allowance): at
// "pick" the first process had marked the whole read when the message
// before it went out, so the second numbers it 2, and, killed at "pick"
// too before writing its entry, leaves it to the third as 2 again; at
// "counted" each kill comes after the count, 1 then 2.
var retryCrashSteps = []retryCrashStep{
	{step: pglease.FailureStepPick, want: []string{"2", "3"}},
	{step: pglease.FailureStepCounted, want: []string{"3"}},
	{step: hangHandler, want: []string{"1", "2", "3"}},
	{step: pglease.FailureStepNacked, want: []string{"1", "2", "3"}},
	{step: pglease.FailureStepRecorded, want: []string{"1", "2", "3"}},
	{step: hangMove, want: []string{"1", "2", "3"}},
	// With MaxAttempts 1, a message that only the mark counts goes out
	// again rather than moving to the dead-letter topic unseen (its owner
	// may have died before handing it out): at most one hand-out more,
	// counted in the copy.
	{step: pglease.FailureStepPick, want: []string{"2"}, maxAttempts: 1, kills: 1, deadAttempts: 2},
}

// TestRetryCrashAtEveryStep: a message that always fails, behind other
// messages of its row, with its process killed with SIGKILL at one step of
// its attempts (or of its dead-letter move) twice, and a third process
// that runs to the end: the message is handed out MaxAttempts times less
// the hand-outs counted and not made (the stated allowance), numbered in
// order, and lands in the dead-letter topic exactly once with MaxAttempts
// counted; every other message is processed, each process processes each
// key in order, and the later message of the poison message's key only
// after the move. `make stress` repeats it (TestStressRetryCrash).
func TestRetryCrashAtEveryStep(t *testing.T) {
	parallel(t)
	for _, s := range retryCrashSteps {
		t.Run(s.name(), func(t *testing.T) { runRetryCrash(t, s) })
	}
}

// retryCrashPayloads are the messages of a run, in publish order, and
// retryCrashKeys their ordering keys: the poison message is the second of
// its row.
var (
	retryCrashPayloads = []string{"a1", "poison", "b1", "a2", "after", "b2", "a3"}
	retryCrashKeys     = map[string]string{"a1": "a", "a2": "a", "a3": "a", "poison": "p", "after": "p", "b1": "b", "b2": "b"}
)

func runRetryCrash(t *testing.T, s retryCrashStep) {
	maxAttempts, kills := cmp.Or(s.maxAttempts, 3), cmp.Or(s.kills, 2)
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	instrument(t, pool, tables)
	pub := newPublisher(t, pool, tables)
	ids := publishPayloads(t, pub, "in", retryCrashKeys, retryCrashPayloads...)
	poison := ids[1]
	cfg := helperConfig{Schema: tables.Schema, Topics: []string{"in"}, Mode: modeRetry,
		SessionTTL: time.Second, PollInterval: 50 * time.Millisecond, HangAt: s.step, CommitInterval: time.Hour,
		Retry: pglease.RetryConfig{MaxAttempts: maxAttempts, MinBackoff: 10 * time.Millisecond,
			MaxBackoff: 20 * time.Millisecond, DeadLetterTopic: "in.dead"}}
	var out []string // the poison message's attempts, as handed out
	collect := func(line string) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "out" {
			require.Equal(t, poison, f[1])
			out = append(out, f[2])
		}
	}
	marker := "at " + s.step + " "
	switch s.step {
	case hangHandler:
		marker = "out "
	case hangMove:
		marker = "moving"
	}
	var killed []string
	for run := range kills {
		name := "k" + string(rune('a'+run))
		h := startHelper(t, cfg.named(name))
		deadline := time.After(30 * time.Second)
		for reached := false; !reached; {
			select {
			case line, ok := <-h.lines:
				require.True(t, ok, "process %s exited; log:\n%s", name, tail(h.stderr.String(), 50))
				collect(line)
				reached = strings.HasPrefix(line, marker)
			case <-deadline:
				t.Fatalf("process %s did not reach %q; hand-outs so far %v", name, s.step, out)
			}
		}
		h.signal(t, syscall.SIGKILL)
		<-h.exited
		for line := range h.lines {
			collect(line)
		}
		killed = append(killed, name)
		require.Equal(t, 0, topicCount(t, pool, tables, "in.dead"), "a dead-letter copy from a killed process")
	}

	cfg.HangAt = ""
	last := startHelper(t, cfg.named("last"))
	waitFor(t, 30*time.Second, "the dead-letter copy and every other message", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(DISTINCT uuid) FROM `+
			table(tables, processedTable)+` WHERE uuid = ANY($1)`, ids).Scan(&n))
		return n == len(ids)-1 && topicCount(t, pool, tables, "in.dead") == 1
	})
	// Its lines up to its exit: the hand-outs it printed.
	last.signal(t, syscall.SIGTERM)
	deadline := time.After(30 * time.Second)
	for open := true; open; {
		select {
		case line, ok := <-last.lines:
			if open = ok; ok {
				collect(line)
			}
		case <-deadline:
			t.Fatalf("process last did not exit after SIGTERM")
		}
	}
	<-last.exited
	require.NoError(t, last.err, "process last's exit status")
	require.Equal(t, s.want, out, "the hand-outs of the poison message, across the processes")
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"), "dead-letter copies")
	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, poison, dead.UUID)
	require.Equal(t, strconv.Itoa(cmp.Or(s.deadAttempts, maxAttempts)), dead.Metadata.Get(pglease.DeadLetterAttemptsMetadata))

	// Each process processed each key in publish order, and the message
	// behind the poison one only in the process that moved it.
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}
	rows, err := pool.Query(context.Background(), `SELECT proc, uuid FROM `+table(tables, processedTable)+` ORDER BY id`)
	require.NoError(t, err)
	last1 := map[string]int{} // proc + key: the index of the last message processed
	for rows.Next() {
		var proc, id string
		require.NoError(t, rows.Scan(&proc, &id))
		i, ok := index[id]
		require.True(t, ok, "processed an unknown message %s", id)
		require.NotEqual(t, poison, id, "the poison message was processed")
		if id == ids[4] {
			require.False(t, slices.Contains(killed, proc), "process %s processed the message behind the poison one", proc)
		}
		k := proc + "/" + retryCrashKeys[retryCrashPayloads[i]]
		if prev, seen := last1[k]; seen {
			require.Greater(t, i, prev, "process %s processed key %s out of order", proc, retryCrashKeys[retryCrashPayloads[i]])
		}
		last1[k] = i
	}
	require.NoError(t, rows.Err())
}
