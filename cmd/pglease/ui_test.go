package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/watermill-pglease/admin"
)

const testToken = "0123456789abcdef-test-token"

// newUITest serves the console of the fixture's schema in process.
func newUITest(t *testing.T, f *fixture, allowWrites bool) (*httptest.Server, *uiServer, *bytes.Buffer) {
	t.Helper()
	insp, err := admin.NewInspector(f.pool, f.tables)
	require.NoError(t, err)
	var log bytes.Buffer
	cfg := uiConfig{insp: insp, pool: f.pool, tables: f.tables, allowWrites: allowWrites, warnAfter: defaultWarnAfter, log: &log,
		loopbackOnly: true, token: testToken}
	srv, err := newUIServer(cfg)
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts, srv, &log
}

// browser is an HTTP client with cookies that sends the Origin of the
// console, as a browser does on a form post.
type browser struct {
	t      *testing.T
	base   string
	client *http.Client
	origin string
}

// newBrowser returns a browser that opened the console with the URL and
// its token, as an operator does.
func newBrowser(t *testing.T, base string) *browser {
	b := newBrowserWithoutToken(t, base)
	code, body := b.get("/?token=" + testToken)
	require.Equal(t, http.StatusOK, code, body)
	return b
}

// readCookie is the cookie of a new read session of srv.
func readCookie(srv *uiServer) *http.Cookie {
	return &http.Cookie{Name: accessCookie, Value: srv.sessions.start(uiSession{}, time.Hour)}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf returns the anti-forgery field that the pages of the browser's
// write session carry.
func (b *browser) csrf() string {
	b.t.Helper()
	code, body := b.get("/signin")
	require.Equal(b.t, http.StatusOK, code, body)
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(b.t, m, "no anti-forgery field: not signed in?")
	return m[1]
}

func newBrowserWithoutToken(t *testing.T, base string) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: base, client: &http.Client{Jar: jar}, origin: base}
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.client.Get(b.base + path)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, string(body)
}

func (b *browser) post(path string, form url.Values) (int, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if b.origin != "" {
		req.Header.Set("Origin", b.origin)
	}
	resp, err := b.client.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, string(body)
}

