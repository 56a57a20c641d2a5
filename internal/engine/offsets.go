package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Position is a place in the delivery order of a topic (the root
// package's Position).
type Position = pgsql.Position

// claim is the ownership of one (consumer group, topic, partition) row by
// one session, valid while the session is and until a fenced statement
// finds the row taken.
type claim struct {
	group     string
	topic     string
	partition int32
	sessionID uuid.UUID
	epoch     int64
	// g is the session generation the claim was made under: its
	// identity fences every statement of the claim (sessionGen.here).
	g *sessionGen
	// acked is the last acknowledged position; committed is the last one
	// known to be written. Between the two are acks not committed yet.
	acked     Position
	committed Position
	// version is where the last commit wrote the row (pgsql.OffsetParams.Version).
	version string
	// headOut: the message after acked is handed out (its handler holds
	// it, or nacked it). A commit or release that moves the position
	// records it (pgsql.OffsetParams.HeadOut), so that the claim that
	// hands that message out next counts this delivery in its attempt.
	headOut bool
	// workerHere is, on Citus, the identity of the worker that held the
	// row when it was claimed (pgsql.ClaimRow.WorkerHere): the statements
	// of the claim routed to that worker refuse to run on another server
	// or timeline, as the session's identity fences them elsewhere.
	workerHere string
	// skip are the positions after acked that were acknowledged when the
	// row was claimed (its acked_above: Acks a previous owner gave above
	// a message not acknowledged, AckInTx's): their messages are not
	// handed out again. Read only by the consumer's goroutine.
	skip map[Position]struct{}
	// above are the positions this claim acknowledged above acked
	// (MaxInFlight above 1): the release adds them to the row's
	// acked_above, so that the next owner skips their messages.
	above []Position
}

// skips reports whether the message at pos was acknowledged when the row
// was claimed (skip).
func (c *claim) skips(pos Position) bool {
	_, ok := c.skip[pos]
	return ok
}

// skipSet is the claim's skip of the row's acked_above.
func skipSet(above []pgsql.Position) map[Position]struct{} {
	if len(above) == 0 {
		return nil
	}
	m := make(map[Position]struct{}, len(above))
	for _, p := range above {
		m[Position(p)] = struct{}{}
	}
	return m
}

func (c *claim) row() rowKey { return rowKey{topic: c.topic, partition: c.partition} }

// dirty reports whether acknowledged positions wait to be committed.
func (c *claim) dirty() bool { return c.acked != c.committed }

func (c *claim) params(pos Position) pgsql.OffsetParams {
	return pgsql.OffsetParams{
		ConsumerGroup: c.group,
		Topic:         c.topic,
		Partition:     c.partition,
		SessionID:     c.sessionID,
		Epoch:         c.epoch,
		Position:      pgsql.Position(pos),
		Here:          c.g.here,
		HeadOut:       c.headOut,
		WorkerHere:    c.workerHere,
		AckedAbove:    positionsAbove(c.above, pos),
	}
}

// positionsAbove returns the positions of ps after pos, as statement
// parameters.
func positionsAbove(ps []Position, pos Position) []pgsql.Position {
	out := make([]pgsql.Position, 0, len(ps))
	for _, p := range ps {
		if comparePositions(p, pos) > 0 {
			out = append(out, pgsql.Position(p))
		}
	}
	return out
}

// wentBack turns pgsql.ErrWentBack, the answer of a statement of c run
// elsewhere than where c's session was made, into ErrDatabaseWentBack,
// and drops the session (sessionGen.elsewhere): every position held in
// memory goes with it. Other errors are returned as they are.
func (c *claim) wentBack(err error, what string) error {
	if !errors.Is(err, pgsql.ErrWentBack) {
		return err
	}
	c.g.elsewhereFor(fmt.Sprintf("%s %q partition %d", what, c.topic, c.partition), err)
	return fmt.Errorf("%s %q (epoch %d): %w", what, c.topic, c.epoch, ErrDatabaseWentBack)
}

// offsetStore runs the statements of the offsets table (claims, commits,
// releases) and the consumers' reads of messages, on pooled connections:
// the session heartbeat has a connection of its own (sessionConn), so
// the application's load on the pool cannot make it late. It is safe for
// concurrent use.
type offsetStore struct {
	pool     *pgxpool.Pool
	driver   *pgsql.Lazy
	releases *releaser
	stats    *subscriberStats
	// afterClaim, when set (tests only), runs after every claim statement
	// and turns its outcome into the error it returns, as if the reply had
	// been lost after the claim committed.
	afterClaim func(topics []string) error
	// beforeDeadLetterCopy, when set (tests only), runs in the
	// transaction of a dead-letter move between the move and the copy.
	beforeDeadLetterCopy func()
	// futures logs the stored messages found ahead of the counter, once
	// each.
	futures *futureRows
}

func newOffsetStore(pool *pgxpool.Pool, driver *pgsql.Lazy, releaseTimeout time.Duration, stats *subscriberStats, logger watermill.LoggerAdapter) offsetStore {
	return offsetStore{pool: pool, driver: driver, releases: newReleaser(pool, driver, releaseTimeout, logger), stats: stats,
		futures: &futureRows{logger: logger, seen: map[futureRow]struct{}{}}}
}

// futureRows logs, once per row and Subscriber, a stored message whose
// transaction id lies at or above the database's counter: no transaction
// of this database wrote it (the messages table's trigger sets every
// row's transaction id to its inserting transaction's), so it was copied
// from another cluster or written by the owner with a position of its
// own. The partition is read as if it were not there: the messages
// around it are delivered, and it is delivered, in the order of its
// transaction id, only if the counter ever passes it. The set of rows
// logged is bounded; past the bound, it starts again.
type futureRows struct {
	logger watermill.LoggerAdapter
	mu     sync.Mutex
	seen   map[futureRow]struct{}
}

type futureRow struct {
	row rowKey
	pos Position
}

// maxFutureRowsLogged bounds futureRows.seen.
const maxFutureRowsLogged = 10000

func (f *futureRows) found(row rowKey, m pgsql.MessageRow) {
	k := futureRow{row: row, pos: Position(m.Position)}
	f.mu.Lock()
	_, logged := f.seen[k]
	if !logged {
		if len(f.seen) >= maxFutureRowsLogged {
			clear(f.seen)
		}
		f.seen[k] = struct{}{}
	}
	f.mu.Unlock()
	if logged {
		return
	}
	f.logger.Error("Skipping a stored message that lies ahead of the database's transaction counter: no transaction "+
		"of this database wrote it; it is delivered only if the counter passes it. See \"Positions from another "+
		"cluster\" in docs/guarantees.md", fmt.Errorf("message %s of topic %q: %w", m.UUID, row.topic, ErrFuturePosition),
		watermill.LogFields{"topic": row.topic, "partition": row.partition, "uuid": m.UUID,
			"position": strconv.FormatUint(m.Position.TransactionID, 10) + ":" + strconv.FormatInt(m.Position.Offset, 10)})
}

// execFenced runs exec, a statement fenced by c's session and epoch that
// returns the rows it changed, on a connection of pool. It returns
// ErrOwnershipLost when it changed no row: the claim was taken over.
// action names the statement in errors.
func execFenced(ctx context.Context, pool *pgxpool.Pool, exec func(pgsql.Querier) (int64, error), c *claim, action string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%s %q: %w", action, c.topic, err)
	}
	defer conn.Release()
	n, err := exec(conn)
	if err != nil {
		return fmt.Errorf("%s %q: %w", action, c.topic, err)
	}
	if n == 0 {
		return ownershipLost(action, c)
	}
	return nil
}

