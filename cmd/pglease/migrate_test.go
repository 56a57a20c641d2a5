package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// emptySchema creates a schema without the pglease tables, dropped at the
// end of the test.
func emptySchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	schema := "pglease_cmd_test_" + hex.EncodeToString(b)
	_, err = pool.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return schema
}

func TestMigrateCommand(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, testDSN, 0)
	env := map[string]string{"DATABASE_URL": testDSN}
	latest := len(tablesOf(pglease.Tables{}).Migrations())
	version := func(schema string) int {
		var v int
		require.NoError(t, pool.QueryRow(ctx, "SELECT COALESCE(max(version), 0) FROM "+
			pgx.Identifier{schema, pglease.DefaultSchemaVersionTable}.Sanitize()).Scan(&v))
		return v
	}
	migrate := func(schema string, args ...string) (result, migrateOutput) {
		t.Helper()
		r := runCLI(t, env, append([]string{"migrate", "--schema", schema, "--json"}, args...)...)
		require.Equal(t, 0, r.code, "%s", r)
		var out migrateOutput
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		return r, out
	}
	versions := func(out migrateOutput) []int {
		var v []int
		for _, m := range out.Migrations {
			v = append(v, m.Version)
		}
		return v
	}
	all := make([]int, latest)
	for i := range all {
		all[i] = i + 1
	}

	// On a schema without the tables: --dry-run prints the whole script and
	// creates nothing; the script runs as it is.
	schema := emptySchema(t, pool)
	r := runCLI(t, env, "migrate", "--schema", schema, "--dry-run")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, "The schema is at version 0; pglease migrate would apply")
	assert.Contains(t, r.stdout, "BEGIN;\nSELECT pg_catalog.pg_advisory_xact_lock(")
	for _, v := range all {
		assert.Contains(t, r.stdout, fmt.Sprintf("\n-- version %d: ", v))
	}
	var created bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{schema, pglease.DefaultSchemaVersionTable}.Sanitize()).Scan(&created))
	assert.False(t, created, "a dry run creates nothing")
	byScript := emptySchema(t, pool)
	script := runCLI(t, env, "migrate", "--schema", byScript, "--dry-run")
	_, err := pool.Exec(ctx, script.stdout)
	require.NoError(t, err, "the printed script")
	assert.Equal(t, latest, version(byScript))
	_, out := migrate(byScript)
	assert.Empty(t, out.Migrations, "the script recorded its versions")

	_, out = migrate(schema, "--dry-run")
	assert.Equal(t, migrateOutput{FromVersion: 0, ToVersion: latest, LatestVersion: latest, DryRun: true,
		Migrations: out.Migrations, SQL: out.SQL}, out)
	assert.Equal(t, all, versions(out))

	// Applies every version, and says so; then nothing.
	r = runCLI(t, env, "migrate", "--schema", schema)
	require.Equal(t, 0, r.code, "%s", r)
	for _, v := range all {
		assert.Contains(t, r.stdout, fmt.Sprintf("Applied version %d: ", v))
	}
	assert.Contains(t, r.stdout, fmt.Sprintf("The schema is at version %d.\n", latest))
	assert.Equal(t, latest, version(schema))
	r = runCLI(t, env, "migrate", "--schema", schema)
	assert.Equal(t, fmt.Sprintf("The schema is at version %d, the latest: nothing to apply.\n", latest), r.stdout)
	r = runCLI(t, env, "migrate", "--schema", schema, "--dry-run")
	assert.Equal(t, fmt.Sprintf("The schema is at version %d, the latest: nothing to apply.\n", latest), r.stdout)

	// From an older release's schema: only what it lacks.
	old := emptySchema(t, pool)
	// The schema of a release whose latest version was 5.
	oldTables := tablesOf(pglease.Tables{Schema: old})
	require.NoError(t, pgsql.Migrate(ctx, pool, oldTables, oldTables.Migrations()[:5]))
	_, out = migrate(old, "--dry-run")
	assert.Equal(t, 5, out.FromVersion)
	assert.Equal(t, all[5:], versions(out))
	assert.NotContains(t, out.SQL, "-- version 5:")
	_, out = migrate(old)
	assert.Equal(t, all[5:], versions(out))
	assert.Equal(t, latest, out.ToVersion)
	assert.Empty(t, out.SQL)
	assert.Equal(t, latest, version(old))
}
