package pgsql

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Suffixes of the names of the maintainer's functions (schema version 7),
// after the messages table's name, as partitions are named.
const (
	fnAddPartition    = "add_retention_partition"
	fnExpirePartition = "expire_retention_partition"
	fnDropDetached    = "drop_detached_partition"
)

// function returns the quoted name of one of the maintainer's functions,
// schema-qualified when Schema is set (else it lives, like the tables, in
// the schema the search_path gives).
func (t *Tables) function(suffix string) string {
	if t.Schema == "" {
		return pgx.Identifier{t.partitionName(suffix)}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.partitionName(suffix)}.Sanitize()
}

// maintainerFunctions returns the maintainer's functions with their
// argument types, as GRANT and to_regprocedure take them.
func (t *Tables) maintainerFunctions() []string {
	return []string{
		t.function(fnAddPartition) + "(integer, bigint, bigint)",
		t.function(fnExpirePartition) + "(integer, bigint)",
		t.function(fnDropDetached) + "(integer, bigint)",
		t.function(fnForgetKeys) + "()",
		t.function(fnAddKeys) + "(integer)",
	}
}

// runtimeGrant is one line of GrantSQL: privileges on one object.
type runtimeGrant struct {
	kind  string   // "schema", "table" or "function"
	name  string   // as GRANT takes it: quoted, qualified, a function with its argument types
	privs []string // in GRANT's order
	// cols, when set, makes privs column privileges on these columns.
	cols []string
}

// runtimeGrants lists what a role needs to run pglease, maintainer
// included: what GrantSQL grants and what a maintainer that does not own
// the tables checks for. The partition of messages kept forever is listed
// because the maintainer deletes from it directly (DeleteExpiredKept);
// every other statement reads and writes the messages table through its
// parent. Identity columns need no privilege on their sequences.
func (t *Tables) runtimeGrants() []runtimeGrant {
	dml := []string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	var grants []runtimeGrant
	if t.Schema != "" {
		grants = append(grants, runtimeGrant{kind: "schema", name: pgx.Identifier{t.Schema}.Sanitize(), privs: []string{"USAGE"}})
	}
	for _, table := range []string{t.Messages, t.partition("forever"), t.Sessions, t.Offsets, t.Topics,
		t.Delayed, t.Maintenance, t.Retention, t.Keys} {
		grants = append(grants, runtimeGrant{kind: "table", name: table, privs: dml})
	}
	grants = append(grants, runtimeGrant{kind: "table", name: t.Version, privs: []string{"SELECT"}})
	for _, fn := range t.maintainerFunctions() {
		grants = append(grants, runtimeGrant{kind: "function", name: fn, privs: []string{"EXECUTE"}})
	}
	return grants
}

// publisherGrants lists what a role needs to publish and nothing more:
// the insert of messages reads the topic's settings (partitions,
// retention class) and the retention table (which partition covers the
// expiry); a delayed message is inserted into the delayed table, whose
// statement returns the due times it wrote; a message with an idempotency
// key writes it into the keys table, whose statement returns the keys it
// wrote (its topic too: SELECT of topic and key); AutoInitializeSchema reads
// the schema version. Nothing on the sessions, offsets or maintenance
// tables, no SELECT on messages, no functions.
func (t *Tables) publisherGrants() []runtimeGrant {
	var grants []runtimeGrant
	if t.Schema != "" {
		grants = append(grants, runtimeGrant{kind: "schema", name: pgx.Identifier{t.Schema}.Sanitize(), privs: []string{"USAGE"}})
	}
	return append(grants,
		runtimeGrant{kind: "table", name: t.Messages, privs: []string{"INSERT"}},
		runtimeGrant{kind: "table", name: t.Delayed, privs: []string{"INSERT"}},
		runtimeGrant{kind: "table", name: t.Delayed, privs: []string{"SELECT"}, cols: []string{"due_at"}},
		runtimeGrant{kind: "table", name: t.Keys, privs: []string{"INSERT"}},
		runtimeGrant{kind: "table", name: t.Keys, privs: []string{"SELECT"}, cols: []string{"topic", "key"}},
		runtimeGrant{kind: "table", name: t.Topics, privs: []string{"SELECT"}},
		runtimeGrant{kind: "table", name: t.Retention, privs: []string{"SELECT"}},
		runtimeGrant{kind: "table", name: t.Version, privs: []string{"SELECT"}},
	)
}

// GrantScript is the script of pglease.GrantSQL for role (see there).
func (t *Tables) GrantScript(role string) string {
	return grantScript("pglease.GrantSQL", "to run pglease", role, t.runtimeGrants())
}

// GrantPublisherScript is the script of pglease.GrantPublisherSQL for role
// (see there).
func (t *Tables) GrantPublisherScript(role string) string {
	return grantScript("pglease.GrantPublisherSQL", "to publish with pglease", role, t.publisherGrants())
}

