package pgsql_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// traceKind is the context key of the kind of a keyed insert traced.
type traceKind struct{}

// keyedStatements records the keyed inserts run on a connection: whether
// each had ON CONFLICT (tolerant) or not (strict), and whether it failed.
type keyedStatements struct {
	mu  sync.Mutex
	ran []string
}

func (k *keyedStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "RETURNING topic, key") {
		return ctx
	}
	kind := "strict"
	if strings.Contains(d.SQL, "ON CONFLICT DO NOTHING") {
		kind = "tolerant"
	}
	return context.WithValue(ctx, traceKind{}, kind)
}

func (k *keyedStatements) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	kind, ok := ctx.Value(traceKind{}).(string)
	if !ok {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if d.Err == nil { // the rows' error, for a query: traced at their Close
		k.ran = append(k.ran, kind)
	} else {
		k.ran = append(k.ran, kind+" failed")
	}
}

// take returns the statements recorded since the last call.
func (k *keyedStatements) take() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := k.ran
	k.ran = nil
	return out
}

// TestKeyedInsertStrictFirst: on a pool, and on a connection outside a
// transaction, the single-node driver runs the strict keyed insert (no ON
// CONFLICT) first, and the tolerant one only after the strict one failed
// on a key stored already, with the same outcome as the tolerant one
// alone; inside a transaction it runs the tolerant one alone, so that a
// key stored already does not abort the caller's transaction. The
// delayed insert does the same.
func TestKeyedInsertStrictFirst(t *testing.T) {
	pgtest.SkipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setup := pgtest.NewPool(t, testDSN, 2)
	tables := pgsql.NewTables(pgsql.Names{Schema: pgtest.NewSchema(t, setup, "pglease_strict_")})
	if err := pgsql.Migrate(ctx, setup, tables, tables.Migrations()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	trace := &keyedStatements{}
	cfg, err := pgxpool.ParseConfig(testDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = trace
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d := pgsql.NewSingleNode(tables)

	params := func(keys ...string) pgsql.InsertMessagesParams {
		p := pgsql.InsertMessagesParams{NotifyChannel: tables.NotifyChannel}
		for _, k := range keys {
			p.Topics = append(p.Topics, "strict")
			p.UUIDs = append(p.UUIDs, uuid.NewString())
			p.Payloads = append(p.Payloads, []byte(k))
			p.Metadata = append(p.Metadata, "")
			p.Keys = append(p.Keys, uuid.NewSHA1(uuid.NameSpaceOID, []byte(k)).String())
		}
		return p
	}
	check := func(what string, got []int, err error, want []int, ran ...string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s left out %v, want %v", what, got, want)
		}
		if r := trace.take(); !slices.Equal(r, ran) {
			t.Fatalf("%s ran %v, want %v", what, r, ran)
		}
	}

	got, err := d.InsertKeyed(ctx, pool, params("a", "b", "a"))
	check("new keys on the pool", got, err, []int{2}, "strict")
	got, err = d.InsertKeyed(ctx, pool, params("c", "a"))
	check("a stored key on the pool", got, err, []int{1}, "strict failed", "tolerant")

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	got, err = d.InsertKeyed(ctx, conn.Conn(), params("b", "d"))
	check("a stored key on a connection", got, err, []int{0}, "strict failed", "tolerant")
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	got, err = d.InsertKeyed(ctx, conn.Conn(), params("c", "e"))
	check("a stored key on a connection in a transaction", got, err, []int{0}, "tolerant")
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("the caller's transaction after a stored key: %v", err)
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err = d.InsertKeyed(ctx, tx, params("f", "d"))
	check("a stored key in a pgx.Tx", got, err, []int{1}, "tolerant")
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after a stored key: %v", err)
	}

	delayed := func(keys ...string) pgsql.InsertMessagesParams {
		p := params(keys...)
		for range keys {
			p.DueAt = append(p.DueAt, time.Now().Add(time.Hour))
		}
		return p
	}
	got, err = d.InsertDelayedKeyed(ctx, pool, delayed("g"))
	check("a new key delayed", got, err, nil, "strict")
	got, err = d.InsertDelayedKeyed(ctx, pool, delayed("h", "g"))
	check("a stored key delayed", got, err, []int{1}, "strict failed", "tolerant")

	var stored int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM `+tables.Messages+` WHERE topic = 'strict'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 6 { // a b c d e f
		t.Fatalf("stored %d messages, want 6", stored)
	}
}
