package pgsql

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Citus: the tables distributed over a Citus cluster (see DistributeScript).
//
// A statement on a distributed table is planned on the coordinator: the
// coordinator evaluates the defaults and functions of a modification
// itself, while a statement it routes to one shard whole (every
// distributed table it reads filtered on the same topic) runs on that
// shard's worker, functions included. Transaction ids and snapshots must
// come from the topic's worker: a position is a worker's transaction id,
// compared with that worker's snapshot. So, when the messages table is
// distributed:
//
//   - a BEFORE INSERT trigger on the messages table sets transaction_id
//     to pg_current_xact_id() on the worker (the column's default would be
//     the coordinator's counter, a number the worker's snapshot says
//     nothing about);
//   - the statements that compare a position with a snapshot read one
//     topic each, so that Citus routes them to its worker whole;
//   - the identity check of a routed statement ([Here]) reads the
//     worker's identity: the session's identity is the coordinator's,
//     checked by the session's statements and the claim, which run there;
//     the statements of a claim routed to its worker check the worker's
//     identity read when it was claimed, and that the position lies below
//     that worker's counter (see citus_consume.go).

// DistributeScript returns the script that distributes the tables over
// a Citus cluster, run on the coordinator by the tables' owner after the
// migrations: the messages and offsets tables distributed by topic and
// co-located (a topic's messages and its groups' offsets on one worker),
// the other tables reference tables (a copy on every node), and the
// trigger that takes a message's transaction id on its worker. The
// offsets' topic gets the messages' collation ("C"), which co-location
// requires. Multi-shard DDL runs sequentially
// (citus.multi_shard_modify_mode), so that the script runs in one
// transaction. It may be run again: what is distributed already is left
// alone. It raises an error when the citus extension is not installed,
// and when the tables to distribute hold messages or group positions
// (positions are transaction ids of the server that took them, which the
// workers' ids would not continue).
func (t *Tables) DistributeScript() string {
	trigger := t.partitionName("transaction_id")
	fn := t.partition("transaction_id")
	lit := quoteLiteral
	reference := ""
	for _, tab := range []string{t.Sessions, t.Topics, t.Retention, t.Delayed, t.Maintenance, t.Version} {
		reference += `
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(tab) + `::regclass) THEN
		PERFORM pg_catalog.create_reference_table(` + lit(tab) + `);
	END IF;`
	}
	return doBlock(`BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
		RAISE EXCEPTION 'pglease: the citus extension is not installed in this database: CREATE EXTENSION citus on the coordinator (and every worker) first';
	END IF;
	PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Messages) + `::regclass)
		AND (EXISTS (SELECT 1 FROM ` + t.Messages + `) OR EXISTS (SELECT 1 FROM ` + t.Offsets + `)) THEN
		RAISE EXCEPTION USING
			MESSAGE = 'pglease: the tables hold messages or consumer group positions: distributing them is refused',
			DETAIL = 'Distributed, the stored messages would take the transaction ids of the workers while the groups keep this server''s, and the groups would skip or repeat messages.',
			HINT = 'Distribute tables while they are empty: run pglease migrate --citus on a new schema (--schema), publish there, and move each Subscriber over once it has consumed the old tables (docs/scaling.md, "Moving to Citus").';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Offsets) + `::regclass) THEN
		EXECUTE ` + lit(`ALTER TABLE `+t.Offsets+` ALTER COLUMN topic TYPE text COLLATE "C"`) + `;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Messages) + `::regclass) THEN
		EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS `+
		dollarQuote(t.render("0012_position.plpgsql"))) + `;
		EXECUTE ` + lit(`DROP TRIGGER IF EXISTS `+pgx.Identifier{trigger}.Sanitize()+` ON `+t.Messages) + `;
		-- Schema version 14 gives a single node's messages positions from
		-- a sequence, as the column's default: a distributed table takes
		-- its workers' transaction ids, as before.
		EXECUTE ` + lit(`ALTER TABLE `+t.Messages+` ALTER COLUMN transaction_id SET DEFAULT pg_catalog.pg_current_xact_id()`) + `;
		EXECUTE ` + lit(`CREATE TRIGGER `+pgx.Identifier{trigger}.Sanitize()+` BEFORE INSERT ON `+t.Messages+
		` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`) + `;
	END IF;` + reference + `
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Messages) + `::regclass) THEN
		-- The trigger is what takes transaction ids on the workers.
		PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
		PERFORM pg_catalog.create_distributed_table(` + lit(t.Messages) + `, 'topic');
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Offsets) + `::regclass) THEN
		PERFORM pg_catalog.create_distributed_table(` + lit(t.Offsets) + `, 'topic', colocate_with => ` + lit(t.Messages) + `);
	END IF;
	-- The idempotency keys (schema version 15) live with their topic
	-- (a schema of an earlier version has no keys table).
	IF pg_catalog.to_regclass(` + lit(t.Keys) + `) IS NOT NULL THEN
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = pg_catalog.to_regclass(` + lit(t.Keys) + `)) THEN
			PERFORM pg_catalog.create_distributed_table(` + lit(t.Keys) + `, 'topic', colocate_with => ` + lit(t.Messages) + `);
		END IF;
	END IF;
END`)
}

