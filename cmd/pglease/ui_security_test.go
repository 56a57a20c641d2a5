package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// TestUIReadsNeedTheToken: without the token every page asks for it and
// shows nothing of the database; the token in the URL or in the form
// leaves a cookie derived from it (not the token) and opens the console;
// a wrong token and a form from another origin are refused.
func TestUIReadsNeedTheToken(t *testing.T) {
	f := newFixture(t)
	f.publish("orders", 1)
	ts, srv, _ := newUITest(t, f, false)

	b := newBrowserWithoutToken(t, ts.URL)
	for _, path := range []string{"/", "/topics", "/topic?name=orders", "/group?name=g", "/message?topic=orders&uuid=x"} {
		code, body := b.get(path)
		assert.Equal(t, http.StatusUnauthorized, code, path)
		assert.Contains(t, body, `id="open-form"`, path)
		assert.NotContains(t, body, "orders", path)
	}
	code, body := b.get("/topics?token=wrong-token-wrong-token")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "not the console&#39;s token")

	b.origin = "http://evil.example"
	code, _ = b.post("/open", url.Values{"token": {testToken}})
	assert.Equal(t, http.StatusForbidden, code, "a form of another site")
	code, _ = b.get("/topics")
	assert.Equal(t, http.StatusUnauthorized, code)
	b.origin = ts.URL
	code, body = b.post("/open", url.Values{"token": {testToken}})
	require.Equal(t, http.StatusOK, code, body)
	code, body = b.get("/topics")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "orders")

	b = newBrowserWithoutToken(t, ts.URL)
	code, body = b.get("/topics?token=" + testToken)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "orders")
	u, err := url.Parse(ts.URL)
	require.NoError(t, err)
	cookies := b.client.Jar.Cookies(u)
	require.Len(t, cookies, 1)
	assert.Regexp(t, `^[0-9a-f]{64}$`, cookies[0].Value, "a random session identifier")
	assert.NotContains(t, cookies[0].Value, testToken)
	mac := hmac.New(sha256.New, []byte(testToken))
	mac.Write([]byte("pglease ui access"))
	assert.NotEqual(t, hex.EncodeToString(mac.Sum(nil)), cookies[0].Value, "not derived from the token")
	_, ok := srv.sessions.get(cookies[0].Value, false)
	assert.True(t, ok, "a session the server knows")
	other := newBrowser(t, ts.URL)
	assert.NotEqual(t, cookies[0].Value, other.client.Jar.Cookies(u)[0].Value, "each opening its own session")
}

// TestUIHostAllowlistAndOrigin: a console on every address answers to IP
// addresses, localhost and its names, never to another name (what a page
// of another site sends once it pointed its name at the console: DNS
// rebinding); a write's Origin must be the address the request was sent
// to, itself allowed.
func TestUIHostAllowlistAndOrigin(t *testing.T) {
	f := newFixture(t)
	insp, err := admin.NewInspector(f.pool, f.tables)
	require.NoError(t, err)
	srv, err := newUIServer(uiConfig{insp: insp, pool: f.pool, tables: f.tables, allowWrites: true, warnAfter: defaultWarnAfter,
		log: io.Discard, token: testToken, hosts: []string{"0.0.0.0", "Console.Example"}})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(ts.URL, "http://"))
	require.NoError(t, err)
	do := func(method, host, origin string) (int, string) {
		req, err := http.NewRequest(method, ts.URL+"/signin", strings.NewReader(url.Values{"name": {"alice"}, "token": {testToken}}.Encode()))
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		req.AddCookie(readCookie(srv))
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "console.example.attacker.example"} {
		code, body := do(http.MethodGet, host, "")
		assert.Equal(t, http.StatusMisdirectedRequest, code, host)
		assert.Contains(t, body, "answers only to IP addresses", host)
	}
	for _, host := range []string{"10.0.0.1:" + port, "127.0.0.1:" + port, "localhost", "console.example:" + port, "CONSOLE.EXAMPLE", "[::1]:" + port} {
		code, body := do(http.MethodGet, host, "")
		assert.Equal(t, http.StatusOK, code, "%s: %s", host, body)
	}
	host := "console.example:" + port
	for _, origin := range []string{"http://attacker.example:" + port, "http://localhost:" + port, "http://console.example:1",
		"https://" + host, "null"} {
		code, _ := do(http.MethodPost, host, origin)
		assert.Equal(t, http.StatusForbidden, code, "Origin %s for Host %s", origin, host)
	}
	code, body := do(http.MethodPost, host, "http://"+host)
	assert.Equal(t, http.StatusSeeOther, code, body)
}

