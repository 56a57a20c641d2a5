package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"
)

// The partitions workload: does a consumer group whose handler is slow get
// through a backlog faster when the topic has more partitions than
// members? The same backlog, on a topic of 1 partition and on one of 8,
// drained by the same group of member processes; each member's handler
// takes 4 ms per message, so that the handler, not pglease, is the
// bottleneck, and one partition (one unacked message at a time) cannot go
// faster than 250 messages per second.

const (
	// partitionMembers member processes drain partitionMessages messages,
	// published beforehand over partitionKeys keys, with a handler that
	// sleeps partitionHandlerDelay before it acks.
	partitionMembers      = 4
	partitionMessages     = 2000
	partitionKeys         = 16
	partitionHandlerDelay = 4 * time.Millisecond
	// partitionKeyFormat names the keys. Key i is fmt.Sprintf of it with i;
	// these 16 fall on 8 partitions 2 each (PartitionOf), so that the
	// partitions carry equal loads and the workload measures the
	// partitions, not the luck of the hash.
	partitionKeyFormat = "key-%02d"
	// partitionSeqMetadata is the metadata key of a message's sequence
	// number among the messages of its key, from 0.
	partitionSeqMetadata = "bench_seq"
	// partitionTimeout bounds the drain.
	partitionTimeout = 2 * time.Minute
	// partitionRatioKey is the metric of the drain time on the most
	// partitions divided by that on one.
	partitionRatioKey = "partitions-ratio"
)

// partitionCounts are the partition counts of the compared topics: one
// (the baseline: a single member works at a time) and two per member.
var partitionCounts = []int{1, 2 * partitionMembers}

func partitionKey(what string, partitions int) string {
	return fmt.Sprintf("partitions-%d-%s", partitions, what)
}