// asCitus returns s as it runs where the messages table is distributed:
// each call of pg_notify cast to text (Citus keeps the result of a common
// table expression as an intermediate result, which cannot hold
// pg_notify's type, void).
func asCitus(s Stmt) Stmt {
	s.SQL = notifyAsText(s.SQL)
	return s
}

// notifyAsText appends ::text to every call of pg_catalog.pg_notify in
// sql (the statements of this package: no parenthesis inside their string
// constants).
func notifyAsText(sql string) string {
	const call = "pg_catalog.pg_notify("
	var b strings.Builder
	for {
		i := strings.Index(sql, call)
		if i < 0 {
			b.WriteString(sql)
			return b.String()
		}
		depth, j := 0, i+len(call)-1
		for ; j < len(sql); j++ {
			if sql[j] == '(' {
				depth++
			} else if sql[j] == ')' {
				depth--
				if depth == 0 {
					break
				}
			}
		}
		b.WriteString(sql[:j+1])
		b.WriteString("::text")
		sql = sql[j+1:]
	}
}

// citusHereIs is hereIs in a statement that Citus routes to a topic's
// worker, where here would read the worker's identity, not the
// coordinator's that the session holds: the parameter is only typed. What
// such a statement still checks is that the position lies below the
// worker's transaction counter.
func citusHereIs(n int) string { return `($` + strconv.Itoa(n) + `::text IS NOT NULL)` }

// MoveBurnBatch and MoveBurnMax bound [PrepareMoveScript]: the worker
// consumes transaction ids in transactions of at most MoveBurnBatch
// subtransactions each (about 4 s at the 240,000 a second measured here),
// and a script that would consume more than MoveBurnMax in all (about 7
// minutes) consumes none and raises an error instead.
const (
	MoveBurnBatch = 1_000_000
	MoveBurnMax   = 100_000_000
)

// PrepareMoveScript returns the script that raises the transaction
// counter of the worker at host:port to at least margin above the
// highest counter of the cluster's workers, run on the coordinator right
// before a shard moves to that worker (citus_move_shard_placement). A
// position is a transaction id of the topic's worker: rows moved to a
// worker whose counter is lower would hold positions ahead of it (their
// commits refused, the topic stalled), and its new messages would sort
// below the groups' positions (skipped). The moved rows' transaction ids
// lie below the source's counter when the move blocks their writes; the
// margin covers what the source takes between the script and then. The
// worker consumes the transaction ids it lacks in transactions of
// MoveBurnBatch subtransactions that each write a row of a temporary
// table (about 240,000 a second measured here), each committed before the
// next: while one runs, the worker's other snapshots take the slower path
// of an overflowed subtransaction cache. When the worker lacks more than
// MoveBurnMax (margin included), the script consumes nothing and raises
// an error that says by how much: a counter that far behind is raised
// with pg_resetwal (see docs/scaling.md), not by consuming ids.
func PrepareMoveScript(host string, port int, margin uint64) string {
	return prepareMoveScript(host, port, margin, "")
}

