package pglease_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// keyedMessage is message seq of key, placed by the PartitionKeyMetadata
// metadata; its payload is "key/seq".
func keyedMessage(key string, seq int) *message.Message {
	msg := message.NewMessage(fmt.Sprintf("%s-%04d-%s", key, seq, randomHex(4)), []byte(fmt.Sprintf("%s/%d", key, seq)))
	msg.Metadata.Set(pglease.PartitionKeyMetadata, key)
	return msg
}

func parseKeyed(t *testing.T, msg *message.Message) (string, int) {
	t.Helper()
	key, seq, ok := strings.Cut(string(msg.Payload), "/")
	require.True(t, ok, "payload %q", msg.Payload)
	n, err := strconv.Atoi(seq)
	require.NoError(t, err)
	return key, n
}

// keyOrder checks, message by message, that each key's messages arrive in
// publish order, a redelivery (a Nack) repeating the last one at most.
type keyOrder struct {
	t    *testing.T
	last map[string]int
}

func newKeyOrder(t *testing.T) *keyOrder { return &keyOrder{t: t, last: map[string]int{}} }

func (o *keyOrder) see(msg *message.Message, redelivery bool) {
	o.t.Helper()
	key, seq := parseKeyed(o.t, msg)
	last, ok := o.last[key]
	if !ok {
		last = -1
	}
	want := last + 1
	if redelivery {
		want = last
	}
	require.Equal(o.t, want, seq, "key %s: message %d arrived after %d", key, seq, last)
	o.last[key] = seq
}

// TestPartitionedTopicOneSubscriber: a Subscriber that owns every partition
// of a topic delivers one unacked message per partition at a time, on the
// one channel, each key in order, also across Nacks; the partition of each
// message is in its context.
func TestPartitionedTopicOneSubscriber(t *testing.T) {
	const partitions = 4
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "hot", pglease.TopicConfig{Partitions: partitions,
		Tables: adapter, InitializeSchema: true}))
	pub := newPublisher(t, pool, adapter)

	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	byPartition := map[int]int{}
	const perKey = 10
	for seq := range perKey {
		for _, k := range keys {
			require.NoError(t, pub.Publish("hot", keyedMessage(k, seq)))
			if seq == 0 {
				byPartition[pglease.PartitionOf(k, partitions)]++
			}
		}
	}
	require.Len(t, byPartition, partitions, "the keys of this test cover every partition")

	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter,
		NackResendDelay: time.Millisecond}, testLogger())
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(sctx, "hot")
	require.NoError(t, err)

	// Nothing acked yet: one message per partition is out at once.
	order := newKeyOrder(t)
	held := map[int32]*message.Message{}
	for len(held) < partitions {
		select {
		case msg := <-msgs:
			p, ok := pglease.MessagePartitionFromCtx(msg.Context())
			require.True(t, ok, "partition in the message's context")
			key, _ := parseKeyed(t, msg)
			require.Equal(t, pglease.PartitionOf(key, partitions), int(p), "message %s", msg.UUID)
			require.NotContains(t, held, p, "a second unacked message of partition %d", p)
			held[p] = msg
			order.see(msg, false)
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d unacked messages, want one per partition (%d)", len(held), partitions)
		}
	}
	// Nack one, ack the others: the nacked one comes again first on its
	// partition.
	held[0].Nack()
	for p, msg := range held {
		if p != 0 {
			msg.Ack()
		}
	}
	redelivered := false
	received := len(held) - 1
	for received < len(keys)*perKey {
		select {
		case msg := <-msgs:
			p, _ := pglease.MessagePartitionFromCtx(msg.Context())
			again := p == 0 && !redelivered
			if again {
				require.Equal(t, held[0].UUID, msg.UUID, "the nacked message comes again before the rest of its partition")
				redelivered = true
			}
			order.see(msg, again)
			msg.Ack()
			received++
		case <-time.After(30 * time.Second):
			t.Fatalf("received %d of %d messages", received, len(keys)*perKey)
		}
	}
	for _, k := range keys {
		assert.Equal(t, perKey-1, order.last[k], "key %s", k)
	}
	require.NoError(t, sub.Close())
	_, open := <-msgs
	require.False(t, open, "channel closed by Close")
	assertNoLeakedGoroutines(t)
}

