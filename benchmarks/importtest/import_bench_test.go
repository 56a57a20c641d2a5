package importtest

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/wmsqlimport"
)

// BenchmarkImport1M times wmsqlimport.Run of 1,000,000 pending
// messages (PGLEASE_IMPORT_MESSAGES to change it) of one topic in
// watermill-sql v4's default PostgreSQL schema, stored by SQL in 10
// transactions, JSON payloads of about 60 bytes, one group that
// acknowledged nothing. Each iteration imports into fresh pglease tables:
//
//	go run ./internal/cmd/localpg run -- sh -c 'cd benchmarks && go test -run "^$" -bench Import1M -benchtime 1x ./importtest/'
func BenchmarkImport1M(b *testing.B) {
	total := 1_000_000
	if v := os.Getenv("PGLEASE_IMPORT_MESSAGES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		total = n
	}
	e := newEnv(b)
	ctx := context.Background()
	_, err := e.wm.Exec(ctx, `CREATE TABLE watermill_bulk (
	"offset" BIGSERIAL, "uuid" VARCHAR(36) NOT NULL, "created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	"payload" JSON DEFAULT NULL, "metadata" JSON DEFAULT NULL, "transaction_id" xid8 NOT NULL,
	PRIMARY KEY ("transaction_id", "offset"));
CREATE TABLE watermill_offsets_bulk (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT,
	last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group));
INSERT INTO watermill_offsets_bulk VALUES ('g', 0, '0')`)
	if err != nil {
		b.Fatal(err)
	}
	chunk := max(total/10, 1)
	for from := 0; from < total; from += chunk {
		_, err := e.wm.Exec(ctx, `INSERT INTO watermill_bulk (uuid, payload, metadata, transaction_id)
SELECT gen_random_uuid()::text, json_build_object('n', n, 'body', 'some payload of an order'),
	json_build_object('n', n::text), pg_current_xact_id()
FROM generate_series($1::int, $2::int) n`, from, min(from+chunk, total)-1)
		if err != nil {
			b.Fatal(err)
		}
	}
	if _, err := e.wm.Exec(ctx, `VACUUM ANALYZE watermill_bulk`); err != nil {
		b.Fatal(err)
	}
	var took time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		adapter := pglease.Tables{Schema: e.adapter.Schema + "_" + strconv.Itoa(i)}
		if err := pglease.Migrate(ctx, e.pg, adapter); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_, _ = e.admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{adapter.Schema}.Sanitize()+" CASCADE")
		})
		b.StartTimer()
		start := time.Now()
		report, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: []string{"bulk"}, Tables: adapter})
		took += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if got := report.Topics[0].Messages; got != int64(total) {
			b.Fatalf("imported %d messages, want %d", got, total)
		}
	}
	b.ReportMetric(float64(total)*float64(b.N)/took.Seconds(), "msgs/s")
	b.ReportMetric(took.Seconds()/float64(b.N), "s/import")
}
