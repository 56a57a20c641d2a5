package engine

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Settings configure a Subscriber: the root package's SubscriberConfig
// with its defaults applied and validated (SubscriberConfig.settings),
// which documents each.
type Settings struct {
	Group            string
	Tables           *pgsql.Tables
	SessionTTL       time.Duration
	StartLatest      bool // StartFromLatest
	PollInterval     time.Duration
	ListenConnConfig *pgx.ConnConfig
	PollOnly         bool
	NackResendDelay  time.Duration
	BatchSize        int
	MaxBufferedBytes int64
	MaxInFlight      int
	OrderingKey      func(msg *message.Message) string
	CommitInterval   time.Duration
	CommitBatch      int
	CloseTimeout     time.Duration
	DrainTimeout     time.Duration
	// Retry is the failure policy; nil: none (a Nack sends the message
	// out again after NackResendDelay).
	Retry       *RetrySettings
	Maintenance MaintenanceSettings
	OnDelivery  func(msg *message.Message) (settled func(err error))
	// SetUp, when set, runs before the first session opens, until it
	// succeeds once: the schema's initialization (InitializeSchema).
	SetUp func(ctx context.Context) error
	// HeartbeatBuckets are the bounds of the heartbeat latency
	// histogram (copied).
	HeartbeatBuckets []time.Duration
}

// MaintenanceSettings are the root package's MaintenanceConfig.
type MaintenanceSettings struct {
	Disabled              bool
	Interval              time.Duration
	RemoveIdleGroupsAfter time.Duration
}
