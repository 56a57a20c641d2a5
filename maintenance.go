package pglease

import "time"

// DefaultMaintenanceInterval is the default of MaintenanceConfig.Interval.
const DefaultMaintenanceInterval = 30 * time.Second

// MaintenanceConfig configures the maintenance that one Subscriber runs
// for all Subscribers of a set of tables: moving delayed messages into
// their topics when due, removing messages past their topic's retention,
// expired sessions and, if asked, the offsets of idle consumer groups.
//
// Every Subscriber whose maintenance is not disabled is a candidate; one
// of them, elected through the consumer-session rows they keep anyway, is
// the maintainer at a time. It holds the role as long as its session
// lives: when it closes, another candidate takes over at once; when its
// process dies, when its session expires (after at most SessionTTL).
// Standing by costs one read of the maintainer's row per candidate about
// every two thirds of SessionTTL (the holder's heartbeat moves the expiry
// it waits for); the claim statement runs only when the row looks free.
// The maintainer's own settings apply; give every Subscriber the same.
type MaintenanceConfig struct {
	// Disabled sets whether the Subscriber never runs maintenance,
	// default false: it is a candidate. With every Subscriber disabled,
	// delayed messages are not delivered and retention removes nothing.
	Disabled bool
	// Interval sets how often the maintainer deletes expired sessions,
	// removes idle groups and looks for new retention settings it was not
	// notified of, default DefaultMaintenanceInterval (30s).
	Interval time.Duration
	// RemoveIdleGroupsAfter sets after how long without a live session,
	// a commit or a claim the offset rows of a consumer group are deleted,
	// default 0: never. The group then starts again as a new group
	// (StartFrom).
	RemoveIdleGroupsAfter time.Duration
}
