package uitest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

const token = "uitest-write-token-0123456789"

var testDSN string

// TestMain finds the database as the library's tests do (internal/pgtest:
// PGLEASE_TEST_DSN, else a Docker engine, else the tests fail saying so);
// under -short the tests skip. `make test-ui` runs them with a throwaway
// PostgreSQL: go run ./internal/cmd/localpg run -- sh -c 'cd cmd/pglease/uitest && go test ./...'
// from the repository's root does the same.
func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "uitest", func(dsn string) { testDSN = dsn }))
}

// chromium returns the browser's path: PGLEASE_CHROMIUM, else chromium
// or chromium-browser on PATH. Without one the test fails, naming
// scripts/install-deps.sh, which installs it (`make test` runs it when
// the browser is missing).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PGLEASE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium: scripts/install-deps.sh chromium installs Debian's, or set PGLEASE_CHROMIUM to a Chromium or Chrome")
	return ""
}

// buildPglease builds the pglease command into a temporary directory.
func buildPglease(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pglease")
	build := exec.Command("go", "build", "-o", bin, "github.com/pglease/watermill-pglease/cmd/pglease")
	build.Env = append(os.Environ(), "GOWORK=off") // this module's go.mod, not the workspace's versions
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startUI starts `pglease ui` on a free port and returns its URL and its
// stderr (the log of writes). It is interrupted at the end of the test and
// must exit 0.
func startUI(t *testing.T, bin, schema string) (string, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(bin, "ui", "--dsn", testDSN, "--schema", schema, "--listen", "127.0.0.1:0", "--allow-writes",
		"--sample-every", "200ms", "--warn-after", "500ms")
	cmd.Env = append(os.Environ(), "PGLEASE_UI_TOKEN="+token)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			assert.NoError(t, err, "pglease ui exits 0 when interrupted; stderr: %s", stderr.String())
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("pglease ui did not stop within 15s of SIGINT")
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	serving := regexp.MustCompile(`serving on (http://[0-9.:]+)/`)
	select {
	case line := <-lines:
		m := serving.FindStringSubmatch(line)
		require.NotNil(t, m, "first line of pglease ui: %q", line)
		return m[1], stderr
	case err := <-exited:
		t.Fatalf("pglease ui exited: %v; stderr: %s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("pglease ui did not say where it serves within 30s; stderr: %s", stderr.String())
	}
	return "", nil
}

// newSchema creates a schema of its own with the pglease tables, dropped
// at the end.
func newSchema(t *testing.T, pool *pgxpool.Pool) pglease.Tables {
	t.Helper()
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	name := "pglease_uitest_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	adapter := pglease.Tables{Schema: name}
	require.NoError(t, pglease.Migrate(context.Background(), pool, adapter))
	return adapter
}

func subscribe(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group, topic string) <-chan *message.Message {
	t.Helper()
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
		CommitBatch: 1, PollInterval: 50 * time.Millisecond,
		// The maintainer makes the partitions of the topics' key windows
		// within a moment.
		Maintenance: pglease.MaintenanceConfig{Interval: 200 * time.Millisecond}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	return msgs
}

func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg := <-msgs:
		require.NotNil(t, msg)
		return msg
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15s")
		return nil
	}
}

// screenshot saves a full-page PNG into $PGLEASE_UI_SCREENSHOTS, when set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NotEmpty(t, png)
	if dir := os.Getenv("PGLEASE_UI_SCREENSHOTS"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
	}
}

// postWithoutToken posts a reset from the page, as a script of the page
// could, and returns the status and the body.
func postWithoutToken(t *testing.T, ctx context.Context) (status float64, body string) {
	t.Helper()
	res, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`fetch("/actions/reset", {method: "POST",
		body: new URLSearchParams({group: "billing", topic: "orders", to: "earliest", force: "on", confirm: "yes"})})
		.then(async r => ({status: r.status, body: await r.text()}))`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	return res["status"].(float64), res["body"].(string)
}

