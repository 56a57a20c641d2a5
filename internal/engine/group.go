package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"

	"github.com/pglease/watermill-pglease/internal/svc"
)

// claimBatchMax bounds the rows one claim statement takes, and the topics
// one offset-row insert creates.
const claimBatchMax = 1000

// errSessionGone means the session row of the generation in use is gone:
// the keeper finds out on its next heartbeat and opens a new one.
var errSessionGone = errors.New("the consumer session row is gone")

// grant hands a claim to the consumer of its topic. yield is closed when
// the member asks the consumer to give the topic up (the group was split
// again and this member holds more than its share).
type grant struct {
	g     *sessionGen
	cl    *claim
	yield chan struct{}
	// hasNext reports that a message lay after the claim's position when
	// it was claimed; without one the consumer waits for news at once.
	hasNext bool
}

// held is a topic this member owns, as the member sees it.
type held struct {
	c     *consumer
	g     *sessionGen
	epoch int64 // of the claim
	yield chan struct{}
	since time.Time
	// extra: claimed beyond the member's caps after the grace, and the
	// group has not changed since (see heldRow.extra).
	extra bool
}

// groupMember is the consumer-group side of a Subscriber. It knows the
// topics the Subscriber subscribes to, which of them it owns, and the other
// live members of its group, read from the sessions table. It publishes
// this Subscriber's set of topics in its session row, computes its share
// (shareOf), claims free topics in batches up to that share and hands each
// claim to the subscription of its topic, and asks subscriptions to give
// up topics above the share, which they do by the normal release.
//
// It runs no per-topic timer: it acts when woken by a subscription that
// starts, ends or loses its topic, by notifications (a release, a session
// that starts, ends or changes its topics), by the expiry of another
// member's session that it read, or, while it holds less than its share,
// every PollInterval. Its methods are safe for concurrent use.
type groupMember struct {
	memberDeps

	mu      sync.Mutex
	waiting map[rowKey]*consumer // subscribed, not owned
	owning  map[rowKey]*held     // granted
	set     rowSet               // the rows of waiting and owning
	shape   setShape             // how set falls into topics
	// unensured are subscribed rows whose offset row may not exist: the
	// partitions of a topic whose count was read (resolve), and every
	// subscribed partition of a topic a claim found a row of missing.
	// recreate are those of the second kind: their creation is logged.
	unensured map[rowKey]struct{}
	recreate  map[rowKey]struct{}
	// unsettled are rows of a claim statement whose outcome is unknown:
	// they may be this session's. The next claim takes them again and
	// releases those that are no longer subscribed.
	unsettled map[rowKey]struct{}
	// future holds back rows refused for a position ahead of the
	// transaction counter: until when, and the wait before the next try
	// (doubling from a second to a minute).
	future map[rowKey]futureHold
	// subs are the Subscriber's subscriptions by topic; unresolved those
	// whose topic's partition count is to be read, with the mark's number
	// (a mark made while a read runs is not cleared by that read).
	subs       map[string][]memberSub
	unresolved map[memberSub]uint64
	marks      uint64
	stale      bool // the members must be read again
	// published is the set last written to the session row, under pubGen.
	published rowSet
	pubGen    *sessionGen
	// resets are the topics a notification said the group's offsets were
	// reset on, to be checked (checkResets); resetChecked is when the
	// last check ran.
	resets       map[string]struct{}
	resetChecked time.Time
	// me and members are the last read of the group; owners the owner
	// of every session seen in the reads since it was last cleared
	// (rememberOwners).
	me      member
	members []member
	owners  map[uuid.UUID]string
	// afterRead, when set, runs after each read of the group with the
	// number of members read (tests only).
	afterRead func(members int)
	// graceWait is the wait before claiming free rows beyond the caps;
	// others the protocol versions other than this release's that the
	// last read of the group showed (logged when they change).
	graceWait graceState
	others    []int

	kick chan struct{}
	// outage logs the failures of the steps.
	outage *outageLog

	loop svc.Service // run, started by the first Subscribe
}

// memberDeps is what a groupMember needs from its Subscriber, given
// explicitly so that the member runs against a fake store in tests.
type memberDeps struct {
	group        string
	pollInterval time.Duration
	startLatest  bool // StartFromLatest
	logger       watermill.LoggerAdapter
	stats        *subscriberStats
	// store runs the member's statements; session tells the generation
	// to claim under.
	store   groupStore
	session sessionSource
	// now is the clock of the member's timers (time.Now but in tests).
	now func() time.Time
	// freeGrace is how long a row may stay free before a member whose
	// caps have no room for it claims it (freeRowGrace).
	freeGrace time.Duration
}

