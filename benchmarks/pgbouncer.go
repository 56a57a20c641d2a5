package main

// pglease through PgBouncer: with -pgbouncer, the publish and
// drain workloads run a third time in each round, on pglease with its pool
// going through a PgBouncer in transaction mode, so that the table shows
// what the pooler costs next to the direct rows.

import (
	"context"
	"fmt"
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

func (pgleasePgBouncerBackend) open(_ context.Context, e *env, ns string) (handle, error) {
	pooled := new(atomic.Int64)
	newPool := func(conns int) (*pgxpool.Pool, error) { return e.pgbouncerPool(conns, pooled) }
	pool, err := newPool(e.cfg.conns)
	if err != nil {
		return nil, err
	}
	listen, err := e.connConfig() // LISTEN directly, not through PgBouncer
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &pgleaseHandle{
		listen:  listen,
		e:       e,
		ns:      ns,
		pool:    pool,
		tables:  pglease.Tables{Schema: ns},
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
// It counts the pool's connections in pooled. Its Subscribers LISTEN
// directly (ListenConnConfig); their session connection, dialled with the
// pool's settings, goes through PgBouncer.
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
	pc.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		pooled.Add(1)
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("pglease pool through PgBouncer: %w", err)
	}
	return pool, nil
}

// checkPgBouncer connects through PgBouncer to the run's database and
// returns what is known of it for the report: its version and pool mode,
// when its admin console answers (the user is an admin or stats user of
// it, as with localpg, internal/cmd/localpg).
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