// ownershipLost is the error of a fenced statement that changed no row.
func ownershipLost(action string, c *claim) error {
	return fmt.Errorf("%s %q (epoch %d): %w", action, c.topic, c.epoch, ErrOwnershipLost)
}

// errNotSent marks errors of statements that were never sent: no
// connection could be had before the wait context ended.
var errNotSent = errors.New("statement not sent")

// conn waits for a pooled connection while wait lasts, then returns it with
// a context for one statement that ends after timeout, whatever wait does.
// Waiting for a connection is not bounded by the statement's timeout: a
// burst of thousands of subscriptions queues for the pool instead of timing
// out and retrying. Give the connection back with done.
func (s offsetStore) conn(wait context.Context, timeout time.Duration) (*pgxpool.Conn, context.Context, func(), error) {
	conn, err := s.pool.Acquire(wait)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", errNotSent, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	return conn, ctx, func() { cancel(); conn.Release() }, nil
}

// ensureMany creates the missing offset rows of rows at the beginning of
// each topic (a new consumer group reads a topic from its first message),
// or with latest, for topics the group has no row of yet, after every
// message visible now; rows must hold every partition of a topic that is
// to be created. It returns the rows it created and where each starts.
// See conn for wait and timeout.
func (s offsetStore) ensureMany(wait context.Context, timeout time.Duration, group string, rows []rowKey, latest bool) ([]createdRow, error) {
	topics, partitions := splitRows(rows)
	conn, ctx, done, err := s.conn(wait, timeout)
	if err != nil {
		return nil, fmt.Errorf("create offset rows: %w", err)
	}
	defer done()
	res, err := s.driver.EnsureOffsets(ctx, conn, pgsql.OffsetsParams{ConsumerGroup: group, Topics: topics,
		Partitions: partitions, Latest: latest})
	if err != nil {
		return nil, fmt.Errorf("create offset rows: %w", check.MissingSchema(err))
	}
	var created []createdRow
	for _, r := range res {
		created = append(created, createdRow{row: rowKey{topic: r.Topic, partition: r.Partition},
			start: Position{TransactionID: r.AckedTransactionID}})
	}
	return created, nil
}

