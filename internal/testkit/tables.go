package testkit

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// Table is the quoted, schema-qualified name of tables's table name.
func Table(tables pglease.Tables, name string) string {
	return pgx.Identifier{tables.Schema, name}.Sanitize()
}

// OffsetRow is what [ReadOffset] reads of an offset row.
type OffsetRow struct {
	Session *uuid.UUID
	Epoch   int64
	Offset  int64
}

// ReadOffset reads the offset row of (group, topic).
func ReadOffset(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, group, topic string) OffsetRow {
	t.Helper()
	var r OffsetRow
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT session_id, epoch, acked_offset FROM "+Table(tables, pglease.DefaultConsumerOffsetsTable)+
			" WHERE consumer_group = $1 AND topic = $2", group, topic).Scan(&r.Session, &r.Epoch, &r.Offset))
	return r
}

// AckedOffset reads the acknowledged position of partition 0 of (group,
// topic).
func AckedOffset(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables, group, topic string) pglease.Position {
	t.Helper()
	var tx string
	var off int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT acked_transaction_id::text, acked_offset FROM `+
		Table(tables, pglease.DefaultConsumerOffsetsTable)+` WHERE consumer_group = $1 AND topic = $2 AND partition = 0`,
		group, topic).Scan(&tx, &off))
	return ParsePos(tx, off)
}

// ParsePos is the position of transaction id tx (xid8 as text) and offset
// off; it panics when tx is not a number.
func ParsePos(tx string, off int64) pglease.Position {
	x, err := strconv.ParseUint(tx, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("xid8 %q: %v", tx, err))
	}
	return pglease.Position{TransactionID: x, Offset: off}
}

// TablesOf returns the statements pglease runs on a's tables, for tests
// that run one themselves.
func TablesOf(a pglease.Tables) *pgsql.Tables {
	return pgsql.NewTables(pgsql.Names(a))
}

// DriverOf returns the driver of a's tables (opened on first use, see
// pgsql.Lazy), for tests that run one of pglease's statements themselves.
func DriverOf(a pglease.Tables) pgsql.Driver {
	return pgsql.NewLazy(TablesOf(a))
}

// ServerHere is the identity of the server q runs on (pgsql.Here): what
// the statements fenced by a session's identity take for a session made
// there.
func ServerHere(t testing.TB, q pgsql.Querier) string {
	t.Helper()
	here, err := pgsql.Here(context.Background(), q)
	if err != nil {
		t.Fatalf("read the server's identity: %v", err)
	}
	return here
}

// CreateTables creates the pglease tables in tables's schema.
func CreateTables(t *testing.T, pool *pgxpool.Pool, tables pglease.Tables) {
	t.Helper()
	_, err := pool.Exec(context.Background(), pglease.SchemaSQL(tables))
	require.NoError(t, err)
}

// ExecQuery runs q on conn and returns the number of rows it affected.
func ExecQuery(t *testing.T, conn *pgxpool.Conn, q pgsql.Stmt) int64 {
	t.Helper()
	tag, err := conn.Exec(context.Background(), q.SQL, q.Args...)
	require.NoError(t, err, q.SQL)
	return tag.RowsAffected()
}

// EnsureRow creates the offset row of (group, topic).
func EnsureRow(t *testing.T, conn *pgxpool.Conn, tables pglease.Tables, group, topic string) {
	t.Helper()
	ExecQuery(t, conn, TablesOf(tables).EnsureOffsets(pgsql.OffsetsParams{ConsumerGroup: group, Topics: []string{topic}}))
}

// ClaimOutcome is what the tables's claim statement said of one topic.
type ClaimOutcome struct {
	Claimed  bool
	Epoch    *int64
	Previous *uuid.UUID
	Future   bool
}

// ClaimQuery is the claim statement for one topic, by a session made on
// the server whose identity is here ([ServerHere]).
func ClaimQuery(tables pglease.Tables, group, topic string, session uuid.UUID, here string) pgsql.Stmt {
	return TablesOf(tables).ClaimOffsets(pgsql.OffsetsParams{ConsumerGroup: group, Topics: []string{topic}, SessionID: session,
		Here: here, Limit: 1})
}

// ScanClaim reads the rows of a one-topic claim statement.
func ScanClaim(rows pgx.Rows) (ClaimOutcome, error) {
	var o ClaimOutcome
	for rows.Next() {
		var (
			kind, topic string
			partition   int32
			tx          *string
			offset      *int64
			hasNext     *bool
			owner       *string
			above       []string
		)
		if err := rows.Scan(&kind, &topic, &partition, &o.Epoch, &tx, &offset, &hasNext, &o.Previous, &owner, &above); err != nil {
			return o, err
		}
		o.Claimed = kind == "c"
		o.Future = kind == "f"
	}
	return o, rows.Err()
}
