// Package engine runs pglease's protocol: the Subscriber's session,
// claims, consumers and delivery loop, the consumer group's shares, the
// maintainer, the LISTEN connection and the idle poller, and the
// Publisher's group commit. The root package (package pglease) is what a
// Watermill user constructs: it validates the configs, translates them
// into [Settings] and wraps the engine's [Subscriber]; every statement the
// engine runs is a method of internal/pgsql's Driver.
//
// Components get their collaborators as constructor arguments: the
// consumers share a consumerDeps, the group member a memberDeps, the
// maintainer a maintainerDeps, the session keeper its sessionHooks; each
// reaches the database only through a store interface (stores.go), which
// the unit tests of this package replace.
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
// # Positions and wake-ups
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
package engine
