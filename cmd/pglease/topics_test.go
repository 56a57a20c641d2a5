package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// createTopics creates n topics named prefix000, prefix001, ... and
// returns their names in order.
func createTopics(t *testing.T, f *fixture, prefix string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s%03d", prefix, i)
		require.NoError(t, pglease.CreateTopic(context.Background(), f.pool, name, pglease.TopicConfig{Partitions: 1, Tables: f.tables}))
		names = append(names, name)
	}
	return names
}

// TestTopicsPaged: pglease topics lists a page of --limit topics, counts
// them all and names the command of the next page; following it lists
// every topic once, in order; --json gives the page, the total and the
// next page's --after; --all lists them all; a bad --limit is refused.
func TestTopicsPaged(t *testing.T) {
	f := newFixture(t)
	names := createTopics(t, f, "t.", 7)
	f.publish("t.003", 1) // with messages and settings: listed once

	out := f.ok("topics", "--limit", "3")
	assert.Equal(t, []string{"t.000", "1", "-", "24h0m0s", "0", "-"}, tableRow(t, out, "t.000"))
	assert.Contains(t, out, "Listed 3 of 7 topics; the next page: pglease topics --after t.002\n")
	assert.NotContains(t, out, "t.003")

	var listed []string
	args := []string{"--limit", "3", "--json"}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5, "no end of the pages")
		var page admin.TopicPage
		require.NoError(t, json.Unmarshal([]byte(f.ok("topics", args...)), &page))
		assert.Equal(t, int64(7), page.Total)
		for _, tp := range page.Topics {
			listed = append(listed, tp.Topic)
		}
		if page.Next == nil {
			assert.Len(t, page.Topics, 1, "the last page")
			break
		}
		assert.Len(t, page.Topics, 3)
		args = []string{"--limit", "3", "--json", "--after", *page.Next}
	}
	assert.Equal(t, names, listed)

	out = f.ok("topics", "--limit", "3", "--after", "t.005")
	assert.Contains(t, out, "Listed 1 of 7 topics: the last page.\n")
	out = f.ok("topics", "--after", "t.006")
	assert.Equal(t, "No topics after t.006; 7 topics in all.\n", out)
	out = f.ok("topics", "--limit", "2", "--all")
	for _, n := range names {
		assert.Len(t, tableRow(t, out, n), 6, n)
	}
	assert.Contains(t, out, "7 topics in all.\n")
	var all admin.TopicPage
	require.NoError(t, json.Unmarshal([]byte(f.ok("topics", "--limit", "2", "--all", "--json")), &all))
	assert.Len(t, all.Topics, 7)
	assert.Nil(t, all.Next)
	assert.Contains(t, f.ok("topics"), "7 topics.\n")

	for _, bad := range [][]string{{"--limit", "0"}, {"--limit", "10001"}, {"--all", "--after", "x"}} {
		r := f.cli("topics", bad...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", bad, r)
	}
}

// TestUITopicsPaged: the console's topics page shows 100 topics, counts
// them all and links the next page, which shows the rest and links back
// to the first.
func TestUITopicsPaged(t *testing.T) {
	f := newFixture(t)
	names := createTopics(t, f, "t.", uiTopicsPage+20)
	ts, _, _ := newUITest(t, f, false)
	b := newBrowser(t, ts.URL)
	link := regexp.MustCompile(`class="topic-link" href="/topic\?name=([^"]+)"`)
	listed := func(body string) []string {
		var out []string
		for _, m := range link.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}

	code, body := b.get("/topics")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, names[:uiTopicsPage], listed(body))
	assert.Contains(t, body, fmt.Sprintf("%d of %d topics", uiTopicsPage, len(names)))
	next := fmt.Sprintf(`href="/topics?after=%s" id="topics-next"`, names[uiTopicsPage-1])
	require.Contains(t, body, next)
	assert.NotContains(t, body, "topics-first")

	code, body = b.get("/topics?after=" + names[uiTopicsPage-1])
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, names[uiTopicsPage:], listed(body))
	assert.Contains(t, body, fmt.Sprintf("20 of %d topics, after %s", len(names), names[uiTopicsPage-1]))
	assert.NotContains(t, body, "topics-next")
	assert.Contains(t, body, `href="/topics" id="topics-first"`)

	code, body = b.get("/topics?after=zzz")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, fmt.Sprintf("No topics after zzz; %d in all.", len(names)))
	assert.False(t, strings.Contains(body, "topic-link"))
}

