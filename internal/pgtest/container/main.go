// Command container starts the PostgreSQL container of the tests when no
// PGLEASE_TEST_DSN is set and a Docker engine answers; package pgtest
// runs it (`go run .` in this directory). It is a module of its own so
// that the library's go.mod does not require testcontainers-go and the
// Docker client.
//
// It starts one PostgreSQL container (postgres:15-alpine, or the image of
// $PGLEASE_TEST_IMAGE, e.g. postgres:17 or postgres:18) on a fixed host
// port (so that
// `docker restart` keeps the address), writes one line of JSON to stdout,
// {"dsn": "...", "id": "..."} or {"error": "..."}, then waits until its
// standard input is closed (the test process ended or called
// pgtest.Terminate) or it gets SIGINT/SIGTERM, and removes the container.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// defaultImage is the container image when PGLEASE_TEST_IMAGE is not
// set; package pgtest names both in its docs.
const defaultImage = "postgres:15-alpine"

// envImage names the environment variable that chooses another image:
// an official postgres image of another major version (postgres:17,
// postgres:18-alpine), or one built on it (its entrypoint, its
// POSTGRES_* variables and pg_stat_statements are used).
const envImage = "PGLEASE_TEST_IMAGE"

const (
	startTimeout     = 5 * time.Minute
	terminateTimeout = time.Minute
)

type reply struct {
	DSN   string `json:"dsn,omitempty"`
	ID    string `json:"id,omitempty"`
	Error string `json:"error,omitempty"`
}

func main() {
	c, r := start()
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if c == nil {
		os.Exit(1)
	}
	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stdinClosed:
	case <-sig:
	}
	ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
	err := c.Terminate(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest container: terminating the PostgreSQL container: %v\n", err)
		os.Exit(1)
	}
}

func start() (c *tcpostgres.PostgresContainer, r reply) {
	port, err := freePort()
	if err != nil {
		return nil, reply{Error: fmt.Sprintf("picking a host port for the PostgreSQL container: %v", err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			r = reply{Error: fmt.Sprintf("starting the PostgreSQL container panicked: %v", p)}
		}
		if r.Error != "" && c != nil {
			tctx, tcancel := context.WithTimeout(context.Background(), terminateTimeout)
			defer tcancel()
			_ = c.Terminate(tctx)
			c = nil
		}
	}()
	image := defaultImage
	if v := os.Getenv(envImage); v != "" {
		image = v
	}
	pgPort := network.MustParsePort("5432/tcp")
	c, err = tcpostgres.Run(ctx, image,
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
		return c, reply{Error: fmt.Sprintf("starting the PostgreSQL container (%s): %v", image, err)}
	}
	dsn, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return c, reply{Error: fmt.Sprintf("PostgreSQL container address: %v", err)}
	}
	return c, reply{DSN: dsn, ID: c.GetContainerID()}
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
