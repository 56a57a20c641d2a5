package pglease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of [SubscriberConfig].
const (
	DefaultSessionTTL      = 10 * time.Second
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultNackResendDelay = 100 * time.Millisecond
	DefaultBatchSize       = 100
	DefaultCloseTimeout    = 5 * time.Second

	// MinSessionTTL is the shortest SessionTTL accepted.
	MinSessionTTL = time.Second
	// maxRetryBackoff caps the wait between retries of failed statements.
	maxRetryBackoff = time.Second
)

// SubscriberConfig configures a [Subscriber]. The zero value of every field
// means its default.
type SubscriberConfig struct {
	// ConsumerGroup names the group whose Subscribers share topics: each
	// (ConsumerGroup, topic) is delivered by one Subscriber at a time, from
	// the group's own offset. A new group starts at the beginning of the
	// topic. The empty string is a group like any other.
	ConsumerGroup string

	// SessionTTL is how long the Subscriber's session lives without a
	// heartbeat; heartbeats run every SessionTTL/3. A crashed process's
	// topics are taken over after at most about SessionTTL. Default
	// DefaultSessionTTL (10s), at least MinSessionTTL (1s).
	SessionTTL time.Duration

	// PollInterval is how often an idle topic is queried for new messages
	// and how often a hot standby tries to claim its topic. Default
	// DefaultPollInterval (100ms).
	PollInterval time.Duration

	// NackResendDelay is how long after a Nack the same message is
	// delivered again. Default DefaultNackResendDelay (100ms).
	NackResendDelay time.Duration

	// BatchSize is how many messages one query reads; they are still handed
	// out one at a time. Default DefaultBatchSize (100).
	BatchSize int

	// CloseTimeout bounds the statements that release topics and delete the
	// session when a subscription ends or the Subscriber closes. Default
	// DefaultCloseTimeout (5s).
	CloseTimeout time.Duration

	// InitializeSchema creates or migrates the tables on the first
	// Subscribe or SubscribeInitialize. Leave it off when the DDL of
	// [SchemaSQL] is applied by a migration tool.
	InitializeSchema bool

	// SchemaAdapter builds every SQL statement. Default DefaultSchemaAdapter{}.
	SchemaAdapter SchemaAdapter
}

func (c *SubscriberConfig) setDefaults() {
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.NackResendDelay == 0 {
		c.NackResendDelay = DefaultNackResendDelay
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.SchemaAdapter == nil {
		c.SchemaAdapter = DefaultSchemaAdapter{}
	}
}

func (c SubscriberConfig) validate() error {
	if c.SessionTTL < MinSessionTTL {
		return fmt.Errorf("SubscriberConfig.SessionTTL must be at least %s, got %s", MinSessionTTL, c.SessionTTL)
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("SubscriberConfig.PollInterval must be positive, got %s", c.PollInterval)
	}
	if c.NackResendDelay < 0 {
		return fmt.Errorf("SubscriberConfig.NackResendDelay must not be negative, got %s", c.NackResendDelay)
	}
	if c.BatchSize < 0 {
		return fmt.Errorf("SubscriberConfig.BatchSize must be positive, got %d", c.BatchSize)
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("SubscriberConfig.CloseTimeout must be positive, got %s", c.CloseTimeout)
	}
	if !validText(c.ConsumerGroup) {
		return fmt.Errorf("SubscriberConfig.ConsumerGroup must be UTF-8 without NUL bytes")
	}
	if a, ok := c.SchemaAdapter.(DefaultSchemaAdapter); ok {
		if err := a.validate(); err != nil {
			return fmt.Errorf("SubscriberConfig.SchemaAdapter: %w", err)
		}
	}
	return nil
}

// Subscriber is a Watermill [message.Subscriber] reading from PostgreSQL.
//
// On its first Subscribe it opens one consumer-session row, kept alive by a
// heartbeat, and claims each subscribed (consumer group, topic) through it.
// Messages of a claimed topic are delivered in order, one at a time: the
// next only after the previous one was acked. A Subscriber that cannot claim
// a topic waits as a hot standby; its channel starts delivering when it wins
// the claim. See the package documentation for the protocol.
//
// A Subscriber is safe for concurrent use.
type Subscriber struct {
	pool    *pgxpool.Pool
	config  SubscriberConfig
	logger  watermill.LoggerAdapter
	offsets offsetStore
	session *sessionKeeper

	schemaMu    sync.Mutex
	schemaReady bool

	mu        sync.Mutex
	closed    bool
	slots     map[string]*topicSlot
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	consumers sync.WaitGroup
}

// topicSlot lets one consumer of this Subscriber at a time work on a topic,
// so that two Subscribe calls for the same topic take turns.
type topicSlot struct {
	token chan struct{}
	refs  int
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
	logger = logger.With(watermill.LogFields{"consumer_group": config.ConsumerGroup})
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		pool:    pool,
		config:  config,
		logger:  logger,
		offsets: offsetStore{pool: pool, adapter: config.SchemaAdapter},
		session: newSessionKeeper(pool, config.SchemaAdapter, config.ConsumerGroup, config.SessionTTL, logger),
		slots:   map[string]*topicSlot{},
		ctx:     ctx,
		cancel:  cancel,
	}, nil
}

