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
// positions of decision 0008 on each worker (see [Tables.WorkerScript]):
// the trigger that takes a message's position from its worker's
// sequence, registering the worker's transaction there first. The
// offsets' topic gets the messages' collation ("C"), which co-location
// requires. Multi-shard DDL runs sequentially
// (citus.multi_shard_modify_mode), so that the script runs in one
// transaction, except the workers' own objects, which it creates first,
// each worker in a transaction of its own. It may be run again: what is
// distributed already is left alone, and a worker added since gets its
// objects. It raises an error when the citus extension is not installed,
// and when the tables to distribute hold messages or group positions
// (positions are those of the server that took them, which the workers'
// would not continue). Last, it grants USAGE on the identity columns'
// sequences to every role that may insert into their tables, which Citus
// needs (see citusIdentityGrants): on the coordinator, and on the
// workers' copies from its second run on.
//
// Tables distributed by an earlier release take their positions from
// their workers' transaction ids: the script replaces their trigger under
// a SHARE ROW EXCLUSIVE lock of the messages table (every node's, which
// Citus takes for it), which waits for every transaction that inserted
// with the old trigger to end and holds new inserts off until it commits.
// Every worker's sequence starts 2^40 above its transaction counter, so
// new positions sort after every stored one and every group's position
// keeps its meaning.
func (t *Tables) DistributeScript() string {
	trigger := t.partitionName("transaction_id")
	fn := t.CitusPositionFunction()
	lit := quoteLiteral
	reference := ""
	for _, tab := range []string{t.Sessions, t.Topics, t.Retention, t.Delayed, t.Maintenance, t.Version} {
		reference += `
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(tab) + `::regclass) THEN
		PERFORM pg_catalog.create_reference_table(` + lit(tab) + `);
	END IF;`
	}
	onCoordinator := func(name, signature, returns string) string {
		return `
	EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+name+signature+returns+` LANGUAGE plpgsql VOLATILE AS `+
			dollarQuote(`BEGIN
	RAISE EXCEPTION 'pglease: `+strings.ReplaceAll(name, "'", "''")+` runs on a topic''s worker, in a statement that Citus routes there whole; it was called on the coordinator';
END`)) + `;`
	}
	return doBlock(`DECLARE
	nsp name;
	failed text;
	distributed boolean;
	r record;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
		RAISE EXCEPTION 'pglease: the citus extension is not installed in this database: CREATE EXTENSION citus on the coordinator (and every worker) first';
	END IF;
	SELECT n.nspname INTO nsp FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = ` + lit(t.Messages) + `::regclass;
	-- The workers' own objects first, before anything of this transaction
	-- is on a worker (each worker's run is a transaction of its own,
	-- committed before the trigger that needs it).
	SELECT pg_catalog.string_agg(c.nodename || ':' || c.nodeport || ': ' || c.result, '; ') INTO failed
	FROM pg_catalog.run_command_on_workers(pg_catalog.format(` + lit(t.WorkerScript()) + `, nsp)) c
	WHERE NOT c.success;
	IF failed IS NOT NULL THEN
		RAISE EXCEPTION 'pglease: the positions on the workers: %', failed;
	END IF;
	PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
	distributed := EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Messages) + `::regclass);
	IF NOT distributed AND (EXISTS (SELECT 1 FROM ` + t.Messages + `) OR EXISTS (SELECT 1 FROM ` + t.Offsets + `)) THEN
		RAISE EXCEPTION USING
			MESSAGE = 'pglease: the tables hold messages or consumer group positions: distributing them is refused',
			DETAIL = 'Distributed, the stored messages would take the positions of the workers while the groups keep this server''s, and the groups would skip or repeat messages.',
			HINT = 'Distribute tables while they are empty: run pglease migrate --citus on a new schema (--schema), publish there, and move each Subscriber over once it has consumed the old tables (docs/scaling.md, "Moving to Citus").';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = ` + lit(t.Offsets) + `::regclass) THEN
		EXECUTE ` + lit(`ALTER TABLE `+t.Offsets+` ALTER COLUMN topic TYPE text COLLATE "C"`) + `;
	END IF;
	-- The worker functions exist on the coordinator too, where statements
	-- are parsed: there they refuse to run (a statement that Citus did not
	-- route to the topic's worker whole).
	PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);` +
		onCoordinator(t.WorkerBoundFunction(), `(topic text, partitions integer[], OUT bounds bigint[])`, ``) +
		onCoordinator(t.WorkerCounterFunction(), `()`, ` RETURNS bigint`) +
		onCoordinator(t.WorkerHolderFunction(), workerHolderSignature, ``) +
		onCoordinator(t.WorkerVisibleFunction(), workerVisibleSignature, ``) + `
	PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'on', true);
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg
		WHERE tg.tgrelid = ` + lit(t.Messages) + `::regclass AND tg.tgfoid = pg_catalog.to_regprocedure(` + lit(fn+"()") + `)) THEN
		-- The trigger runs on the shards (Citus copies it there).
		PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
		IF distributed THEN
			-- Waits for every transaction that inserted with the old
			-- trigger (a position from its worker's transaction id) to
			-- end, and holds new inserts off until this commits.
			EXECUTE ` + lit(`LOCK TABLE `+t.Messages+` IN SHARE ROW EXCLUSIVE MODE`) + `;
		END IF;
		EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS `+
		dollarQuote(t.render("citus_take_position.plpgsql"))) + `;
		EXECUTE 'ALTER FUNCTION ' || ` + lit(fn) + ` || '() SET search_path = pg_catalog, ' || pg_catalog.quote_ident(nsp) || ', pg_temp';
		EXECUTE ` + lit(`REVOKE ALL ON FUNCTION `+fn+`() FROM PUBLIC`) + `;
		EXECUTE ` + lit(`DROP TRIGGER IF EXISTS `+pgx.Identifier{trigger}.Sanitize()+` ON `+t.Messages) + `;
		IF NOT distributed THEN
			-- Schema version 14 gives a single node's messages positions
			-- from its sequence, as the column's default: the coordinator
			-- would evaluate it. The trigger sets every row's.
			EXECUTE ` + lit(`ALTER TABLE `+t.Messages+` ALTER COLUMN transaction_id SET DEFAULT pg_catalog.pg_current_xact_id()`) + `;
		END IF;
		EXECUTE ` + lit(`CREATE TRIGGER `+pgx.Identifier{trigger}.Sanitize()+` BEFORE INSERT ON `+t.Messages+
		` FOR EACH ROW EXECUTE FUNCTION `+fn+`(`) + ` || CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
			WHERE a.attrelid = ` + lit(t.Messages) + `::regclass AND a.attname = 'needs_registration' AND NOT a.attisdropped)
			THEN '''needs_registration''' ELSE '' END || ')';
	END IF;` + reference + `
	IF NOT distributed THEN
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
	-- Every role that may insert into a table with an identity column
	-- gets USAGE on its sequence, which Citus needs (see
	-- citusIdentityGrants); on the workers once the tables were
	-- distributed by an earlier run (what this one creates there is not
	-- committed yet: GrantSQL, run after, grants the workers' copies).` +
		identitySequenceGrants(`SELECT DISTINCT pg_catalog.format('%I.%I', n.nspname, c.relname) AS tab, a.attname AS col,
			CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END AS grantee
		FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attidentity <> '' AND NOT a.attisdropped
		CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) g
		WHERE c.oid IN (`+lit(t.Messages)+`::regclass, `+lit(t.Delayed)+`::regclass, pg_catalog.to_regclass(`+lit(t.Keys)+`))
			AND g.privilege_type = 'INSERT' AND g.grantee <> c.relowner
		ORDER BY 1, 2, 3`, "distributed") + `
END`)
}

