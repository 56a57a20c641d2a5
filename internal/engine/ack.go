package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// deliveryKey is the context key of a delivered message's place.
type deliveryKey struct{}

// delivery is where a delivered message comes from and who delivered it.
type delivery struct {
	topic     string
	partition int32
	pos       Position
	group     string
	sessionID uuid.UUID
	epoch     int64
	g         *sessionGen
	driver    *pgsql.Lazy
	// above: delivered with MaxInFlight above 1 (AckInTx records the
	// position in the row, pgsql.OffsetParams.Above).
	above bool
	// workerHere: see claim.workerHere.
	workerHere string
	// reason is the reason of the delivery's Nack (SetNackReason).
	reason failureReason
}

// deliveryCtx is a delivered message's context: the subscription's, plus
// where the message comes from, in one allocation per delivery.
type deliveryCtx struct {
	context.Context
	d delivery
}

// Value implements context.Context.
func (c *deliveryCtx) Value(key any) any {
	if key == (deliveryKey{}) {
		return &c.d
	}
	return c.Context.Value(key)
}

// Delivered says where a delivered message comes from and under which
// claim it was delivered (the root package's MessageDelivery).
type Delivered struct {
	Group     string
	Topic     string
	Partition int32
	Position  Position
	SessionID uuid.UUID
	Epoch     int64
}

// DeliveryOf returns where the message whose context ctx is comes from;
// false for a context that is not a delivered message's.
func DeliveryOf(ctx context.Context) (Delivered, bool) {
	d, ok := ctx.Value(deliveryKey{}).(*delivery)
	if !ok {
		return Delivered{}, false
	}
	return Delivered{Group: d.group, Topic: d.topic, Partition: d.partition, Position: d.pos,
		SessionID: d.sessionID, Epoch: d.epoch}, true
}

func deliveryOf(msg *message.Message) (*delivery, bool) {
	d, ok := msg.Context().Value(deliveryKey{}).(*delivery)
	return d, ok
}

// Ack is the acknowledgement of a message in a transaction (the root
// package's AckInTx and TxHandler): its statement's parameters and the
// function that reads its outcome.
type Ack struct {
	driver pgsql.Driver
	params pgsql.OffsetParams
	check  func(pgsql.AckRow, error) error
}

// Check reads the outcome of the acknowledgement's statement: nil when it
// moved the group past the message.
func (a Ack) Check(r pgsql.AckRow, err error) error { return a.check(r, err) }

// Run acknowledges with q.
func (a Ack) Run(ctx context.Context, q pgsql.Querier) error {
	return a.check(a.driver.AckOffset(ctx, q, a.params))
}

// Queue sends the acknowledgement with the statements of batch (see
// pgsql.QueuedAck).
func (a Ack) Queue(batch *pgx.Batch) pgsql.QueuedAck { return a.driver.QueueAck(batch, a.params) }

// AckOf returns the acknowledgement of msg in a transaction.
func AckOf(msg *message.Message) (Ack, error) {
	if msg == nil {
		return Ack{}, fmt.Errorf("%w: AckInTx of a nil message", ErrInvalidMessage)
	}
	d, ok := deliveryOf(msg)
	if !ok {
		return Ack{}, fmt.Errorf("%w: message %s was not delivered by a pglease Subscriber "+
			"(AckInTx reads its origin from the message's context)", ErrInvalidMessage, msg.UUID)
	}
	what := func() string {
		return fmt.Sprintf("acknowledge message %s of topic %q partition %d for consumer group %q in a transaction",
			msg.UUID, d.topic, d.partition, d.group)
	}
	if d.g.isLost() {
		return Ack{}, fmt.Errorf("%s: the delivering session was lost: %w", what(), ErrOwnershipLost)
	}
	params := pgsql.OffsetParams{ConsumerGroup: d.group, Topic: d.topic, Partition: d.partition,
		SessionID: d.sessionID, Epoch: d.epoch, Position: pgsql.Position(d.pos), Here: d.g.here, Above: d.above,
		WorkerHere: d.workerHere}
	outcome := func(r pgsql.AckRow, err error) error {
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%s: the offset row is gone: %w", what(), ErrOwnershipLost)
		case err != nil:
			return fmt.Errorf("%s: %w", what(), check.MissingSchema(err))
		case !r.OnHistory:
			d.g.elsewhereFor("an AckInTx of topic "+strconv.Quote(d.topic), r.Elsewhere)
			return fmt.Errorf("%s: the database is not where the message was read: %w: %w", what(),
				ErrOwnershipLost, ErrDatabaseWentBack)
		case r.Advanced:
			return nil
		case r.SessionID == nil || *r.SessionID != d.sessionID || r.Epoch != d.epoch:
			return fmt.Errorf("%s (epoch %d, now %d): %w", what(), d.epoch, r.Epoch, ErrOwnershipLost)
		case r.Recorded:
			return fmt.Errorf("%s: %w", what(), ErrAlreadyAcknowledged)
		}
		if acked := Position(r.Acked); !positionLess(acked, d.pos) {
			return fmt.Errorf("%s: %w", what(), ErrAlreadyAcknowledged)
		}
		return fmt.Errorf("%s: the offset row was not moved: %w", what(), ErrOwnershipLost)
	}
	return Ack{driver: d.driver, params: params, check: outcome}, nil
}

func positionLess(a, b Position) bool {
	if a.TransactionID != b.TransactionID {
		return a.TransactionID < b.TransactionID
	}
	return a.Offset < b.Offset
}