// SubscribeInitialize validates topic and, with InitializeSchema, creates
// the tables. It implements [message.SubscribeInitializer].
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := validateTopic(topic); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrSubscriberClosed
	}
	return s.initializeSchema(s.ctx)
}

// Subscribe returns a channel of the messages of topic for this Subscriber's
// consumer group. The channel is closed when ctx ends or the Subscriber
// closes; the topic is then released at once, with its acknowledged offset,
// for another Subscriber of the group to take over.
//
// Every message must be acked or nacked: the next one is delivered only
// after an Ack, a Nack delivers the same message again after
// NackResendDelay. A message's context is cancelled after its Ack or Nack,
// when ctx ends and on Close.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, ErrSubscriberClosed
	}
	if err := s.initializeSchema(ctx); err != nil {
		return nil, err
	}
	if err := s.session.start(ctx); err != nil {
		if errors.Is(err, ErrSubscriberClosed) {
			return nil, err
		}
		return nil, fmt.Errorf("subscribe to topic %q: %w", topic, err)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrSubscriberClosed
	}
	slot := s.slots[topic]
	if slot == nil {
		slot = &topicSlot{token: make(chan struct{}, 1)}
		s.slots[topic] = slot
	}
	slot.refs++
	s.consumers.Add(1)
	s.mu.Unlock()

	cctx, cancel := context.WithCancel(ctx)
	c := &consumer{
		s:      s,
		topic:  topic,
		slot:   slot,
		ctx:    cctx,
		cancel: cancel,
		out:    make(chan *message.Message),
		logger: s.logger.With(watermill.LogFields{"topic": topic}),
	}
	stopOnClose := context.AfterFunc(s.ctx, cancel)
	go func() {
		defer stopOnClose()
		c.run()
	}()
	return c.out, nil
}

// Close ends every subscription: it releases their topics with their
// acknowledged offsets, closes their channels, waits for every goroutine the
// Subscriber started, and deletes the session row. It is idempotent. If the
// database cannot be reached, the topics are free once the session expires.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()

	s.cancel()
	s.consumers.Wait()
	if err := s.session.close(s.config.CloseTimeout); err != nil {
		s.logger.Error("Cannot delete the consumer session; it expires after SessionTTL", err, nil)
	}
	s.logger.Info("Subscriber closed", nil)
	return nil
}

func (s *Subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Subscriber) initializeSchema(ctx context.Context) error {
	if !s.config.InitializeSchema {
		return nil
	}
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.schemaReady {
		return nil
	}
	if err := initializeSchema(ctx, s.pool, s.config.SchemaAdapter); err != nil {
		return err
	}
	s.schemaReady = true
	return nil
}

func (s *Subscriber) releaseSlot(topic string, slot *topicSlot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot.refs--
	if slot.refs == 0 {
		delete(s.slots, topic)
	}
}

// storedMessage is one row read from the messages table.
type storedMessage struct {
	pos      Position
	uuid     string
	payload  []byte
	metadata string
}

// toMessage builds a new Watermill message each time, so that an Ack of a
// nacked delivery can never affect the next one.
func (m storedMessage) toMessage() (*message.Message, error) {
	msg := message.NewMessage(m.uuid, m.payload)
	if m.metadata != "" {
		if err := json.Unmarshal([]byte(m.metadata), &msg.Metadata); err != nil {
			return nil, fmt.Errorf("decode metadata of message %s: %w", m.uuid, err)
		}
	}
	return msg, nil
}

