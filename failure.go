package pglease

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/pglease/watermill-pglease/internal/engine"
)

// The metadata a message moved to its dead-letter topic carries
// ([RetryConfig.DeadLetterTopic]), beside its own.
const (
	// DeadLetterSourceTopicMetadata is the topic the message was
	// published to; DeadLetterSourcePartitionMetadata its partition
	// there; DeadLetterSourcePositionMetadata its position there
	// ("transaction_id:offset", the form `pglease reset-offsets` and
	// `pglease messages` show).
	DeadLetterSourceTopicMetadata     = engine.DeadLetterSourceTopicMetadata
	DeadLetterSourcePartitionMetadata = engine.DeadLetterSourcePartitionMetadata
	DeadLetterSourcePositionMetadata  = engine.DeadLetterSourcePositionMetadata
	// DeadLetterGroupMetadata is the consumer group whose attempts failed.
	DeadLetterGroupMetadata = engine.DeadLetterGroupMetadata
	// DeadLetterAttemptsMetadata is how many times it was handed out.
	DeadLetterAttemptsMetadata = engine.DeadLetterAttemptsMetadata
	// DeadLetterFirstFailureMetadata and DeadLetterLastFailureMetadata
	// are the times of its first and last failure, on the database's
	// clock, in RFC 3339 with nanoseconds, UTC.
	DeadLetterFirstFailureMetadata = engine.DeadLetterFirstFailureMetadata
	DeadLetterLastFailureMetadata  = engine.DeadLetterLastFailureMetadata
	// DeadLetterReasonMetadata is the reason given with the last Nack
	// ([NackWithReason]); absent when none was.
	DeadLetterReasonMetadata = engine.DeadLetterReasonMetadata
)

// NackWithReason nacks msg, a message delivered by a [Subscriber], with
// err as the reason of its failure: under a failure policy
// ([SubscriberConfig.Retry]) the reason is written with the failure and,
// after the last attempt, into the dead-letter copy
// (DeadLetterReasonMetadata; at most 1 KiB of err's text). It returns
// msg.Nack's result. For a message that a Subscriber did not deliver it
// only nacks. Safe for concurrent use; like Nack, only the first Ack or
// Nack of a message counts.
func NackWithReason(msg *message.Message, err error) bool {
	engine.SetNackReason(msg, err)
	return msg.Nack()
}

// RecordNackReason is a Watermill handler middleware that gives a failing
// handler's error as the reason of the Nack that follows
// ([NackWithReason]): add it to a Router (router.AddMiddleware) that
// consumes with a failure policy.
func RecordNackReason(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			engine.SetNackReason(msg, err)
		}
		return out, err
	}
}