// grantScript grants grants to role in one transaction, or, for the empty
// role and "public", raises an error instead; what names the function in
// both.
func grantScript(what, purpose, role string, grants []runtimeGrant) string {
	refuse := func(msg string) string {
		return "-- " + what + ": " + msg + "\n" + doBlock("BEGIN\n\tRAISE EXCEPTION "+quoteLiteral(what+": "+msg)+";\nEND") + ";\n"
	}
	switch role {
	case "":
		return refuse("the role name is empty")
	case "public":
		return refuse(`role "public" would be every role: name an application role`)
	}
	to := pgx.Identifier{role}.Sanitize()
	var b strings.Builder
	fmt.Fprintf(&b, "-- What role %s needs %s (%s); run as the owner of the tables.\nBEGIN;\n", to, purpose, what)
	for _, gr := range grants {
		privs := strings.Join(gr.privs, ", ")
		if gr.cols != nil {
			cols := make([]string, len(gr.cols))
			for i, c := range gr.cols {
				cols[i] = pgx.Identifier{c}.Sanitize()
			}
			privs += " (" + strings.Join(cols, ", ") + ")"
		}
		fmt.Fprintf(&b, "GRANT %s ON %s %s TO %s;\n", privs, strings.ToUpper(gr.kind), gr.name, to)
	}
	var inserts []string
	for _, gr := range grants {
		if gr.kind == "table" && gr.cols == nil && slices.Contains(gr.privs, "INSERT") {
			inserts = append(inserts, gr.name)
		}
	}
	if len(inserts) > 0 {
		b.WriteString(citusIdentityGrants(inserts, to))
		b.WriteString(";\n")
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

// citusIdentityGrants returns the block of grantScript that, where the
// messages table is distributed by Citus, grants role (quoted) USAGE on
// the identity sequences of tables (quoted, qualified when Schema is
// set: those the role may INSERT into), on the coordinator and on every
// worker; elsewhere it does nothing. A single server needs no privilege
// on them: the identity column's value is taken without a check. Citus
// takes it on the coordinator with nextval() when it evaluates an
// INSERT ... SELECT there itself (a common table expression with a
// volatile function before the INSERT, as the statement of one topic had
// before the Citus insert was rewritten), and nextval() checks USAGE:
// "permission denied for sequence <messages>_offset_seq1". Each worker
// has a copy of the sequence, with a name of its own, which a statement
// run on that worker would take its values from (pglease runs none
// there: applications connect to the coordinator).
func citusIdentityGrants(tables []string, role string) string {
	lit := quoteLiteral
	list := make([]string, len(tables))
	for i, tab := range tables {
		list[i] = lit(tab) + "::regclass"
	}
	return doBlock(`DECLARE
	r record;
	failed text;
BEGIN
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
		RETURN; -- not Citus
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
		WHERE p.logicalrelid = ` + lit(tables[0]) + `::regclass) THEN
		RETURN; -- not distributed (yet: DistributeSQL grants it then)
	END IF;` + identitySequenceGrants(`SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) AS tab, a.attname AS col,
			`+lit(role)+`::text AS grantee
		FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attrelid IN (`+strings.Join(list, ", ")+`) AND a.attidentity <> '' AND NOT a.attisdropped
		ORDER BY 1, 2`, "true") + `
END`)
}

// identitySequenceGrants returns PL/pgSQL statements, for a block that
// declares r record and failed text, that grant USAGE on the identity
// sequences that query lists (columns tab: a table, qualified and
// quoted; col: its identity column; grantee: a role as GRANT takes it,
// quoted, or PUBLIC) on the Citus coordinator, and, when onWorkers (a
// PL/pgSQL boolean expression) holds, on every worker, each worker's own
// copy of the sequence (found there by pg_get_serial_sequence: its name
// may differ from the coordinator's). A worker that does not see the
// table (created by the transaction that runs this, not committed yet)
// is left alone. Worker failures raise an error naming the workers.
func identitySequenceGrants(query, onWorkers string) string {
	return `
	FOR r IN ` + query + ` LOOP
		EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE %s TO %s', pg_catalog.pg_get_serial_sequence(r.tab, r.col), r.grantee);
		IF ` + onWorkers + ` THEN
			SELECT pg_catalog.string_agg(c.nodename || ':' || c.nodeport || ': ' || c.result, '; ') INTO failed
			FROM pg_catalog.run_command_on_workers(pg_catalog.format('DO %L', pg_catalog.format(
				'BEGIN IF pg_catalog.to_regclass(%L) IS NOT NULL THEN EXECUTE pg_catalog.format(%L, pg_catalog.pg_get_serial_sequence(%L, %L), %L); END IF; END',
				r.tab, 'GRANT USAGE ON SEQUENCE %s TO %s', r.tab, r.col, r.grantee))) c
			WHERE NOT c.success;
			IF failed IS NOT NULL THEN
				RAISE EXCEPTION 'pglease: USAGE on the sequence of %.% for % on the workers: %', r.tab, r.col, r.grantee, failed;
			END IF;
		END IF;
	END LOOP;`
}
