package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

var grantSpec = commandSpec{
	name:     "grant",
	summary:  "let an application role run pglease on the tables (run as their owner)",
	synopsis: "--role ROLE [--publisher] [--dry-run] [--json]",
	help: `Runs pglease.GrantSQL for ROLE: USAGE on the schema, SELECT, INSERT, UPDATE and
DELETE on the pglease tables, SELECT on the schema version table, EXECUTE on
the owner's functions that the maintainer adds and drops retention partitions
with. That is everything the role needs to publish, subscribe, create topics,
delay messages, reset offsets and be the maintainer, and nothing more: it
cannot drop, alter or truncate the tables. Run it as the tables' owner (or a
member of that role, or a superuser), after pglease migrate: as another role
it fails, naming the owner, since PostgreSQL would grant nothing. Upgrades
keep these grants.

--publisher runs pglease.GrantPublisherSQL instead: only what publishing
needs (INSERT on the messages and delayed tables, SELECT on the topic
settings, the retention table and the schema version), for a service that
publishes and must not read messages or touch any consumer group.

--dry-run prints the statements and grants nothing.`,
	new: func() subcommand { return &grantCmd{} },
}

// undefinedFunction is PostgreSQL's error code for a missing function.
const undefinedFunction = "42883"

type grantCmd struct {
	role      onceString
	publisher bool
	dryRun    bool
}

// grantOutput is the JSON of pglease grant.
type grantOutput struct {
	Role      string `json:"role"`
	Publisher bool   `json:"publisher"`
	DryRun    bool   `json:"dry_run"`
	// SQL is what was run (with dry_run: what would be).
	SQL string `json:"sql"`
}

func (c *grantCmd) flags(fs *flag.FlagSet) {
	fs.Var(&c.role, "role", "the application `ROLE` to grant (required; used exactly as given)")
	fs.BoolVar(&c.publisher, "publisher", false, "grant only what publishing needs (pglease.GrantPublisherSQL)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print the statements, and grant nothing")
}

func (c *grantCmd) check(*flag.FlagSet) error {
	switch {
	case !c.role.set || c.role.value == "":
		return usageErrorf("--role is required")
	case c.role.value == "public":
		return usageErrorf(`--role public would grant to every role: name an application role`)
	}
	return nil
}

// privilegeNotGranted is the SQLSTATE of PostgreSQL's warnings "no
// privileges were granted" and "not all privileges were granted": GRANT
// by a role that holds the privileges but may not grant them (it does
// not own the object) succeeds and grants nothing.
const privilegeNotGranted = "01007"

func (c *grantCmd) run(ctx context.Context, e *cmdEnv) error {
	out := grantOutput{Role: c.role.value, Publisher: c.publisher, DryRun: c.dryRun}
	if c.publisher {
		out.SQL = pglease.GrantPublisherSQL(e.tables, c.role.value)
	} else {
		out.SQL = pglease.GrantSQL(e.tables, c.role.value)
	}
	if !c.dryRun {
		if err := checkOwner(ctx, e); err != nil {
			return err
		}
		e.notices.take()
		if _, err := e.conn.Exec(ctx, out.SQL); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == undefinedFunction {
				return fmt.Errorf("%w (the schema predates the maintainer's functions: run pglease migrate first)", err)
			}
			return err
		}
		var refused []string
		for _, n := range e.notices.take() {
			if n.Code == privilegeNotGranted {
				refused = append(refused, n.Message)
			}
		}
		if len(refused) > 0 {
			return fmt.Errorf("PostgreSQL did not grant everything (%s): run pglease grant again as the owner of the tables, "+
				"a member of that role, or a superuser", strings.Join(refused, "; "))
		}
	}
	if e.json {
		return writeJSON(e.stdout, out)
	}
	if c.dryRun {
		fmt.Fprint(e.stdout, out.SQL)
		return nil
	}
	what := "what pglease needs at run time, maintainer included"
	if c.publisher {
		what = "what publishing needs, and nothing of consumers"
	}
	fmt.Fprintf(e.stdout, "Granted role %s %s, on the tables of %s.\n",
		pgx.Identifier{c.role.value}.Sanitize(), what, schemaName(e.tables))
	return nil
}

// checkOwner refuses to grant when the connection's role may not grant
// privileges on the messages table (it is not its owner, a member of the
// owner's role or a superuser): PostgreSQL would only warn and grant
// nothing. Without the table, it leaves the GRANT to fail saying so.
func checkOwner(ctx context.Context, e *cmdEnv) error {
	r, err := pgsql.TablesOwner(ctx, e.conn, tablesOf(e.tables))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("read the owner of the tables: %w", err)
	case !r.MayGrant:
		return fmt.Errorf("role %s does not own the pglease tables of %s (their owner is %s): PostgreSQL would grant nothing; "+
			"run pglease grant as %s, a member of that role, or a superuser",
			pgx.Identifier{r.User}.Sanitize(), schemaName(e.tables), pgx.Identifier{r.Owner}.Sanitize(),
			pgx.Identifier{r.Owner}.Sanitize())
	}
	return nil
}

func schemaName(a pglease.Tables) string {
	if a.Schema == "" {
		return "the search_path"
	}
	return "schema " + pgx.Identifier{a.Schema}.Sanitize()
}
