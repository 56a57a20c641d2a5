// Package importtest checks wmsqlimport.Run against the real
// watermill-sql v4 (its pgx adapter), which only the benchmarks module may
// depend on. The tests need PostgreSQL, found as the library's tests find
// it (internal/pgtest: PGLEASE_TEST_DSN, which `make test` sets, else a
// Docker engine); under -short they skip.
package importtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/wmsqlimport"
)

// wmBatch is watermill-sql's batch size, and the acknowledged counts are
// multiples of it: its Subscriber commits a group's offset once per batch.
const wmBatch = 100

// env is one test's two schemas: watermill-sql's tables (through the
// search_path of wm, as watermill-sql names them) and pglease's.
type env struct {
	admin   *pgxpool.Pool
	wm      *pgxpool.Pool
	pg      *pgxpool.Pool
	adapter pglease.Tables
}

// testDSN is the database of the tests (see TestMain).
var testDSN string

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, "benchmarks/importtest", func(dsn string) { testDSN = dsn }))
}

func dsn(t testing.TB) string {
	t.Helper()
	pgtest.SkipShort(t)
	return testDSN
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ctx := context.Background()
	d := dsn(t)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	wmSchema, pgSchema := "wm_"+hex.EncodeToString(suffix), "pgl_"+hex.EncodeToString(suffix)
	admin, err := pgxpool.New(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	for _, s := range []string{wmSchema, pgSchema} {
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		})
	}
	cfg, err := pgxpool.ParseConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = wmSchema
	wm, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wm.Close)
	pg, err := pgxpool.New(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	e := &env{admin: admin, wm: wm, pg: pg, adapter: pglease.Tables{Schema: pgSchema}}
	if err := pglease.Migrate(ctx, pg, e.adapter); err != nil {
		t.Fatal(err)
	}
	return e
}

