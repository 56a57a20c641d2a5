package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgrepl"
)

const (
	// serverUser is the system user PostgreSQL and PgBouncer run as when
	// localpg runs as root (both refuse to run as root).
	serverUser = "postgres"
	// maxConnections is the throwaway server's max_connections:
	// Watermill's universal suite, PgBouncer's pool and the tests' own
	// pools at once.
	maxConnections = 400
	// controlSocket is the name, in the directory of the server's data
	// directory, of the socket on which `localpg run` takes restart
	// requests.
	controlSocket = "localpg.sock"
	// restartTimeout bounds a restart, as the restart command waits for it.
	restartTimeout = 2 * time.Minute
)

// account is the user the servers run as: postgres when this process is
// root, else this process's user (cred nil).
type account struct {
	name     string
	cred     *syscall.Credential
	uid, gid int
}

func serverAccount() (*account, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, err
		}
		return &account{name: u.Username, uid: -1, gid: -1}, nil
	}
	u, err := user.Lookup(serverUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL and PgBouncer refuse to: no system user %q to run them as "+
			"(scripts/install-deps.sh creates it): %w", serverUser, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &account{name: serverUser, uid: uid, gid: gid,
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}, nil
}

func (a *account) chown(path string) error {
	if a.cred == nil {
		return nil
	}
	return os.Chown(path, a.uid, a.gid)
}

// writeOwned writes a file that belongs to a.
func writeOwned(path string, data []byte, perm os.FileMode, a *account) error {
	if err := os.WriteFile(path, data, perm); err != nil {
		return err
	}
	if err := os.Chmod(path, perm); err != nil {
		return err
	}
	return a.chown(path)
}

// server is the throwaway PostgreSQL of `localpg run`, with the socket
// its restart command talks to.
type server struct {
	cluster *pgrepl.Cluster
	ctl     net.Listener

	mu     sync.Mutex // held by a restart and by close
	closed bool
}

// serverSettings are the throwaway server's settings, after pgrepl's.
func serverSettings(bindir string, durable bool) map[string]string {
	durability := "off"
	if durable {
		durability = "on"
	}
	preload := ""
	if fileExists(filepath.Join(bindir, "..", "lib", "pg_stat_statements.so")) {
		preload = "pg_stat_statements" // benchmarks/pgstats.go reads it
	}
	return map[string]string{
		"max_connections":          strconv.Itoa(maxConnections),
		"fsync":                    durability,
		"synchronous_commit":       durability,
		"full_page_writes":         durability,
		"shared_buffers":           "256MB",
		"track_io_timing":          "off",
		"shared_preload_libraries": preload,
		// pgrepl turns JIT off for its failover tests; the tests of the
		// library run with PostgreSQL's default.
		"jit": "on",
	}
}

// startServer runs initdb and starts the server, and listens for restart
// requests.
func startServer(ctx context.Context, durable bool) (*server, error) {
	bindir, err := pgrepl.FindBindir()
	if err != nil {
		return nil, err
	}
	c, err := pgrepl.StartSingle(ctx, pgrepl.Options{Bindir: bindir, Settings: serverSettings(bindir, durable)})
	if err != nil {
		return nil, err
	}
	s := &server{cluster: c}
	sock := filepath.Join(c.Dir(), controlSocket)
	if s.ctl, err = net.Listen("unix", sock); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("the socket for restart requests: %w", err)
	}
	go s.serve()
	return s, nil
}

func (s *server) dataDir() string { return s.cluster.Primary.DataDir() }
func (s *server) logPath() string { return s.cluster.Primary.LogPath() }
func (s *server) dsn() string     { return s.cluster.Primary.DSN() }
func (s *server) port() int       { return s.cluster.Primary.Port() }

// version returns the server's version, e.g. "15.14".
func (s *server) version(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		return "?"
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "?"
	}
	if f := strings.Fields(v); len(f) > 0 {
		return f[0]
	}
	return v
}

// serve answers restart requests until the socket is closed: one line,
// "restart", answered with "ok" or "error: " and why, then the end of
// the connection.
func (s *server) serve() {
	for {
		conn, err := s.ctl.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil {
				return
			}
			reply := "ok"
			if req := strings.TrimSpace(line); req != "restart" {
				reply = "error: unknown request " + strconv.Quote(req)
			} else if err := s.restart(); err != nil {
				reply = "error: " + err.Error()
			}
			_, _ = fmt.Fprintln(conn, reply)
		}()
	}
}

func (s *server) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("localpg is shutting down")
	}
	ctx, cancel := context.WithTimeout(context.Background(), restartTimeout)
	defer cancel()
	return s.cluster.Primary.Restart(ctx)
}

// close stops the server and removes its files.
func (s *server) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	_ = s.ctl.Close()
	return s.cluster.Close()
}

// cmdRestart is `localpg restart DATADIR`: it asks the `localpg run` that
// started the server of DATADIR to restart it, and waits.
func cmdRestart(args []string) int {
	if len(args) != 1 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	data, err := filepath.Abs(args[0])
	if err == nil {
		if fi, serr := os.Stat(data); serr != nil || !fi.IsDir() {
			err = fmt.Errorf("no data directory %s", args[0])
		}
	}
	if err != nil {
		logf("restart: %v", err)
		return 1
	}
	sock := filepath.Join(filepath.Dir(data), controlSocket)
	conn, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		logf("restart: no `localpg run` serves %s: %v", data, err)
		return 1
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(restartTimeout + 10*time.Second))
	if _, err := fmt.Fprintln(conn, "restart"); err != nil {
		logf("restart: %v", err)
		return 1
	}
	// The answer, until the other end closes: "ok", or "error: " and
	// why, on as many lines as it takes.
	b, err := io.ReadAll(conn)
	reply := strings.TrimSpace(string(b))
	if err != nil || reply == "" {
		logf("restart: no answer from `localpg run` (%v)", err)
		return 1
	}
	if reply != "ok" {
		logf("restart: %s", strings.TrimPrefix(reply, "error: "))
		return 1
	}
	return 0
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("no free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portOpen reports whether something accepts connections on 127.0.0.1:port.
func portOpen(port int) bool {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// tail returns the last n lines of a file, or "".
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
