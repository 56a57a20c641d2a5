package pglease_test

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// previousRelease is the commit of the release before this one, whose
// members TestRollingDeploy runs beside this release's: schema version 8,
// the share of a group as a total. Move it to the previous release's
// commit (or tag) at every release.
const previousRelease = "ea8d8d5b34b4efc5ee6d2d9f06d33efbaf2ae148"

// oldMemberSource is the member program built against previousRelease.
const oldMemberSource = "testdata/oldrelease/main.go"

// oldMemberConfig is the JSON the old member program reads (see
// testdata/oldrelease/main.go).
type oldMemberConfig struct {
	Name         string
	DSN          string
	Schema       string
	Group        string
	Topics       []string
	Partitions   map[string]int
	SessionTTL   time.Duration
	PollInterval time.Duration
	Work         time.Duration
	RecordSQL    string
	Setup        bool
}

// buildPreviousRelease returns the member program built against
// previousRelease: the commit's tree is taken from the repository (git
// archive), the program's source added to it, and built there with the
// module cache (or the module proxy) for its dependencies. The binary is
// kept under .tmp/oldrelease/, keyed by the commit, the program's source
// and the Go version, so that it is built once.
func buildPreviousRelease(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile(oldMemberSource)
	require.NoError(t, err)
	root, err := os.Getwd() // the package's directory: the module's root
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(previousRelease + "\x00" + runtime.Version() + "\x00" + string(src)))
	dir := filepath.Join(root, ".tmp", "oldrelease")
	bin := filepath.Join(dir, previousRelease[:12]+"-"+hex.EncodeToString(sum[:6]), "oldmember")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is needed to build the previous release")
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--is-inside-work-tree").Output(); err != nil ||
		strings.TrimSpace(string(out)) != "true" {
		t.Skip("not a git checkout: the previous release cannot be built")
	}
	if err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		t.Fatalf("commit %s (the previous release) is not in this clone; a shallow clone needs `git fetch --unshallow`", previousRelease)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	work, err := os.MkdirTemp(dir, "build-")
	require.NoError(t, err)
	defer os.RemoveAll(work)
	began := time.Now()
	require.NoError(t, extractCommit(root, previousRelease, work))
	prog := filepath.Join(work, "internal", "cmd", "pglease-oldmember")
	require.NoError(t, os.MkdirAll(prog, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(prog, "main.go"), src, 0o644))
	out := filepath.Join(work, "oldmember")
	build := exec.Command("go", "build", "-o", out, "./internal/cmd/pglease-oldmember")
	build.Dir = work
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false", "CGO_ENABLED=0")
	if logs, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the member program against %s: %v\n%s", previousRelease, err, logs)
	}
	require.NoError(t, os.MkdirAll(filepath.Dir(bin), 0o755))
	require.NoError(t, os.Rename(out, bin))
	t.Logf("built the member program of %s in %s (kept in %s)", previousRelease[:7], time.Since(began).Round(time.Millisecond), bin)
	return bin
}

// extractCommit writes the tree of commit into dir (git archive, read as
// a tar stream: no tar program needed).
func extractCommit(root, commit, dir string) error {
	cmd := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	tr := tar.NewReader(stdout)
	var extractErr error
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			extractErr = err
			break
		}
		name := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		if !strings.HasPrefix(name, dir+string(filepath.Separator)) {
			extractErr = fmt.Errorf("archive entry %q outside the directory", hdr.Name)
			break
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			extractErr = os.MkdirAll(name, 0o755)
		case tar.TypeReg:
			extractErr = writeFileFrom(name, tr, os.FileMode(hdr.Mode)&0o777)
		}
		if extractErr != nil {
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %v: %s", commit, err, stderr.String())
	}
	return extractErr
}

func writeFileFrom(name string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode|0o200)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runOld runs the old member program with cfg until it exits (Setup).
func runOld(t *testing.T, bin string, cfg oldMemberConfig) {
	t.Helper()
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "PGLEASE_OLD_MEMBER="+string(js))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "old member program (%s): %s", cfg.Name, out)
}

// startOld starts an old member running cfg and waits until it is ready.
func startOld(t *testing.T, bin string, cfg oldMemberConfig) *helperProc {
	t.Helper()
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "PGLEASE_OLD_MEMBER="+string(js))
	h := launchProcess(t, helperConfig{Name: cfg.Name, Schema: cfg.Schema, Group: cfg.Group}, cmd)
	h.waitLine(t, "ready", time.Minute)
	return h
}

