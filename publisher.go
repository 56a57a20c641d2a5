package pglease

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/engine"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// DB is what a [Publisher] writes with. *pgxpool.Pool, *pgx.Conn and pgx.Tx
// implement it; with a pgx.Tx every Publish runs inside the caller's
// transaction (the transactional outbox), so the messages commit or roll
// back with the caller's own writes.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PublisherConfig configures a [Publisher]. The zero value is valid.
type PublisherConfig struct {
	// AutoInitializeSchema sets whether the tables are created or migrated
	// before the first Publish, default false. With a pgx.Tx it runs
	// inside that transaction (a savepoint), and its advisory lock is held
	// until the transaction ends. Leave it off when the DDL of [SchemaSQL]
	// is applied by a migration tool, or by `pglease migrate` as the
	// tables' owner.
	AutoInitializeSchema bool

	// Tables sets the names of the tables and their schema, default
	// Tables{}: the default names in the connection's search_path.
	Tables Tables

	// SchemaAdapter is the former name of Tables. Set one of the two:
	// both set to different tables is an error.
	//
	// Deprecated: use Tables. The field will be removed in the next minor
	// release.
	SchemaAdapter Tables

	// PartitionKey sets the function that returns the partition key of
	// a message published to a topic with partitions (see
	// [CreateTopic]), default nil: the value of the message's
	// PartitionKeyMetadata ("partition_key") metadata. Messages with
	// the same key go to the same partition ([PartitionOf]) and are
	// delivered in order. A message with an empty key is placed by a
	// hash of its UUID, which spreads such messages over the partitions
	// with no order between them. An error fails the Publish call
	// before anything is stored. On a topic with one partition the key
	// does not matter.
	PartitionKey func(topic string, msg *message.Message) (string, error)

	// IdempotencyKey sets the function that returns the idempotency key
	// of a message published to a topic, default nil: the value of the
	// message's IdempotencyKeyMetadata ("_pglease_idempotency_key")
	// metadata. An empty key means none. A message whose key its topic
	// stored within the key window (the longest of its retention, its
	// TopicConfig.KeyWindow and a day, [KeyWindow]) is not stored again: the
	// Publish succeeds, and [Publisher.PublishWithResult] says which
	// messages were left out. Return msg.UUID to make every retry of a
	// Publish with the same messages safe. A message without a key is
	// stored as before, by the same statement as before.
	IdempotencyKey func(topic string, msg *message.Message) string

	// RouteToWorkers sets whether, on Citus, a Publish is sent to the
	// worker that holds its topic's shard rather than to the coordinator,
	// default false. The coordinator then neither plans nor relays the
	// insert, which is what limits publishing on a cluster of several
	// workers (docs/scaling.md, "Routing publishes to the workers"). It
	// needs Citus 11 or later, whose workers hold the cluster's metadata
	// (pg_dist_node.hasmetadata, the default), and clients that can
	// connect to the workers.
	//
	// Each worker gets a connection pool of its own (see ConnectWorker),
	// opened on the first Publish routed there and closed by
	// [Publisher.Close]; each worker's calls are group-committed on it.
	// Where the shards are is read from the coordinator's catalog on the
	// first Publish, every RouteRefreshInterval and after a worker could
	// not be reached. Subscribers are notified through the coordinator
	// once the messages are committed.
	//
	// A call goes through the coordinator, as without RouteToWorkers,
	// when its messages are delayed (they go to a table on every node),
	// when its topic's node is the coordinator or a worker without
	// synced metadata (logged once), when the tables are not distributed
	// (logged once: the same configuration serves a single PostgreSQL),
	// and for RouteRetryAfter after a worker's pool could not connect
	// (logged once per outage): only a failure before anything was sent
	// goes to the coordinator, so that nothing is stored twice; any other
	// failure is the call's error. It is an error with a *pgx.Conn (one
	// connection, to one node); with a pgx.Tx it has no effect: the
	// caller's transaction decides where the messages are written.
	RouteToWorkers bool

	// ConnectWorker sets the function that opens the connection pool of
	// a worker, given its address in the coordinator's pg_dist_node
	// (nodename, nodeport), default nil: the coordinator pool's
	// configuration (credentials, TLS, size, hooks) with that host and
	// port. Set it when clients reach the workers at other addresses or
	// with other settings. The Publisher owns the pools it returns and
	// closes them in Close. Used only with RouteToWorkers.
	ConnectWorker func(ctx context.Context, host string, port int) (*pgxpool.Pool, error)

	// RouteRefreshInterval sets how often a routing Publisher reads again
	// where the shards are, default 30s. A Publish sent to a worker that
	// no longer holds its topic's shard (moved by
	// citus_move_shard_placement or a rebalance since) is still stored:
	// that worker forwards it to the new one, in a distributed
	// transaction, slower; from the next read on it goes to the new one.
	RouteRefreshInterval time.Duration
}

