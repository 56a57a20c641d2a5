package pgsql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Driver runs the statements of one set of tables ([Tables]) on one kind
// of database: a single PostgreSQL server ([NewSingleNode]), or a Citus
// cluster whose coordinator holds the tables distributed by
// [Tables.DistributeScript] ([NewCitus]). Each method runs one operation
// (one statement on a single node, sometimes several on Citus) and
// returns typed rows; errors are the database's, unwrapped. A Driver is
// chosen once, from the catalog, by [OpenDriver] (or [Lazy.Get]): nothing
// outside this package asks which kind of database it runs on.
//
// The Citus driver writes every method out, either with statements of its
// own or by an explicit delegation to the single-node one: a method
// added here without its Citus variant does not compile.
//
// Both drivers hold nothing but their Tables: they are safe for
// concurrent use. Not for implementing outside this package. The
// documentation of each operation is on the single-node method.
type Driver interface {
	// Tables are the names the statements run on.
	Tables() *Tables

	// Topics and messages.

	InsertMessages(ctx context.Context, q Querier, p InsertMessagesParams) error
	InsertDelayed(ctx context.Context, q Querier, p InsertMessagesParams) error
	// InsertKeyed and InsertDelayedKeyed are InsertMessages and
	// InsertDelayed that return the 0-based indexes, in order, of the
	// messages they did not store because their idempotency key was
	// stored already (none without keys).
	InsertKeyed(ctx context.Context, q Querier, p InsertMessagesParams) (skipped []int, err error)
	InsertDelayedKeyed(ctx context.Context, q Querier, p InsertMessagesParams) (skipped []int, err error)
	// ForgetKeys empties the keys table's partitions two slots old, one
	// per key class, and returns how many it emptied.
	ForgetKeys(ctx context.Context, q Querier) (emptied int, err error)
	// KeyLanes, AddKeyPartitions, KeysLockHolders and SetKeysSince make
	// the partitions of the key classes in use and let publishers use
	// them (schema version 21; see keys.go).
	KeyLanes(ctx context.Context, q Querier) ([]KeyLane, error)
	AddKeyPartitions(ctx context.Context, q Querier, class int) (made bool, err error)
	KeysLockHolders(ctx context.Context, q Querier) ([]string, error)
	SetKeysSince(ctx context.Context, q Querier, class int) (bool, error)
	UpsertTopic(ctx context.Context, q Querier, p TopicParams) (UpsertTopicResult, error)
	TopicPartitions(ctx context.Context, q Querier, topics []string) (map[string]int, error)
	SelectMessages(ctx context.Context, q Querier, p SelectMessagesParams) (SelectResult, error)
	SelectMessagesAt(ctx context.Context, q Querier, p SelectMessagesAtParams) (SelectResult, error)
	// PositionBounds returns, for each (topic, partition) row, the
	// position below which a later statement may read its messages: on a
	// single node the bound of decision 0008, computed from the sequence
	// and the publishers' locks; it refuses to run at an isolation level
	// other than READ COMMITTED. Citus returns nil (its reads use their
	// worker's xmin horizon).
	PositionBounds(ctx context.Context, q Querier, topics []string, partitions []int32) ([]uint64, error)
	VisibleTopics(ctx context.Context, q Querier, p VisibleTopicsParams) ([]int64, error)

	// Sessions.

	CreateSession(ctx context.Context, q Querier, p SessionParams) (ClusterMark, error)
	HeartbeatSession(ctx context.Context, q Querier, p SessionParams) (HeartbeatRow, error)
	DeleteSession(ctx context.Context, q Querier, p SessionParams) error
	DeleteExpiredSessions(ctx context.Context, q Querier, ttl time.Duration) (int64, error)
	SetSubscriptions(ctx context.Context, q Querier, p SessionParams) (bool, error)
	GroupMembers(ctx context.Context, q Querier, group string) ([]MemberRow, error)

	// Offsets.

	OffsetOwners(ctx context.Context, q Querier, group string, topics []string) ([]OwnerRow, error)
	EnsureOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]EnsuredRow, error)
	ClaimOffsets(ctx context.Context, q Querier, p OffsetsParams) ([]ClaimRow, error)
	CountHeadDelivery(ctx context.Context, q Querier, p OffsetParams) (int32, error)
	CommitOffset(ctx context.Context, q Querier, p OffsetParams) (version string, written bool, err error)
	ReleaseOffset(ctx context.Context, q Querier, p OffsetParams) (int64, error)
	// ReleaseOffsets runs the releases ps (each as ReleaseOffset), and
	// returns the outcome of each, in the order of ps; err is a failure
	// that concerns them all. Each round trip is bounded by timeout: on
	// a single node the releases go in one pipelined batch (one implicit
	// transaction, the rows updated in the order of ps), a statement's
	// error other than ErrWentBack ending the batch; on Citus, where a
	// release is two statements, they run one after another, each with
	// its own outcome.
	ReleaseOffsets(ctx context.Context, q BatchQuerier, ps []OffsetParams, timeout time.Duration) (results []ReleaseResult, err error)
	AckOffset(ctx context.Context, q Querier, p OffsetParams) (AckRow, error)
	// QueueAck is AckOffset sent with the other statements of b (see
	// [QueuedAck]).
	QueueAck(b *pgx.Batch, p OffsetParams) QueuedAck

	// The failure policy (waiting.go).

	LoadWaiting(ctx context.Context, q Querier, p OffsetParams) ([]WaitingRow, error)
	RecordWaiting(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error)
	LoadHandedOut(ctx context.Context, q Querier, p OffsetParams) (mark Position, ok bool, err error)
	MarkHandedOut(ctx context.Context, q Querier, p OffsetParams) error
	DeadLetterOffset(ctx context.Context, q Querier, p WaitingParams) (WaitingRow, error)

	// Maintenance.

	MaintainerAccess(ctx context.Context, q Querier) (AccessRow, error)
	MaintainerHolder(ctx context.Context, q Querier) (HolderRow, error)
	ClaimMaintainer(ctx context.Context, q Querier, p MaintainerParams) (HolderRow, error)
	ReleaseMaintainer(ctx context.Context, q Querier, p MaintainerParams) error
	MoveDueMessages(ctx context.Context, q Querier, p MoveDueParams) (moved int64, nextMs *int64, err error)
	DeleteIdleGroups(ctx context.Context, q Querier, idleFor time.Duration) ([]IdleGroupRow, error)
	RetentionLanes(ctx context.Context, q Querier) ([]LaneRow, error)
	MessagesLockHolders(ctx context.Context, q Querier) ([]string, error)
	SetUsableUntil(ctx context.Context, q Querier, class int, until time.Time) (bool, error)
	RetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error)
	DetachedRetentionPartitions(ctx context.Context, q Querier) ([]PartitionRow, error)
	CreateRetentionPartition(ctx context.Context, db Beginner, p RetentionPartition) error
	DetachRetentionPartition(ctx context.Context, q Querier, p RetentionPartition, finalize bool) error
	DropRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) error
	CallAddRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error)
	CallExpireRetentionPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error)
	CallDropDetachedPartition(ctx context.Context, q Querier, p RetentionPartition) (bool, error)
	UnacknowledgedInPartition(ctx context.Context, q Querier, p RetentionPartition) ([]SkippedRow, error)
	DeleteExpiredKept(ctx context.Context, q Querier, limit int) ([]SkippedRow, error)

	// Inspection (admin.Inspector, the pglease command).

	// InspectSettings sets, until the end of the transaction q runs in
	// (SET LOCAL), what the inspector's reads run with: JIT compilation
	// off; on Citus also one connection per worker for a multi-shard
	// statement (citus.max_adaptive_executor_pool_size = 1), so that a
	// listing reuses the coordinator session's cached connection to each
	// worker instead of opening and closing parallel ones.
	InspectSettings(ctx context.Context, q Querier) error
	InspectSessions(ctx context.Context, q Querier) ([]SessionRow, error)
	InspectLag(ctx context.Context, q Querier, groups, topics []string) ([]LagRow, error)
	InspectHorizon(ctx context.Context, q Querier) (HorizonRow, error)
	// BoundHolder reads the transaction that holds back delivery of the
	// topic's partition: the publisher of it whose registration holds its
	// position bound lowest (topicOnly true); on Citus a backend of the
	// topic's worker (row.Node), or none named where the workers' function
	// is missing (tables distributed by an earlier release).
	BoundHolder(ctx context.Context, q Querier, topic string, partition int32) (row HorizonRow, topicOnly bool, err error)
	// OpenPublishers reads the transactions that published and have not
	// ended, which hold back the later messages of the partitions they
	// published to (ok true); on Citus those of every worker, where they
	// register (row.Node), with the coordinator's session whose
	// transaction each runs (row.Client), or nothing (ok false) where
	// the tables take their positions from the workers' transaction ids
	// (distributed by an earlier release).
	OpenPublishers(ctx context.Context, q Querier) (rows []PublisherRow, ok bool, err error)
	// InspectTopics and InspectTopicsPage read the topics as a schema of
	// the version given has them: they run on the schemas of earlier
	// releases.
	InspectTopics(ctx context.Context, q Querier, schema int) ([]TopicRow, error)
	InspectTopicsPage(ctx context.Context, q Querier, p TopicsPageParams) ([]TopicPageRow, error)
	ResetOffsets(ctx context.Context, q Querier, p ResetParams) ([]ResetRow, error)
	// InspectWorkers reads every worker's horizon and open publishers
	// where the tables are distributed by Citus, with one command on
	// each worker (ok false elsewhere: nothing read).
	InspectWorkers(ctx context.Context, q Querier) (row WorkersRow, ok bool, err error)
	InspectWaiting(ctx context.Context, q Querier, groups, topics []string) ([]WaitingInspectRow, error)

	// The message browser and replay.

	MessagesNewestFirst(ctx context.Context, q Querier, p BrowseParams) ([]BrowseRow, error)
	MessagesByUUID(ctx context.Context, q Querier, topic, id string, preview, limit int) ([]BrowseRow, error)
	DeleteMessagesForReplay(ctx context.Context, q Querier, p ReplayParams) ([]BrowseRow, error)
	TopicDetail(ctx context.Context, q Querier, topic string, schema int) (TopicDetailRow, error)
	CountTopicMessages(ctx context.Context, q Querier, topics []string, capPerTopic int64) ([]TopicCountRow, error)
	EstimateTopicMessages(ctx context.Context, q Querier, topic string) (int64, error)
	LockGroupOffsets(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error)
	GroupLiveOwners(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error)
	DeleteGroupOffsets(ctx context.Context, q Querier, group string, locked []GroupOffsetRow) (DeleteGroupOffsetsResult, error)
}

