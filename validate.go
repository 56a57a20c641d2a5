package pglease

import (
	"context"

	"github.com/jackc/pgx/v5"

	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pglease/watermill-pglease/internal/check"
)

// MaxTopicLength is the longest topic name accepted, in bytes.
const MaxTopicLength = 255

func validateTopic(topic string) error {
	if err := check.Topic(topic, MaxTopicLength); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTopic, err)
	}
	return nil
}

// validText reports whether PostgreSQL can store s in a text or jsonb value.
func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// parsedConnConfig tells whether cfg was created by pgx.ParseConfig, which
// pgx.ConnectConfig demands (it panics otherwise). It tries to connect
// with a context that has already ended, so nothing is dialled.
func parsedConnConfig(cfg *pgx.ConnConfig) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if conn, err := pgx.ConnectConfig(ctx, cfg.Copy()); err == nil {
		_ = conn.Close(context.Background())
	}
	return true
}