// groupStore runs the statements of a group member (pgGroupStore in
// production). ctx bounds the wait for a connection; each statement has
// a timeout of its own. Not for implementing outside this package.
type groupStore interface {
	// partitionCounts reads the partition counts of topics (1 for a topic
	// never created).
	partitionCounts(ctx context.Context, topics []string) (map[string]int, error)
	// ensureOffsets creates the missing offset rows of rows (see
	// offsetStore.ensureMany) and returns those it created.
	ensureOffsets(ctx context.Context, rows []rowKey, latest bool) ([]createdRow, error)
	// claimOffsets claims up to limit of the free rows of rows for
	// session g. An error wrapping errNotSent, ErrDatabaseWentBack (g was
	// dropped) or a *pgconn.PgError means nothing was claimed; after any
	// other the statement may have committed.
	claimOffsets(ctx context.Context, rows []rowKey, g *sessionGen, limit int) ([]claimedRow, error)
	// releaseOffset frees a claim nobody waits for any more.
	releaseOffset(c *claim) error
	// setSubscriptions records set in g's session row; false: the row is
	// gone.
	setSubscriptions(g *sessionGen, set rowSet) (bool, error)
	// groupMembers reads the live members of the group.
	groupMembers() ([]member, error)
	// offsetOwners reads who owns the group's rows of topics, and under
	// which epoch.
	offsetOwners(ctx context.Context, topics []string) (map[rowKey]rowOwner, error)
}

// rowOwner is the owner of an offset row (uuid.Nil: none) and its epoch.
type rowOwner struct {
	session uuid.UUID
	epoch   int64
}

// sessionSource gives the session generation in use (sessionKeeper).
type sessionSource interface {
	// current returns the trusted generation, or nil and a channel
	// closed when there is one.
	current() (*sessionGen, <-chan struct{})
}

// memberSub is what a group member asks of a subscription
// (*subscription): its topic, consumers up to n partitions (returning
// the first partition started), how many partitions it consumes, and to
// end.
type memberSub interface {
	subTopic() string
	grow(n int) (from int)
	partitionCount() int
	stop()
}

func (sub *subscription) subTopic() string { return sub.topic }
func (sub *subscription) stop()            { sub.cancel() }

func newGroupMember(deps memberDeps) *groupMember {
	if deps.now == nil {
		deps.now = time.Now
	}
	return &groupMember{
		memberDeps: deps,
		waiting:    map[rowKey]*consumer{},
		owning:     map[rowKey]*held{},
		unensured:  map[rowKey]struct{}{},
		recreate:   map[rowKey]struct{}{},
		unsettled:  map[rowKey]struct{}{},
		future:     map[rowKey]futureHold{},
		subs:       map[string][]memberSub{},
		unresolved: map[memberSub]uint64{},
		resets:     map[string]struct{}{},
		stale:      true,
		graceWait:  graceState{hint: true},
		kick:       make(chan struct{}, 1),
		outage:     newOutageLog(deps.logger, componentGroup),
	}
}

// wake makes the loop run a step soon.
func (m *groupMember) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// membersChanged marks the group's members stale (a session started,
// ended or changed its topics) and wakes the loop.
func (m *groupMember) membersChanged() {
	m.mu.Lock()
	m.stale = true
	m.graceWait.hint = true // a member that ended leaves its rows free
	m.mu.Unlock()
	m.wake()
}

// pollTick stands in for notifications that do not arrive (see
// wakeHub.pollTick): while consumers wait for their rows, the group is
// read again, so that a row released or left by another member is taken.
func (m *groupMember) pollTick() {
	m.mu.Lock()
	waiting := len(m.waiting) > 0
	m.mu.Unlock()
	if waiting {
		m.membersChanged()
	}
}

// released wakes the loop if topic, a row of which was just released by its
// owner, is one this member subscribes to.
func (m *groupMember) released(topic string) {
	m.mu.Lock()
	ok := len(m.subs[topic]) > 0
	if ok {
		m.graceWait.hint = true
	}
	m.mu.Unlock()
	if ok {
		m.wake()
	}
}

// addSubscription registers sub; the loop reads its topic's partition
// count and starts a consumer per partition (subscription.grow).
func (m *groupMember) addSubscription(sub memberSub) {
	m.mu.Lock()
	topic := sub.subTopic()
	m.subs[topic] = append(m.subs[topic], sub)
	m.marks++
	m.unresolved[sub] = m.marks
	m.mu.Unlock()
	m.wake()
}