// routeForTests turns RouteToWorkers on for every Publisher on a pool:
// the tests' PGLEASE_TEST_CITUS_ROUTE (export_test.go), which runs the
// Citus tests that publish with routing.
var routeForTests bool

// RouteRetryAfter is how long a routing Publisher sends a worker's topics
// through the coordinator after the worker's pool failed to connect.
const RouteRetryAfter = 5 * time.Second

// IdempotencyKeyMetadata is the metadata key of a message's idempotency key
// (see PublisherConfig.IdempotencyKey). The metadata is stored with the
// message, as any other.
const IdempotencyKeyMetadata = "_pglease_idempotency_key"

// KeyWindow is how long a topic without a retention or
// [TopicConfig.KeyWindow] longer than a day remembers an idempotency key
// at least: a Publish of a message whose key a message of the same topic
// was stored with, by a transaction that began less than KeyWindow
// earlier, stores nothing. Keys are kept two to
// three days, then forgotten by the maintainer, which empties a day's
// partition of the keys table at once (nothing to vacuum). A topic whose
// retention ([TopicConfig.Retention]) is longer than a day remembers a
// key for at least its retention, and forgets it two to three slots of
// its retention class later (a slot is at most twice the retention), in
// partitions the maintainer makes for the class; until it has, for a
// day. So does a topic whose TopicConfig.KeyWindow is longer than a day
// and than its retention, for its KeyWindow.
const KeyWindow = pgsql.KeySlotSeconds * time.Second

// PublishResult says what a Publish stored.
type PublishResult struct {
	// AlreadyStored are the indexes, in the messages passed, in order,
	// of the messages not stored because their idempotency key was
	// stored already, by an earlier Publish or an earlier message of the
	// same call. Empty when every message was stored.
	AlreadyStored []int
}

func (c PublisherConfig) validate() error {
	if c.RouteRefreshInterval < 0 {
		return fmt.Errorf("PublisherConfig.RouteRefreshInterval must not be negative, got %s", c.RouteRefreshInterval)
	}
	return checkTables("PublisherConfig", c.Tables, c.SchemaAdapter)
}

// tableNames returns the tables c names: Tables, or the deprecated
// SchemaAdapter when only that is set.
func (c PublisherConfig) tableNames() Tables { return pickTables(c.Tables, c.SchemaAdapter) }

// Publisher is a Watermill [message.Publisher] writing to PostgreSQL. All
// topics share one messages table; a topic needs no set-up.
//
// A Publisher is safe for concurrent use. On a *pgxpool.Pool, Publish calls
// that arrive together are group-committed: written by one statement, each
// caller returning once its own messages are committed, or with the error
// that concerns them. On a *pgx.Conn or a pgx.Tx, which run one statement at
// a time, concurrent Publish calls take turns.
type Publisher struct {
	db     DB
	config PublisherConfig
	logger watermill.LoggerAdapter
	// traces is false when logger is watermill's NopLogger: the trace line
	// of every Publish call then builds no fields (a map per call, a tenth
	// of the client's CPU in the 64-goroutine benchmark).
	traces bool
	// driver runs the statements on config's tables.
	driver *pgsql.Lazy
	// serial is held around every statement when db is not a pool.
	serial *sync.Mutex
	// group batches concurrent Publish calls when db is a pool.
	group *engine.GroupCommitter
	// router sends calls to their topics' Citus workers (RouteToWorkers
	// on a pool), or is nil.
	router *engine.Router

	schema schemaOnce // AutoInitializeSchema

	closeMu   sync.RWMutex
	closed    bool
	inflight  sync.WaitGroup
	closeDone chan struct{} // closed when the first Close returns
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher writing with db: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx. It does not touch the database. A nil logger means
// no logging.
func NewPublisher(db DB, config PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	if isNilDB(db) {
		return nil, fmt.Errorf("%w: NewPublisher needs a *pgxpool.Pool, *pgx.Conn or pgx.Tx, got nil", ErrInvalidConfig)
	}
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	_, nop := logger.(watermill.NopLogger)
	p := &Publisher{db: db, config: config, logger: logger, traces: !nop, closeDone: make(chan struct{}),
		driver: pgsql.NewLazy(config.tableNames().tables())}
	pool, isPool := db.(*pgxpool.Pool)
	if isPool {
		p.group = engine.NewGroupCommitter(pool, p.driver, logger)
	} else {
		p.serial = &sync.Mutex{}
	}
	if routeForTests && isPool {
		config.RouteToWorkers = true
	}
	if config.RouteToWorkers {
		switch _, isTx := db.(pgx.Tx); {
		case isPool:
			var connect engine.ConnectFunc
			if config.ConnectWorker != nil {
				connect = config.ConnectWorker
			}
			p.router = engine.NewRouter(pool, p.driver, connect, logger)
			if config.RouteRefreshInterval > 0 {
				p.router.RefreshInterval = config.RouteRefreshInterval
			}
			p.router.RetryAfter = RouteRetryAfter
		case isTx: // the caller's transaction decides
		default:
			return nil, fmt.Errorf("%w: PublisherConfig.RouteToWorkers needs a *pgxpool.Pool (or a pgx.Tx, where it has no effect), got %T",
				ErrInvalidConfig, db)
		}
	}
	return p, nil
}

// Publish writes msgs to topic atomically, in one statement: either all of
// them are stored, in order, or none and an error is returned. The UUID,
// payload and metadata are kept exactly (a Subscriber adds one metadata
// key on delivery, DeliveryAttemptMetadata). Subscribers listening on the
// messages table are notified when the messages commit. The context of the
// first message bounds the call: if it ends first, Publish returns its
// error, and the messages may or may not have been stored. Publish with no
// messages does nothing.
//
// After [Publisher.Close], Publish returns ErrPublisherClosed.
//
// A message with an idempotency key (see PublisherConfig.IdempotencyKey)
// whose key is stored already is left out, and the call succeeds: a
// Publish retried after an error whose outcome was unknown stores each
// message once. [Publisher.PublishWithResult] says which were left out.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	_, err := p.PublishWithResult(topic, msgs...)
	return err
}

