package pglease_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// The steps of modeRetry's HangAt besides the failure steps: the handler
// holds the message, the dead-letter move's transaction is open.
const (
	hangHandler = "handler"
	hangMove    = "moving"
)

// runRetry reads every topic's channel of the first Subscriber directly. A
// message whose payload starts with "poison" is reported ("out <uuid>
// <attempt>") and then, with PoisonHang (or HangAt hangHandler), held until
// the process is killed, otherwise nacked with a reason; every other
// message is recorded in processedTable and acked. With HangInMove (or
// HangAt hangMove), a dead-letter move reports "moving" inside its
// transaction (after the move of the group past the message, before the
// copy's insert) and waits there until the process is killed. With HangAt
// a failure step, the poison message's attempt reports "at <step>
// <attempt>" at that step and waits there until the process is killed.
func (h *helperChild) runRetry(term <-chan os.Signal) error {
	sub := h.subs[0]
	if h.cfg.HangInMove || h.cfg.HangAt == hangMove {
		pglease.SetBeforeDeadLetterCopyHook(sub, func() {
			h.say("moving")
			select {}
		})
	}
	if at := h.cfg.HangAt; at != "" && at != hangMove && at != hangHandler {
		pglease.SetFailureStepHook(sub, func(step, uuid string, attempt int) {
			if step == at && strings.HasPrefix(uuid, "poison") {
				h.say("at " + step + " " + strconv.Itoa(attempt))
				select {}
			}
		})
	}
	hang := h.cfg.PoisonHang || h.cfg.HangAt == hangHandler
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, len(h.cfg.Topics))
	for _, topic := range h.cfg.Topics {
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			return err
		}
		go func() {
			for msg := range msgs {
				if strings.HasPrefix(string(msg.Payload), "poison") {
					h.say("out " + msg.UUID + " " + msg.Metadata.Get(pglease.DeliveryAttemptMetadata))
					if hang {
						select {}
					}
					pglease.NackWithReason(msg, errors.New("poisoned"))
					continue
				}
				if err := h.record(0, topic, msg, time.Now()); err != nil {
					msg.Nack()
					continue
				}
				msg.Ack()
			}
			errs <- nil
		}()
	}
	h.say("ready")
	<-term
	cancel()
	began := time.Now()
	if err := sub.Close(); err != nil {
		return err
	}
	h.say("closed " + time.Since(began).String())
	return nil
}

// TestRetryAttemptsExactAcrossCrashes: a message that kills every process
// that takes it (each helper holds it until it is killed with SIGKILL) is
// handed out exactly MaxAttempts times across the processes, numbered 1
// to MaxAttempts, and then moved to the dead-letter topic once, without
// going out again, by the next process; the other key's messages and the
// later message of its own key are all processed.
func TestRetryAttemptsExactAcrossCrashes(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	instrument(t, pool, tables)
	pub := newPublisher(t, pool, tables)
	keys := map[string]string{"poison": "p", "after": "p", "ok1": "q", "ok2": "q"}
	ids := publishPayloads(t, pub, "in", keys, "poison", "ok1", "ok2", "after")
	const maxAttempts = 3
	cfg := helperConfig{Name: "r", Schema: tables.Schema, Topics: []string{"in"}, Mode: modeRetry,
		SessionTTL: time.Second, PollInterval: 50 * time.Millisecond, PoisonHang: true,
		Retry: pglease.RetryConfig{MaxAttempts: maxAttempts, MinBackoff: 10 * time.Millisecond, DeadLetterTopic: "in.dead"}}
	var attempts []string
	var last *helperProc
	for run := 0; topicCount(t, pool, tables, "in.dead") == 0; run++ {
		require.Less(t, run, maxAttempts+2, "no dead-letter copy after %d processes; attempts %v", run, attempts)
		h := startHelper(t, cfg.named("r"+string(rune('a'+run))))
		deadline := time.Now().Add(30 * time.Second)
		for out := false; !out; {
			select {
			case line, ok := <-h.lines:
				require.True(t, ok, "process %s exited", h.cfg.Name)
				if f := strings.Fields(line); len(f) == 3 && f[0] == "out" {
					require.Equal(t, ids[0], f[1])
					attempts = append(attempts, f[2])
					h.signal(t, syscall.SIGKILL)
					<-h.exited
					out = true
				}
			case <-time.After(20 * time.Millisecond):
				if topicCount(t, pool, tables, "in.dead") > 0 {
					last, out = h, true
				}
			}
			require.True(t, time.Now().Before(deadline), "process %s neither handed the message out nor moved it", h.cfg.Name)
		}
	}
	require.Equal(t, []string{"1", "2", "3"}, attempts, "the hand-outs of the message, across the processes")
	require.NotNil(t, last, "the copy came from a process that was killed")
	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, ids[0], dead.UUID)
	require.Equal(t, "3", dead.Metadata.Get(pglease.DeadLetterAttemptsMetadata))
	require.Contains(t, dead.Metadata.Get(pglease.DeadLetterReasonMetadata), "without its outcome recorded")
	waitFor(t, 30*time.Second, "every other message processed", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(DISTINCT uuid) FROM `+
			table(tables, processedTable)+` WHERE uuid = ANY($1)`, ids[1:]).Scan(&n))
		return n == 3
	})
	last.close(t)
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"))
}

// TestDeadLetterMoveSurvivesAKillInItsTransaction: a process killed inside
// the transaction of a dead-letter move (after the move of the group
// past the message, before the copy's insert) leaves neither: the next
// process moves the message once, without handing it out again.
func TestDeadLetterMoveSurvivesAKillInItsTransaction(t *testing.T) {
	parallel(t)
	pool := newPool(t, 10)
	tables := newSchema(t, pool)
	instrument(t, pool, tables)
	pub := newPublisher(t, pool, tables)
	ids := publishPayloads(t, pub, "in", nil, "poison", "ok1")
	cfg := helperConfig{Name: "m1", Schema: tables.Schema, Topics: []string{"in"}, Mode: modeRetry,
		SessionTTL: time.Second, PollInterval: 50 * time.Millisecond, HangInMove: true,
		Retry: pglease.RetryConfig{MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, DeadLetterTopic: "in.dead"}}
	h := startHelper(t, cfg)
	require.Equal(t, "out "+ids[0]+" 1", h.waitLine(t, "out ", 30*time.Second))
	require.Equal(t, "out "+ids[0]+" 2", h.waitLine(t, "out ", 30*time.Second))
	h.waitLine(t, "moving", 30*time.Second)
	h.signal(t, syscall.SIGKILL)
	<-h.exited
	require.Equal(t, 0, topicCount(t, pool, tables, "in.dead"), "a copy from the killed transaction")

	cfg.HangInMove = false
	h = startHelper(t, cfg.named("m2"))
	waitFor(t, 30*time.Second, "the copy and ok1", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
			table(tables, processedTable)+` WHERE uuid = $1`, ids[1]).Scan(&n))
		return n > 0 && topicCount(t, pool, tables, "in.dead") == 1
	})
	// Its lines come before the copy (the helper prints before the
	// handler nacks): every one is in the channel by now.
	for drained := false; !drained; {
		select {
		case line := <-h.lines:
			require.False(t, strings.HasPrefix(line, "out "), "the second process handed the message out again: %q", line)
		default:
			drained = true
		}
	}
	h.close(t)
	require.Equal(t, 1, topicCount(t, pool, tables, "in.dead"))
	dead := receiveDeadLetter(t, pool, tables, "in.dead")
	require.Equal(t, "2", dead.Metadata.Get(pglease.DeadLetterAttemptsMetadata))
}
