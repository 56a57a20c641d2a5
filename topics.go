package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/pglease/watermill-pglease/internal/engine"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// MaxPartitions is the largest partition count a topic may have. Each
// partition is a row per consumer group that is claimed, balanced and
// delivered on its own.
const MaxPartitions = 1024

// MinRetention and MaxRetention bound [TopicConfig.Retention] (0 keeps a
// topic's messages forever).
const (
	MinRetention = time.Second
	MaxRetention = 10 * 365 * 24 * time.Hour
)

// PartitionKeyMetadata is the metadata key that gives a message's partition
// key when [PublisherConfig.PartitionKey] is not set.
const PartitionKeyMetadata = "partition_key"

// TopicConfig is the settings of a topic, stored in the database so that
// every process agrees on them. A topic that was never created has one
// partition.
type TopicConfig struct {
	// Partitions sets the number of partitions, default 1 (0 means 1),
	// at most [MaxPartitions]. Messages with the same partition key go
	// to the same partition and are delivered in order; the partitions
	// of a topic are owned and delivered independently, by the members
	// of each consumer group.
	Partitions int

	// Retention sets how long messages of the topic are kept after they
	// were published (or, for delayed messages, became due), default 0:
	// forever; otherwise between [MinRetention] and [MaxRetention].
	// Older ones are removed whether consumed or not, as in Kafka.
	// Removal is done by the maintainer (see [MaintenanceConfig]) a
	// partition at a time, so a message may live up to half its
	// retention longer. A consumer group whose position falls behind
	// retention skips the removed messages; the maintainer logs it at
	// Error level (Watermill's logger has no Warn), wrapping
	// [ErrSkippedByRetention], and counts it
	// (SubscriberStats.RetentionSkipped). Setting the topic again with
	// another Retention changes it for the messages published from then
	// on; messages already stored keep the expiry they were given,
	// except that messages kept forever (published before the topic had
	// a retention) are deleted once they are older than the new
	// retention.
	Retention time.Duration

	// KeyWindow sets how long the topic recognises a message's
	// idempotency key (see PublisherConfig.IdempotencyKey) at least,
	// when that is longer than its Retention, default 0: the topic's
	// Retention when that is longer than a day, else a day
	// ([KeyWindow]). Otherwise between [MinRetention] and
	// [MaxRetention]; a window of a day or less is a day. A topic with
	// no Retention, whose messages are kept forever, can thus be told to
	// recognise a retried Publish for a week. A window longer than a day
	// is kept as a Retention's is: in partitions of its class that the
	// maintainer makes (until it has, keys are recognised for a day) and
	// empties two to three slots later (a slot is at most twice the
	// window). Changing a topic's window to one of another class starts
	// its keys anew: the keys stored for the old window are not read.
	KeyWindow time.Duration

	// Tables sets the names of the tables and their schema, default
	// Tables{}: the default names in the connection's search_path.
	Tables Tables
	// SchemaAdapter is the former name of Tables. Set one of the two:
	// both set to different tables is an error.
	//
	// Deprecated: use Tables. The field will be removed in the next minor
	// release.
	SchemaAdapter Tables
	// InitializeSchema sets whether CreateTopic creates or migrates the
	// tables first, default false.
	InitializeSchema bool
}

// tableNames returns the tables c names: Tables, or the deprecated
// SchemaAdapter when only that is set.
func (c TopicConfig) tableNames() Tables { return pickTables(c.Tables, c.SchemaAdapter) }