// removeSubscription forgets sub, whose context ended.
func (m *groupMember) removeSubscription(sub memberSub) {
	m.mu.Lock()
	defer m.mu.Unlock()
	topic := sub.subTopic()
	if subs := slices.DeleteFunc(m.subs[topic], func(x memberSub) bool { return x == sub }); len(subs) > 0 {
		m.subs[topic] = subs
	} else {
		delete(m.subs, topic)
	}
	delete(m.unresolved, sub)
}

// cancelAll ends every subscription (Close).
func (m *groupMember) cancelAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, subs := range m.subs {
		for _, sub := range subs {
			sub.stop()
		}
	}
}

// ownedRows counts the rows this member holds.
func (m *groupMember) ownedRows() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.owning)
}

// resetCheckInterval is how long the member waits at least between two
// reads of the offset rows that notifications of a reset asked for
// (checkResets): a flood of such notifications, which any role of the
// database can send, costs at most one read per interval.
const resetCheckInterval = 100 * time.Millisecond

// offsetsReset asks the loop to check the rows of topic that this member
// owns: an operator may have reset the group's offsets
// (admin.Inspector.ResetOffsets), which bumps the rows' epochs. The
// notification is only a hint: the loop reads the rows (checkResets) and
// gives up those whose owner or epoch changed; their subscriptions claim
// them again, from the new positions.
func (m *groupMember) offsetsReset(topic string) {
	m.mu.Lock()
	owns := false
	for key := range m.owning {
		if key.topic == topic {
			owns = true
			break
		}
	}
	_, pending := m.resets[topic]
	if owns {
		m.resets[topic] = struct{}{}
	}
	m.mu.Unlock()
	if owns && !pending {
		m.wake()
	}
}

// checkResets reads the rows of the topics offsetsReset was told of, at
// most once per resetCheckInterval, and makes the subscriptions whose row
// another session or epoch owns now give it up (a commit would be refused
// anyway). It returns when to run again for notifications still to check
// (0: none).
func (m *groupMember) checkResets(ctx context.Context) (time.Duration, error) {
	m.mu.Lock()
	if len(m.resets) == 0 {
		m.mu.Unlock()
		return 0, nil
	}
	if wait := resetCheckInterval - m.now().Sub(m.resetChecked); wait > 0 {
		m.mu.Unlock()
		return wait, nil
	}
	topics := make([]string, 0, len(m.resets))
	for t := range m.resets {
		topics = append(topics, t)
	}
	clear(m.resets)
	m.resetChecked = m.now()
	m.mu.Unlock()
	slices.Sort(topics)
	owners, err := m.store.offsetOwners(ctx, topics)
	if err != nil {
		m.mu.Lock()
		for _, t := range topics {
			m.resets[t] = struct{}{}
		}
		m.mu.Unlock()
		return 0, err
	}
	byTopic := map[string][]int32{}
	m.mu.Lock()
	for key, h := range m.owning {
		if !slices.Contains(topics, key.topic) {
			continue
		}
		if o, ok := owners[key]; ok && o.session == h.g.id && o.epoch == h.epoch {
			continue // still this claim's
		}
		select {
		case <-h.yield:
		default:
			close(h.yield)
			byTopic[key.topic] = append(byTopic[key.topic], key.partition)
		}
	}
	m.mu.Unlock()
	for topic, partitions := range byTopic {
		slices.Sort(partitions)
		m.logger.Info("Offsets of the topic were reset: giving its partitions up after the messages in flight, to claim them again from the new positions",
			watermill.LogFields{"topic": topic, "partitions": partitions})
	}
	return 0, nil
}

// topicChanged makes the loop read the partition count of topic again
// (all topics when topic is nil): it was raised, or a notification saying
// so may have been missed.
func (m *groupMember) topicChanged(topic *string) {
	m.mu.Lock()
	for t, subs := range m.subs {
		if topic != nil && *topic != t {
			continue
		}
		for _, sub := range subs {
			m.marks++
			m.unresolved[sub] = m.marks
		}
	}
	m.mu.Unlock()
	m.wake()
}

// register adds c's row to the subscribed set; c then waits for a grant.
func (m *groupMember) register(c *consumer) {
	key := c.row()
	m.mu.Lock()
	m.waiting[key] = c
	m.set.add(key.topic, key.partition)
	m.shape.add(key.topic)
	m.graceWait.hint = true // the row may be free
	m.mu.Unlock()
	m.wake()
}

// unregister removes c's row from the subscribed set. It returns the
// grant c had not taken yet, if any, for c to release.
func (m *groupMember) unregister(c *consumer) (grant, bool) {
	key := c.row()
	m.mu.Lock()
	if m.waiting[key] == c {
		delete(m.waiting, key)
		m.set.remove(key.topic, key.partition)
		m.shape.remove(key.topic)
	} else if h := m.owning[key]; h != nil && h.c == c {
		delete(m.owning, key)
		m.set.remove(key.topic, key.partition)
		m.shape.remove(key.topic)
	}
	m.mu.Unlock()
	m.wake()
	select {
	case gr := <-c.grant:
		return gr, true
	default:
		return grant{}, false
	}
}

