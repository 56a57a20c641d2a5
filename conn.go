package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// The hooks that concern acquiring from the pool (PrepareConn,
// BeforeAcquire, AfterRelease, ShouldPing) do not apply. A poolDialer is
// safe for concurrent use.
type poolDialer struct {
	config *pgxpool.Config
}

func newPoolDialer(pool *pgxpool.Pool) poolDialer {
	return poolDialer{config: pool.Config()}
}

// dial opens a connection. Close it with close.
func (d poolDialer) dial(ctx context.Context) (*pgx.Conn, error) {
	cfg := d.config.ConnConfig.Copy()
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
