package main

import (
	"strings"
	"testing"
)

// These tests need no database.

func TestTargetOf(t *testing.T) {
	t.Setenv("PGUSER", "envuser")
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGDATABASE", "")
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGHOST", "")
	t.Setenv("PGPORT", "")
	for _, tc := range []struct {
		dsn  string
		want target
	}{
		{"postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable",
			target{Host: "127.0.0.1", Port: 5433, User: "postgres", Database: "postgres", SSLMode: "disable"}},
		// Escapes, a password with @ and /, the database defaults to the user.
		{"postgresql://us%20er:p%40ss%2Fw%22rd@db.example:6000?sslmode=require",
			target{Host: "db.example", Port: 6000, User: "us er", Password: `p@ss/w"rd`, Database: "us er", SSLMode: "require"}},
		{"postgres://u@[::1]/d",
			target{Host: "::1", Port: 5432, User: "u", Database: "d", SSLMode: "prefer"}},
		{"postgres://u@h/d?sslmode=allow",
			target{Host: "h", Port: 5432, User: "u", Database: "d", SSLMode: "allow"}},
		// Keyword/value, quoted values, PGUSER for the user.
		{`host=127.0.0.1 port=5999 dbname='my db' password='it\'s' sslmode=disable`,
			target{Host: "127.0.0.1", Port: 5999, User: "envuser", Password: "it's", Database: "my db", SSLMode: "disable"}},
	} {
		got, err := targetOf(tc.dsn)
		if err != nil {
			t.Errorf("targetOf(%q): %v", tc.dsn, err)
			continue
		}
		if got != tc.want {
			t.Errorf("targetOf(%q) = %+v, want %+v", tc.dsn, got, tc.want)
		}
	}
	for dsn, wantErr := range map[string]string{
		"postgres://u@h1:5432,h2:5432/d":                       "several hosts",
		"postgres://u@h/d?sslmode=bogus":                       "sslmode",
		"host=h user=u sslmode=verify-full":                    "as a URL",
		"postgres://u@h/d?sslmode=verify-ca&sslrootcert=/nope": "CA file",
	} {
		_, err := targetOf(dsn)
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("targetOf(%q) error = %v, want one that says %q", dsn, err, wantErr)
		}
	}
}

func TestPoolSize(t *testing.T) {
	for maxConns, want := range map[int]int{400: 40, 100: 24, 20: 4, 5: 2, 0: 2} {
		if got := poolSize(maxConns); got != want {
			t.Errorf("poolSize(%d) = %d, want %d", maxConns, got, want)
		}
	}
}

func TestAuthFileLine(t *testing.T) {
	if got, want := authFileLine(`a"b`, ""), `"a""b" ""`+"\n"; got != want {
		t.Errorf("authFileLine = %q, want %q", got, want)
	}
}

func TestRenderIni(t *testing.T) {
	d := iniData{Host: "127.0.0.1", Port: 5432, ListenPort: 6432, Dir: "/tmp/x/pgbouncer", User: "postgres",
		PoolSize: 40, MaxClients: 2000, SSLMode: "disable"}
	b, err := renderIni(d)
	if err != nil {
		t.Fatal(err)
	}
	ini := string(b)
	for _, line := range []string{
		"* = host=127.0.0.1 port=5432",
		"listen_addr = 127.0.0.1",
		"listen_port = 6432",
		"pidfile = /tmp/x/pgbouncer/pgbouncer.pid",
		"logfile = /tmp/x/pgbouncer/pgbouncer.log",
		"auth_file = /tmp/x/pgbouncer/userlist.txt",
		"admin_users = postgres",
		"pool_mode = transaction",
		"max_client_conn = 2000",
		"default_pool_size = 40",
		"server_login_retry = 1",
		"server_tls_sslmode = disable",
	} {
		if !strings.Contains(ini, "\n"+line+"\n") {
			t.Errorf("pgbouncer.ini has no line %q:\n%s", line, ini)
		}
	}
	if strings.Contains(ini, "server_tls_ca_file") {
		t.Errorf("pgbouncer.ini names a CA file without one:\n%s", ini)
	}
	d.SSLMode, d.CAFile = "verify-full", "/etc/ca.pem"
	if b, err = renderIni(d); err != nil || !strings.Contains(string(b), "\nserver_tls_sslmode = verify-full\nserver_tls_ca_file = /etc/ca.pem\n") {
		t.Errorf("with a CA file: %v\n%s", err, b)
	}
	for _, bad := range []iniData{{Host: "h\nadmin_users = x"}, {Host: "my host"}, {User: "u\n"}} {
		if _, err := renderIni(bad); err == nil {
			t.Errorf("renderIni(%+v) = nil error", bad)
		}
	}
}