// disown moves c back to waiting: it lost or gave up its row.
func (m *groupMember) disown(c *consumer) {
	key := c.row()
	m.mu.Lock()
	if h := m.owning[key]; h != nil && h.c == c {
		delete(m.owning, key)
		m.waiting[key] = c
	}
	m.mu.Unlock()
	m.wake()
}

// run is the member's loop (m.loop), until ctx, which ends with the
// Subscriber's, ends. ctx also bounds the waits of its statements for a
// connection.
func (m *groupMember) run(ctx context.Context) {
	retry := newBackoff(m.pollInterval/20, maxRetryBackoff)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-m.kick:
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		g, ready := m.session.current()
		if g == nil {
			select {
			case <-ready:
				m.wake()
			case <-ctx.Done():
				return
			}
			continue
		}
		sent := time.Now()
		next, err := m.step(ctx, g)
		timer.Stop()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, errSessionGone) && !errors.Is(err, ErrDatabaseWentBack) {
				// (The session keeper logs a database that went back.)
				m.outage.failed(sent, "Cannot split the consumer group's topics, retrying", err, nil)
			}
			timer.Reset(retry.delay())
			continue
		}
		m.outage.ok()
		retry.reset()
		if next > 0 {
			timer.Reset(next)
		}
	}
}

// step brings this member to its share under generation g: creates missing
// offset rows, publishes its topics, reads the group if needed, gives up
// surplus topics and claims up to its share. It returns when it wants to
// run again (0: only when woken).
func (m *groupMember) step(ctx context.Context, g *sessionGen) (time.Duration, error) {
	resetWait, err := m.checkResets(ctx)
	if err != nil {
		return 0, err
	}
	if err := m.resolve(ctx); err != nil {
		return 0, err
	}
	if err := m.ensure(ctx); err != nil {
		return 0, err
	}
	if err := m.publish(g); err != nil {
		return 0, err
	}
	if err := m.readMembers(g); err != nil {
		return 0, err
	}
	plan := m.yieldSurplus(g)
	m.mu.Lock()
	settle := len(m.unsettled) > 0
	m.mu.Unlock()
	if plan.want > 0 || settle {
		full, err := m.claim(ctx, g, plan)
		if err != nil {
			return 0, err
		}
		if full {
			return time.Millisecond, nil // there may be more to claim
		}
	}
	graceWait, err := m.claimBeyond(ctx, g)
	if err != nil {
		return 0, err
	}
	next := m.nextWake(g)
	for _, w := range []time.Duration{resetWait, graceWait} {
		if w > 0 && (next == 0 || w < next) {
			next = w
		}
	}
	return next, nil
}

