package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// TestTerminalWriterEscapesControls: control characters but new line and
// tab, C1 controls, bidirectional overrides and bytes that are not UTF-8
// are escaped; everything else, a character cut between two writes
// included, passes as it is.
func TestTerminalWriterEscapesControls(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text, ünïcode 🙂\tand\nlines", "plain text, ünïcode 🙂\tand\nlines"},
		{"\x1b]0;pwned\x07", `\u001b]0;pwned\u0007`},
		{"\x1b[2J\r\x7f", `\u001b[2J\u000d\u007f`},
		{"\u009b31m", `\u009b31m`},
		{"abc\u202edcba", `abc\u202edcba`},
		{"\xff\xfe", `\xff\xfe`},
	} {
		var b bytes.Buffer
		w := newTerminalWriter(&b)
		_, err := w.Write([]byte(c.in))
		require.NoError(t, err)
		require.NoError(t, w.Flush())
		assert.Equal(t, c.want, b.String(), "%q", c.in)
	}
	var b bytes.Buffer
	w := newTerminalWriter(&b)
	smile := []byte("🙂")
	for _, p := range [][]byte{[]byte("a"), smile[:1], smile[1:3], smile[3:], {0xc2}, {0x9b}, {0xe2}} {
		_, err := w.Write(p)
		require.NoError(t, err)
	}
	require.NoError(t, w.Flush())
	assert.Equal(t, `a🙂\u009b\xe2`, b.String())
	s := `{"k": "\u001b and ` + "\u009b and \u202e" + `"}`
	b.Reset()
	_, err := newTerminalWriter(&b).Write([]byte(s))
	require.NoError(t, err)
	assert.True(t, json.Valid(b.Bytes()), "JSON stays JSON: %s", b.String())
}

// TestCommandsPrintNoControlSequences: terminal control sequences stored
// in the database (a message's UUID and metadata, a session's owner, the
// query text of the transaction holding the horizon) reach the output of
// messages, status and lag escaped, in text and in JSON.
func TestCommandsPrintNoControlSequences(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	const evil = "\x1b]0;pwned\x07\x1b[2J\u009b31m\u202e"
	messages := pgx.Identifier{f.schema, pglease.DefaultMessagesTable}.Sanitize()
	metadata, err := json.Marshal(map[string]string{"key" + evil: "value" + evil})
	require.NoError(t, err)
	// Text and a cast, not a map: the simple protocol (PgBouncer) has no
	// type to encode a map for.
	_, err = f.pool.Exec(ctx, "INSERT INTO "+messages+" (topic, uuid, payload, metadata) VALUES ('t', $1, $2, $3::text::jsonb)",
		"uuid"+evil, []byte("payload"+evil), string(metadata))
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "INSERT INTO "+messages+` (topic, uuid, payload, metadata) VALUES ('t', 'raw', 'x', $1::jsonb)`,
		`{"m": 1, "n": "\u001b[2J \u009b"}`)
	require.NoError(t, err)
	sub, _ := f.subscribe("g", "t")
	sessions := pgx.Identifier{f.schema, pglease.DefaultConsumerSessionsTable}.Sanitize()
	waitFor(t, 10*time.Second, "the session", func() bool {
		tag, err := f.pool.Exec(ctx, "UPDATE "+sessions+" SET owner = $1", "owner"+evil)
		return err == nil && tag.RowsAffected() == 1
	})
	_ = sub

	blocker, err := pgx.Connect(ctx, testDSN)
	require.NoError(t, err)
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// In the transaction: through PgBouncer in transaction mode, a
	// statement outside it may run on another server connection.
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id() /* "+evil+" */")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the blocker to hold the horizon", func() bool {
		return strings.Contains(f.ok("status", "--warn-after", "1ms"), fmt.Sprintf("pid %d", pid))
	})

	outputs := map[string]string{}
	for _, args := range [][]string{
		{"messages", "--topic", "t"}, {"messages", "--topic", "t", "--json"}, {"messages", "--topic", "t", "--uuid", "uuid" + evil},
		{"messages", "--topic", "t", "--uuid", "raw"},
		{"status", "--warn-after", "1ms"}, {"status", "--json", "--warn-after", "1ms"}, {"lag"}, {"lag", "--json"},
	} {
		r := f.cli(args[0], args[1:]...)
		require.Equal(t, 0, r.code, "%v: %s", args, r)
		outputs[strings.Join(args, " ")] = r.stdout + r.stderr
	}
	for name, out := range outputs {
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
			assert.NotContains(t, out, bad, "%s prints %q", name, bad)
		}
		if strings.Contains(name, "--json") {
			assert.True(t, json.Valid([]byte(out)), "%s: %s", name, out)
		}
	}
	assert.Contains(t, outputs["messages --topic t"], `value\u001b]0;pwned\u0007`)
	assert.Contains(t, outputs["messages --topic t"], `raw:{"m": 1`, "the undecodable row, raw")
	assert.Contains(t, outputs["messages --topic t --uuid raw"], `metadata as stored`)
	assert.Contains(t, outputs["status --warn-after 1ms"], `owner\u001b]0;pwned`)
	assert.Contains(t, outputs["status --warn-after 1ms"], `/* \u001b]0;pwned\u0007`)
}
