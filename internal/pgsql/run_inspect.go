package pgsql

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// SessionRow is one consumer session of [InspectSessions].
type SessionRow struct {
	ID            uuid.UUID
	ConsumerGroup string
	Owner         string
	CreatedAt     time.Time
	ExpiresAt     time.Time
	Now           time.Time
	RowsHeld      int64
	Maintainer    bool
}

// InspectSessions returns every consumer session, by group and age.
func (d singleNode) InspectSessions(ctx context.Context, q Querier) ([]SessionRow, error) {
	return collect(ctx, q, d.t.InspectSessions(), pgx.RowToStructByPos[SessionRow])
}

// LagRow is one offset row of [InspectLag].
type LagRow struct {
	ConsumerGroup string
	Topic         string
	Partition     int32
	SessionID     *uuid.UUID
	LiveOwner     *string // nil: no owner, or its session expired
	Epoch         int64
	Acked         Position
	Lag           int64
	LagSeconds    *float64
	Pending       bool
}

// InspectLag returns the owner, position and lag of every offset row of
// the groups and topics (nil: all).
//
// Where the tables are distributed by Citus, it runs one statement per
// topic, routed to the topic's worker, whose snapshot the lag is counted
// against.
func (d singleNode) InspectLag(ctx context.Context, q Querier, groups, topics []string) ([]LagRow, error) {
	return collect(ctx, q, d.t.InspectLag(groups, topics), scanLagRow)
}

func scanLagRow(row pgx.CollectableRow) (LagRow, error) {
	var l LagRow
	err := row.Scan(&l.ConsumerGroup, &l.Topic, &l.Partition, &l.SessionID, &l.LiveOwner, &l.Epoch,
		(*xid8)(&l.Acked.TransactionID), &l.Acked.Offset, &l.Lag, &l.LagSeconds, &l.Pending)
	return l, err
}

// HorizonRow is the row of [InspectHorizon]: the xmin horizon and the
// oldest transaction with a transaction id (PID nil: none).
type HorizonRow struct {
	Xmin                                 uint64
	PID                                  *int32
	GID, AppName, State, Query, DB, User *string
	XactStart, QueryStart                *time.Time
	AgeSeconds                           *float64
	// Node is the Citus worker (host:port, as Citus's node table names
	// it) whose backend PID is, in a row of [Driver.BoundHolder] on
	// Citus; nil elsewhere.
	Node *string
}

// InspectHorizon reads the xmin horizon and the transaction holding it
// back (on the node it runs on: see [Driver.InspectWorkers] for Citus).
func (d singleNode) InspectHorizon(ctx context.Context, q Querier) (HorizonRow, error) {
	s := d.t.InspectHorizon()
	var h HorizonRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan((*xid8)(&h.Xmin), &h.PID, &h.GID, &h.AppName, &h.State,
		&h.XactStart, &h.QueryStart, &h.AgeSeconds, &h.Query, &h.DB, &h.User)
	return h, err
}

// BoundHolder implements Driver: the publisher that holds the topic's
// bound the lowest, Xmin its registered v (no PID: none; a prepared
// transaction has no PID and an empty GID); topicOnly is true.
func (d singleNode) BoundHolder(ctx context.Context, q Querier, topic string, partition int32) (HorizonRow, bool, error) {
	s := d.t.BoundHolder(topic, partition)
	var h HorizonRow
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan((*xid8)(&h.Xmin), &h.PID, &h.GID, &h.AppName, &h.State,
		&h.XactStart, &h.QueryStart, &h.AgeSeconds, &h.Query, &h.DB, &h.User)
	return h, true, err
}

// PublisherRow is one transaction of [Driver.OpenPublishers]: in the
// columns of InspectHorizon (Xmin the lowest position it registered), the
// partitions it holds back that have settings or offset rows, and how
// many it holds back in all (Held; more than the partitions listed when
// some have neither).
//
// On Citus a row is one worker's transaction (Node the worker, PID its
// backend there): a transaction that published to topics on two workers
// is a row on each.
type PublisherRow struct {
	HorizonRow
	Topics     []string
	Partitions []int32
	Held       int
	// GlobalPID, on Citus, is the global process id of the session whose
	// distributed transaction the worker's backend runs (as Citus names
	// it in the backend's application_name); nil on a single node and
	// for a backend that is not one of Citus's connections.
	GlobalPID *int64
	// Client, on Citus, is that session's backend on the coordinator
	// (the transaction to commit, roll back or end there); nil on a
	// single node and where the session is not the coordinator's (a
	// client of a worker) or has ended.
	Client *HorizonRow
}

// OpenPublishers implements Driver.
func (d singleNode) OpenPublishers(ctx context.Context, q Querier) ([]PublisherRow, bool, error) {
	s := d.t.OpenPublishers()
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, true, err
	}
	defer rows.Close()
	var out []PublisherRow
	for rows.Next() {
		var (
			p    PublisherRow
			held int32
		)
		if err := rows.Scan((*xid8)(&p.Xmin), &p.PID, &p.GID, &p.AppName, &p.State, &p.XactStart, &p.QueryStart,
			&p.AgeSeconds, &p.Query, &p.DB, &p.User, &p.Topics, &p.Partitions, &held); err != nil {
			return nil, true, err
		}
		p.Held = int(held)
		out = append(out, p)
	}
	return out, true, rows.Err()
}