// WorkerScript returns the script that creates, on one worker, what the
// positions of a distributed messages table need there: the sequence
// positions come from (not a distributed object: Citus would route its
// nextval to the coordinator), started 2^40 above the worker's
// transaction counter and called (so that its last value was handed
// out), and the functions a statement routed to a topic's shard calls:
// the bound ([Tables.WorkerBoundFunction]), the counter
// ([Tables.WorkerCounterFunction]), the holder of a topic
// ([Tables.WorkerHolderFunction]) and the idle poll of the worker's
// topics ([Tables.WorkerVisibleFunction]). It is a format string (%L: the
// messages table's schema, every other percent sign doubled), formatted
// and run on every worker by [Tables.DistributeScript] and on the target
// of a shard move by [PrepareShardMoveScript]. It may run again: the
// sequence is left where it is.
func (t *Tables) WorkerScript() string {
	lit := quoteLiteral
	const schema = "\x00schema\x00"
	script := doBlock(`DECLARE
	nsp name := ` + schema + `;
	seq text;
BEGIN
	-- Objects of this worker only.
	PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
	-- Only where it is missing: CREATE SCHEMA IF NOT EXISTS needs CREATE
	-- on the database even where the schema exists (an owner without it
	-- runs this again).
	IF pg_catalog.to_regnamespace(pg_catalog.quote_ident(nsp)) IS NULL THEN
		EXECUTE 'CREATE SCHEMA IF NOT EXISTS ' || pg_catalog.quote_ident(nsp);
	END IF;
	PERFORM pg_catalog.set_config('search_path', pg_catalog.quote_ident(nsp), true);
	seq := pg_catalog.quote_ident(nsp) || '.' || pg_catalog.quote_ident(` + lit(t.partitionName("positions")) + `);
	IF pg_catalog.to_regclass(seq) IS NULL THEN
		-- CACHE 1: a range cached per backend would hand values out of the
		-- order in which they are taken.
		EXECUTE 'CREATE SEQUENCE ' || seq || ' AS bigint CACHE 1 NO CYCLE';
		PERFORM pg_catalog.setval(seq::regclass,
			pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint + 1099511627776, true);
	END IF;
	-- Any role may read where the sequence is and take values from it
	-- (what a publisher's trigger does); none but the owner may set it.
	EXECUTE 'GRANT SELECT, USAGE ON SEQUENCE ' || seq || ' TO PUBLIC';
	-- The move scripts find the sequences to raise by their comment.
	EXECUTE 'COMMENT ON SEQUENCE ' || seq || ' IS ' || ` + lit(lit(PositionsComment)) + `;
	EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+t.WorkerBoundFunction()+`(topic text, partitions integer[], OUT bounds bigint[])
	LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS `+dollarQuote(t.render("citus_worker_bound.plpgsql"))) + `;
	EXECUTE 'ALTER FUNCTION ' || ` + lit(t.WorkerBoundFunction()) + ` || '(text, integer[]) SET search_path = pg_catalog, '
		|| pg_catalog.quote_ident(nsp) || ', pg_temp';
	EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+t.WorkerCounterFunction()+`() RETURNS bigint
	LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS `+dollarQuote(`DECLARE
	n bigint;
BEGIN
	-- The position this worker's sequence hands out next: no row of its
	-- history has reached it.
	SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END INTO n FROM `+
		pgx.Identifier{t.partitionName("positions")}.Sanitize()+` s;
	RETURN n;
END`)) + `;
	EXECUTE 'ALTER FUNCTION ' || ` + lit(t.WorkerCounterFunction()) + ` || '() SET search_path = pg_catalog, '
		|| pg_catalog.quote_ident(nsp) || ', pg_temp';
	-- The holder of a topic's partition on this worker: the single node's
	-- query, on the topic's shard, with the worker's node (the table and
	-- shard found when it runs: the table may be distributed after).
	EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+t.WorkerHolderFunction()+workerHolderSignature+`
	LANGUAGE sql VOLATILE SET search_path = pg_catalog AS `+dollarQuote(`SELECT h.*, (SELECT n.nodename || ':' || n.nodeport
	FROM pg_catalog.pg_dist_node n WHERE n.groupid = (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g) LIMIT 1)
FROM (`+boundHolderSQL(`pg_catalog.to_regclass(pg_catalog.shard_name(pg_catalog.to_regclass(`+lit(t.Messages)+`),
		pg_catalog.get_shard_id_for_distribution_column(pg_catalog.to_regclass(`+lit(t.Messages)+`), $1)))::oid`, `$1`, `$2`)+`) h`)) + `;
	EXECUTE ` + lit(`CREATE OR REPLACE FUNCTION `+t.WorkerVisibleFunction()+workerVisibleSignature+`
	LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS `+dollarQuote(t.render("citus_worker_visible.plpgsql"))) + `;
	EXECUTE 'ALTER FUNCTION ' || ` + lit(t.WorkerVisibleFunction()) + ` || '` + workerVisibleArgs + ` SET search_path = pg_catalog, '
		|| pg_catalog.quote_ident(nsp) || ', pg_temp';
END`)
	return strings.ReplaceAll(strings.ReplaceAll(script, "%", "%%"), schema, "%L")
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

// PositionsComment marks, in its comment, the position sequence of a
// messages table on a Citus worker ([Tables.WorkerScript]): the move
// scripts find every such sequence of a worker by it, whatever the
// tables' names.
const PositionsComment = "pglease: message positions of this worker"

// MoveMarginFloor is the least margin [PrepareMoveScript] raises a
// target's position sequences by: a value of a sequence costs nothing,
// and the margin must exceed the positions the source hands out between
// the script and the end of the move.
const MoveMarginFloor = 1 << 32

// PrepareMoveScript returns the script that raises the position
// sequences of the worker at host:port to at least margin (at least
// MoveMarginFloor) above the highest position handed out by any worker's,
// run on the coordinator right before a shard moves to that worker
// (citus_move_shard_placement). A position comes from the sequence of
// the topic's worker: rows moved to a worker whose sequence is lower
// would hold positions ahead of its counter (their commits refused, the
// topic stalled), and its new messages would sort below the groups'
// positions (skipped). The moved rows' positions lie below the source's
// last value when the move blocks their writes; the margin covers what
// the source hands out between the script and then. The script raises
// every sequence that PositionsComment marks (a sequence only grows, and
// one raised further than needed costs nothing); it refuses when the
// target has none (a worker added since `pglease migrate --citus` ran:
// run it again) or no worker has any (tables distributed by an earlier
// release, whose positions are transaction ids: migrate first).
func PrepareMoveScript(host string, port int, margin uint64) string {
	return prepareMoveScript(host, port, margin, "")
}

// PrepareShardMoveScript is PrepareMoveScript for a move from the worker
// at srcHost:srcPort: it raises the target only to margin above the
// source's positions, and not at all where it is there already. The moved
// rows, and the groups' positions of their topics, were taken on the
// source (or, for a topic moved before, below a value an earlier script
// raised the source above): no other worker's sequence matters to this
// move.
func PrepareShardMoveScript(srcHost string, srcPort int, host string, port int, margin uint64) string {
	return prepareMoveScript(host, port, margin, `c.nodename = `+quoteLiteral(srcHost)+` AND c.nodeport = `+strconv.Itoa(srcPort))
}

// prepareMoveScript is the script of PrepareMoveScript, raising the
// target above the highest position of the workers that source (a
// condition on run_command_on_workers's row c) selects, every worker's
// when empty.
func prepareMoveScript(host string, port int, margin uint64, source string) string {
	marked := `FROM pg_catalog.pg_class s WHERE s.relkind = 'S' AND pg_catalog.obj_description(s.oid, 'pg_class') = ` + quoteLiteral(PositionsComment)
	last := quoteLiteral(`SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.max(pg_catalog.pg_sequence_last_value(s.oid)), 0) ` + marked)
	from := "true"
	if source != "" {
		from = source
	}
	if margin < MoveMarginFloor {
		margin = MoveMarginFloor
	}
	return doBlock(`DECLARE
	top numeric;
	sources bigint;
	here bigint;
	raised record;
