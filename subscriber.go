package pglease

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/engine"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Subscriber is a Watermill [message.Subscriber] reading from PostgreSQL.
//
// On its first Subscribe it opens one consumer-session row, kept alive by a
// heartbeat, and claims subscribed (consumer group, topic) rows through it:
// the live Subscribers of a group split the topics they subscribe to
// evenly. Messages of a claimed (topic, partition) are delivered in order,
// by default one at a time, the next only after the previous one was
// acked; with SubscriberConfig.MaxInFlight N, up to N at once, never two
// of one ordering key. The channel of a topic
// that another Subscriber of the group owns stays silent until this one is
// granted the topic; a topic can also move to another Subscriber between
// two messages when the group is split again. See the package documentation
// for the protocol.
//
// A Subscriber is safe for concurrent use.
type Subscriber struct {
	pool   *pgxpool.Pool
	tables *pgsql.Tables
	engine *engine.Subscriber

	schema schemaOnce // InitializeSchema
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber returns a Subscriber reading with pool. It does not touch the
// database: the session opens on the first Subscribe. A nil logger means no
// logging.
func NewSubscriber(pool *pgxpool.Pool, config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: NewSubscriber needs a *pgxpool.Pool, got nil", ErrInvalidConfig)
	}
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	settings := config.settings()
	s := &Subscriber{pool: pool, tables: settings.Tables}
	if config.InitializeSchema {
		settings.SetUp = s.initializeSchema
	}
	s.engine = engine.NewSubscriber(pool, settings, logger)
	return s, nil
}

// SubscribeInitialize validates topic and, with InitializeSchema, creates
// the tables. It implements [message.SubscribeInitializer]. Unlike
// Subscribe, it needs the database: it returns the error of the set-up.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := validateTopic(topic); err != nil {
		return err
	}
	return s.engine.SubscribeInitialize()
}

// Subscribe returns a channel of the messages of topic for this Subscriber's
// consumer group. The channel is closed when ctx ends or the Subscriber
// closes; the topic is then released, once the messages handed out are
// acked or nacked (or DrainTimeout passed), with its acknowledged offset,
// for another Subscriber of the group to take over.
//
// Every message must be acked or nacked: with MaxInFlight 1 (the default)
// the next one is delivered only after an Ack, with MaxInFlight N once
// fewer than N are out and the earlier ones of its ordering key are
// acked; a Nack delivers the same message again after NackResendDelay. When ctx ends or on Close, nothing more is handed out,
// and the topic is released once the messages out are acked or nacked, or
// DrainTimeout passed. A message's context is cancelled after its Ack or
// Nack, or when its topic is released or lost.
//
// The first Subscribe initializes the schema (with InitializeSchema) and
// opens the session. When the database cannot be reached (refused, cut,
// starting up, too slow), Subscribe returns the channel all the same: the
// set-up is retried in the background with the backoff of later outages,
// logged once at Error and then at Info at most every 15 seconds, and
// delivery starts once it succeeds; a service may start before its
// database. An error that retrying cannot fix (the tables, schema or
// database missing, the role lacking grants or failing to log in) is
// returned, as is ctx's error when it ends first.
//
// Subscriptions of one consumer group to one topic share its messages,
// whether made on one Subscriber or on several: each message goes to one
// of them. When a second one starts in this process (same database,
// tables, group and topic), it is logged at Info, saying to give each
// handler its own ConsumerGroup if each must receive every message.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	return s.engine.Subscribe(ctx, topic)
}

// Close ends every subscription: it hands nothing more out, waits up to
// DrainTimeout for the messages already handed out to be acked or nacked,
// releases the topics with their acknowledged offsets, closes their
// channels, waits for every goroutine the Subscriber started, and deletes
// the session row. Releases that fail are retried until CloseTimeout has
// passed since the last subscription stopped waiting (at most DrainTimeout
// after Close began).
//
// Close returns an error when a release or the session delete could not be
// written (the database is unreachable, say): nothing is lost, the topics
// are free for other Subscribers once the session row expires, after at
// most SessionTTL. It is idempotent: a call made while another is under way
// returns when that one is done; later calls return nil.
func (s *Subscriber) Close() error { return s.engine.Close() }

// initializeSchema creates the tables once (InitializeSchema): the
// engine's set-up before its first session.
func (s *Subscriber) initializeSchema(ctx context.Context) error {
	return s.schema.run(ctx, s.pool, s.tables)
}
