package pglease_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// The test binary runs as a subscriber process when helperEnv is set: it
// subscribes with the settings in the PGLEASE_HELPER_* variables, prints
// "ready" once Subscribe returned, "msg <uuid>" for each message it acks,
// and on SIGTERM closes the Subscriber and prints "closed".
const helperEnv = "PGLEASE_HELPER"

func runHelperProcess() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGLEASE_HELPER_DSN"))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	ttl, err := time.ParseDuration(os.Getenv("PGLEASE_HELPER_TTL"))
	if err != nil {
		return fail(err)
	}
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    os.Getenv("PGLEASE_HELPER_GROUP"),
		SessionTTL:       ttl,
		PollInterval:     20 * time.Millisecond,
		InitializeSchema: true,
		SchemaAdapter:    pglease.DefaultSchemaAdapter{Schema: os.Getenv("PGLEASE_HELPER_SCHEMA")},
	}, nil)
	if err != nil {
		return fail(err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)

	msgs, err := sub.Subscribe(ctx, os.Getenv("PGLEASE_HELPER_TOPIC"))
	if err != nil {
		return fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	println := func(s string) {
		_, _ = out.WriteString(s + "\n")
		_ = out.Flush()
	}
	println("ready")
	for {
		select {
		case msg, ok := <-msgs:
			if !ok {
				return fail(fmt.Errorf("messages channel closed before SIGTERM"))
			}
			println("msg " + msg.UUID)
			msg.Ack()
		case <-term:
			if err := sub.Close(); err != nil {
				return fail(err)
			}
			println("closed")
			return 0
		}
	}
}

// helperProcess is a subscriber process started by a test.
type helperProcess struct {
	cmd   *exec.Cmd
	lines chan string
	mu    sync.Mutex
	got   []string
}

func startHelper(t *testing.T, schema, group, topic string, ttl time.Duration) *helperProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		helperEnv+"=1",
		"PGLEASE_HELPER_DSN="+testDSN,
		"PGLEASE_HELPER_SCHEMA="+schema,
		"PGLEASE_HELPER_GROUP="+group,
		"PGLEASE_HELPER_TOPIC="+topic,
		"PGLEASE_HELPER_TTL="+ttl.String(),
	)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	h := &helperProcess{cmd: cmd, lines: make(chan string, 10000)}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if uuid, ok := strings.CutPrefix(line, "msg "); ok {
				h.mu.Lock()
				h.got = append(h.got, uuid)
				h.mu.Unlock()
			}
			h.lines <- line
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// waitLine waits for the process to print want.
func (h *helperProcess) waitLine(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-h.lines:
			require.True(t, ok, "helper exited before printing %q", want)
			if line == want {
				return
			}
		case <-deadline:
			t.Fatalf("helper did not print %q within %s", want, timeout)
		}
	}
}

func (h *helperProcess) received() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

func (h *helperProcess) has(uuid string) bool {
	for _, u := range h.received() {
		if u == uuid {
			return true
		}
	}
	return false
}

// TestExclusiveOwnershipAcrossProcesses runs two Subscribers of one group in
// two processes: only the owner receives, and closing it hands the topic
// over at once, not after the session TTL.
func TestExclusiveOwnershipAcrossProcesses(t *testing.T) {
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, nil)
	require.NoError(t, err)
	const topic, group = "orders", "billing"
	const ttl = 10 * time.Second
	publish := func() string {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		require.NoError(t, pub.Publish(topic, msg))
		return msg.UUID
	}

	a := startHelper(t, adapter.Schema, group, topic, ttl)
	a.waitLine(t, "ready", 30*time.Second)
	first := publish()
	waitFor(t, 10*time.Second, "process A to receive the first message", func() bool { return a.has(first) })

	b := startHelper(t, adapter.Schema, group, topic, ttl)
	b.waitLine(t, "ready", 30*time.Second)
	var sent []string
	for i := 0; i < 20; i++ {
		sent = append(sent, publish())
	}
	last := sent[len(sent)-1]
	waitFor(t, 10*time.Second, "process A to receive 20 more messages", func() bool { return a.has(last) })
	// B has been subscribed all along (its claim retries run every 20ms):
	// as a hot standby it must not have received anything.
	assert.Empty(t, b.received(), "the standby process received messages while the owner was alive")

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	a.waitLine(t, "closed", 10*time.Second)
	closedAt := time.Now()
	next := publish()
	waitFor(t, ttl/2, "process B to take over", func() bool { return b.has(next) })
	handover := time.Since(closedAt)
	t.Logf("handover after Close: %s (session TTL %s)", handover, ttl)
	assert.Less(t, handover, 2*time.Second, "handover must come from the release, not from session expiry")
	assert.Equal(t, []string{next}, b.received(), "B must start exactly after A's last acked message")
}