// TopicRow is one topic of [InspectTopics].
type TopicRow struct {
	Topic       string
	Partitions  int32
	Groups      int64
	NewestAt    *time.Time
	RetentionUs int64
	// KeyWindowUs is the topic's key_window (0: not set, or a schema
	// before KeyWindowVersion).
	KeyWindowUs int64
	// KeyClassReady reports that publishers may use the partitions of
	// the topic's key class (the class of the longer of its retention and
	// its key window: its retention row's keys_since is set); false
	// before KeyClassesVersion.
	KeyClassReady bool
}

// InspectTopics returns every topic that has messages, settings or offset
// rows, reading what the schema of version schema has. Where the tables
// are distributed by Citus, it reads the topics of every shard of the
// messages table first (run_command_on_shards).
func (d singleNode) InspectTopics(ctx context.Context, q Querier, schema int) ([]TopicRow, error) {
	return collect(ctx, q, d.t.InspectTopics(schema), pgx.RowToStructByPos[TopicRow])
}

// TopicPageRow is one topic of [InspectTopicsPage], with the number of
// topics.
type TopicPageRow struct {
	TopicRow
	Total int64
}

// TopicsPageParams are the arguments of [InspectTopicsPage].
type TopicsPageParams struct {
	// Schema is the tables' schema version (SchemaVersion): the columns
	// an earlier release's schema lacks are read as not set.
	Schema int
	// First selects the first page; otherwise the topics after After.
	First bool
	After string
	// Limit is the most topics returned.
	Limit int
}

// InspectTopicsPage returns at most p.Limit topics, in byte order of
// their names: from the first with p.First, else those after p.After;
// each row carries the number of topics. Where the tables are
// distributed by Citus, it reads the topics of every shard of the
// messages table first.
func (d singleNode) InspectTopicsPage(ctx context.Context, q Querier, p TopicsPageParams) ([]TopicPageRow, error) {
	return collect(ctx, q, d.t.InspectTopicsPage(p), pgx.RowToStructByPos[TopicPageRow])
}

// ResetParams are the arguments of [ResetOffsets].
type ResetParams struct {
	ConsumerGroup string
	Topic         string
	To            string // "earliest", "latest" or "time"
	At            time.Time
	Force         bool
	// Notification is the payload that tells the group's Subscribers of
	// the reset.
	Notification string
}

// ResetRow is one offset row of [ResetOffsets].
type ResetRow struct {
	Partition int32
	SessionID *uuid.UUID
	LiveOwner *string
	From, To  Position
	Applied   bool
	// Changed reports a row whose owner or epoch changed between the
	// statement's snapshot and its lock: nothing was written.
	Changed bool
}

// ResetOffsets sets the acknowledged positions of the rows of the group's
// topic (run EnsureOffsets first, in the same transaction, to create
// missing ones) and bumps each
// row's epoch, so that an owner's later commits are refused. A row
// whose owner session is alive keeps its owner (with force; without
// force it is left alone), others are freed. Whether the owner is
// alive is decided on a snapshot that sees every committed session,
// and a row is written only if its owner and epoch are still those
// of that snapshot when the statement holds its lock: a row changed
// in between (a concurrent claim or release) is left alone and
// reported with changed true; the caller then rolls the transaction
// back and runs the reset again, on a snapshot that sees the change.
// When it writes a row it notifies the group's Subscribers (the "o"
// payload of [Tables.NotifyChannel], p.Notification), for the owners to
// claim their rows again. p.To is "earliest", "latest" or "time" (then
// p.At is the time).
func (d singleNode) ResetOffsets(ctx context.Context, q Querier, p ResetParams) ([]ResetRow, error) {
	t := d.t
	var bounds []int64
	if p.To != "earliest" {
		// The bounds first, in a statement of their own (see
		// Tables.ResetOffsets).
		counts, err := d.TopicPartitions(ctx, q, []string{p.Topic})
		if err != nil {
			return nil, err
		}
		n := max(counts[p.Topic], 1)
		topics, partitions := make([]string, n), make([]int32, n)
		for i := range n {
			topics[i], partitions[i] = p.Topic, int32(i)
		}
		b, err := d.PositionBounds(ctx, q, topics, partitions)
		if err != nil {
			return nil, err
		}
		bounds = make([]int64, len(b))
		for i, v := range b {
			bounds[i] = int64(v)
		}
	}
	s := t.ResetOffsets(p.ConsumerGroup, p.Topic, p.To, p.At, p.Force, t.NotifyChannel, p.Notification, bounds)
	return collect(ctx, q, s, func(row pgx.CollectableRow) (ResetRow, error) {
		var r ResetRow
		err := row.Scan(&r.Partition, &r.SessionID, &r.LiveOwner, (*xid8)(&r.From.TransactionID), &r.From.Offset,
			(*xid8)(&r.To.TransactionID), &r.To.Offset, &r.Applied, &r.Changed)
		return r, err
	})
}

// InspectWorkers implements Driver: on a single node, nothing (ok false).
func (d singleNode) InspectWorkers(_ context.Context, _ Querier) (WorkersRow, bool, error) {
	return WorkersRow{}, false, nil
}