// TestPartitionCountRaisedWhileSubscribed: raising a topic's partition count
// makes running subscriptions consume the new partitions, woken by the
// notification of CreateTopic.
func TestPartitionCountRaisedWhileSubscribed(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	cfg := pglease.TopicConfig{Partitions: 1, Tables: adapter, InitializeSchema: true}
	require.NoError(t, pglease.CreateTopic(ctx, pool, "growing", cfg))
	pub := newPublisher(t, pool, adapter)
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter,
		PollInterval: time.Hour}, testLogger()) // no poll: only the notification can tell
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "growing")
	require.NoError(t, err)

	require.NoError(t, pub.Publish("growing", keyedMessage("k", 0)))
	msg := receiveOne(t, msgs)
	p, _ := pglease.MessagePartitionFromCtx(msg.Context())
	require.Equal(t, int32(0), p)
	msg.Ack()

	cfg.Partitions = 4
	require.NoError(t, pglease.CreateTopic(ctx, pool, "growing", cfg))
	// One message for each partition: every one arrives.
	want := map[int32]bool{}
	for i := 0; len(want) < 4; i++ {
		key := fmt.Sprintf("key%d", i)
		p := int32(pglease.PartitionOf(key, 4))
		if want[p] {
			continue
		}
		want[p] = true
		require.NoError(t, pub.Publish("growing", keyedMessage(key, 0)))
	}
	got := map[int32]bool{}
	for len(got) < 4 {
		msg := receiveOne(t, msgs)
		p, _ := pglease.MessagePartitionFromCtx(msg.Context())
		got[p] = true
		msg.Ack()
	}
	require.Equal(t, want, got)

	// Every partition is owned and idle now; with no poll, only the
	// notification of each partition ("n<partition>:<topic>") wakes its
	// consumer.
	var keys []string
	for p := range 4 {
		for i := 0; ; i++ {
			if key := fmt.Sprintf("again%d", i); pglease.PartitionOf(key, 4) == p {
				keys = append(keys, key)
				break
			}
		}
	}
	for _, key := range keys {
		require.NoError(t, pub.Publish("growing", keyedMessage(key, 0)))
		msg := receiveOne(t, msgs)
		gotKey, _ := parseKeyed(t, msg)
		require.Equal(t, key, gotKey)
		msg.Ack()
	}
	require.NoError(t, sub.Close())
	assertNoLeakedGoroutines(t)
}