// claimBeyond claims, once the grace is over (graceState), the free rows
// this member waits for beyond its caps, as extra, and returns when to
// run again for the grace under way (0: none).
func (m *groupMember) claimBeyond(ctx context.Context, g *sessionGen) (time.Duration, error) {
	now := m.now()
	m.mu.Lock()
	// In a group of one version the caps of its members add up to the
	// rows: a free row is always in some member's caps, who claims it.
	var rows []rowKey
	if len(m.others) > 0 {
		rows = claimable(m.waiting, m.future, now)
	}
	due, st := m.graceWait.step(len(rows) > 0, now, m.freeGrace)
	m.graceWait = st
	m.mu.Unlock()
	if !due {
		return st.wait(now), nil
	}
	taken := 0
	err := inChunks(rows, func(chunk []rowKey) error {
		n, _, err := m.claimRowsAs(ctx, g, chunk, len(chunk), true)
		taken += n
		return err
	})
	if err != nil {
		m.mu.Lock()
		m.graceWait.at = now // again at the next step
		m.mu.Unlock()
		return 0, err
	}
	if taken > 0 {
		m.logger.Info("Claiming free topics beyond this member's share: no member took them within the grace "+
			"(members of another release split the group another way); they are kept until the group changes",
			watermill.LogFields{"claimed": taken, "grace": m.freeGrace.String()})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.graceWait.wait(m.now()), nil
}

// resolve reads the partition counts of the topics of new subscriptions (and
// of topics whose count changed), in batches, and has each subscription
// start a consumer per partition. The offset rows of the new partitions
// are created by the ensure that follows, all partitions of a topic in one
// statement (see EnsureOffsets), before their consumers register.
func (m *groupMember) resolve(ctx context.Context) error {
	m.mu.Lock()
	marks := make(map[memberSub]uint64, len(m.unresolved))
	byTopic := map[string][]memberSub{}
	for sub, mark := range m.unresolved {
		marks[sub] = mark
		byTopic[sub.subTopic()] = append(byTopic[sub.subTopic()], sub)
	}
	m.mu.Unlock()
	if len(byTopic) == 0 {
		return nil
	}
	topics := make([]string, 0, len(byTopic))
	for t := range byTopic {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	return inChunks(topics, func(batch []string) error {
		counts, err := m.store.partitionCounts(ctx, batch)
		if err != nil {
			return err
		}
		for _, t := range batch {
			for _, sub := range byTopic[t] {
				m.mu.Lock()
				mark, ok := m.unresolved[sub]
				if ok && mark == marks[sub] {
					delete(m.unresolved, sub)
				}
				m.mu.Unlock()
				if !ok {
					continue
				}
				n := max(counts[t], 1)
				from := sub.grow(n)
				m.mu.Lock()
				for _, r := range partitionRows(t, from, n) {
					m.unensured[r] = struct{}{}
				}
				m.mu.Unlock()
			}
		}
		return nil
	})
}

// ensure creates the offset rows of newly subscribed rows, in batches that
// keep the rows of a topic together, and logs where the rows start when a
// reader of StartFrom could not tell.
func (m *groupMember) ensure(ctx context.Context) error {
	m.mu.Lock()
	rows := make([]rowKey, 0, len(m.unensured))
	for r := range m.unensured {
		rows = append(rows, r)
	}
	m.mu.Unlock()
	slices.SortFunc(rows, compareRows)
	latest := m.startLatest
	return inTopicChunks(rows, func(batch []rowKey) error {
		created, err := m.store.ensureOffsets(ctx, batch, latest)
		if err != nil {
			return err
		}
		recreated := map[rowKey]bool{}
		m.mu.Lock()
		for _, r := range batch {
			delete(m.unensured, r)
			if _, ok := m.recreate[r]; ok {
				recreated[r] = true
				delete(m.recreate, r)
			}
		}
		m.mu.Unlock()
		m.logCreated(created, recreated, latest)
		return nil
	})
}

// logCreated logs, per topic, the offset rows ensure created where
// StartFrom alone does not say where they start: at Info, rows created
// again after they were found missing (deleted by hand, or the group
// removed by Maintenance.RemoveIdleGroupsAfter), with where they start,
// and, under StartFromLatest, rows started at the beginning because the
// group already consumes the topic (partitions added after it started).
// Info, not Error: nothing failed, both follow from something done on
// purpose (Watermill's LoggerAdapter has no Warn level). The rows of a
// group's first start on a topic are logged at Debug.
func (m *groupMember) logCreated(created []createdRow, recreated map[rowKey]bool, latest bool) {
	slices.SortFunc(created, func(a, b createdRow) int { return compareRows(a.row, b.row) })
	type kind struct {
		topic              string
		recreated, atStart bool
	}
	var (
		cur   kind
		parts []int32
		start Position
	)
	flush := func() {
		if len(parts) == 0 {
			return
		}
		fields := watermill.LogFields{"topic": cur.topic, "partitions": parts}
		switch {
		case cur.recreated && cur.atStart:
			fields["start"] = "earliest"
			m.logger.Info("Offset rows were gone (deleted by hand, or the group removed by "+
				"Maintenance.RemoveIdleGroupsAfter) and are created again at the beginning of their partitions, "+
				"since the group still consumes the topic or starts from the earliest: their messages are "+
				"delivered again from the first one", fields)
		case cur.recreated:
			fields["start"], fields["acked_transaction_id"] = "latest", start.TransactionID
			m.logger.Info("Offset rows were gone (deleted by hand, or the group removed by "+
				"Maintenance.RemoveIdleGroupsAfter) and are created again after every message visible now, as for "+
				"a new group (StartFromLatest, and the group had no row of the topic left): messages published "+
				"before are not delivered", fields)
		case latest && cur.atStart:
			fields["start"] = "earliest"
			m.logger.Info("The group consumes the topic already: its partitions without an offset row (added "+
				"after the group started on the topic) are consumed from their first message, StartFromLatest "+
				"notwithstanding", fields)
		default:
			if latest {
				fields["start"], fields["acked_transaction_id"] = "latest", start.TransactionID
			} else {
				fields["start"] = "earliest"
			}
			m.logger.Debug("Offset rows created", fields)
		}
		parts = nil
	}
	for _, c := range created {
		k := kind{topic: c.row.topic, recreated: recreated[c.row], atStart: c.start == (Position{})}
		if k != cur {
			flush()
			cur = k
		}
		parts = append(parts, c.row.partition)
		start = c.start
	}
	flush()
}

// inTopicChunks is inChunks for rows sorted by topic, but a chunk that
// reaches claimBatchMax goes on to the last row of its last topic: a
// chunk holds at most claimBatchMax-1+MaxPartitions rows.
func inTopicChunks(rows []rowKey, f func([]rowKey) error) error {
	for len(rows) > 0 {
		n := min(len(rows), claimBatchMax)
		for n < len(rows) && rows[n].topic == rows[n-1].topic {
			n++
		}
		if err := f(rows[:n]); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// inChunks calls f with consecutive chunks of at most claimBatchMax items,
// until f fails.
func inChunks[T any](items []T, f func([]T) error) error {
	for len(items) > 0 {
		n := min(len(items), claimBatchMax)
		if err := f(items[:n]); err != nil {
			return err
		}
		items = items[n:]
	}
	return nil
}

// publish writes the member's set of topics into its session row when it
// changed, or the generation did, and marks the members stale.
func (m *groupMember) publish(g *sessionGen) error {
	m.mu.Lock()
	set := m.set
	due := m.pubGen != g || m.published != set
	m.mu.Unlock()
	if !due {
		return nil
	}
	ok, err := m.store.setSubscriptions(g, set)
	if err != nil {
		return err
	}
	if !ok {
		return errSessionGone
	}
	m.mu.Lock()
	m.published, m.pubGen, m.stale = set, g, true
	m.mu.Unlock()
	return nil
}

// readMembers reads the live members of the group when they are stale or
// one of them may have expired.
func (m *groupMember) readMembers(g *sessionGen) error {
	m.mu.Lock()
	due := readDue(m.stale, m.me.id, m.members, g.id, m.now())
	m.stale = false
	m.mu.Unlock()
	if !due {
		return nil
	}
	members, err := m.store.groupMembers()
	if err != nil {
		m.membersChanged()
		return err
	}
	i := slices.IndexFunc(members, func(x member) bool { return x.id == g.id })
	if i < 0 {
		return errSessionGone
	}
	m.mu.Lock()
	if !sameGroup(m.members, members) {
		// The group changed: rows held beyond the caps count as any
		// other again (planShare gives up those above the caps now), and
		// free rows are looked for again.
		for _, h := range m.owning {
			h.extra = false
		}
		m.graceWait.hint = true
	}
	m.me, m.members = members[i], members
	m.rememberOwners(members)
	others, was := otherProtocols(members), m.others
	m.others = others
	m.mu.Unlock()
	m.logProtocols(was, others, members)
	if m.afterRead != nil {
		m.afterRead(len(members))
	}
	return nil
}

// logProtocols logs, when they change, the versions of the group's rules
// other than this release's among the members: a group with members of
// another release (a rolling deploy) works, but its share is balanced only
// once they are gone.
func (m *groupMember) logProtocols(was, others []int, members []member) {
	if slices.Equal(was, others) {
		return
	}
	if len(others) == 0 {
		m.logger.Info("Every member of the consumer group follows this release's protocol again",
			watermill.LogFields{"protocol": groupProtocol})
		return
	}
	var owners []string
	for _, x := range members {
		if x.protocol != groupProtocol {
			owners = append(owners, x.owner)
		}
	}
	slices.Sort(owners)
	m.logger.Info("The consumer group has members of another release (a rolling deploy?): they split the "+
		"topics another way, so a free topic that no member's share has room for is taken by any member after "+
		"the grace, and the share is balanced once they are gone",
		watermill.LogFields{"protocol": groupProtocol, "other_protocols": others, "other_members": owners,
			"grace": m.freeGrace.String()})
}

// maxRememberedOwners bounds the owners a member remembers: past it, it
// keeps those of the last read only.
const maxRememberedOwners = 1000

// rememberOwners records the owners of members, for the logs of takeovers
// of sessions that expired and whose row another claim already deleted;
// m.mu must be held.
func (m *groupMember) rememberOwners(members []member) {
	if m.owners == nil || len(m.owners)+len(members) > maxRememberedOwners {
		m.owners = make(map[uuid.UUID]string, len(members))
	}
	for _, x := range members {
		m.owners[x.id] = x.owner
	}
}

// yieldSurplus asks subscriptions to give up the rows this member holds
// above its share or above a topic's cap, the idle ones first, and returns
// the plan (planShare): the share, how many rows it holds under g (not
// counting those asked to go), and what it may claim.
func (m *groupMember) yieldSurplus(g *sessionGen) sharePlan {
	m.mu.Lock()
	defer m.mu.Unlock()
	var mine []heldRow
	for key, h := range m.owning {
		if h.g != g {
			continue // under a lost generation: it is dropping the topic
		}
		select {
		case <-h.yield:
			continue // already asked
		default:
		}
		mine = append(mine, heldRow{row: key, idle: h.c.idle.Load(), since: h.since, extra: h.extra})
	}
	p := planShare(m.members, m.me, m.shape, mine)
	if len(p.yield) == 0 {
		return p
	}
	for _, r := range p.yield {
		close(m.owning[r].yield)
	}
	m.logger.Info("Rebalancing: giving up topics above this member's share", watermill.LogFields{
		"share": p.share, "held": len(mine), "giving_up": len(p.yield)})
	return p
}

// claim takes up to plan.want free rows that this member waits for, no
// more of a topic than its cap allows (claimBuckets), in statements of at
// most claimBatchMax rows, and hands each claim to its subscription. It
// first settles rows whose claim may have committed unseen, whatever the
// share: what is claimed of them is granted or released. It reports
// whether a statement took all it was allowed (more may be free).
func (m *groupMember) claim(ctx context.Context, g *sessionGen, plan sharePlan) (bool, error) {
	m.mu.Lock()
	unsettled := make([]rowKey, 0, len(m.unsettled))
	for r := range m.unsettled {
		unsettled = append(unsettled, r)
	}
	m.mu.Unlock()
	slices.SortFunc(unsettled, compareRows)
	err := inChunks(unsettled, func(batch []rowKey) error {
		if _, _, err := m.claimRows(ctx, g, batch, len(batch)); err != nil {
			return err
		}
		m.mu.Lock()
		for _, r := range batch {
			delete(m.unsettled, r)
		}
		m.mu.Unlock()
		return nil
	})
	if err != nil {
		return false, err
	}
	want := plan.want
	if want == 0 {
		return false, nil
	}
	now := m.now()
	m.mu.Lock()
	rows := claimable(m.waiting, m.future, now)
	m.mu.Unlock()
	for _, b := range claimBuckets(rows, plan) {
		bwant := b.want
		// A chunk of claimBatchMax rows per statement: a statement over
		// every row a member waits for would look at all of them each
		// time.
		for rows := b.rows; len(rows) > 0 && bwant > 0 && want > 0; {
			chunk := rows[:min(len(rows), claimBatchMax)]
			rows = rows[len(chunk):]
			limit := min(bwant, want, claimBatchMax)
			n, raced, err := m.claimRows(ctx, g, chunk, limit)
			if err != nil {
				return false, err
			}
			if n >= limit || raced {
				// The share may allow more (or rows found missing are to be
				// created and claimed), or another member took rows this
				// statement had chosen while others of the chunk may still
				// be free: the next step goes on at once.
				return true, nil
			}
			want -= n
			bwant -= n
		}
	}
	return false, nil
}

// claimRows runs one claim statement for up to limit of rows and handles
// what it says of each. It returns how many rows the statement claimed or
// found missing or refused, and whether it lost rows to another
// transaction.
func (m *groupMember) claimRows(ctx context.Context, g *sessionGen, rows []rowKey, limit int) (n int, raced bool, err error) {
	return m.claimRowsAs(ctx, g, rows, limit, false)
}

// claimRowsAs is claimRows, the rows taken held as extra when extra is
// set (claimBeyond).
func (m *groupMember) claimRowsAs(ctx context.Context, g *sessionGen, rows []rowKey, limit int, extra bool) (n int, raced bool, err error) {
	results, err := m.store.claimOffsets(ctx, rows, g, limit)
	if err != nil {
		if claimOutcomeUnknown(err) {
			// The statement may have committed without its reply.
			m.mu.Lock()
			for _, r := range rows {
				m.unsettled[r] = struct{}{}
			}
			m.mu.Unlock()
		}
		return 0, false, err
	}
	var missing []rowKey
	defer func() { m.recreateRows(missing) }()
	for _, r := range results {
		if r.kind != claimLost {
			n++
		}
		switch r.kind {
		case claimLost:
			raced = true
		case claimMissing:
			m.logger.Debug("The offset row is gone; creating it again",
				watermill.LogFields{"topic": r.row.topic, "partition": r.row.partition})
			missing = append(missing, r.row)
		case claimFuture:
			m.logger.Error("Refusing to claim the topic: its acknowledged position lies ahead of the database's "+
				"transaction counter, so new messages would be skipped; see \"Positions from another cluster\" in "+
				"docs/guarantees.md for the repair", fmt.Errorf("claim %s of consumer group %q: %w",
				r.row, m.group, ErrFuturePosition),
				watermill.LogFields{"topic": r.row.topic, "partition": r.row.partition})
			m.mu.Lock()
			m.future[r.row] = m.future[r.row].next(m.now())
			m.mu.Unlock()
		case claimTaken:
			m.mu.Lock()
			delete(m.future, r.row)
			m.mu.Unlock()
			m.handOver(g, r, extra)
		}
	}
	return n, raced, nil
}

// recreateRows has the next step create the offset rows of missing
// again, with every subscribed partition of their topics (whose rows may
// be gone too, unseen while their owners have nothing to commit), in one
// statement per topic (see EnsureOffsets): a group whose rows were all
// deleted starts again on every partition of a topic at the same place.
func (m *groupMember) recreateRows(missing []rowKey) {
	if len(missing) == 0 {
		return
	}
	m.mu.Lock()
	var subs []memberSub
	topics := map[string]bool{}
	for _, r := range missing {
		m.unensured[r] = struct{}{}
		m.recreate[r] = struct{}{}
		if !topics[r.topic] {
			topics[r.topic] = true
			subs = append(subs, m.subs[r.topic]...)
		}
	}
	m.mu.Unlock()
	// The partition counts under sub.mu, not under m.mu: grow takes
	// sub.mu, then s.mu, and Subscribe holds s.mu to take m.mu.
	partitions := make(map[string]int, len(subs))
	for _, sub := range subs {
		partitions[sub.subTopic()] = max(partitions[sub.subTopic()], sub.partitionCount())
	}
	m.mu.Lock()
	for topic, n := range partitions {
		for p := range n {
			r := rowKey{topic: topic, partition: int32(p)}
			m.unensured[r] = struct{}{}
			m.recreate[r] = struct{}{}
		}
	}
	m.mu.Unlock()
	m.wake()
}

// handOver gives a claim to the subscription of its topic, or releases it
// when nobody of this Subscriber waits for the topic any more. extra: it
// was claimed beyond the caps (claimBeyond).
func (m *groupMember) handOver(g *sessionGen, r claimedRow, extra bool) {
	fields := watermill.LogFields{"topic": r.row.topic, "partition": r.row.partition,
		"session_id": g.id.String(), "epoch": r.claim.epoch,
		"acked_transaction_id": r.claim.acked.TransactionID, "acked_offset": r.claim.acked.Offset}
	m.stats.claims.Add(1)
	switch {
	case r.previous != uuid.Nil && g.keeper != nil && g.keeper.madeBy(r.previous):
		// This Subscriber's own earlier session, replaced after the
		// database restarted, failed over or moved the topic's shard
		// (logged once, by the keeper): not a takeover.
		fields["previous_session_id"] = r.previous.String()
		m.logger.Debug("Topic claimed again by the Subscriber's new session", fields)
	case r.previous != uuid.Nil:
		m.stats.takeovers.Add(1)
		fields["previous_session_id"] = r.previous.String()
		owner := r.previousOwner
		if owner == "" {
			// The session row was gone: an earlier claim of another of
			// its rows deleted it. The member saw it alive.
			m.mu.Lock()
			owner = m.owners[r.previous]
			m.mu.Unlock()
		}
		fields["previous_owner"] = owner
		m.logger.Info("Topic taken over from an expired session", fields)
	default:
		m.logger.Debug("Topic claimed", fields)
	}
	m.mu.Lock()
	c := m.waiting[r.row]
	if c != nil {
		delete(m.waiting, r.row)
		yield := make(chan struct{})
		m.owning[r.row] = &held{c: c, g: g, epoch: r.claim.epoch, yield: yield, since: m.now(), extra: extra}
		c.grant <- grant{g: g, cl: r.claim, yield: yield, hasNext: r.hasNext}
	}
	m.mu.Unlock()
	if c != nil {
		return
	}
	if err := m.store.releaseOffset(r.claim); err != nil && !errors.Is(err, ErrOwnershipLost) &&
		!errors.Is(err, ErrDatabaseWentBack) { // the session was dropped, freeing the row
		m.logger.Error("Cannot release a topic claimed for a subscription that ended; it is free once the session ends",
			err, watermill.LogFields{"topic": r.row.topic, "partition": r.row.partition})
	}
}

// nextWake returns when the loop should run again without being woken:
// while it waits for topics, when another member's session may expire (its
// topics are then to be shared), and every PollInterval while it holds
// less than its share; otherwise never.
func (m *groupMember) nextWake(g *sessionGen) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	owned := 0
	for _, h := range m.owning {
		if h.g == g {
			owned++
		}
	}
	return standbyWait(len(m.waiting) > 0, m.members, m.me, g.id, owned, m.pollInterval, m.now())
}
