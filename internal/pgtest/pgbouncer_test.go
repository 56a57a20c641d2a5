package pgtest_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgtest"
)

func TestPgBouncerDSNFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     string
		want    string
		wantErr []string
	}{
		{name: "set", env: "postgres://u@127.0.0.1:6432/db?sslmode=disable", want: "postgres://u@127.0.0.1:6432/db?sslmode=disable"},
		{name: "unset", env: "", wantErr: []string{pgtest.EnvPgBouncerDSN, "make test", "internal/cmd/localpg"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(pgtest.EnvPgBouncerDSN, tt.env)
			got, err := pgtest.PgBouncerDSN()
			if len(tt.wantErr) == 0 {
				if err != nil || got != tt.want {
					t.Fatalf("PgBouncerDSN() = %q, %v, want %q, nil", got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("PgBouncerDSN() = %q, nil, want an error", got)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("PgBouncerDSN() error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestPgBouncerAlive checks the PgBouncer that `make test` starts: it
// answers, and pools in transaction mode.
func TestPgBouncerAlive(t *testing.T) {
	pgtest.SkipShort(t)
	dsn, err := pgtest.PgBouncerDSN()
	if err != nil {
		t.Fatal(err)
	}
	if err := pgtest.PgBouncerAlive(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// pgx through the pooler, the way pglease's tests connect.
	conn, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatalf("connect through PgBouncer: %v", err)
	}
	defer conn.Close(ctx)
	var sum int
	if err := conn.QueryRow(ctx, "SELECT $1::int + 1", 41).Scan(&sum); err != nil || sum != 42 {
		t.Fatalf("SELECT $1::int + 1 through PgBouncer = %d, %v, want 42", sum, err)
	}

	if os.Getenv(pgtest.EnvPgBouncerPidFile) == "" {
		t.Logf("%s is not set (a PgBouncer of the caller's own): its pool mode is not checked", pgtest.EnvPgBouncerPidFile)
		return
	}
	// localpg makes the user an admin of its PgBouncer, whose
	// console (database "pgbouncer") speaks the simple protocol only.
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = "pgbouncer"
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to the PgBouncer console: %v", err)
	}
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatalf("SHOW CONFIG: %v", err)
	}
	settings, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		vals, err := row.Values()
		if err != nil || len(vals) < 2 {
			return [2]string{}, fmt.Errorf("SHOW CONFIG row %v: %v", vals, err)
		}
		return [2]string{fmt.Sprint(vals[0]), fmt.Sprint(vals[1])}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range settings {
		got[kv[0]] = kv[1]
	}
	if got["pool_mode"] != "transaction" {
		t.Fatalf("PgBouncer pool_mode = %q, want transaction", got["pool_mode"])
	}
	t.Logf("PgBouncer: pool_mode %s, default_pool_size %s, max_client_conn %s", got["pool_mode"], got["default_pool_size"], got["max_client_conn"])
}

func TestPgBouncerAliveFailures(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "pgbouncer.log")
	const fatal = "FATAL server_proto: server in bad state"
	if err := os.WriteFile(logFile, []byte("LOG process up\n"+fatal+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writePidFile := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A port nothing listens on: connections are refused at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	refusedDSN := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", closedPort)
	self := writePidFile("self.pid", fmt.Sprintf("%d\n", os.Getpid()))

	tests := []struct {
		name    string
		dsn     string
		pidFile string
		wantErr []string
	}{
		{name: "no DSN", dsn: "", pidFile: self, wantErr: []string{pgtest.EnvPgBouncerDSN, "make test"}},
		{name: "pid file gone", dsn: refusedDSN, pidFile: filepath.Join(dir, "missing.pid"), wantErr: []string{"not running", "read pid file", fatal}},
		{name: "pid file without a pid", dsn: refusedDSN, pidFile: writePidFile("garbage.pid", "pgbouncer\n"), wantErr: []string{"not running", "holds no process id"}},
		// Above the largest pid_max of Linux (2^22) and of macOS.
		{name: "no such process", dsn: refusedDSN, pidFile: writePidFile("dead.pid", "4194305\n"), wantErr: []string{"not running", "4194305", fatal}},
		{name: "process alive, no answer", dsn: refusedDSN, pidFile: self, wantErr: []string{"no answer through PgBouncer", fatal}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(pgtest.EnvPgBouncerDSN, tt.dsn)
			t.Setenv(pgtest.EnvPgBouncerPidFile, tt.pidFile)
			t.Setenv(pgtest.EnvPgBouncerLog, logFile)
			err := pgtest.PgBouncerAlive()
			if err == nil {
				t.Fatal("PgBouncerAlive() = nil, want an error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("PgBouncerAlive() error %q does not mention %q", err, s)
				}
			}
		})
	}
}