var (
	_ Driver = singleNode{}
	_ Driver = citus{}
)

// singleNode is the Driver of a single PostgreSQL server: every operation
// one statement.
type singleNode struct {
	t *Tables
	// register: how inserts register (see registering), from the
	// functions the schema has: none before version 18 (the position
	// trigger registers row by row), a position per row in 18 and 19,
	// one per statement since 20. Read once, when the Driver is opened: a
	// Driver opened before a migration keeps it until its process
	// restarts (slower, as correct).
	register registering
}

// citus is the Driver of a Citus cluster (see citus.go). It does not embed
// singleNode: each of its methods is written out (citus_driver.go).
type citus struct {
	t   *Tables
	one singleNode
	// pollPerWorker: the idle poll asks each worker once for all its
	// rows (the workers' WorkerVisibleFunction), rather than with a
	// statement per row. From the catalog, when the Driver is opened: the
	// function is missing where the tables were distributed by an earlier
	// release, until `pglease migrate --citus` runs again; a Driver
	// opened before keeps polling per row until its process restarts.
	pollPerWorker bool
}

// NewSingleNode returns the Driver of t on a single PostgreSQL server,
// without reading the catalog.
func NewSingleNode(t *Tables) Driver { return singleNode{t: t, register: registerPerStatement} }

