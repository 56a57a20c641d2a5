package pglease

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/engine"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// DeliveryAttemptMetadata is the metadata key that a [Subscriber] sets on
// every message it hands out: the delivery attempt, from 1. It counts the
// Nacks of this Subscriber and, for the first message a claim hands out
// (the one after the group's committed position), the claims before that
// handed it out without its position being committed: a message that
// crashes every process that takes it keeps counting up, across
// processes. An owner records that it handed out the message after the
// position it commits, and it commits at most CommitInterval after an
// Ack: a message its handler held longer than that before the process
// died counts that delivery. One it died on sooner, with Acks before it
// not committed yet, counts from 1 again on the next owner (the first
// message of that owner's claim is an earlier one); set CommitBatch to 1
// where a poison rule must count such crashes too.
const DeliveryAttemptMetadata = "_pglease_delivery_attempt"

// ErrAlreadyAcknowledged is returned by [AckInTx] for a message whose
// position its consumer group has already committed: it was acknowledged
// before (in a transaction that committed, or by Ack), and is delivered
// again only because the outcome was not known (a Nack after the commit, a
// commit whose reply was lost). Roll the transaction back and Ack the
// message: its effects are already there.
var ErrAlreadyAcknowledged = engine.ErrAlreadyAcknowledged

// MessagePartitionFromCtx returns the partition of its topic that a message
// delivered by a [Subscriber] comes from; pass the message's Context. It
// reports false for a context that is not a delivered message's.
func MessagePartitionFromCtx(ctx context.Context) (int32, bool) {
	d, ok := engine.DeliveryOf(ctx)
	return d.Partition, ok
}

// MessagePositionFromCtx returns the position in its partition of a message
// delivered by a [Subscriber]; pass the message's Context. It reports false
// for a context that is not a delivered message's.
func MessagePositionFromCtx(ctx context.Context) (Position, bool) {
	d, ok := engine.DeliveryOf(ctx)
	return Position(d.Position), ok
}

// MessageDelivery says where a message delivered by a [Subscriber] comes
// from and under which claim it was delivered, as [MessageDeliveryFromCtx]
// reports it: for telemetry and logs (the otel module records it on the
// message's span).
type MessageDelivery struct {
	ConsumerGroup string
	Topic         string
	Partition     int32
	Position      Position
	// SessionID is the consumer session (the Subscriber's row in the
	// consumer sessions table) that delivered the message.
	SessionID uuid.UUID
	// Epoch is the fencing token of the claim of the (group, topic,
	// partition) row under which the message was delivered: it grows with
	// every change of owner, so two deliveries of one message with
	// different epochs were made by different claims.
	Epoch int64
}

// MessageDeliveryFromCtx returns where a message delivered by a
// [Subscriber] comes from and under which claim it was delivered, in one
// look-up; pass the message's Context. It reports false for a context that
// is not a delivered message's.
func MessageDeliveryFromCtx(ctx context.Context) (MessageDelivery, bool) {
	d, ok := engine.DeliveryOf(ctx)
	return MessageDelivery{ConsumerGroup: d.Group, Topic: d.Topic, Partition: d.Partition, Position: Position(d.Position),
		SessionID: d.SessionID, Epoch: d.Epoch}, ok
}

// AckInTx acknowledges msg inside tx: it moves its consumer group's
// acknowledged position of the message's topic and partition to the
// message, fenced by the session and epoch that delivered it, as one more
// write of tx. Once tx commits, the message counts as acknowledged even if
// the process dies before msg.Ack(): the next owner starts after it. So
// effects written in tx (and messages published in tx, by a [Publisher] on
// tx) happen exactly once for the group, as long as every delivery of the
// message goes through AckInTx.
//
// Call msg.Ack() after tx committed, as always; it costs no extra
// statement beyond the coalesced commit. If tx rolls back, Nack (or Ack:
// the message is then acknowledged the usual way).
//
// Errors, after which tx must be rolled back:
//   - one wrapping [ErrOwnershipLost]: another session took the partition
//     over (or this Subscriber's session was lost); the message goes to
//     the new owner;
//   - one wrapping [ErrAlreadyAcknowledged]: the group's position is
//     already at or after the message; Ack it;
//   - one wrapping [ErrInvalidMessage]: msg was not delivered by a pglease
//     Subscriber (or its context was replaced);
//   - the database's errors (a serialization failure under REPEATABLE READ
//     or SERIALIZABLE when the row changed concurrently, for example).
//
// With MaxInFlight above 1, an earlier message of the partition may not be
// acknowledged yet, and the position moves only over a contiguous
// acknowledged prefix: AckInTx then records the message's position in the
// offset row (fenced the same way) instead of moving the position there,
// and the consumer's commits move the position over it once every message
// before it is acknowledged. A delivery of a message recorded so (after a
// crash before msg.Ack(), or a takeover) gets ErrAlreadyAcknowledged, so
// the effects stay exactly once.
//
// AckInTx locks the group's offset row until tx ends: keep tx short, as a
// takeover of the partition waits for it (and, with MaxInFlight above 1,
// the AckInTx of the partition's other messages and its commits).
func AckInTx(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	if tx == nil {
		return fmt.Errorf("%w: AckInTx needs a transaction, got nil", ErrInvalidConfig)
	}
	a, err := engine.AckOf(msg)
	if err != nil {
		return err
	}
	return a.Run(ctx, tx)
}