// TestUIMessagePageReadsABoundedPrefix: the page of a 64 MiB message
// reads and renders the first MiB of it (marked as cut), in text or in
// hex, and the allocations of the request stay far below the payload's
// size; the page needs its topic.
func TestUIMessagePageReadsABoundedPrefix(t *testing.T) {
	const size = 64 << 20
	f := newFixture(t)
	_, err := f.pool.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{f.schema, pglease.DefaultMessagesTable}.Sanitize()+
		` (topic, uuid, payload) VALUES ('big', 'big-1', convert_to(repeat('x', $1), 'UTF8'))`, size)
	require.NoError(t, err)
	ts, _, _ := newUITest(t, f, false)
	b := newBrowser(t, ts.URL)

	for _, view := range []string{"text", "hex"} {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		code, body := b.get("/message?topic=big&uuid=big-1&view=" + view)
		runtime.ReadMemStats(&after)
		require.Equal(t, http.StatusOK, code, body)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("view %s: the request allocated %.1f MiB, the page is %.1f MiB", view, float64(allocated)/(1<<20), float64(len(body))/(1<<20))
		assert.Less(t, allocated, uint64(48<<20), "allocated by one request for a %d MiB message", size>>20)
		assert.Contains(t, body, fmt.Sprintf("of %d bytes", size))
		assert.Less(t, len(body), 8<<20)
	}
	code, _ := b.get("/message?uuid=big-1")
	assert.Equal(t, http.StatusBadRequest, code, "no topic")
	code, body := b.get("/topic?name=big&uuid=big-1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="found"`)
}

// TestUIServerDisconnectsSlowClients: clients that send their headers or
// their body a byte at a time, keep an idle connection, or send too large
// headers are disconnected within the server's limits.
func TestUIServerDisconnectsSlowClients(t *testing.T) {
	limits := uiLimits{readHeader: 300 * time.Millisecond, read: time.Second, write: 5 * time.Second, idle: 500 * time.Millisecond,
		maxHeaderBytes: 4 << 10}
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}), limits)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	addr := ln.Addr().String()

	// closedWithin reports whether the server closed conn before the
	// deadline (reading what it sends until the end).
	closedWithin := func(conn net.Conn, d time.Duration) error {
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(d)))
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("still connected after %s", d)
		}
		return nil
	}
	// trickle writes a byte of s every 50 ms until it fails or stop.
	trickle := func(conn net.Conn, s string, stop <-chan struct{}) {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{s[i%len(s)]}); err != nil {
				return
			}
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	check := func(what string, n int, margin time.Duration, start func(net.Conn)) {
		var cwg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			start(conn)
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				if err := closedWithin(conn, margin); err != nil {
					errs <- err
				}
			}()
		}
		cwg.Wait()
		close(errs)
		var open int
		for range errs {
			open++
		}
		assert.Zero(t, open, "%s: %d of %d clients still connected %s after they started", what, open, n, margin)
	}

	check("slow headers", 50, limits.readHeader+2*time.Second, func(conn net.Conn) {
		_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
		require.NoError(t, err)
		wg.Add(1)
		go func() { defer wg.Done(); trickle(conn, "X-Slow: aaaaaaaa\r\n", stop) }()
	})
	check("slow body", 10, limits.read+2*time.Second, func(conn net.Conn) {
		_, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n")
		require.NoError(t, err)
		wg.Add(1)
		go func() { defer wg.Done(); trickle(conn, "a", stop) }()
	})
	check("idle keep-alive", 10, limits.idle+2*time.Second, func(conn net.Conn) {
		_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	})

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

// TestUIRedirectsOnlyToTheConsole: after the token in the address, the
// console sends the browser to the same page of the console without the
// token, and for any other path to the overview: never to another site,
// whatever the path looks like (two slashes, a backslash, encoded).
func TestUIRedirectsOnlyToTheConsole(t *testing.T) {
	f := newFixture(t)
	ts, _, _ := newUITest(t, f, false)
	base, err := url.Parse(ts.URL)
	require.NoError(t, err)
	location := func(rawPath string) string {
		t.Helper()
		conn, err := net.Dial("tcp", base.Host)
		require.NoError(t, err)
		defer conn.Close()
		_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", rawPath, base.Host)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, rawPath)
		return resp.Header.Get("Location")
	}
	for _, p := range []string{"//evil.example/x", `/\evil.example/x`, "/%2F%2Fevil.example/x", "/%5Cevil.example/x",
		"///evil.example/x", "/%2Fevil.example", "/.//evil.example", `/\/evil.example`, "/%09/evil.example", "/http://evil.example"} {
		loc := location(p + "?token=" + testToken)
		assert.Equal(t, "/", loc, "path %s", p)
		target, err := base.Parse(loc)
		require.NoError(t, err)
		assert.Equal(t, base.Host, target.Host, "path %s", p)
	}
	assert.Equal(t, "/topic?name=orders", location("/topic?name=orders&token="+testToken))
	assert.Equal(t, "/topics", location("/topics?token="+testToken))
	assert.Equal(t, "/?name=%2F%2Fevil.example", location("//evil.example?name=%2F%2Fevil.example&token="+testToken),
		"the query stays a query")
}

