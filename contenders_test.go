package pglease_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestManyContenders runs 20 Subscribers in 4 processes, one consumer group,
// each subscribed to all of 50 topics. Every subscription ends after a few
// messages and subscribes again, so ownership keeps moving; halfway
// through, one process is killed with SIGKILL and a new one takes its
// place. Throughout, each topic has at most one deliverer at any moment
// (no two processing intervals of different Subscribers overlap, and the
// records of each claim come from one Subscriber), every message is
// processed, in order per topic, and a message is processed twice only
// when the claim it was first processed under ended without a release
// (the killed process, or a lost session), never after a clean handover.
func TestManyContenders(t *testing.T) {
	const (
		procs    = 4
		subs     = 5
		topicsN  = 50
		perTopic = 20
		ttl      = 2 * time.Second
	)
	var topics []string
	for i := 0; i < topicsN; i++ {
		topics = append(topics, fmt.Sprintf("c%02d", i))
	}
	s := newFailureSetup(t, ttl, topics...)
	cfg := s.cfg
	cfg.Mode = modeChurn
	cfg.Subscribers = subs
	cfg.ChurnMin, cfg.ChurnMax = 2, 6

	began := time.Now()
	var helpers []*helperProc
	for i := 0; i < procs; i++ {
		helpers = append(helpers, startHelper(t, cfg.named(fmt.Sprintf("p%d", i))))
	}
	started := time.Since(began)

	var killed *helperProc
	var killedAt time.Time
	for round := 0; round < perTopic; round++ {
		for _, topic := range topics {
			require.NoError(t, s.pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(round)))))
		}
		if round == perTopic/2 {
			killed = helpers[0]
			killed.signal(t, syscall.SIGKILL)
			killedAt = time.Now()
			helpers[0] = startHelper(t, cfg.named("p0-restarted"))
		}
		time.Sleep(50 * time.Millisecond) // publishing pace, not a wait for a condition
	}
	waitProcessed(t, s.pool, s.adapter, topics, 3*time.Minute)
	doneIn := time.Since(began)
	for _, h := range helpers {
		h.close(t)
	}

	h := loadHistory(t, s.pool, s.adapter, failureGroup)
	sum := h.verify(t, topics)
	require.Equal(t, topicsN*perTopic, sum.messages)

	// Ownership moved around: many claims per topic, by many Subscribers.
	deliverers := map[string]bool{}
	for _, r := range h.records {
		deliverers[r.deliverer()] = true
	}
	assert.Greater(t, sum.claims, 3*topicsN, "ownership hardly moved: the test did not test contention")
	assert.Greater(t, len(deliverers), procs*subs/2, "few Subscribers ever delivered")

	// A clean handover (the subscription ended, the claim was released)
	// processes nothing twice: a message is processed again only when the
	// claim it was first processed under ended without a release, because
	// its process was killed or its session was lost.
	released := map[string]map[int64]bool{}
	for _, c := range h.offsets {
		if c.isRelease() {
			if released[c.topic] == nil {
				released[c.topic] = map[int64]bool{}
			}
			released[c.topic][c.oldEpoch] = true
		}
	}
	first := map[string]processed{}
	for _, r := range h.records {
		if _, ok := first[r.uuid]; !ok {
			first[r.uuid] = r
		}
	}
	fromKilled := 0
	for _, id := range h.duplicates() {
		r := first[id]
		assert.False(t, released[r.topic][*r.ownerEpoch],
			"message %s processed twice although %s released its claim (epoch %d) cleanly", id, r.deliverer(), *r.ownerEpoch)
		if r.proc == killed.cfg.Name && r.received.Before(killedAt) {
			fromKilled++
		}
	}
	lostSessions := 0
	for _, hp := range append(helpers, killed) {
		lostSessions += strings.Count(hp.logs(), ownershipLostText)
	}
	t.Logf("many contenders: %d processes x %d Subscribers on %d topics; started in %s; %d messages processed in %s; "+
		"%d claims, %d Subscribers delivered, %d processed twice (%d first by the killed process; %d log lines about lost ownership), "+
		"no overlap, order kept",
		procs, subs, topicsN, started.Round(time.Millisecond), sum.messages, doneIn.Round(time.Millisecond),
		sum.claims, len(deliverers), sum.duplicates, fromKilled, lostSessions)
}
