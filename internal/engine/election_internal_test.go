package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/pgsql"
	"github.com/pglease/watermill-pglease/internal/pgtest"
)

// These tests need no database: the maintainer's election, as plain
// functions (election.go) and against fakeMaintainerStore, an in-memory
// maintainer's row and sessions.

func ms(n int64) *int64 { return &n }

func holderOf(id uuid.UUID) *[16]byte { h := [16]byte(id); return &h }

func TestCandidacyOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		row     pgsql.AccessRow
		err     error
		kind    candidateKind
		missing []string
		fails   string // part of the error, when it could not find out
	}{
		{name: "the owner's privileges", row: pgsql.AccessRow{Role: "app", Owner: "app", Owns: true}, kind: standAsOwner},
		{name: "owner and grants: runs the DDL itself", row: pgsql.AccessRow{Owns: true, Missing: []string{"x"}}, kind: standAsOwner},
		{name: "the grants of GrantSQL", row: pgsql.AccessRow{Role: "app", Owner: "owner"}, kind: standDelegated},
		{name: "neither", row: pgsql.AccessRow{Role: "app", Owner: "owner", Missing: []string{"EXECUTE on f"}},
			kind: notStanding, missing: []string{"EXECUTE on f"}},
		{name: "no USAGE on the schema", err: &pgconn.PgError{Code: "42501", Message: "permission denied for schema s"},
			kind: notStanding, missing: []string{"permission denied for schema s"}},
		{name: "the messages table is missing", err: pgx.ErrNoRows, fails: "run pglease.Migrate"},
		{name: "undefined table", err: &pgconn.PgError{Code: "42P01"}, fails: "the pglease tables are missing"},
		{name: "unreachable", err: errors.New("dial tcp: connection refused"), fails: "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := candidacyOf(tc.row, tc.err)
			if tc.fails != "" {
				if err == nil || !strings.Contains(err.Error(), tc.fails) {
					t.Fatalf("error %v, want one saying %q", err, tc.fails)
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v", err)
			}
			if c.kind != tc.kind || fmt.Sprint(c.missing) != fmt.Sprint(tc.missing) {
				t.Errorf("candidacy %v %q, want %v %q", c.kind, c.missing, tc.kind, tc.missing)
			}
		})
	}
}

func TestLooksFree(t *testing.T) {
	t.Parallel()
	me, other := uuid.UUID{1}, uuid.UUID{2}
	for _, tc := range []struct {
		name string
		row  pgsql.HolderRow
		free bool
	}{
		{"no holder", pgsql.HolderRow{}, true},
		{"mine (a claim whose reply was lost)", pgsql.HolderRow{Holder: holderOf(me), ExpiresInMs: ms(5000)}, true},
		{"another's, alive", pgsql.HolderRow{Holder: holderOf(other), ExpiresInMs: ms(5000)}, false},
		{"another's, alive for 1 ms", pgsql.HolderRow{Holder: holderOf(other), ExpiresInMs: ms(1)}, false},
		{"another's, expiring now", pgsql.HolderRow{Holder: holderOf(other), ExpiresInMs: ms(0)}, true},
		{"another's, expired", pgsql.HolderRow{Holder: holderOf(other), ExpiresInMs: ms(-300)}, true},
		{"another's, its session row gone", pgsql.HolderRow{Holder: holderOf(other)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := looksFree(tc.row, me); got != tc.free {
				t.Errorf("looksFree = %v, want %v", got, tc.free)
			}
		})
	}
}

func TestCandidateWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		expiresIn *int64
		spread    time.Duration
		wait      time.Duration
	}{
		{"unknown expiry", nil, 0, 100 * time.Millisecond},
		{"unknown expiry, spread", nil, 300 * time.Millisecond, 400 * time.Millisecond},
		{"just after the holder's expiry", ms(6000), 0, 6020 * time.Millisecond},
		{"after the expiry, spread", ms(6000), 250 * time.Millisecond, 6270 * time.Millisecond},
		{"an expiry sooner than 100 ms", ms(30), 0, 100 * time.Millisecond},
		{"an expiry past (lost the race to another candidate)", ms(-50), 10 * time.Millisecond, 110 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := candidateWait(tc.expiresIn, tc.spread); got != tc.wait {
				t.Errorf("candidateWait = %s, want %s", got, tc.wait)
			}
		})
	}
}

func TestReleaseAtTermEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ closing, lost, release bool }{
		{closing: true, lost: false, release: true},  // Close: hand the role over at once
		{closing: true, lost: true, release: false},  // not ours any more
		{closing: false, lost: true, release: false}, // the session was lost: step down
		{closing: false, lost: false, release: false},
	} {
		if got := releaseAtTermEnd(tc.closing, tc.lost); got != tc.release {
			t.Errorf("releaseAtTermEnd(closing %v, lost %v) = %v, want %v", tc.closing, tc.lost, got, tc.release)
		}
	}
}

