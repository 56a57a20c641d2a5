package pgsql

import (
	"fmt"
	"strings"
)

// Prepare returns the idempotent statements run before the version table
// is read: the schema, when it is set (migrations/0000_schema.plpgsql),
// and the version table (migrations/0000_version_table.sql). The schema is
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
	return append(stmts, t.render("0000_version_table.sql"))
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