// consumer is one Subscribe call: it waits for the session, claims the
// topic (or waits as a hot standby), then delivers messages until its
// context ends or ownership is lost.
type consumer struct {
	s      *Subscriber
	topic  string
	slot   *topicSlot
	ctx    context.Context // ends with the Subscribe context or Close
	cancel context.CancelFunc
	out    chan *message.Message
	logger watermill.LoggerAdapter
}

type outcome int

const (
	acked   outcome = iota
	stopped         // the subscription ended: release the claim
	lost            // ownership lost: go back to standby
)

func (c *consumer) run() {
	defer c.s.consumers.Done()
	defer close(c.out)
	defer c.cancel()
	defer c.s.releaseSlot(c.topic, c.slot)

	select {
	case c.slot.token <- struct{}{}:
		defer func() { <-c.slot.token }()
	case <-c.ctx.Done():
		return
	}

	retry := newBackoff(c.s.config.PollInterval/2, maxRetryBackoff)
	ensured := false
	standby := false
	for {
		g := c.s.session.wait(c.ctx.Done(), nil)
		if g == nil {
			return
		}
		if !ensured {
			if err := c.ensureOffset(); err != nil {
				c.logger.Error("Cannot create the offset row, retrying", err, nil)
				if !sleep(retry.delay(), c.ctx.Done(), nil) {
					return
				}
				continue
			}
			ensured = true
		}
		cl, err := c.tryClaim(g)
		if err != nil {
			c.logger.Error("Cannot claim the topic, retrying", err, nil)
			if !sleep(retry.delay(), c.ctx.Done(), nil) {
				return
			}
			continue
		}
		retry.reset()
		if cl == nil {
			if !standby {
				c.logger.Debug("Topic is owned by another session, waiting as hot standby", nil)
				standby = true
			}
			if !sleep(c.s.config.PollInterval, c.ctx.Done(), nil) {
				return
			}
			continue
		}
		standby = false
		c.logger.Debug("Topic claimed", watermill.LogFields{"session_id": g.id.String(), "epoch": cl.epoch,
			"acked_transaction_id": cl.acked.TransactionID, "acked_offset": cl.acked.Offset})
		if c.own(g, cl) == stopped {
			c.release(cl)
			return
		}
	}
}

func (c *consumer) stmtContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.s.config.SessionTTL)
}

func (c *consumer) ensureOffset() error {
	ctx, cancel := c.stmtContext()
	defer cancel()
	return c.s.offsets.ensure(ctx, c.s.config.ConsumerGroup, c.topic)
}

// tryClaim runs on a context that the subscription's end does not cancel: a
// claim cut off half-way could commit without this consumer knowing.
func (c *consumer) tryClaim(g *sessionGen) (*claim, error) {
	ctx, cancel := c.stmtContext()
	defer cancel()
	return c.s.offsets.tryClaim(ctx, c.s.config.ConsumerGroup, c.topic, g.id)
}

func (c *consumer) release(cl *claim) {
	ctx, cancel := context.WithTimeout(context.Background(), c.s.config.CloseTimeout)
	defer cancel()
	if err := c.s.offsets.release(ctx, cl); err != nil {
		if errors.Is(err, ErrOwnershipLost) {
			c.logger.Info("Topic was already taken over before release", watermill.LogFields{"epoch": cl.epoch})
			return
		}
		c.logger.Error("Cannot release the topic; it is free once the session ends", err, nil)
		return
	}
	c.logger.Debug("Topic released", watermill.LogFields{"epoch": cl.epoch,
		"acked_transaction_id": cl.acked.TransactionID, "acked_offset": cl.acked.Offset})
}

// own delivers the claimed topic's messages until the subscription ends
// (stopped) or ownership is lost (lost).
func (c *consumer) own(g *sessionGen, cl *claim) outcome {
	retry := newBackoff(c.s.config.PollInterval/2, maxRetryBackoff)
	for {
		if c.ctx.Err() != nil {
			return stopped
		}
		if g.isLost() {
			c.logger.Info("Session lost, topic delivery stopped", watermill.LogFields{"epoch": cl.epoch})
			return lost
		}
		batch, err := c.fetch(cl.acked)
		if err != nil {
			c.logger.Error("Cannot read messages, retrying", err, nil)
			if !sleep(retry.delay(), c.ctx.Done(), g.lost) && c.ctx.Err() != nil {
				return stopped
			}
			continue
		}
		retry.reset()
		if len(batch) == 0 {
			if !sleep(c.s.config.PollInterval, c.ctx.Done(), g.lost) && c.ctx.Err() != nil {
				return stopped
			}
			continue
		}
		for _, m := range batch {
			if res := c.deliver(g, m); res != acked {
				return res
			}
			if res := c.commit(g, cl, m.pos); res != acked {
				return res
			}
		}
	}
}

