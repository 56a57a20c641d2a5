package pgsql

import (
	"context"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// insertThroughCoordinator stores p's messages through the coordinator
// with the statements of the routed insert (see citus_route.go): the
// placements of the call's topics read from the coordinator's copies of
// the reference tables, then an INSERT ... VALUES per topic, which Citus
// plans as a router insert into the topic's shard and relays to its
// worker whole, and the notifications, in one batch. The INSERT ...
// SELECT of insertMessagesStmt costs more: Citus runs its SELECT on the
// coordinator and copies the rows to every shard they go to as
// intermediate results, over parallel connections it opens per worker
// (docs/scaling.md, "Scale-out, simulated").
//
// The batch is one transaction: q's when q is in one (a pgx.Tx, a
// connection inside a transaction block), else, when it has several
// inserts, its own, BEGIN and COMMIT in the batch (a pool's connection, a
// connection outside a transaction block). Not a pipeline's implicit
// transaction: Citus sees no transaction block there and commits each
// router insert on its worker as the statement ends, so that a later
// statement's failure would leave the earlier topics stored. It reports
// false, and does nothing, for a Querier that is none of those.
//
// The notifications are sent in the same transaction, at its commit, as
// insertMessagesStmt sends them: one statement, queued first, for the
// partitions known here (one partition, or the messages' hashes), and,
// for a topic of several partitions whose messages have no partition
// key, a notifying select over the insert's returned partitions, on the
// coordinator. The inserts come last, so that an open publisher's last
// statement on the coordinator is an insert (pglease status shows it).
func (d citus) insertThroughCoordinator(ctx context.Context, q Querier, p InsertMessagesParams) (bool, error) {
	switch c := q.(type) {
	case *pgxpool.Pool:
		conn, err := c.Acquire(ctx)
		if err != nil {
			return true, err
		}
		defer conn.Release()
		return true, d.insertBatch(ctx, conn.Conn(), p, true)
	case *pgx.Conn:
		return true, d.insertBatch(ctx, c, p, c.PgConn().TxStatus() == 'I')
	case pgx.Tx:
		return true, d.insertBatch(ctx, c, p, false)
	}
	return false, nil
}

// insertBatch runs insertThroughCoordinator's statements on q, in a
// transaction of their own (own, when there are several inserts) or in
// q's. One insert needs none: its notifications are in the same
// statement, or the implicit transaction of the batch's, which ends with
// the insert's.
func (d citus) insertBatch(ctx context.Context, q BatchQuerier, p InsertMessagesParams, own bool) error {
	qs, err := Routed{d: d}.inserts(ctx, q, p)
	if err != nil {
		return err
	}
	var payloads payloadSet
	for k, c := range qs {
		if p.NotifyChannel == "" || payloads.addKnown(p, c) {
			continue
		}
		// The insert computes the partitions: the notifications are a
		// select over what it returns.
		s := c.s
		ch := "$" + strconv.Itoa(len(s.Args)+1)
		s.SQL = `WITH inserted AS (
` + s.SQL + `
)
SELECT pg_catalog.pg_notify(` + ch + `::text, ` + messagesPayload("t.partition", "$1::text") + `)
FROM (SELECT DISTINCT i.partition FROM inserted i) t`
		s.Args = append(slices.Clip(s.Args), p.NotifyChannel)
		qs[k].s = s
	}
	own = own && len(qs) > 1
	b := &pgx.Batch{}
	if own {
		b.Queue("BEGIN")
	}
	if len(payloads.list) > 0 {
		n := notifyPayloadsStmt(p.NotifyChannel, payloads.list)
		b.Queue(n.SQL, n.Args...)
	}
	for _, c := range qs {
		b.Queue(c.s.SQL, c.s.Args...)
	}
	if own {
		b.Queue("COMMIT")
	}
	err = q.SendBatch(ctx, b).Close()
	if err != nil && own {
		if c, ok := q.(*pgx.Conn); ok {
			rollbackFailed(ctx, c)
		}
	}
	return err
}
