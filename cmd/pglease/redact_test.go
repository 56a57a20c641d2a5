package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The password of every connection string below is made of the words
// secretA and secretB: neither may be printed.
const (
	secretA = "S3cret"
	secretB = "Xyzzy"
)

// keywordForms are the ways libpq accepts to write a password in a
// key=value connection string (white space around "=", quoted values,
// escapes), and the other keyword that holds one.
var keywordForms = []string{
	`password=S3cret_Xyzzy`,
	`password = S3cret_Xyzzy`,
	`password =S3cret_Xyzzy`,
	`password= S3cret_Xyzzy`,
	"password\t=\tS3cret_Xyzzy",
	"password\n=\n S3cret_Xyzzy",
	`password='S3cret Xyzzy'`,
	`password = 'S3cret Xyzzy'`,
	`password='S3cret\' Xyzzy'`,
	`password='S3cret\\ Xyzzy'`,
	`password='S3cret=Xyzzy'`,
	`password=S3cret\ Xyzzy`,
	`password=S3cret\'Xyzzy`,
	`password=S3cret''Xyzzy`,
	`sslpassword=S3cret_Xyzzy`,
	`sslpassword = 'S3cret Xyzzy'`,
}

// uriForms are the URIs of libpq with a password ({port} is replaced):
// in the userinfo (encoded or not), in the query, with several hosts.
var uriForms = []string{
	"postgres://u:S3cret_Xyzzy@127.0.0.1:{port}/db",
	"postgresql://u:S3cret_Xyzzy@127.0.0.1:{port}/db",
	"postgres://u:S3cret%20Xyzzy@127.0.0.1:{port}/db",
	"postgres://u:S3cret%2FXyzzy@127.0.0.1:{port}/db",
	"postgres://u:S3cret%40Xyzzy@127.0.0.1:{port}/db",
	"postgres://u:S3cret/Xyzzy@127.0.0.1:{port}/db",
	"postgres://u:S3cret@Xyzzy@127.0.0.1:{port}/db",
	"postgres://u:S3cret:Xyzzy@127.0.0.1:{port}/db",
	"postgres://u@127.0.0.1/db?password=S3cret_Xyzzy&port={port}",
	"postgres://u@127.0.0.1/db?port={port}&password=S3cret%20Xyzzy",
	"postgres://u@127.0.0.1/db?sslpassword=S3cret_Xyzzy&port={port}",
	"postgres://u@127.0.0.1/db?pass%77ord=S3cret_Xyzzy&port={port}",
	"postgres://u:S3cret_Xyzzy@127.0.0.1:5432,127.0.0.2:{port}/db",
	"postgres://u:S3cret_Xyzzy@[::1]:{port}/db",
	"postgres://:S3cret_Xyzzy@127.0.0.1:{port}/db",
}

// dsnForms returns every form as a connection string that pgx cannot
// parse (a bad port) and as one it parses but cannot connect with.
func dsnForms() []string {
	var out []string
	for _, port := range []string{"abc", "1"} {
		for _, f := range keywordForms {
			out = append(out, "host=127.0.0.1 port="+port+" "+f+" dbname=db", f+" host=127.0.0.1 port="+port)
		}
		for _, f := range uriForms {
			out = append(out, strings.ReplaceAll(f, "{port}", port))
		}
	}
	return out
}

func assertNoSecret(t *testing.T, out, what string) {
	t.Helper()
	assert.NotContains(t, out, secretA, what)
	assert.NotContains(t, out, secretB, what)
}

// TestRedactText: in a message that quotes a connection string of any
// form, the password is masked and the rest kept.
func TestRedactText(t *testing.T) {
	for _, dsn := range dsnForms() {
		for _, msg := range []string{"cannot parse `" + dsn + "`: invalid port", "dial " + dsn + "\nnext line", dsn} {
			out := redactText(msg, nil)
			assertNoSecret(t, out, msg)
			assert.Contains(t, out, redactMask, msg)
			assert.Regexp(t, `127\.0\.0\.|\[::1\]`, out, msg)
		}
	}
	assert.Equal(t, "PGPASSWORD=xxxxx psql", redactText("PGPASSWORD=S3cret_Xyzzy psql", nil))
	assert.Equal(t, "no password here: host=x port=5", redactText("no password here: host=x port=5", nil))
	assert.Equal(t, "postgres://u@h:5432/db?sslmode=disable", redactText("postgres://u@h:5432/db?sslmode=disable", nil))
}

// TestRedactWriterMasksTheGivenPasswords: a password of a connection
// string given to the command is masked wherever it is printed, decoded
// or not.
func TestRedactWriterMasksTheGivenPasswords(t *testing.T) {
	for _, dsn := range dsnForms() {
		var buf bytes.Buffer
		w := newRedactWriter(&buf)
		w.addDSN(dsn)
		secrets := dsnSecrets(dsn)
		require.NotEmpty(t, secrets, dsn)
		for _, s := range secrets {
			_, err := w.Write([]byte("the server said: " + s + "!\n"))
			require.NoError(t, err)
		}
		assertNoSecret(t, buf.String(), dsn)
	}
}

// TestCLIErrorsDoNotPrintPasswords: whatever form the connection string
// of --dsn or $DATABASE_URL has, what pglease prints when it cannot parse
// it or cannot connect holds no part of its password.
func TestCLIErrorsDoNotPrintPasswords(t *testing.T) {
	for _, dsn := range dsnForms() {
		r := runCLI(t, nil, "status", "--timeout", "5s", "--dsn", dsn)
		assert.Equal(t, exitError, r.code, "%s: %s", dsn, r)
		assertNoSecret(t, r.stdout+r.stderr, dsn)
		r = runCLI(t, map[string]string{"DATABASE_URL": dsn}, "topics", "--timeout", "5s")
		assert.Equal(t, exitError, r.code, "%s: %s", dsn, r)
		assertNoSecret(t, r.stdout+r.stderr, dsn)
	}
	r := runCLI(t, nil, "status", "--dsn", "host=x port=abc password = S3cret_Xyzzy")
	assert.Equal(t, "pglease status: cannot parse the connection string of --dsn: invalid port\n", r.stderr)
}

// TestImportSourceDSNErrorsDoNotPrintPasswords: the same for pglease
// import's --source-dsn.
func TestImportSourceDSNErrorsDoNotPrintPasswords(t *testing.T) {
	f := newFixture(t)
	for _, dsn := range dsnForms() {
		r := f.cli("import", "watermill-sql", "--topics", "a", "--timeout", "5s", "--source-dsn", dsn)
		assert.Equal(t, exitError, r.code, "%s: %s", dsn, r)
		assertNoSecret(t, r.stdout+r.stderr, dsn)
	}
}
