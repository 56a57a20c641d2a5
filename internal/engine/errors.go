package engine

import "errors"

// The errors the engine returns and logs. The root package re-exports
// each under the same name, with its documentation for users; errors.Is
// matches either name.
var (
	ErrSubscriberClosed        = errors.New("pglease: subscriber is closed")
	ErrOwnershipLost           = errors.New("pglease: ownership of the topic was lost")
	ErrFuturePosition          = errors.New("pglease: stored position lies ahead of the database's transaction counter (data from another cluster?)")
	ErrDatabaseWentBack        = errors.New("pglease: the database went back in time (failover or restore)")
	ErrDeliveryHeldBack        = errors.New("pglease: delivery held back by a long-running transaction")
	ErrInvalidMessage          = errors.New("pglease: invalid message")
	ErrNacked                  = errors.New("pglease: message was nacked")
	ErrDeliveryEnded           = errors.New("pglease: delivery ended before the message was acked or nacked")
	ErrSkippedByRetention      = errors.New("pglease: messages removed by retention before the consumer group acknowledged them")
	ErrMaintenanceNotPermitted = errors.New("pglease: the role may not do the maintainer's work")
	ErrUndecodableMetadata     = errors.New("pglease: message metadata is not a JSON object of strings")
	ErrAlreadyAcknowledged     = errors.New("pglease: the message was already acknowledged")
)