// createdRow is an offset row that ensureMany created, and the position
// it starts after (the zero Position: the beginning of the partition).
type createdRow struct {
	row   rowKey
	start Position
}

// partitionCounts reads the partition counts of topics (1 for a topic never
// created). See conn for wait and timeout.
func (s offsetStore) partitionCounts(wait context.Context, timeout time.Duration, topics []string) (map[string]int, error) {
	conn, ctx, done, err := s.conn(wait, timeout)
	if err != nil {
		return nil, fmt.Errorf("read partition counts: %w", err)
	}
	defer done()
	return TopicPartitions(ctx, conn, s.driver, topics)
}

// owners reads who owns group's offset rows of topics, and under which
// epoch. See conn for wait and timeout.
func (s offsetStore) owners(wait context.Context, timeout time.Duration, group string, topics []string) (map[rowKey]rowOwner, error) {
	conn, ctx, done, err := s.conn(wait, timeout)
	if err != nil {
		return nil, fmt.Errorf("read the owners of offset rows: %w", err)
	}
	defer done()
	rows, err := s.driver.OffsetOwners(ctx, conn, group, topics)
	if err != nil {
		return nil, fmt.Errorf("read the owners of offset rows: %w", check.MissingSchema(err))
	}
	out := make(map[rowKey]rowOwner, len(rows))
	for _, r := range rows {
		o := rowOwner{epoch: r.Epoch}
		if r.SessionID != nil {
			o.session = *r.SessionID
		}
		out[rowKey{r.Topic, r.Partition}] = o
	}
	return out, nil
}

// rowKey names one (topic, partition) row of a consumer group: the unit of
// ownership.
type rowKey struct {
	topic     string
	partition int32
}

func (r rowKey) String() string {
	return fmt.Sprintf("topic %q partition %d", r.topic, r.partition)
}

// compareRows orders rows by topic (bytewise), then partition.
func compareRows(a, b rowKey) int {
	if c := strings.Compare(a.topic, b.topic); c != 0 {
		return c
	}
	return cmp.Compare(a.partition, b.partition)
}

