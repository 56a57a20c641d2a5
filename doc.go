// Package pglease is a Watermill Pub/Sub on PostgreSQL (pgx/v5) in which
// every Subscriber keeps one consumer-session row alive with a heartbeat and
// claims exclusive ownership of each (consumer group, topic) it subscribes
// to through that row.
//
// # Tables
//
// [Tables] uses these tables (names configurable, always
// quoted): one messages table for all topics (partitioned by retention
// class and expiry), one consumer_sessions row per live Subscriber, one
// consumer_offsets row per (consumer group, topic, partition) holding the
// acknowledged position, the owner session and the epoch, the topics'
// settings, delayed messages, the maintainer's row, the retention classes
// and the schema version. [SchemaSQL] returns the DDL;
// [Migrate] applies it (the owner's step, also `pglease migrate`), and
// [GrantSQL] gives an application role that owns nothing what it needs
// to run pglease, the maintainer's work included (through the owner's
// SECURITY DEFINER functions).
//
// # Delivery
//
// A message's position is (transaction_id, offset): the xid8 of the
// inserting transaction and an identity value. Offsets are assigned before
// commit and so commit out of order; a reader only sees rows whose
// transaction is older than every running one (below pg_snapshot_xmin) and
// orders them by (transaction_id, offset), so no row can later appear behind
// a position already consumed. Messages of a (group, topic, partition) are
// handed out one at a time by default: the next only after an Ack, whose
// position is then committed, coalesced (SubscriberConfig.CommitInterval
// and CommitBatch; always before idling and in the release). With
// SubscriberConfig.MaxInFlight above 1, up to that many are out at once,
// one per ordering key, and the committed position is the end of the
// contiguous acknowledged prefix. A Nack delivers the same message again
// after SubscriberConfig.NackResendDelay. No transaction is open while a
// handler runs. Delivery is at least once.
//
// # Sessions, claims and groups
//
// The first Subscribe opens the Subscriber's session row; a heartbeat keeps
// it alive every SessionTTL/3, and each (group, topic, partition) row the
// Subscriber owns names that session and an epoch. Every offset commit is
// fenced by both: a paused or partitioned old owner never moves an offset
// after a new owner took over. The live Subscribers of a consumer group
// split the rows of the topics they subscribe to evenly; a crashed
// process's rows are taken over once its session expires (after at most
// about SessionTTL), and Close hands them over at once.
//
// Messages are ordered by the id of the publishing transaction and
// delivered once no older transaction is running in the PostgreSQL
// cluster: a writing transaction left open anywhere holds back delivery on
// every topic until it ends (bound it with
// idle_in_transaction_session_timeout). Positions copied from another
// cluster, ahead of this one's transaction counter, are refused with
// [ErrFuturePosition]. Publish notifies the Subscribers when its
// transaction commits; polling every PollInterval is the fallback.
//
// The protocol in full (sessions, claims and fencing, the group's shares,
// wake-ups) is in docs/architecture.md and in the documentation of the
// engine package (internal/engine), which implements it.
//
// # Partitioned topics
//
// A topic created with [CreateTopic] and TopicConfig.Partitions > 1 is
// split into partitions, each a (group, topic, partition) row of its own:
// owned, balanced and delivered independently. A Publisher places each
// message by its key ([PublisherConfig.PartitionKey], by default the
// [PartitionKeyMetadata] metadata; [PartitionOf] is the hash), so that
// messages with the same key keep their order. A Subscribe call delivers
// every partition its Subscriber owns on its one channel, one unacked
// message per partition at a time; [MessagePartitionFromCtx] tells which.
// A topic never created has one partition.
//
// # Exactly once for effects in the same database
//
// [AckInTx] commits a delivered message's position in the caller's own
// transaction, fenced by the delivering session and epoch, so effects and
// the position commit together; [TxHandler] wraps that for the Router,
// publishing the handler's messages in the same transaction.
//
// # Operating
//
// The Inspector of package [github.com/pglease/watermill-pglease/admin]
// reads sessions, lag per (group, topic, partition), the xmin horizon,
// topics and stored messages, and resets offsets; the pglease command
// (cmd/pglease) and the metrics module are built on it. Package
// [github.com/pglease/watermill-pglease/wmsqlimport] moves an application's
// pending messages and group positions from watermill-sql. Both are
// clients of the tables this package creates. [Subscriber.Stats] returns the
// client-side counters. [SubscriberConfig.StartFrom] sets where a new group
// starts; [DeliveryAttemptMetadata] numbers deliveries.
//
// When a Subscribe context ends or the Subscriber closes, each topic is
// released at once with its acknowledged position and a notification, so a
// standby takes over in milliseconds; Close then deletes the session row. A
// crashed process's topics are taken over once its session expires, after
// at most about SessionTTL: the other members read the owner's expiry and
// claim its topics just after it.
package pglease
