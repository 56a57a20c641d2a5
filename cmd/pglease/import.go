package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/wmsqlimport"
)

// importSpec is the command table's entry of pglease import.
var importSpec = commandSpec{
	name:     "import",
	summary:  "take over watermill-sql's pending messages and consumer groups",
	synopsis: "watermill-sql [--source-dsn DSN] (--topics a,b | --all [--owner ROLE]) [--dry-run] [--json]",
	help: `Runs wmsqlimport.Run: for each watermill-sql topic (tables
watermill_<topic> and watermill_offsets_<topic> in the source's search_path),
copies the messages that at least one consumer group has not acknowledged
into pglease's topic of the same name, in watermill-sql's order, and creates
each group's pglease offset so that it receives exactly the messages it had
not acknowledged. Messages of watermill-sql v4's delayed pub/sub that are not
acknowledged are carried too; those still delayed become pglease delayed
messages. Each topic is imported in one transaction.

Running it again copies only the messages published to watermill-sql since,
and moves a group's offset only while no pglease Subscriber ever claimed it;
groups that consume in pglease already are left alone (KEPT).

  --source-dsn DSN  watermill-sql's database (default: --dsn); set its
                    search_path in the DSN when the tables are not in the
                    default one, e.g. ?search_path=app
  --topics a,b      these topics
  --all             every watermill_* table of the source's search_path
                    that --owner owns (with its offsets table); the others
                    are skipped and listed
  --owner ROLE      with --all: the role whose tables are imported
                    (default: the role of the source connection)
  --dry-run         run the import and roll it back: shows what it would do

A table that is not watermill-sql's default PostgreSQL schema (v3 or v4) is
refused, naming the table and the column. The pglease tables must exist
(pglease migrate). Without --timeout the command does not time out.
docs/migrating.md describes the cut-over.`,
	new: func() subcommand { return &importCmd{} },
}

type importCmd struct {
	sourceDSN string
	topics    string
	all       bool
	owner     string
	dryRun    bool
}

func (c *importCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.sourceDSN, "source-dsn", "", "watermill-sql's database `URL` (default: --dsn)")
	fs.StringVar(&c.topics, "topics", "", "comma-separated `TOPICS` to import")
	fs.BoolVar(&c.all, "all", false, "import every watermill-sql topic of the source's search_path")
	fs.StringVar(&c.owner, "owner", "", "with --all, import the tables of this `ROLE` (default: the source connection's role)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "run the import and roll it back")
}

// check takes the source (watermill-sql, the only one so far) from the
// first argument, then the flags after it.
func (c *importCmd) check(fs *flag.FlagSet) error {
	if fs.NArg() == 0 {
		return usageErrorf("name the source: pglease import watermill-sql ...")
	}
	if fs.Arg(0) != "watermill-sql" {
		return usageErrorf("unknown source %q (known: watermill-sql)", fs.Arg(0))
	}
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return usageErrorf("%v", err)
	}
	if c.all == (c.topics != "") {
		return usageErrorf("pass either --topics or --all")
	}
	if c.owner != "" && !c.all {
		return usageErrorf("--owner goes with --all")
	}
	timeoutSet := false
	fs.Visit(func(f *flag.Flag) { timeoutSet = timeoutSet || f.Name == "timeout" })
	if !timeoutSet {
		// An import of millions of messages takes longer than the
		// default of the reading commands.
		_ = fs.Set("timeout", "0")
	}
	return nil
}

func (c *importCmd) dsnFlags() []string { return []string{c.sourceDSN} }

func (c *importCmd) run(ctx context.Context, e *cmdEnv) error {
	dsn := c.sourceDSN
	if dsn == "" {
		dsn = e.conn.Config().ConnString()
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return parseDSNError("--source-dsn", err)
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = applicationName
	}
	src, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to the source: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = src.Close(closeCtx)
	}()
	config := wmsqlimport.Config{All: c.all, SourceOwner: c.owner, Tables: e.tables, DryRun: c.dryRun}
	if c.topics != "" {
		for _, t := range strings.Split(c.topics, ",") {
			if t = strings.TrimSpace(t); t != "" {
				config.Topics = append(config.Topics, t)
			}
		}
	}
	report, err := wmsqlimport.Run(ctx, e.conn, src, config)
	if err != nil {
		return err
	}
	if e.json {
		return writeJSON(e.stdout, report)
	}
	printImport(e.stdout, report)
	return nil
}

func printImport(w io.Writer, r wmsqlimport.Report) {
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "skipped: table %s: %s\n", displayName(s.Table), s.Reason)
	}
	if len(r.Topics) == 0 {
		fmt.Fprintln(w, "No watermill-sql topics found.")
		return
	}
	if r.DryRun {
		fmt.Fprintln(w, "Dry run: rolled back, nothing changed.")
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "TOPIC\tSOURCE\tKIND\tRUN\tMESSAGES\tDELAYED")
	for _, t := range r.Topics {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", displayName(t.Topic), t.SourceTable, t.SourceKind, t.Run, t.Messages, t.Delayed)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "TOPIC\tGROUP\tWATERMILL-SQL ACKED\tPOSITION\tACTION")
	for _, t := range r.Topics {
		for _, g := range t.Groups {
			fmt.Fprintf(tw, "%s\t%s\t%d:%d\t%s\t%s\n", displayName(t.Topic), displayName(g.ConsumerGroup),
				g.SourceTransactionID, g.SourceOffset, formatPosition(g.Position), strings.ToUpper(g.Action))
		}
	}
	_ = tw.Flush()
	for _, t := range r.Topics {
		for _, warning := range t.Warnings {
			fmt.Fprintf(w, "warning: topic %s: %s\n", displayName(t.Topic), warning)
		}
	}
}
