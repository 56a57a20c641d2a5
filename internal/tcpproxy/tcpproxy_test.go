package tcpproxy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/tcpproxy"
)

// silence is how long a frozen connection is watched for bytes that must
// not arrive.
const silence = 300 * time.Millisecond

// ioTimeout bounds every read and write that must succeed.
const ioTimeout = 5 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Terminate()
	os.Exit(code)
}

func TestProxy(t *testing.T) {
	tests := []struct {
		name string
		// sink: the target accepts and never reads, instead of echoing.
		sink bool
		run  func(t *testing.T, p *tcpproxy.Proxy)
	}{
		{
			name: "forward",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				c := dial(t, p)
				roundTrip(t, c, "hello")
				roundTrip(t, c, strings.Repeat("x", 200<<10))
				waitFor(t, "1 connection", func() bool { return p.Conns() == 1 })
			},
		},
		{
			name: "freeze: writes succeed, nothing arrives, the connection stays open",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				c := dial(t, p)
				roundTrip(t, c, "before")
				p.Freeze()
				writeAll(t, c, "lost")
				expectSilence(t, c)
				// Still open, still silent.
				writeAll(t, c, strings.Repeat("y", 1<<20))
				expectSilence(t, c)
				if n := p.Conns(); n != 1 {
					t.Fatalf("Conns() = %d after Freeze, want 1", n)
				}
			},
		},
		{
			name: "a connection after freeze forwards",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				frozen := dial(t, p)
				roundTrip(t, frozen, "before")
				p.Freeze()
				c := dial(t, p)
				roundTrip(t, c, "after")
				waitFor(t, "2 connections", func() bool { return p.Conns() == 2 })
				writeAll(t, frozen, "lost")
				expectSilence(t, frozen)
				roundTrip(t, c, "still")
			},
		},
		{
			name: "unfreeze resumes",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				c := dial(t, p)
				roundTrip(t, c, "before")
				p.Freeze()
				expectSilence(t, c)
				p.Unfreeze()
				roundTrip(t, c, "after")
			},
		},
		{
			name: "hold: a new connection waits until release, an existing one goes on",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				before := dial(t, p)
				roundTrip(t, before, "before")
				p.Hold()
				p.Hold() // again: still one hold
				held := dial(t, p)
				writeAll(t, held, "waits")
				expectSilence(t, held)
				roundTrip(t, before, "still")
				p.Release()
				expectRead(t, held, "waits")
				roundTrip(t, held, "after")
				p.Release() // again: a no-op
				roundTrip(t, dial(t, p), "new")
			},
		},
		{
			name: "close ends a held connection",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				p.Hold()
				c := dial(t, p)
				waitFor(t, "1 connection", func() bool { return p.Conns() == 1 })
				closeProxy(t, p)
				_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
				if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("read after Close = %d, %v, want the connection closed", n, err)
				}
			},
		},
		{
			name: "a peer closing a frozen connection ends it",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				c := dial(t, p)
				roundTrip(t, c, "before")
				p.Freeze()
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "no connection", func() bool { return p.Conns() == 0 })
			},
		},
		{
			name: "freeze cuts short a write the target does not read",
			sink: true,
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				c := dial(t, p)
				// Fill the path until a write times out: the proxy is
				// then blocked writing to the target.
				chunk := bytes.Repeat([]byte("z"), 64<<10)
				deadline := time.Now().Add(time.Minute)
				for {
					if time.Now().After(deadline) {
						t.Fatal("writes never blocked")
					}
					_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
					if _, err := c.Write(chunk); err != nil {
						if !errors.Is(err, os.ErrDeadlineExceeded) {
							t.Fatalf("write: %v", err)
						}
						break
					}
				}
				done := make(chan struct{})
				go func() {
					p.Freeze()
					close(done)
				}()
				select {
				case <-done:
				case <-time.After(ioTimeout):
					t.Fatal("Freeze did not return while a write to the target was blocked")
				}
				// The proxy drops what arrives now: writes go through.
				writeAll(t, c, strings.Repeat("w", 4<<20))
				if n := p.Conns(); n != 1 {
					t.Fatalf("Conns() = %d after Freeze, want 1", n)
				}
			},
		},
		{
			name: "close ends every connection",
			run: func(t *testing.T, p *tcpproxy.Proxy) {
				frozen := dial(t, p)
				roundTrip(t, frozen, "a")
				p.Freeze()
				c := dial(t, p)
				roundTrip(t, c, "b")
				closeProxy(t, p)
				if n := p.Conns(); n != 0 {
					t.Fatalf("Conns() = %d after Close, want 0", n)
				}
				for _, conn := range []net.Conn{frozen, c} {
					_ = conn.SetReadDeadline(time.Now().Add(ioTimeout))
					if n, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("read after Close = %d, %v, want the connection closed", n, err)
					}
				}
				if _, err := net.DialTimeout("tcp", p.Addr(), ioTimeout); err == nil {
					t.Fatal("the proxy still accepts connections after Close")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := echoServer(t)
			if tt.sink {
				target = sinkServer(t)
			}
			p, err := tcpproxy.Start(target)
			if err != nil {
				t.Fatal(err)
			}
			tt.run(t, p)
			closeProxy(t, p)
			closeProxy(t, p) // again: a no-op
			noProxyGoroutines(t)
		})
	}
}

