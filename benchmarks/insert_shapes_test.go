package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// BenchmarkInsertShapes measures what one statement writing 100 messages
// costs the server, for the statement each backend runs and for the
// shapes pglease could take instead. Every shape runs on one pgx
// connection (no Publisher, no database/sql), in a fresh schema, so the
// differences are the server's work and the wire. It is the evidence
// behind the "publish: batches of 100" row of `make bench`:
//
//	make bench-insert
//
// Shapes:
//   - pglease: pgsql Tables.InsertMessages, the statement the
//     Publisher runs (unnest of arrays, notification in the same statement);
//   - watermill-sql: DefaultPostgreSQLSchema.InsertQuery (a multi-row
//     VALUES) into its own table;
//   - pglease-copy: binary COPY of the same rows into pglease's table, one
//     round trip, no notification;
//   - pglease-no-index: pglease's statement on its table without the
//     primary key, i.e. what the read path's index costs;
//   - one-row-per-call: the 100 messages stored as arrays in a single row,
//     the storage shape that would take the per-message work away.
func BenchmarkInsertShapes(b *testing.B) {
	dsn := os.Getenv("PGLEASE_TEST_DSN")
	if dsn == "" {
		dsn = os.Getenv("DATABASE_URL")
	}
	if dsn == "" {
		b.Fatal("no database: set PGLEASE_TEST_DSN or DATABASE_URL, or run `make bench-insert`, which starts a throwaway PostgreSQL")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)

	const n = 100
	const topic = "bench_insert_shapes"
	msgs := newMessages(n)
	uuids := make([]string, n)
	payloads := make([][]byte, n)
	metadata := make([]string, n) // no metadata, as in `make bench`
	for i, m := range msgs {
		uuids[i], payloads[i] = m.UUID, m.Payload
	}

	exec := func(b *testing.B, sql string, args ...any) {
		b.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	// inSchema runs body in a fresh schema that is dropped afterwards.
	inSchema := func(b *testing.B, body func(schema string)) {
		schema := pgx.Identifier{fmt.Sprintf("bench_shapes_%d", os.Getpid())}.Sanitize()
		exec(b, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		exec(b, "CREATE SCHEMA "+schema)
		defer exec(b, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		exec(b, "SET search_path TO "+schema)
		defer exec(b, "RESET search_path")
		body(schema[1 : len(schema)-1])
	}
	pgleaseTable := func(b *testing.B, schema string) pglease.Tables {
		adapter := pglease.Tables{Schema: schema}
		if _, err := conn.PgConn().Exec(ctx, pglease.SchemaSQL(adapter)).ReadAll(); err != nil {
			b.Fatal(err)
		}
		return adapter
	}
	// pglease's statement, as its Publisher builds it (internal/pgsql).
	pgleaseInsert := func(adapter pglease.Tables) pgsql.Stmt {
		t := pgsql.NewTables(pgsql.Names(adapter))
		return t.InsertMessages(pgsql.InsertMessagesParams{
			Topics: []string{topic}, UUIDs: uuids, Payloads: payloads, Metadata: metadata,
			NotifyChannel: t.NotifyChannel,
		})
	}
	// loop runs write b.N times (after a warm-up of 200) and reports
	// messages per second.
	loop := func(b *testing.B, write func() error) {
		for range 200 {
			if err := write(); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		for range b.N {
			if err := write(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "msg/s")
	}

	b.Run("pglease", func(b *testing.B) {
		inSchema(b, func(schema string) {
			q := pgleaseInsert(pgleaseTable(b, schema))
			loop(b, func() error { _, err := conn.Exec(ctx, q.SQL, q.Args...); return err })
		})
	})
	b.Run("watermill-sql", func(b *testing.B) {
		inSchema(b, func(string) {
			schema := wsql.DefaultPostgreSQLSchema{}
			queries, err := schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
			if err != nil {
				b.Fatal(err)
			}
			for _, q := range queries {
				exec(b, q.Query, q.Args...)
			}
			q, err := schema.InsertQuery(wsql.InsertQueryParams{Topic: topic, Msgs: message.Messages(msgs)})
			if err != nil {
				b.Fatal(err)
			}
			loop(b, func() error { _, err := conn.Exec(ctx, q.Query, q.Args...); return err })
		})
	})
	b.Run("pglease-copy", func(b *testing.B) {
		inSchema(b, func(schema string) {
			pgleaseTable(b, schema)
			table := pgx.Identifier{schema, pglease.DefaultMessagesTable}.Sanitize()
			sql := "COPY " + table + " (topic, uuid, payload, metadata) FROM STDIN (FORMAT binary)"
			loop(b, func() error {
				data := copyBinary(topic, uuids, payloads)
				_, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(data), sql)
				return err
			})
		})
	})
	b.Run("pglease-no-index", func(b *testing.B) {
		inSchema(b, func(schema string) {
			adapter := pgleaseTable(b, schema)
			table := pgx.Identifier{schema, pglease.DefaultMessagesTable}.Sanitize()
			exec(b, "ALTER TABLE "+table+" DROP CONSTRAINT "+pgx.Identifier{pglease.DefaultMessagesTable + "_pkey"}.Sanitize())
			q := pgleaseInsert(adapter)
			loop(b, func() error { _, err := conn.Exec(ctx, q.SQL, q.Args...); return err })
		})
	})
	b.Run("one-row-per-call", func(b *testing.B) {
		inSchema(b, func(string) {
			exec(b, `CREATE TABLE batches (
	"offset"       bigint GENERATED ALWAYS AS IDENTITY,
	topic          text COLLATE "C" NOT NULL,
	partition      integer NOT NULL DEFAULT 0,
	transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
	uuids          text[] NOT NULL,
	payloads       bytea[],
	metadata       text[],
	created_at     timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (topic, partition, transaction_id, "offset"))`)
			sql := `INSERT INTO batches (topic, uuids, payloads, metadata) VALUES ($1, $2, $3, $4)`
			loop(b, func() error { _, err := conn.Exec(ctx, sql, topic, uuids, payloads, metadata); return err })
		})
	})
}

// copyBinary encodes rows of (topic text, uuid text, payload bytea,
// metadata jsonb NULL) in COPY's binary format.
func copyBinary(topic string, uuids []string, payloads [][]byte) []byte {
	b := make([]byte, 0, 21+len(uuids)*(2+4*4+len(topic)+36+payloadSize))
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension length
	for i := range uuids {
		b = binary.BigEndian.AppendUint16(b, 4)
		b = binary.BigEndian.AppendUint32(b, uint32(len(topic)))
		b = append(b, topic...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(uuids[i])))
		b = append(b, uuids[i]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(payloads[i])))
		b = append(b, payloads[i]...)
		b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF) // NULL metadata
	}
	return binary.BigEndian.AppendUint16(b, 0xFFFF) // trailer
}