// CreateTopic stores the settings of topic. It is idempotent: creating a
// topic again with the same settings does nothing. Every setting is what
// config says: calling it again with another Retention (0 included)
// changes the retention.
//
// The partition count of an existing topic may be raised: messages
// published from then on spread over the new partitions, so a key may map
// to another partition than before (as in Kafka), and order between a
// key's messages published before and after the change is not kept.
// Subscribers pick up the new partitions within a moment. Lowering the
// count is refused with an error wrapping [ErrInvalidConfig]: the messages
// and offsets of the dropped partitions would be stranded.
//
// db may be a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx (the settings then
// commit with the transaction).
func CreateTopic(ctx context.Context, db DB, topic string, config TopicConfig) error {
	if err := validateTopic(topic); err != nil {
		return err
	}
	if isNilDB(db) {
		return fmt.Errorf("%w: CreateTopic needs a *pgxpool.Pool, *pgx.Conn or pgx.Tx, got nil", ErrInvalidConfig)
	}
	if config.Partitions == 0 {
		config.Partitions = 1
	}
	if config.Partitions < 1 || config.Partitions > MaxPartitions {
		return fmt.Errorf("%w: create topic %q: TopicConfig.Partitions must be between 1 and %d, got %d",
			ErrInvalidConfig, topic, MaxPartitions, config.Partitions)
	}
	if config.Retention != 0 && (config.Retention < MinRetention || config.Retention > MaxRetention) {
		return fmt.Errorf("%w: create topic %q: TopicConfig.Retention must be 0 (forever) or between %s and %s, got %s",
			ErrInvalidConfig, topic, MinRetention, MaxRetention, config.Retention)
	}
	if config.KeyWindow != 0 && (config.KeyWindow < MinRetention || config.KeyWindow > MaxRetention) {
		return fmt.Errorf("%w: create topic %q: TopicConfig.KeyWindow must be 0 (the retention, or a day) or between %s and %s, got %s",
			ErrInvalidConfig, topic, MinRetention, MaxRetention, config.KeyWindow)
	}
	if err := checkTables("TopicConfig", config.Tables, config.SchemaAdapter); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	tables := config.tableNames().tables()
	if config.InitializeSchema {
		if err := initializeSchema(ctx, db, tables); err != nil {
			return err
		}
	}
	driver := pgsql.NewLazy(tables)
	res, err := driver.UpsertTopic(ctx, db, pgsql.TopicParams{Topic: topic, Partitions: config.Partitions,
		Retention: config.Retention, RetentionClass: engine.RetentionClass(config.Retention),
		KeyWindow: config.KeyWindow, KeyClass: engine.RetentionClass(config.KeyWindow),
		NotifyChannel: tables.NotifyChannel})
	if err != nil {
		return fmt.Errorf("create topic %q: %w", topic, wrapMissingSchema(err))
	}
	oldN, newN := res.OldPartitions, res.NewPartitions
	if newN != nil {
		return nil // created, or its partition count raised
	}
	current := oldN
	if current == nil {
		// Created by a concurrent call after this statement's snapshot.
		rows, err := engine.TopicPartitions(ctx, db, driver, []string{topic})
		if err != nil {
			return fmt.Errorf("create topic %q: %w", topic, err)
		}
		n := int32(rows[topic])
		current = &n
	}
	if int(*current) > config.Partitions {
		return fmt.Errorf("%w: create topic %q: it has %d partitions, and the count can only be raised, not lowered to %d",
			ErrInvalidConfig, topic, *current, config.Partitions)
	}
	return nil
}

// PartitionOf returns the partition of a key on a topic with partitions
// partitions: the 32-bit FNV-1a hash of the key's bytes modulo partitions.
// The same key maps to the same partition in every process, release and
// restart, as long as the partition count stays.
func PartitionOf(key string, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	return int(engine.KeyHash(key) % uint32(partitions))
}

// partitionHash returns the hash that places msg and whether it has a key:
// the hash of its partition key, from keyFunc when set, else from the
// PartitionKeyMetadata metadata. A message without a key (empty) is placed
// by the hash of its UUID, which spreads such messages over the partitions:
// the server computes it (hashtext) when no message of the statement has a
// key, and the caller (engine.KeyHash of the UUID) only when one has, so
// that it is not computed here for nothing (0 is returned then).
func partitionHash(keyFunc func(string, *message.Message) (string, error), topic string, msg *message.Message) (uint32, bool, error) {
	var key string
	if keyFunc != nil {
		k, err := keyFunc(topic, msg)
		if err != nil {
			return 0, false, err
		}
		key = k
	} else {
		key = msg.Metadata.Get(PartitionKeyMetadata)
	}
	if key == "" {
		return 0, false, nil
	}
	return engine.KeyHash(key), true, nil
}