// PrepareShardMoveScript is PrepareMoveScript for a move from the worker
// at srcHost:srcPort: it raises the target only to margin above the
// source's counter, and not at all when the target's counter is there
// already. The moved rows, and the groups' positions of their topics,
// were taken on the source (or, for a topic moved before, below a counter
// an earlier script raised the source above): no other worker's counter
// matters to this move. A target ahead of the source consumes nothing.
func PrepareShardMoveScript(srcHost string, srcPort int, host string, port int, margin uint64) string {
	return prepareMoveScript(host, port, margin, `c.nodename = `+quoteLiteral(srcHost)+` AND c.nodeport = `+strconv.Itoa(srcPort))
}

// prepareMoveScript is the script of PrepareMoveScript, raising the
// target above the highest counter of the workers that source (a
// condition on run_command_on_workers's row c) selects, every worker's
// when empty.
func prepareMoveScript(host string, port int, margin uint64, source string) string {
	const counters = `'SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())'`
	from := "true"
	if source != "" {
		from = source
	}
	return doBlock(`DECLARE
	top numeric;
	have numeric;
	burnt record;
BEGIN
	IF EXISTS (SELECT 1 FROM pg_catalog.run_command_on_workers(` + counters + `) c WHERE NOT c.success) THEN
		RAISE EXCEPTION 'pglease: cannot read the transaction counter of every worker';
	END IF;
	SELECT pg_catalog.max(c.result::numeric) FILTER (WHERE ` + from + `) + ` + strconv.FormatUint(margin, 10) + `,
		pg_catalog.max(c.result::numeric) FILTER (WHERE c.nodename = ` + quoteLiteral(host) + ` AND c.nodeport = ` + strconv.Itoa(port) + `)
	INTO top, have
	FROM pg_catalog.run_command_on_workers(` + counters + `) c;
	IF have IS NULL THEN
		RAISE EXCEPTION 'pglease: no worker %:% in the cluster', ` + quoteLiteral(host) + `, ` + strconv.Itoa(port) + `;
	END IF;
	IF top IS NULL THEN
		RAISE EXCEPTION 'pglease: no source worker in the cluster (%)', ` + quoteLiteral(from) + `;
	END IF;
	IF top - have > ` + strconv.Itoa(MoveBurnMax) + ` THEN
		RAISE EXCEPTION 'pglease: worker %:% is % transaction ids behind the counter it must reach (the source''s, or every worker''s, plus the margin), more than the % this script consumes (about 7 minutes): raise its counter with pg_resetwal --epoch, or move the shard to a worker closer to the others', ` + quoteLiteral(host) + `, ` + strconv.Itoa(port) + `, top - have, ` + strconv.Itoa(MoveBurnMax) + `
			USING ERRCODE = 'program_limit_exceeded';
	END IF;
	WHILE have < top LOOP
		SELECT * INTO burnt FROM pg_catalog.master_run_on_worker(ARRAY[` + quoteLiteral(host) + `], ARRAY[` + strconv.Itoa(port) + `],
			ARRAY[pg_catalog.format(` + quoteLiteral(`DO $burn$ BEGIN
	CREATE TEMPORARY TABLE IF NOT EXISTS pglease_counter (x integer);
	FOR i IN 1..%s LOOP
		BEGIN
			INSERT INTO pglease_counter VALUES (1);
		EXCEPTION WHEN OTHERS THEN NULL;
		END;
	END LOOP;
	DROP TABLE pglease_counter;
END $burn$`) + `, LEAST(top - have, ` + strconv.Itoa(MoveBurnBatch) + `))], false);
		IF NOT burnt.success THEN
			RAISE EXCEPTION 'pglease: raising the transaction counter of worker %:% failed: %', ` + quoteLiteral(host) + `, ` + strconv.Itoa(port) + `, burnt.result;
		END IF;
		have := have + LEAST(top - have, ` + strconv.Itoa(MoveBurnBatch) + `);
	END LOOP;
END`)
}
