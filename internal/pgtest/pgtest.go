// Package pgtest finds a PostgreSQL server for the tests of this module.
//
// It is meant for test code only: the library's tests and test helpers call
// [DSN] to get a database URL, [RestartCommand] to learn how to restart that
// server (for reconnection tests), and [Terminate] at the end of TestMain.
//
// Where the database comes from, in order:
//
//  1. The environment variable PGLEASE_TEST_DSN, when it is not empty.
//     `make test` (localpg, internal/cmd/localpg) sets it to a throwaway local server,
//     together with PGLEASE_TEST_RESTART_CMD.
//  2. A Docker engine, when one answers (DOCKER_HOST, else
//     /var/run/docker.sock, answers GET /_ping): a single postgres:15-alpine
//     container ([Image]; the environment variable PGLEASE_TEST_IMAGE
//     names another, e.g. postgres:17 or postgres:18) is started and
//     shared by the whole test process. The
//     start-up runs in a program of its own, `go run .` in
//     internal/pgtest/container, a nested module, so that this module does
//     not require testcontainers-go and the Docker client.
//  3. Otherwise [DSN] returns an error that says how to provide a database
//     and why Docker could not be used.
//
// Under `go test -short` no database is looked for: [Main] runs the tests
// without one and [SkipShort] skips those that need one, saying to run
// `make test`.
//
// Tests that run pglease behind a transaction pooler call [PgBouncerDSN]
// for the URL of the same database through PgBouncer in transaction mode,
// and [PgBouncerAlive] at the end to check that PgBouncer survived them.
// Only `make test` (localpg, internal/cmd/localpg) provides one, in
// PGLEASE_TEST_PGBOUNCER_DSN with PGLEASE_TEST_PGBOUNCER_PIDFILE and
// PGLEASE_TEST_PGBOUNCER_LOG; no container is started for it, and without
// it [PgBouncerDSN] returns an error that says so: such tests fail rather
// than skip.
package pgtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// EnvDSN names the environment variable that holds the URL of the database
// the tests use, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
const EnvDSN = "PGLEASE_TEST_DSN"

// EnvRestartCmd names the environment variable that holds a command line,
// split on white space, which restarts the server behind [EnvDSN] and returns
// once it accepts connections again.
const EnvRestartCmd = "PGLEASE_TEST_RESTART_CMD"

// Image is the container image started when no [EnvDSN] is given and a
// Docker engine answers (see internal/pgtest/container), unless
// [EnvImage] names another.
const Image = "postgres:15-alpine"

// EnvImage names the environment variable that chooses the container
// image instead of [Image]: postgres:17, postgres:18 (the versions `make
// test PG=17` and PG=18 test locally).
const EnvImage = "PGLEASE_TEST_IMAGE"

const (
	dockerCheckTimeout = 5 * time.Second
	// containerTimeout bounds the container program: building it the
	// first time, pulling the image, starting the server.
	containerTimeout = 10 * time.Minute
	terminateTimeout = time.Minute
)

var (
	mu          sync.Mutex
	once        sync.Once
	ctr         *exec.Cmd      // the container program, while it runs
	ctrStdin    io.WriteCloser // closing it makes the program remove the container
	ctrID       string
	ctrDSN      string
	ctrErr      error
	ctrFinished bool
)

// DSN returns the URL of a PostgreSQL database for tests.
//
// It returns the value of PGLEASE_TEST_DSN when that is set. Otherwise, if a
// Docker engine answers, it starts one postgres:15-alpine container for the
// whole process (later calls return the same URL) and returns its URL; the
// container's port on the host is fixed, so that `docker restart` keeps it.
// Otherwise it returns an error that tells how to provide a database.
func DSN() (string, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return dsn, nil
	}
	once.Do(startContainer)
	mu.Lock()
	defer mu.Unlock()
	if ctrFinished {
		return "", errors.New("pgtest: the test PostgreSQL container was already terminated")
	}
	return ctrDSN, ctrErr
}

// RestartCommand returns a command, program first, that restarts the server
// returned by [DSN].
//
// With PGLEASE_TEST_RESTART_CMD set, it is that variable split on white
// space; the command returns once the server accepts connections again.
// For the container started by [DSN] it is `docker restart <container id>`,
// which may return before PostgreSQL accepts connections, so callers should
// retry connecting until a deadline. Otherwise (an external database without
// a restart command, or [DSN] not called yet) it is nil.
func RestartCommand() []string {
	if cmd := strings.Fields(os.Getenv(EnvRestartCmd)); len(cmd) > 0 {
		return cmd
	}
	mu.Lock()
	defer mu.Unlock()
	if ctrID != "" && !ctrFinished {
		return []string{"docker", "restart", ctrID}
	}
	return nil
}

