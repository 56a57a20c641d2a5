package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// The consumer-group workloads ("a consumer group scales out"): what an idle
// group costs the server as it grows, how fast the group is split again
// after a join and after a kill, and one Subscriber on very many topics.

// groupSizes are the member counts of the idle-group workload;
// watermill-sql runs groupCompared members only.
var groupSizes = []int{1, 3, 10}

const (
	groupCompared = 3

	// The balance workload: balanceMembers members share balanceTopics
	// topics, one more joins, then one of them is killed.
	balanceMembers = 4
	balanceTopics  = 200
	// balanceTimeout bounds each wait for the group to settle.
	balanceTimeout = 2 * time.Minute
)

func groupIdleKey(members int) string { return fmt.Sprintf("group-idle-%d", members) }

func groupIdleWorkload(cfg config) workload {
	w := workload{id: "group-idle", run: runGroupIdle}
	for _, n := range groupSizes {
		m := metric{
			key:         groupIdleKey(n),
			label:       fmt.Sprintf("idle group: %s, %s topics, transactions/s (pg_stat_database)", plural(n, "member"), thousands(cfg.idleTopics)),
			short:       fmt.Sprintf("idle group of %d, %s topics, xact/s", n, thousands(cfg.idleTopics)),
			unit:        "xact/s",
			better:      lowerIsBetter,
			pgleaseOnly: n != groupCompared,
		}
		if n == 3 {
			m.target = target{kind: pgleaseAtMost, value: 15, text: "pglease ≤ 15"}
		}
		w.metrics = append(w.metrics, m)
	}
	return w
}