// TestConsoleInABrowser: an operator opens the overview and sees a group
// with lag, opens it and sees its partitions and owners and the lag
// chart, sees each topic's key window in the list of topics and on the
// topic's page, browses a topic and opens a message (without the token, the
// console asks for it and shows nothing); without signing in a write is
// refused; signed in, resets the group (preview, then confirm) and
// replays a poisoned message, which a running Subscriber of its original
// topic receives, and signs out, after which writes are refused again; a
// held xmin horizon shows the red banner.
func TestConsoleInABrowser(t *testing.T) {
	pgtest.SkipShort(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testDSN)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	adapter := newSchema(t, pool)
	require.NoError(t, pglease.CreateTopic(ctx, pool, "orders", pglease.TopicConfig{Partitions: 2, Tables: adapter}))
	// Topics whose keys are recognised for longer than a day: by a key
	// window, and by a retention that outlasts the key window.
	require.NoError(t, pglease.CreateTopic(ctx, pool, "payments", pglease.TopicConfig{KeyWindow: 72 * time.Hour, Tables: adapter}))
	require.NoError(t, pglease.CreateTopic(ctx, pool, "audit", pglease.TopicConfig{Retention: 7 * 24 * time.Hour,
		KeyWindow: 2 * time.Hour, Tables: adapter}))
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	const orders = 12
	for i := range orders {
		msg := message.NewMessage(fmt.Sprintf("order-%02d", i), []byte(fmt.Sprintf(`{"order": %d, "amount": "%d.50"}`, i, 10+i)))
		msg.Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("customer-%d", i%4))
		require.NoError(t, pub.Publish("orders", msg))
	}
	poisoned := message.NewMessage("order-poisoned-7", []byte(`{"order": 7, "amount": "oops"}`))
	poisoned.Metadata.Set(middleware.PoisonedTopicKey, "shipments")
	poisoned.Metadata.Set(middleware.ReasonForPoisonedKey, "amount is not a number")
	poisoned.Metadata.Set(middleware.PoisonedHandlerKey, "ship")
	require.NoError(t, pub.Publish("shipments.poison", poisoned))

	billing := subscribe(t, pool, adapter, "billing", "orders")
	receive(t, billing) // handed out, never acked: the group lags
	shipments := subscribe(t, pool, adapter, "shipper", "shipments")

	bin := buildPglease(t)
	base, log := startUI(t, bin, adapter.Schema)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	bctx, cancelTimeout := context.WithTimeout(bctx, 3*time.Minute)
	defer cancelTimeout()
	run := func(actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, actions...))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err)
		return s
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
		require.NoError(t, err)
		return n
	}

	// Without the token the console asks for it; the address printed at
	// start, with the token, opens it.
	run(chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#open-form")))
	assert.NotContains(t, text("main"), "billing")
	run(chromedp.Navigate(base+"/?token="+token), chromedp.WaitVisible(chromedp.CSS("#groups")))
	location, err := chromedp.Run(bctx, chromedp.Location())
	require.NoError(t, err)
	assert.Equal(t, base+"/", location, "the token leaves the address bar")

	// The overview: the group and its lag.
	run(chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#groups")))
	groups := text("#groups")
	assert.Contains(t, groups, "billing")
	assert.Regexp(t, `billing\s+1\s+2\s+2\s+12\s`, groups, "one member, two rows owned, a lag of 12")
	assert.Contains(t, text("#sessions"), "shipper")
	screenshot(t, bctx, "ui-overview.png")

	// The group: partitions, owners, and the chart once sampled.
	run(chromedp.Click(chromedp.CSS(`a.group-link[href="/group?name=billing"]`)), chromedp.WaitVisible(chromedp.CSS("#partitions")))
	parts := text("#partitions")
	assert.Regexp(t, `orders\s+0\s`, parts)
	assert.Regexp(t, `orders\s+1\s`, parts)
	host, _ := os.Hostname()
	assert.Contains(t, parts, host, "the owner process")
	deadline := time.Now().Add(10 * time.Second)
	for {
		run(chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#lag-chart")))
		if count("#lag-chart polyline") > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no lag sampled within 10s")
		time.Sleep(250 * time.Millisecond)
	}
	assert.NotContains(t, text("main"), "Preview the reset", "no actions before signing in")
	screenshot(t, bctx, "ui-group.png")

	// Without the token a write is refused.
	status, body := postWithoutToken(t, bctx)
	assert.Equal(t, 403.0, status)
	assert.Contains(t, body, "sign in to write first")

	// The topics and how long each recognises a retried Publish: its key
	// window, its retention, or a day; once the maintainer has made the
	// key classes' partitions (until then, a day, and the longer window
	// waiting).
	deadline = time.Now().Add(20 * time.Second)
	for {
		run(chromedp.Navigate(base+"/topics"), chromedp.WaitVisible(chromedp.CSS("#topics")))
		if count("#topics .key-window-pending") == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the key windows still wait for the maintainer after 20s: %s", text("#topics"))
		time.Sleep(250 * time.Millisecond)
	}
	keyWindows, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]string](`Object.fromEntries(
		Array.from(document.querySelectorAll("#topics tbody tr"), r => [r.querySelector("a.topic-link").textContent, r.querySelector("td.key-window").textContent]))`))
	require.NoError(t, err)
	assert.Equal(t, "72h0m0s", keyWindows["payments"], "its KeyWindow")
	assert.Equal(t, "168h0m0s (KeyWindow 2h0m0s)", keyWindows["audit"], "its retention, longer than its KeyWindow")
	assert.Equal(t, "24h0m0s", keyWindows["orders"], "neither: a day")
	// A topic's own page says the same, opened from the list.
	for topic, want := range keyWindows {
		run(chromedp.Navigate(base+"/topics"), chromedp.WaitVisible(chromedp.CSS("#topics")),
			chromedp.Click(chromedp.CSS(`a.topic-link[href="/topic?name=`+topic+`"]`)),
			chromedp.WaitVisible(chromedp.CSS("#uuid-form")))
		require.Equal(t, 1, count("#key-window"), "the key window on the page of topic %q: %s", topic, text(".summary"))
		assert.Equal(t, want, text("#key-window"), "the key window on the page of topic %q", topic)
		assert.Contains(t, text(".summary"), "key window "+want, "topic %q", topic)
	}

	// The topic and its message browser; a message.
	run(chromedp.Navigate(base+"/topics"), chromedp.WaitVisible(chromedp.CSS("#topics")),
		chromedp.Click(chromedp.CSS(`a.topic-link[href="/topic?name=shipments.poison"]`)),
		chromedp.WaitVisible(chromedp.CSS("#messages")))
	assert.Contains(t, text("#messages"), "order-poisoned-7")
	assert.Contains(t, text("#messages"), "reason_poisoned=amount is not a number")
	run(chromedp.Navigate(base+"/topic?name=orders"), chromedp.WaitVisible(chromedp.CSS("#messages")))
	assert.Contains(t, text("#messages"), "order-11")
	assert.Equal(t, "12", text("#stored"))
	screenshot(t, bctx, "ui-messages.png")
	run(chromedp.Click(chromedp.CSS(`a.message-link`)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	assert.Contains(t, text("#payload"), `{"order": 11, "amount": "21.50"}`)
	assert.Contains(t, text("#metadata"), "customer-3")

	// Sign in.
	run(chromedp.Navigate(base+"/signin"), chromedp.WaitVisible(chromedp.CSS("#signin-form")),
		chromedp.SendKeys(chromedp.CSS("#signin-name"), "alice"),
		chromedp.SendKeys(chromedp.CSS("#signin-token"), token),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#operator")))
	assert.Equal(t, "alice", text("#operator"))

	// Reset the group: refused while owned, unless forced; preview, then
	// confirm.
	run(chromedp.Navigate(base+"/group?name=billing"), chromedp.WaitVisible(chromedp.CSS("#reset-form")),
		chromedp.SetValue(chromedp.CSS("#reset-to"), "earliest"),
		chromedp.Click(chromedp.CSS("#reset-preview-button")), chromedp.WaitVisible(chromedp.CSS("#error")))
	assert.Contains(t, text("#error"), "a live session owns the offsets")
	run(chromedp.WaitVisible(chromedp.CSS("#reset-form")), chromedp.Click(chromedp.CSS("#reset-force")),
		chromedp.Click(chromedp.CSS("#reset-preview-button")), chromedp.WaitVisible(chromedp.CSS("#reset-preview")))
	assert.Contains(t, text("#reset-preview"), host, "the owner to be fenced")
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(t, err)
	before, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"billing"}})
	require.NoError(t, err)
	run(chromedp.Click(chromedp.CSS("#reset-confirm")), chromedp.WaitVisible(chromedp.CSS("#notice")))
	assert.Contains(t, text("#notice"), "Reset billing on orders to earliest: 2 partitions.")
	after, err := insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{"billing"}})
	require.NoError(t, err)
	require.Len(t, after, 2)
	for i := range after {
		assert.Greater(t, after[i].Epoch, before[i].Epoch, "fenced")
		assert.Zero(t, after[i].Position.Offset, "back at the beginning")
	}

	// Replay the poisoned message: preview, confirm, and its original
	// topic's Subscriber receives it.
	run(chromedp.Navigate(base+"/topic?name=shipments.poison"), chromedp.WaitVisible(chromedp.CSS("#replay-form")),
		chromedp.Click(chromedp.CSS("#replay-preview-button")), chromedp.WaitVisible(chromedp.CSS("#replay-preview")))
	assert.Contains(t, text("#replay-preview"), "order-poisoned-7")
	assert.Contains(t, text("#replay-preview"), "shipments")
	run(chromedp.Click(chromedp.CSS("#replay-confirm")), chromedp.WaitVisible(chromedp.CSS("#notice")))
	assert.Contains(t, text("#notice"), "Replayed 1 message from shipments.poison.")
	got := receive(t, shipments)
	assert.Equal(t, "order-poisoned-7", got.UUID)
	assert.Equal(t, "amount is not a number", got.Metadata.Get(middleware.ReasonForPoisonedKey))
	got.Ack()

	// Sign out: the server ends the write session; writes are refused.
	run(chromedp.Click(chromedp.CSS(`form[action="/signout"] button`)), chromedp.WaitVisible(chromedp.CSS("#signin-link")))
	assert.Equal(t, "Signed out.", text("#notice"))
	status, body = postWithoutToken(t, bctx)
	assert.Equal(t, 403.0, status)
	assert.Contains(t, body, "sign in to write first")

	// A transaction that published and is held open: the red banner
	// names it and the topic it holds back.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var pid int
	outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.Publish("held", message.NewMessage("held-1", nil)))
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	deadline = time.Now().Add(10 * time.Second)
	for {
		run(chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#groups")))
		if count("#held-banner") > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no banner within 10s")
		time.Sleep(200 * time.Millisecond)
	}
	assert.Contains(t, text("#held-banner"), fmt.Sprintf("pid %d", pid))
	assert.Contains(t, text("#held-banner"), "on 1 partition", "a topic without settings or offset rows, counted")
	require.NoError(t, tx.Rollback(ctx))

	logged := log.String()
	t.Logf("the log of writes:\n%s", logged)
	assert.Contains(t, logged, `reset-offsets group="billing" topic="orders" to=earliest force=true by "alice"`)
	assert.Contains(t, logged, `replay from="shipments.poison" to="" to_original=true filter="" limit=100 by "alice"`)
	assert.Contains(t, logged, `by "(not signed in)"`)
}
