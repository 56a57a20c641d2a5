package pgsql

import (
	"context"
	"strconv"
)

// here is the identity of the server a statement runs on, as text: the
// timeline it writes WAL on (8 hex digits), the time its postmaster
// started and the time its shared statistics were last reset (both in
// microseconds since 1970), e.g.
// "00000001:1795749487213876:1795749485102937".
//
// A Subscriber holds positions in memory (where it read, what it
// delivered, what it acknowledged) that are only valid on the history
// they were read on. A server leaves that history in four ways, and each
// changes here: a standby promoted after a failover writes on a new
// timeline; a copy started as it is (a disk or VM snapshot restored in
// place, a base backup started without recovery settings) keeps the
// timeline but is a new postmaster; a restore to a point in time starts a
// new timeline; and crash recovery after a backend crashed (the postmaster
// ends every process, runs recovery and goes on, keeping its start time
// and timeline) loses the commits that were not flushed yet
// (synchronous_commit = off) and sends the transaction counter back. Crash
// recovery discards the cumulative statistics and stamps the reset time of
// the fixed-numbered ones with the time of recovery; a clean shutdown
// keeps them, restored at the next start. The background writer's reset
// time is the one read: one of those, readable by every role, in every
// version from 15 on. Resetting it by hand
// (pg_stat_reset_shared('bgwriter'), a superuser's function unless
// granted) also changes here, and costs a resynchronisation, as below.
//
// A restart of the same server changes here too, which cannot be told
// from a copy started as it is: the Subscriber then claims again from the
// positions committed in the database, which costs the redelivery of what
// was acknowledged and not committed yet, and loses nothing.
//
// Every statement that reads or writes by a position held in memory
// carries the here of the session it was decided under ([ClusterMark.Here],
// read by the statement that made the session) and compares it on the
// server (hereIs): a pooler that moved the client to another server, or a
// connection dialled anew to a promoted standby, is found by the first
// such statement, before it reads or writes anything.
//
// The functions are called through pg_catalog and read only the server's
// shared memory: pg_current_wal_lsn takes a spinlock, pg_walfile_name
// formats it, pg_postmaster_start_time reads a variable, and
// pg_stat_get_bgwriter_stat_reset_time copies the background writer's
// statistics under their lock (once per transaction: the statistics
// snapshot caches it). (The system identifier would need a read of the
// control file from disk: the Subscriber compares it once per connection
// of its session keeper.)
const here = `(pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8) || ':' ||
	((EXTRACT(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000::numeric)::bigint)::text || ':' ||
	COALESCE(((EXTRACT(epoch FROM pg_catalog.pg_stat_get_bgwriter_stat_reset_time()) * 1000000::numeric)::bigint)::text, ''))`

// hereIs is the condition that the statement runs where the text
// parameter $n says (see here).
func hereIs(n int) string { return `(` + here + ` = $` + strconv.Itoa(n) + `::text)` }

// Here returns the identity of the server q runs on (see here).
func Here(ctx context.Context, q Querier) (string, error) {
	var h string
	err := q.QueryRow(ctx, `SELECT `+here).Scan(&h)
	return h, err
}