BEGIN
	IF EXISTS (SELECT 1 FROM pg_catalog.run_command_on_workers(` + last + `) c WHERE NOT c.success) THEN
		RAISE EXCEPTION 'pglease: cannot read the position sequences of every worker';
	END IF;
	SELECT pg_catalog.max(pg_catalog.split_part(c.result, ':', 2)::numeric) FILTER (WHERE ` + from + `) + ` + strconv.FormatUint(margin, 10) + `,
		pg_catalog.sum(pg_catalog.split_part(c.result, ':', 1)::bigint) FILTER (WHERE ` + from + `),
		pg_catalog.max(pg_catalog.split_part(c.result, ':', 1)::bigint) FILTER (WHERE c.nodename = ` + quoteLiteral(host) + ` AND c.nodeport = ` + strconv.Itoa(port) + `)
	INTO top, sources, here
	FROM pg_catalog.run_command_on_workers(` + last + `) c;
	IF here IS NULL THEN
		RAISE EXCEPTION 'pglease: no worker %:% in the cluster', ` + quoteLiteral(host) + `, ` + strconv.Itoa(port) + `;
	END IF;
	IF top IS NULL THEN
		RAISE EXCEPTION 'pglease: no source worker in the cluster (%)', ` + quoteLiteral(from) + `;
	END IF;
	IF sources = 0 THEN
		RAISE EXCEPTION 'pglease: no position sequence on the source workers: the tables take their positions from the workers'' transaction ids (distributed by an earlier release): run pglease migrate --citus first';
	END IF;
	IF here = 0 THEN
		RAISE EXCEPTION 'pglease: worker %:% has no position sequence (added after pglease migrate --citus ran): run pglease migrate --citus again first', ` + quoteLiteral(host) + `, ` + strconv.Itoa(port) + `;
	END IF;
	SELECT * INTO raised FROM pg_catalog.master_run_on_worker(ARRAY[` + quoteLiteral(host) + `], ARRAY[` + strconv.Itoa(port) + `],
		ARRAY[pg_catalog.format(` + quoteLiteral(`SELECT pg_catalog.count(pg_catalog.setval(s.oid, GREATEST(COALESCE(pg_catalog.pg_sequence_last_value(s.oid), 0), %s), true)) `+strings.ReplaceAll(marked, "%", "%%")) + `, top)], false);
	IF NOT raised.success THEN
		RAISE EXCEPTION 'pglease: raising the position sequences of worker %:% failed: %', ` + quoteLiteral(host) + `, ` + strconv.Itoa(port) + `, raised.result;
	END IF;
END`)
}
