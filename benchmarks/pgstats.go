package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// enableStatements creates the pg_stat_statements extension when it is
// missing and reports whether its view can be read (the library must be in
// shared_preload_libraries, as localpg, internal/cmd/localpg, sets it).
func enableStatements(ctx context.Context, admin *pgxpool.Pool) (bool, error) {
	if _, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false, err
	}
	if _, err := admin.Exec(ctx, "SELECT 1 FROM pg_stat_statements LIMIT 1"); err != nil {
		return false, err
	}
	return true, nil
}

type statKey struct {
	userID, queryID int64
	topLevel        bool
}

type statEntry struct {
	query string
	calls int64
	time  float64 // total_exec_time, ms
}

// statSnapshot is pg_stat_statements for the current database, without the
// statements that read it.
type statSnapshot map[statKey]statEntry

func (s statSnapshot) calls() int64 {
	var n int64
	for _, e := range s {
		n += e.calls
	}
	return n
}

// execTime is the statements' total execution time, in milliseconds.
func (s statSnapshot) execTime() float64 {
	var ms float64
	for _, e := range s {
		ms += e.time
	}
	return ms
}

// querier is a pool or one connection of it.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func takeStatements(ctx context.Context, admin querier) (statSnapshot, error) {
	rows, err := admin.Query(ctx, `
		SELECT userid::int8, coalesce(queryid, 0), toplevel, calls, total_exec_time,
		       left(regexp_replace(query, '\s+', ' ', 'g'), 160)
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'
		  AND query NOT LIKE '%pg_stat_database%'`)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_statements: %w", err)
	}
	snap := statSnapshot{}
	var (
		k statKey
		e statEntry
	)
	_, err = pgx.ForEachRow(rows, []any{&k.userID, &k.queryID, &k.topLevel, &e.calls, &e.time, &e.query}, func() error {
		snap[k] = e
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_statements: %w", err)
	}
	return snap, nil
}

// printTopStatements prints the n statements that took the most server time
// between two snapshots.
func printTopStatements(w io.Writer, title string, before, after statSnapshot, n int) {
	var rows []statEntry
	var totalCalls int64
	var totalTime float64
	for k, a := range after {
		b := before[k]
		d := statEntry{query: a.query, calls: a.calls - b.calls, time: a.time - b.time}
		if d.calls <= 0 {
			continue
		}
		totalCalls += d.calls
		totalTime += d.time
		rows = append(rows, d)
	}
	slices.SortFunc(rows, func(x, y statEntry) int {
		switch {
		case x.time > y.time:
			return -1
		case x.time < y.time:
			return 1
		}
		return 0
	})
	fmt.Fprintf(w, "\n  busiest statements, %s: %d calls, %.0f ms server time in all\n", title, totalCalls, totalTime)
	for _, r := range rows[:min(n, len(rows))] {
		fmt.Fprintf(w, "  %9d calls %9.0f ms %6.3f ms/call  %s\n", r.calls, r.time, r.time/float64(r.calls), r.query)
	}
	fmt.Fprintln(w)
}

// load is a reading of the server's counters for the idle workload.
type load struct {
	at           time.Time
	statements   statSnapshot
	deallocs     int64
	transactions int64
}

func takeLoad(ctx context.Context, e *env) (load, error) {
	var l load
	if e.stats {
		var err error
		if l.statements, err = takeStatements(ctx, e.admin); err != nil {
			return l, err
		}
		// pg_stat_statements_info exists from PostgreSQL 14 on.
		_ = e.admin.QueryRow(ctx, "SELECT dealloc FROM pg_stat_statements_info").Scan(&l.deallocs)
	}
	l.at = time.Now()
	// Each transaction reads the statistics snapshot afresh.
	err := e.admin.QueryRow(ctx, `
		SELECT xact_commit + xact_rollback FROM pg_stat_database
		WHERE datname = current_database()`).Scan(&l.transactions)
	if err != nil {
		return l, fmt.Errorf("read pg_stat_database: %w", err)
	}
	return l, nil
}

// machineInfo describes where the numbers come from.
type machineInfo struct {
	date         time.Time
	cores        int
	cpu          string
	goVersion    string
	osArch       string
	postgres     string
	settings     string
	watermill    string
	watermillSQL string
	pgx          string
	pglease      string // the library's commit, as git describes it
	command      string
	ownDatabase  bool // the run had a database of its own
	// pgbouncer describes the PgBouncer of -pgbouncer; empty: none.
	pgbouncer string
	// fsync and synchronousCommit are the server's settings, which decide
	// the durability of the PostgreSQL backends.
	fsync, synchronousCommit string
	// The peers' libraries and servers (peers.go).
	watermillNATS, natsServer, watermillRedis, goRedis, redisServer string
	// skipped are the peers of -peers left out, with the reason.
	skipped map[string]string
}

func collectMachineInfo(ctx context.Context, e *env) (machineInfo, error) {
	info := machineInfo{
		date:        time.Now().UTC(),
		cores:       runtime.NumCPU(),
		cpu:         cpuModel(),
		goVersion:   runtime.Version(),
		osArch:      runtime.GOOS + "/" + runtime.GOARCH,
		command:     benchCommand(),
		ownDatabase: e.database != "",
		pglease:     pgleaseRevision(),
	}
	if err := e.admin.QueryRow(ctx, "SHOW server_version").Scan(&info.postgres); err != nil {
		return info, fmt.Errorf("read the server version: %w", err)
	}
	var parts []string
	for _, name := range []string{"fsync", "synchronous_commit", "shared_buffers", "max_connections"} {
		var v string
		if err := e.admin.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err == nil {
			parts = append(parts, name+"="+v)
			switch name {
			case "fsync":
				info.fsync = v
			case "synchronous_commit":
				info.synchronousCommit = v
			}
		}
	}
	info.settings = strings.Join(parts, ", ")
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/ThreeDotsLabs/watermill":
				info.watermill = d.Version
			case "github.com/ThreeDotsLabs/watermill-sql/v4":
				info.watermillSQL = d.Version
			case "github.com/jackc/pgx/v5":
				info.pgx = d.Version
			case "github.com/ThreeDotsLabs/watermill-nats/v2":
				info.watermillNATS = d.Version
			case "github.com/nats-io/nats-server/v2":
				info.natsServer = d.Version
			case "github.com/ThreeDotsLabs/watermill-redisstream":
				info.watermillRedis = d.Version
			case "github.com/redis/go-redis/v9":
				info.goRedis = d.Version
			}
		}
	}
	return info, nil
}

// pgleaseRevision names the commit of the library measured (the
// repository around this module), with "-dirty" when files other than
// this program's own results differ from it; empty when git cannot tell.
func pgleaseRevision() string {
	rev, err := exec.Command("git", "-C", "..", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	changed, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--untracked-files=no", "--",
		":(top)", ":(top,exclude)benchmarks/results.md", ":(top,exclude)benchmarks/results.svg").Output()
	if err != nil {
		return ""
	}
	if len(bytes.TrimSpace(changed)) > 0 {
		return strings.TrimSpace(string(rev)) + "-dirty"
	}
	return strings.TrimSpace(string(rev))
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// benchCommand is how this run was started, as a reader would retype it.
func benchCommand() string {
	args := strings.Join(os.Args[1:], " ")
	if args == "" {
		return "make bench"
	}
	return "cd benchmarks && go run . " + args
}

// startCPUProfile profiles this process into dir/name.pprof until the
// returned function is called; with no dir it does nothing.
func startCPUProfile(dir, name string) (func(), error) {
	if dir == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