// TestPartitionedTopicAcrossProcesses: a topic of 8 partitions consumed by a
// group of 4 processes (a Router each, handler 4 ms): each owns 2
// partitions; one is SIGKILLed and the other three share its partitions
// once its session expires; a new process joins and gets 2 partitions
// handed over by release. Every message is processed, each key (each
// partition) in order, duplicates only from the killed process's
// uncommitted window, and no partition is ever delivered by two live
// sessions (invariant checker).
func TestPartitionedTopicAcrossProcesses(t *testing.T) {
	const (
		ttl        = 2 * time.Second
		partitions = 8
		keys       = 16
		perKey     = 60
	)
	began := time.Now()
	s := newFailureSetup(t, ttl, "hot")
	installInvariantChecker(t, s.pool, s.adapter)
	require.NoError(t, pglease.CreateTopic(context.Background(), s.pool, "hot",
		pglease.TopicConfig{Partitions: partitions, Tables: s.adapter}))
	var streams []string
	for p := range partitions {
		streams = append(streams, streamName("hot", int32(p)))
	}
	cfg := s.cfg
	cfg.NoKeepalive = true
	cfg.Work = 4 * time.Millisecond

	var cfgs []helperConfig
	for i := range 4 {
		cfgs = append(cfgs, cfg.named(fmt.Sprintf("p%d", i)))
	}
	four := startHelpers(t, cfgs...)
	ready := time.Now()
	split := waitSplit(t, s, streams, four, partitions/4, 0, ready, time.Minute)
	t.Logf("4 processes: 2 partitions each %s after all were ready", split.Round(time.Millisecond))

	publish := func(from, to int) {
		for seq := from; seq < to; seq++ {
			var batch []*message.Message
			for k := range keys {
				batch = append(batch, keyedMessage(fmt.Sprintf("key%02d", k), seq))
			}
			require.NoError(t, s.pub.Publish("hot", batch...))
		}
	}
	publish(0, perKey/2)
	victim := four[1]
	waitProgress(t, s.pool, s.adapter, victim.cfg.Name, ready, 20, 30*time.Second)
	victim.signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	publish(perKey/2, perKey)
	survivors := []*helperProc{four[0], four[2], four[3]}
	shared := waitSplit(t, s, streams, survivors, 3, 1, killedAt, time.Minute)
	t.Logf("kill: the 8 partitions owned by the 3 survivors (3, 3, 2) %s after SIGKILL (SessionTTL %s)",
		shared.Round(time.Millisecond), ttl)
	// A new process joins: the others hand partitions over by release
	// until each of the four owns 2.
	p4 := launchHelper(t, cfg.named("p4"))
	p4.waitLine(t, "ready", time.Minute)
	joined := time.Now()
	publish(perKey, perKey+perKey/2)
	four = append(append([]*helperProc(nil), survivors...), p4)
	rejoin := waitSplit(t, s, streams, four, partitions/4, 0, joined, time.Minute)
	t.Logf("join: 2 partitions each %s after the new process was ready", rejoin.Round(time.Millisecond))
	waitProcessed(t, s.pool, s.adapter, []string{"hot"}, time.Minute)
	for _, p := range four {
		p.close(t)
	}

	h := loadHistory(t, s.pool, s.adapter, s.cfg.Group)
	sum := h.verify(t, streams)
	assert.Equal(t, keys*(perKey+perKey/2), sum.messages)
	assertDuplicatesFollowTakeovers(t, h)
	lostSessions := false
	for _, p := range four {
		lostSessions = lostSessions || sessionsOpened(h)[p.pid()] != 1
	}
	if !lostSessions {
		// No survivor lost its session: the duplicates are exactly what
		// the killed process processed after its last commits.
		assert.Equal(t, killWindow(h, streams, victim.cfg.Name, killedAt), h.duplicates())
	}
	// Per key: the first processing of each message follows publish order
	// (verify checks it per partition; a key lives in one partition).
	for _, r := range h.records {
		key, _, _ := strings.Cut(r.uuid, "-")
		assert.Equal(t, streamName("hot", int32(pglease.PartitionOf(key, partitions))), r.topic,
			"message %s processed as part of the wrong partition", r.uuid)
	}
	counts := assertNoInvariantViolations(t, s)
	t.Logf("partitioned topic: %d messages (%d processed, %d more than once), %d claims; invariants: %s; run %s",
		sum.messages, sum.records, sum.duplicates, sum.claims, counts, time.Since(began).Round(time.Millisecond))
}

// TestPartitionedTopicSpreadWithOtherTopics: two processes of a group
// that subscribes to a topic of 4 partitions and two plain topics each
// own 2 partitions of the partitioned topic and one plain topic, after
// the second joins the first (which held everything).
func TestPartitionedTopicSpreadWithOtherTopics(t *testing.T) {
	const ttl = 2 * time.Second
	s := newFailureSetup(t, ttl, "orders", "plain1", "plain2")
	require.NoError(t, pglease.CreateTopic(context.Background(), s.pool, "orders",
		pglease.TopicConfig{Partitions: 4, Tables: s.adapter}))
	streams := []string{"plain1", "plain2"}
	for p := range 4 {
		streams = append(streams, streamName("orders", int32(p)))
	}
	cfg := s.cfg
	cfg.NoKeepalive = true

	p0 := startHelper(t, cfg.named("p0"))
	waitSplit(t, s, streams, []*helperProc{p0}, len(streams), 0, time.Now(), time.Minute)
	p1 := startHelper(t, cfg.named("p1"))
	joined := time.Now()
	procs := []*helperProc{p0, p1}
	even := func(owners map[string]int) bool {
		if len(owners) != len(streams) {
			return false
		}
		for _, p := range procs {
			orders, plain := 0, 0
			for stream, pid := range owners {
				if pid != p.pid() {
					continue
				}
				if strings.HasPrefix(stream, "orders") {
					orders++
				} else {
					plain++
				}
			}
			if orders != 2 || plain != 1 {
				return false
			}
		}
		return true
	}
	var last map[string]int
	deadline := time.Now().Add(30 * time.Second)
	for {
		owners, err := topicOwners(s, streams)
		if err == nil && even(owners) {
			break
		}
		last = owners
		if time.Now().After(deadline) {
			t.Fatalf("no even split 30s after the second process started; owners by pid: %v", last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("2 partitions of orders and 1 plain topic each %s after the second process started",
		time.Since(joined).Round(time.Millisecond))
	for _, p := range procs {
		p.close(t)
	}
}
