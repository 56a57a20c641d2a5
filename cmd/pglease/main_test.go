package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// testDSN is the database of every test; each works in a schema of its own.
var testDSN string

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "cmd/pglease", func(dsn string) { testDSN = dsn }))
}

// fixture is a fresh schema with the pglease tables, a pool and a
// publisher on it.
type fixture struct {
	t      testing.TB
	pool   *pgxpool.Pool
	schema string
	tables pglease.Tables
	pub    *pglease.Publisher
}

// newFixture creates a schema with a random name, dropped at the end of
// the test, and the pglease tables in it.
func newFixture(t testing.TB) *fixture {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewPool(t, testDSN, 0)
	schema := pgtest.NewSchema(t, pool, "pglease_cmd_test_")
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	tables := pglease.Tables{Schema: schema}
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	// The tables, before anything reads them.
	require.NoError(t, pglease.CreateTopic(ctx, pool, "created-by-the-fixture", pglease.TopicConfig{
		Tables: tables, InitializeSchema: true}))
	_, err = pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, pglease.DefaultTopicsTable}.Sanitize())
	require.NoError(t, err)
	return &fixture{t: t, pool: pool, schema: schema, tables: tables, pub: pub}
}

// result is what one run of the command did.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runCLI runs the command line args in process, with DATABASE_URL from
// env (nil: none set).
func runCLI(t testing.TB, env map[string]string, args ...string) result {
	t.Helper()
	return runCLIWithin(t, 30*time.Second, env, args...)
}

// runCLIWithin is runCLI with the command's context cancelled after d.
func runCLIWithin(t testing.TB, d time.Duration, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	code := run(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// cli runs command with args on the fixture's schema, connecting through
// DATABASE_URL.
func (f *fixture) cli(command string, args ...string) result {
	f.t.Helper()
	return runCLI(f.t, map[string]string{"DATABASE_URL": testDSN}, append([]string{command, "--schema", f.schema}, args...)...)
}

// ok runs command and requires exit status 0.
func (f *fixture) ok(command string, args ...string) string {
	f.t.Helper()
	r := f.cli(command, args...)
	require.Equal(f.t, 0, r.code, "pglease %s %s: %s", command, strings.Join(args, " "), r)
	return r.stdout
}

// lag returns the rows of `pglease lag --json args...`.
func (f *fixture) lag(args ...string) []admin.LagInfo {
	f.t.Helper()
	var rows []admin.LagInfo
	require.NoError(f.t, json.Unmarshal([]byte(f.ok("lag", append([]string{"--json"}, args...)...)), &rows))
	return rows
}

// publish publishes n messages on topic and returns their UUIDs.
func (f *fixture) publish(topic string, n int) []string {
	f.t.Helper()
	var ids []string
	for range n {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		require.NoError(f.t, f.pub.Publish(topic, msg))
		ids = append(ids, msg.UUID)
	}
	return ids
}

// failOnce publishes one message on topic and has a Subscriber of group,
// under a failure policy whose next attempt is a minute away, nack it:
// the message waits for its retry until the end of the test.
func (f *fixture) failOnce(group, topic string) {
	f.t.Helper()
	f.publish(topic, 1)
	sub, err := pglease.NewSubscriber(f.pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: f.tables,
		CommitBatch: 1, PollInterval: 10 * time.Millisecond,
		Retry: pglease.RetryConfig{MaxAttempts: 3, MinBackoff: time.Minute, MaxBackoff: time.Minute, DeadLetterTopic: topic + ".dead"}}, nil)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(f.t, err)
	select {
	case m := <-msgs:
		m.Nack()
	case <-time.After(10 * time.Second):
		f.t.Fatal("no message")
	}
}

// subscribe starts a Subscriber of group on topic, committing every ack at
// once and polling every 50 ms, closed at the end of the test.
func (f *fixture) subscribe(group, topic string) (*pglease.Subscriber, <-chan *message.Message) {
	f.t.Helper()
	sub, err := pglease.NewSubscriber(f.pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: f.tables,
		CommitBatch: 1, PollInterval: 50 * time.Millisecond}, nil)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(f.t, err)
	return sub, msgs
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, timeout, what, cond)
}

