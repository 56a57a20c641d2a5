package pgsql

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// The kinds of notification sent on a [Tables.NotifyChannel]: the first
// byte of each payload, followed by what it concerns. The statements
// that send them and the Subscribers' listener that reads them both use
// these names. A notification is a hint, never an order: anyone who may
// NOTIFY can send one, and a Subscriber acts on it only by reading the
// tables again.
const (
	// NotifyMessages + topic: new messages in partition 0 (what
	// Subscribers of schema versions before 4 listen for).
	NotifyMessages = 'm'
	// NotifyPartition + partition + ":" + topic: new messages in another
	// partition.
	NotifyPartition = 'n'
	// NotifyReleased + topic: a row of the topic was released.
	NotifyReleased = 'r'
	// NotifyGroup + consumer group: a session of the group started,
	// ended or changed its topics.
	NotifyGroup = 'g'
	// NotifyPartitions + topic: the topic's partition count was raised.
	NotifyPartitions = 'p'
	// NotifyReset + the consumer group's length in bytes (decimal) + ":"
	// + consumer group + topic: an operator reset the group's offsets on
	// the topic.
	NotifyReset = 'o'
	// NotifyResetAny + topic: the reset notification of earlier
	// versions, which names no group.
	NotifyResetAny = 'x'
	// NotifyRetention + topic: the topic's retention changed.
	NotifyRetention = 't'
	// NotifyDelayed + Unix milliseconds: delayed messages were stored,
	// the earliest due then.
	NotifyDelayed = 'd'
	// NotifyMaintainer: the maintainer's row was released.
	NotifyMaintainer = 'e'
	// NotifyProbe + token: a listener's probe of its own connection,
	// sent through the pool.
	NotifyProbe = 'k'
)

// kind is notification kind k as an SQL literal.
func kind(k byte) string { return `'` + string(rune(k)) + `'` }

// messagesPayload is the SQL expression of the payload that notifies new
// messages in partition of topic (both SQL expressions).
func messagesPayload(partition, topic string) string {
	return `CASE WHEN ` + partition + ` = 0 THEN ` + kind(NotifyMessages) + ` || ` + topic +
		` ELSE ` + kind(NotifyPartition) + ` || ` + partition + `::text || ':' || ` + topic + ` END`
}

// messagesPayloadOf is the payload messagesPayload computes, for
// partition of topic.
func messagesPayloadOf(partition int32, topic string) string {
	if partition == 0 {
		return string(rune(NotifyMessages)) + topic
	}
	return string(rune(NotifyPartition)) + strconv.Itoa(int(partition)) + ":" + topic
}

// Listen makes conn LISTEN on channel.
func Listen(ctx context.Context, conn Querier, channel string) error {
	_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}

// Unlisten makes conn stop listening on channel.
func Unlisten(ctx context.Context, conn Querier, channel string) error {
	_, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}

// Notify sends payload on channel.
func Notify(ctx context.Context, q Querier, channel, payload string) error {
	_, err := q.Exec(ctx, "SELECT pg_catalog.pg_notify($1, $2)", channel, payload)
	return err
}
