package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

var migrateSpec = commandSpec{
	name:     "migrate",
	summary:  "create the tables, or upgrade them to this pglease's schema version",
	synopsis: "[--dry-run] [--citus] [--json]",
	help: `Applies the schema migrations that the database lacks (all of them on a
database without the pglease tables), in one transaction under pglease's
advisory lock, exactly as pglease.Migrate does, and prints the versions it
applied. Run it as the role that is to own the tables (a deploy job), so that
the application can run as a role that owns nothing: see pglease grant.
Running it again applies nothing.

--dry-run prints the SQL of the migrations it would apply (a script that
psql can run as it is) and changes nothing.

--citus, on the coordinator of a Citus cluster, then distributes the tables
(pglease.DistributeSQL): the messages and offsets tables by topic, co-located,
the others reference tables, and a trigger that takes each message's
transaction id on its worker. Run it before the applications start; running
it again leaves alone what is distributed already. It fails when the citus
extension is not installed in the database. See docs/scaling.md.`,
	new: func() subcommand { return &migrateCmd{} },
}

type migrateCmd struct {
	dryRun bool
	citus  bool
}

// migrationInfo is one schema version in the JSON of pglease migrate.
type migrationInfo struct {
	Version     int    `json:"version"`
	Description string `json:"description"`
}

// migrateOutput is the JSON of pglease migrate.
type migrateOutput struct {
	// FromVersion is the version found (0: no pglease tables), ToVersion
	// the version after the command (with dry_run: the one it would
	// reach), LatestVersion the newest this pglease knows.
	FromVersion   int  `json:"from_version"`
	ToVersion     int  `json:"to_version"`
	LatestVersion int  `json:"latest_version"`
	DryRun        bool `json:"dry_run"`
	// Migrations are the versions applied (with dry_run: to apply).
	Migrations []migrationInfo `json:"migrations"`
	// SQL is the script of those migrations (with dry_run only; with
	// citus, followed by pglease.DistributeSQL's).
	SQL string `json:"sql,omitempty"`
	// Citus reports that the tables were (with dry_run: would be)
	// distributed over the Citus cluster (--citus).
	Citus bool `json:"citus,omitempty"`
}

func (c *migrateCmd) flags(fs *flag.FlagSet) {
	fs.BoolVar(&c.dryRun, "dry-run", false, "print the SQL of the migrations to apply, and apply nothing")
	fs.BoolVar(&c.citus, "citus", false, "then distribute the tables over the Citus cluster of the coordinator connected to (pglease.DistributeSQL)")
}

func (c *migrateCmd) check(*flag.FlagSet) error { return nil }

func (c *migrateCmd) run(ctx context.Context, e *cmdEnv) error {
	from, err := schemaVersion(ctx, e.conn, e.tables)
	if err != nil {
		return err
	}
	tables := tablesOf(e.tables)
	migrations := tables.Migrations()
	latest := migrations[len(migrations)-1].Version
	out := migrateOutput{FromVersion: from, ToVersion: from, LatestVersion: latest, DryRun: c.dryRun, Migrations: []migrationInfo{}}
	if c.dryRun {
		var pending []pgsql.Migration
		for _, m := range migrations {
			if m.Version > from {
				pending = append(pending, m)
				out.Migrations = append(out.Migrations, migrationInfo{m.Version, m.Description})
				out.ToVersion = m.Version
			}
		}
		if len(pending) > 0 {
			out.SQL = tables.MigrationScript(pending)
		}
		if c.citus {
			out.SQL += pglease.DistributeSQL(e.tables) + ";\n"
			out.Citus = true
		}
	} else {
		if err := pglease.Migrate(ctx, e.conn, e.tables); err != nil {
			return err
		}
		// After the migrations, which create the tables that the script
		// distributes; it leaves alone what is distributed already.
		if c.citus {
			if _, err := e.conn.Exec(ctx, pglease.DistributeSQL(e.tables)); err != nil {
				return fmt.Errorf("distribute the tables over Citus: %w", err)
			}
			out.Citus = true
		}
		if out.ToVersion, err = schemaVersion(ctx, e.conn, e.tables); err != nil {
			return err
		}
		for _, m := range migrations {
			if m.Version > from && m.Version <= out.ToVersion {
				out.Migrations = append(out.Migrations, migrationInfo{m.Version, m.Description})
			}
		}
	}
	if e.json {
		return writeJSON(e.stdout, out)
	}
	switch {
	case c.dryRun && c.citus:
		fmt.Fprintf(e.stdout, "-- The schema is at version %d; pglease migrate --citus would run what follows.\n%s", from, out.SQL)
		return nil
	case from > latest:
		fmt.Fprintf(e.stdout, "The schema is at version %d, newer than this pglease knows (%d): nothing to apply.\n", from, latest)
	case len(out.Migrations) == 0:
		fmt.Fprintf(e.stdout, "The schema is at version %d, the latest: nothing to apply.\n", from)
	case c.dryRun:
		fmt.Fprintf(e.stdout, "-- The schema is at version %d; pglease migrate would apply what follows, as one transaction.\n%s", from, out.SQL)
	default:
		for _, m := range out.Migrations {
			fmt.Fprintf(e.stdout, "Applied version %d: %s\n", m.Version, m.Description)
		}
		fmt.Fprintf(e.stdout, "The schema is at version %d.\n", out.ToVersion)
	}
	if out.Citus && !c.dryRun {
		fmt.Fprintln(e.stdout, "The tables are distributed over the Citus cluster: messages and offsets by topic, the others reference tables.")
	}
	return nil
}

// schemaVersion reads the highest version recorded: 0 when the version
// table does not exist yet.
func schemaVersion(ctx context.Context, conn *pgx.Conn, tables pglease.Tables) (int, error) {
	v, err := pgsql.SchemaVersion(ctx, conn, tablesOf(tables))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the schema version: %w", err)
	}
	return v, nil
}

// tablesOf returns the quoted names and the statements of
// tables.
func tablesOf(tables pglease.Tables) *pgsql.Tables {
	return pgsql.NewTables(pgsql.Names(tables))
}
