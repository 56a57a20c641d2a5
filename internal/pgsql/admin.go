package pgsql

import (
	"context"
	"fmt"
	"strings"
)

// The statements of the admin packages and of the pglease command that
// are not about one table's rows: the transaction settings of the
// Inspector and of the import's source, the owner check of `pglease
// grant`, and the script of `pglease migrate --dry-run`.

func jitOff() Stmt { return Stmt{SQL: "SET LOCAL jit = off"} }

// InspectSettings implements Driver: JIT off (SET LOCAL).
func (d singleNode) InspectSettings(ctx context.Context, q Querier) error {
	_, err := exec(ctx, q, jitOff())
	return err
}

// citusInspectSettings turns JIT off and makes a multi-shard statement
// run its shards on one connection per worker, for the transaction (the
// third argument of set_config: local). Parallel connections per worker
// are what a statement over a few rows of each shard needs least: each
// is opened and closed for the statement (the coordinator session keeps
// one per worker), and on the console's refreshes they were most of the
// connections the workers served.
func citusInspectSettings() Stmt {
	return Stmt{SQL: `SELECT pg_catalog.set_config('jit', 'off', true),
	pg_catalog.set_config('citus.max_adaptive_executor_pool_size', '1', true)`}
}

// InspectSettings implements Driver: JIT off, one connection per worker.
func (d citus) InspectSettings(ctx context.Context, q Querier) error {
	_, err := exec(ctx, q, citusInspectSettings())
	return err
}

func wmReadOnly() Stmt { return Stmt{SQL: `SET TRANSACTION READ ONLY`} }

func wmSnapshot() Stmt {
	return Stmt{SQL: `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`}
}

// WMReadOnly makes the transaction q runs in, on watermill-sql's
// database, read only. It must run before the transaction's first query.
func WMReadOnly(ctx context.Context, q Querier) error {
	_, err := exec(ctx, q, wmReadOnly())
	return err
}

// WMSnapshot makes the transaction q runs in, on watermill-sql's
// database, read only and REPEATABLE READ: every statement reads the
// snapshot of its first query. It must run before that query.
func WMSnapshot(ctx context.Context, q Querier) error {
	_, err := exec(ctx, q, wmSnapshot())
	return err
}

func (t *Tables) tablesOwner() Stmt {
	return Stmt{SQL: `SELECT current_user::text, pg_catalog.pg_get_userbyid(c.relowner)::text,
	pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE'::text)
FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1::text)::oid`, Args: []any{t.Messages}}
}

// TablesOwnerRow is the row of [TablesOwner].
type TablesOwnerRow struct {
	// User is the connection's role, Owner the messages table's owner.
	User, Owner string
	// MayGrant reports that User has Owner's privileges (it is Owner, a
	// member of it, or a superuser), so that its GRANTs on the tables
	// grant something.
	MayGrant bool
}

// TablesOwner reads who owns the messages table, and whether the
// connection's role may grant privileges on it. It returns pgx.ErrNoRows
// when the table does not exist.
func TablesOwner(ctx context.Context, q Querier, t *Tables) (TablesOwnerRow, error) {
	var r TablesOwnerRow
	s := t.tablesOwner()
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&r.User, &r.Owner, &r.MayGrant)
	return r, err
}

// MigrationScript is what [Migrate] runs for pending, as one script to
// run by hand: the lock, the set-up statements of [Tables.Prepare], each
// migration and the record of its version, in one transaction.
func (t *Tables) MigrationScript(pending []Migration) string {
	var b strings.Builder
	b.WriteString("BEGIN;\n")
	fmt.Fprintf(&b, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%s::text, 0::bigint));\n", quoteLiteral(t.LockKey))
	for _, s := range t.Prepare() {
		b.WriteString(s + ";\n")
	}
	for _, m := range pending {
		sql := strings.TrimSpace(m.SQL)
		if !strings.HasSuffix(sql, ";") {
			sql += ";"
		}
		fmt.Fprintf(&b, "\n-- version %d: %s\n%s\n", m.Version, m.Description, sql)
		fmt.Fprintf(&b, "INSERT INTO %s (version, description) VALUES (%d, %s);\n", t.Version, m.Version, quoteLiteral(m.Description))
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}
