package pglease

import (
	"errors"

	"github.com/pglease/watermill-pglease/internal/engine"
)

var (
	// ErrPublisherClosed is returned by [Publisher.Publish] after
	// [Publisher.Close].
	ErrPublisherClosed = errors.New("pglease: publisher is closed")
	// ErrSubscriberClosed is returned by [Subscriber.Subscribe] and
	// [Subscriber.SubscribeInitialize] after [Subscriber.Close].
	ErrSubscriberClosed = engine.ErrSubscriberClosed
	// ErrOwnershipLost means a fenced write found that another session
	// took over the (consumer group, topic): nothing was written.
	ErrOwnershipLost = engine.ErrOwnershipLost
	// ErrFuturePosition means that a stored position or message lies ahead
	// of the database's transaction counter: they were copied from another
	// cluster (a logical dump and restore, for example), whose transaction
	// ids ran higher (the database gives every message it stores its
	// inserting transaction's id). A group whose acknowledged position lies
	// ahead is not claimed until it is repaired; a message that lies
	// ahead is read around and logged once, wrapped in this error. See
	// "Positions from another cluster" in docs/guarantees.md.
	ErrFuturePosition = engine.ErrFuturePosition
	// ErrDatabaseWentBack is logged when a Subscriber finds that the
	// database went back in time since its last heartbeat: a new
	// timeline (a standby was promoted), WAL or a transaction counter
	// behind what it read before (a copy started as the primary, a
	// restore), or another cluster. Positions it held in memory may name
	// transaction ids the database hands out again, so it drops them and
	// claims every row again from the position the database has: what
	// was acknowledged after that position is delivered again, nothing
	// published afterwards is skipped. See "Failover" in
	// docs/guarantees.md.
	ErrDatabaseWentBack = engine.ErrDatabaseWentBack
	// ErrDeliveryHeldBack is logged, once per stall, when committed
	// messages have waited for an older running transaction (the xmin
	// horizon) for over a second; the log names the blocking backend.
	ErrDeliveryHeldBack = engine.ErrDeliveryHeldBack
	// ErrInvalidTopic is wrapped by the errors for topic names that are
	// empty, longer than [MaxTopicLength], not UTF-8 or hold a NUL byte.
	ErrInvalidTopic = errors.New("pglease: invalid topic")
	// ErrInvalidMessage is wrapped by the errors for nil messages, for
	// messages with an empty UUID and for messages whose UUID or metadata
	// PostgreSQL cannot store.
	ErrInvalidMessage = engine.ErrInvalidMessage
	// ErrInvalidConfig is wrapped by the errors of the constructors
	// (NewPublisher, NewSubscriber, and admin.NewInspector), CreateTopic,
	// AckInTx, Migrate and the admin and import calls for invalid
	// arguments or configuration.
	ErrInvalidConfig = errors.New("pglease: invalid config")
	// ErrNacked is what the settled func of [SubscriberConfig.OnDelivery]
	// is called with for a delivery whose message was nacked.
	ErrNacked = engine.ErrNacked
	// ErrDeliveryEnded is wrapped by what the settled func of
	// [SubscriberConfig.OnDelivery] is called with for a delivery that
	// ended before its message was acked or nacked; the error says why.
	// The message's position was not committed: it is delivered again,
	// by this Subscriber or another.
	ErrDeliveryEnded = engine.ErrDeliveryEnded
)

// ErrSkippedByRetention is the error logged (Watermill's logger has no
// Warn level) when the maintainer removes messages, past their topic's
// retention, that a consumer group had not acknowledged: the group skips
// them.
var ErrSkippedByRetention = engine.ErrSkippedByRetention

// ErrMaintenanceNotPermitted is the error logged, once, by a Subscriber
// whose role can do the maintainer's partition DDL neither itself (it
// lacks the privileges of the tables' owner) nor through the owner's
// functions (it lacks the grants of [GrantSQL]): it does not stand for
// maintainer.
var ErrMaintenanceNotPermitted = engine.ErrMaintenanceNotPermitted

// ErrUndecodableMetadata is the error logged, once per message, by a
// Subscriber that skips a stored message whose metadata is not a JSON
// object of strings (a row pglease did not write: inserted by hand or by
// another program), and wrapped by admin.Inspector.Replay for such a row.
// The message cannot become a Watermill message: the Subscriber moves past
// it as if it were acknowledged, and the row stays in the messages table
// (until its topic's retention removes it), where admin.Inspector.Messages
// and pglease messages show it with its metadata raw.
var ErrUndecodableMetadata = engine.ErrUndecodableMetadata
