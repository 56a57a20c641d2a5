package engine

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// sharedTopicMessage is logged when a subscription of this process joins
// another one of the same consumer group and topic. Sharing is right for
// competing consumers (each message handled once, partitions side by
// side), and wrong for handlers that must each see every message: with
// Watermill's CQRS component, one Subscriber given to every event handler,
// or a Subscriber per handler that all leave ConsumerGroup empty, leave
// all but one handler without messages and nothing fails.
const sharedTopicMessage = "Another subscription of this process has the same consumer group and topic: " +
	"they share the topic's messages, each message goes to one of them. " +
	"If each handler must receive every message (CQRS event handlers), give each handler its own ConsumerGroup"

// subscriptionKey is what two subscriptions of the process share a
// topic's messages by: the database (the pool's connection string), the
// tables, the consumer group and the topic.
type subscriptionKey struct {
	db, messages, group, topic string
}

// liveSubscriptions counts the subscriptions of this process that have not
// ended, per key. It is safe for concurrent use.
var liveSubscriptions = struct {
	mu sync.Mutex
	n  map[subscriptionKey]int
}{n: map[subscriptionKey]int{}}

// trackSubscription counts one more subscription of k and returns how many
// others of k there were.
func trackSubscription(k subscriptionKey) (others int) {
	liveSubscriptions.mu.Lock()
	defer liveSubscriptions.mu.Unlock()
	others = liveSubscriptions.n[k]
	liveSubscriptions.n[k] = others + 1
	return others
}

// untrackSubscription counts one subscription of k less.
func untrackSubscription(k subscriptionKey) {
	liveSubscriptions.mu.Lock()
	defer liveSubscriptions.mu.Unlock()
	if n := liveSubscriptions.n[k] - 1; n > 0 {
		liveSubscriptions.n[k] = n
	} else {
		delete(liveSubscriptions.n, k)
	}
}

// logIfShared counts sub's subscription and logs, at Info, when another
// subscription of this process shares its topic's messages. Watermill's
// LoggerAdapter has no Warn, and this is not an Error: sharing is what
// competing consumers in one process want (two Subscribers of a group
// consume a partitioned topic's partitions side by side). Info is printed
// by Watermill's default loggers, once per Subscribe call.
func (sub *subscription) logIfShared() {
	if others := trackSubscription(sub.key); others > 0 {
		sub.logger.Info(sharedTopicMessage, watermill.LogFields{"subscriptions": others + 1})
	}
}
