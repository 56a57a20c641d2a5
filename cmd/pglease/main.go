// Command pglease shows and operates the consumer groups of pglease, the
// Watermill Pub/Sub backend on PostgreSQL, as kafka-consumer-groups does
// for Kafka:
//
//	pglease status          live sessions and the xmin horizon
//	pglease lag             position, owner and lag per (group, topic, partition)
//	pglease topics          topics with their partitions, groups and newest message
//	pglease reset-offsets   move a consumer group's positions on a topic
//	pglease migrate         create or upgrade the tables (as their owner; --citus distributes them)
//	pglease move-shard      on Citus, move a topic's shard to another worker
//	pglease rebalance       on Citus, the rebalancer's moves, each made safe
//	pglease grant           let an application role run pglease (as the owner)
//	pglease import          take over watermill-sql's pending messages and groups
//	pglease messages        browse a topic's stored messages (messages.go)
//	pglease replay          move poisoned messages back to their topic (replay.go)
//	pglease ui              the console in a browser (ui.go)
//
// It connects to --dsn, else to $DATABASE_URL, and works on the pglease
// tables of --schema (default: the search_path). Every command takes --json.
// Exit status: 0 on success, 1 on an error (or a refused reset), 2 on bad
// usage. docs/operations.md shows every command with its output.
//
// Install it with
//
//	go install github.com/pglease/watermill-pglease/cmd/pglease@latest
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

