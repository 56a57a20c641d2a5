package pgsql

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Idempotency keys on Citus: a keyed publish is two statements in one
// transaction, the keys' (citusKeysStmt) and then the insert without keys
// (insertMessagesStmt) of the messages whose keys were new, so that it
// opens a transaction on its topics' workers only.
//
// One statement, as insertKeyed is, cannot: its insert into the messages
// table reads which keys were new, the result of the keys' insert, which
// Citus computes apart (a sub-plan) and writes where the queries that
// read it run; it runs an INSERT ... SELECT through the coordinator
// without knowing where its SELECT will run, and so sends every sub-plan
// that statement reads to every node (Citus's intermediate result
// pruning, FindSubPlanUsages). Each keyed Publish then began a
// transaction on every worker, committed in two phases on all of them,
// and failed while any worker was down, whatever worker its topic lay on.
// Each of the two statements here reads no sub-plan in an insert: the
// keys' insert reads the parameters and the reference tables only (the
// key class decided inline, as keysWritten decides it), and returns the
// keys written to a query on the coordinator; the messages' insert is the
// one without keys, whose placement is decided inline (citusPlacement).

// citusKeysStmt is the statement that writes the keys of p's messages on
// Citus, as keysWritten does, and returns the ordinals (1-based) of the
// messages left out: with a key stored already, or not the first of its
// key among p's. Its insert reads no common table expression: c, the
// keys' classes, is computed inline from the parameters and the
// reference tables, and again, in the same snapshot, for the ordinals;
// the query that returns them reads only the results of c and the
// insert, on the coordinator. Strict, the insert has no ON CONFLICT
// clause (see strictFirst). Args: the topics and the keys of p.
func (d citus) citusKeysStmt(p InsertMessagesParams, strict bool) Stmt {
	t := d.t
	classes := `SELECT f.topic, f.key, f.n, ` + keyClassColumns(keyClassOf("tp"), "kl") + `
	FROM (SELECT DISTINCT ON (m.topic, m.key) m.topic, m.key, m.n
		FROM (SELECT u.topic, NULLIF(u.k, '')::uuid AS key, u.n FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(topic, k, n)) m
		WHERE m.key IS NOT NULL ORDER BY m.topic, m.key, m.n) f
	LEFT JOIN ` + t.Topics + ` tp ON tp.topic = f.topic
	LEFT JOIN ` + t.Retention + ` kl ON kl.retention_class = ` + keyClassOf("tp") + ` AND ` + keyWindowOf("tp") + ` > interval '1 day'`
	return Stmt{
		SQL: `WITH k AS (` + t.keysInsert(strict, "("+classes+") c", "("+keysClock+") s") + `),
c AS MATERIALIZED (` + classes + `),
fresh AS (` + keysFresh + `)
SELECT m.n FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS m(topic, k, n)
LEFT JOIN fresh ON fresh.n = m.n
WHERE NULLIF(m.k, '') IS NOT NULL AND fresh.n IS NULL`,
		Args: []any{p.Topics, keysOf(p)},
	}
}

// citusInsertKeyed stores p's messages whose keys were new, and those
// without a key, in one transaction: citusKeysStmt, then the insert
// without keys of the messages it did not leave out; it returns the
// 0-based indexes of those it left out.
//
// The transaction is q's when q is in one already (a pgx.Tx, a
// connection inside a transaction block): both statements run there, and
// the keys' insert is tolerant (strictFirst's rule). Where q runs each
// statement in a transaction of its own (a pool, a connection outside a
// transaction block), the transaction is this call's, on one connection,
// and sent in one round trip with the strict keys' insert
// (citusInsertKeyedOwn). Another Querier that can begin a transaction
// (a savepoint inside one) runs both in it; one that cannot runs the
// one-statement insertKeyed, which stores the keys and the messages
// together but opens a transaction on every worker.
func (d citus) citusInsertKeyed(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	switch c := q.(type) {
	case *pgxpool.Pool:
		conn, err := c.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer conn.Release()
		return d.citusInsertKeyedOwn(ctx, conn.Conn(), p)
	case *pgx.Conn:
		if c.PgConn().TxStatus() == 'I' {
			return d.citusInsertKeyedOwn(ctx, c, p)
		}
		return d.citusInsertKeyedIn(ctx, c, p)
	case pgx.Tx:
		return d.citusInsertKeyedIn(ctx, c, p)
	case Beginner:
		var out []int
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			var err error
			out, err = d.citusInsertKeyedIn(ctx, tx, p)
			return err
		})
		return out, err
	}
	return skipped(ctx, q, d.t.insertKeyed(p, false, noRegistration))
}