// NewCitus returns the Driver of t distributed over a Citus cluster,
// without reading the catalog.
func NewCitus(t *Tables) Driver { return citus{t: t, one: singleNode{t: t}, pollPerWorker: true} }

// Tables implements Driver.
func (d singleNode) Tables() *Tables { return d.t }

// OpenDriver reads from the catalog whether the messages table of t is
// distributed by Citus, and returns the Driver of what it found: Citus's,
// or the single node's when the extension is not installed, the messages
// table is a plain table, or it does not exist yet.
func OpenDriver(ctx context.Context, q Querier, t *Tables) (Driver, error) {
	d, _, err := openDriver(ctx, q, t)
	return d, err
}

// openDriver is OpenDriver, and reports whether the messages table
// exists (the answer holds for good only then).
func openDriver(ctx context.Context, q Querier, t *Tables) (d Driver, found bool, err error) {
	var distributed, register, nextPosition, visible bool
	err = q.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1::text) IS NOT NULL,
	pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL
	AND EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'),
	pg_catalog.to_regprocedure($2::text) IS NOT NULL, pg_catalog.to_regprocedure($3::text) IS NOT NULL,
	pg_catalog.to_regprocedure($4::text) IS NOT NULL`,
		t.Messages, t.RegisterFunction()+"(text, integer[])", t.NextPositionFunction()+"(boolean)",
		t.WorkerVisibleFunction()+workerVisibleArgs).Scan(&found, &distributed, &register, &nextPosition, &visible)
	if err != nil {
		return nil, false, err
	}
	if distributed {
		err = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
	WHERE logicalrelid = pg_catalog.to_regclass($1::text))`, t.Messages).Scan(&distributed)
		if err != nil {
			return nil, false, err
		}
	}
	if distributed {
		// The workers' idle poll function exists on the coordinator too
		// (where it refuses to run), created by the same script.
		return citus{t: t, one: singleNode{t: t}, pollPerWorker: visible}, found, nil
	}
	n := singleNode{t: t}
	switch {
	case nextPosition:
		n.register = registerPerStatement
	case register:
		n.register = registerPerRow
	}
	return n, found, nil
}