// fakeMaintainerStore is the maintainer's row and the sessions it is held
// through. Safe for concurrent use.
type fakeMaintainerStore struct {
	mu       sync.Mutex
	missing  bool                // the row does not exist
	holder   *uuid.UUID          // nil: free
	epoch    int64               // bumped on every claim
	sessions map[uuid.UUID]int64 // live sessions: ms left (<= 0: expired)
	access   pgsql.AccessRow
	fail     map[string]error // the next call of a method fails with its error
	calls    map[string]int
	released []int64 // epochs released
	// taken, when set, is a candidate that claims the row between this
	// one's read and its claim.
	taken *uuid.UUID
	// onRelease runs after a release (the notification).
	onRelease func()
}

func newFakeMaintainerStore() *fakeMaintainerStore {
	return &fakeMaintainerStore{sessions: map[uuid.UUID]int64{}, fail: map[string]error{}, calls: map[string]int{},
		access: pgsql.AccessRow{Role: "app", Owner: "app", Owns: true}}
}

func (f *fakeMaintainerStore) call(method string) error {
	f.calls[method]++
	err := f.fail[method]
	delete(f.fail, method)
	return err
}

func (f *fakeMaintainerStore) rowLocked() pgsql.HolderRow {
	var r pgsql.HolderRow
	if f.holder != nil {
		r.Holder = holderOf(*f.holder)
		if left, ok := f.sessions[*f.holder]; ok {
			r.ExpiresInMs = ms(left)
		}
	}
	return r
}

func (f *fakeMaintainerStore) accessRow(context.Context) (pgsql.AccessRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("access"); err != nil {
		return pgsql.AccessRow{}, err
	}
	return f.access, nil
}

func (f *fakeMaintainerStore) holderRow(context.Context) (pgsql.HolderRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("holder"); err != nil {
		return pgsql.HolderRow{}, err
	}
	if f.missing {
		return pgsql.HolderRow{}, pgx.ErrNoRows
	}
	return f.rowLocked(), nil
}

func (f *fakeMaintainerStore) claimRow(_ context.Context, session uuid.UUID) (pgsql.HolderRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("claim"); err != nil {
		return pgsql.HolderRow{}, err
	}
	if f.missing {
		return pgsql.HolderRow{}, pgx.ErrNoRows
	}
	if f.taken != nil {
		f.holder, f.taken = f.taken, nil
		f.epoch++
	}
	if f.holder != nil && *f.holder != session {
		left, alive := f.sessions[*f.holder]
		if alive && left > 0 {
			return f.rowLocked(), nil
		}
		delete(f.sessions, *f.holder) // the expired holder's session row goes with the takeover
	}
	f.holder = &session
	f.epoch++
	r := f.rowLocked()
	r.Epoch = ms(f.epoch)
	return r, nil
}

func (f *fakeMaintainerStore) releaseRow(_ context.Context, session uuid.UUID, epoch int64) error {
	f.mu.Lock()
	if err := f.call("release"); err != nil {
		f.mu.Unlock()
		return err
	}
	if f.holder != nil && *f.holder == session && f.epoch == epoch {
		f.holder = nil
		f.released = append(f.released, epoch)
	}
	notify := f.onRelease
	f.mu.Unlock()
	if notify != nil {
		notify()
	}
	return nil
}

func (f *fakeMaintainerStore) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *fakeMaintainerStore) heldBy() (uuid.UUID, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holder == nil {
		return uuid.Nil, f.epoch
	}
	return *f.holder, f.epoch
}

// fakeMaintainerStoreAPI adapts fakeMaintainerStore to maintainerStore
// (its methods' names are taken by its fields).
type fakeMaintainerStoreAPI struct{ *fakeMaintainerStore }

func (f fakeMaintainerStoreAPI) access(ctx context.Context) (pgsql.AccessRow, error) {
	return f.accessRow(ctx)
}
func (f fakeMaintainerStoreAPI) holder(ctx context.Context) (pgsql.HolderRow, error) {
	return f.holderRow(ctx)
}
func (f fakeMaintainerStoreAPI) claim(ctx context.Context, s uuid.UUID) (pgsql.HolderRow, error) {
	return f.claimRow(ctx, s)
}
func (f fakeMaintainerStoreAPI) release(ctx context.Context, s uuid.UUID, epoch int64) error {
	return f.releaseRow(ctx, s, epoch)
}
func (f fakeMaintainerStoreAPI) moveDue(context.Context, int) (int64, *int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return 0, nil, f.call("moveDue")
}
func (f fakeMaintainerStoreAPI) forgetKeys(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return 0, f.call("forgetKeys")
}

