package pglease

// GrantSQL returns the statements that give role everything pglease needs
// at run time, and nothing more, on tables (Tables{}: the default names),
// for an application that runs as a role that owns nothing: the owner of
// the tables runs them, once, after [Migrate]. With them, role publishes
// (delayed messages too), subscribes, creates topics (CreateTopic),
// inspects and resets offsets (admin.Inspector), and, when elected, does
// the maintainer's work, retention partitions included, through the
// owner's SECURITY DEFINER functions (schema version 7).
//
// It grants USAGE on the schema (when Schema is set); SELECT, INSERT,
// UPDATE and DELETE on the messages table, its partition of messages kept
// forever, and the sessions, offsets, topics, delayed, maintenance and
// retention tables; SELECT on the schema version table; EXECUTE on the
// maintainer's functions. No TRUNCATE, REFERENCES or TRIGGER, no CREATE,
// no ownership: role cannot drop or alter the tables. Where the messages
// table is distributed by Citus ([DistributeSQL]), it also grants USAGE
// on the sequences of the identity columns of the tables role may insert
// into, on the coordinator and every worker, which Citus needs where a
// single server checks nothing (docs/security.md, "Citus"); elsewhere
// that last block grants nothing. The statements run in one transaction
// and may be run again.
//
// An upgrade keeps these grants (the migrations carry the grants of the
// tables they replace, and those that create the maintainer's functions
// grant EXECUTE on them to every role that may DELETE from the messages
// table, and to no other), so GrantSQL is run again after an upgrade only
// when a release says so.
//
// Who runs it: the owner of the tables (the role that ran [Migrate]), a
// member of that role, or a superuser. Run by any other role, even one
// that holds these privileges itself, PostgreSQL grants nothing and only
// warns ("no privileges were granted"): the script succeeds and role
// then gets "permission denied". `pglease grant` checks the owner first
// and fails on those warnings.
//
// role is quoted (used exactly as given). For the empty role name or
// "public" (which GRANT would take for every role), the script raises an
// error instead of granting anything. See also `pglease grant --role`.
func GrantSQL(tables Tables, role string) string {
	return tables.tables().GrantScript(role)
}

// GrantPublisherSQL returns the statements that give role what it needs to
// publish, and nothing more, on tables: for a service that
// only publishes (a web front end, the producer side of an outbox). Run
// it as for [GrantSQL], whose grants include these.
//
// It grants USAGE on the schema (when Schema is set); INSERT on the
// messages table and on the delayed table, with SELECT of the delayed
// table's due_at column (the insert returns the due times it wrote);
// SELECT on the topics and retention tables (a message's partition and
// retention are read from them) and on the schema version table. role
// cannot read messages, consume, move or delete any consumer group's
// offsets, touch sessions, create topics ([CreateTopic] needs GrantSQL's
// grants) or call the maintainer's functions. A Publisher of such a role
// works with AutoInitializeSchema unset, or set once the owner has
// migrated (it then only reads the schema version).
// On Citus it also grants USAGE on the identity columns' sequences of the
// messages and delayed tables, as [GrantSQL] does.
//
// role is quoted (used exactly as given). For the empty role name or
// "public", the script raises an error instead of granting anything. See
// also `pglease grant --role NAME --publisher`.
func GrantPublisherSQL(tables Tables, role string) string {
	return tables.tables().GrantPublisherScript(role)
}
