package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Inspector reads who owns what, how far behind each consumer group is,
// what holds delivery back and the stored messages, for health checks,
// admin pages, the pglease command and metrics. Three methods write:
// [Inspector.ResetOffsets] moves a group's positions and
// [Inspector.DeleteGroupOffsets] deletes a group's rows, both refusing
// rows a live Subscriber owns, and [Inspector.Replay] moves messages from
// one topic to another; every other method only reads. It is safe for concurrent use on a
// *pgxpool.Pool; on a *pgx.Conn or a pgx.Tx, one call at a time.
type Inspector struct {
	db     pglease.DB
	driver *pgsql.Lazy

	// beforeDeleteGroup, when set, runs in DeleteGroupOffsets after the
	// owners were checked and before the rows are deleted (tests only).
	beforeDeleteGroup func()
}

// NewInspector returns an Inspector of tables (pglease.Tables{}: the
// default names) on db, which may be a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. Invalid arguments give an
// error wrapping [pglease.ErrInvalidConfig].
func NewInspector(db pglease.DB, tables pglease.Tables) (*Inspector, error) {
	if check.NilDB(db) {
		return nil, fmt.Errorf("%w: NewInspector needs a *pgxpool.Pool, *pgx.Conn or pgx.Tx, got nil", pglease.ErrInvalidConfig)
	}
	if err := check.TableNames(pgsql.Names(tables)); err != nil {
		return nil, fmt.Errorf("%w: NewInspector: %w", pglease.ErrInvalidConfig, err)
	}
	return &Inspector{db: db, driver: pgsql.NewLazy(pgsql.NewTables(pgsql.Names(tables)))}, nil
}

// validateTopic refuses the topic names that pglease refuses, with an
// error wrapping [pglease.ErrInvalidTopic].
func validateTopic(topic string) error {
	if err := check.Topic(topic, pglease.MaxTopicLength); err != nil {
		return fmt.Errorf("%w: %w", pglease.ErrInvalidTopic, err)
	}
	return nil
}