// ownerWatch polls the group's offset rows and measures how long each
// stays without a live owner (no session, or one that expired or is
// gone).
type ownerWatch struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	since   map[string]time.Time // rows unowned now, since when
	longest map[string]time.Duration
	err     error
}

func watchOwners(t *testing.T, pool *pgxpool.Pool, adapter pglease.Tables, group string, every time.Duration) *ownerWatch {
	t.Helper()
	w := &ownerWatch{stop: make(chan struct{}), done: make(chan struct{}),
		since: map[string]time.Time{}, longest: map[string]time.Duration{}}
	q := `SELECT ` + streamSQL + `, s.id IS NOT NULL
FROM ` + table(adapter, pglease.DefaultConsumerOffsetsTable) + ` o
LEFT JOIN ` + table(adapter, pglease.DefaultConsumerSessionsTable) + ` s ON s.id = o.session_id AND s.expires_at > now()
WHERE o.consumer_group = $1`
	go func() {
		defer close(w.done)
		for {
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			rows, err := pool.Query(ctx, q, group)
			owned := map[string]bool{}
			if err == nil {
				for rows.Next() {
					var row string
					var ok bool
					if err = rows.Scan(&row, &ok); err != nil {
						break
					}
					owned[row] = ok
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
			}
			cancel()
			w.mu.Lock()
			if err != nil {
				w.err = err
			} else {
				// A row free at this read was free since the read was
				// sent at least; one owned again was free until then at
				// most.
				for row, ok := range owned {
					from, was := w.since[row]
					switch {
					case !ok && !was:
						w.since[row] = sent
					case ok && was:
						w.longest[row] = max(w.longest[row], sent.Sub(from))
						delete(w.since, row)
					}
				}
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *ownerWatch) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// result stops the watch and returns the longest time a row was without
// a live owner (a row still free counting until now), and which.
func (w *ownerWatch) result() (string, time.Duration, error) {
	w.halt()
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var row string
	var longest time.Duration
	for r, d := range w.longest {
		if d > longest {
			row, longest = r, d
		}
	}
	for r, from := range w.since {
		if d := now.Sub(from); d > longest {
			row, longest = r, d
		}
	}
	return row, longest, w.err
}

// TestRollingDeploy runs a rolling deploy from the previous release:
// two members of previousRelease (built by the test) start a group on
// the tables of their schema version, two of this release join and
// upgrade the schema while the old ones run, a third old member starts
// on the upgraded schema, then the old ones are stopped (SIGTERM) one
// after the other while messages are published to a topic of 4
// partitions (and one of one). The two releases split the group differently
// (the old share is a total, this release's caps go by topic, and a topic
// of one row makes them differ); a row that no member's share has room
// for is taken after the grace. Checked: no row is without a live owner
// for more than a heartbeat interval once the old members owned them all;
// nothing is lost or processed twice, and every partition is processed in
// order (one deliverer at a time); once the old members are gone the new
// ones split the topic evenly; no member, old or new, logs an ERROR; each
// new member logs once that the group has members of another release.
func TestRollingDeploy(t *testing.T) {
	pgtest.SkipShort(t)
	const (
		ttl   = 6 * time.Second
		phase = 4 * time.Second // how long each mix of releases lasts
		group = "rolling"
	)
	interval := ttl / 3 // the heartbeat interval
	bin := buildPreviousRelease(t)

	pool := newPool(t, 10)
	adapter := newSchema(t, pool)
	topics := []string{"orders", "side"}
	runOld(t, bin, oldMemberConfig{Name: "setup", DSN: testkit.DSN, Schema: adapter.Schema, Topics: topics,
		Partitions: map[string]int{"orders": 4, "side": 1}, Setup: true})
	versions := table(adapter, pglease.DefaultSchemaVersionTable)
	oldVersion := schemaVersion(t, pool, versions)
	require.Less(t, oldVersion, len(tablesOf(adapter).Migrations()), "the previous release's schema is older")
	instrumentTables(t, pool, adapter)

	oldCfg := oldMemberConfig{DSN: testkit.DSN, Schema: adapter.Schema, Group: group, Topics: topics,
		SessionTTL: ttl, PollInterval: pglease.DefaultPollInterval, Work: time.Millisecond,
		RecordSQL: recordSQL(adapter.Schema)}
	var olds []*helperProc
	for _, name := range []string{"old1", "old2"} {
		c := oldCfg
		c.Name = name
		olds = append(olds, startOld(t, bin, c))
	}
	streams := []string{"orders", "orders#1", "orders#2", "orders#3", "side"}
	waitFor(t, 30*time.Second, "the old members to own every row", func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table(adapter, pglease.DefaultConsumerOffsetsTable)+
			` WHERE consumer_group = $1 AND session_id IS NOT NULL`, group).Scan(&n)
		return err == nil && n == len(streams)
	})
	watch := watchOwners(t, pool, adapter, group, 20*time.Millisecond)

	// Two members of this release join: the first upgrades the schema.
	newCfg := helperConfig{Schema: adapter.Schema, Group: group, Topics: topics, Mode: modeRouter,
		SessionTTL: ttl, PollInterval: pglease.DefaultPollInterval, Work: time.Millisecond, NoKeepalive: true}
	news := startHelpers(t, newCfg.named("new1"), newCfg.named("new2"))
	require.Equal(t, len(tablesOf(adapter).Migrations()), schemaVersion(t, pool, versions),
		"the new members upgraded the schema from version %d", oldVersion)
	// An old member started on the upgraded schema (a restart, a
	// rollback): its set-up finds the schema newer than it knows, and it
	// works with it.
	c := oldCfg
	c.Name = "old3"
	olds = append(olds, startOld(t, bin, c))

	pub := newPublisher(t, pool, adapter)
	var (
		pubMu    sync.Mutex
		attempts []publishAttempt
	)
	stopPub, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for seq := 0; ; seq++ {
			topic := "orders"
			msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(seq)))
			if seq%5 == 4 {
				topic = "side"
			} else {
				msg.Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("k%d", seq%8))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			msg.SetContext(ctx)
			err := pub.Publish(topic, msg)
			cancel()
			pubMu.Lock()
			attempts = append(attempts, publishAttempt{uuid: msg.UUID, topic: topic, err: err})
			pubMu.Unlock()
			select {
			case <-stopPub:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	halt := sync.OnceFunc(func() { close(stopPub); <-pubDone })
	t.Cleanup(halt)

	// The releases mixed: three old members and two new, then two old,
	// one, none.
	time.Sleep(phase)
	for _, old := range olds {
		took := old.close(t)
		t.Logf("%s closed in %s", old.cfg.Name, took.Round(time.Millisecond))
		time.Sleep(phase)
	}
	// Only this release's members are left: the rows taken beyond their
	// caps while the releases mixed are given back, and each holds 2
	// partitions of orders.
	waitFor(t, 10*time.Second, "the new members to split orders 2 and 2", func() bool {
		var split []int
		err := pool.QueryRow(context.Background(), `SELECT array_agg(n ORDER BY n) FROM (
	SELECT count(*) AS n FROM `+table(adapter, pglease.DefaultConsumerOffsetsTable)+`
	WHERE consumer_group = $1 AND topic = 'orders' AND session_id IS NOT NULL GROUP BY session_id) c`, group).Scan(&split)
		return err == nil && len(split) == 2 && split[0] == 2 && split[1] == 2
	})
	halt()
	waitProcessed(t, pool, adapter, topics, time.Minute)
	row, longest, watchErr := watch.result()
	require.NoError(t, watchErr)
	for _, p := range news {
		p.close(t)
	}

	h := loadHistory(t, pool, adapter, group)
	sum := h.verify(t, streams)
	failed, _ := h.verifyPublishes(t, attempts)
	assert.Zero(t, failed, "failed publishes")
	assert.Zero(t, sum.duplicates, "messages processed twice: every member ended cleanly")
	t.Logf("rolling deploy from %s (schema %d): %d messages, %d processed (%d more than once), %d claims; "+
		"longest a row was without a live owner: %s (%s); heartbeat interval %s",
		previousRelease[:7], oldVersion, sum.messages, sum.records, sum.duplicates, sum.claims,
		longest.Round(time.Millisecond), row, interval)
	assert.Less(t, longest, interval, "row %s was without a live owner for %s, more than a heartbeat interval", row, longest)

	// Schema version 14 takes positions from a sequence started above
	// the transaction counter: the previous release reads such a row as
	// ahead of the counter, refuses it (an error, retried) and delivers
	// nothing past it, so that the rows it owns wait for this release's
	// members; it logs no other error, and this release's none.
	for _, p := range append(append([]*helperProc(nil), olds...), news...) {
		for _, line := range strings.Split(p.logs(), "\n") {
			if strings.Contains(line, "level=ERROR") && (!strings.HasPrefix(p.cfg.Name, "old") ||
				!strings.Contains(line, "ahead of the database's transaction counter")) {
				t.Errorf("%s logged an error: %s", p.cfg.Name, line)
			}
		}
	}
	for _, p := range news {
		assert.Equal(t, 1, strings.Count(p.logs(), "has members of another release"),
			"%s logs once that the group has members of another release", p.cfg.Name)
	}
}