// TestUINoticeComesFromTheServer: the notice bar shows only what the
// console put there after a write, once; text in the address is not shown.
func TestUINoticeComesFromTheServer(t *testing.T) {
	f := newFixture(t)
	ts, _, _ := newUITest(t, f, true)
	b := newBrowser(t, ts.URL)
	const forged = "Your session expired: sign in again at evil.example"
	code, body := b.get("/?notice=" + url.QueryEscape(forged))
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "evil.example")
	assert.NotContains(t, body, `id="notice"`)

	code, body = b.post("/signin", url.Values{"name": {"alice"}, "token": {testToken}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<p class="notice" id="notice">Signed in as alice: writes are on.</p>`)
	code, body = b.get("/")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, `id="notice"`, "shown once")
}

// TestUIWriteSessions: signing in starts a random write session whose
// cookie nothing else can make (not from the token); it expires; signing
// out ends it on the server, so that a copy of the cookie no longer
// writes; a session identifier set in the browser before signing in is
// not the one signed in; the log names the operator with the name given at
// sign-in, whatever cookie the browser sends.
func TestUIWriteSessions(t *testing.T) {
	f := newFixture(t)
	f.publish("orders", 1)
	f.ok("reset-offsets", "--group", "billing", "--topic", "orders", "--to-earliest")
	ts, srv, log := newUITest(t, f, true)
	base, err := url.Parse(ts.URL)
	require.NoError(t, err)
	now := time.Now()
	var clockMu sync.Mutex
	srv.sessions.now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	advance := func(d time.Duration) { clockMu.Lock(); defer clockMu.Unlock(); now = now.Add(d) }

	b := newBrowser(t, ts.URL)
	// A write session cookie made from the token, as it was derived before.
	mac := hmac.New(sha256.New, []byte(testToken))
	mac.Write([]byte("pglease ui writes"))
	b.client.Jar.SetCookies(base, []*http.Cookie{{Name: writeCookie, Value: hex.EncodeToString(mac.Sum(nil))},
		{Name: "pglease_ui_name", Value: "mallory"}})
	csrfMAC := hmac.New(sha256.New, []byte(testToken))
	csrfMAC.Write([]byte("pglease ui forms"))
	preview := url.Values{"group": {"billing"}, "topic": {"orders"}, "to": {"earliest"}, "csrf": {hex.EncodeToString(csrfMAC.Sum(nil))}}
	code, body := b.post("/actions/reset", preview)
	assert.Equal(t, http.StatusForbidden, code, "a cookie derived from the token")
	assert.Contains(t, body, "sign in to write first")

	// A session identifier planted before signing in.
	planted := strings.Repeat("ab", 32)
	b.client.Jar.SetCookies(base, []*http.Cookie{{Name: writeCookie, Value: planted}})
	code, body = b.post("/signin", url.Values{"name": {"alice"}, "token": {testToken}})
	require.Equal(t, http.StatusOK, code, body)
	var session string
	for _, c := range b.client.Jar.Cookies(base) {
		if c.Name == writeCookie {
			session = c.Value
		}
	}
	assert.Regexp(t, `^[0-9a-f]{64}$`, session)
	assert.NotEqual(t, planted, session)
	preview.Set("csrf", b.csrf())
	code, body = b.post("/actions/reset", preview)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "reset-confirm")

	// The name cookie of the old console is not the operator.
	b.client.Jar.SetCookies(base, []*http.Cookie{{Name: "pglease_ui_name", Value: "mallory"}})
	code, body = b.post("/actions/reset", preview)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, log.String(), `reset-offsets group="billing" topic="orders" to=earliest force=false by "alice"`)
	assert.NotContains(t, log.String(), "mallory")

	// Another browser with a copy of the cookie writes while the session
	// lives, and not after the operator signed out.
	thief := newBrowser(t, ts.URL)
	thief.client.Jar.SetCookies(base, []*http.Cookie{{Name: writeCookie, Value: session}})
	code, body = thief.post("/actions/reset", preview)
	require.Equal(t, http.StatusOK, code, "the copy works while the session lives: %s", body)
	code, body = b.post("/signout", url.Values{"csrf": {preview.Get("csrf")}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Signed out.")
	code, body = thief.post("/actions/reset", preview)
	assert.Equal(t, http.StatusForbidden, code, "a cookie from before sign-out")
	assert.Contains(t, body, "sign in to write first")

	// A session expires.
	code, body = b.post("/signin", url.Values{"name": {"bob"}, "token": {testToken}})
	require.Equal(t, http.StatusOK, code, body)
	preview.Set("csrf", b.csrf())
	code, body = b.post("/actions/reset", preview)
	require.Equal(t, http.StatusOK, code, body)
	advance(writeSessionTTL + time.Second)
	code, body = b.post("/actions/reset", preview)
	assert.Equal(t, http.StatusForbidden, code, "an expired write session: %s", body)
	assert.Contains(t, body, "sign in to write first", "the read session lives longer")
	advance(readSessionTTL)
	code, body = b.get("/topics")
	assert.Equal(t, http.StatusUnauthorized, code, "an expired read session")
	assert.Contains(t, body, `id="open-form"`)
}