func (c *consumer) fetch(after Position) ([]storedMessage, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.s.config.SessionTTL)
	defer cancel()
	q := c.s.config.SchemaAdapter.SelectMessages(SelectMessagesParams{
		Topic: c.topic,
		After: after,
		Limit: c.s.config.BatchSize,
	})
	rows, err := c.s.pool.Query(ctx, q.SQL, q.Args...)
	if err != nil {
		return nil, fmt.Errorf("read messages of topic %q: %w", c.topic, wrapMissingSchema(err))
	}
	defer rows.Close()
	batch := make([]storedMessage, 0, c.s.config.BatchSize)
	for rows.Next() {
		var (
			m        storedMessage
			txText   string
			metadata *string
		)
		if err := rows.Scan(&m.pos.Offset, &txText, &m.uuid, &m.payload, &metadata); err != nil {
			return nil, fmt.Errorf("read messages of topic %q: %w", c.topic, err)
		}
		if m.pos.TransactionID, err = parseXID8(txText); err != nil {
			return nil, fmt.Errorf("read messages of topic %q: %w", c.topic, err)
		}
		if metadata != nil {
			m.metadata = *metadata
		}
		batch = append(batch, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read messages of topic %q: %w", c.topic, err)
	}
	return batch, nil
}

// deliver hands m out until it is acked. Each delivery is a fresh message
// whose context ends after its Ack or Nack. Nothing is handed out once the
// session generation is lost.
func (c *consumer) deliver(g *sessionGen, m storedMessage) outcome {
	for {
		if g.isLost() {
			return lost
		}
		msg, err := m.toMessage()
		if err != nil {
			// A row this package did not write; delivering it without its
			// metadata would hide the problem, skipping it would lose it.
			c.logger.Error("Cannot decode message, retrying", err, nil)
			if !sleep(maxRetryBackoff, c.ctx.Done(), g.lost) {
				return c.interrupted(g)
			}
			continue
		}
		mctx, mcancel := context.WithCancel(c.ctx)
		msg.SetContext(mctx)

		select {
		case c.out <- msg:
		case <-c.ctx.Done():
			mcancel()
			return stopped
		case <-g.lost:
			mcancel()
			return lost
		}
		c.logger.Trace("Message delivered", watermill.LogFields{"uuid": m.uuid, "offset": m.pos.Offset})

		select {
		case <-msg.Acked():
			mcancel()
			return acked
		case <-msg.Nacked():
			mcancel()
		case <-c.ctx.Done():
			mcancel()
			if isAcked(msg) {
				return acked
			}
			return stopped
		case <-g.lost:
			mcancel()
			return lost
		}
		if !sleep(c.s.config.NackResendDelay, c.ctx.Done(), g.lost) {
			return c.interrupted(g)
		}
	}
}

func (c *consumer) interrupted(g *sessionGen) outcome {
	if c.ctx.Err() != nil {
		return stopped
	}
	return lost
}

func isAcked(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	default:
		return false
	}
}

// commit writes pos as the claim's acknowledged position, fenced by session
// and epoch, retrying while the database cannot be reached.
func (c *consumer) commit(g *sessionGen, cl *claim, pos Position) outcome {
	retry := newBackoff(c.s.config.PollInterval/2, maxRetryBackoff)
	for {
		ctx, cancel := c.stmtContext()
		err := c.s.offsets.commit(ctx, cl, pos)
		cancel()
		if err == nil {
			return acked
		}
		if errors.Is(err, ErrOwnershipLost) {
			c.logger.Info("Topic was taken over by another session, delivery stopped",
				watermill.LogFields{"epoch": cl.epoch, "error": err.Error()})
			return lost
		}
		c.logger.Error("Cannot commit offset, retrying", err, nil)
		if !sleep(retry.delay(), c.ctx.Done(), g.lost) {
			return c.interrupted(g)
		}
	}
}
