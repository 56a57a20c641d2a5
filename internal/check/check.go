// Package check holds the argument checks and error hints that pglease
// and its admin packages (admin, wmsqlimport) share, so that a topic or
// a table name is refused the same way, with the same words, whichever
// package takes it. The sentinel errors stay in the packages that export
// them: the checks here describe the problem, and the caller wraps its
// own sentinel around it.
package check

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Topic describes what is wrong with a topic name (empty, longer than
// maxLength bytes, not UTF-8 or holding a NUL byte), nil when nothing is;
// the caller wraps pglease.ErrInvalidTopic around it and passes
// pglease.MaxTopicLength.
func Topic(topic string, maxLength int) error {
	switch {
	case topic == "":
		return errors.New("topic is empty")
	case len(topic) > maxLength:
		return fmt.Errorf("topic is %d bytes long, at most %d are allowed", len(topic), maxLength)
	case strings.IndexByte(topic, 0) >= 0:
		return fmt.Errorf("topic %q contains a NUL byte", topic)
	case !utf8.ValidString(topic):
		return fmt.Errorf("topic %q is not valid UTF-8", topic)
	}
	return nil
}

// TableNames describes what is wrong with the names of a
// Tables (a name longer than PostgreSQL's 63 bytes, or
// holding a NUL byte), naming its field; nil when nothing is.
func TableNames(n pgsql.Names) error {
	for _, f := range []struct{ field, value string }{
		{"Schema", n.Schema},
		{"MessagesTable", n.MessagesTable},
		{"ConsumerSessionsTable", n.ConsumerSessionsTable},
		{"ConsumerOffsetsTable", n.ConsumerOffsetsTable},
		{"SchemaVersionTable", n.SchemaVersionTable},
		{"TopicsTable", n.TopicsTable},
		{"DelayedTable", n.DelayedTable},
		{"MaintenanceTable", n.MaintenanceTable},
		{"RetentionTable", n.RetentionTable},
	} {
		if len(f.value) > 63 {
			return fmt.Errorf("pglease.Tables.%s must be at most 63 bytes, got %d", f.field, len(f.value))
		}
		if strings.ContainsRune(f.value, 0) {
			return fmt.Errorf("pglease.Tables.%s must not contain a NUL byte", f.field)
		}
	}
	return nil
}

// NilDB reports whether db, a pglease.DB, is nil or a nil *pgxpool.Pool
// or *pgx.Conn.
func NilDB(db any) bool {
	switch d := db.(type) {
	case nil:
		return true
	case *pgxpool.Pool:
		return d == nil
	case *pgx.Conn:
		return d == nil
	}
	return false
}

// MissingSchema adds what to do to the errors that say that the tables
// are missing or that the role may not use them; other errors are
// returned as they are.
func MissingSchema(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "42P01": // undefined_table
		return fmt.Errorf("%w (the pglease tables are missing: run pglease.Migrate or `pglease migrate` as the role that is to own them, "+
			"or apply pglease.SchemaSQL with your migration tool)", err)
	case "42501": // insufficient_privilege
		return fmt.Errorf("%w (the role lacks pglease's grants: have the owner of the tables run pglease.GrantSQL "+
			"or `pglease grant --role NAME`)", err)
	}
	return err
}