// publish publishes messages n = from..to-1 of topic with watermill-sql,
// 25 per call (one transaction each), and returns their UUIDs in order.
func (e *env) publish(t testing.TB, topic string, from, to int) []string {
	t.Helper()
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(e.wm), wsql.PublisherConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var uuids []string
	for start := from; start < to; start += 25 {
		var msgs []*message.Message
		for n := start; n < min(start+25, to); n++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"n": %d}`, n)))
			m.Metadata.Set("n", strconv.Itoa(n))
			msgs = append(msgs, m)
			uuids = append(uuids, m.UUID)
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	return uuids
}

// consumeWM acknowledges the first count messages of topic for group with
// watermill-sql's Subscriber, then stops it once the next message was
// handed out (so that the batch with the last acknowledged one committed).
func (e *env) consumeWM(t testing.TB, topic, group string, count int) {
	t.Helper()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(e.wm), wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: wmBatch},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= count; i++ {
		select {
		case m := <-ch:
			if i < count {
				m.Ack()
			}
		case <-ctx.Done():
			t.Fatalf("watermill-sql group %s on %s: %d of %d messages", group, topic, i, count+1)
		}
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
}

// wmAcked returns the UUID of the message that group's watermill-sql
// offset row points at.
func (e *env) wmAcked(t testing.TB, topic, group string) string {
	t.Helper()
	var uuid string
	err := e.wm.QueryRow(context.Background(), `SELECT m.uuid FROM `+pgx.Identifier{"watermill_" + topic}.Sanitize()+` m
JOIN `+pgx.Identifier{"watermill_offsets_" + topic}.Sanitize()+` o
	ON o.last_processed_transaction_id = m.transaction_id AND o.offset_acked = m."offset"
WHERE o.consumer_group = $1`, group).Scan(&uuid)
	if err != nil {
		t.Fatalf("watermill-sql offset of %s on %s: %v", group, topic, err)
	}
	return uuid
}

// receiver is a pglease Subscriber of a group on topics, recording what
// it receives (and acknowledging it).
type receiver struct {
	sub    *pglease.Subscriber
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	got  map[string][]string // topic -> UUIDs in order of delivery
	meta map[string][]string // topic -> metadata "n" in order of delivery
	cond chan struct{}       // closed and replaced on every delivery
}

func (e *env) receive(t testing.TB, group string, topics ...string) *receiver {
	t.Helper()
	sub, err := pglease.NewSubscriber(e.pg, pglease.SubscriberConfig{
		ConsumerGroup: group, Tables: e.adapter, PollInterval: 50 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &receiver{sub: sub, cancel: cancel, got: map[string][]string{}, meta: map[string][]string{}, cond: make(chan struct{})}
	for _, topic := range topics {
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for m := range ch {
				r.mu.Lock()
				r.got[topic] = append(r.got[topic], m.UUID)
				r.meta[topic] = append(r.meta[topic], m.Metadata.Get("n"))
				close(r.cond)
				r.cond = make(chan struct{})
				r.mu.Unlock()
				m.Ack()
			}
		}()
	}
	t.Cleanup(r.close)
	return r
}

func (r *receiver) close() {
	r.cancel()
	_ = r.sub.Close()
	r.wg.Wait()
}

// waitFor waits until topic has delivered n messages (or more).
func (r *receiver) waitFor(t testing.TB, topic string, n int) []string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		r.mu.Lock()
		got, wake := append([]string(nil), r.got[topic]...), r.cond
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("topic %s: %d of %d messages after a minute", topic, len(got), n)
		}
	}
}

// lagZero waits until the group's lag on topic, as pglease's Inspector
// counts it, is 0: nothing more is to come.
func (e *env) lagZero(t testing.TB, group, topic string) {
	t.Helper()
	insp, err := admin.NewInspector(e.pg, e.adapter)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := insp.Lag(context.Background(), admin.LagFilter{ConsumerGroups: []string{group}, Topics: []string{topic}})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 1 && rows[0].Lag == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s on %s: lag %+v after a minute", group, topic, rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sameOrder(t testing.TB, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: message %d is %s, want %s", what, i, got[i], want[i])
		}
	}
}

// The test: 1,000 messages on each of two topics with
// watermill-sql v4, 400 acknowledged by group A and 100 by group B; after
// the import pglease delivers A the other 600 and B the other 900 of
// each topic, in order, exactly once; 50 more published to watermill-sql
// and imported again arrive, and only they.
func TestImportWatermillSQL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	topics := []string{"orders", "payments"}
	const published, ackedA, ackedB = 1000, 400, 100
	uuids := map[string][]string{}
	for _, topic := range topics {
		uuids[topic] = e.publish(t, topic, 0, published)
		e.consumeWM(t, topic, "A", ackedA)
		e.consumeWM(t, topic, "B", ackedB)
		if got := e.wmAcked(t, topic, "A"); got != uuids[topic][ackedA-1] {
			t.Fatalf("watermill-sql: A acknowledged up to %s, want message %d", got, ackedA-1)
		}
		if got := e.wmAcked(t, topic, "B"); got != uuids[topic][ackedB-1] {
			t.Fatalf("watermill-sql: B acknowledged up to %s, want message %d", got, ackedB-1)
		}
	}

	dry, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{All: true, Tables: e.adapter, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Topics) != 2 || dry.Topics[0].Messages != published-ackedB {
		t.Fatalf("dry run: %+v", dry)
	}
	var stored int
	if err := e.pg.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{e.adapter.Schema, pglease.DefaultMessagesTable}.Sanitize()).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("after the dry run %d messages are stored (%v), want 0", stored, err)
	}

	report, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{All: true, Tables: e.adapter})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Topics) != 2 {
		t.Fatalf("report: %+v", report)
	}
	for i, it := range report.Topics {
		if it.Topic != topics[i] || it.SourceKind != "transaction_id" || it.Messages != published-ackedB || it.Run != 1 || len(it.Groups) != 2 {
			t.Fatalf("topic %d: %+v", i, it)
		}
		for _, g := range it.Groups {
			if g.Action != wmsqlimport.GroupCreated {
				t.Fatalf("topic %s group %s: %s, want created", it.Topic, g.ConsumerGroup, g.Action)
			}
		}
	}

	// Running again with nothing new copies nothing and leaves the groups.
	again, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: topics, Tables: e.adapter})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range again.Topics {
		if it.Messages != 0 || it.Groups[0].Action != wmsqlimport.GroupUnchanged {
			t.Fatalf("second run without news: %+v", it)
		}
	}

	a := e.receive(t, "A", topics...)
	b := e.receive(t, "B", topics...)
	for _, topic := range topics {
		sameOrder(t, "A on "+topic, a.waitFor(t, topic, published-ackedA), uuids[topic][ackedA:])
		sameOrder(t, "B on "+topic, b.waitFor(t, topic, published-ackedB), uuids[topic][ackedB:])
		e.lagZero(t, "A", topic)
		e.lagZero(t, "B", topic)
	}
	a.mu.Lock()
	if a.meta["orders"][0] != strconv.Itoa(ackedA) {
		t.Errorf("metadata of A's first message: n=%s, want %d", a.meta["orders"][0], ackedA)
	}
	a.mu.Unlock()

	// 50 more with watermill-sql, imported while A and B consume in pglease.
	const more = 50
	for _, topic := range topics {
		uuids[topic] = append(uuids[topic], e.publish(t, topic, published, published+more)...)
	}
	report, err = wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: topics, Tables: e.adapter})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range report.Topics {
		if it.Messages != more || it.Run != 2 {
			t.Fatalf("run 2: %+v", it)
		}
		for _, g := range it.Groups {
			if g.Action != wmsqlimport.GroupKept {
				t.Fatalf("run 2, topic %s group %s: %s, want kept", it.Topic, g.ConsumerGroup, g.Action)
			}
		}
	}
	for _, topic := range topics {
		sameOrder(t, "A on "+topic+" after run 2", a.waitFor(t, topic, published-ackedA+more), uuids[topic][ackedA:])
		sameOrder(t, "B on "+topic+" after run 2", b.waitFor(t, topic, published-ackedB+more), uuids[topic][ackedB:])
		e.lagZero(t, "A", topic)
		e.lagZero(t, "B", topic)
	}
	a.close()
	b.close()
	for _, topic := range topics {
		sameOrder(t, "A on "+topic+" at the end", a.got[topic], uuids[topic][ackedA:])
		sameOrder(t, "B on "+topic+" at the end", b.got[topic], uuids[topic][ackedB:])
	}
}

// A group that keeps consuming in watermill-sql between two runs, and has
// not started in pglease, follows: its offset row moves with the second
// run. A new pglease group reads the imported messages from the first.
// A message published to pglease before the first import comes after the
// messages of that import.
func TestImportFollowsGroupsNotStartedInPglease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const topic = "events"
	uuids := e.publish(t, topic, 0, 300)
	e.consumeWM(t, topic, "A", 100)

	pub, err := pglease.NewPublisher(e.pg, pglease.PublisherConfig{Tables: e.adapter}, nil)
	if err != nil {
		t.Fatal(err)
	}
	early := message.NewMessage(watermill.NewUUID(), []byte(`{"early": true}`))
	if err := pub.Publish(topic, early); err != nil {
		t.Fatal(err)
	}

	if _, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: []string{topic}, Tables: e.adapter}); err != nil {
		t.Fatal(err)
	}
	e.consumeWM(t, topic, "A", 100) // A goes on in watermill-sql: 200 acknowledged now
	uuids = append(uuids, e.publish(t, topic, 300, 320)...)
	report, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: []string{topic}, Tables: e.adapter})
	if err != nil {
		t.Fatal(err)
	}
	if g := report.Topics[0].Groups[0]; g.Action != wmsqlimport.GroupMoved || report.Topics[0].Messages != 20 {
		t.Fatalf("run 2: %+v", report.Topics[0])
	}

	late := message.NewMessage(watermill.NewUUID(), []byte(`{"late": true}`))
	if err := pub.Publish(topic, late); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	a := e.receive(t, "A", topic)
	n := e.receive(t, "new", topic)
	// The first run put its messages before the pglease message published
	// before it (no group consumed the topic in pglease yet); the second
	// run's come after it, and before what was published after them.
	// A: the 120 it had not acknowledged in watermill-sql, with the
	// pglease messages where they belong; "new": everything imported.
	join := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	wantA := join(uuids[200:300], []string{early.UUID}, uuids[300:], []string{late.UUID})
	sameOrder(t, "A", a.waitFor(t, topic, len(wantA)), wantA)
	wantNew := join(uuids[100:300], []string{early.UUID}, uuids[300:], []string{late.UUID})
	sameOrder(t, "new", n.waitFor(t, topic, len(wantNew)), wantNew)
	e.lagZero(t, "A", topic)
}

// v4's delayed pub/sub: what is not acknowledged is carried, the messages
// still delayed as pglease delayed messages.
func TestImportDelayedPubSub(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const topic = "reminders"
	pub, err := wsql.NewDelayedPostgreSQLPublisher(wsql.BeginnerFromPgx(e.wm), wsql.DelayedPostgreSQLPublisherConfig{
		DelayPublisherConfig: delay.PublisherConfig{AllowNoDelay: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	due := message.NewMessage(watermill.NewUUID(), []byte(`"due"`))
	later := message.NewMessage(watermill.NewUUID(), []byte(`"later"`))
	delay.Message(later, delay.For(time.Hour))
	if err := pub.Publish(topic, due, later); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()

	report, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: []string{topic}, Tables: e.adapter})
	if err != nil {
		t.Fatal(err)
	}
	if it := report.Topics[0]; it.SourceKind != "queue" || it.Messages != 1 || it.Delayed != 1 {
		t.Fatalf("report: %+v", it)
	}
	var uuid string
	var dueAt time.Time
	if err := e.pg.QueryRow(ctx, `SELECT uuid, due_at FROM `+pgx.Identifier{e.adapter.Schema, pglease.DefaultDelayedTable}.Sanitize()).
		Scan(&uuid, &dueAt); err != nil {
		t.Fatal(err)
	}
	if uuid != later.UUID || time.Until(dueAt) < 50*time.Minute {
		t.Fatalf("delayed row %s due %v, want %s in an hour", uuid, dueAt, later.UUID)
	}
	r := e.receive(t, "g", topic)
	sameOrder(t, "delivered", r.waitFor(t, topic, 1), []string{due.UUID})
}

// A table that is not watermill-sql's default schema is refused, naming
// the table and the column.
func TestImportRefusesOtherSchemas(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.wm.Exec(ctx, `CREATE TABLE watermill_custom ("offset" bigserial, uuid text, created_at timestamp,
	payload json, metadata json, transaction_id xid8, tenant text)`); err != nil {
		t.Fatal(err)
	}
	_, err := wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: []string{"custom"}, Tables: e.adapter})
	if !errors.Is(err, wmsqlimport.ErrNotWatermillSQLSchema) || !strings.Contains(err.Error(), `"watermill_custom"`) || !strings.Contains(err.Error(), `"tenant"`) {
		t.Fatalf("err = %v, want ErrNotWatermillSQLSchema naming watermill_custom and tenant", err)
	}
	_, err = wmsqlimport.Run(ctx, e.pg, e.wm, wmsqlimport.Config{Topics: []string{"missing"}, Tables: e.adapter})
	if !errors.Is(err, wmsqlimport.ErrNotWatermillSQLSchema) || !strings.Contains(err.Error(), `"watermill_missing"`) {
		t.Fatalf("err = %v, want ErrNotWatermillSQLSchema naming watermill_missing", err)
	}
}
