package main

// pglease through PgBouncer (issue 20): with -pgbouncer, the publish and
// drain workloads run a third time in each round, on pglease with its pool
// going through a PgBouncer in transaction mode, so that the table shows
// what the pooler costs next to the direct rows.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// pgbouncerName is the backend name of pglease through PgBouncer.
const pgbouncerName = "pglease through PgBouncer"

type pgleasePgBouncerBackend struct{}

func (pgleasePgBouncerBackend) name() string  { return pgbouncerName }
func (pgleasePgBouncerBackend) short() string { return "pgb" }

func (pgleasePgBouncerBackend) open(ctx context.Context, e *env, ns string) (handle, error) {
	pooled := new(atomic.Int64)
	newPool := func(conns int) (*pgxpool.Pool, error) { return e.pgbouncerPool(conns, pooled) }
	pool, err := newPool(e.cfg.conns)
	if err != nil {
		return nil, err
	}
	return &pgleaseHandle{
		e:       e,
		ns:      ns,
		pool:    pool,
		adapter: pglease.DefaultSchemaAdapter{Schema: ns},
		newPool: newPool,
		verify: func() error {
			// Every workload publishes through the pool.
			if pooled.Load() == 0 {
				return fmt.Errorf("no connection of the pool went through PgBouncer (%s): the run measured pglease direct", pgbouncerAddr(e.cfg.pgbouncerDSN))
			}
			return nil
		},
	}, nil
}

// pgbouncerPool opens a pool of at most conns connections (it connects on
// first use) through PgBouncer, in the run's database when there is one,
// with pgx's default_query_exec_mode=exec: PgBouncer 1.18 in transaction
// mode does not keep the named prepared statements of pgx's default mode.
// It counts the pool's connections in pooled.
func (e *env) pgbouncerPool(conns int, pooled *atomic.Int64) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(e.cfg.pgbouncerDSN)
	if err != nil {
		return nil, fmt.Errorf("parse the PgBouncer URL: %w", err)
	}
	if e.database != "" {
		pc.ConnConfig.Database = e.database
	}
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pc.MaxConns = int32(conns)
	direct, err := e.connConfig()
	if err != nil {
		return nil, err
	}
	// TODO(issue 20): once SubscriberConfig.ListenConnConfig is on main,
	// set it to direct in the Subscribers of this backend
	// (newPgleaseSubscriber) and delete routeDials and this hook: every
	// connection of the pool then goes through PgBouncer, and pglease
	// dials its LISTEN connection with ListenConnConfig.
	pc.BeforeConnect = routeDials(direct, pooled)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("pglease pool through PgBouncer: %w", err)
	}
	return pool, nil
}

// routeDials returns a BeforeConnect hook for the pool through PgBouncer
// that keeps pglease's LISTEN connection off PgBouncer, until pglease has a
// setting for it (see the TODO in pgbouncerPool).
//
// pglease dials its LISTEN connection, and the connection of its session
// statements, outside the pool with the pool's config and hooks. A LISTEN
// through PgBouncer in transaction mode leaves notifications arriving on
// server connections that no client holds (PgBouncer 1.18 crashed on that
// under load: "server in bad state"). So the hook lets through PgBouncer
// only the connections that pgxpool dials for the pool and pglease's
// session connection, and points every other one (the LISTEN connection)
// at PostgreSQL directly: host, port, user, password and TLS of direct,
// the database of the pool. Should pglease rename its session connection,
// that one goes direct too, which costs nothing measurable; the LISTEN
// connection never goes through PgBouncer. pooled counts the connections
// that did.
func routeDials(direct *pgx.ConnConfig, pooled *atomic.Int64) func(context.Context, *pgx.ConnConfig) error {
	return func(_ context.Context, cc *pgx.ConnConfig) error {
		if dialledForPool() {
			pooled.Add(1)
			return nil
		}
		cc.Host, cc.Port = direct.Host, direct.Port
		cc.User, cc.Password = direct.User, direct.Password
		cc.TLSConfig, cc.Fallbacks = direct.TLSConfig, direct.Fallbacks
		return nil
	}
}

// dialledForPool reports whether the BeforeConnect hook that calls it runs
// for a connection of the pool itself (pgxpool dials it) or for pglease's
// session statements.
func dialledForPool() bool {
	pcs := make([]uintptr, 64)
	n := runtime.Callers(3, pcs) // Callers, dialledForPool, the hook
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/jackc/pgx/v5/pgxpool.") ||
			strings.HasPrefix(f.Function, "github.com/pglease/watermill-pglease.(*sessionConn).") {
			return true
		}
		if !more {
			return false
		}
	}
}

// checkPgBouncer connects through PgBouncer to the run's database and
// returns what is known of it for the report: its version and pool mode,
// when its admin console answers (the user is an admin or stats user of
// it, as with scripts/localpg.sh).
func checkPgBouncer(ctx context.Context, e *env) (string, error) {
	pool, err := e.pgbouncerPool(1, new(atomic.Int64))
	if err != nil {
		return "", err
	}
	defer pool.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var one int
	if err := pool.QueryRow(cctx, "SELECT 1").Scan(&one); err != nil {
		// The run's database exists only on the server of -dsn.
		return "", fmt.Errorf("-pgbouncer: no connection through PgBouncer (%s) to the run's database (is it in front of the server of -dsn? -pgbouncer= runs without it): %w", pgbouncerAddr(e.cfg.pgbouncerDSN), err)
	}
	return pgbouncerSettings(cctx, e.cfg.pgbouncerDSN), nil
}

// pgbouncerSettings reads the version and pool settings from PgBouncer's
// admin console, or says why it could not.
func pgbouncerSettings(ctx context.Context, dsn string) string {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "PgBouncer (version unknown)"
	}
	cc.Database = "pgbouncer"
	// The console speaks the simple protocol only.
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return "PgBouncer (version and settings unknown: no admin console)"
	}
	defer conn.Close(ctx)
	version := "PgBouncer"
	if err := conn.QueryRow(ctx, "SHOW VERSION").Scan(&version); err != nil {
		version = "PgBouncer (version unknown)"
	}
	rows, err := conn.Query(ctx, "SHOW CONFIG")
	if err != nil {
		return version
	}
	settings := map[string]string{}
	for rows.Next() {
		vals, err := rows.Values()
		if err == nil && len(vals) >= 2 {
			settings[fmt.Sprint(vals[0])] = fmt.Sprint(vals[1])
		}
	}
	rows.Close()
	var parts []string
	for _, k := range []string{"pool_mode", "default_pool_size", "max_client_conn"} {
		if v, ok := settings[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	if len(parts) == 0 {
		return version
	}
	return version + " (" + strings.Join(parts, ", ") + ")"
}

// pgbouncerAddr is the host:port of a PgBouncer URL, for messages (the URL
// may hold a password).
func pgbouncerAddr(dsn string) string {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "unreadable URL"
	}
	return fmt.Sprintf("%s:%d", cc.Host, cc.Port)
}
