package pgsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// TestKeyClassWithoutSchema: with Tables' Schema empty (the tables in the
// first schema of the search_path), the owner's functions of the keys,
// whose own search_path is pg_catalog's, find the keys table in the
// messages table's schema: a key class's partitions are made there, a
// keyed publish of a topic of the class writes them, and the maintainer's
// function empties the class's partition two slots old. (A build that
// named the keys table unqualified inside the function failed here.)
func TestKeyClassWithoutSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := pgtest.NewPool(t, testDSN, 2)
	schema := pgtest.NewSchema(t, admin, "pglease_keys_noschema_")
	if _, err := admin.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(testDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tables := pgsql.NewTables(pgsql.Names{})
	if err := pgsql.Migrate(ctx, pool, tables, tables.Migrations()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	d := pgsql.NewSingleNode(tables)
	const class = 19
	if _, err := d.UpsertTopic(ctx, pool, pgsql.TopicParams{Topic: "long", Partitions: 1, Retention: 72 * time.Hour, RetentionClass: class}); err != nil {
		t.Fatal(err)
	}
	if made, err := d.AddKeyPartitions(ctx, pool, class); err != nil || !made {
		t.Fatalf("add key partitions = %t, %v; want made", made, err)
	}
	var where string
	if err := pool.QueryRow(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'pglease_messages_keys_76'`).Scan(&where); err != nil || where != schema {
		t.Fatalf("the class's partition is in %q (%v), want %q", where, err, schema)
	}
	if _, err := d.SetKeysSince(ctx, pool, class); err != nil {
		t.Fatal(err)
	}
	p := pgsql.InsertMessagesParams{Topics: []string{"long"}, UUIDs: []string{"a"}, Payloads: [][]byte{nil}, Metadata: []string{""},
		Keys: []string{"0190a6e2-7c3b-7d2e-9f10-2b3c4d5e6f70"}}
	if skipped, err := d.InsertKeyed(ctx, pool, p); err != nil || len(skipped) != 0 {
		t.Fatalf("keyed insert left out %v, %v", skipped, err)
	}
	var classRows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglease_messages_keys WHERE gen BETWEEN 76 AND 79`).Scan(&classRows); err != nil || classRows != 2 {
		t.Fatalf("class rows = %d, %v; want 2", classRows, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO pglease_messages_keys (topic, key, slot, gen)
		SELECT 'long', gen_random_uuid(), s, (76 + s % 4)::smallint FROM (SELECT floor(extract(epoch FROM now()) / 262144)::bigint - 2 AS s) x`); err != nil {
		t.Fatal(err)
	}
	if n, err := d.ForgetKeys(ctx, pool); err != nil || n != 1 {
		t.Fatalf("forget = %d, %v; want the class's partition two slots old emptied", n, err)
	}
}
