package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// consumerGroup is the consumer group of every subscriber, for both backends.
const consumerGroup = "bench"

// backend is one Pub/Sub implementation under test.
type backend interface {
	name() string
	short() string // in schema and profile file names
	// open returns a handle on a fresh, empty PostgreSQL schema named ns.
	open(ctx context.Context, e *env, ns string) (handle, error)
}

// handle builds Publishers and Subscribers of one backend in one schema.
// Publishers and Subscribers have the backend's default configuration
// except for the schema they work in and the consumer group; schema
// initialization (off by default in both) is left to initTopic.
type handle interface {
	publisher() (message.Publisher, error)
	subscriber() (message.Subscriber, error)
	// member returns a Subscriber of the consumer group with a connection
	// pool of its own (at most cfg.memberConns connections), as a member in
	// a process of its own would have, and a function that closes both.
	member() (message.Subscriber, func() error, error)
	// initTopic creates the tables topic needs, so that no workload times
	// DDL.
	initTopic(ctx context.Context, topic string) error
	// close closes the handle's connections and drops its schema.
	close(ctx context.Context) error
}

// ---------------------------------------------------------------- pglease

// pgleaseBackend is pglease with default configurations; asyncCommit sets
// synchronous_commit=off on its pool's connections (the pglease-async
// peer): commits return before their WAL is flushed, which the WAL writer
// does within 3 × wal_writer_delay, the durability class of Redis's AOF
// everysec.
type pgleaseBackend struct{ asyncCommit bool }

func (b pgleaseBackend) name() string {
	if b.asyncCommit {
		return pgleaseAsyncName
	}
	return "pglease"
}

func (b pgleaseBackend) short() string {
	if b.asyncCommit {
		return "pgl-async"
	}
	return "pgl"
}

// pgleaseAsyncName is the pglease-async peer's name in the report.
const pgleaseAsyncName = "pglease, synchronous_commit=off"

func (b pgleaseBackend) open(_ context.Context, e *env, ns string) (handle, error) {
	pool, err := e.pgleasePoolWith(e.cfg.conns, b.asyncCommit)
	if err != nil {
		return nil, err
	}
	// The schema itself is created by pglease's schema initialization.
	return &pgleaseHandle{e: e, ns: ns, pool: pool, tables: pglease.Tables{Schema: ns}}, nil
}

// pgleasePool opens a pool of at most conns connections (it connects on
// first use).
func (e *env) pgleasePool(conns int) (*pgxpool.Pool, error) {
	return e.pgleasePoolWith(conns, false)
}

// pgleasePoolWith is pgleasePool, with synchronous_commit=off on every
// connection when asyncCommit is set.
func (e *env) pgleasePoolWith(conns int, asyncCommit bool) (*pgxpool.Pool, error) {
	pc, err := e.poolConfig()
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(conns)
	if asyncCommit {
		pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("pglease pool: %w", err)
	}
	return pool, nil
}

type pgleaseHandle struct {
	e      *env
	ns     string
	pool   *pgxpool.Pool
	tables pglease.Tables
	// newPool opens the pool of a member; nil: e.pgleasePool.
	newPool func(conns int) (*pgxpool.Pool, error)
	// verify, when set, checks after a workload that it ran as intended.
	verify func() error
	// listen, when set, is the Subscribers' ListenConnConfig (a direct
	// connection when the pool goes through PgBouncer).
	listen *pgx.ConnConfig
}

func (h *pgleaseHandle) publisher() (message.Publisher, error) {
	return pglease.NewPublisher(h.pool, pglease.PublisherConfig{Tables: h.tables}, h.e.logger)
}

func (h *pgleaseHandle) subscriber() (message.Subscriber, error) {
	return h.newSubscriber(false)
}

func (h *pgleaseHandle) newSubscriber(initializeSchema bool) (message.Subscriber, error) {
	return newPgleaseSubscriber(h.pool, h.ns, initializeSchema, h.e.logger, h.listen)
}

// newPgleaseSubscriber returns a Subscriber of the consumer group with the
// default configuration in schema ns.
func newPgleaseSubscriber(pool *pgxpool.Pool, ns string, initializeSchema bool, logger watermill.LoggerAdapter, listen *pgx.ConnConfig) (*pglease.Subscriber, error) {
	return pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    consumerGroup,
		InitializeSchema: initializeSchema,
		Tables:           pglease.Tables{Schema: ns},
		ListenConnConfig: listen,
	}, logger)
}

func (h *pgleaseHandle) member() (message.Subscriber, func() error, error) {
	newPool := h.newPool
	if newPool == nil {
		newPool = h.e.pgleasePool
	}
	pool, err := newPool(h.e.cfg.memberConns)
	if err != nil {
		return nil, nil, err
	}
	sub, err := newPgleaseSubscriber(pool, h.ns, false, h.e.logger, h.listen)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return sub, func() error {
		err := sub.Close()
		pool.Close()
		return err
	}, nil
}

