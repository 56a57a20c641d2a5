package pglease

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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

// expireLockTimeout bounds how long the function that expires a retention
// partition waits for its lock on the messages table: a plain DETACH
// PARTITION takes an ACCESS EXCLUSIVE lock, and while it waits for
// transactions that use the table, publishers and readers queue behind it.
// See "Least privilege" in docs/architecture.md for what it costs them.
const expireLockTimeout = "500ms"

// function returns the quoted name of one of the maintainer's functions,
// schema-qualified when Schema is set (else it lives, like the tables, in
// the schema the search_path gives).
func (a DefaultSchemaAdapter) function(suffix string) string {
	if a.Schema == "" {
		return pgx.Identifier{a.partitionName(suffix)}.Sanitize()
	}
	return pgx.Identifier{a.Schema, a.partitionName(suffix)}.Sanitize()
}

// maintainerFunctions returns the maintainer's functions with their
// argument types, as GRANT and to_regprocedure take them.
func (a DefaultSchemaAdapter) maintainerFunctions() []string {
	return []string{
		a.function(fnAddPartition) + "(integer, bigint, bigint)",
		a.function(fnExpirePartition) + "(integer, bigint)",
		a.function(fnDropDetached) + "(integer, bigint)",
	}
}

// migration7 creates the functions through which a maintainer whose role
// does not own the tables adds, expires and drops retention partitions.
// They are SECURITY DEFINER functions of the messages table's owner (set so
// even when a superuser runs the migration), with a pinned search_path and
// every name schema-qualified inside: the schema is the messages table's,
// read when the migration runs (with Schema empty, the search_path
// decides where the tables are). EXECUTE is revoked from PUBLIC and granted
// to every role that may INSERT into the messages table, so that an
// upgrade needs no new grant for the roles that run pglease.
//
// Each function takes a retention class and the slot's start (and end) in
// Unix seconds, builds the partition's name itself, as partitionName does,
// and acts only on tables of that name in the messages table's schema that
// are retention partitions of the messages table (attached, or, for
// drop_detached_partition, detached and shaped like one): no argument
// names a table.
func (a DefaultSchemaAdapter) migration7() string {
	msgs := a.MessagesTable
	if msgs == "" {
		msgs = DefaultMessagesTable
	}
	retention := a.RetentionTable
	if retention == "" {
		retention = DefaultRetentionTable
	}
	sum := sha256.Sum256([]byte(msgs))
	// The header of every function: the names, then the partition's name
	// built from p_class and p_start exactly as partitionName builds it
	// (PostgreSQL's names are at most 63 bytes).
	declare := `	msgs constant text := ` + quoteLiteral(msgs) + `;
	retention constant text := ` + quoteLiteral(retention) + `;
	hash constant text := ` + quoteLiteral(hex.EncodeToString(sum[:4])) + `;
	suffix text;
	part text;
`
	name := `	IF p_class IS NULL OR p_class < 1 OR p_class > 32767 THEN
		RAISE EXCEPTION 'pglease: retention class % is not between 1 and 32767', p_class USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF p_start IS NULL OR p_start < 0 OR p_start > 253402300799 THEN
		RAISE EXCEPTION 'pglease: partition start % is not a Unix time in seconds', p_start USING ERRCODE = 'invalid_parameter_value';
	END IF;
	suffix := 'r' || p_class || '_' || p_start;
	part := msgs || '_' || suffix;
	IF octet_length(part) > 63 THEN
		part := convert_from(substring(convert_to(msgs, 'UTF8') FROM 1 FOR 53 - octet_length(suffix)), 'UTF8') || '_' || hash || '_' || suffix;
	END IF;
`
	add := declare + `BEGIN
` + name + `	IF p_end IS NULL OR p_end <= p_start OR p_end > 253402300799 THEN
		RAISE EXCEPTION 'pglease: partition end % does not follow its start %', p_end, p_start USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = nsp AND c.relname = part) THEN
		RETURN false;
	END IF;
	EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS)', nsp, part, nsp, msgs);
	EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (topic, partition, transaction_id, "offset")', nsp, part);
	EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s, to_timestamp(%s)) TO (%s, to_timestamp(%s))',
		nsp, msgs, nsp, part, p_class, p_start, p_class, p_end);
	EXECUTE format('UPDATE %I.%I SET covered_until = $1, updated_at = now() WHERE retention_class = $2 AND covered_until < $1', nsp, retention)
		USING to_timestamp(p_end), p_class::smallint;
	RETURN true;
END`
	expire := declare + `	rel oid;
	pending boolean;
BEGIN
` + name + `	SELECT c.oid, i.inhdetachpending INTO rel, pending
	FROM pg_class p
	JOIN pg_namespace pn ON pn.oid = p.relnamespace
	JOIN pg_inherits i ON i.inhparent = p.oid
	JOIN pg_class c ON c.oid = i.inhrelid
	WHERE pn.nspname = nsp AND p.relname = msgs AND c.relnamespace = p.relnamespace AND c.relname = part;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	IF pending THEN
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I FINALIZE', nsp, msgs, nsp, part);
	ELSE
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I', nsp, msgs, nsp, part);
	END IF;
	EXECUTE format('DROP TABLE %I.%I', nsp, part);
	RETURN true;
END`
	drop := declare + `	rel oid;
	parent oid;
BEGIN
` + name + `	SELECT p.oid INTO parent FROM pg_class p JOIN pg_namespace pn ON pn.oid = p.relnamespace
	WHERE pn.nspname = nsp AND p.relname = msgs;
	SELECT c.oid INTO rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = nsp AND c.relname = part;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	IF parent IS NULL
		OR (SELECT c.relkind <> 'r' OR c.relispartition FROM pg_class c WHERE c.oid = rel)
		OR EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = rel OR inhparent = rel)
		OR (SELECT c.relowner FROM pg_class c WHERE c.oid = rel) NOT IN
			((SELECT p.relowner FROM pg_class p WHERE p.oid = parent), current_user::regrole::oid)
		OR NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = 'expires_at' AND NOT attisdropped)
		OR EXISTS (SELECT 1 FROM pg_attribute x WHERE x.attrelid = rel AND x.attnum > 0 AND NOT x.attisdropped
			AND NOT EXISTS (SELECT 1 FROM pg_attribute y WHERE y.attrelid = parent AND y.attname = x.attname
				AND y.atttypid = x.atttypid AND NOT y.attisdropped))
	THEN
		RAISE EXCEPTION 'pglease: %.% is not a detached retention partition of %.%', nsp, part, nsp, msgs
			USING ERRCODE = 'wrong_object_type';
	END IF;
	EXECUTE format('DROP TABLE %I.%I', nsp, part);
	RETURN true;
END`
	create := func(suffix, params, types, lockTimeout, body string) string {
		return `	fn := quote_ident(nsp) || '.' || quote_ident(` + quoteLiteral(a.partitionName(suffix)) + `);
	EXECUTE 'CREATE OR REPLACE FUNCTION ' || fn || '(` + params + `) RETURNS boolean
		LANGUAGE plpgsql VOLATILE SECURITY DEFINER
		SET search_path = pg_catalog, pg_temp
		SET lock_timeout = ` + strings.ReplaceAll(quoteLiteral(lockTimeout), "'", "''") + `
		AS ' || quote_literal('DECLARE
	nsp constant text := ' || quote_literal(nsp) || ';
' || ` + dollarQuote(body) + `);
	fns := fns || (fn || '(` + types + `)');
`
	}
	return doBlock(`DECLARE
	msgs regclass := to_regclass(`+quoteLiteral(a.messages())+`);
	nsp name;
	owner name;
	fn text;
	fns text[] := '{}';
	r record;
BEGIN
	SELECT n.nspname, pg_get_userbyid(c.relowner) INTO nsp, owner
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = msgs;
	IF nsp IS NULL THEN
		RAISE EXCEPTION 'pglease: the messages table % is missing', `+quoteLiteral(a.messages())+`;
	END IF;
`+create(fnAddPartition, "p_class integer, p_start bigint, p_end bigint", "integer, bigint, bigint", "5s", add)+
		create(fnExpirePartition, "p_class integer, p_start bigint", "integer, bigint", expireLockTimeout, expire)+
		create(fnDropDetached, "p_class integer, p_start bigint", "integer, bigint", "5s", drop)+`	FOREACH fn IN ARRAY fns LOOP
		EXECUTE 'REVOKE ALL ON FUNCTION ' || fn || ' FROM PUBLIC';
		IF owner <> current_user THEN
			EXECUTE 'ALTER FUNCTION ' || fn || ' OWNER TO ' || quote_ident(owner);
		END IF;
		-- The roles that run pglease today keep every part of it.
		FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
			WHERE c.oid = msgs AND a.privilege_type = 'INSERT' AND a.grantee NOT IN (0, c.relowner)
		LOOP
			EXECUTE 'GRANT EXECUTE ON FUNCTION ' || fn || ' TO ' || quote_ident(pg_get_userbyid(r.grantee));
		END LOOP;
	END LOOP;
END`) + ";"
}

