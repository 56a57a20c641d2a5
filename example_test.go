package pglease_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// The tables that the owner's schema set-up creates, here in the schema
// "billing". SchemaSQL returns the whole script, for review or for a
// migration tool of your own; pglease.Migrate runs it.
func ExampleSchemaSQL() {
	script := pglease.SchemaSQL(pglease.Tables{Schema: "billing"})
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "CREATE TABLE IF NOT EXISTS") {
			fmt.Println(strings.TrimSuffix(line, " ("))
		}
	}
	// Output:
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_schema_version"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_messages"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_consumer_sessions"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_consumer_offsets"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_topics"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_retention"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_delayed"
	// CREATE TABLE IF NOT EXISTS "billing"."pglease_maintenance"
}

// What the owner of the tables runs so that the application role "app",
// which owns nothing, can publish, subscribe and be the maintainer (the
// block at the end grants only where the tables are distributed by
// Citus).
func ExampleGrantSQL() {
	fmt.Print(pglease.GrantSQL(pglease.Tables{Schema: "billing"}, "app"))
	// Output:
	// -- What role "app" needs to run pglease (pglease.GrantSQL); run as the owner of the tables.
	// BEGIN;
	// GRANT USAGE ON SCHEMA "billing" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_messages" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_messages_forever" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_consumer_sessions" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_consumer_offsets" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_topics" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_delayed" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_maintenance" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_retention" TO "app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "billing"."pglease_messages_keys" TO "app";
	// GRANT SELECT ON TABLE "billing"."pglease_schema_version" TO "app";
	// GRANT EXECUTE ON FUNCTION "billing"."pglease_messages_add_retention_partition"(integer, bigint, bigint) TO "app";
	// GRANT EXECUTE ON FUNCTION "billing"."pglease_messages_expire_retention_partition"(integer, bigint) TO "app";
	// GRANT EXECUTE ON FUNCTION "billing"."pglease_messages_drop_detached_partition"(integer, bigint) TO "app";
	// GRANT EXECUTE ON FUNCTION "billing"."pglease_messages_forget_keys"() TO "app";
	// GRANT EXECUTE ON FUNCTION "billing"."pglease_messages_add_key_partitions"(integer) TO "app";
	// DO $pglease$
	// DECLARE
	// 	r record;
	// 	failed text;
	// BEGIN
	// 	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
	// 		RETURN; -- not Citus
	// 	END IF;
	// 	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
	// 		WHERE p.logicalrelid = '"billing"."pglease_messages"'::regclass) THEN
	// 		RETURN; -- not distributed (yet: DistributeSQL grants it then)
	// 	END IF;
	// 	FOR r IN SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) AS tab, a.attname AS col,
	// 			'"app"'::text AS grantee
	// 		FROM pg_catalog.pg_attribute a
	// 		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
	// 		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	// 		WHERE a.attrelid IN ('"billing"."pglease_messages"'::regclass, '"billing"."pglease_messages_forever"'::regclass, '"billing"."pglease_consumer_sessions"'::regclass, '"billing"."pglease_consumer_offsets"'::regclass, '"billing"."pglease_topics"'::regclass, '"billing"."pglease_delayed"'::regclass, '"billing"."pglease_maintenance"'::regclass, '"billing"."pglease_retention"'::regclass, '"billing"."pglease_messages_keys"'::regclass) AND a.attidentity <> '' AND NOT a.attisdropped
	// 		ORDER BY 1, 2 LOOP
	// 		EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE %s TO %s', pg_catalog.pg_get_serial_sequence(r.tab, r.col), r.grantee);
	// 		IF true THEN
	// 			SELECT pg_catalog.string_agg(c.nodename || ':' || c.nodeport || ': ' || c.result, '; ') INTO failed
	// 			FROM pg_catalog.run_command_on_workers(pg_catalog.format('DO %L', pg_catalog.format(
	// 				'BEGIN IF pg_catalog.to_regclass(%L) IS NOT NULL THEN EXECUTE pg_catalog.format(%L, pg_catalog.pg_get_serial_sequence(%L, %L), %L); END IF; END',
	// 				r.tab, 'GRANT USAGE ON SEQUENCE %s TO %s', r.tab, r.col, r.grantee))) c
	// 			WHERE NOT c.success;
	// 			IF failed IS NOT NULL THEN
	// 				RAISE EXCEPTION 'pglease: USAGE on the sequence of %.% for % on the workers: %', r.tab, r.col, r.grantee, failed;
	// 			END IF;
	// 		END IF;
	// 	END LOOP;
	// END
	// $pglease$;
	// COMMIT;
}

