package pgsql

import (
	"fmt"
	"strings"
)

// Prepare returns the idempotent statements run before the version table
// is read: the schema, when it is set (migrations/0000_schema.plpgsql),
// the guard (see [Tables.Guard]) and the version table
// (migrations/0000_version_table.sql). The schema is
// created only when pg_namespace does not have it: CREATE SCHEMA IF NOT
// EXISTS checks the CREATE privilege on the database even when the schema
// exists, which an owner role given its own schema usually lacks.
func (t *Tables) Prepare() []string {
	var stmts []string
	if t.Schema != "" {
		// Not CREATE SCHEMA IF NOT EXISTS: it checks CREATE on the
		// database even when the schema exists (an owner given its own
		// schema usually lacks it), and it looks the name up in the
		// backend's catalog cache, which may still hold "missing" from a
		// read made before the set-up lock was granted (the lock does
		// not refresh it): it then fails on the schema another set-up
		// just created. A query reads the catalog as of now.
		stmts = append(stmts, doBlock(t.render("0000_schema.plpgsql")))
	}
	return append(stmts, t.Guard(), t.render("0000_version_table.sql"))
}

// Script is the whole DDL of the latest schema version as one script
// (what pglease.SchemaSQL returns): idempotent, and recording the
// versions it creates.
func (t *Tables) Script() string {
	var b strings.Builder
	b.WriteString("BEGIN;\n")
	for _, s := range t.Prepare() {
		b.WriteString(s)
		b.WriteString(";\n")
	}
	for _, m := range t.Migrations() {
		sql := strings.TrimSpace(m.SQL)
		if !strings.HasSuffix(sql, ";") {
			sql += ";"
		}
		fmt.Fprintf(&b, "\n-- version %d: %s\n%s\n", m.Version, m.Description, sql)
		fmt.Fprintf(&b, "INSERT INTO %s (version, description) VALUES (%d, %s) ON CONFLICT (version) DO NOTHING;\n",
			t.Version, m.Version, quoteLiteral(m.Description))
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

// Guard is the statement (migrations/0000_guard.plpgsql) that makes the
// rest of its transaction safe from the objects other roles may create:
// it sets the transaction's search_path to pg_catalog, pg_temp (with
// Schema empty: the schema the search_path gave, then pg_catalog,
// pg_temp), so that no function, operator or type another role planted
// in a schema of the caller's search_path is called; and it refuses, with
// an error naming them, a schema of the tables in which roles other than
// its owner, the migrating role and the roles that role is a member of
// may CREATE, and tables of pglease's names that exist already, owned by
// another role. Such a role could have planted a trigger, a rule or a
// policy that the migration would run with the migrating role's
// privileges, or rows (a version table that records every version).
func (t *Tables) Guard() string {
	return doBlock(t.render("0000_guard.plpgsql"))
}