func (f fakeMaintainerStoreAPI) deleteExpiredSessions(context.Context, time.Duration) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return 0, f.call("deleteExpiredSessions")
}
func (f fakeMaintainerStoreAPI) deleteIdleGroups(context.Context, time.Duration) ([]pgsql.IdleGroupRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return nil, f.call("deleteIdleGroups")
}

// fakeSession is a session keeper: one generation at a time.
type fakeSession struct {
	mu    sync.Mutex
	g     *sessionGen
	ready chan struct{}
}

func newFakeSession(id uuid.UUID) *fakeSession {
	g := &sessionGen{id: id, lost: make(chan struct{})}
	g.trustUntil.Store(math.MaxInt64)
	return &fakeSession{g: g}
}

func (s *fakeSession) current() (*sessionGen, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.g != nil && !s.g.isLost() {
		return s.g, nil
	}
	if s.ready == nil {
		s.ready = make(chan struct{})
	}
	return nil, s.ready
}

func newTestMaintainer(store *fakeMaintainerStore, session sessionSource) *maintainer {
	return newMaintainer(maintainerDeps{
		cfg: MaintenanceSettings{Interval: time.Hour}, sessionTTL: 2 * time.Second, stmtTimeout: 2 * time.Second, closeTimeout: time.Second,
		logger: watermill.NopLogger{}, stats: newSubscriberStats(nil), session: session,
		store:     fakeMaintainerStoreAPI{store},
		spread:    func(time.Duration) time.Duration { return 0 },
		runUpkeep: func(ctx context.Context) { <-ctx.Done() },
	})
}

// TestMaintainerClaim: one election attempt of a candidate, from each
// state the maintainer's row can be in.
func TestMaintainerClaim(t *testing.T) {
	t.Parallel()
	me, other := uuid.UUID{1}, uuid.UUID{2}
	unreachable := errors.New("dial tcp: connection refused")
	for _, tc := range []struct {
		name    string
		setup   func(f *fakeMaintainerStore)
		elected int64 // the epoch won, 0 for none
		wait    time.Duration
		claims  int    // claim statements run
		fails   string // part of the error
	}{
		{name: "free: elected", elected: 1, claims: 1},
		{name: "held by a live session: waits past its expiry, no claim statement", setup: func(f *fakeMaintainerStore) {
			f.holder, f.epoch, f.sessions[other] = &other, 3, 4000
		}, wait: 4020 * time.Millisecond},
		{name: "held by an expired session: taken over", setup: func(f *fakeMaintainerStore) {
			f.holder, f.epoch, f.sessions[other] = &other, 3, -10
		}, elected: 4, claims: 1},
		{name: "its holder's session row gone: taken over", setup: func(f *fakeMaintainerStore) {
			f.holder, f.epoch = &other, 3
		}, elected: 4, claims: 1},
		{name: "already mine (a claim whose reply was lost): claimed again", setup: func(f *fakeMaintainerStore) {
			f.holder, f.epoch, f.sessions[me] = &me, 2, 5000
		}, elected: 3, claims: 1},
		{name: "another candidate won between read and claim", setup: func(f *fakeMaintainerStore) {
			f.taken, f.sessions[other] = &other, 1500
		}, wait: 1520 * time.Millisecond, claims: 1},
		{name: "the read fails: no claim", setup: func(f *fakeMaintainerStore) {
			f.fail["holder"] = unreachable
		}, fails: "connection refused"},
		{name: "the claim fails", setup: func(f *fakeMaintainerStore) {
			f.fail["claim"] = &pgconn.PgError{Code: "40001", Message: "could not serialize"}
		}, claims: 1, fails: "could not serialize"},
		{name: "the row is missing", setup: func(f *fakeMaintainerStore) { f.missing = true },
			fails: "the maintainer's row is missing"},
		{name: "the tables are missing", setup: func(f *fakeMaintainerStore) {
			f.fail["holder"] = &pgconn.PgError{Code: "42P01"}
		}, fails: "pglease.Migrate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeMaintainerStore()
			f.sessions[me] = 5000
			if tc.setup != nil {
				tc.setup(f)
			}
			s := newFakeSession(me)
			m := newTestMaintainer(f, s)
			epoch, wait, err := m.claim(context.Background(), s.g)
			switch {
			case tc.fails != "":
				if err == nil || !strings.Contains(err.Error(), tc.fails) {
					t.Fatalf("error %v, want one saying %q", err, tc.fails)
				}
			case err != nil:
				t.Fatalf("error %v", err)
			case tc.elected != 0 && (epoch == nil || *epoch != tc.elected):
				t.Fatalf("epoch %v, want %d", epoch, tc.elected)
			case tc.elected == 0 && (epoch != nil || wait != tc.wait):
				t.Fatalf("epoch %v, wait %s; want not elected, wait %s", epoch, wait, tc.wait)
			}
			if got := f.count("claim"); got != tc.claims {
				t.Errorf("%d claim statements, want %d", got, tc.claims)
			}
			if holder, _ := f.heldBy(); tc.elected != 0 && holder != me {
				t.Errorf("the row is held by %v", holder)
			}
		})
	}
}