// splitRows returns the topics and partitions of rows, for statement
// parameters.
func splitRows(rows []rowKey) ([]string, []int32) {
	topics := make([]string, len(rows))
	partitions := make([]int32, len(rows))
	for i, r := range rows {
		topics[i], partitions[i] = r.topic, r.partition
	}
	return topics, partitions
}

// claimKind is what a claim statement says about one topic.
type claimKind byte

const (
	claimTaken   claimKind = pgsql.ClaimTaken   // claimed
	claimMissing claimKind = pgsql.ClaimMissing // no offset row
	claimFuture  claimKind = pgsql.ClaimFuture  // position ahead of the transaction counter
	claimLost    claimKind = pgsql.ClaimLost    // changed by another transaction meanwhile
)

// claimedRow is one row of a claim statement.
type claimedRow struct {
	kind  claimKind
	row   rowKey
	claim *claim // claimTaken only
	// hasNext reports that a message lies after the claimed position.
	hasNext bool
	// previous is the session the row was taken from (uuid.Nil when it was
	// free or already this session's); previousOwner its owner string,
	// empty when that session's row was gone.
	previous      uuid.UUID
	previousOwner string
}

// claimMany claims for the session up to limit of the topics' rows of
// group that are free (see pgsql.Driver.ClaimOffsets). An error
// that wraps errNotSent or a *pgconn.PgError means nothing was claimed;
// after any other the statement may have committed.
func (s offsetStore) claimMany(wait context.Context, timeout time.Duration, group string, rows []rowKey, g *sessionGen, limit int) ([]claimedRow, error) {
	topics, partitions := splitRows(rows)
	conn, ctx, done, err := s.conn(wait, timeout)
	if err != nil {
		return nil, fmt.Errorf("claim topics: %w", err)
	}
	defer done()
	res, err := s.driver.ClaimOffsets(ctx, conn, pgsql.OffsetsParams{ConsumerGroup: group, Topics: topics,
		Partitions: partitions, SessionID: g.id, Here: g.here, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("claim topics: %w", check.MissingSchema(err))
	}
	out := make([]claimedRow, 0, len(res))
	for _, c := range res {
		if c.Kind == pgsql.ClaimWentBack {
			g.elsewhere("a claim of consumer group " + strconv.Quote(group))
			return nil, fmt.Errorf("claim topics: %w", ErrDatabaseWentBack)
		}
		r := claimedRow{kind: claimKind(c.Kind), row: rowKey{topic: c.Topic, partition: c.Partition},
			previous: c.Previous, previousOwner: c.PreviousOwner}
		if r.kind == claimTaken {
			pos := Position(c.Acked)
			r.claim = &claim{group: group, topic: c.Topic, partition: c.Partition, sessionID: g.id, g: g,
				epoch: c.Epoch, acked: pos, committed: pos, workerHere: c.WorkerHere, skip: skipSet(c.AckedAbove)}
			r.hasNext = c.HasNext
		}
		out = append(out, r)
	}
	if s.afterClaim != nil {
		if err := s.afterClaim(topics); err != nil {
			return nil, fmt.Errorf("claim topics: %w", err)
		}
	}
	return out, nil
}

// read runs one SelectMessages (see consumerStore.read): it waits for a
// connection while ctx lasts, then gives the statement timeout.
func (s offsetStore) read(ctx context.Context, timeout time.Duration, p readParams) (rows []storedMessage, pending bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("read messages of topic %q: %w", p.row.topic, err)
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s.stats.reads.Add(1)
	var bound uint64
	if p.bound != nil {
		bound = p.bound.Load()
	}
	res, err := s.driver.SelectMessages(ctx, conn, pgsql.SelectMessagesParams{
		Topic:           p.row.topic,
		Partition:       p.row.partition,
		After:           pgsql.Position(p.after),
		Limit:           p.limit,
		MaxMessageBytes: p.wholeUpTo,
		Here:            p.here,
		WorkerHere:      p.workerHere,
		Bound:           bound,
	})
	if err != nil {
		return nil, false, fmt.Errorf("read messages of topic %q: %w", p.row.topic, check.MissingSchema(err))
	}
	if p.bound != nil {
		// A full read leaves rows below its bound unread, most likely:
		// the next read uses it. After one that was not full, the next
		// computes a new one (a row at or above this one is reported
		// pending meanwhile, so the consumer reads again soon).
		if len(res.Messages) == p.limit {
			p.bound.Store(res.Bound)
		} else {
			p.bound.Store(0)
		}
	}
	if res.WentBack {
		return nil, false, fmt.Errorf("read messages of topic %q after %d:%d: %w", p.row.topic,
			p.after.TransactionID, p.after.Offset, wentBackError(res))
	}
	if res.Future != nil && s.futures != nil {
		s.futures.found(p.row, *res.Future)
	}
	rows = make([]storedMessage, len(res.Messages))
	for i, m := range res.Messages {
		rows[i] = storedMessage{uuid: m.UUID, payload: m.Payload, metadata: m.Metadata, size: m.Size,
			whole: m.Size <= p.wholeUpTo, pos: Position(m.Position)}
	}
	return rows, res.Pending, nil
}

// countHead counts a delivery of the message after c's committed position
// (see pgsql.CountHeadDelivery) and returns the count.
func (s offsetStore) countHead(ctx context.Context, c *claim) (int, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("count delivery of topic %q: %w", c.topic, err)
	}
	defer conn.Release()
	n, err := s.driver.CountHeadDelivery(ctx, conn, c.params(c.committed))
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, ownershipLost("count delivery of topic", c)
		}
		return 0, c.wentBack(fmt.Errorf("count delivery of topic %q: %w", c.topic, check.MissingSchema(err)),
			"count delivery of topic")
	}
	return int(n), nil
}