// citusInsertKeyedIn runs the two statements of citusInsertKeyed on q,
// inside a transaction, the keys' insert tolerant.
func (d citus) citusInsertKeyedIn(ctx context.Context, q Querier, p InsertMessagesParams) ([]int, error) {
	out, err := skipped(ctx, q, d.citusKeysStmt(p, false))
	if err != nil {
		return nil, err
	}
	if rest, ok := leftIn(p, out); ok {
		if _, err := exec(ctx, q, d.insertMessagesStmt(rest)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// citusInsertKeyedOwn runs citusInsertKeyed in a transaction of its own
// on conn, outside a transaction block: BEGIN, the strict keys' insert,
// the insert of the messages that do not repeat a key of p
// (repeatedKeys) and COMMIT, in one batch, one round trip. A key stored
// already fails the strict insert (unique_violation), which rolls the
// transaction back (nothing was written); the transaction runs again,
// tolerant, a statement at a time (BEGIN, the keys, the messages, COMMIT:
// the messages' insert needs the keys' result), as only a retry does.
func (d citus) citusInsertKeyedOwn(ctx context.Context, conn *pgx.Conn, p InsertMessagesParams) ([]int, error) {
	dup := repeatedKeys(p)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	keys := d.citusKeysStmt(p, true)
	b.Queue(keys.SQL, keys.Args...)
	rest, some := leftIn(p, dup)
	if some {
		ins := d.insertMessagesStmt(rest)
		b.Queue(ins.SQL, ins.Args...)
	}
	b.Queue("COMMIT")
	err := conn.SendBatch(ctx, b).Close()
	if err == nil {
		return dup, nil
	}
	if !isUniqueViolation(err) {
		rollbackFailed(ctx, conn)
		return nil, err
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		return nil, err
	}
	var out []int
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		out, err = d.citusInsertKeyedIn(ctx, tx, p)
		return err
	})
	return out, err
}

// rollbackFailed ends the transaction that a batch of its own (BEGIN
// ... COMMIT) left open on conn when one of its statements failed. On
// ctx, not beyond it: a connection whose ROLLBACK fails, or is cancelled,
// is closed by pgx, and so never reused inside that transaction.
func rollbackFailed(ctx context.Context, conn *pgx.Conn) {
	if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
}

// repeatedKeys returns the 0-based indexes of p's messages whose key an
// earlier message of the same topic has (compared as the statements
// compare them, as UUIDs), in order: the messages the keys' statement
// leaves out whichever keys were stored before.
func repeatedKeys(p InsertMessagesParams) []int {
	type topicKey struct {
		topic string
		key   uuid.UUID
	}
	var out []int
	seen := map[topicKey]bool{}
	for i, k := range keysOf(p) {
		if k == "" {
			continue
		}
		id, err := uuid.Parse(k)
		if err != nil {
			continue // the statement fails on it
		}
		tk := topicKey{p.Topics[i], id}
		if seen[tk] {
			out = append(out, i)
		}
		seen[tk] = true
	}
	return out
}

// leftIn returns p without the messages at the (sorted) indexes out and
// without keys, and whether a message is left.
func leftIn(p InsertMessagesParams, out []int) (InsertMessagesParams, bool) {
	rest := InsertMessagesParams{NotifyChannel: p.NotifyChannel}
	j := 0
	for i := range p.UUIDs {
		if j < len(out) && out[j] == i {
			j++
			continue
		}
		rest.Topics = append(rest.Topics, p.Topics[i])
		rest.UUIDs = append(rest.UUIDs, p.UUIDs[i])
		rest.Payloads = append(rest.Payloads, p.Payloads[i])
		rest.Metadata = append(rest.Metadata, p.Metadata[i])
		if p.PartitionHashes != nil {
			var h uint32
			if i < len(p.PartitionHashes) {
				h = p.PartitionHashes[i]
			}
			rest.PartitionHashes = append(rest.PartitionHashes, h)
		}
	}
	return rest, len(rest.UUIDs) > 0
}