// runtimeGrant is one line of GrantSQL: privileges on one object.
type runtimeGrant struct {
	kind  string   // "schema", "table" or "function"
	name  string   // as GRANT takes it: quoted, qualified, a function with its argument types
	privs []string // in GRANT's order
}

// runtimeGrants lists what a role needs to run pglease, maintainer
// included: what GrantSQL grants and what a maintainer that does not own
// the tables checks for. The partition of messages kept forever is listed
// because the maintainer deletes from it directly (DeleteExpiredKept);
// every other statement reads and writes the messages table through its
// parent. Identity columns need no privilege on their sequences.
func (a DefaultSchemaAdapter) runtimeGrants() []runtimeGrant {
	dml := []string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	var grants []runtimeGrant
	if a.Schema != "" {
		grants = append(grants, runtimeGrant{"schema", pgx.Identifier{a.Schema}.Sanitize(), []string{"USAGE"}})
	}
	for _, table := range []string{a.messages(), a.partition("forever"), a.sessions(), a.offsets(), a.topics(),
		a.delayed(), a.maintenance(), a.retention()} {
		grants = append(grants, runtimeGrant{"table", table, dml})
	}
	grants = append(grants, runtimeGrant{"table", a.VersionTable(), []string{"SELECT"}})
	for _, fn := range a.maintainerFunctions() {
		grants = append(grants, runtimeGrant{"function", fn, []string{"EXECUTE"}})
	}
	return grants
}

