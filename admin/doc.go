// Package admin is pglease's operator API: an [Inspector] that reads
// who owns what (consumer sessions, the lag of each consumer group on each
// topic and partition, the xmin horizon that holds delivery back, the
// topics), browses and replays stored messages, and resets or deletes a
// consumer group's offsets. The pglease command, its web console and the
// metrics collectors are built on it.
//
// It is a client of the tables that package pglease creates, apart from
// the Publisher and Subscriber a Watermill application constructs: it
// takes the same [pglease.Tables] and a [pglease.DB], and
// its errors wrap pglease's sentinels ([pglease.ErrInvalidConfig],
// [pglease.ErrInvalidTopic], [pglease.ErrUndecodableMetadata]) or its own
// ([ErrOwnedByLiveSession]).
//
//	insp, err := admin.NewInspector(pool, pglease.Tables{})
//	lag, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"billing"}})
package admin
