package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// poolConnectTimeout is the ConnectTimeout pgxpool gives a connection whose
// config has none, so that a dial cannot hang for ever.
const poolConnectTimeout = 2 * time.Minute

// poolDialer opens connections outside a pool exactly as the pool opens its
// own: from a copy of the pool's ConnConfig, with pgxpool's default
// ConnectTimeout, through the pool config's BeforeConnect and AfterConnect
// hooks, and closed through its BeforeClose hook. Applications put IAM
// tokens, roles and session settings in those hooks; a connection made
// without them may fail to log in or behave differently from the pool's.
//
// With a ConnConfig of its own (SubscriberConfig.ListenConnConfig), it
// dials that instead of the pool's, still through the pool's hooks.
//
// The hooks that concern acquiring from the pool (PrepareConn,
// BeforeAcquire, AfterRelease, ShouldPing) do not apply. A poolDialer is
// safe for concurrent use.
type poolDialer struct {
	config *pgxpool.Config
	// conn, when not nil, replaces the pool's ConnConfig (the pool's
	// hooks still apply): SubscriberConfig.ListenConnConfig.
	conn *pgx.ConnConfig
}

func newPoolDialer(pool *pgxpool.Pool) poolDialer {
	return poolDialer{config: pool.Config()}
}

// dial opens a connection. Close it with close.
func (d poolDialer) dial(ctx context.Context) (*pgx.Conn, error) {
	base := d.config.ConnConfig
	if d.conn != nil {
		base = d.conn
	}
	cfg := base.Copy()
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = poolConnectTimeout
	}
	if d.config.BeforeConnect != nil {
		if err := d.config.BeforeConnect(ctx, cfg); err != nil {
			return nil, fmt.Errorf("pool's BeforeConnect hook: %w", err)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if d.config.AfterConnect != nil {
		if err := d.config.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(ctx) // as pgxpool: without BeforeClose
			return nil, fmt.Errorf("pool's AfterConnect hook: %w", err)
		}
	}
	return conn, nil
}

// close closes conn, made by dial, waiting at most timeout for the server to
// be told.
func (d poolDialer) close(conn *pgx.Conn, timeout time.Duration) {
	if d.config.BeforeClose != nil {
		d.config.BeforeClose(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = conn.Close(ctx)
}

var (
	sessionConnsMu sync.Mutex
	sessionConns   = map[*pgxpool.Pool]*sessionConn{}
)

// errSessionConnReleased is returned by a statement on a sessionConn that
// its last user released; no keeper does that.
var errSessionConnReleased = errors.New("session connection already released")

// sessionConn is the connection on which the session keepers of every
// Subscriber of the process that use one pool run their session
// statements (create, heartbeat, delete), one at a time. It is not one of
// the pool's connections: the application's load on the pool (other
// Subscribers, Publishers, its own queries) can take every pooled
// connection, and a heartbeat that waits for one lets the session
// self-fence and every topic be claimed again.
//
// It is reference-counted like sharedListener: acquireSessionConn returns
// the one of the pool, made on first use, and the last release closes it.
// The connection is dialled (poolDialer) on the first statement, and again
// on the statement after an error that may have left it unusable. A
// sessionConn is safe for concurrent use.
type sessionConn struct {
	pool   *pgxpool.Pool
	dialer poolDialer
	refs   int // guarded by sessionConnsMu

	// turn is held by the statement that uses conn. It is a channel, not a
	// mutex, so that a statement waits for its turn only until its
	// deadline.
	turn     chan struct{}
	conn     *pgx.Conn // nil until dialled, and after an error dropped it
	released bool
	// systemID is the system identifier of the server the connection was
	// last dialled to ("" when not known: not dialled yet, or the role may
	// not read pg_control_system()).
	systemID atomic.Pointer[string]
}

// acquireSessionConn returns the session connection of pool, adding a
// reference; give it back with release.
func acquireSessionConn(pool *pgxpool.Pool) *sessionConn {
	sessionConnsMu.Lock()
	defer sessionConnsMu.Unlock()
	c := sessionConns[pool]
	if c == nil {
		c = &sessionConn{pool: pool, dialer: newPoolDialer(pool), turn: make(chan struct{}, 1)}
		sessionConns[pool] = c
	}
	c.refs++
	return c
}

// release drops a reference. The last one closes the connection after the
// statement under way, if any, telling the server unless timeout passes
// first; a Subscriber that starts afterwards gets a new sessionConn.
func (c *sessionConn) release(timeout time.Duration) {
	sessionConnsMu.Lock()
	c.refs--
	last := c.refs == 0
	if last {
		delete(sessionConns, c.pool)
	}
	sessionConnsMu.Unlock()
	if !last {
		return
	}
	c.turn <- struct{}{}
	defer func() { <-c.turn }()
	c.released = true
	if c.conn != nil {
		c.dialer.close(c.conn, timeout)
		c.conn = nil
	}
}

// run runs stmt, one statement on the connection, after the statements
// of other Subscribers before it, and dials the connection first if
// needed; waiting and dialling count against ctx. An error that may have
// left the connection unusable (any but an error the server returned for
// the statement, with the connection open and out of any transaction)
// closes it: the next statement dials again.
func (c *sessionConn) run(ctx context.Context, stmt func(q pgsql.Querier) error) error {
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for the session connection: %w", ctx.Err())
	}
	defer func() { <-c.turn }()
	if c.released {
		return errSessionConnReleased
	}
	if err := c.dialIfNeeded(ctx); err != nil {
		return err
	}
	err := stmt(c.conn)
	c.afterError(err)
	return err
}

// dialIfNeeded dials the connection when there is none, and reads the
// system identifier of the server it reached. Called with the turn held.
func (c *sessionConn) dialIfNeeded(ctx context.Context) error {
	if c.conn != nil {
		return nil
	}
	conn, err := c.dialer.dial(ctx)
	if err != nil {
		return fmt.Errorf("connect for session statements: %w", err)
	}
	id, err := pgsql.SystemIdentifier(ctx, conn)
	if err != nil {
		if !usableAfter(conn, err) {
			c.dialer.close(conn, 0)
			return fmt.Errorf("connect for session statements: %w", err)
		}
		id = "" // not allowed to read it: the other signs still tell
	}
	c.systemID.Store(&id)
	c.conn = conn
	return nil
}

// afterError drops the connection after an error that may have left it
// unusable: most such errors closed it already (a deadline or a network
// error does). It is closed without waiting to tell the server: it may not
// answer, and others wait for their turn. Called with the turn held.
func (c *sessionConn) afterError(err error) {
	if err != nil && !usableAfter(c.conn, err) {
		c.dialer.close(c.conn, 0)
		c.conn = nil
	}
}

// serverID is the system identifier of the server the connection was last
// dialled to, "" when unknown.
func (c *sessionConn) serverID() string {
	if p := c.systemID.Load(); p != nil {
		return *p
	}
	return ""
}

// usableAfter reports whether conn can run another statement after err:
// the server rejected the statement and the connection is open and idle.
func usableAfter(conn *pgx.Conn, err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !conn.IsClosed() && conn.PgConn().TxStatus() == 'I'
}
