package main

// Redis Streams, a peer: watermill-redisstream against
// Debian's redis-server, which the benchmark starts for each run on
// 127.0.0.1 and a free port with its files in a temporary directory, AOF
// on with appendfsync everysec and RDB snapshots off, and stops (SIGTERM,
// directory removed) when the run ends. scripts/install-deps.sh redis,
// which `make bench` runs first when it is missing, installs redis-server.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

const (
	redisName = "Redis Streams"

	// redisReadyTimeout bounds the wait for a started server to answer PING.
	redisReadyTimeout = 10 * time.Second
	// redisStopTimeout is how long a server gets to exit after SIGTERM
	// (it writes and fsyncs its AOF) before it is killed.
	redisStopTimeout = 10 * time.Second
	// redisStartAttempts: a port found free may be taken before the server
	// binds it.
	redisStartAttempts = 5
)

// findRedisServer returns the redis-server program to run: path when
// given, else redis-server on PATH, else Debian's /usr/bin/redis-server.
func findRedisServer(path string) (string, error) {
	if path != "" {
		return exec.LookPath(path)
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	// Debian's path, for a user whose PATH lacks /usr/bin.
	if p, err := exec.LookPath("/usr/bin/redis-server"); err == nil {
		return p, nil
	}
	return "", errors.New("no redis-server on PATH or in /usr/bin (scripts/install-deps.sh redis installs it; `make bench` runs that when it is missing)")
}

// findRedis finds the redis-server program of the Redis peer (-redis-server)
// and its version, for the runs and the report.
func (e *env) findRedis(info *machineInfo) error {
	program, err := findRedisServer(e.cfg.redisServer)
	if err != nil {
		return err
	}
	version, err := redisServerVersion(program)
	if err != nil {
		return err
	}
	e.redisServer, info.redisServer = program, version
	return nil
}

var redisVersionRE = regexp.MustCompile(`\bv=(\S+)`)

// redisServerVersion is the version redis-server --version prints.
func redisServerVersion(program string) (string, error) {
	out, err := exec.Command(program, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", program, err)
	}
	return parseRedisVersion(string(out)), nil
}

// parseRedisVersion reads the version from redis-server --version
// ("Redis server v=7.0.15 sha=..."); unknown when it is not there.
func parseRedisVersion(s string) string {
	if m := redisVersionRE.FindStringSubmatch(s); m != nil {
		return m[1]
	}
	return "unknown"
}

// redisArgs are the arguments of a server listening on 127.0.0.1:port
// with its files in dir: AOF on, fsync once per second, no RDB snapshots
// (they would fork and write the whole data set now and then), logging to
// standard output.
func redisArgs(port int, dir string) []string {
	return []string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--protected-mode", "yes",
		"--dir", dir,
		"--appendonly", "yes",
		"--appendfsync", "everysec",
		"--save", "",
		"--daemonize", "no",
		"--logfile", "",
		"--loglevel", "warning",
	}
}

type redisBackend struct{}

func (redisBackend) name() string  { return redisName }
func (redisBackend) short() string { return "redis" }

// open starts a server of its own for the run; ns is not used (the server
// holds nothing else).
func (redisBackend) open(ctx context.Context, e *env, _ string) (handle, error) {
	if e.redisServer == "" {
		return nil, errors.New("no redis-server program")
	}
	dir, err := os.MkdirTemp("", "pglease-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("create the Redis directory: %w", err)
	}
	srv, err := startRedis(ctx, e.redisServer, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &redisHandle{e: e, srv: srv, dir: dir}, nil
}

// redisServerProc is one running redis-server.
type redisServerProc struct {
	cmd    *exec.Cmd
	addr   string
	log    *bytes.Buffer // its standard output and error
	exited chan struct{} // closed when it has exited
}

// startRedis starts redis-server in dir on a free port of 127.0.0.1 and
// waits until it answers PING.
func startRedis(ctx context.Context, program, dir string) (*redisServerProc, error) {
	var lastErr error
	for range redisStartAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		srv, err := startRedisOn(ctx, program, dir, port)
		if err == nil {
			return srv, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

func startRedisOn(ctx context.Context, program, dir string, port int) (*redisServerProc, error) {
	cmd := exec.Command(program, redisArgs(port, dir)...)
	cmd.Dir = dir
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	stopWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", program, err)
	}
	srv := &redisServerProc{cmd: cmd, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: &log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(srv.exited)
	}()
	client := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1})
	defer client.Close()
	deadline := time.Now().Add(redisReadyTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := client.Ping(pctx).Err()
		cancel()
		if err == nil {
			return srv, nil
		}
		select {
		case <-srv.exited:
			return nil, fmt.Errorf("redis-server exited at start: %s", strings.TrimSpace(log.String()))
		case <-ctx.Done():
			_ = srv.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = srv.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING within %s: %v", srv.addr, redisReadyTimeout, err)
		}
	}
}

// stop sends SIGTERM (Redis then fsyncs its AOF and exits) and waits for
// the server to exit; after redisStopTimeout it kills it.
func (s *redisServerProc) stop() error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return nil
	case <-time.After(redisStopTimeout):
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	return fmt.Errorf("redis-server on %s did not exit within %s of SIGTERM; killed", s.addr, redisStopTimeout)
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type redisHandle struct {
	e   *env
	srv *redisServerProc
	dir string
}

// client is a go-redis client with its defaults (a pool of 10 connections
// per CPU); each Publisher and Subscriber gets one of its own, since they
// close it on Close.
func (h *redisHandle) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: h.srv.addr})
}

// publisher: watermill-redisstream's default configuration (one XADD per
// message, streams not capped).
func (h *redisHandle) publisher() (message.Publisher, error) {
	return redisstream.NewPublisher(redisstream.PublisherConfig{Client: h.client()}, h.e.logger)
}

// subscriber: the default configuration with the consumer group of the
// PostgreSQL backends (created at the start of the stream on Subscribe).
func (h *redisHandle) subscriber() (message.Subscriber, error) {
	return redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        h.client(),
		ConsumerGroup: consumerGroup,
	}, h.e.logger)
}

func (h *redisHandle) member() (message.Subscriber, func() error, error) {
	return nil, nil, errNoMembers
}

// initTopic does nothing: XADD creates a stream, and Subscribe creates the
// consumer group (and the stream, if need be).
func (h *redisHandle) initTopic(_ context.Context, _ string) error { return nil }

// close stops the server and removes its files.
func (h *redisHandle) close(_ context.Context) error {
	err := h.srv.stop()
	if rerr := os.RemoveAll(h.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("remove %s: %w", filepath.Base(h.dir), rerr))
	}
	return err
}
