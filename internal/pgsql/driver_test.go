package pgsql

import (
	"context"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// TestCitusDriverEmbedsNothing: the Citus driver writes every method out
// (no embedded field would supply a method it lacks), so that an
// operation added to Driver without its Citus variant does not compile.
func TestCitusDriverEmbedsNothing(t *testing.T) {
	typ := reflect.TypeOf(citus{})
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Anonymous {
			t.Errorf("citus embeds %s: its methods would stand in for the Citus variants", f.Type)
		}
	}
}

// lazyIsOpen reports whether l has cached a Driver.
func lazyIsOpen(l *Lazy) bool { return l.d.Load() != nil }

// TestLazyOpensOnceTheTablesExist: before the messages table exists,
// Lazy.Get answers the single node's driver without keeping it (the
// tables may be created, and distributed, later); once the table is
// found, it keeps the driver read.
func TestLazyOpensOnceTheTablesExist(t *testing.T) {
	dsn := os.Getenv("PGLEASE_TEST_DSN")
	if dsn == "" {
		t.Skip("needs PostgreSQL: set PGLEASE_TEST_DSN or run `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, dsn, 0)
	tables := NewTables(Names{Schema: pgtest.NewSchema(t, pool, "pglease_lazy_")})
	l := NewLazy(tables)
	d, err := l.Get(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(singleNode); !ok || lazyIsOpen(l) {
		t.Fatalf("before the tables: Get = %T, kept %v; want singleNode, not kept", d, lazyIsOpen(l))
	}
	if err := Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		t.Fatal(err)
	}
	if d, err = l.Get(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(singleNode); !ok || !lazyIsOpen(l) {
		t.Fatalf("after the migrations: Get = %T, kept %v; want singleNode, kept", d, lazyIsOpen(l))
	}
	if d.Tables() != tables || l.Tables() != tables {
		t.Fatal("the driver runs on other tables than the Lazy's")
	}
}

// TestCitusLazyWaitsForTheTables: a Lazy that read before the tables
// were created and distributed (a Publisher with AutoInitializeSchema on
// a new schema) opens the Citus driver once they are.
func TestCitusLazyWaitsForTheTables(t *testing.T) {
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("needs a Citus cluster: run `make test-citus`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, os.Getenv("PGLEASE_TEST_DSN"), 0)
	tables := NewTables(Names{Schema: pgtest.NewSchema(t, pool, "pglease_citus_lazy_")})
	l := NewLazy(tables)
	if d, err := l.Get(ctx, pool); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(singleNode); !ok || lazyIsOpen(l) {
		t.Fatalf("before the tables: Get = %T, kept %v; want singleNode, not kept", d, lazyIsOpen(l))
	}
	if err := Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, tables.DistributeScript()); err != nil {
		t.Fatal(err)
	}
	d, err := l.Get(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(citus); !ok || !lazyIsOpen(l) {
		t.Fatalf("after distributing: Get = %T, kept %v; want citus, kept", d, lazyIsOpen(l))
	}
}
