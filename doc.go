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
// # Sessions, claims and fencing
//
//	              claim succeeds                       ctx ends / Close
//	standby ─────────────────────────▶ owner ─────────────────────────▶ released
//	   ▲                                 │        (offset written, claim freed
//	   │  session lost, self-fenced,     │         in one statement)
//	   └──────── or commit fenced ◀──────┘
//
// The first Subscribe opens a session row expiring at the server's
// now() + SessionTTL; a heartbeat moves the expiry every SessionTTL/3, and
// only while the row has not expired. A (group, topic) row is free when it
// has no owner, or when its owner session has expired or is gone; claiming
// sets the owner and bumps the epoch in one statement, which writes only if
// the row still has the owner and epoch it decided on (a compare-and-swap),
// and which deletes an expired owner's session row: the owner's heartbeat
// and that delete conflict on the row's lock, so a session that lost a row
// can never be extended again. Holding a claim writes nothing: liveness
// costs one write per Subscriber per heartbeat, whatever the number of
// topics. A live session never keeps a topic that no subscription consumes:
// a release that fails is retried while the session lives.
//
// Every offset commit is fenced: it matches the row only while it still
// names this session and epoch, so a paused or partitioned old owner can
// never move an offset after a new owner took over. The Subscriber also
// trusts its session only for SessionTTL less a margin after the last
// successful heartbeat was sent (measured on the monotonic clock): past
// that, it stops handing out messages before the server can expire the row.
// A session found expired or deleted is replaced by a new one, whose claims
// start from the committed offsets.
//
// The session statements do not use the pool: the Subscribers of a process
// that share a pool run them, one at a time, on one connection of their own,
// so that a pool saturated by the application cannot stop the heartbeats.
// That connection, like the LISTEN connection, is dialled as the pool dials
// (with its BeforeConnect, AfterConnect and BeforeClose hooks) and counts
// against the server's max_connections, not against the pool's MaxConns.
//
// # Consumer groups
//
// The live sessions of a consumer group split the topics they subscribe to,
// as a Kafka consumer group splits partitions: each Subscriber publishes the
// hash and size of its set of topics in its session row, reads the group's
// live sessions when notified that one started, ended or changed, and owns
// at most its share: of the N members with the same set of T topics, ranked
// by age, the first T mod N own floor(T/N)+1 and the others floor(T/N). A
// member claims free topics in batches up to its share and gives topics
// above it up, between messages, by the normal release. Nobody takes a topic
// from a live session; a dead member's topics are claimed once its session
// expires. Standbys run no statement per topic.
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
//
// # Wake-ups
//
// Messages are ordered by the id of the publishing transaction (assigned at
// its first write) and delivered once no older transaction is running in the
// cluster: a writing transaction left open anywhere in the PostgreSQL
// cluster holds back delivery on every topic until it ends (bound it with
// idle_in_transaction_session_timeout). The database sets each message's
// transaction id and creation time, whatever the inserting statement says.
// Positions copied from another cluster, ahead of this one's transaction
// counter, are refused with [ErrFuturePosition]; a message copied so is
// read around and logged once.
//
// Publish notifies the messages table's channel once per topic and
// partition when its transaction commits; the Subscribers of a process that
// share a pool listen on one connection and wake only the consumer of the
// notified partition. Polling is the
// fallback: every PollInterval, one statement per Subscriber checks all of
// its idle topics. Concurrent Publish calls on a pool are group-committed.
package pglease
