package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

func TestGrantCommand(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	role := "pglease_cmd_role_" + hex.EncodeToString(b)
	_, err = f.pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = f.pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = f.pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	messages := pgx.Identifier{f.schema, pglease.DefaultMessagesTable}.Sanitize()
	expire := pgx.Identifier{f.schema, pglease.DefaultMessagesTable + "_expire_retention_partition"}.Sanitize() + "(integer, bigint)"
	granted := func() (table, function bool) {
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, 'INSERT'), has_function_privilege($1, $3, 'EXECUTE')`,
			role, messages, expire).Scan(&table, &function))
		return table, function
	}

	out := f.ok("grant", "--role", role, "--dry-run")
	assert.Equal(t, pglease.GrantSQL(f.tables, role), out)
	table, function := granted()
	assert.False(t, table || function, "a dry run grants nothing")
	assert.Equal(t, pglease.GrantPublisherSQL(f.tables, role), f.ok("grant", "--role", role, "--publisher", "--dry-run"))

	out = f.ok("grant", "--role", role, "--publisher")
	assert.Equal(t, fmt.Sprintf("Granted role %s what publishing needs, and nothing of consumers, on the tables of schema %s.\n",
		pgx.Identifier{role}.Sanitize(), pgx.Identifier{f.schema}.Sanitize()), out)
	table, function = granted()
	assert.True(t, table, "INSERT on the messages table")
	assert.False(t, function, "no function for a publisher")

	out = f.ok("grant", "--role", role)
	assert.Equal(t, fmt.Sprintf("Granted role %s what pglease needs at run time, maintainer included, on the tables of schema %s.\n",
		pgx.Identifier{role}.Sanitize(), pgx.Identifier{f.schema}.Sanitize()), out)
	table, function = granted()
	assert.True(t, table && function)

	var res grantOutput
	require.NoError(t, json.Unmarshal([]byte(f.ok("grant", "--role", role, "--json")), &res), "granting again")
	assert.Equal(t, grantOutput{Role: role, SQL: pglease.GrantSQL(f.tables, role)}, res)

	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"grant"}, 2, "--role is required"},
		{[]string{"grant", "--role", ""}, 2, "--role is required"},
		{[]string{"grant", "--role", "public"}, 2, "would grant to every role"},
		{[]string{"grant", "--role", "a", "--role", "b"}, 2, "given more than once"},
		{[]string{"grant", "--role", "pglease_no_such_role"}, 1, `role "pglease_no_such_role" does not exist`},
	} {
		r := f.cli(tc.args[0], tc.args[1:]...)
		assert.Equal(t, tc.code, r.code, "%v: %s", tc.args, r)
		assert.Contains(t, r.stderr, tc.stderr, "%v", tc.args)
	}
	r := runCLI(t, map[string]string{"DATABASE_URL": testDSN}, "grant", "--role", role, "--schema", emptySchema(t, f.pool))
	assert.Equal(t, 1, r.code, "%s", r)
	assert.Contains(t, r.stderr, "No pglease tables in schema")
}

// TestGrantAsNotTheOwner: pglease grant run by a role that does not own
// the tables (PostgreSQL then warns "no privileges were granted" and
// grants nothing) fails, names the owner and says what to do. When the
// role owns the messages table but not every object, the warnings
// PostgreSQL sends make it fail too.
func TestGrantAsNotTheOwner(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	newRole := func(login bool) string {
		b := make([]byte, 4)
		_, err := rand.Read(b)
		require.NoError(t, err)
		role := "pglease_cmd_role_" + hex.EncodeToString(b)
		create := "CREATE ROLE " + pgx.Identifier{role}.Sanitize()
		if login {
			create += " LOGIN"
		}
		_, err = f.pool.Exec(ctx, create)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = f.pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
			_, _ = f.pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
		})
		return role
	}
	app, other := newRole(true), newRole(false)
	f.ok("grant", "--role", app) // by the owner: app may use the tables, not grant them
	cfg, err := pgx.ParseConfig(testDSN)
	require.NoError(t, err)
	var owner string
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT current_user").Scan(&owner))
	appDSN := strings.Replace(testDSN, "://"+cfg.User+"@", "://"+app+"@", 1)
	require.NotEqual(t, testDSN, appDSN, "the test DSN names its user as user@host")
	if conn, err := pgx.Connect(ctx, appDSN); err != nil {
		t.Skipf("role %s cannot log in to the test server (a password, or a pooler's user list): %v", app, err)
	} else {
		_ = conn.Close(ctx)
	}
	messages := pgx.Identifier{f.schema, pglease.DefaultMessagesTable}.Sanitize()
	granted := func() bool {
		var ok bool
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, 'INSERT')`, other, messages).Scan(&ok))
		return ok
	}

	r := runCLI(t, map[string]string{"DATABASE_URL": appDSN}, "grant", "--schema", f.schema, "--role", other)
	assert.Equal(t, 1, r.code, "%s", r)
	assert.Contains(t, r.stderr, fmt.Sprintf("role %s does not own the pglease tables of schema %s (their owner is %s)",
		pgx.Identifier{app}.Sanitize(), pgx.Identifier{f.schema}.Sanitize(), pgx.Identifier{owner}.Sanitize()))
	assert.Contains(t, r.stderr, "run pglease grant as")
	assert.Empty(t, r.stdout)
	assert.False(t, granted())

	// app owns the messages table now, not the other tables.
	_, err = f.pool.Exec(ctx, "ALTER TABLE "+messages+" OWNER TO "+pgx.Identifier{app}.Sanitize())
	require.NoError(t, err)
	r = runCLI(t, map[string]string{"DATABASE_URL": appDSN}, "grant", "--schema", f.schema, "--role", other)
	assert.Equal(t, 1, r.code, "%s", r)
	assert.Contains(t, r.stderr, "PostgreSQL did not grant everything (no privileges were granted for")
	assert.Contains(t, r.stderr, "run pglease grant again as the owner of the tables")
	assert.Empty(t, r.stdout)
}