func balanceWorkload() workload {
	return workload{
		id:          "group-balance",
		pgleaseOnly: true,
		run:         runGroupBalance,
		metrics: []metric{
			{
				key:         "balance-join",
				label:       fmt.Sprintf("group split: a member joins %d on %d topics, until each owns %d±1", balanceMembers, balanceTopics, balanceTopics/(balanceMembers+1)),
				short:       "balance after a join",
				unit:        "s",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
			{
				key:         "balance-kill",
				label:       fmt.Sprintf("group split: 1 of %d members SIGKILLed, until the other %d own %d±1", balanceMembers+1, balanceMembers, balanceTopics/balanceMembers),
				short:       "balance after a kill",
				unit:        "s",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
		},
	}
}

func manyKey(what string, topics int) string { return fmt.Sprintf("many-%s-%d", what, topics) }

func manyTopicsWorkload(topics int) workload {
	prefix := fmt.Sprintf("1 Subscriber, %s topics: ", thousands(topics))
	claim := metric{
		key:         manyKey("claim", topics),
		label:       prefix + "all claimed, from the first Subscribe",
		short:       prefix + "claimed",
		unit:        "s",
		better:      lowerIsBetter,
		pgleaseOnly: true,
	}
	if topics == 100_000 {
		claim.target = target{kind: pgleaseAtMost, value: 60, text: "pglease < 60 s"}
	}
	return workload{
		id:          fmt.Sprintf("many-topics-%d", topics),
		pgleaseOnly: true,
		run: func(ctx context.Context, e *env, h handle) (map[string]float64, error) {
			return runManyTopics(ctx, e, h, topics)
		},
		metrics: []metric{
			claim,
			{
				key:         manyKey("heap", topics),
				label:       prefix + "Go heap and stacks per idle topic, after GC",
				short:       prefix + "memory per topic",
				unit:        "KiB",
				better:      lowerIsBetter,
				target:      target{kind: pgleaseAtMost, value: 8, text: "pglease ≤ 8 KiB"},
				pgleaseOnly: true,
			},
			{
				key:         manyKey("statements", topics),
				label:       prefix + "idle statements/s (pg_stat_statements)",
				short:       prefix + "idle statements/s",
				unit:        "stmt/s",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
			{
				key:         manyKey("transactions", topics),
				label:       prefix + "idle transactions/s (pg_stat_database; only without pg_stat_statements)",
				short:       prefix + "idle transactions/s",
				unit:        "xact/s",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
			{
				key:         manyKey("close", topics),
				label:       prefix + "Close",
				short:       prefix + "Close",
				unit:        "s",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
			{
				key:         manyKey("unreleased", topics),
				label:       prefix + "topics still owned by a live session after Close",
				short:       prefix + "left owned by Close",
				unit:        "topics",
				better:      lowerIsBetter,
				pgleaseOnly: true,
			},
		},
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func topicNames(format string, n int) []string {
	topics := make([]string, n)
	for i := range topics {
		topics[i] = fmt.Sprintf(format, i)
	}
	return topics
}

// initTopics creates the tables of every topic beforehand (one per topic
// for watermill-sql), so that creating them does not compete with the
// polling of the topics subscribed first.
func initTopics(ctx context.Context, e *env, h handle, topics []string) error {
	t0 := time.Now()
	if err := parallel(ctx, 4, len(topics), func(i int) error { return h.initTopic(ctx, topics[i]) }); err != nil {
		return err
	}
	if d := time.Since(t0); d > time.Second {
		e.log("tables of %d topics ready in %s", len(topics), d.Round(time.Millisecond))
	}
	return nil
}

// groupMembers are Subscribers of one consumer group, each with a pool of
// its own.
type groupMembers struct {
	closers []func() error
}

// join adds a member and subscribes it to every topic, from 32 goroutines.
// No message is published to the topics: nobody needs to read the channels.
func (g *groupMembers) join(ctx, subCtx context.Context, h handle, topics []string) error {
	sub, closeFn, err := h.member()
	if err != nil {
		return err
	}
	g.closers = append(g.closers, closeFn)
	return parallel(ctx, 32, len(topics), func(i int) error {
		if _, err := sub.Subscribe(subCtx, topics[i]); err != nil {
			return fmt.Errorf("subscribe to %s: %w", topics[i], err)
		}
		return nil
	})
}

func (g *groupMembers) close() error {
	var errs []error
	for _, c := range g.closers {
		errs = append(errs, c())
	}
	g.closers = nil
	return errors.Join(errs...)
}

// ownerCounts returns how many topics of the consumer group each owning
// session holds, fewest first.
func ownerCounts(ctx context.Context, e *env, h *pgleaseHandle) ([]int, error) {
	rows, err := e.admin.Query(ctx, `SELECT count(*)::int FROM `+h.offsetsTable()+`
		WHERE consumer_group = $1 AND session_id IS NOT NULL GROUP BY session_id ORDER BY 1`, consumerGroup)
	if err != nil {
		return nil, fmt.Errorf("count owned topics: %w", err)
	}
	counts, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("count owned topics: %w", err)
	}
	return counts, nil
}

// ownedCountSQL counts the owned topics of the consumer group in schema ns.
func ownedCountSQL(ns string) string {
	return `SELECT count(*) FROM ` + offsetsTable(ns) + `
		WHERE consumer_group = $1 AND session_id IS NOT NULL`
}

// heldCountSQL counts the topics of the consumer group in schema ns that a
// live session owns: a row that still names a session that ended (Close
// deletes its session row last) is free to claim at once.
func heldCountSQL(ns string) string {
	return `SELECT count(*) FROM ` + offsetsTable(ns) + ` o
		JOIN ` + sessionsTable(ns) + ` s ON s.id = o.session_id AND s.expires_at > now()
		WHERE o.consumer_group = $1`
}

// split is a state of the group to wait for: exactly members sessions own
// topics, each between lo and hi of them, and total in all unless total
// is 0.
type split struct {
	members, lo, hi, total int
}

func (s split) String() string {
	if s.lo == s.hi {
		return fmt.Sprintf("%d members owning %d rows each", s.members, s.lo)
	}
	return fmt.Sprintf("%d members owning %d to %d rows each", s.members, s.lo, s.hi)
}

func (s split) holds(counts []int) bool {
	if len(counts) != s.members {
		return false
	}
	sum := 0
	for _, c := range counts {
		if c < s.lo || c > s.hi {
			return false
		}
		sum += c
	}
	return s.total == 0 || sum == s.total
}

// fairSplit is every topic owned, split as evenly as it goes.
func fairSplit(members, topics int) split {
	return split{members: members, lo: topics / members, hi: (topics + members - 1) / members, total: topics}
}

// waitSplit polls the offsets table every 10 ms until the group is split
// as s says. It returns when the read that saw it was sent (the split
// happened between that read's and the previous read's snapshot).
func waitSplit(ctx context.Context, e *env, h *pgleaseHandle, s split, timeout time.Duration) (time.Time, error) {
	return waitSplitBy(ctx, func(ctx context.Context) ([]int, error) { return ownerCounts(ctx, e, h) }, s, timeout)
}

// waitSplitBy is waitSplit with the rows owned per session counted by
// count. With a timeout of 0 it reads once.
func waitSplitBy(ctx context.Context, count func(context.Context) ([]int, error), s split, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	var counts []int
	for {
		sent := time.Now()
		var err error
		if counts, err = count(ctx); err != nil {
			return time.Time{}, err
		}
		if s.holds(counts) {
			return sent, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no %s within %s; rows (topic, partition) owned per session: %v", s, timeout, counts)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
}

// readTransactions returns the run database's committed and rolled-back
// transactions, read on e.server so that the read itself is not counted.
func readTransactions(ctx context.Context, e *env) (int64, time.Time, error) {
	var n int64
	err := e.server.QueryRow(ctx, `
		SELECT xact_commit + xact_rollback FROM pg_stat_database
		WHERE datname = coalesce(nullif($1, ''), current_database())`, e.database).Scan(&n)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("read pg_stat_database: %w", err)
	}
	return n, time.Now(), nil
}

// window is what the server did in the run's database during an idle
// window.
type window struct {
	secs         float64
	transactions int64
	statements   int64   // -1 without pg_stat_statements
	execMs       float64 // the statements' execution time
}

// measureWindow waits until the server's rate of statements is steady
// (settle: the subscriptions of a group that split its topics still start
// up; without pg_stat_statements, transactions), then cfg.groupSettle more,
// then counts the server's transactions (pg_stat_database) and, with
// pg_stat_statements, its statements during cfg.groupWindow. With
// -statements it prints the busiest statements of the window under title.
//
// A backend reports its transactions to pg_stat_database at most once a
// second; what it ran in the second after a report waits until its next
// transaction or until it has been idle for 10 s. The wait of
// cfg.groupSettle (at least 11 s) lets the reports of the start-up arrive
// before the window opens. None of the function's own reads is counted:
// pg_stat_database is read from another database, and pg_stat_statements
// on one connection of the run's database held throughout, idle for more
// than a second before the window opens, so that what it ran before is
// reported before the first count, and what it runs after the window
// opened is reported at once.
func measureWindow(ctx context.Context, e *env, title string) (window, error) {
	conn, err := e.admin.Acquire(ctx)
	if err != nil {
		return window{}, err
	}
	defer conn.Release()
	if e.stats && e.database != "" {
		// Clear the entries of set-up statements (the DDL of thousands of
		// topics would otherwise crowd the view), as runIdle does.
		_, _ = conn.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	}
	if err := settle(ctx, e); err != nil {
		return window{}, err
	}
	if !sleepCtx(ctx, max(e.cfg.groupSettle, 1100*time.Millisecond)) {
		return window{}, ctx.Err()
	}
	var stmtsBefore statSnapshot
	if e.stats {
		if stmtsBefore, err = takeStatements(ctx, conn); err != nil {
			return window{}, err
		}
	}
	xBefore, t0, err := readTransactions(ctx, e)
	if err != nil {
		return window{}, err
	}
	if !sleepCtx(ctx, e.cfg.groupWindow) {
		return window{}, ctx.Err()
	}
	xAfter, t1, err := readTransactions(ctx, e)
	if err != nil {
		return window{}, err
	}
	w := window{secs: t1.Sub(t0).Seconds(), transactions: xAfter - xBefore, statements: -1}
	if e.stats {
		stmtsAfter, err := takeStatements(ctx, conn)
		if err != nil {
			return window{}, err
		}
		w.statements = stmtsAfter.calls() - stmtsBefore.calls()
		w.execMs = stmtsAfter.execTime() - stmtsBefore.execTime()
		if e.cfg.statements {
			printTopStatements(os.Stderr, title, stmtsBefore, stmtsAfter, 10)
		}
	}
	return w, nil
}

func (w window) String() string {
	s := fmt.Sprintf("%d transactions in %.1fs (%.2f/s)", w.transactions, w.secs, float64(w.transactions)/w.secs)
	if w.statements >= 0 {
		s += fmt.Sprintf(", %d statements (%.2f/s, %.1f ms/s of server time)", w.statements, float64(w.statements)/w.secs, w.execMs/w.secs)
	}
	return s
}

// runGroupIdle: for each size of groupSizes (watermill-sql: groupCompared
// only), that many Subscribers of one consumer group, each with a pool of
// its own and the default configuration, subscribe to the same
// cfg.idleTopics topics, which get no messages. Once the group settled
// (pglease: every topic owned, split evenly) and cfg.groupSettle passed,
// the server's transactions in this database during cfg.groupWindow, per
// second.
func runGroupIdle(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	topics := topicNames("bench_group_%05d", e.cfg.idleTopics)
	if err := initTopics(ctx, e, h, topics); err != nil {
		return nil, err
	}
	ph, isPglease := h.(*pgleaseHandle)
	sizes := groupSizes
	if !isPglease {
		sizes = []int{groupCompared}
	}
	vals := map[string]float64{}
	for _, n := range sizes {
		w, err := groupIdleOnce(ctx, e, h, ph, topics, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", plural(n, "member"), err)
		}
		vals[groupIdleKey(n)] = float64(w.transactions) / w.secs
	}
	return vals, nil
}

func groupIdleOnce(ctx context.Context, e *env, h handle, ph *pgleaseHandle, topics []string, n int) (window, error) {
	var g groupMembers
	defer func() {
		if err := g.close(); err != nil {
			e.log("group idle: close: %v", err)
		}
	}()
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	for range n {
		if err := g.join(ctx, subCtx, h, topics); err != nil {
			return window{}, err
		}
	}
	if ph != nil {
		if _, err := waitSplit(ctx, e, ph, fairSplit(n, len(topics)), balanceTimeout); err != nil {
			return window{}, err
		}
		e.log("group idle, %s: %d topics owned and split after %s", plural(n, "member"), len(topics), time.Since(t0).Round(time.Millisecond))
	}
	w, err := measureWindow(ctx, e, fmt.Sprintf("idle group of %d", n))
	if err != nil {
		return window{}, err
	}
	e.log("group idle, %s: %s", plural(n, "member"), w)
	return w, nil
}

// runGroupBalance: balanceMembers Subscribers of one group, one of them in
// a child process and the others in this one, each with a pool of its own
// and the default configuration, share balanceTopics idle topics. Once
// they are split evenly, one more (in this process) joins: the time from
// its first Subscribe call until the group is split evenly again. Then the
// child is killed with SIGKILL, so that its session stays until it expires
// and nothing is released: the time from the kill until the others own its
// topics, split evenly. Either split counts as even with ±1 topic per
// member.
func runGroupBalance(ctx context.Context, e *env, h handle) (map[string]float64, error) {
	ph := h.(*pgleaseHandle)
	const format = "bench_balance_%03d"
	topics := topicNames(format, balanceTopics)
	if err := h.initTopic(ctx, topics[0]); err != nil { // the schema
		return nil, err
	}
	victim, err := startChild(e, childConfig{Role: childMember, Schema: ph.ns, Conns: e.cfg.memberConns, TopicFormat: format, Topics: balanceTopics})
	if err != nil {
		return nil, err
	}
	defer victim.stop()
	var g groupMembers
	defer func() {
		if err := g.close(); err != nil {
			e.log("group balance: close: %v", err)
		}
	}()
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := victim.waitLine(ctx, "ready", time.Minute); err != nil {
		return nil, err
	}
	for range balanceMembers - 1 {
		if err := g.join(ctx, subCtx, h, topics); err != nil {
			return nil, err
		}
	}
	if _, err := waitSplit(ctx, e, ph, fairSplit(balanceMembers, balanceTopics), balanceTimeout); err != nil {
		return nil, err
	}
	// Let the members finish what the split started.
	if !sleepCtx(ctx, 2*time.Second) {
		return nil, ctx.Err()
	}

	share := balanceTopics / (balanceMembers + 1)
	t0 := time.Now()
	if err := g.join(ctx, subCtx, h, topics); err != nil {
		return nil, err
	}
	at, err := waitSplit(ctx, e, ph, split{members: balanceMembers + 1, lo: share - 1, hi: share + 1}, balanceTimeout)
	if err != nil {
		return nil, fmt.Errorf("after the join: %w", err)
	}
	join := at.Sub(t0)
	if _, err := waitSplit(ctx, e, ph, fairSplit(balanceMembers+1, balanceTopics), balanceTimeout); err != nil {
		return nil, fmt.Errorf("after the join: %w", err)
	}
	if !sleepCtx(ctx, 2*time.Second) {
		return nil, ctx.Err()
	}

	share = balanceTopics / balanceMembers
	t0 = time.Now()
	if err := victim.kill(); err != nil {
		return nil, fmt.Errorf("kill the child: %w", err)
	}
	at, err = waitSplit(ctx, e, ph, split{members: balanceMembers, lo: share - 1, hi: share + 1}, balanceTimeout)
	if err != nil {
		return nil, fmt.Errorf("after the kill: %w", err)
	}
	kill := at.Sub(t0)
	return map[string]float64{"balance-join": join.Seconds(), "balance-kill": kill.Seconds()}, nil
}

// runManyTopics: one Subscriber with the default configuration, in a child
// process of its own, subscribes to topics topics that get no messages
// (their offset rows do not exist yet: the Subscriber creates them). The
// child measures the time from its first Subscribe call until every topic
// is owned; after cfg.groupSettle, the server's statements (without
// pg_stat_statements, transactions) during cfg.groupWindow; then the
// child measures its Go heap and stacks after GC, per topic, and how long
// Close takes.
func runManyTopics(ctx context.Context, e *env, h handle, topics int) (map[string]float64, error) {
	ph := h.(*pgleaseHandle)
	if err := h.initTopic(ctx, "bench_many_warm_up"); err != nil { // the schema
		return nil, err
	}
	c, err := startChild(e, childConfig{Role: childMany, Schema: ph.ns, Conns: e.cfg.conns, TopicFormat: "bench_many_%06d", Topics: topics})
	if err != nil {
		return nil, err
	}
	defer c.stop()
	claimed, err := c.waitNumber(ctx, "claimed ", 6*time.Minute)
	if err != nil {
		return nil, err
	}
	w, err := measureWindow(ctx, e, fmt.Sprintf("1 Subscriber, %s topics", thousands(topics)))
	if err != nil {
		return nil, err
	}
	if err := c.tell("close"); err != nil {
		return nil, fmt.Errorf("tell the child to close: %w", err)
	}
	heap, err := c.waitNumber(ctx, "heap ", time.Minute)
	if err != nil {
		return nil, err
	}
	closed, err := c.waitNumber(ctx, "closed ", 2*time.Minute)
	if err != nil {
		return nil, err
	}
	if err := c.wait(time.Minute); err != nil {
		return nil, fmt.Errorf("child: %w", err)
	}
	// Rows Close did not release within CloseTimeout still name its
	// session, which Close then deletes: they are free, as released ones.
	var unreleased int
	if err := e.admin.QueryRow(ctx, heldCountSQL(ph.ns), consumerGroup).Scan(&unreleased); err != nil {
		return nil, fmt.Errorf("count topics left owned: %w", err)
	}
	e.log("%s topics: claimed in %.2fs; idle: %s; %.0f bytes per topic; Close %.2fs, %d topics left owned",
		thousands(topics), claimed, w, heap, closed, unreleased)
	vals := map[string]float64{
		manyKey("claim", topics):      claimed,
		manyKey("heap", topics):       heap / 1024,
		manyKey("close", topics):      closed,
		manyKey("unreleased", topics): float64(unreleased),
	}
	if w.statements >= 0 {
		vals[manyKey("statements", topics)] = float64(w.statements) / w.secs
	} else {
		vals[manyKey("transactions", topics)] = float64(w.transactions) / w.secs
	}
	return vals, nil
}