// commit writes the claim's acknowledged position, starting from the
// version of the row that the claim's last commit wrote. It returns
// ErrOwnershipLost when the row is no longer owned by the claim's session
// and epoch: the position was not written.
func (s offsetStore) commit(ctx context.Context, c *claim) error {
	pos := c.acked
	p := c.params(pos)
	p.Version = c.version
	var version string
	err := execFenced(ctx, s.pool, func(q pgsql.Querier) (int64, error) {
		v, written, err := s.driver.CommitOffset(ctx, q, p)
		if !written {
			return 0, err
		}
		version = v
		return 1, err
	}, c, "commit offset for topic")
	if err != nil {
		err = c.wentBack(err, "commit offset for topic")
		if errors.Is(err, ErrOwnershipLost) {
			s.stats.fenced.Add(1)
		}
		return err
	}
	c.committed = pos
	c.version = version
	return nil
}

// release writes the claim's acknowledged position and frees the row in one
// statement, so that a waiting Subscriber can claim it at once. It returns
// ErrOwnershipLost when the claim was already taken over, and
// ErrDatabaseWentBack when the statement ran elsewhere than the claim's
// session was made, having dropped the session (which frees the row).
// Releases that come together are batched (see releaser).
func (s offsetStore) release(ctx context.Context, c *claim) error {
	p := c.params(c.acked)
	p.NotifyChannel = s.driver.Tables().NotifyChannel
	if err := s.releases.release(ctx, c, p); err != nil {
		err = c.wentBack(err, "release topic")
		if errors.Is(err, ErrOwnershipLost) {
			s.stats.fenced.Add(1)
		}
		return err
	}
	s.stats.releases.Add(1)
	c.committed = c.acked
	return nil
}

// wentBackError is the error of a read that found the database elsewhere
// (res.WentBack): what the topic's worker was and is on Citus, else
// pgsql.ErrWentBack.
func wentBackError(res pgsql.SelectResult) error {
	if res.Elsewhere != nil {
		return res.Elsewhere
	}
	return pgsql.ErrWentBack
}