// BatchQuerier is a Querier that can send a pipelined batch: a
// connection (*pgxpool.Conn, *pgx.Conn) or a pgx.Tx.
type BatchQuerier interface {
	Querier
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ReleaseResult is the outcome of one release of [Driver.ReleaseOffsets]:
// the rows released (0: ownership lost), or the release's error
// ([ErrWentBack] on a single node; any on Citus).
type ReleaseResult struct {
	Released int64
	Err      error
}

// ReleaseOffsets implements Driver: one pipelined batch.
func (d singleNode) ReleaseOffsets(ctx context.Context, q BatchQuerier, ps []OffsetParams, timeout time.Duration) ([]ReleaseResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	batch := &pgx.Batch{}
	for _, p := range ps {
		d.t.ReleaseOffset(p).Queue(batch)
	}
	results := q.SendBatch(ctx, batch)
	out := make([]ReleaseResult, len(ps))
	for i := range ps {
		released, err := ScanRelease(results.QueryRow())
		switch {
		case errors.Is(err, ErrWentBack):
			out[i].Err = err
		case err != nil:
			_ = results.Close()
			return nil, err
		default:
			out[i].Released = released
		}
	}
	if err := results.Close(); err != nil {
		return nil, err
	}
	return out, nil
}

// QueuedAck is an acknowledgement ([Driver.AckOffset]) sent together with
// the statements of a pgx.Batch, made by [Driver.QueueAck]: queued in the
// batch where it is one statement (a single node), else (Citus, where it
// is several) run after the batch on the same connection or transaction.
// Read the batch's results up to it, then call Scan; when Scan reports it
// was not queued, close the results and call Run.
type QueuedAck struct {
	d      Driver
	p      OffsetParams
	queued bool
}

// Scan reads the acknowledgement's row from results, after the rows of
// the statements queued before it. ok is false when the acknowledgement
// was not queued: nothing was read, run it with Run once results are
// closed.
func (a QueuedAck) Scan(results pgx.BatchResults) (r AckRow, ok bool, err error) {
	if !a.queued {
		return AckRow{}, false, nil
	}
	r, err = ScanAck(results.QueryRow())
	return r, true, err
}

// Run runs the acknowledgement on q, the batch's connection or
// transaction, when it was not queued (see Scan).
func (a QueuedAck) Run(ctx context.Context, q Querier) (AckRow, error) {
	if a.queued {
		return AckRow{}, fmt.Errorf("pgsql: the acknowledgement was queued in the batch: read it with Scan")
	}
	return a.d.AckOffset(ctx, q, a.p)
}

// QueueAck implements Driver: the statement queued in b.
func (d singleNode) QueueAck(b *pgx.Batch, p OffsetParams) QueuedAck {
	d.t.AckOffset(p).Queue(b)
	return QueuedAck{d: d, p: p, queued: true}
}
