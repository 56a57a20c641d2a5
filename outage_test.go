package pglease_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// gate listens on a port of its own, in front of the test database: shut,
// it accepts each connection and closes it at once, as a database that is
// not up yet; open, it forwards connections to the database.
type gate struct {
	ln       net.Listener
	target   string
	open     atomic.Bool
	refused  atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
	shutDown bool
}

func startGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := &gate{ln: ln, target: target}
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(g.close)
	return g
}

func (g *gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		if !g.open.Load() {
			g.refused.Add(1)
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", g.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		g.mu.Lock()
		if g.shutDown {
			g.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		g.conns = append(g.conns, c, s)
		g.mu.Unlock()
		g.wg.Add(2)
		go func() { defer g.wg.Done(); _, _ = io.Copy(s, c); _ = s.Close() }()
		go func() { defer g.wg.Done(); _, _ = io.Copy(c, s); _ = c.Close() }()
	}
}

func (g *gate) close() {
	_ = g.ln.Close()
	g.mu.Lock()
	g.shutDown = true
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// errorsBy counts the Error lines of logger by their component field
// ("" for lines without one).
func errorsBy(logger *capturingLogger) map[string]int {
	n := map[string]int{}
	for _, e := range logger.Entries() {
		if e.Level == "error" {
			c, _ := e.Fields["component"].(string)
			n[c]++
		}
	}
	return n
}

// errorLines returns the messages and fields of the Error lines of
// component (empty: the lines without one).
func errorLines(logger *capturingLogger, component string) []string {
	var out []string
	for _, e := range logger.Entries() {
		if c, _ := e.Fields["component"].(string); e.Level == "error" && c == component {
			out = append(out, fmt.Sprintf("%s: %v %v", e.Msg, e.Err, e.Fields))
		}
	}
	return out
}

// recoveries returns the components that logged their recovery.
func recoveries(logger *capturingLogger) map[string]int {
	n := map[string]int{}
	for _, e := range logger.Entries() {
		if _, ok := e.Fields["outage"]; ok && e.Level == "info" {
			c, _ := e.Fields["component"].(string)
			n[c]++
		}
	}
	return n
}

// TestSubscribeBeforeTheDatabaseIsUp: with the database not up yet,
// Subscribe (InitializeSchema on) returns the channel at once; the set-up
// is retried, logged once at Error; once the database is there, the
// schema is created, the session opened, and messages are delivered, and
// the recovery is logged once.
func TestSubscribeBeforeTheDatabaseIsUp(t *testing.T) {
	parallel(t)
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	g := startGate(t, hostPort(t, testkit.DSN))
	cfg, err := pxConfig(testkit.DSN, g.ln.Addr().String())
	require.NoError(t, err)
	gated, err := pxNew(cfg)
	require.NoError(t, err)
	t.Cleanup(gated.Close)

	logger := newCapturingLogger()
	sub, err := pglease.NewSubscriber(gated, pglease.SubscriberConfig{
		Tables: adapter, InitializeSchema: true, SessionTTL: 2 * time.Second,
		PollInterval: 50 * time.Millisecond, ConsumerGroup: "early",
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	began := time.Now()
	msgs, err := sub.Subscribe(context.Background(), "early")
	require.NoError(t, err, "Subscribe with the database down returns the channel")
	assert.Less(t, time.Since(began), 5*time.Second)
	// Several attempts fail before the database comes up.
	waitFor(t, 30*time.Second, "ten refused connections", func() bool { return g.refused.Load() >= 10 })
	assert.Equal(t, 1, errorsBy(logger)["consumer session"], "the set-up's failures: one Error line")

	g.open.Store(true)
	// The tables exist once the Subscriber set them up.
	pub := newPublisher(t, pool, adapter)
	ids := publishN(t, pub, "early", 3)
	for _, id := range ids {
		select {
		case m := <-msgs:
			assert.Equal(t, id, m.UUID)
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("no message 30s after the database came up")
		}
	}
	waitFor(t, 10*time.Second, "the recovery of the consumer session to be logged", func() bool {
		return recoveries(logger)["consumer session"] == 1
	})
	for c, n := range errorsBy(logger) {
		assert.LessOrEqual(t, n, 1, "Error lines of component %q", c)
	}
	t.Logf("%d connections refused; Error lines by component %v; recoveries %v",
		g.refused.Load(), errorsBy(logger), recoveries(logger))
}

// TestSubscribeWithoutTablesFails: an error that retrying cannot fix (no
// tables, InitializeSchema off) is returned by Subscribe.
func TestSubscribeWithoutTablesFails(t *testing.T) {
	parallel(t)
	pool := newPool(t, 4)
	adapter := pglease.Tables{Schema: pgtest.NewSchema(t, pool, "pglease_test_")}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Subscribe(context.Background(), "t")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the pglease tables are missing")
}

// TestOutageLogsOncePerComponent restarts PostgreSQL under a Subscriber
// that polls, listens, reads and commits: each component logs one Error
// line for the outage at most, and its recovery once.
func TestOutageLogsOncePerComponent(t *testing.T) {
	restart := pgtest.RestartCommand()
	if len(restart) == 0 {
		t.Skip("no way to restart the test PostgreSQL: set PGLEASE_TEST_RESTART_CMD (`make test` does)")
	}
	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	logger := newCapturingLogger()
	cfg := pglease.SubscriberConfig{Tables: adapter, InitializeSchema: true, SessionTTL: 10 * time.Second,
		PollInterval: 20 * time.Millisecond}
	if testkit.PoolDSN != testkit.DSN {
		cfg.ListenConnConfig = directConnConfig(t)
	}
	sub, err := pglease.NewSubscriber(pool, cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })

	var received atomic.Int64
	consume := func(msgs <-chan *message.Message) {
		for m := range msgs {
			received.Add(1)
			m.Ack()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 {
		msgs, err := sub.Subscribe(ctx, "o"+strconv.Itoa(i))
		require.NoError(t, err)
		go consume(msgs)
	}
	st := startStream(t, pub, "o0", 5*time.Millisecond)
	defer st.halt()
	waitFor(t, 30*time.Second, "delivery", func() bool { return received.Load() >= 20 })

	out, err := exec.Command(restart[0], restart[1:]...).CombinedOutput()
	require.NoError(t, err, "restart: %s", out)
	pool.Reset()
	after := received.Load()
	waitFor(t, 60*time.Second, "delivery after the restart", func() bool { return received.Load() >= after+50 })
	failed := errorsBy(logger)
	waitFor(t, 30*time.Second, "every component that logged an Error to log its recovery", func() bool {
		rec := recoveries(logger)
		for c := range failed {
			if rec[c] == 0 && c != "" {
				return false
			}
		}
		return true
	})
	cancel()
	st.halt()
	failed = errorsBy(logger)
	assert.NotEmpty(t, failed, "the restart failed nothing: the test tests nothing")
	for c, n := range failed {
		assert.LessOrEqual(t, n, 1, "Error lines of component %q: %v", c, errorLines(logger, c))
		assert.NotEmpty(t, c, "an Error line without a component: %v", errorLines(logger, c))
	}
	for c, n := range recoveries(logger) {
		assert.Equal(t, 1, n, "recovery lines of component %q", c)
	}
	t.Logf("restart: Error lines by component %v; recoveries %v", failed, recoveries(logger))
}

// hostPort returns the host:port of dsn.
func hostPort(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

// pxConfig is dsn's pool configuration, dialling addr instead.
func pxConfig(dsn, addr string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 4
	return cfg, nil
}

func pxNew(cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	return pgxpool.NewWithConfig(context.Background(), cfg)
}