// TestPostgres puts the proxy between pgx and PostgreSQL: a frozen
// connection's query runs into its deadline, and a new connection through
// the proxy works.
func TestPostgres(t *testing.T) {
	pgtest.SkipShort(t)
	dsn, err := pgtest.DSN()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		t.Fatalf("%s reaches PostgreSQL through a Unix socket (%s); this test needs TCP", pgtest.EnvDSN, cfg.Host)
	}
	p, err := tcpproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	portNum, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(portNum), nil

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer closeConn(conn)
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("query through the proxy: %v", err)
	}

	p.Freeze()
	qctx, qcancel := context.WithTimeout(ctx, time.Second)
	defer qcancel()
	start := time.Now()
	var one int
	err = conn.QueryRow(qctx, "SELECT 1").Scan(&one)
	if err == nil {
		t.Fatal("a query on a frozen connection succeeded")
	}
	if elapsed := time.Since(start); elapsed < 900*time.Millisecond {
		t.Fatalf("the query on the frozen connection failed after %v, before its deadline: %v", elapsed, err)
	}
	t.Logf("query on the frozen connection: %v", err)

	conn2, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through the proxy after Freeze: %v", err)
	}
	defer closeConn(conn2)
	var pid2 int
	if err := conn2.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid2); err != nil {
		t.Fatalf("query on a new connection after Freeze: %v", err)
	}
	if pid2 == pid {
		t.Fatalf("the new connection has the backend of the frozen one (%d)", pid)
	}

	// pgx gave up the frozen connection, but waits up to 15 s for the
	// server to answer its Terminate, which the proxy drops; Close ends
	// it.
	closeProxy(t, p)
	noProxyGoroutines(t)
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// echoServer starts a server on 127.0.0.1 that writes back what it reads,
// stopped at the end of the test; it returns its address.
func echoServer(t *testing.T) string {
	return server(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// sinkServer starts a server that accepts connections and never reads.
func sinkServer(t *testing.T) string {
	return server(t, nil)
}

func server(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if handle != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					handle(c)
					_ = c.Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

func dial(t *testing.T, p *tcpproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func writeAll(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
	if n, err := c.Write([]byte(msg)); err != nil || n != len(msg) {
		t.Fatalf("write of %d bytes = %d, %v", len(msg), n, err)
	}
}

// roundTrip writes msg and reads it back from the echo server.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	writeAll(t, c, msg)
	expectRead(t, c, msg)
}

// expectRead reads len(msg) bytes from c and checks that they are msg.
func expectRead(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %d bytes: %v", len(msg), err)
	}
	if string(got) != msg {
		t.Fatalf("read back %.20q..., want %.20q...", got, msg)
	}
}

// expectSilence checks that nothing arrives on c for a while, and that c
// is not closed meanwhile.
func expectSilence(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(silence))
	n, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a frozen connection = %d bytes, %v; want nothing until the deadline", n, err)
	}
}