// grantsAdapter is implemented by DefaultSchemaAdapter and the adapters
// that embed it.
type grantsAdapter interface {
	runtimeGrants() []runtimeGrant
}

// GrantSQL returns the statements that give role everything pglease needs
// at run time, and nothing more, on the tables of adapter (nil:
// DefaultSchemaAdapter{}), for an application that runs as a role that
// owns nothing: the owner of the tables runs them, once, after [Migrate].
// With them, role publishes (delayed messages too), subscribes, creates
// topics (CreateTopic), inspects and resets offsets (Inspector), and, when
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
// role is quoted (used exactly as given). For the empty role name or
// "public" (which GRANT would take for every role), and for an adapter
// that neither is nor embeds DefaultSchemaAdapter, the script raises an
// error instead of granting anything. See also `pglease grant --role`.
func GrantSQL(adapter SchemaAdapter, role string) string {
	if adapter == nil {
		adapter = DefaultSchemaAdapter{}
	}
	refuse := func(msg string) string {
		return "-- pglease.GrantSQL: " + msg + "\n" + doBlock("BEGIN\n\tRAISE EXCEPTION "+quoteLiteral("pglease.GrantSQL: "+msg)+";\nEND") + ";\n"
	}
	g, ok := adapter.(grantsAdapter)
	switch {
	case !ok:
		return refuse(fmt.Sprintf("the schema adapter %T does not say which objects pglease uses", adapter))
	case role == "":
		return refuse("the role name is empty")
	case role == "public":
		return refuse(`role "public" would be every role: name an application role`)
	}
	to := pgx.Identifier{role}.Sanitize()
	var b strings.Builder
	fmt.Fprintf(&b, "-- What role %s needs to run pglease (pglease.GrantSQL); run as the owner of the tables.\nBEGIN;\n", to)
	for _, gr := range g.runtimeGrants() {
		fmt.Fprintf(&b, "GRANT %s ON %s %s TO %s;\n", strings.Join(gr.privs, ", "), strings.ToUpper(gr.kind), gr.name, to)
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}