func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg := <-msgs:
		require.NotNil(t, msg, "channel closed")
		return msg
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
		return nil
	}
}

// thisOwner is the owner string of the sessions of this process.
func thisOwner(t *testing.T) string {
	host, err := os.Hostname()
	require.NoError(t, err)
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// tableRow returns the fields of the first line of a table whose first
// fields are prefix.
func tableRow(t *testing.T, out string, prefix ...string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= len(prefix) && slicesEqual(f[:len(prefix)], prefix) {
			return f
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, out)
	return nil
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLag: a subscriber that acked 4 of 10 messages shows as the owner
// with a lag of 6, in text and JSON; --group "" selects the group named "";
// filters that match nothing print a note, or [].
func TestLag(t *testing.T) {
	f := newFixture(t)
	f.publish("orders", 10)
	_, msgs := f.subscribe("billing", "orders")
	var last pglease.Position
	for range 4 {
		msg := receive(t, msgs)
		last, _ = pglease.MessagePositionFromCtx(msg.Context())
		msg.Ack()
	}
	var rows []admin.LagInfo
	waitFor(t, 10*time.Second, "the 4th ack to be committed", func() bool {
		rows = f.lag("--group", "billing")
		return len(rows) == 1 && rows[0].Position == last
	})
	owner := thisOwner(t)
	l := rows[0]
	assert.Equal(t, "billing", l.ConsumerGroup)
	assert.Equal(t, "orders", l.Topic)
	assert.Equal(t, int32(0), l.Partition)
	assert.Equal(t, owner, l.Owner)
	assert.NotEqual(t, uuid.Nil, l.OwnerSession)
	assert.Equal(t, int64(6), l.Lag)
	assert.Positive(t, l.LagSeconds)
	assert.False(t, l.Pending)

	out := f.ok("lag", "--topic", "orders")
	assert.Equal(t, []string{"GROUP", "TOPIC", "PARTITION", "OWNER", "POSITION", "LAG", "LAG-SECONDS"},
		strings.Fields(strings.SplitN(out, "\n", 2)[0]), "header, without PENDING:\n%s", out)
	row := tableRow(t, out, "billing", "orders")
	assert.Equal(t, []string{"billing", "orders", "0", owner, formatPosition(last), "6"}, row[:6], out)

	// The group named "" is a group like any other.
	reset := f.ok("reset-offsets", "--group", "", "--topic", "orders", "--to-earliest")
	assert.Contains(t, reset, `Reset consumer group "" on topic "orders" to earliest.`)
	rows = f.lag("--group", "")
	require.Len(t, rows, 1)
	assert.Equal(t, "", rows[0].ConsumerGroup)
	assert.Equal(t, int64(10), rows[0].Lag)
	assert.Empty(t, rows[0].Owner)
	row = tableRow(t, f.ok("lag", "--group="), `""`)
	assert.Equal(t, []string{`""`, "orders", "0", "-", "0:0", "10"}, row[:6])
	assert.Len(t, f.lag(), 2, "no filter: every group")
	assert.Len(t, f.lag("--group", "billing", "--group", ""), 2, "--group repeated")
	assert.Len(t, f.lag("--group", "billing", "--topic", "orders", "--topic", "other"), 1)

	assert.Equal(t, "[]\n", f.ok("lag", "--json", "--topic", "nothing"))
	assert.Contains(t, f.ok("lag", "--group", "nobody"), "No offsets rows")

	// --by-group: the console overview's line per group.
	var groups []groupSummary
	require.NoError(t, json.Unmarshal([]byte(f.ok("lag", "--by-group", "--json")), &groups))
	require.Len(t, groups, 2, "billing and the group named \"\"")
	assert.Equal(t, groupSummary{Name: "", Members: 0, Rows: 1, Owned: 0, Lag: 10, MaxLagSeconds: groups[0].MaxLagSeconds}, groups[0])
	assert.Equal(t, groupSummary{Name: "billing", Members: 1, Rows: 1, Owned: 1, Lag: 6, MaxLagSeconds: groups[1].MaxLagSeconds}, groups[1])
	assert.Positive(t, groups[1].MaxLagSeconds)
	row = tableRow(t, f.ok("lag", "--by-group", "--group", "billing"), "billing")
	assert.Equal(t, []string{"billing", "1", "1", "1", "6"}, row[:5])
	assert.Equal(t, "[]\n", f.ok("lag", "--by-group", "--json", "--group", "nobody"), "a filter leaves out groups without its rows")

	// Without lag, both print "-" for its age, as the console does.
	f.ok("reset-offsets", "--group", "caught-up", "--topic", "orders", "--to-latest")
	row = tableRow(t, f.ok("lag", "--group", "caught-up"), "caught-up")
	assert.Equal(t, []string{"caught-up", "orders", "0", "-"}, row[:4])
	assert.Equal(t, []string{"0", "-"}, row[5:7])
	row = tableRow(t, f.ok("lag", "--by-group", "--group", "caught-up"), "caught-up")
	assert.Equal(t, []string{"caught-up", "0", "1", "0", "0", "-", "no"}, row)
}

// TestStatus: the session of a live Subscriber, and a writing transaction
// held open on another connection named as the horizon's holder.
func TestStatus(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.publish("t", 1)
	f.subscribe("g", "t")
	var st statusOutput
	waitFor(t, 10*time.Second, "the session to own its row", func() bool {
		st = statusOutput{}
		require.NoError(t, json.Unmarshal([]byte(f.ok("status", "--json")), &st))
		return len(st.Sessions) == 1 && st.Sessions[0].RowsHeld == 1
	})
	s := st.Sessions[0]
	assert.Equal(t, "g", s.ConsumerGroup)
	assert.Equal(t, thisOwner(t), s.Owner)
	assert.True(t, s.Alive)
	assert.Positive(t, s.ExpiresIn)

	cfg, err := pgx.ParseConfig(testDSN)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "pglease-cmd-test-blocker"
	blocker, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The pid inside the transaction: through PgBouncer in transaction
	// mode, a statement before BEGIN may have run on another server
	// connection.
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)

	waitFor(t, 10*time.Second, "the blocker to be the horizon's holder", func() bool {
		st = statusOutput{}
		require.NoError(t, json.Unmarshal([]byte(f.ok("status", "--json", "--warn-after", "1ms")), &st))
		return st.Horizon.Holder != nil && st.Horizon.Holder.PID == pid
	})
	h := st.Horizon.Holder
	assert.Equal(t, "pglease-cmd-test-blocker", h.ApplicationName)
	assert.Equal(t, "idle in transaction", h.State)
	assert.Equal(t, "SELECT pg_current_xact_id()", h.Query)
	assert.Positive(t, st.Horizon.Xmin)
	// A writer that published nothing holds back vacuum, not delivery.
	assert.True(t, st.Horizon.PerTopic)
	assert.Empty(t, st.Horizon.Publishers)
	require.NotNil(t, st.DeliveryHeldBack)
	assert.False(t, *st.DeliveryHeldBack)
	out := f.ok("status", "--warn-after", "1ms")
	assert.Contains(t, out, "Open publishers: none: no topic is held back")
	assert.Regexp(t, `(?m)^held by\s+pid `+strconv.Itoa(pid)+` \(pglease-cmd-test-blocker, idle in transaction, .* old\)$`, out)

	// Once it publishes (an outbox), it holds back that topic.
	outbox, err := pglease.NewPublisher(tx, pglease.PublisherConfig{Tables: f.tables}, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
	st = statusOutput{}
	require.NoError(t, json.Unmarshal([]byte(f.ok("status", "--json", "--warn-after", "1ms")), &st))
	require.Len(t, st.Horizon.Publishers, 1)
	p := st.Horizon.Publishers[0]
	assert.Equal(t, pid, p.PID)
	assert.Equal(t, "pglease-cmd-test-blocker", p.ApplicationName)
	assert.Equal(t, []admin.TopicPartition{{Topic: "t", Partition: 0}}, p.Partitions)
	assert.Equal(t, 1, p.Held)
	require.NotNil(t, st.DeliveryHeldBack)
	assert.True(t, *st.DeliveryHeldBack)

	out = f.ok("status", "--warn-after", "1ms")
	row := tableRow(t, out, "g", s.ID.String())
	assert.Equal(t, thisOwner(t), row[2])
	assert.Equal(t, "1", row[len(row)-1], "ROWS")
	// The only Subscriber is the maintainer.
	waitFor(t, 10*time.Second, "the maintainer", func() bool {
		return strings.Contains(f.ok("status"), "Maintainer: session "+s.ID.String()+" of "+thisOwner(t))
	})
	st = statusOutput{}
	require.NoError(t, json.Unmarshal([]byte(f.ok("status", "--json")), &st))
	assert.True(t, st.Sessions[0].Maintainer)
	pubRow := tableRow(t, out, strconv.Itoa(pid))
	assert.Equal(t, []string{strconv.Itoa(pid), "pglease-cmd-test-blocker", "idle", "in", "transaction"}, pubRow[:5])
	assert.Contains(t, out, fmt.Sprintf(`DELIVERY IS HELD BACK on "t"/0: pid %d has kept a transaction that published there open`, pid))
	assert.Contains(t, out, fmt.Sprintf("pg_terminate_backend(%d)", pid))
	assert.Contains(t, f.ok("status", "--warn-after", "1h"), "Delivery is not held back: the oldest open publisher")

	require.NoError(t, tx.Rollback(ctx))
	st = statusOutput{} // "holder" is left out when there is none
	require.NoError(t, json.Unmarshal([]byte(f.ok("status", "--json")), &st))
	if st.Horizon.Holder != nil {
		assert.NotEqual(t, pid, st.Horizon.Holder.PID, "the transaction ended: %+v", *st.Horizon.Holder)
	}
}

// TestTopics: partitions from CreateTopic, groups with offsets rows, and
// the newest message, in text and JSON.
func TestTopics(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, pglease.CreateTopic(context.Background(), f.pool, "two", pglease.TopicConfig{Partitions: 2,
		Retention: time.Hour, Tables: f.tables}))
	f.publish("plain", 3)
	f.subscribe("g", "two")
	waitFor(t, 10*time.Second, "the offsets rows of two", func() bool { return len(f.lag("--topic", "two")) == 2 })

	var page admin.TopicPage
	require.NoError(t, json.Unmarshal([]byte(f.ok("topics", "--json")), &page))
	assert.Equal(t, int64(2), page.Total)
	assert.Nil(t, page.Next)
	topics := page.Topics
	require.Len(t, topics, 2)
	assert.Equal(t, "plain", topics[0].Topic)
	assert.Equal(t, 1, topics[0].Partitions)
	assert.Equal(t, int64(0), topics[0].Groups)
	require.NotNil(t, topics[0].NewestAt)
	assert.Equal(t, "two", topics[1].Topic)
	assert.Equal(t, 2, topics[1].Partitions)
	assert.Equal(t, int64(1), topics[1].Groups)
	assert.Nil(t, topics[1].NewestAt)

	out := f.ok("topics")
	assert.Equal(t, []string{"TOPIC", "PARTITIONS", "RETENTION", "KEY-WINDOW", "GROUPS", "NEWEST"}, strings.Fields(strings.SplitN(out, "\n", 2)[0]))
	assert.Equal(t, []string{"plain", "1", "-", "24h0m0s", "0", topics[0].NewestAt.UTC().Format(time.RFC3339)}, tableRow(t, out, "plain"))
	assert.Equal(t, []string{"two", "2", "1h0m0s", "24h0m0s", "1", "-"}, tableRow(t, out, "two"))
	assert.Equal(t, time.Hour, topics[1].Retention)
}

// TestResetOffsets: earliest, by time and latest on a topic nobody owns;
// a dry run changes nothing; refused while a live Subscriber owns the
// topic, changing nothing; applied with --force, naming the fenced owner.
func TestResetOffsets(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	first := f.publish("t", 3)
	var boundary time.Time
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&boundary))
	f.publish("t", 3)
	only := func() admin.LagInfo {
		t.Helper()
		rows := f.lag("--group", "g", "--topic", "t")
		require.Len(t, rows, 1)
		return rows[0]
	}

	out := f.ok("reset-offsets", "--group", "g", "--topic", "t", "--to-earliest")
	assert.Contains(t, out, `Reset consumer group "g" on topic "t" to earliest.`)
	assert.Equal(t, []string{"0", "0:0", "0:0", "-"}, tableRow(t, out, "0"), "a new row: from the beginning to it")
	l := only()
	assert.Equal(t, pglease.Position{}, l.Position)
	assert.Equal(t, int64(6), l.Lag)

	var res resetOutput
	require.NoError(t, json.Unmarshal([]byte(f.ok("reset-offsets", "--group", "g", "--topic", "t",
		"--to-time", boundary.Format(time.RFC3339Nano), "--json")), &res))
	assert.Equal(t, "time", res.To)
	require.NotNil(t, res.Time)
	assert.True(t, boundary.Equal(*res.Time))
	require.Len(t, res.Partitions, 1)
	assert.Equal(t, pglease.Position{}, res.Partitions[0].From)
	l = only()
	assert.Equal(t, res.Partitions[0].To, l.Position)
	assert.Equal(t, int64(3), l.Lag, "the 3 messages stored after the time")

	f.ok("reset-offsets", "--group", "g", "--topic", "t", "--to-latest")
	l = only()
	assert.Equal(t, int64(math.MaxInt64), l.Position.Offset, "latest is (bound - 1, the largest offset)")
	assert.Positive(t, l.Position.TransactionID)
	assert.Equal(t, int64(0), l.Lag)
	latest := l.Position

	out = f.ok("reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--dry-run")
	assert.Contains(t, out, "Dry run, nothing was changed")
	assert.Equal(t, []string{"0", formatPosition(latest), "0:0", "-"}, tableRow(t, out, "0"))
	assert.Equal(t, latest, only().Position, "a dry run changes nothing")

	// A live owner.
	_, msgs := f.subscribe("g", "t")
	f.publish("t", 1)
	msg := receive(t, msgs) // in flight, not acked
	l = only()
	require.Equal(t, thisOwner(t), l.Owner)

	r := f.cli("reset-offsets", "--group", "g", "--topic", "t", "--to-earliest")
	assert.Equal(t, 1, r.code, "%s", r)
	assert.Contains(t, r.stderr, "a live session owns the offsets")
	assert.Contains(t, r.stderr, fmt.Sprintf("partition 0 by %s (session %s)", l.Owner, l.OwnerSession))
	assert.Contains(t, r.stderr, "Nothing was changed. With --force")
	assert.Empty(t, r.stdout)
	after := only()
	assert.Equal(t, l.Position, after.Position, "a refused reset changes nothing")
	assert.Equal(t, l.Epoch, after.Epoch)

	out = f.ok("reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--force")
	assert.Equal(t, []string{"0", formatPosition(latest), "0:0", l.Owner}, tableRow(t, out, "0"))
	assert.Contains(t, out, fmt.Sprintf("Fenced %s (session %s) on partition 0.", l.Owner, l.OwnerSession))
	after = only()
	assert.Greater(t, after.Epoch, l.Epoch, "fenced")
	assert.Equal(t, pglease.Position{}, after.Position)
	// The owner learns of the reset; once its message in flight is acked
	// (that commit is refused by the epoch), it gives the row up and
	// delivers again from the beginning.
	msg.Ack()
	again := receive(t, msgs)
	assert.Equal(t, first[0], again.UUID, "delivered again from the reset position")
	assert.Equal(t, pglease.Position{}, only().Position, "the ack made before the reset did not move it")
	again.Nack()
}

