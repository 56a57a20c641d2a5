// Package pgtest finds a PostgreSQL server for the tests of this module.
//
// It is meant for test code only: the library's tests and test helpers call
// [DSN] to get a database URL, [RestartCommand] to learn how to restart that
// server (for reconnection tests), and [Terminate] at the end of TestMain.
//
// Where the database comes from, in order:
//
//  1. The environment variable PGLEASE_TEST_DSN, when it is not empty.
//     `make test` (scripts/localpg.sh) sets it to a throwaway local server,
//     together with PGLEASE_TEST_RESTART_CMD.
//  2. A Docker engine, when one answers: a single postgres:15-alpine container
//     is started through testcontainers-go and shared by the whole test
//     process.
//  3. Otherwise [DSN] returns an error that says how to provide a database.
//
// Tests that run pglease behind a transaction pooler call [PgBouncerDSN]
// for the URL of the same database through PgBouncer in transaction mode,
// and [PgBouncerAlive] at the end to check that PgBouncer survived them.
// Only `make test` (scripts/localpg.sh) provides one, in
// PGLEASE_TEST_PGBOUNCER_DSN with PGLEASE_TEST_PGBOUNCER_PIDFILE and
// PGLEASE_TEST_PGBOUNCER_LOG; no container is started for it, and without
// it [PgBouncerDSN] returns an error that says so: such tests fail rather
// than skip.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// EnvDSN names the environment variable that holds the URL of the database
// the tests use, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
const EnvDSN = "PGLEASE_TEST_DSN"

// EnvRestartCmd names the environment variable that holds a command line,
// split on white space, which restarts the server behind [EnvDSN] and returns
// once it accepts connections again.
const EnvRestartCmd = "PGLEASE_TEST_RESTART_CMD"

// Image is the container image started when no [EnvDSN] is given and a
// Docker engine answers.
const Image = "postgres:15-alpine"

const (
	dockerCheckTimeout = 5 * time.Second
	containerTimeout   = 5 * time.Minute
	terminateTimeout   = time.Minute
)

var (
	mu          sync.Mutex
	once        sync.Once
	ctr         *tcpostgres.PostgresContainer
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
// it at the end of TestMain, after m.Run. It is a no-op when no container was
// started, and safe to call more than once.
func Terminate() {
	mu.Lock()
	c := ctr
	ctr = nil
	if c != nil {
		ctrFinished = true
	}
	mu.Unlock()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
	defer cancel()
	if err := c.Terminate(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: terminating the PostgreSQL container: %v\n", err)
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
	dsn, id, c, err := runContainer()
	mu.Lock()
	defer mu.Unlock()
	ctrDSN, ctrID, ctr, ctrErr = dsn, id, c, err
}

func runContainer() (dsn, id string, c *tcpostgres.PostgresContainer, err error) {
	if err := dockerAvailable(dockerCheckTimeout); err != nil {
		return "", "", nil, noDatabaseError(err)
	}

	port, err := freePort()
	if err != nil {
		return "", "", nil, fmt.Errorf("pgtest: picking a host port for the PostgreSQL container: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), containerTimeout)
	defer cancel()

	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pgtest: starting the PostgreSQL container panicked: %v", r)
		}
		if err != nil && c != nil {
			tctx, tcancel := context.WithTimeout(context.Background(), terminateTimeout)
			defer tcancel()
			_ = c.Terminate(tctx)
			c = nil
		}
	}()

	// A fixed host port, so that `docker restart` keeps the address.
	pgPort := network.MustParsePort("5432/tcp")
	c, err = tcpostgres.Run(ctx, Image,
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs(
			"-c", "max_connections=400",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
			"-c", "shared_preload_libraries=pg_stat_statements",
		),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = network.PortMap{
				pgPort: {{HostPort: strconv.Itoa(port)}},
			}
			// Docker's default of 64 MiB for /dev/shm is tight for
			// PostgreSQL's dynamic shared memory.
			hc.ShmSize = 256 << 20
		}),
	)
	if err != nil {
		return "", "", c, fmt.Errorf("pgtest: starting the PostgreSQL container (%s): %w", Image, err)
	}
	dsn, err = c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", "", c, fmt.Errorf("pgtest: PostgreSQL container address: %w", err)
	}
	return dsn, c.GetContainerID(), c, nil
}

// dockerAvailable reports, within timeout, whether a Docker engine answers.
// It never panics and never blocks longer than about timeout.
func dockerAvailable(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	result := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				result <- fmt.Errorf("docker check panicked: %v", r)
			}
		}()
		provider, err := testcontainers.NewDockerProvider()
		if err != nil {
			result <- err
			return
		}
		// Health closes the provider.
		result <- provider.Health(ctx)
	}()

	select {
	case err := <-result:
		return err
	case <-time.After(timeout + time.Second):
		return fmt.Errorf("no answer from the Docker engine within %v", timeout)
	}
}

// freePort returns a TCP port that nothing listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
