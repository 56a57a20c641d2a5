package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// resyncLog runs what a statement that found the session's database
// elsewhere does (sessionGen.elsewhereFor with its error, by the first
// statement and then by a second of the same generation), then what the
// new session does (resynced with where the database is now), and
// returns the lines logged.
func resyncLog(t *testing.T, prev, now clusterMark, errs ...error) map[watermill.LogLevel][]watermill.CapturedMessage {
	t.Helper()
	logger := watermill.NewCaptureLogger()
	k := &sessionKeeper{logger: logger, stats: &subscriberStats{}, kick: make(chan struct{}, 1), mark: prev}
	g := newSessionGen()
	g.keeper, k.cur = k, g
	for i, err := range errs {
		g.elsewhereFor(fmt.Sprintf("read messages of topic %d", i), err)
	}
	if !g.isLost() {
		t.Fatal("the generation was not dropped")
	}
	k.mu.Lock()
	k.resynced(now)
	k.mu.Unlock()
	out := map[watermill.LogLevel][]watermill.CapturedMessage{}
	for level, msgs := range logger.Captured() {
		out[level] = append(out[level], msgs...)
	}
	return out
}

// TestPlannedShardMoveIsLoggedOnce: a statement that found a topic's
// shard moved by a planned move (a pgsql.ShardMovedError) has the
// Subscriber resynchronise as when the database went back, and log it
// once, at Info, naming the topic and both workers, however many of the
// generation's statements found it. A statement that found the worker
// elsewhere for any other reason (pgsql.ErrWentBack alone), or a move
// found while the coordinator went back too, is still logged at Error.
func TestPlannedShardMoveIsLoggedOnce(t *testing.T) {
	t.Parallel()
	mark := clusterMark{timeline: "00000001", here: "00000001:1:1", lsn: 100, xmax: 10}
	moved := &pgsql.ShardMovedError{Topic: "orders", Shard: 102008, From: "w1:5432", To: "w2:5432"}
	movedErr := fmt.Errorf("read messages of topic %q: %w", "orders", moved)
	if !errors.Is(movedErr, pgsql.ErrWentBack) {
		t.Fatal("a ShardMovedError is not an ErrWentBack")
	}

	logged := resyncLog(t, mark, mark, movedErr, movedErr)
	if n := len(logged[watermill.ErrorLogLevel]); n != 0 {
		t.Errorf("a planned move logged %d lines at Error: %v", n, logged[watermill.ErrorLogLevel])
	}
	var lines []watermill.CapturedMessage
	for _, m := range logged[watermill.InfoLogLevel] {
		if strings.HasPrefix(m.Msg, "Shard of topic") {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("a planned move logged %d lines at Info, want 1: %v", len(lines), logged[watermill.InfoLogLevel])
	}
	for _, want := range []string{`"orders"`, "w1:5432", "w2:5432"} {
		if !strings.Contains(lines[0].Msg, want) {
			t.Errorf("the line %q does not name %s", lines[0].Msg, want)
		}
	}
	if f := lines[0].Fields; f["topic"] != "orders" || f["shard"] != int64(102008) || f["from_worker"] != "w1:5432" ||
		f["to_worker"] != "w2:5432" {
		t.Errorf("fields %v", f)
	}

	// The worker elsewhere, not moved: at Error, as ever.
	logged = resyncLog(t, mark, mark, fmt.Errorf("commit offset for topic %q: %w", "orders", pgsql.ErrWentBack))
	if errs := logged[watermill.ErrorLogLevel]; len(errs) != 1 || !errors.Is(errs[0].Err, ErrDatabaseWentBack) ||
		!strings.Contains(errs[0].Msg, "went back in time") {
		t.Errorf("a worker that went back logged %v at Error, want one line that it went back", errs)
	}
	// A move found first, a real going back second: the first statement
	// names what the generation was dropped for.
	logged = resyncLog(t, mark, mark, movedErr, pgsql.ErrWentBack)
	if n := len(logged[watermill.ErrorLogLevel]); n != 0 {
		t.Errorf("logged %d lines at Error", n)
	}
	// The coordinator went back as well: at Error.
	back := mark
	back.timeline = "00000002"
	logged = resyncLog(t, mark, back, movedErr)
	if errs := logged[watermill.ErrorLogLevel]; len(errs) != 1 || !strings.Contains(errs[0].Msg, "went back in time") {
		t.Errorf("a move found while the coordinator went back logged %v at Error, want one line that it went back", errs)
	}
}

// TestWorkerWentBackIsLoggedWithTheWorker: a statement that found its
// topic's worker of a Citus cluster gone back (a pgsql.WorkerWentBackError)
// while the coordinator, whose marks the session keeps, did not, is
// logged once at Error, as the database going back, with what the worker
// was and is and the position held against its counter: not with the
// coordinator's counters, which did not move.
func TestWorkerWentBackIsLoggedWithTheWorker(t *testing.T) {
	t.Parallel()
	mark := clusterMark{timeline: "00000001", here: "00000001:1:1", lsn: 100, xmax: 10}
	back := &pgsql.WorkerWentBackError{Topic: "orders", Position: 1 << 41, Counter: 1<<41 - 5, Before: "w:1:1", Now: "w:2:1"}
	err := fmt.Errorf("commit offset for topic %q: %w", "orders", back)
	if !errors.Is(err, pgsql.ErrWentBack) {
		t.Fatal("a WorkerWentBackError is not an ErrWentBack")
	}
	logged := resyncLog(t, mark, mark, err, err)
	errs := logged[watermill.ErrorLogLevel]
	if len(errs) != 1 || !errors.Is(errs[0].Err, ErrDatabaseWentBack) || !strings.HasPrefix(errs[0].Msg, `The worker of topic "orders" went back in time`) {
		t.Fatalf("logged %v at Error, want one line that the worker went back", errs)
	}
	f := errs[0].Fields
	if f["topic"] != "orders" || f["worker_before"] != "w:1:1" || f["worker_now"] != "w:2:1" ||
		f["position"] != uint64(1<<41) || f["worker_counter"] != uint64(1<<41-5) {
		t.Errorf("fields %v", f)
	}
	if _, ok := f["counter_before"]; ok {
		t.Errorf("the coordinator's counters logged for a worker: %v", f)
	}
}

// TestRestartFoundByAStatementBeforeTheHeartbeat: a statement finds the
// restarted server first (the generation dropped by elsewhere), then the
// heartbeat reads the restarted server's mark before the new session is
// made: the restart is still logged once, at Info, as a restart, not at
// Error as a database gone back (TestOutageLogsOncePerComponent saw
// that line under load).
func TestRestartFoundByAStatementBeforeTheHeartbeat(t *testing.T) {
	t.Parallel()
	before := clusterMark{timeline: "00000001", here: "00000001:1:1", lsn: 100, xmax: 10}
	after := clusterMark{timeline: "00000001", here: "00000001:2:1", lsn: 200, xmax: 12}
	logger := watermill.NewCaptureLogger()
	k := &sessionKeeper{logger: logger, stats: &subscriberStats{}, kick: make(chan struct{}, 1), mark: before}
	g := newSessionGen()
	g.keeper, k.cur = k, g
	g.elsewhereFor("read messages of topic \"o0\"", fmt.Errorf("read: %w", pgsql.ErrWentBack))
	if !g.isLost() {
		t.Fatal("the generation was not dropped")
	}
	if !k.backInTime(g, after) {
		t.Fatal("the heartbeat did not find the restart")
	}
	k.mu.Lock()
	k.resynced(after)
	k.mu.Unlock()
	logged := logger.Captured()
	if n := len(logged[watermill.ErrorLogLevel]); n != 0 {
		t.Errorf("a restart logged %d lines at Error: %v", n, logged[watermill.ErrorLogLevel])
	}
	var restarts []watermill.CapturedMessage
	for _, m := range logged[watermill.InfoLogLevel] {
		if strings.HasPrefix(m.Msg, "The database server restarted") {
			restarts = append(restarts, m)
		}
	}
	if len(restarts) != 1 {
		t.Fatalf("the restart logged %d lines at Info, want 1: %v", len(restarts), logged[watermill.InfoLogLevel])
	}
	if by := restarts[0].Fields["detected_by"]; by != "read messages of topic \"o0\"" {
		t.Errorf("detected_by %v, want the statement", by)
	}
	if n := k.stats.resyncs.Load(); n != 1 {
		t.Errorf("%d resynchronisations counted, want 1", n)
	}
}
