package pglease

// GrantSQL returns the statements that give role everything pglease needs
// at run time, and nothing more, on the tables of adapter
// (DefaultSchemaAdapter{}: the default names), for an application that runs as a role that
// owns nothing: the owner of the tables runs them, once, after [Migrate].
// With them, role publishes (delayed messages too), subscribes, creates
// topics (CreateTopic), inspects and resets offsets (admin.Inspector), and, when
// elected, does the maintainer's work, retention partitions included,
// through the owner's SECURITY DEFINER functions (schema version 7).
//
// It grants USAGE on the schema (when Schema is set); SELECT, INSERT,
// UPDATE and DELETE on the messages table, its partition of messages kept
// forever, and the sessions, offsets, topics, delayed, maintenance and
// retention tables; SELECT on the schema version table; EXECUTE on the
// maintainer's functions. No TRUNCATE, REFERENCES or TRIGGER, no CREATE,
// no ownership: role cannot drop or alter the tables. The statements run
// in one transaction and may be run again.
//
// An upgrade keeps these grants (the migrations carry the grants of the
// tables they replace, and the one that adds functions grants EXECUTE on
// them to every role that may INSERT into the messages table), so GrantSQL
// is run again after an upgrade only when a release says so.
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
func GrantSQL(adapter DefaultSchemaAdapter, role string) string {
	return adapter.tables().GrantScript(role)
}