func (h *pgleaseHandle) offsetsTable() string { return offsetsTable(h.ns) }

// offsetsTable is the quoted name of pglease's consumer offsets table in
// schema ns.
func offsetsTable(ns string) string {
	return pgx.Identifier{ns, pglease.DefaultConsumerOffsetsTable}.Sanitize()
}

func (h *pgleaseHandle) initTopic(_ context.Context, topic string) error {
	return subscribeInitialize(h.newSubscriber, topic)
}

func (h *pgleaseHandle) close(ctx context.Context) error {
	h.pool.Close()
	return dropSchema(ctx, h.e.admin, h.ns)
}

// ---------------------------------------------------------- watermill-sql

type watermillSQLBackend struct{}

func (watermillSQLBackend) name() string  { return watermillSQLName }
func (watermillSQLBackend) short() string { return "wsql" }

// open creates the schema and a pgxpool whose search_path is that schema:
// watermill-sql names its tables without a schema. The pool goes to
// watermill-sql through its pgx adapter (BeginnerFromPgx), as its own
// tests do for pgx.
func (watermillSQLBackend) open(ctx context.Context, e *env, ns string) (handle, error) {
	if _, err := e.admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{ns}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", ns, err)
	}
	pool, err := e.watermillSQLPool(ns, e.cfg.conns)
	if err != nil {
		return nil, err
	}
	return &watermillSQLHandle{e: e, ns: ns, pool: pool}, nil
}

// watermillSQLPool opens a pool of at most conns connections (it connects
// on first use) for schema ns (see open).
func (e *env) watermillSQLPool(ns string, conns int) (*pgxpool.Pool, error) {
	pc, err := e.poolConfig()
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = ns
	pc.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("watermill-sql pool: %w", err)
	}
	return pool, nil
}

type watermillSQLHandle struct {
	e    *env
	ns   string
	pool *pgxpool.Pool
}

// watermillSQLSchema is the schema adapter of every watermill-sql
// Publisher and Subscriber: the PostgreSQL default, whose payload column
// is json (the benchmark's payloads are JSON).
var watermillSQLSchema = wsql.DefaultPostgreSQLSchema{}

func (h *watermillSQLHandle) publisher() (message.Publisher, error) {
	return wsql.NewPublisher(wsql.BeginnerFromPgx(h.pool), wsql.PublisherConfig{
		SchemaAdapter: watermillSQLSchema,
	}, h.e.logger)
}

func (h *watermillSQLHandle) subscriber() (message.Subscriber, error) {
	return h.newSubscriber(false)
}

func (h *watermillSQLHandle) newSubscriber(initializeSchema bool) (message.Subscriber, error) {
	return newWatermillSQLSubscriber(h.pool, initializeSchema, h.e.logger)
}

func (h *watermillSQLHandle) member() (message.Subscriber, func() error, error) {
	pool, err := h.e.watermillSQLPool(h.ns, h.e.cfg.memberConns)
	if err != nil {
		return nil, nil, err
	}
	sub, err := newWatermillSQLSubscriber(pool, false, h.e.logger)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return sub, func() error {
		err := sub.Close()
		pool.Close()
		return err
	}, nil
}

func newWatermillSQLSubscriber(pool *pgxpool.Pool, initializeSchema bool, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:    consumerGroup,
		SchemaAdapter:    watermillSQLSchema,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: initializeSchema,
	}, logger)
}

func (h *watermillSQLHandle) initTopic(_ context.Context, topic string) error {
	return subscribeInitialize(h.newSubscriber, topic)
}

func (h *watermillSQLHandle) close(ctx context.Context) error {
	h.pool.Close()
	return dropSchema(ctx, h.e.admin, h.ns)
}

// dropSchema drops schema ns if it exists. Its tables go first, a few
// hundred per statement: one DROP SCHEMA ... CASCADE of thousands of tables
// (watermill-sql's two per topic) would need more locks than a default
// server has.
func dropSchema(ctx context.Context, admin *pgxpool.Pool, ns string) error {
	for {
		rows, err := admin.Query(ctx,
			`SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = $1 LIMIT 200`, ns)
		if err != nil {
			return fmt.Errorf("list tables of schema %s: %w", ns, err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("list tables of schema %s: %w", ns, err)
		}
		if len(tables) == 0 {
			break
		}
		if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS "+strings.Join(tables, ", ")+" CASCADE"); err != nil {
			return fmt.Errorf("drop tables of schema %s: %w", ns, err)
		}
	}
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{ns}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", ns, err)
	}
	return nil
}

// subscribeInitialize creates topic's tables with a Subscriber that
// initializes the schema, closed again at once.
func subscribeInitialize(newSubscriber func(initializeSchema bool) (message.Subscriber, error), topic string) error {
	sub, err := newSubscriber(true)
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.(message.SubscribeInitializer).SubscribeInitialize(topic)
}