// TestUIPagesRender: the overview shows a group with its lag, the group's
// page its partitions and owner, the topic page its messages, the message
// page its payload and metadata; a read-only console refuses writes.
func TestUIPagesRender(t *testing.T) {
	f := newFixture(t)
	f.publish("orders", 3)
	msg := message.NewMessage("poisoned-1", []byte("<script>alert(1)</script>"))
	msg.Metadata.Set(middleware.PoisonedTopicKey, "orders")
	require.NoError(t, f.pub.Publish("poison", msg))
	_, msgs := f.subscribe("billing", "orders")
	receive(t, msgs) // not acked: lag 3
	ts, srv, _ := newUITest(t, f, false)
	require.NoError(t, srv.sampler.sample(context.Background()))
	b := newBrowser(t, ts.URL)

	code, body := b.get("/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `href="/group?name=billing"`)
	assert.Regexp(t, `class="n lag">3<`, body)
	code, body = b.get("/group?name=billing")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<td class="n">0</td>`) // partition 0
	assert.Contains(t, body, "<polyline")
	assert.NotContains(t, body, "reset-form", "no actions without writes")
	code, body = b.get("/topic?name=poison")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "poisoned-1")
	assert.Contains(t, body, "&lt;script&gt;", "payloads are escaped")
	code, body = b.get("/message?topic=poison&uuid=poisoned-1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "topic_poisoned")
	code, _ = b.get("/group?name=nope")
	assert.Equal(t, http.StatusNotFound, code)

	code, body = b.post("/actions/replay", url.Values{"from": {"poison"}, "where": {"original"}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "without --allow-writes")
}

// TestUIWritesNeedTokenOriginAndCSRF: with writes on, a write is refused
// without the token, from another origin, and without the form's
// anti-forgery field; signed in, a reset is previewed, changes nothing,
// and is applied when confirmed; each write is logged with who asked.
func TestUIWritesNeedTokenOriginAndCSRF(t *testing.T) {
	f := newFixture(t)
	f.publish("orders", 3)
	sub, msgs := f.subscribe("billing", "orders")
	receive(t, msgs).Ack()
	waitFor(t, 10*time.Second, "the ack", func() bool { return f.lag("--group", "billing")[0].Lag == 2 })
	require.NoError(t, sub.Close())
	ts, _, log := newUITest(t, f, true)
	b := newBrowser(t, ts.URL)
	reset := url.Values{"group": {"billing"}, "topic": {"orders"}, "to": {"earliest"}}

	code, body := b.post("/actions/reset", reset)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "sign in")
	code, _ = b.post("/signin", url.Values{"name": {"alice"}, "token": {"wrong-token-wrong-token"}})
	assert.Equal(t, http.StatusForbidden, code)

	b.origin = "http://evil.example"
	code, _ = b.post("/signin", url.Values{"name": {"alice"}, "token": {testToken}})
	assert.Equal(t, http.StatusForbidden, code, "cross-origin sign-in")
	b.origin = ts.URL
	code, body = b.post("/signin", url.Values{"name": {"alice"}, "token": {testToken}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Signed in as alice")

	code, _ = b.post("/actions/reset", reset)
	assert.Equal(t, http.StatusForbidden, code, "no anti-forgery field")
	reset.Set("csrf", b.csrf())
	b.origin = "http://evil.example"
	code, _ = b.post("/actions/reset", reset)
	assert.Equal(t, http.StatusForbidden, code, "cross-origin")
	b.origin = ts.URL

	code, body = b.post("/actions/reset", reset)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "reset-confirm")
	assert.Equal(t, int64(2), f.lag("--group", "billing")[0].Lag, "a preview changes nothing")
	reset.Set("confirm", "yes")
	code, body = b.post("/actions/reset", reset)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Reset billing on orders")
	assert.Equal(t, int64(3), f.lag("--group", "billing")[0].Lag)

	code, body = b.post("/actions/delete-group", url.Values{"group": {"billing"}, "csrf": {b.csrf()}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Empty(t, f.lag("--group", "billing"))

	assert.Contains(t, log.String(), `reset-offsets group="billing" topic="orders" to=earliest force=false by "alice"`)
	assert.Contains(t, log.String(), `applied to 1 partition`)
	assert.Contains(t, log.String(), `by "(not signed in)"`)
	assert.Contains(t, log.String(), `delete-group-offsets group="billing" by "alice"`)
}

// TestUIAnswersOnlyToLoopbackNames: a console on a loopback address
// refuses a request whose Host is another name, which is what a page of
// another site sends after pointing its name at 127.0.0.1 (DNS rebinding):
// it must not be able to read messages through the operator's browser.
func TestUIAnswersOnlyToLoopbackNames(t *testing.T) {
	f := newFixture(t)
	ts, srv, _ := newUITest(t, f, false)
	get := func(host string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, ts.URL+"/topics", nil)
		require.NoError(t, err)
		req.Host = host
		req.AddCookie(readCookie(srv))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	_, port, err := net.SplitHostPort(strings.TrimPrefix(ts.URL, "http://"))
	require.NoError(t, err)
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "10.0.0.1:" + port} {
		code, body := get(host)
		assert.Equal(t, http.StatusMisdirectedRequest, code, host)
		assert.Contains(t, body, "answers only to IP addresses, localhost", host)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "[::1]:" + port} {
		code, body := get(host)
		assert.Equal(t, http.StatusOK, code, "%s: %s", host, body)
	}
	assert.True(t, isLoopbackListen("127.0.0.1:8080"))
	assert.True(t, isLoopbackListen("localhost:0"))
	assert.True(t, isLoopbackListen("[::1]:8080"))
	assert.False(t, isLoopbackListen("0.0.0.0:8080"))
	assert.False(t, isLoopbackListen(":8080"))
}

// TestUIOverviewSampleOlderThanASession: a lag sample taken before a
// Subscriber started does not show its group with nothing owned: the
// overview reads the lag for the page instead. A sample newer than every
// session is shown with its age.
func TestUIOverviewSampleOlderThanASession(t *testing.T) {
	f := newFixture(t)
	f.publish("orders", 1)
	ts, srv, _ := newUITest(t, f, false)
	require.NoError(t, srv.sampler.sample(context.Background()), "before any Subscriber")
	f.subscribe("billing", "orders")
	waitFor(t, 10*time.Second, "the Subscriber to own the row", func() bool {
		rows := f.lag("--group", "billing")
		return len(rows) == 1 && rows[0].Owner != ""
	})
	b := newBrowser(t, ts.URL)
	// Members, rows, owned.
	const counts = `<td class="n">1</td><td class="n">1</td><td class="n">1</td>`
	code, body := b.get("/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, counts)
	assert.Contains(t, body, "Lag read just now.")

	require.NoError(t, srv.sampler.sample(context.Background()), "after the claim")
	code, body = b.get("/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, counts)
	assert.Regexp(t, `Lag as sampled [0-9.]+m?s ago, at `, body)
}

// TestUIGroupShowsWaitingMessages: a message that failed under a failure
// policy and waits for its next attempt shows in its partition's row of
// the group's page, with its attempts.
func TestUIGroupShowsWaitingMessages(t *testing.T) {
	f := newFixture(t)
	f.failOnce("billing", "orders")
	ts, _, _ := newUITest(t, f, false)
	b := newBrowser(t, ts.URL)
	waitFor(t, 10*time.Second, "the waiting message on the group's page", func() bool {
		code, body := b.get("/group?name=billing")
		require.Equal(t, http.StatusOK, code, body)
		return strings.Contains(body, `<td class="n waiting"><span class="warn">1</span> (1 attempt, next `)
	})
}