// PublishWithResult is Publish, and returns which messages were left out
// because their idempotency key was stored already.
func (p *Publisher) PublishWithResult(topic string, msgs ...*message.Message) (PublishResult, error) {
	params, err := buildInsertParams(topic, msgs, p.config)
	if err != nil {
		return PublishResult{}, err
	}
	if len(msgs) == 0 {
		return PublishResult{}, nil
	}

	p.closeMu.RLock()
	if p.closed {
		p.closeMu.RUnlock()
		return PublishResult{}, ErrPublisherClosed
	}
	p.inflight.Add(1)
	p.closeMu.RUnlock()
	defer p.inflight.Done()

	ctx := msgs[0].Context()
	if p.serial != nil {
		p.serial.Lock()
		defer p.serial.Unlock()
	}
	if err := p.initializeSchema(ctx); err != nil {
		return PublishResult{}, err
	}
	params.NotifyChannel = p.driver.Tables().NotifyChannel
	var skipped []int
	switch {
	case params.DueAt != nil:
		skipped, err = execDelayed(ctx, p.db, p.driver, params)
	case p.router != nil:
		var routed bool
		if skipped, routed, err = p.router.Publish(ctx, params); !routed {
			skipped, err = p.group.PublishKeyed(ctx, params)
		}
	case p.group != nil:
		skipped, err = p.group.PublishKeyed(ctx, params)
	default:
		skipped, err = engine.InsertKeyed(ctx, p.db, p.driver, params)
	}
	if err != nil {
		return PublishResult{}, fmt.Errorf("publish %s to topic %q: %w", countMessages(len(msgs)), topic, err)
	}
	if len(skipped) > 0 {
		p.logger.Debug("Messages already stored left out", watermill.LogFields{"topic": topic, "count": len(skipped)})
	}
	if p.traces {
		p.logger.Trace("Messages published", watermill.LogFields{"topic": topic, "count": len(msgs) - len(skipped)})
	}
	return PublishResult{AlreadyStored: skipped}, nil
}

// countMessages says "1 message" or "n messages".
func countMessages(n int) string {
	if n == 1 {
		return "1 message"
	}
	return strconv.Itoa(n) + " messages"
}

// Close makes later Publish calls fail with ErrPublisherClosed and waits for
// the ones under way. It does not close db, which belongs to the caller; it
// closes the workers' pools it opened (RouteToWorkers). It is idempotent,
// and a call made while another is under way returns when that one is done.
func (p *Publisher) Close() error {
	p.closeMu.Lock()
	if p.closed {
		p.closeMu.Unlock()
		<-p.closeDone // a concurrent Close may still be waiting
		return nil
	}
	p.closed = true
	p.closeMu.Unlock()
	defer close(p.closeDone)
	p.inflight.Wait()
	if p.group != nil {
		p.group.Wait()
	}
	if p.router != nil {
		p.router.Close()
	}
	return nil
}