// TestBadInput: usage errors exit with status 2 before connecting; errors
// of the database exit with status 1.
func TestBadInput(t *testing.T) {
	db := map[string]string{"DATABASE_URL": testDSN}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"no command", db, nil, 2, "Commands:"},
		{"unknown command", db, []string{"offsets"}, 2, `unknown command "offsets"`},
		{"flag before the command", db, []string{"--dsn", "x", "status"}, 2, "flags go after the command"},
		{"unknown flag", db, []string{"status", "--verbose"}, 2, "flag provided but not defined: -verbose"},
		{"extra argument", db, []string{"lag", "billing"}, 2, `unexpected argument "billing"`},
		{"missing --group", db, []string{"reset-offsets", "--topic", "t", "--to-latest"}, 2, "--group is required"},
		{"--group twice", db, []string{"reset-offsets", "--group", "a", "--group", "b", "--topic", "t", "--to-latest"}, 2,
			"given more than once"},
		{"missing --topic", db, []string{"reset-offsets", "--group", "g", "--to-latest"}, 2, "--topic is required"},
		{"empty --topic", db, []string{"reset-offsets", "--group", "g", "--topic", "", "--to-latest"}, 2, "--topic is required"},
		{"no --to", db, []string{"reset-offsets", "--group", "g", "--topic", "t"}, 2,
			"one of --to-earliest, --to-latest, --to-time and --skip is required"},
		{"--skip not a position", db, []string{"reset-offsets", "--group", "g", "--topic", "t", "--skip", "7"}, 2,
			"is not a position TRANSACTION:OFFSET"},
		{"--skip with --to-latest", db, []string{"reset-offsets", "--group", "g", "--topic", "t", "--skip", "7:1", "--to-latest"}, 2,
			"give only one of"},
		{"two --to", db, []string{"reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--to-latest"}, 2,
			"give only one of --to-earliest, --to-latest, --to-time and --skip, not --to-earliest and --to-latest"},
		{"--to-time and --to-latest", db, []string{"reset-offsets", "--group", "g", "--topic", "t", "--to-latest",
			"--to-time", "2026-01-02T03:04:05Z"}, 2, "not --to-latest and --to-time"},
		{"bad time", db, []string{"reset-offsets", "--group", "g", "--topic", "t", "--to-time", "yesterday"}, 2,
			`--to-time "yesterday" is not an RFC 3339 time`},
		{"time without zone", db, []string{"reset-offsets", "--group", "g", "--topic", "t", "--to-time", "2026-01-02T03:04:05"}, 2,
			"is not an RFC 3339 time"},
		{"negative --warn-after", db, []string{"status", "--warn-after", "-1s"}, 2, "--warn-after must not be negative"},
		{"no DSN", nil, []string{"lag"}, 2, "no database to connect to: pass --dsn or set DATABASE_URL"},
		{"unreachable database", nil, []string{"lag", "--dsn", "postgres://postgres@127.0.0.1:1/x?connect_timeout=5"}, 1,
			"pglease lag: connect:"},
		{"no tables in the schema", db, []string{"topics", "--schema", "pglease_cmd_test_missing"}, 1,
			`No pglease tables in schema "pglease_cmd_test_missing"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no tables in the schema" {
				pgtest.SkipShort(t) // the one case that reads the database
			}
			r := runCLI(t, tc.env, tc.args...)
			assert.Equal(t, tc.code, r.code, "%s", r)
			assert.Contains(t, r.stderr, tc.stderr)
			assert.Empty(t, r.stdout)
			if tc.code == 2 && len(tc.args) > 0 && lookup(tc.args[0]) != nil && tc.name != "no DSN" {
				assert.Contains(t, r.stderr, "usage: pglease "+tc.args[0], "the command's usage")
			}
		})
	}
}

// TestHelp: help goes to stdout with exit status 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		r := runCLI(t, nil, args...)
		assert.Equal(t, 0, r.code, "%s", r)
		assert.Contains(t, r.stdout, "Commands:")
		for _, c := range commands {
			assert.Contains(t, r.stdout, "  "+c.name+" ")
		}
	}
	for _, c := range commands {
		for _, args := range [][]string{{"help", c.name}, {c.name, "-h"}, {c.name, "--help"}} {
			r := runCLI(t, nil, args...)
			assert.Equal(t, 0, r.code, "%s", r)
			assert.Contains(t, r.stdout, "Usage: pglease "+c.name)
			assert.Contains(t, r.stdout, "--dsn URL")
			assert.Empty(t, r.stderr)
		}
	}
	r := runCLI(t, nil, "help", "nope")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, `unknown command "nope"`)
}

// TestResetOffsetsSkip: --skip moves a group past one message of a
// partition: the group delivers the others, in order; skipping it again
// says there is nothing to skip (exit status 1).
func TestResetOffsetsSkip(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	ids := f.publish("t", 3)
	f.ok("reset-offsets", "--group", "g", "--topic", "t", "--to-earliest")
	var tx, off int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT transaction_id::text::bigint, "offset" FROM `+
		pgx.Identifier{f.schema, pglease.DefaultMessagesTable}.Sanitize()+` WHERE uuid = $1`, ids[1]).Scan(&tx, &off))
	pos := fmt.Sprintf("%d:%d", tx, off)

	out := f.ok("reset-offsets", "--group", "g", "--topic", "t", "--skip", pos, "--dry-run")
	assert.Contains(t, out, "Dry run, nothing was changed")
	out = f.ok("reset-offsets", "--group", "g", "--topic", "t", "--skip", pos)
	assert.Contains(t, out, `Made consumer group "g" skip message `+pos+` of topic "t" partition 0`)
	r := f.cli("reset-offsets", "--group", "g", "--topic", "t", "--skip", pos)
	assert.Equal(t, 1, r.code, "%s", r)
	assert.Contains(t, r.stderr, "nothing to skip")

	_, msgs := f.subscribe("g", "t")
	for _, want := range []string{ids[0], ids[2]} {
		select {
		case m := <-msgs:
			assert.Equal(t, want, m.UUID)
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("message %s not delivered", want)
		}
	}
}

// TestStatusShowsWaiting: a message that failed under a failure policy
// and waits for its next attempt is listed by status, with its group,
// topic, partition and attempts, in text and JSON.
func TestStatusShowsWaiting(t *testing.T) {
	f := newFixture(t)
	f.failOnce("billing", "orders")
	var st statusOutput
	waitFor(t, 10*time.Second, "the waiting message in status", func() bool {
		st = statusOutput{}
		require.NoError(t, json.Unmarshal([]byte(f.ok("status", "--json")), &st))
		return len(st.Waiting) == 1
	})
	w := st.Waiting[0]
	assert.Equal(t, []any{"billing", "orders", int32(0), 1, 1}, []any{w.ConsumerGroup, w.Topic, w.Partition, w.Waiting, w.Attempts})
	require.NotNil(t, w.NextAttempt)
	out := f.ok("status")
	assert.Contains(t, out, "Waiting for a retry (failure policy): 1 message(s)")
	row := tableRow(t, out, "billing", "orders")
	assert.Equal(t, []string{"billing", "orders", "0", "1", "1"}, row[:5])
}