// waitFor polls cond until it holds, failing the test after ioTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(ioTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closeProxy closes p, failing the test if Close fails or does not return
// within ioTimeout.
func closeProxy(t *testing.T, p *tcpproxy.Proxy) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Close did not return")
	}
}

// noProxyGoroutines fails the test unless the goroutines of the proxy are
// gone. Close waits for them, but one that called WaitGroup.Done may still
// be on its way out for a moment.
func noProxyGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(ioTimeout)
	for {
		left := proxyGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines of the proxy left after Close:\n%s", strings.Join(left, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// proxyGoroutines returns the stacks of the goroutines that run the
// proxy's code.
func proxyGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/tcpproxy.(*") {
			left = append(left, g)
		}
	}
	return left
}

// TestDelay: with Options.Delay each direction holds what it reads for
// that long, so a round trip takes at least twice the delay; megabytes
// written in pieces of random sizes while the other side reads come back
// complete and in order; a peer that reads nothing holds back a bounded
// amount, not everything the sender writes; and Close ends connections
// with data queued, leaving no goroutine.
func TestDelay(t *testing.T) {
	const delay = 40 * time.Millisecond
	if _, err := tcpproxy.StartOptions("127.0.0.1:1", tcpproxy.Options{Delay: -time.Second}); err == nil {
		t.Fatal("a negative delay was accepted")
	}
	if _, err := tcpproxy.StartOptions("127.0.0.1:1", tcpproxy.Options{Delay: tcpproxy.MaxDelay + 1}); err == nil {
		t.Fatal("a delay above MaxDelay was accepted")
	}

	t.Run("round trip", func(t *testing.T) {
		p, err := tcpproxy.StartOptions(echoServer(t), tcpproxy.Options{Delay: delay})
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, p)
		roundTrip(t, c, "connected") // the dial of the target is not timed
		for i := range 5 {
			start := time.Now()
			roundTrip(t, c, "ping"+strconv.Itoa(i))
			if took := time.Since(start); took < 2*delay {
				t.Fatalf("round trip %d took %s through a proxy that delays each direction by %s", i, took, delay)
			}
		}
		closeProxy(t, p)
		noProxyGoroutines(t)
	})

	t.Run("complete and in order", func(t *testing.T) {
		p, err := tcpproxy.StartOptions(echoServer(t), tcpproxy.Options{Delay: delay})
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, p)
		const size = 8 << 20
		want := make([]byte, size)
		for i := range want {
			// A sequence whose pieces do not repeat at any short period:
			// a reordered or repeated piece shows.
			want[i] = byte(i*7 + i>>8 + i>>16)
		}
		rng := uint64(1)
		writeErr := make(chan error, 1)
		go func() {
			_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			for off := 0; off < size; {
				rng = rng*6364136223846793005 + 1442695040888963407
				n := min(1+int(rng>>33)%(100<<10), size-off)
				if _, err := c.Write(want[off : off+n]); err != nil {
					writeErr <- err
					return
				}
				off += n
			}
			writeErr <- nil
		}()
		got := make([]byte, size)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("read back %d bytes: %v", size, err)
		}
		if err := <-writeErr; err != nil {
			t.Fatalf("write: %v", err)
		}
		if i := firstDifference(got, want); i >= 0 {
			t.Fatalf("byte %d of %d came back as %d, want %d", i, size, got[i], want[i])
		}
		closeProxy(t, p)
		noProxyGoroutines(t)
	})

	t.Run("bounded, closed with data queued", func(t *testing.T) {
		p, err := tcpproxy.StartOptions(sinkServer(t), tcpproxy.Options{Delay: delay})
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, p)
		// The target reads nothing: what the client manages to write is
		// what the kernel's buffers and the proxy's queue hold.
		const limit = 64 << 20
		piece := make([]byte, 1<<20)
		written := 0
		for written < limit {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			n, err := c.Write(piece)
			written += n
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				t.Fatalf("write: %v", err)
			}
		}
		if written >= limit {
			t.Fatalf("a target that reads nothing was sent %d MiB through the proxy without the writer blocking", written>>20)
		}
		t.Logf("held back for a target that reads nothing: %d MiB", written>>20)
		closeProxy(t, p)
		noProxyGoroutines(t)
	})
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
