package engine

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// deliveryHook is [SubscriberConfig.OnDelivery].
type deliveryHook func(msg *message.Message) (settled func(err error))

// begin calls the hook, if there is one, for a delivery of msg about to be
// handed out, and returns its settled func (nil for none).
func (h deliveryHook) begin(msg *message.Message) (settled func(err error)) {
	if h == nil {
		return nil
	}
	return h(msg)
}

// What settled is called with for a delivery that ended before its message
// was acked or nacked, by why it ended.
var (
	errDeliveryStopped = fmt.Errorf("%w: the subscription ended", ErrDeliveryEnded)
	errDeliveryLost    = fmt.Errorf("%w: %w", ErrDeliveryEnded, ErrOwnershipLost)
	errDeliveryYielded = fmt.Errorf("%w: the topic was handed over to another member of the group", ErrDeliveryEnded)
)

// settlement is what the settled func of a delivery of msg that ended with
// res is called with: what the handler did with the message (nil for an
// Ack, ErrNacked for a Nack) or, if neither, why the delivery ended.
func settlement(msg *message.Message, res outcome) error {
	select {
	case <-msg.Acked():
		return nil
	case <-msg.Nacked():
		return ErrNacked
	default:
	}
	switch res {
	case lost:
		return errDeliveryLost
	case yielded:
		return errDeliveryYielded
	default:
		return errDeliveryStopped
	}
}