func (p *Publisher) initializeSchema(ctx context.Context) error {
	if !p.config.AutoInitializeSchema {
		return nil
	}
	return p.schema.run(ctx, p.db, p.driver.Tables())
}

// buildInsertParams validates topic and msgs and returns the parameters that
// write them, placed by config.PartitionKey, with the idempotency keys of
// config.IdempotencyKey.
func buildInsertParams(topic string, msgs []*message.Message, config PublisherConfig) (pgsql.InsertMessagesParams, error) {
	keyFunc := config.PartitionKey
	if err := validateTopic(topic); err != nil {
		return pgsql.InsertMessagesParams{}, err
	}
	params := pgsql.InsertMessagesParams{
		Topics:   make([]string, len(msgs)),
		UUIDs:    make([]string, len(msgs)),
		Payloads: make([][]byte, len(msgs)),
		Metadata: make([]string, len(msgs)),
	}
	now := time.Now()
	for i, msg := range msgs {
		if msg == nil {
			return params, fmt.Errorf("%w: message %d of %d is nil", ErrInvalidMessage, i, len(msgs))
		}
		if msg.UUID == "" {
			return params, fmt.Errorf("%w: UUID of message %d is empty", ErrInvalidMessage, i)
		}
		if !validText(msg.UUID) {
			return params, fmt.Errorf("%w: UUID of message %d must be UTF-8 without NUL bytes", ErrInvalidMessage, i)
		}
		for k, v := range msg.Metadata {
			if !validText(k) || !validText(v) {
				return params, fmt.Errorf("%w: metadata %q of message %s must be UTF-8 without NUL bytes", ErrInvalidMessage, k, msg.UUID)
			}
		}
		due, delayed, err := messageDue(msg.Metadata, now)
		if err != nil {
			return params, fmt.Errorf("message %s: %w", msg.UUID, err)
		}
		if delayed {
			if params.DueAt == nil {
				params.DueAt = make([]time.Time, len(msgs))
			}
			params.DueAt[i] = due
		}
		h, keyed, err := partitionHash(keyFunc, topic, msg)
		if err != nil {
			return params, fmt.Errorf("partition key of message %s for topic %q: %w", msg.UUID, topic, err)
		}
		if keyed && params.PartitionHashes == nil {
			// The first message with a key: the ones before it are
			// placed by their UUID's hash, here rather than by the server.
			params.PartitionHashes = make([]uint32, len(msgs))
			for j := range i {
				params.PartitionHashes[j] = engine.KeyHash(msgs[j].UUID)
			}
		}
		if params.PartitionHashes != nil {
			if !keyed {
				h = engine.KeyHash(msg.UUID) // among keyed messages: placed by its UUID here
			}
			params.PartitionHashes[i] = h
		}
		if k := idempotencyKey(config.IdempotencyKey, topic, msg); k != "" {
			if !validText(k) {
				return params, fmt.Errorf("%w: idempotency key of message %s must be UTF-8 without NUL bytes", ErrInvalidMessage, msg.UUID)
			}
			if params.Keys == nil {
				params.Keys = make([]string, len(msgs))
			}
			params.Keys[i] = keyDigest(k)
		}
		params.Topics[i] = topic
		params.UUIDs[i] = msg.UUID
		params.Payloads[i] = msg.Payload
		if len(msg.Metadata) > 0 { // no metadata is stored as NULL
			b, err := json.Marshal(msg.Metadata)
			if err != nil {
				return params, fmt.Errorf("%w: encode metadata of message %s: %w", ErrInvalidMessage, msg.UUID, err)
			}
			params.Metadata[i] = string(b)
		}
	}
	return params, nil
}

func isNilDB(db DB) bool { return check.NilDB(db) }

// idempotencyKey is msg's idempotency key: f's, or without f the
// metadata's; "" for none.
func idempotencyKey(f func(string, *message.Message) string, topic string, msg *message.Message) string {
	if f != nil {
		return f(topic, msg)
	}
	return msg.Metadata.Get(IdempotencyKeyMetadata)
}

// keyDigest is what the keys table stores of key: a key that is a UUID
// in its canonical text form, that UUID; any other, the first 16 bytes of
// its SHA-256. Keys of any length take 16 bytes; two keys share a digest
// with a probability of about n²/2¹²⁹ among n keys. A UUID is kept as it
// is so that time-ordered ones (version 7, as message UUIDs) go into the
// keys table's index in order, next to each other, rather than at random
// places of it.
func keyDigest(key string) string {
	if len(key) == 36 {
		if id, err := uuid.Parse(key); err == nil && id.String() == key {
			return key
		}
	}
	sum := sha256.Sum256([]byte(key))
	return uuid.UUID(sum[:16]).String()
}