// TestUIGroupsAndRowsPaged: the overview lists 100 groups a page, with
// their number and a link to the next page; a group's page shows
// maxGroupRows rows at a time, with their number and a link to the next
// rows.
func TestUIGroupsAndRowsPaged(t *testing.T) {
	f := newFixture(t)
	offsets := pgx.Identifier{f.schema, pglease.DefaultConsumerOffsetsTable}.Sanitize()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO `+offsets+` (consumer_group, topic)
		SELECT 'g.' || pg_catalog.lpad(i::text, 3, '0'), 'orders' FROM pg_catalog.generate_series(0, $1 - 1) AS i`, uiGroupsPage+5)
	require.NoError(t, err)
	_, err = f.pool.Exec(context.Background(), `INSERT INTO `+offsets+` (consumer_group, topic)
		SELECT 'big', 't.' || pg_catalog.lpad(i::text, 4, '0') FROM pg_catalog.generate_series(0, $1 - 1) AS i`, maxGroupRows+10)
	require.NoError(t, err)
	ts, _, _ := newUITest(t, f, false)
	b := newBrowser(t, ts.URL)
	groupLink := regexp.MustCompile(`class="group-link" href="/group\?name=([^"]+)"`)
	groups := func(body string) []string {
		var out []string
		for _, m := range groupLink.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}

	code, body := b.get("/")
	require.Equal(t, http.StatusOK, code, body)
	first := groups(body)
	require.Len(t, first, uiGroupsPage)
	assert.Equal(t, "big", first[0])
	assert.Contains(t, body, fmt.Sprintf("%d of %d groups", uiGroupsPage, uiGroupsPage+6))
	last := first[len(first)-1]
	require.Contains(t, body, `href="/?after=`+last+`" id="groups-next"`)
	code, body = b.get("/?after=" + last)
	require.Equal(t, http.StatusOK, code, body)
	rest := groups(body)
	assert.Len(t, rest, 6)
	assert.Equal(t, "g.104", rest[len(rest)-1])
	assert.NotContains(t, body, "groups-next")
	assert.Contains(t, body, `id="groups-first"`)

	code, body = b.get("/group?name=big")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, fmt.Sprintf("Rows 1 to %d of %d.", maxGroupRows, maxGroupRows+10))
	assert.Contains(t, body, fmt.Sprintf(`href="/group?name=big&amp;from=%d" id="rows-next"`, maxGroupRows))
	assert.NotContains(t, body, "t.1000")
	code, body = b.get(fmt.Sprintf("/group?name=big&from=%d", maxGroupRows))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, fmt.Sprintf("Rows %d to %d of %d.", maxGroupRows+1, maxGroupRows+10, maxGroupRows+10))
	assert.Contains(t, body, "t.1009")
	assert.NotContains(t, body, ">t.0999<")
	assert.NotContains(t, body, "rows-next")
	code, _ = b.get("/group?name=big&from=-1")
	assert.Equal(t, http.StatusBadRequest, code)

	// The reset form offers a list of at most maxTopicChoices topics.
	ts, srv, _ := newUITest(t, f, true)
	b = newBrowser(t, ts.URL)
	code, body = b.post("/signin", url.Values{"name": {"alice"}, "token": {testToken}})
	require.Equal(t, http.StatusOK, code, body)
	code, body = b.get("/group?name=big")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, fmt.Sprintf(`(one of its %d) <input name="topic" id="reset-topic" required>`, maxGroupRows+10))
	assert.NotContains(t, body, "<option value=\"t.")
	gb, err := srv.groupData(context.Background(), "big", 0)
	require.NoError(t, err)
	assert.Len(t, gb.Topics, maxTopicChoices)
	assert.Equal(t, maxGroupRows+10, gb.TopicCount)
	code, body = b.get("/group?name=g.000")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<select name="topic" id="reset-topic"><option value="orders">orders</option></select>`)
}

// TestTopicsKeyWindow: pglease topics says how long each topic recognises
// an idempotency key: a topic with a KeyWindow its window, one whose
// retention is longer than its KeyWindow its retention, one with neither
// a day; a longer window is marked, and named in --json, until the
// maintainer has made its partitions.
func TestTopicsKeyWindow(t *testing.T) {
	testTopicsKeyWindow(t, newFixture(t))
}

func testTopicsKeyWindow(t *testing.T, f *fixture) {
	ctx := context.Background()
	const day, week = 24 * time.Hour, 7 * 24 * time.Hour
	for name, c := range map[string]pglease.TopicConfig{
		"window":    {KeyWindow: 72 * time.Hour},
		"retention": {Retention: week, KeyWindow: 2 * time.Hour},
		"neither":   {},
	} {
		c.Tables = f.tables
		require.NoError(t, pglease.CreateTopic(ctx, f.pool, name, c))
	}
	topics := func() map[string]admin.TopicInfo {
		var page admin.TopicPage
		require.NoError(t, json.Unmarshal([]byte(f.ok("topics", "--json")), &page))
		out := map[string]admin.TopicInfo{}
		for _, tp := range page.Topics {
			out[tp.Topic] = tp
		}
		return out
	}

	// No maintainer ran: the longer windows wait for their partitions.
	got := topics()
	assert.Equal(t, 72*time.Hour, got["window"].KeyWindow)
	assert.Equal(t, day, got["window"].EffectiveKeyWindow)
	assert.Equal(t, 72*time.Hour, got["window"].PendingKeyWindow)
	assert.Equal(t, 2*time.Hour, got["retention"].KeyWindow)
	assert.Equal(t, day, got["retention"].EffectiveKeyWindow)
	assert.Equal(t, week, got["retention"].PendingKeyWindow)
	assert.Equal(t, admin.TopicInfo{Topic: "neither", Partitions: 1, EffectiveKeyWindow: day}, got["neither"])
	out := f.ok("topics")
	assert.Equal(t, []string{"window", "1", "-", "24h0m0s*", "0", "-"}, tableRow(t, out, "window"))
	assert.Equal(t, []string{"retention", "1", "168h0m0s", "24h0m0s*", "0", "-"}, tableRow(t, out, "retention"))
	assert.Equal(t, []string{"neither", "1", "-", "24h0m0s", "0", "-"}, tableRow(t, out, "neither"))
	assert.Contains(t, out, pendingKeyWindowNote+"\n")
	raw := f.ok("topics", "--json")
	assert.Contains(t, raw, `"key_window_ns": 259200000000000,`)
	assert.Contains(t, raw, `"effective_key_window_ns": 86400000000000,`)
	assert.Contains(t, raw, `"pending_key_window_ns": 259200000000000,`)
	// pglease messages --json: the topic's key windows, as pglease topics
	// has them.
	detail := func(topic string) admin.TopicDetail {
		var out messagesOutput
		require.NoError(t, json.Unmarshal([]byte(f.ok("messages", "--topic", topic, "--json")), &out))
		return out.Topic
	}
	for _, topic := range []string{"window", "retention", "neither"} {
		d := detail(topic)
		assert.Equal(t, [3]time.Duration{got[topic].KeyWindow, got[topic].EffectiveKeyWindow, got[topic].PendingKeyWindow},
			[3]time.Duration{d.KeyWindow, d.EffectiveKeyWindow, d.PendingKeyWindow}, "topic %q", topic)
	}
	assert.Contains(t, f.ok("messages", "--topic", "window", "--json"), `"pending_key_window_ns": 259200000000000,`)

	// A Subscriber's maintainer makes them: the windows are in use.
	startMaintainer(ctx, t, f, "neither")
	waitFor(t, 30*time.Second, "the maintainer to make the key classes' partitions", func() bool {
		got = topics()
		return got["window"].PendingKeyWindow == 0 && got["retention"].PendingKeyWindow == 0
	})
	assert.Equal(t, 72*time.Hour, got["window"].EffectiveKeyWindow)
	assert.Equal(t, week, got["retention"].EffectiveKeyWindow)
	assert.Equal(t, day, got["neither"].EffectiveKeyWindow)
	out = f.ok("topics")
	assert.Equal(t, []string{"window", "1", "-", "72h0m0s", "0", "-"}, tableRow(t, out, "window"))
	assert.Equal(t, []string{"retention", "1", "168h0m0s", "168h0m0s", "0", "-"}, tableRow(t, out, "retention"))
	assert.Equal(t, []string{"neither", "1", "-", "24h0m0s", "1", "-"}, tableRow(t, out, "neither"))
	assert.NotContains(t, out, "*")
	assert.NotContains(t, f.ok("topics", "--json"), "pending_key_window_ns")
	for _, topic := range []string{"window", "retention", "neither"} {
		d := detail(topic)
		assert.Equal(t, [3]time.Duration{got[topic].KeyWindow, got[topic].EffectiveKeyWindow, 0},
			[3]time.Duration{d.KeyWindow, d.EffectiveKeyWindow, d.PendingKeyWindow}, "topic %q", topic)
	}
	assert.NotContains(t, f.ok("messages", "--topic", "window", "--json"), "pending_key_window_ns")
}

// TestTopicsOnEarlierSchemas: pglease topics lists the topics of the
// schema of an earlier release, which lacks the key window (version 21:
// a topic's keys are recognised for its retention), the key classes
// (version 20: for a day) or idempotency keys (version 14).
func TestTopicsOnEarlierSchemas(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, testDSN, 0)
	const week = 7 * 24 * time.Hour
	for _, c := range []struct {
		version   int
		keys      string // the KEY-WINDOW of a topic with a week's retention
		effective time.Duration
	}{
		{21, "24h0m0s*", 24 * time.Hour}, // no maintainer made the class's partitions
		{20, "24h0m0s", 24 * time.Hour},
		{14, "-", 0},
	} {
		schema := pgtest.NewSchema(t, pool, "pglease_cmd_test_")
		_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
		require.NoError(t, err)
		tables := tablesOf(pglease.Tables{Schema: schema})
		require.NoError(t, pgsql.Migrate(ctx, pool, tables, tables.Migrations()[:c.version]))
		// What CreateTopic of that release wrote (no key_window).
		_, err = pool.Exec(ctx, `INSERT INTO `+tables.Topics+` (topic, partitions, retention, retention_class)
			VALUES ('kept', 1, interval '7 days', 21)`)
		require.NoError(t, err)
		env := map[string]string{"DATABASE_URL": testDSN}
		r := runCLI(t, env, "topics", "--schema", schema)
		require.Equal(t, 0, r.code, "version %d: %s", c.version, r)
		assert.Equal(t, []string{"kept", "1", "168h0m0s", c.keys, "0", "-"}, tableRow(t, r.stdout, "kept"), "version %d", c.version)
		r = runCLI(t, env, "topics", "--schema", schema, "--json")
		require.Equal(t, 0, r.code, "version %d: %s", c.version, r)
		var page admin.TopicPage
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
		require.Len(t, page.Topics, 1)
		assert.Equal(t, week, page.Topics[0].Retention)
		assert.Zero(t, page.Topics[0].KeyWindow)
		assert.Equal(t, c.effective, page.Topics[0].EffectiveKeyWindow, "version %d", c.version)
		// The topic's detail (pglease messages --json, the console's
		// topic page) reads the key window on that schema as well.
		r = runCLI(t, env, "messages", "--schema", schema, "--topic", "kept", "--json")
		require.Equal(t, 0, r.code, "version %d: %s", c.version, r)
		var msgs messagesOutput
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &msgs))
		assert.Equal(t, week, msgs.Topic.Retention)
		assert.Zero(t, msgs.Topic.KeyWindow)
		assert.Equal(t, c.effective, msgs.Topic.EffectiveKeyWindow, "version %d", c.version)
		assert.Equal(t, page.Topics[0].PendingKeyWindow, msgs.Topic.PendingKeyWindow, "version %d", c.version)
	}
}

// TestUITopicsKeyWindow: the console's topics page shows each topic's key
// window as pglease topics does (see TestTopicsKeyWindow), with the
// longer window that waits for the maintainer, and the KeyWindow set when
// the retention outlasts it; a topic's own page shows the same, and the
// KeyWindow set while a longer retention waits.
func TestUITopicsKeyWindow(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for name, c := range map[string]pglease.TopicConfig{
		"window":    {KeyWindow: 72 * time.Hour},
		"retention": {Retention: 7 * 24 * time.Hour, KeyWindow: 2 * time.Hour},
		"neither":   {},
	} {
		c.Tables = f.tables
		require.NoError(t, pglease.CreateTopic(ctx, f.pool, name, c))
	}
	ts, _, _ := newUITest(t, f, false)
	b := newBrowser(t, ts.URL)
	cells := func() map[string]string {
		code, body := b.get("/topics")
		require.Equal(t, http.StatusOK, code, body)
		out := map[string]string{}
		row := regexp.MustCompile(`href="/topic\?name=([^"]+)">[^<]*</a></td>.*?<td class="key-window">(.*?)</td>`)
		for _, m := range row.FindAllStringSubmatch(body, -1) {
			out[m[1]] = m[2]
		}
		return out
	}
	// The key window on the topic's own page, in its summary.
	page := func(topic string) string {
		code, body := b.get("/topic?name=" + url.QueryEscape(topic))
		require.Equal(t, http.StatusOK, code, body)
		m := regexp.MustCompile(`<span title="How long a retried Publish [^"]*">key window</span> <span id="key-window">(.*?)</span> ·`).FindStringSubmatch(body)
		require.NotNil(t, m, "the key window on the page of topic %q: %s", topic, body)
		return m[1]
	}

	got := cells()
	assert.Equal(t, `24h0m0s <span class="muted key-window-pending">(72h0m0s once the maintainer has made its partitions)</span>`, got["window"])
	assert.Equal(t, `24h0m0s <span class="muted key-window-pending">(168h0m0s once the maintainer has made its partitions)</span>`, got["retention"])
	assert.Equal(t, `24h0m0s`, got["neither"])
	assert.Equal(t, got["window"], page("window"))
	// The topic's page names the KeyWindow set, shorter than the
	// retention that waits.
	assert.Equal(t, got["retention"]+` <span class="muted">(KeyWindow 2h0m0s)</span>`, page("retention"))
	assert.Equal(t, `24h0m0s`, page("neither"))
	assert.Equal(t, `24h0m0s`, page("never.created"), "a topic without settings: a day")

	startMaintainer(ctx, t, f, "neither")
	waitFor(t, 30*time.Second, "the maintainer to make the key classes' partitions", func() bool {
		got = cells()
		return !strings.Contains(got["window"]+got["retention"], "pending")
	})
	assert.Equal(t, `72h0m0s`, got["window"])
	assert.Equal(t, `168h0m0s <span class="muted">(KeyWindow 2h0m0s)</span>`, got["retention"])
	assert.Equal(t, `24h0m0s`, got["neither"])
	for _, topic := range []string{"window", "retention", "neither"} {
		assert.Equal(t, got[topic], page(topic), "the page of topic %q shows what the topics page does", topic)
	}
}

// startMaintainer starts a Subscriber of topic whose maintainer runs
// every 100 ms (it makes the key classes' partitions), until the test
// ends.
func startMaintainer(ctx context.Context, t *testing.T, f *fixture, topic string) {
	t.Helper()
	sub, err := pglease.NewSubscriber(f.pool, pglease.SubscriberConfig{ConsumerGroup: "g", Tables: f.tables,
		Maintenance: pglease.MaintenanceConfig{Interval: 100 * time.Millisecond}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	subCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	_, err = sub.Subscribe(subCtx, topic)
	require.NoError(t, err)
}