// The same key goes to the same partition, in every process and release:
// FNV-1a of the key modulo the topic's partition count.
func ExamplePartitionOf() {
	for _, key := range []string{"customer-42", "customer-7", "customer-42"} {
		fmt.Printf("%s -> partition %d of 8\n", key, pglease.PartitionOf(key, 8))
	}
	// Output:
	// customer-42 -> partition 6 of 8
	// customer-7 -> partition 1 of 8
	// customer-42 -> partition 6 of 8
}

// The zero value of a field means its default.
func ExampleSubscriberConfig() {
	fmt.Printf("SessionTTL: %v (a heartbeat every %v)\n", pglease.DefaultSessionTTL, pglease.DefaultSessionTTL/3)
	fmt.Println("PollInterval:", pglease.DefaultPollInterval)
	fmt.Println("NackResendDelay:", pglease.DefaultNackResendDelay)
	fmt.Println("BatchSize:", pglease.DefaultBatchSize)
	fmt.Println("CommitInterval:", pglease.DefaultCommitInterval, "CommitBatch:", pglease.DefaultCommitBatch)
	fmt.Println("CloseTimeout:", pglease.DefaultCloseTimeout)
	fmt.Println("MaxBufferedBytes:", pglease.DefaultMaxBufferedBytes>>20, "MiB")
	fmt.Println("Maintenance.Interval:", pglease.DefaultMaintenanceInterval)
	// Output:
	// SessionTTL: 10s (a heartbeat every 3.333333333s)
	// PollInterval: 1s
	// NackResendDelay: 100ms
	// BatchSize: 100
	// CommitInterval: 100ms CommitBatch: 100
	// CloseTimeout: 5s
	// MaxBufferedBytes: 64 MiB
	// Maintenance.Interval: 30s
}

// A Subscriber of the consumer group "billing" behind a Watermill Router:
// the live Subscribers of the group split its topics, and each message is
// handled by one of them. (Compiled, not run: it needs a database.)
func ExampleNewSubscriber() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	logger := watermill.NewStdLogger(false, false)

	subscriber, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "billing",
		InitializeSchema: true,
	}, logger)
	if err != nil {
		panic(err)
	}
	// Close deletes the session row at once. The Router closes its
	// Subscribers only sometimes: not when Run ends because ctx did.
	defer subscriber.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("charge", "orders.placed", subscriber, func(msg *message.Message) error {
		fmt.Printf("order %s: %s\n", msg.UUID, msg.Payload)
		return nil // an error Nacks: the message comes again after NackResendDelay
	})
	if err := router.Run(ctx); err != nil {
		panic(err)
	}
}

// A Publisher on a transaction: the messages commit or roll back with the
// caller's own writes (the transactional outbox). (Compiled, not run: it
// needs a database.)
func ExampleNewPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "UPDATE orders SET state = 'placed' WHERE id = $1", 1); err != nil {
		panic(err)
	}
	publisher, err := pglease.NewPublisher(tx, pglease.PublisherConfig{}, nil)
	if err != nil {
		panic(err)
	}
	if err := publisher.Publish("orders.placed", message.NewMessage(watermill.NewUUID(), []byte(`{"id": 1}`))); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
}