// TestMaintainerDecide: who stands for maintainer, and what a failure to
// find out does (an error, to be retried).
func TestMaintainerDecide(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		access    pgsql.AccessRow
		err       error
		stand     bool
		delegated bool
		fails     bool
	}{
		{name: "owner", access: pgsql.AccessRow{Owns: true}, stand: true},
		{name: "grants", access: pgsql.AccessRow{Owner: "owner"}, stand: true, delegated: true},
		{name: "neither", access: pgsql.AccessRow{Missing: []string{"EXECUTE"}}},
		{name: "no schema USAGE", err: &pgconn.PgError{Code: "42501"}},
		{name: "unreachable", err: errors.New("i/o timeout"), fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeMaintainerStore()
			f.access = tc.access
			if tc.err != nil {
				f.fail["access"] = tc.err
			}
			m := newTestMaintainer(f, newFakeSession(uuid.UUID{1}))
			stand, err := m.decide(context.Background())
			if (err != nil) != tc.fails || stand != tc.stand || m.delegated != tc.delegated {
				t.Errorf("stand %v, delegated %v, error %v; want %v, %v, error: %v", stand, m.delegated, err, tc.stand, tc.delegated, tc.fails)
			}
		})
	}
}

// TestMaintainerTerms runs two candidates' loops against one row: the
// first is elected and moves delayed messages (retrying a failure); the
// second stands by; Close of the first releases the row and the second,
// notified, takes over; a lost session ends a term without a release; a
// candidate whose role may not maintain does not stand.
func TestMaintainerTerms(t *testing.T) {
	t.Parallel()
	const deadline = 5 * time.Second
	f := newFakeMaintainerStore()
	idA, idB := uuid.UUID{1}, uuid.UUID{2}
	f.sessions[idA], f.sessions[idB] = 60000, 60000
	f.fail["moveDue"] = errors.New("connection reset") // the first move fails
	sa, sb := newFakeSession(idA), newFakeSession(idB)
	a, b := newTestMaintainer(f, sa), newTestMaintainer(f, sb)
	f.onRelease = func() { a.notified('e'); b.notified('e') }

	a.loop.Start(context.Background(), a.run)
	pgtest.WaitFor(t, deadline, "a elected", func() bool { h, _ := f.heldBy(); return h == idA && a.active.Load() })
	pgtest.WaitFor(t, deadline, "a moves due messages again after a failure", func() bool { return f.count("moveDue") >= 2 })

	b.loop.Start(context.Background(), b.run)
	pgtest.WaitFor(t, deadline, "b reads the row", func() bool { return f.count("holder") >= 2 })
	if b.active.Load() || f.count("claim") != 1 {
		t.Fatalf("b active %v with %d claim statements: a live holder's row was claimed", b.active.Load(), f.count("claim"))
	}

	a.loop.Stop() // Close
	if a.active.Load() {
		t.Fatal("a still active after its loop stopped")
	}
	if f.released == nil || f.released[0] != 1 {
		t.Fatalf("released epochs %v, want a's epoch 1", f.released)
	}
	// b was waiting until after a's expiry, a minute away: only the
	// release's notification can wake it in time.
	pgtest.WaitFor(t, deadline, "b takes over", func() bool { h, e := f.heldBy(); return h == idB && e == 2 && b.active.Load() })

	// b's session is lost: it steps down and does not release (the row is
	// taken when its session expires).
	sb.g.markLost()
	pgtest.WaitFor(t, deadline, "b steps down", func() bool { return !b.active.Load() })
	b.loop.Stop()
	if len(f.released) != 1 {
		t.Errorf("released epochs %v: a lost session released the row", f.released)
	}
	if got := a.stats.maintainerTerms.Load() + b.stats.maintainerTerms.Load(); got != 2 {
		t.Errorf("%d terms, want 2", got)
	}

	// A role that may not maintain does not stand: its loop ends by itself.
	f.access = pgsql.AccessRow{Missing: []string{"EXECUTE"}}
	c := newTestMaintainer(f, newFakeSession(uuid.UUID{3}))
	c.loop.Start(context.Background(), c.run)
	select {
	case <-c.loop.Done():
	case <-time.After(deadline):
		c.loop.Stop()
		t.Fatal("a candidate without the privileges stands")
	}
}
