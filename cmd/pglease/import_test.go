package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/watermill-pglease/wmsqlimport"
)

// TestImportCommand imports a topic in watermill-sql v4's default
// PostgreSQL schema, made by hand here (the library module must not
// depend on watermill-sql; benchmarks/importtest runs the real one). The
// tables are in the default search_path, as watermill-sql's usually are,
// under a topic name of their own.
func TestImportCommand(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	topic := "cli_" + hex.EncodeToString(b)
	messages := pgx.Identifier{"watermill_" + topic}.Sanitize()
	offsets := pgx.Identifier{"watermill_offsets_" + topic}.Sanitize()
	_, err = f.pool.Exec(ctx, `CREATE TABLE `+messages+` (
	"offset" BIGSERIAL, "uuid" VARCHAR(36) NOT NULL, "created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	"payload" JSON DEFAULT NULL, "metadata" JSON DEFAULT NULL, "transaction_id" xid8 NOT NULL,
	PRIMARY KEY ("transaction_id", "offset"));
CREATE TABLE `+offsets+` (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT,
	last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group))`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+messages+`, `+offsets) })
	insert := func(from, to int) {
		t.Helper()
		for n := from; n < to; n++ {
			_, err := f.pool.Exec(ctx, `INSERT INTO `+messages+` (uuid, payload, metadata, transaction_id)
VALUES ($1, $2::json, '{"n": "x"}', pg_current_xact_id())`, fmt.Sprintf("m%d", n), fmt.Sprintf(`{"n": %d}`, n))
			require.NoError(t, err)
		}
	}
	insert(0, 10)
	// Group g acknowledged the first four messages.
	_, err = f.pool.Exec(ctx, `INSERT INTO `+offsets+` (consumer_group, offset_acked, last_processed_transaction_id)
SELECT 'g', "offset", transaction_id FROM `+messages+` WHERE uuid = 'm3'`)
	require.NoError(t, err)

	var report wmsqlimport.Report
	require.NoError(t, json.Unmarshal([]byte(f.ok("import", "watermill-sql", "--topics", topic, "--dry-run", "--json")), &report))
	require.Len(t, report.Topics, 1)
	assert.True(t, report.DryRun)
	assert.Equal(t, int64(6), report.Topics[0].Messages)
	assert.Empty(t, f.lag("--topic", topic), "a dry run changes nothing")

	out := f.ok("import", "watermill-sql", "--topics", topic)
	assert.Equal(t, []string{topic, "watermill_" + topic, "transaction_id", "1", "6", "0"}, tableRow(t, out, topic))
	assert.Contains(t, out, "CREATED")
	rows := f.lag("--topic", topic)
	require.Len(t, rows, 1)
	assert.Equal(t, "g", rows[0].ConsumerGroup)
	assert.Equal(t, int64(6), rows[0].Lag)

	insert(10, 12)
	require.NoError(t, json.Unmarshal([]byte(f.ok("import", "watermill-sql", "--topics", topic, "--json")), &report))
	assert.Equal(t, int64(2), report.Topics[0].Messages)
	assert.Equal(t, 2, report.Topics[0].Run)
	assert.Equal(t, wmsqlimport.GroupUnchanged, report.Topics[0].Groups[0].Action)
	assert.Equal(t, int64(8), f.lag("--topic", topic)[0].Lag)

	_, sub := f.subscribe("g", topic)
	for n := 4; n < 12; n++ {
		msg := receive(t, sub)
		assert.Equal(t, fmt.Sprintf("m%d", n), msg.UUID)
		assert.JSONEq(t, fmt.Sprintf(`{"n": %d}`, n), string(msg.Payload))
		msg.Ack()
	}

	r := f.cli("import", "watermill-sql", "--topics", "cli_missing_"+hex.EncodeToString(b))
	assert.Equal(t, 1, r.code, "%s", r)
	assert.Contains(t, r.stderr, `no table "watermill_cli_missing_`)
}

func TestImportCommandBadInput(t *testing.T) {
	db := map[string]string{"DATABASE_URL": testDSN}
	for _, tc := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no source", []string{"import"}, "name the source: pglease import watermill-sql"},
		{"unknown source", []string{"import", "kafka", "--all"}, `unknown source "kafka"`},
		{"no topics", []string{"import", "watermill-sql"}, "pass either --topics or --all"},
		{"both", []string{"import", "watermill-sql", "--all", "--topics", "a"}, "pass either --topics or --all"},
		{"extra argument", []string{"import", "watermill-sql", "--all", "b"}, `unexpected argument "b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, db, tc.args...)
			assert.Equal(t, 2, r.code, "%s", r)
			assert.Contains(t, r.stderr, tc.stderr)
			assert.Contains(t, r.stderr, "usage: pglease import")
		})
	}
}