// readTx begins a transaction (a savepoint on a pgx.Tx) with the
// inspector's settings (pgsql.Driver.InspectSettings), undone when it
// ends. JIT compilation off: the per-row look-ups of Lag and Topics are
// estimated high enough to cross jit_above_cost, and compiling them took
// 200-340 ms of statements that run in a few ms (Topics) or spent a third
// of their time there (Lag on 100,000 rows). On Citus, one connection per
// worker for a statement over every shard: a pglease status call opened
// 10.0-11.5 connections on the workers with Citus's parallel ones, 4.0
// without (docs/scaling.md).
func (i *Inspector) readTx(ctx context.Context) (pgx.Tx, error) {
	tx, err := i.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := i.driver.InspectSettings(ctx, tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// SessionInfo is one consumer session: one per live Subscriber (a row
// whose session expired is kept until it is cleaned up or taken over).
type SessionInfo struct {
	ID            uuid.UUID     `json:"id"`
	ConsumerGroup string        `json:"group"`
	Owner         string        `json:"owner"` // host and pid of the process
	CreatedAt     time.Time     `json:"created_at"`
	ExpiresAt     time.Time     `json:"expires_at"`
	Age           time.Duration `json:"age_ns"`
	// ExpiresIn is how long the session lives without a heartbeat; zero
	// or negative: expired.
	ExpiresIn time.Duration `json:"expires_in_ns"`
	Alive     bool          `json:"alive"`
	// RowsHeld counts the (group, topic, partition) rows it owns.
	RowsHeld int64 `json:"rows_held"`
	// Maintainer tells whether it holds the maintainer's row (see
	// pglease.MaintenanceConfig).
	Maintainer bool `json:"maintainer"`
}

// Sessions returns every consumer session, by group and age.
func (i *Inspector) Sessions(ctx context.Context) ([]SessionInfo, error) {
	tx, err := i.readTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("read sessions: %w", check.MissingSchema(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := i.driver.InspectSessions(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("read sessions: %w", check.MissingSchema(err))
	}
	var out []SessionInfo
	for _, r := range rows {
		s := SessionInfo{ID: r.ID, ConsumerGroup: r.ConsumerGroup, Owner: r.Owner, CreatedAt: r.CreatedAt,
			ExpiresAt: r.ExpiresAt, RowsHeld: r.RowsHeld, Maintainer: r.Maintainer}
		s.Age, s.ExpiresIn = r.Now.Sub(s.CreatedAt), s.ExpiresAt.Sub(r.Now)
		s.Alive = s.ExpiresIn > 0
		out = append(out, s)
	}
	return out, nil
}

// LagInfo is where one consumer group stands on one partition of a topic.
type LagInfo struct {
	ConsumerGroup string `json:"group"`
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	// OwnerSession is the live session that owns the row (uuid.Nil: free,
	// or its owner's session expired); Owner its process.
	OwnerSession uuid.UUID `json:"owner_session"`
	Owner        string    `json:"owner"`
	// OwnerExpired reports a row still held by a session that expired or
	// is gone (its process crashed or paused): the group takes it over
	// soon. False for a free row.
	OwnerExpired bool             `json:"owner_expired"`
	Epoch        int64            `json:"epoch"`
	Position     pglease.Position `json:"position"`
	// Lag counts the messages after the position that every reader can
	// see; LagSeconds is the age of the oldest of them (0 without one).
	Lag        int64   `json:"lag"`
	LagSeconds float64 `json:"lag_seconds"`
	// Pending reports committed messages after the position that wait
	// for an open transaction that published to the same partition before
	// them (on Citus: for an older transaction of the topic's worker to
	// end, see Inspector.Horizon).
	Pending bool `json:"pending"`
	// Waiting counts the messages of the row that failed and wait for
	// their next attempt under a failure policy (SubscriberConfig.Retry);
	// WaitingSince is the first failure of the oldest of them,
	// NextAttempt the earliest next attempt among them (both on the
	// database's clock, nil without any), Attempts the most attempts
	// counted among them.
	Waiting      int        `json:"waiting"`
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	NextAttempt  *time.Time `json:"next_attempt,omitempty"`
	Attempts     int        `json:"waiting_attempts,omitempty"`
}

// LagFilter selects rows of [Inspector.Lag].
type LagFilter struct {
	// ConsumerGroups sets the consumer groups whose rows are selected,
	// default nil: every group.
	ConsumerGroups []string
	// Topics sets the topics whose rows are selected, default nil: every
	// topic.
	Topics []string
}

// Lag returns, for every (group, topic, partition) row that f selects, its
// owner, position and lag. Counting the lag reads the index entries of the
// messages after each position, so its cost grows with the total lag. It
// runs in a transaction of its own (a savepoint on a pgx.Tx) with JIT
// compilation off: compiling its per-row look-ups costs more than it saves.
func (i *Inspector) Lag(ctx context.Context, f LagFilter) ([]LagInfo, error) {
	tx, err := i.readTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("read lag: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := i.driver.InspectLag(ctx, tx, f.ConsumerGroups, f.Topics)
	if err != nil {
		return nil, fmt.Errorf("read lag: %w", check.MissingSchema(err))
	}
	waiting, err := i.driver.InspectWaiting(ctx, tx, f.ConsumerGroups, f.Topics)
	if err != nil {
		return nil, fmt.Errorf("read waiting messages: %w", check.MissingSchema(err))
	}
	type rowKey struct {
		group, topic string
		partition    int32
	}
	waitingOf := make(map[rowKey][]pgsql.WaitingRow, len(waiting))
	for _, w := range waiting {
		waitingOf[rowKey{w.ConsumerGroup, w.Topic, w.Partition}] = w.Entries
	}
	var out []LagInfo
	for _, r := range rows {
		l := LagInfo{ConsumerGroup: r.ConsumerGroup, Topic: r.Topic, Partition: r.Partition, Epoch: r.Epoch,
			Position: pglease.Position(r.Acked), Lag: r.Lag, Pending: r.Pending}
		l.setWaiting(waitingOf[rowKey{r.ConsumerGroup, r.Topic, r.Partition}])
		if r.LiveOwner != nil && r.SessionID != nil {
			l.OwnerSession, l.Owner = *r.SessionID, *r.LiveOwner
		} else if r.SessionID != nil {
			l.OwnerExpired = true
		}
		if r.LagSeconds != nil {
			l.LagSeconds = max(*r.LagSeconds, 0)
		}
		out = append(out, l)
	}
	return out, nil
}

// WaitingInfo is one (consumer group, topic, partition) row with messages
// that failed under a failure policy and wait for their next attempt.
type WaitingInfo struct {
	ConsumerGroup string `json:"group"`
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	// Waiting, WaitingSince, NextAttempt and Attempts are LagInfo's.
	Waiting      int        `json:"waiting"`
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	NextAttempt  *time.Time `json:"next_attempt,omitempty"`
	Attempts     int        `json:"waiting_attempts,omitempty"`
}

// Waiting returns the rows of f's groups and topics that have messages
// waiting for their next attempt under a failure policy
// (SubscriberConfig.Retry), without counting lag: one read of the offsets
// table's rows whose waiting column is not empty.
func (i *Inspector) Waiting(ctx context.Context, f LagFilter) ([]WaitingInfo, error) {
	tx, err := i.readTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("read waiting messages: %w", check.MissingSchema(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := i.driver.InspectWaiting(ctx, tx, f.ConsumerGroups, f.Topics)
	if err != nil {
		return nil, fmt.Errorf("read waiting messages: %w", check.MissingSchema(err))
	}
	var out []WaitingInfo
	for _, r := range rows {
		var l LagInfo
		l.setWaiting(r.Entries)
		if l.Waiting == 0 {
			continue
		}
		out = append(out, WaitingInfo{ConsumerGroup: r.ConsumerGroup, Topic: r.Topic, Partition: r.Partition,
			Waiting: l.Waiting, WaitingSince: l.WaitingSince, NextAttempt: l.NextAttempt, Attempts: l.Attempts})
	}
	return out, nil
}

// setWaiting sets l's waiting messages from the row's entries.
func (l *LagInfo) setWaiting(entries []pgsql.WaitingRow) {
	l.Waiting = len(entries)
	for _, e := range entries {
		l.Attempts = max(l.Attempts, int(e.Attempts))
		if !e.FirstFailure.IsZero() && (l.WaitingSince == nil || e.FirstFailure.Before(*l.WaitingSince)) {
			t := e.FirstFailure
			l.WaitingSince = &t
		}
		if !e.NextAttempt.IsZero() && (l.NextAttempt == nil || e.NextAttempt.Before(*l.NextAttempt)) {
			t := e.NextAttempt
			l.NextAttempt = &t
		}
	}
}

// Horizon is the cluster's xmin horizon, which a writing transaction
// left open holds back (it holds back vacuum), and what holds back
// delivery: with PerTopic, the open publishers of each partition
// (Publishers); without it (Citus tables distributed by an earlier
// release), the horizon of the topic's worker: messages of transactions
// at or above its Xmin are not delivered yet.
type Horizon struct {
	// Xmin is the oldest transaction id still running
	// (pg_snapshot_xmin(pg_current_snapshot())).
	Xmin uint64 `json:"xmin"`
	// Holder is the oldest running transaction that holds it back; nil
	// when no writing transaction runs.
	Holder *HorizonHolder `json:"holder,omitempty"`
	// Node, where the tables are distributed by Citus, names the worker
	// ("host:port") whose horizon this is: Xmin and Holder are those of
	// the worker with the oldest holder (with none, of the first
	// worker). A worker's horizon holds back its vacuum, and, without
	// PerTopic, the delivery of the topics on it. Empty on a single node.
	Node string `json:"node,omitempty"`
	// Client, where the tables are distributed by Citus and Holder is one
	// of Citus's connections (its application is "citus_internal
	// gpid=..."), is the session on the coordinator whose distributed
	// transaction it runs: the one to commit, roll back or end there.
	// nil on a single node, and where the session is not the
	// coordinator's or has ended.
	Client *HorizonHolder `json:"client,omitempty"`
	// Workers, where the tables are distributed by Citus, is every
	// worker's horizon (Xmin is that worker's transaction counter: the
	// workers' counters are unrelated).
	Workers []Horizon `json:"workers,omitempty"`
	// PerTopic reports that delivery is held back per partition, by the
	// open transactions that published to it (positions from a
	// sequence, decision 0008; on Citus, from each worker's), not by the
	// xmin horizon, which then holds back only vacuum. Publishers lists
	// them. It is false on Citus tables distributed by an earlier
	// release, whose positions are the workers' transaction ids (until
	// `pglease migrate --citus` runs again): there each worker's horizon
	// holds back the topics on it.
	PerTopic bool `json:"per_topic"`
	// Publishers, with PerTopic, are the transactions that published
	// and have not ended, oldest first: each holds back the messages
	// stored after its own in the partitions it published to.
	Publishers []OpenPublisher `json:"publishers,omitempty"`
}

// OpenPublisher is a transaction that published and has not ended. On
// Citus it is a transaction on one worker (Node): a transaction that
// published to topics on two workers is listed once for each.
type OpenPublisher struct {
	// HorizonHolder is the transaction's backend; on Citus its backend
	// on the worker (for a distributed transaction, one of Citus's
	// connections: its application is "citus_internal gpid=...").
	HorizonHolder
	// Node, on Citus, is the worker ("host:port") where it published and
	// holds partitions back. Empty on a single node.
	Node string `json:"node,omitempty"`
	// GlobalPID, on Citus, is the global process id of the session whose
	// distributed transaction it is (0: not one of Citus's connections,
	// a session connected to the worker itself).
	GlobalPID int64 `json:"global_pid,omitempty"`
	// Client, on Citus, is that session's backend on the coordinator:
	// the transaction to commit or roll back there, or to end with
	// pg_terminate_backend(Client.PID). nil on a single node, and where
	// the session is not the coordinator's or has ended.
	Client *HorizonHolder `json:"client,omitempty"`
	// Partitions are the partitions it holds back, among those with
	// settings (CreateTopic) or a consumer group's offset row.
	Partitions []TopicPartition `json:"partitions"`
	// Held is how many partitions it holds back in all (more than
	// Partitions when some have neither settings nor offset rows).
	Held int `json:"held"`
}

// TopicPartition names one partition of a topic.
type TopicPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

// HorizonHolder is the oldest running writing transaction.
type HorizonHolder struct {
	// PID is its backend's process id; 0 for a prepared transaction,
	// named by GID.
	PID             int    `json:"pid"`
	GID             string `json:"gid,omitempty"`
	ApplicationName string `json:"application_name"`
	// Database and User are those of its session: the horizon is the
	// whole cluster's, so it may be in another database.
	Database   string    `json:"database"`
	User       string    `json:"user"`
	State      string    `json:"state"`
	XactStart  time.Time `json:"xact_start"`
	QueryStart time.Time `json:"query_start"`
	// Age is how long the transaction has been running. AgeKnown is false
	// when the role may not see the backend's details (it lacks
	// pg_read_all_stats): then Age, the start times and Query are unknown,
	// and the holder may well be old.
	Age      time.Duration `json:"age_ns"`
	AgeKnown bool          `json:"age_known"`
	Query    string        `json:"query"`
}

// Horizon returns the xmin horizon and the transaction holding it back,
// and the open publishers, which hold back delivery (Horizon.PerTopic).
// Reading other users' backends needs the pg_read_all_stats role (or
// superuser); without it the holder is still found, but its age, start
// times and query are unknown (HorizonHolder.AgeKnown is false).
//
// Where the tables are distributed by Citus, it reads every worker's
// horizon and open publishers (run_command_on_workers: a connection to
// each worker): the horizon returned is the one with the oldest holder,
// naming its worker (Horizon.Node), with every worker's in
// Horizon.Workers; each open publisher names its worker and the
// coordinator's session whose transaction it is.
func (i *Inspector) Horizon(ctx context.Context) (Horizon, error) {
	workers, citus, err := i.driver.InspectWorkers(ctx, i.db)
	if err != nil {
		return Horizon{}, fmt.Errorf("inspect the workers: %w", check.MissingSchema(err))
	}
	if citus {
		h := workersHorizon(workers.Horizons)
		h.PerTopic = workers.PerTopic
		for _, p := range workers.Publishers {
			h.Publishers = append(h.Publishers, openPublisherOf(p))
		}
		return h, nil
	}
	r, err := i.driver.InspectHorizon(ctx, i.db)
	if err != nil {
		return Horizon{}, fmt.Errorf("read the xmin horizon: %w", err)
	}
	h := horizonOf(r)
	pubs, perTopic, err := i.driver.OpenPublishers(ctx, i.db)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		// No tables yet: nothing was published, nothing is held back (the
		// horizon itself needs no table).
		pubs, perTopic, err = nil, true, nil
	}
	if err != nil {
		return Horizon{}, fmt.Errorf("read the open publishers: %w", check.MissingSchema(err))
	}
	h.PerTopic = perTopic
	for _, p := range pubs {
		h.Publishers = append(h.Publishers, openPublisherOf(p))
	}
	return h, nil
}

// openPublisherOf is the OpenPublisher of a row of OpenPublishers.
func openPublisherOf(p pgsql.PublisherRow) OpenPublisher {
	o := OpenPublisher{Held: p.Held, Node: deref(p.Node), GlobalPID: deref(p.GlobalPID)}
	if hh := horizonOf(p.HorizonRow).Holder; hh != nil {
		o.HorizonHolder = *hh
	}
	if p.Client != nil {
		o.Client = horizonOf(*p.Client).Holder
	}
	for k, topic := range p.Topics {
		o.Partitions = append(o.Partitions, TopicPartition{Topic: topic, Partition: p.Partitions[k]})
	}
	return o
}

// workersHorizon is the horizon of the worker whose holder is the oldest
// (the first worker's when none has one), with every worker's.
func workersHorizon(nodes []pgsql.NodeHorizonRow) Horizon {
	var out Horizon
	oldest := -1.0
	for k, n := range nodes {
		h := horizonOf(n.HorizonRow)
		h.Node = fmt.Sprintf("%s:%d", n.Node, n.Port)
		if n.Client != nil {
			h.Client = horizonOf(*n.Client).Holder
		}
		out.Workers = append(out.Workers, h)
		age := -1.0
		if h.Holder != nil {
			age = 0 // held, age unknown: older than none
			if h.Holder.AgeKnown {
				age = h.Holder.Age.Seconds()
			}
		}
		if k == 0 || age > oldest {
			oldest = age
			out.Xmin, out.Holder, out.Node, out.Client = h.Xmin, h.Holder, h.Node, h.Client
		}
	}
	return out
}

// horizonOf is the Horizon of a row of InspectHorizon.
func horizonOf(r pgsql.HorizonRow) Horizon {
	h := Horizon{Xmin: r.Xmin}
	if r.PID == nil {
		return h
	}
	hh := &HorizonHolder{PID: int(*r.PID)}
	hh.GID, hh.ApplicationName, hh.State, hh.Query = deref(r.GID), deref(r.AppName), deref(r.State), deref(r.Query)
	hh.Database, hh.User = deref(r.DB), deref(r.User)
	if r.XactStart != nil {
		hh.XactStart = *r.XactStart
	}
	if r.QueryStart != nil {
		hh.QueryStart = *r.QueryStart
	}
	if r.AgeSeconds != nil {
		hh.Age, hh.AgeKnown = time.Duration(*r.AgeSeconds*float64(time.Second)), true
	}
	h.Holder = hh
	return h
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// TopicInfo describes one topic.
type TopicInfo struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	// Retention is how long its messages are kept (0: forever).
	Retention time.Duration `json:"retention_ns"`
	// KeyWindow is the topic's pglease.TopicConfig.KeyWindow as set (0:
	// not set, or a schema before version 22, which has none).
	KeyWindow time.Duration `json:"key_window_ns"`
	// EffectiveKeyWindow is how long the topic recognises an idempotency
	// key at least, so how long after a Publish a retry of it is left
	// out: the longest of Retention, KeyWindow and a day
	// (pglease.KeyWindow); a day while PendingKeyWindow is set, and on a
	// schema before version 21 (which keeps every key for a day); 0 on a
	// schema before version 15, which has no idempotency keys.
	EffectiveKeyWindow time.Duration `json:"effective_key_window_ns"`
	// PendingKeyWindow is the window longer than a day that the topic's
	// Retention or KeyWindow asks for while publishers cannot use it yet:
	// the maintainer has not made the partitions of its key class, or
	// waits for the transactions that had the keys table open to end
	// (see pglease.MaintenanceConfig). 0 when none is pending.
	PendingKeyWindow time.Duration `json:"pending_key_window_ns,omitempty"`
	// Groups counts the consumer groups with an offset row on the topic.
	Groups int64 `json:"groups"`
	// NewestAt is when its newest message was stored (nil: no message).
	NewestAt *time.Time `json:"newest_at,omitempty"`
}

// Topics returns every topic that has messages, settings or offset rows
// (all of them: [Inspector.TopicsPage] reads a page). It runs in a transaction of its own (a savepoint on a pgx.Tx) with JIT
// compilation off: compiling its per-row look-ups costs more than it saves.
// It reads the schema's version first, in that transaction, and reads
// the topics as that version has them: it runs on the schema of an
// earlier release, whose key windows it reports (see
// TopicInfo.EffectiveKeyWindow).
func (i *Inspector) Topics(ctx context.Context) ([]TopicInfo, error) {
	tx, err := i.readTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("read topics: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	schema, err := pgsql.SchemaVersion(ctx, tx, i.driver.Tables())
	if err != nil {
		return nil, fmt.Errorf("read topics: %w", check.MissingSchema(err))
	}
	rows, err := i.driver.InspectTopics(ctx, tx, schema)
	if err != nil {
		return nil, fmt.Errorf("read topics: %w", check.MissingSchema(err))
	}
	var out []TopicInfo
	for _, r := range rows {
		out = append(out, topicInfo(schema, r))
	}
	return out, nil
}

// topicInfo is the TopicInfo of r, read on a schema of version schema.
func topicInfo(schema int, r pgsql.TopicRow) TopicInfo {
	ti := TopicInfo{Topic: r.Topic, Partitions: int(r.Partitions), Groups: r.Groups, NewestAt: r.NewestAt,
		Retention: time.Duration(r.RetentionUs) * time.Microsecond,
		KeyWindow: time.Duration(r.KeyWindowUs) * time.Microsecond}
	ti.EffectiveKeyWindow, ti.PendingKeyWindow = keyWindows(schema, ti.Retention, ti.KeyWindow, r.KeyClassReady)
	return ti
}

// keyWindows returns how long a topic recognises its idempotency keys
// (effective) and the longer window that waits for the maintainer
// (pending, 0 for none), from the topic's retention and key window, on a
// schema of version schema, classReady telling whether publishers may use
// the partitions of its key class (see internal/pgsql/keys.go).
func keyWindows(schema int, retention, keyWindow time.Duration, classReady bool) (effective, pending time.Duration) {
	switch {
	case schema < pgsql.KeysVersion:
		return 0, 0
	case schema < pgsql.KeyClassesVersion:
		return pglease.KeyWindow, 0
	}
	asked := max(retention, keyWindow)
	switch {
	case asked <= pglease.KeyWindow:
		return pglease.KeyWindow, 0
	case !classReady:
		return pglease.KeyWindow, asked
	default:
		return asked, 0
	}
}

// The page sizes of [Inspector.TopicsPage].
const (
	// DefaultTopicsPage is the page size when TopicsParams.Limit is 0.
	DefaultTopicsPage = 100
	// MaxTopicsPage is the largest page.
	MaxTopicsPage = 10000
)

// TopicsParams selects a page of [Inspector.TopicsPage].
type TopicsParams struct {
	// After sets where the page starts: the topics whose names sort after
	// it (byte order), default nil: from the first. The Next of a
	// TopicPage is the After of the next page.
	After *string
	// Limit sets the page size, default DefaultTopicsPage, at most
	// MaxTopicsPage.
	Limit int
}

// TopicPage is a page of topics.
type TopicPage struct {
	Topics []TopicInfo `json:"topics"`
	// Total counts every topic, of every page.
	Total int64 `json:"total"`
	// Next is the After of the next page; nil on the last page.
	Next *string `json:"next,omitempty"`
}

// TopicsPage returns a page of the topics that [Inspector.Topics] returns,
// in byte order of their names, with their number: what a list shows
// however many topics there are.
func (i *Inspector) TopicsPage(ctx context.Context, p TopicsParams) (TopicPage, error) {
	limit := p.Limit
	switch {
	case limit == 0:
		limit = DefaultTopicsPage
	case limit < 0 || limit > MaxTopicsPage:
		return TopicPage{}, fmt.Errorf("pglease: a page of topics holds 1 to %d topics, not %d", MaxTopicsPage, p.Limit)
	}
	tx, err := i.readTx(ctx)
	if err != nil {
		return TopicPage{}, fmt.Errorf("read topics: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	schema, err := pgsql.SchemaVersion(ctx, tx, i.driver.Tables())
	if err != nil {
		return TopicPage{}, fmt.Errorf("read topics: %w", check.MissingSchema(err))
	}
	// One more than the page: whether there is a next one.
	rows, err := i.driver.InspectTopicsPage(ctx, tx, pgsql.TopicsPageParams{Schema: schema, First: p.After == nil,
		After: deref(p.After), Limit: limit + 1})
	if err != nil {
		return TopicPage{}, fmt.Errorf("read topics: %w", check.MissingSchema(err))
	}
	var out TopicPage
	if len(rows) == 0 && p.After != nil {
		// Past the last topic: count them anyway.
		if rows, err = i.driver.InspectTopicsPage(ctx, tx, pgsql.TopicsPageParams{Schema: schema, First: true, Limit: 1}); err != nil {
			return TopicPage{}, fmt.Errorf("read topics: %w", check.MissingSchema(err))
		}
		if len(rows) > 0 {
			out.Total = rows[0].Total
		}
		return out, nil
	}
	for n, r := range rows {
		out.Total = r.Total
		if n == limit {
			next := rows[n-1].Topic
			out.Next = &next
			break
		}
		out.Topics = append(out.Topics, topicInfo(schema, r.TopicRow))
	}
	return out, nil
}

// ResetTo says where [Inspector.ResetOffsets] moves a group's positions.
type ResetTo struct {
	kind string
	at   time.Time
}

var (
	// ResetToEarliest delivers the topic again from its first message.
	ResetToEarliest = ResetTo{kind: "earliest"}
	// ResetToLatest skips every message visible now: delivery goes on
	// with messages of transactions still running or not started.
	ResetToLatest = ResetTo{kind: "latest"}
)

// ResetToTime skips the messages before the first one (in delivery order)
// stored at or after t; with none, it is ResetToLatest.
func ResetToTime(t time.Time) ResetTo { return ResetTo{kind: "time", at: t} }

func (r ResetTo) String() string {
	if r.kind == "time" {
		return "time " + r.at.Format(time.RFC3339Nano)
	}
	return r.kind
}

// ErrOwnedByLiveSession is returned by [Inspector.ResetOffsets] without
// Force when a live session owns a row of the topic.
var ErrOwnedByLiveSession = errors.New("pglease: a live session owns the offsets")

// ResetRefusedError is the error of a reset refused because live sessions
// own rows of the topic; it wraps [ErrOwnedByLiveSession].
type ResetRefusedError struct {
	ConsumerGroup string
	Topic         string
	To            ResetTo
	// Owned are the partitions owned by a live session, with their owner.
	Owned []OffsetReset
}

func (e *ResetRefusedError) Error() string {
	var owners []string
	for _, r := range e.Owned {
		owners = append(owners, fmt.Sprintf("partition %d by %s (session %s)", r.Partition, r.PreviousOwner, r.PreviousOwnerSession))
	}
	return fmt.Sprintf("reset offsets of consumer group %q on topic %q to %s: %v: %s (stop those Subscribers, or force the reset, which fences them)",
		e.ConsumerGroup, e.Topic, e.To, ErrOwnedByLiveSession, strings.Join(owners, ", "))
}

// Unwrap returns ErrOwnedByLiveSession.
func (e *ResetRefusedError) Unwrap() error { return ErrOwnedByLiveSession }

// ResetOffsetsParams select the rows to reset and where to.
type ResetOffsetsParams struct {
	// ConsumerGroup sets the consumer group, default "" (the group named
	// "").
	ConsumerGroup string
	// Topic sets the topic, required; every partition of it is reset.
	Topic string
	// To sets where the positions go, required: ResetToEarliest,
	// ResetToLatest or ResetToTime.
	To ResetTo
	// Force sets whether rows that a live session owns are reset too,
	// default false: refused. Forced, the row's epoch is bumped, so the
	// owner's later commits and releases are refused
	// (pglease.ErrOwnershipLost); notified, the owner stops delivering
	// the partition and claims it again, from the new position. A
	// message it had handed out before may still be processed once.
	Force bool
}

// OffsetReset is what [Inspector.ResetOffsets] did to one partition.
type OffsetReset struct {
	Partition int32 `json:"partition"`
	// PreviousOwner is the live session that owned the row (uuid.Nil:
	// none), fenced by the reset.
	PreviousOwnerSession uuid.UUID        `json:"previous_owner_session"`
	PreviousOwner        string           `json:"previous_owner"`
	From                 pglease.Position `json:"from"`
	To                   pglease.Position `json:"to"`
}

// resetAttempts bounds how many times [Inspector.ResetOffsets] runs the
// reset again after rows changed under it (a concurrent claim or release
// committed between its snapshot and its lock).
const resetAttempts = 5

// ResetOffsets moves the acknowledged positions of every partition of a
// consumer group's topic, in one transaction: all or nothing. Rows that do
// not exist yet are created (to set where a new group starts). Without
// Force it fails with an error wrapping [ErrOwnedByLiveSession], changing
// nothing, while a live session owns a row.
//
// A row that a Subscriber claims (or releases) while the reset runs is
// never reset on what it was before: the reset sees the change when it
// gets the row's lock, rolls back and starts again, so a row a live
// session has just claimed is refused (naming that session) without Force,
// and with Force that session is the one fenced. After a few such rounds,
// under a group that keeps rebalancing, it gives up with an error,
// changing nothing.
func (i *Inspector) ResetOffsets(ctx context.Context, p ResetOffsetsParams) ([]OffsetReset, error) {
	if err := validateTopic(p.Topic); err != nil {
		return nil, err
	}
	if p.To.kind == "" {
		return nil, fmt.Errorf("%w: ResetOffsetsParams.To is not set (ResetToEarliest, ResetToLatest or ResetToTime)", pglease.ErrInvalidConfig)
	}
	what := fmt.Sprintf("reset offsets of consumer group %q on topic %q to %s", p.ConsumerGroup, p.Topic, p.To)
	for range resetAttempts {
		out, owned, changed, err := i.resetOnce(ctx, p)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s: %w", what, err)
		case changed:
			continue
		case len(owned) > 0:
			return nil, &ResetRefusedError{ConsumerGroup: p.ConsumerGroup, Topic: p.Topic, To: p.To, Owned: owned}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: its rows changed owner under it %d times in a row (the group is rebalancing); nothing was reset, try again",
		what, resetAttempts)
}

// resetOnce runs the reset in a transaction of its own and commits it,
// unless a live session owns a row and p.Force is false (owned lists
// those rows) or a row changed between the reset's snapshot and its lock
// (changed): then nothing is written.
func (i *Inspector) resetOnce(ctx context.Context, p ResetOffsetsParams) (out, owned []OffsetReset, changed bool, err error) {
	tx, err := i.db.Begin(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	counts, err := i.driver.TopicPartitions(ctx, tx, []string{p.Topic})
	if err != nil {
		return nil, nil, false, fmt.Errorf("read partition counts: %w", check.MissingSchema(err))
	}
	var (
		topics     []string
		partitions []int32
	)
	for part := range max(counts[p.Topic], 1) {
		topics, partitions = append(topics, p.Topic), append(partitions, int32(part))
	}
	if _, err := i.driver.EnsureOffsets(ctx, tx, pgsql.OffsetsParams{ConsumerGroup: p.ConsumerGroup,
		Topics: topics, Partitions: partitions}); err != nil {
		return nil, nil, false, check.MissingSchema(err)
	}
	rows, err := i.driver.ResetOffsets(ctx, tx, pgsql.ResetParams{ConsumerGroup: p.ConsumerGroup, Topic: p.Topic,
		To: p.To.kind, At: p.To.at, Force: p.Force, Notification: pgsql.ResetNotification(p.ConsumerGroup, p.Topic)})
	if err != nil {
		return nil, nil, false, check.MissingSchema(err)
	}
	for _, row := range rows {
		r := OffsetReset{Partition: row.Partition, From: pglease.Position(row.From), To: pglease.Position(row.To)}
		changed = changed || row.Changed
		if row.LiveOwner != nil && row.SessionID != nil {
			r.PreviousOwnerSession, r.PreviousOwner = *row.SessionID, *row.LiveOwner
			if !row.Applied && !row.Changed {
				owned = append(owned, r)
			}
		}
		out = append(out, r)
	}
	if changed || len(owned) > 0 {
		return nil, owned, changed, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, false, err
	}
	return out, nil, false, nil
}

// SkipMessageParams name the one message [Inspector.SkipMessage] moves a
// consumer group past.
type SkipMessageParams struct {
	// ConsumerGroup sets the consumer group, default "" (the group named
	// "").
	ConsumerGroup string
	// Topic sets the topic, required.
	Topic string
	// Partition sets the partition, default 0.
	Partition int32
	// Position is the message's position (pglease lag, pglease messages,
	// the waiting messages of a failure policy), required.
	Position pglease.Position
	// Force sets whether the message is skipped while a live session owns
	// the partition, default false: refused. Forced, the owner is fenced
	// (as by a forced ResetOffsets) and claims the partition again. Until
	// it learns of the fence (a notification, or its next statement) it
	// may still hand out a message it holds in memory, such as a Nacked
	// one sent out again after NackResendDelay; it commits nothing, and
	// once it has claimed the partition again past the skipped message,
	// that message is not delivered.
	Force bool
}

// SkippedMessage is what [Inspector.SkipMessage] did.
type SkippedMessage struct {
	Partition int32            `json:"partition"`
	Position  pglease.Position `json:"position"`
	// From is the group's position on the partition (unchanged: the
	// messages before the skipped one are still delivered).
	From pglease.Position `json:"from"`
	// PreviousOwner is the live session that owned the row (uuid.Nil:
	// none), fenced by the skip.
	PreviousOwnerSession uuid.UUID `json:"previous_owner_session"`
	PreviousOwner        string    `json:"previous_owner"`
}

// ErrNothingToSkip is returned by [Inspector.SkipMessage] when the group
// has no row for the partition, no message has the position, or the group
// is already past it.
var ErrNothingToSkip = errors.New("pglease: nothing to skip")

// SkipMessage moves a consumer group past exactly one message of a
// partition, such as a message that fails every time, and leaves every
// other message to be delivered: the position is recorded as acknowledged
// above the group's position (as AckInTx records one), so the partition's
// owner skips it and moves over it, and a failure policy's waiting entry
// for it is dropped. It changes nothing and returns an error wrapping
// [ErrOwnedByLiveSession] while a live session owns the partition, unless
// Force; one wrapping [ErrNothingToSkip] when there is nothing to skip.
func (i *Inspector) SkipMessage(ctx context.Context, p SkipMessageParams) (SkippedMessage, error) {
	if err := validateTopic(p.Topic); err != nil {
		return SkippedMessage{}, err
	}
	what := fmt.Sprintf("skip message %d:%d of consumer group %q on topic %q partition %d",
		p.Position.TransactionID, p.Position.Offset, p.ConsumerGroup, p.Topic, p.Partition)
	for range resetAttempts {
		out, done, err := i.skipOnce(ctx, p)
		if err != nil {
			var refused *ResetRefusedError
			if errors.As(err, &refused) {
				return SkippedMessage{}, err
			}
			return SkippedMessage{}, fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return out, nil
		}
	}
	return SkippedMessage{}, fmt.Errorf("%s: its row changed owner under it %d times in a row (the group is rebalancing); nothing was changed, try again",
		what, resetAttempts)
}

// skipOnce runs the skip in a transaction of its own and commits it; done
// is false when the row changed under it (nothing written).
func (i *Inspector) skipOnce(ctx context.Context, p SkipMessageParams) (SkippedMessage, bool, error) {
	tx, err := i.db.Begin(ctx)
	if err != nil {
		return SkippedMessage{}, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := i.driver.Get(ctx, tx); err != nil {
		return SkippedMessage{}, false, check.MissingSchema(err)
	}
	r, err := pgsql.SkipMessage(ctx, tx, i.driver.Tables(), pgsql.SkipParams{ConsumerGroup: p.ConsumerGroup, Topic: p.Topic,
		Partition: p.Partition, Position: pgsql.Position(p.Position), Force: p.Force,
		Notification: pgsql.ResetNotification(p.ConsumerGroup, p.Topic)})
	if err != nil {
		return SkippedMessage{}, false, check.MissingSchema(err)
	}
	out := SkippedMessage{Partition: p.Partition, Position: p.Position, From: pglease.Position(r.From)}
	switch {
	case !r.RowFound:
		return out, false, fmt.Errorf("%w: the group has no position on this partition (it never consumed it)", ErrNothingToSkip)
	case r.Changed:
		return out, false, nil
	case !r.MessageFound:
		return out, false, fmt.Errorf("%w: no message of the partition has this position (see pglease lag or pglease messages)", ErrNothingToSkip)
	case r.AlreadyPast:
		return out, false, fmt.Errorf("%w: the group is already past it (its position is %d:%d)", ErrNothingToSkip,
			r.From.TransactionID, r.From.Offset)
	}
	if r.LiveOwner != nil && r.SessionID != nil {
		out.PreviousOwnerSession, out.PreviousOwner = *r.SessionID, *r.LiveOwner
		if !r.Applied {
			return out, false, &ResetRefusedError{ConsumerGroup: p.ConsumerGroup, Topic: p.Topic,
				To:    ResetTo{kind: fmt.Sprintf("past %d:%d", p.Position.TransactionID, p.Position.Offset)},
				Owned: []OffsetReset{{Partition: p.Partition, PreviousOwnerSession: *r.SessionID, PreviousOwner: *r.LiveOwner, From: out.From}}}
		}
	}
	if !r.Applied {
		return out, false, nil
	}
	return out, true, tx.Commit(ctx)
}