const (
	// defaultTimeout bounds a whole command: connecting, reading, resetting.
	defaultTimeout = 30 * time.Second
	// applicationName is the application_name the command connects with
	// (unless the DSN sets one), so that it is recognizable in
	// pg_stat_activity.
	applicationName = "pglease"
	// undefinedTable is PostgreSQL's error code for a missing table.
	undefinedTable = "42P01"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// subcommand is one command of pglease: flags registers its own flags,
// check validates them once parsed (returning a usageError for bad input),
// run does the work on an open connection.
type subcommand interface {
	flags(fs *flag.FlagSet)
	check(fs *flag.FlagSet) error
	run(ctx context.Context, e *cmdEnv) error
}

// commandSpec names a subcommand and documents it.
type commandSpec struct {
	name     string
	summary  string // one line, for the list of commands
	synopsis string // the arguments after "pglease <name>"
	help     string // what it does, for its usage
	new      func() subcommand
}

// commands are pglease's commands, in the order help lists them. Each
// command's file declares its commandSpec.
var commands = []commandSpec{
	statusSpec,
	lagSpec,
	topicsSpec,
	resetSpec,
	migrateSpec,
	moveShardSpec,
	rebalanceSpec,
	grantSpec,
	importSpec,
	messagesSpec,
	replaySpec,
	uiSpec,
}

func lookup(name string) *commandSpec {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// run runs the pglease command line args (without the program name), with
// env for environment variables, and returns the exit status. What it
// prints goes through a terminalWriter: nothing read from the database
// reaches the terminal as a control sequence. What it prints on stderr
// goes through a redactWriter too: no password of a connection string.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	out, errOut := newTerminalWriter(stdout), newTerminalWriter(stderr)
	defer func() { _, _ = out.Flush(), errOut.Flush() }()
	return runSafe(ctx, args, env, out, newRedactWriter(errOut))
}

func runSafe(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		switch {
		case len(args) == 1:
			printUsage(stdout)
			return exitOK
		case len(args) == 2 && lookup(args[1]) != nil:
			spec := lookup(args[1])
			fs, _, _ := spec.flagSet(io.Discard)
			spec.printUsage(stdout, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "pglease help: unknown command %q\n\n", strings.Join(args[1:], " "))
		printUsage(stderr)
		return exitUsage
	}
	spec := lookup(args[0])
	if spec == nil {
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(stderr, "pglease: %s: flags go after the command, as in: pglease status --dsn URL\n\n", args[0])
		} else {
			fmt.Fprintf(stderr, "pglease: unknown command %q\n\n", args[0])
		}
		printUsage(stderr)
		return exitUsage
	}
	return spec.execute(ctx, args[1:], env, stdout, stderr)
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `pglease shows and operates the consumer groups of pglease on PostgreSQL,
and sets up its tables.

Usage:
  pglease <command> [flags]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  help [command]\tthis help, or a command's\n")
	_ = tw.Flush()
	fmt.Fprint(w, `
Every command takes:
`)
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	(&commonFlags{}).register(fs)
	printFlags(w, fs, nil)
	fmt.Fprint(w, `
Exit status: 0 on success, 1 on an error or a refused reset, 2 on bad usage.
`)
}

// commonFlags are the flags of every command.
type commonFlags struct {
	dsn     string
	schema  string
	json    bool
	timeout time.Duration
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", "", "PostgreSQL `URL` or key=value connection string (default: $DATABASE_URL, which ps does not show)")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL `SCHEMA` of the pglease tables (default: the search_path)")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of tables")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "give up after this `DURATION` (0: never)")
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// isCommon reports whether name is a flag of commonFlags.
func isCommon(name string) bool {
	switch name {
	case "dsn", "schema", "json", "timeout":
		return true
	}
	return false
}

// cmdEnv is what a subcommand runs with.
type cmdEnv struct {
	conn   *pgx.Conn
	tables pglease.Tables
	insp   *admin.Inspector
	json   bool
	stdout io.Writer

	// For long-running commands (pglease ui): where to log, the
	// environment, the connection string, and --timeout (which bounds
	// each of their requests, not the command).
	stderr io.Writer
	getenv func(string) string
	dsn    string
	// dsnSource names where dsn came from: --dsn or $DATABASE_URL.
	dsnSource string
	timeout   time.Duration

	// notices are the notices and warnings the server sent on conn.
	notices *noticeLog
}

// noticeLog collects the notices of a connection (pgconn calls add from
// the goroutine that reads the connection; take reads them later).
type noticeLog struct {
	mu   sync.Mutex
	list []*pgconn.Notice
}

func (l *noticeLog) add(_ *pgconn.PgConn, n *pgconn.Notice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = append(l.list, n)
}

// take returns the notices collected since the last take.
func (l *noticeLog) take() []*pgconn.Notice {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := l.list
	l.list = nil
	return list
}

// dsnFlags is a subcommand with connection strings of its own (pglease
// import's --source-dsn): their passwords are masked in what it prints.
type dsnFlags interface{ dsnFlags() []string }

// longRunning is a subcommand that runs until interrupted (pglease ui):
// --timeout does not bound it as a whole.
type longRunning interface{ longRunning() }

// unbounded is a subcommand that moves data for as long as it takes
// (move-shard, rebalance: a move raises the target's position sequence,
// then copies the shard): --timeout bounds it only when given.
type unbounded interface{ unbounded() }

// usageError is bad input on the command line: reported with the
// command's usage and exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// flagSet returns a new instance of the command and its flag set, with
// its own and the common flags registered, writing its messages to out.
func (s *commandSpec) flagSet(out io.Writer) (*flag.FlagSet, *commonFlags, subcommand) {
	fs := flag.NewFlagSet("pglease "+s.name, flag.ContinueOnError)
	fs.SetOutput(out)
	var common commonFlags
	common.register(fs)
	cmd := s.new()
	cmd.flags(fs)
	return fs, &common, cmd
}

func (s *commandSpec) printShortUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: pglease %s %s\nRun 'pglease help %s' for more.\n", s.name, s.synopsis, s.name)
}

func (s *commandSpec) printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: pglease %s %s\n\n%s\n\nFlags:\n", s.name, s.synopsis, s.help)
	printFlags(w, fs, func(name string) bool { return !isCommon(name) })
	fmt.Fprintf(w, "\nConnection and output (every command):\n")
	printFlags(w, fs, isCommon)
}

// printFlags prints the flags of fs that keep selects (nil: all), with
// double dashes.
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(string) bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		if keep != nil && !keep(f.Name) {
			return
		}
		arg, usage := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && !strings.Contains(usage, "(default") {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(tw, "  --%s%s\t%s\n", f.Name, arg, usage)
	})
	_ = tw.Flush()
}

// execute parses args for the command, connects and runs it.
func (s *commandSpec) execute(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	red := newRedactWriter(stderr)
	red.addDSN(getenv("DATABASE_URL"))
	red.addSecret(getenv("PGPASSWORD"))
	stderr = red
	var msgs bytes.Buffer // what the flag package prints: the error
	fs, common, cmd := s.flagSet(&msgs)
	fs.Usage = func() {} // printed below: all of it on -h, the synopsis on an error
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			s.printUsage(stdout, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "pglease %s: %s\n", s.name, strings.TrimSpace(msgs.String()))
		s.printShortUsage(stderr)
		return exitUsage
	}
	err := cmd.check(fs) // which may parse flags after an argument (pglease import)
	red.addDSN(common.dsn)
	if d, ok := cmd.(dsnFlags); ok {
		red.addDSN(d.dsnFlags()...)
	}
	if err == nil && fs.NArg() > 0 {
		err = usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if err != nil {
		fmt.Fprintf(stderr, "pglease %s: %v\n", s.name, err)
		s.printShortUsage(stderr)
		return exitUsage
	}
	dsn, dsnSource := common.dsn, "--dsn"
	if dsn == "" {
		dsn, dsnSource = getenv("DATABASE_URL"), "$DATABASE_URL"
	}
	if dsn == "" {
		fmt.Fprintf(stderr, "pglease %s: no database to connect to: pass --dsn or set DATABASE_URL\n", s.name)
		return exitUsage
	}

	if _, ok := cmd.(unbounded); ok && !flagSet(fs, "timeout") {
		common.timeout = 0
	}
	if _, long := cmd.(longRunning); common.timeout > 0 && !long {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, common.timeout)
		defer cancel()
	}
	err = s.connectAndRun(ctx, cmd, dsn, dsnSource, common, stdout, stderr, getenv)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		err = fmt.Errorf("%w (gave up after --timeout %s)", err, common.timeout)
	}
	fmt.Fprintf(stderr, "pglease %s: %v\n", s.name, err)
	var (
		refused *refusedError
		pgErr   *pgconn.PgError
	)
	switch {
	case errors.As(err, &refused):
		fmt.Fprintln(stderr, refused.hint)
	case errors.As(err, &pgErr) && pgErr.Code == undefinedTable:
		where := "the search_path"
		if common.schema != "" {
			where = "schema " + strconv.Quote(common.schema)
		}
		fmt.Fprintf(stderr, "No pglease tables in %s: are they in another schema (--schema)?\n", where)
	case errors.As(err, &pgErr):
		// What the server adds to its error, pglease's scripts' reasons
		// and remedies among them.
		if pgErr.Detail != "" {
			fmt.Fprintf(stderr, "Detail: %s\n", pgErr.Detail)
		}
		if pgErr.Hint != "" {
			fmt.Fprintf(stderr, "Hint: %s\n", pgErr.Hint)
		}
	}
	return exitError
}

func (s *commandSpec) connectAndRun(ctx context.Context, cmd subcommand, dsn, dsnSource string, common *commonFlags,
	stdout, stderr io.Writer, getenv func(string) string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return parseDSNError(dsnSource, err)
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = applicationName
	}
	// No session settings as startup parameters: a transaction pooler
	// (PgBouncer) refuses those it does not know ("unsupported startup
	// parameter: jit"). The Inspector turns JIT off per transaction for
	// the statements that need it.
	notices := &noticeLog{}
	cfg.OnNotice = notices.add
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	tables := pglease.Tables{Schema: common.schema}
	insp, err := admin.NewInspector(conn, tables)
	if err != nil {
		return err
	}
	return cmd.run(ctx, &cmdEnv{conn: conn, tables: tables, insp: insp, json: common.json, stdout: stdout,
		stderr: stderr, getenv: getenv, dsn: dsn, dsnSource: dsnSource, timeout: common.timeout, notices: notices})
}

// stringList is a repeatable flag. values stays nil until the flag is
// given, so that "not given" (nil: everything) differs from `--group ""`
// (the group named "").
type stringList struct{ values []string }

func (l *stringList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.values, ",")
}

func (l *stringList) Set(v string) error {
	l.values = append(l.values, v)
	return nil
}

// onceString is a flag that may be given once, and knows whether it was
// (an empty value is a valid one).
type onceString struct {
	value string
	set   bool
}

func (s *onceString) String() string {
	if s == nil {
		return ""
	}
	return s.value
}

func (s *onceString) Set(v string) error {
	if s.set {
		return fmt.Errorf("given more than once (%q, then %q)", s.value, v)
	}
	s.value, s.set = v, true
	return nil
}