// Terminate stops and removes the container started by [DSN], if any. Call
// it at the end of TestMain, after m.Run ([Main] does). It is a no-op when
// no container was started, and safe to call more than once.
func Terminate() {
	mu.Lock()
	c, stdin := ctr, ctrStdin
	ctr, ctrStdin = nil, nil
	if c != nil {
		ctrFinished = true
	}
	mu.Unlock()
	if c == nil {
		return
	}
	_ = stdin.Close() // the program removes the container and exits
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: terminating the PostgreSQL container: %v\n", err)
		}
	case <-time.After(terminateTimeout):
		_ = c.Process.Kill()
		fmt.Fprintf(os.Stderr, "pgtest: the container program did not exit within %v; killed it (container %s may be left)\n",
			terminateTimeout, ctrID)
	}
}

// noDatabaseError says how to provide a database; reason tells why Docker
// could not be used.
func noDatabaseError(reason error) error {
	return fmt.Errorf("pgtest: no PostgreSQL for tests: set %s "+
		"(e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), "+
		"or run `make test`, which starts a throwaway local PostgreSQL, "+
		"or start a Docker engine (Docker engine check: %v)", EnvDSN, reason)
}

func startContainer() {
	err := dockerAvailable(os.Getenv("DOCKER_HOST"), dockerCheckTimeout)
	if err != nil {
		mu.Lock()
		ctrErr = noDatabaseError(err)
		mu.Unlock()
		return
	}
	cmd, stdin, r, err := runContainer()
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		ctrErr = err
		return
	}
	ctr, ctrStdin, ctrDSN, ctrID = cmd, stdin, r.DSN, r.ID
}

// containerReply is the line the container program writes.
type containerReply struct {
	DSN   string `json:"dsn"`
	ID    string `json:"id"`
	Error string `json:"error"`
}

// containerDir is the directory of the container program, beside this file.
func containerDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("pgtest: cannot find the directory of the container program")
	}
	return filepath.Join(filepath.Dir(file), "container"), nil
}

// runContainer runs the container program and reads its reply. On success
// the program keeps running until its stdin is closed.
func runContainer() (*exec.Cmd, io.WriteCloser, containerReply, error) {
	var r containerReply
	dir, err := containerDir()
	if err != nil {
		return nil, nil, r, err
	}
	cmd := exec.Command("go", "run", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off") // the container module's own go.mod, not the workspace's versions
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, r, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, r, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, r, fmt.Errorf("pgtest: starting the container program (go run . in %s): %w", dir, err)
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		} else {
			line <- ""
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	fail := func(err error) (*exec.Cmd, io.WriteCloser, containerReply, error) {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, nil, r, err
	}
	select {
	case l := <-line:
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			return fail(fmt.Errorf("pgtest: the container program (in %s) said %q: %v", dir, l, err))
		}
		if r.Error != "" || r.DSN == "" {
			return fail(fmt.Errorf("pgtest: %s", r.Error))
		}
		return cmd, stdin, r, nil
	case <-time.After(containerTimeout):
		return fail(fmt.Errorf("pgtest: the container program (in %s) did not start PostgreSQL within %v", dir, containerTimeout))
	}
}

// dockerAvailable reports, within timeout, whether a Docker engine answers
// GET /_ping at host (DOCKER_HOST's syntax: unix:///path or tcp://host:port;
// empty means unix:///var/run/docker.sock).
func dockerAvailable(host string, timeout time.Duration) error {
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	u, err := url.Parse(host)
	if err != nil {
		return fmt.Errorf("DOCKER_HOST %q: %w", host, err)
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		network, addr = "unix", u.Path
	case "tcp", "http":
		network, addr = "tcp", u.Host
	default:
		return fmt.Errorf("DOCKER_HOST %q: only unix:// and tcp:// are checked", host)
	}
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			},
		},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://docker/_ping")
	if err != nil {
		return fmt.Errorf("no Docker engine at %s: %w", host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the Docker engine at %s answered /_ping with %s", host, resp.Status)
	}
	return nil
}