func partitionsWorkload() workload {
	prefix := fmt.Sprintf("partitioned group: %d members drain %s messages over %d keys, handler %d ms", partitionMembers,
		thousands(partitionMessages), partitionKeys, partitionHandlerDelay.Milliseconds())
	most := partitionCounts[len(partitionCounts)-1]
	w := workload{id: "partitions", pgleaseOnly: true}
	for _, n := range partitionCounts {
		w.metrics = append(w.metrics,
			metric{
				key:         partitionKey("s", n),
				label:       fmt.Sprintf("%s; %s: drain time", prefix, plural(n, "partition")),
				short:       fmt.Sprintf("drain on %s", plural(n, "partition")),
				unit:        "s",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
			metric{
				key:         partitionKey("rate", n),
				label:       fmt.Sprintf("%s; %s: messages/s", prefix, plural(n, "partition")),
				short:       fmt.Sprintf("drain rate on %s", plural(n, "partition")),
				unit:        "msg/s",
				better:      higherIsBetter,
				pgleaseOnly: true,
			})
	}
	w.metrics = append(w.metrics, metric{
		key:         partitionRatioKey,
		label:       fmt.Sprintf("partitioned group: drain time on %d partitions ÷ on 1 (same round)", most),
		short:       fmt.Sprintf("drain time, %d partitions ÷ 1", most),
		unit:        "×",
		better:      lowerIsBetter,
		target:      target{kind: pgleaseAtMost, value: 0.4, text: "pglease ≤ 0.4"},
		pgleaseOnly: true,
	})
	// The cases run one after the other in each round, in alternating
	// order, so that noise from other work on the machine falls on both
	// alike. w is copied by value, and every copy shares runs.
	runs := new(int)
	w.run = func(ctx context.Context, e *env, h handle) (map[string]float64, error) {
		*runs++
		return runPartitions(ctx, e, h.(*pgleaseHandle), *runs%2 == 0)
	}
	return w
}

// runPartitions drains the backlog once on a topic of each of
// partitionCounts partitions (in reverse order when reverse is set), and
// returns the drain times, the rates and the ratio of the drain times.
func runPartitions(ctx context.Context, e *env, h *pgleaseHandle, reverse bool) (map[string]float64, error) {
	counts := append([]int(nil), partitionCounts...)
	if reverse {
		for i, j := 0, len(counts)-1; i < j; i, j = i+1, j-1 {
			counts[i], counts[j] = counts[j], counts[i]
		}
	}
	vals := map[string]float64{}
	for _, n := range counts {
		d, err := partitionDrain(ctx, e, h, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", plural(n, "partition"), err)
		}
		vals[partitionKey("s", n)] = d.Seconds()
		vals[partitionKey("rate", n)] = partitionMessages / d.Seconds()
	}
	most := partitionCounts[len(partitionCounts)-1]
	vals[partitionRatioKey] = vals[partitionKey("s", most)] / vals[partitionKey("s", 1)]
	return vals, nil
}

// partitionDrain: a topic of n partitions (CreateTopic) gets
// partitionMessages messages, published beforehand in calls of 100 from one
// goroutine, round robin over partitionKeys keys (metadata partition_key)
// and numbered per key. Then partitionMembers child processes of one
// consumer group subscribe to it, with the default configuration, without
// reading their channels yet. Once every member has a live session and
// the owned (topic, partition) rows are split evenly (the members that
// own one own n/partitionMembers each, rounded up or down), and a second
// later still are, every member is told to start: it reads its channel
// and handles each message in a goroutine of its own, as a Watermill
// Router does, sleeping partitionHandlerDelay, reporting the message and
// acking it. The time from the start until this process has heard of
// every message once.
//
// Each message must come from the partition that PartitionOf gives for its
// key, and the messages of each key must arrive in the order they were
// published: otherwise the run fails. A message reported twice is logged.
func partitionDrain(ctx context.Context, e *env, h *pgleaseHandle, n int) (time.Duration, error) {
	topic := fmt.Sprintf("bench_partitions_%d", n)
	if err := pglease.CreateTopic(ctx, h.pool, topic, pglease.TopicConfig{
		Partitions: n, Tables: h.tables, InitializeSchema: true,
	}); err != nil {
		return 0, err
	}
	if err := publishKeyed(h, topic); err != nil {
		return 0, err
	}
	_, _ = e.admin.Exec(ctx, "CHECKPOINT")

	children := make([]*child, 0, partitionMembers)
	defer func() {
		for _, c := range children {
			c.stop()
		}
	}()
	for range partitionMembers {
		c, err := startChild(e, childConfig{Role: childKeyed, Schema: h.ns, Conns: e.cfg.memberConns,
			Topic: topic, HandlerDelay: partitionHandlerDelay})
		if err != nil {
			return 0, err
		}
		children = append(children, c)
	}
	for _, c := range children {
		if _, err := c.waitLine(ctx, "ready", time.Minute); err != nil {
			return 0, err
		}
	}
	if err := waitLiveSessions(ctx, e, h, partitionMembers, balanceTimeout); err != nil {
		return 0, err
	}
	even := split{members: min(partitionMembers, n), lo: n / partitionMembers,
		hi: (n + partitionMembers - 1) / partitionMembers, total: n}
	counts := func(ctx context.Context) ([]int, error) { return topicOwnerCounts(ctx, e, h, topic) }
	if _, err := waitSplitBy(ctx, counts, even, balanceTimeout); err != nil {
		return 0, err
	}
	// Let the members finish what the split started, and make sure it
	// stays: the members must not move partitions while the clock runs.
	if !sleepCtx(ctx, time.Second) {
		return 0, ctx.Err()
	}
	if _, err := waitSplitBy(ctx, counts, even, 0); err != nil {
		return 0, fmt.Errorf("a second after the split: %w", err)
	}

	lines := make(chan childLine)
	done := make(chan struct{})
	stopForwarding := sync.OnceFunc(func() { close(done) })
	defer stopForwarding()
	for i, c := range children {
		go c.forward(i, lines, done)
	}
	t0 := time.Now()
	for _, c := range children {
		if err := c.tell("go"); err != nil {
			return 0, fmt.Errorf("tell a member to start: %w", err)
		}
	}
	check := newKeyOrder(n)
	perMember := make([]int, len(children))
	deadline := time.NewTimer(partitionTimeout)
	defer deadline.Stop()
	for check.distinct < partitionMessages {
		select {
		case l := <-lines:
			if l.exited {
				return 0, fmt.Errorf("member %d exited after %d of %d messages", l.child, check.distinct, partitionMessages)
			}
			rest, ok := strings.CutPrefix(l.text, "msg ")
			if !ok {
				continue
			}
			if err := check.add(rest); err != nil {
				return 0, err
			}
			perMember[l.child]++
		case <-deadline.C:
			return 0, fmt.Errorf("%d of %d messages handled within %s", check.distinct, partitionMessages, partitionTimeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	took := time.Since(t0)
	stopForwarding()
	e.log("partitions, %s: %s messages in %s (%.0f/s); handled per member: %v; %d reported twice",
		plural(n, "partition"), thousands(partitionMessages), took.Round(time.Millisecond),
		partitionMessages/took.Seconds(), perMember, check.duplicates)
	if check.violations > 0 {
		return 0, fmt.Errorf("order per key violated %d times, first: %s", check.violations, check.first)
	}

	for _, c := range children {
		if err := c.tell("close"); err != nil {
			e.log("partitions: tell a member to close: %v", err)
		}
	}
	for _, c := range children {
		if err := c.wait(time.Minute); err != nil {
			e.log("partitions: member: %v", err)
		}
	}
	return took, nil
}

// publishKeyed publishes the backlog of partitionDrain to topic.
func publishKeyed(h *pgleaseHandle, topic string) error {
	const perCall = 100
	pub, err := h.publisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	for i := 0; i < partitionMessages; i += perCall {
		msgs := make([]*message.Message, 0, perCall)
		for j := i; j < min(i+perCall, partitionMessages); j++ {
			msg := message.NewMessage(watermill.NewUUID(), payload)
			msg.Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf(partitionKeyFormat, j%partitionKeys))
			msg.Metadata.Set(partitionSeqMetadata, strconv.Itoa(j/partitionKeys))
			msgs = append(msgs, msg)
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("publish the backlog: %w", err)
		}
	}
	return nil
}

// keyOrder checks the messages a partitioned group reports: from the
// partition of their key, and each key's in the order of its sequence
// numbers. It is not safe for concurrent use.
type keyOrder struct {
	partitions int
	last       map[string]int // the highest sequence number seen per key
	seen       map[string]map[int]bool
	distinct   int
	duplicates int
	violations int
	first      string // the first violation
}

func newKeyOrder(partitions int) *keyOrder {
	return &keyOrder{partitions: partitions, last: map[string]int{}, seen: map[string]map[int]bool{}}
}

// add takes a member's report "<key> <sequence number> <partition>". It
// returns an error for a message from another partition than its key's,
// or for a report it cannot read; an order violation is counted.
func (k *keyOrder) add(report string) error {
	var key string
	var seq, part int
	if _, err := fmt.Sscan(report, &key, &seq, &part); err != nil {
		return fmt.Errorf("member report %q: %w", report, err)
	}
	if want := pglease.PartitionOf(key, k.partitions); part != want {
		return fmt.Errorf("key %s: message %d delivered from partition %d, but the key's partition is %d", key, seq, part, want)
	}
	if k.seen[key] == nil {
		k.seen[key] = map[int]bool{}
	}
	if k.seen[key][seq] {
		k.duplicates++
		return nil
	}
	k.seen[key][seq] = true
	k.distinct++
	if last, ok := k.last[key]; ok && seq < last {
		k.violations++
		if k.first == "" {
			k.first = fmt.Sprintf("key %s: message %d after %d", key, seq, last)
		}
		return nil
	}
	k.last[key] = seq
	return nil
}

// topicOwnerCounts returns how many rows (partitions) of topic each live
// session of the consumer group owns, fewest first.
func topicOwnerCounts(ctx context.Context, e *env, h *pgleaseHandle, topic string) ([]int, error) {
	rows, err := e.admin.Query(ctx, `SELECT count(*)::int FROM `+h.offsetsTable()+` o
		JOIN `+sessionsTable(h.ns)+` s ON s.id = o.session_id AND s.expires_at > now()
		WHERE o.consumer_group = $1 AND o.topic = $2 GROUP BY o.session_id ORDER BY 1`, consumerGroup, topic)
	if err != nil {
		return nil, fmt.Errorf("count owned partitions: %w", err)
	}
	counts, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("count owned partitions: %w", err)
	}
	return counts, nil
}

// waitLiveSessions polls every 10 ms until the consumer group has members
// live sessions.
func waitLiveSessions(ctx context.Context, e *env, h *pgleaseHandle, members int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var live int
		err := e.admin.QueryRow(ctx, `SELECT count(*) FROM `+sessionsTable(h.ns)+`
			WHERE consumer_group = $1 AND expires_at > now()`, consumerGroup).Scan(&live)
		if err != nil {
			return fmt.Errorf("count live sessions: %w", err)
		}
		if live == members {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d live sessions after %s, want %d", live, timeout, members)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// sessionsTable is the quoted name of pglease's consumer sessions table in
// schema ns.
func sessionsTable(ns string) string {
	return pgx.Identifier{ns, pglease.DefaultConsumerSessionsTable}.Sanitize()
}

// childLine is a line a child printed, or (exited) the end of its output.
type childLine struct {
	child  int
	text   string
	exited bool
}

// forward sends the child's lines to to, tagged with i, then its end,
// until done is closed; after that it reads and drops them, so that the
// child never blocks on its output.
func (c *child) forward(i int, to chan<- childLine, done <-chan struct{}) {
	for line := range c.lines {
		select {
		case to <- childLine{child: i, text: line}:
		case <-done:
		}
	}
	select {
	case to <- childLine{child: i, exited: true}:
	case <-done:
	}
}

// consumeKeyed is the keyed child's work (see child.go): it subscribes to
// c.Topic, prints "ready", and once start is closed reads the channel,
// handling each message in a goroutine of its own as a Watermill Router
// does: it sleeps c.HandlerDelay, prints "msg <key> <sequence number>
// <partition>" and acks. It returns when closing is closed, once the
// handlers running have returned.
func (c childConfig) consumeKeyed(ctx context.Context, sub message.Subscriber, start, closing <-chan struct{}) error {
	ch, err := sub.Subscribe(ctx, c.Topic)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", c.Topic, err)
	}
	fmt.Println("ready")
	select {
	case <-start:
	case <-closing:
		return nil
	}
	var (
		out      sync.Mutex
		handlers sync.WaitGroup
	)
	defer handlers.Wait()
	for {
		select {
		case msg, ok := <-ch:
			if !ok {
				return fmt.Errorf("the subscription to %s ended", c.Topic)
			}
			handlers.Add(1)
			go func() {
				defer handlers.Done()
				time.Sleep(c.HandlerDelay)
				part, ok := pglease.MessagePartitionFromCtx(msg.Context())
				if !ok {
					part = -1
				}
				out.Lock()
				_, err := fmt.Fprintf(os.Stdout, "msg %s %s %d\n", msg.Metadata.Get(pglease.PartitionKeyMetadata),
					msg.Metadata.Get(partitionSeqMetadata), part)
				out.Unlock()
				if err != nil {
					msg.Nack()
					return
				}
				msg.Ack()
			}()
		case <-closing:
			return nil
		}
	}
}