// TxHandlerFunc handles one message inside tx: it writes its effects with
// tx and returns the messages to publish, which are published in tx too.
type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error)

// TxHandlerConfig configures [TxHandler].
type TxHandlerConfig struct {
	// PublishTopic sets where the messages returned by the handler are
	// published, default "": required when the handler returns messages.
	PublishTopic string
	// Publisher sets how they are written in the transaction, default
	// PublisherConfig{}: its Tables (or the deprecated SchemaAdapter) and
	// PartitionKey (AutoInitializeSchema is not used: the Subscriber's
	// InitializeSchema has created the tables).
	Publisher PublisherConfig
	// TxOptions sets the options of each transaction, default READ
	// COMMITTED, read-write.
	TxOptions pgx.TxOptions
}

// TxBeginner begins transactions: a *pgxpool.Pool or a *pgx.Conn.
type TxBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// TxHandler turns f into a Watermill handler that processes each message
// exactly once, for effects in the same PostgreSQL database: it begins a
// transaction on db, calls f with it, publishes the messages f returns to
// config.PublishTopic in the same transaction, acknowledges the message in
// it ([AckInTx]) and commits. The input consumed, the effects written and
// the messages published commit together or not at all. Use it with
// Router.AddConsumerHandler (or AddNoPublisherHandler):
//
//	router.AddConsumerHandler("orders", "orders", sub,
//		pglease.TxHandler(pool, pglease.TxHandlerConfig{PublishTopic: "invoices"}, handle))
//
// An error from f, from publishing or from the commit rolls everything back
// and is returned, so the Router nacks the message and it is delivered
// again (Retry and PoisonQueue middlewares work as usual: the poison queue
// publish is not part of the transaction). A message already acknowledged
// (ErrAlreadyAcknowledged: delivered again after its transaction committed)
// is rolled back and acked: what f wrote this time is undone. The message's
// context bounds the transaction.
func TxHandler(db TxBeginner, config TxHandlerConfig, f TxHandlerFunc) message.NoPublishHandlerFunc {
	tables := config.Publisher.tableNames().tables()
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, err := db.BeginTx(ctx, config.TxOptions)
		if err != nil {
			return fmt.Errorf("begin the transaction of message %s: %w", msg.UUID, err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		out, err := f(ctx, tx, msg)
		if err != nil {
			return err
		}
		// Last: the offset row stays locked only from here to the commit,
		// so claims and commits of the partition do not wait for f. The
		// messages to publish and the acknowledgement go in one round trip.
		ack, err := engine.AckOf(msg)
		if err != nil {
			return err
		}
		batch := &pgx.Batch{}
		var inserts []pgsql.Stmt
		if len(out) > 0 {
			if config.PublishTopic == "" {
				return fmt.Errorf("%w: the handler of message %s returned %d messages, but TxHandlerConfig.PublishTopic is empty",
					ErrInvalidConfig, msg.UUID, len(out))
			}
			params, err := buildInsertParams(config.PublishTopic, out, config.Publisher)
			if err != nil {
				return err
			}
			params.NotifyChannel = tables.NotifyChannel
			inserts = insertStatements(tables, params)
			for _, q := range inserts {
				q.Queue(batch)
			}
		}
		queued := ack.Queue(batch)
		results := tx.SendBatch(ctx, batch)
		for range inserts {
			if _, err := results.Exec(); err != nil {
				_ = results.Close()
				return fmt.Errorf("publish %s to topic %q: %w", countMessages(len(out)), config.PublishTopic, wrapMissingSchema(err))
			}
		}
		// Where the acknowledgement is one statement it was queued in the
		// batch and its row is read here; else it runs after the batch.
		row, scanned, err := queued.Scan(results)
		if scanned {
			err = ack.Check(row, err)
		}
		if cerr := results.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err == nil && !scanned {
			err = ack.Check(queued.Run(ctx, tx))
		}
		if err != nil {
			if errors.Is(err, ErrAlreadyAcknowledged) {
				return nil // done before; what f did now is rolled back
			}
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit the transaction of message %s: %w", msg.UUID, err)
		}
		return nil
	}
}
