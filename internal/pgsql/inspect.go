package pgsql

import "time"

// InspectSessions is the statement of [InspectSessions].
func (t *Tables) InspectSessions() Stmt {
	return Stmt{SQL: `SELECT s.id, s.consumer_group, s.owner, s.created_at, s.expires_at, pg_catalog.now(), COALESCE(h.n, 0),
	EXISTS (SELECT 1 FROM ` + t.Maintenance + ` mt WHERE mt.session_id = s.id)
FROM ` + t.Sessions + ` s
LEFT JOIN (SELECT session_id, pg_catalog.count(*) AS n FROM ` + t.Offsets + `
	WHERE session_id IS NOT NULL GROUP BY session_id) h ON h.session_id = s.id
ORDER BY s.consumer_group, s.created_at, s.id`}
}

// InspectLag is the statement of [InspectLag]. Per row: one pass over the
// index range after the position (the count, and the oldest storage time
// among those messages), and one index probe for a pending message. Lag
// counts the messages below the partition's position bound (decision
// 0008), which one call of the bound function computes for every selected
// row; a message at or above it is pending: committed or not, it waits
// for an open publisher of its partition. The bound is read within the
// statement, after its snapshot: a message committed in between is in
// neither count, which a report can afford.
func (t *Tables) InspectLag(groups, topics []string) Stmt {
	return Stmt{
		SQL: `WITH sel AS MATERIALIZED (
	SELECT o.consumer_group, o.topic, o.partition, o.session_id, o.epoch, o.acked_transaction_id, o.acked_offset,
		pg_catalog.row_number() OVER (ORDER BY o.consumer_group, o.topic, o.partition) AS n
	FROM ` + t.Offsets + ` o
	WHERE ($1::text[] IS NULL OR o.consumer_group = ANY($1)) AND ($2::text[] IS NULL OR o.topic = ANY($2))
), b AS MATERIALIZED (
	SELECT f.bounds FROM ` + t.PositionBoundFunction() + `(ARRAY(SELECT sel.topic FROM sel ORDER BY sel.n),
		ARRAY(SELECT sel.partition FROM sel ORDER BY sel.n)) f
)
SELECT o.consumer_group, o.topic, o.partition, o.session_id,
	CASE WHEN s.expires_at > pg_catalog.now() THEN s.owner END, o.epoch, o.acked_transaction_id::text, o.acked_offset,
	l.lag, extract(epoch FROM pg_catalog.now() - l.oldest)::float8,
	EXISTS (SELECT 1 FROM ` + t.Messages + ` m
		WHERE m.topic = o.topic AND m.partition = o.partition AND m.transaction_id >= x.xmin)
FROM sel o
CROSS JOIN b
CROSS JOIN LATERAL (SELECT b.bounds[o.n]::text::xid8 AS xmin) x
LEFT JOIN ` + t.Sessions + ` s ON s.id = o.session_id
CROSS JOIN LATERAL (
	SELECT pg_catalog.count(*) AS lag, pg_catalog.min(m.created_at) AS oldest FROM ` + t.Messages + ` m
	WHERE m.topic = o.topic AND m.partition = o.partition
		AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)
		AND m.transaction_id < x.xmin
) l
ORDER BY o.n`,
		Args: []any{groups, topics},
	}
}

// InspectHorizon is the statement of [InspectHorizon]: the oldest transaction
// with a transaction id, among backends and prepared transactions.
func (t *Tables) InspectHorizon() Stmt {
	return Stmt{SQL: `SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text, h.pid, h.gid, h.application_name, h.state,
	h.xact_start, h.query_start, extract(epoch FROM pg_catalog.now() - h.xact_start)::float8, h.query, h.datname, h.usename
FROM (SELECT 1) one
LEFT JOIN LATERAL (
	SELECT * FROM (
		SELECT b.pid, NULL::text AS gid, b.application_name, b.state, b.xact_start, b.query_start,
			pg_catalog.left(b.query, 1000) AS query, b.backend_xid AS xid, b.datname::text, b.usename::text
		FROM pg_stat_activity b
		WHERE b.backend_xid IS NOT NULL AND b.pid <> pg_catalog.pg_backend_pid()
		UNION ALL
		SELECT 0, p.gid, NULL, 'prepared', p.prepared, NULL, NULL, p.transaction, p.database::text, p.owner::text
		FROM pg_prepared_xacts p
	) c
	ORDER BY pg_catalog.age(c.xid) DESC
	LIMIT 1
) h ON true`}
}

// BoundHolder is the statement of [Driver.BoundHolder] on a single node:
// the transaction that holds the topic's lock and a write lock on the
// messages table with the lowest registered v (see the position bound of
// migration 14), in the columns of InspectHorizon, v in the first.
func (t *Tables) BoundHolder(topic string, partition int32) Stmt {
	return Stmt{SQL: boundHolderSQL(`pg_catalog.to_regclass($1::text)::oid`, `$2::text`, `$3::integer`),
		Args: []any{t.Messages, topic, partition}}
}

// boundHolderSQL is the query of BoundHolder for the relation whose oid
// root is (an expression) and the topic and partition (expressions): on
// a single node the messages table, on a Citus worker the topic's shard
// ([Tables.WorkerHolderFunction]).
func boundHolderSQL(root, topic, partition string) string {
	return `WITH db AS (
	SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
), root AS (
	SELECT ` + root + ` AS oid
), holders AS (
	SELECT k.virtualtransaction AS vx, k.pid
	FROM pg_catalog.pg_locks k, db, root
	WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 2 AND k.database = db.oid AND k.classid = root.oid
		AND k.objid::bigint = (pg_catalog.hashtext(` + topic + ` || ':' || ` + partition + `::text)::bigint & 4294967295)
		AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks w WHERE w.virtualtransaction = k.virtualtransaction AND w.granted
			AND w.locktype = 'relation' AND w.mode <> 'AccessShareLock' AND w.database = db.oid
			AND (w.relation = root.oid OR w.relation IN (SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = root.oid)))
), h AS (
	SELECT holders.pid, (SELECT pg_catalog.min(((v.classid::bigint & 16777215) << 32) | v.objid::bigint) FROM pg_catalog.pg_locks v
		WHERE v.virtualtransaction = holders.vx AND v.granted AND v.locktype = 'advisory' AND v.objsubid = 1
			AND v.classid::bigint >> 24 = 112) AS v
	FROM holders
	ORDER BY 2
	LIMIT 1
)
SELECT COALESCE(h.v, 0)::text, h.pid, CASE WHEN h.pid IS NULL AND h.v IS NOT NULL THEN '' END, a.application_name, a.state,
	a.xact_start, a.query_start, extract(epoch FROM pg_catalog.now() - a.xact_start)::float8, pg_catalog.left(a.query, 1000),
	a.datname::text, a.usename::text
FROM (SELECT 1) one
LEFT JOIN h ON true
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid`
}

// OpenPublishers is the statement of [Driver.OpenPublishers] on a single
// node: the transactions that hold a partition's key and a write lock on
// the messages table (the holders the position bound counts, see
// migration 14), oldest first, each with the lowest v it registered, the
// partitions among those with settings or offset rows whose key it holds,
// and how many keys it holds.
func (t *Tables) OpenPublishers() Stmt {
	return Stmt{SQL: `WITH db AS (
	SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
), root AS (
	SELECT pg_catalog.to_regclass($1::text)::oid AS oid
), l AS MATERIALIZED (
	SELECT l.locktype, l.virtualtransaction AS vx, l.pid, l.classid, l.objid, l.objsubid
	FROM pg_catalog.pg_locks l, db, root
	WHERE l.granted AND l.database = db.oid
		AND (l.locktype = 'advisory' AND (l.objsubid = 2 AND l.classid = root.oid OR l.objsubid = 1 AND l.classid::bigint >> 24 = 112)
			OR l.locktype = 'relation' AND l.mode <> 'AccessShareLock'
				AND (l.relation = root.oid OR l.relation IN (SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = root.oid)))
), writers AS (
	SELECT DISTINCT l.vx FROM l WHERE l.locktype = 'relation'
), h AS (
	SELECT w.vx, pg_catalog.max(k.pid) AS pid, pg_catalog.array_agg(DISTINCT k.objid::bigint) AS keys,
		(SELECT pg_catalog.min(((v.classid::bigint & 16777215) << 32) | v.objid::bigint) FROM l v
			WHERE v.vx = w.vx AND v.locktype = 'advisory' AND v.objsubid = 1) AS v
	FROM writers w JOIN l k ON k.vx = w.vx AND k.locktype = 'advisory' AND k.objsubid = 2
	GROUP BY w.vx
), names AS (
	SELECT o.topic COLLATE "C" AS topic, o.partition FROM ` + t.Offsets + ` o
	UNION
	SELECT tp.topic, p.p::integer FROM ` + t.Topics + ` tp, pg_catalog.generate_series(0, tp.partitions - 1) p(p)
), named AS (
	SELECT h.vx, n.topic, n.partition FROM h JOIN names n
		ON (pg_catalog.hashtext(n.topic || ':' || n.partition::text)::bigint & 4294967295) = ANY(h.keys)
)
SELECT COALESCE(h.v, 0)::text, COALESCE(h.pid, 0), CASE WHEN h.pid IS NULL THEN p.gid END, a.application_name, a.state,
	COALESCE(a.xact_start, p.prepared), a.query_start, extract(epoch FROM pg_catalog.now() - COALESCE(a.xact_start, p.prepared))::float8,
	pg_catalog.left(a.query, 1000), COALESCE(a.datname::text, p.database::text), COALESCE(a.usename::text, p.owner::text),
	ARRAY(SELECT n.topic FROM named n WHERE n.vx = h.vx ORDER BY n.topic, n.partition),
	ARRAY(SELECT n.partition FROM named n WHERE n.vx = h.vx ORDER BY n.topic, n.partition),
	pg_catalog.cardinality(h.keys)
FROM h
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid
LEFT JOIN LATERAL (
	-- A prepared transaction has no backend: its gid, by the transaction
	-- id it holds (a subtransaction's are held too, so the one prepared).
	SELECT px.gid, px.prepared, px.database, px.owner
	FROM pg_catalog.pg_locks xl JOIN pg_catalog.pg_prepared_xacts px ON px.transaction = xl.transactionid
	WHERE h.pid IS NULL AND xl.virtualtransaction = h.vx AND xl.locktype = 'transactionid' AND xl.granted
	LIMIT 1
) p ON true
ORDER BY COALESCE(a.xact_start, p.prepared) NULLS FIRST, h.v`, Args: []any{t.Messages}}
}

// InspectTopics is the statement of [InspectTopics] on a schema of
// version schema (see topicKeyColumns). The topics with messages are
// found by skipping through the primary key, one probe per topic.
func (t *Tables) InspectTopics(schema int) Stmt {
	return Stmt{SQL: t.inspectTopicsSQL(schema, false)}
}

// InspectTopicsPage is the statement of [InspectTopicsPage]: the first
// p.Limit topics after p.After (all from the first with p.First), and the
// number of topics.
func (t *Tables) InspectTopicsPage(p TopicsPageParams) Stmt {
	return Stmt{SQL: t.inspectTopicsSQL(p.Schema, true), Args: []any{p.First, p.After, p.Limit}}
}

func (t *Tables) inspectTopicsSQL(schema int, page bool) string {
	from, total := "names", ""
	if page {
		from, total = "page", `,
	(SELECT pg_catalog.count(*) FROM names)`
	}
	sql := `WITH RECURSIVE mt AS (
	(SELECT topic FROM ` + t.Messages + ` ORDER BY topic LIMIT 1)
	UNION ALL
	SELECT (SELECT m.topic FROM ` + t.Messages + ` m WHERE m.topic > mt.topic ORDER BY m.topic LIMIT 1)
	FROM mt WHERE mt.topic IS NOT NULL
), names AS (
	SELECT topic FROM mt WHERE topic IS NOT NULL
	UNION SELECT topic FROM ` + t.Topics + `
	UNION SELECT topic COLLATE "C" FROM ` + t.Offsets + `
), groups AS (
	SELECT topic COLLATE "C" AS topic, pg_catalog.count(DISTINCT consumer_group) AS n FROM ` + t.Offsets + ` GROUP BY topic
)`
	if page {
		sql += `, page AS (
	SELECT topic FROM names WHERE $1::boolean OR topic > $2::text ORDER BY topic LIMIT $3
)`
	}
	keyColumns, keyJoin := t.topicKeyColumns(schema, "t")
	return sql + `
SELECT n.topic, COALESCE(t.partitions, 1), COALESCE(g.n, 0),
	(SELECT pg_catalog.max(l.created_at) FROM pg_catalog.generate_series(0, COALESCE(t.partitions, 1) - 1) AS p(partition),
		LATERAL (SELECT m.created_at FROM ` + t.Messages + ` m WHERE m.topic = n.topic AND m.partition = p.partition
			ORDER BY m.transaction_id DESC, m."offset" DESC LIMIT 1) l),
	COALESCE(pg_catalog.floor(extract(epoch FROM t.retention) * 1000000::numeric)::bigint, 0),
	` + keyColumns + total + `
FROM ` + from + ` n
LEFT JOIN ` + t.Topics + ` t ON t.topic = n.topic` + keyJoin + `
LEFT JOIN groups g ON g.topic = n.topic
ORDER BY n.topic`
}

// ResetOffsets is the statement of [ResetOffsets]. "latest" is the position
// (bound - 1, the largest offset), just below the partition's position
// bound (decision 0008) read by the statement: every message below the
// bound is skipped, the messages of running publishers of the partition
// are not (their positions are at least their bound).
//
// Whether a row's owner is alive is decided as ClaimOffsets decides it: on
// the statement's snapshot (snap), where a session row exists before its
// first claim commits, and the write is a compare-and-swap on the
// (session_id, epoch) read there. The rows are locked (cur) before any is
// written, which waits for concurrent claims and commits and reads the rows
// as they are then; a row whose owner or epoch changed since the snapshot
// is reported changed and left alone, for the caller to run the statement
// again on a fresh snapshot. (Locking the rows and joining the sessions in
// one SELECT ... FOR UPDATE re-checks only the locked row when it waited:
// the joined session comes out null-extended, and a row that a live
// session had just claimed looked free.) The positions AckInTx recorded
// above the old position (acked_above) are forgotten: after a reset back,
// their messages are delivered and acknowledged again.
//
// bounds are the position bounds of the topic's partitions (index =
// partition), computed by a statement before this one (PositionBounds):
// a bound read in this statement, after its snapshot, could pass a
// message whose publisher committed in between (not in the snapshot, no
// longer holding its key), and the reset would move the group past it. A
// row of a partition bounds lacks takes the bound this statement reads.
func (t *Tables) ResetOffsets(group, topic, to string, at time.Time, force bool, notifyChannel, notification string, bounds []int64) Stmt {
	return Stmt{
		SQL: `WITH snap AS (
	SELECT o.partition, o.session_id, o.epoch, CASE WHEN s.expires_at > pg_catalog.now() THEN s.owner END AS live_owner
	FROM ` + t.Offsets + ` o
	LEFT JOIN ` + t.Sessions + ` s ON s.id = o.session_id
	WHERE o.consumer_group = $1 AND o.topic = $2
), cur AS (
	SELECT o.partition, o.session_id, o.epoch, o.acked_transaction_id, o.acked_offset
	FROM ` + t.Offsets + ` o
	WHERE o.consumer_group = $1 AND o.topic = $2
	ORDER BY o.partition
	FOR UPDATE
), target AS (
	SELECT cur.partition, cur.session_id, cur.acked_transaction_id, cur.acked_offset,
		snap.session_id AS snap_session_id, snap.epoch AS snap_epoch,
		snap.partition IS NULL OR cur.session_id IS DISTINCT FROM snap.session_id OR cur.epoch <> snap.epoch AS changed,
		snap.live_owner, t.tx, t.off
	FROM cur LEFT JOIN snap ON snap.partition = cur.partition,
	LATERAL (SELECT b.b::text::xid8 AS xmin, (b.b - 1)::text::xid8 AS below
		FROM (SELECT COALESCE(($8::bigint[])[cur.partition + 1],
			(SELECT f.bounds[1] FROM ` + t.PositionBoundFunction() + `(ARRAY[$2::text], ARRAY[cur.partition]) f)) AS b) b) x, LATERAL (
		SELECT c.tx, c.off FROM (
			SELECT 1 AS choice, f.tx, f.off FROM (
				SELECT m.transaction_id AS tx, m."offset" - 1 AS off
				FROM ` + t.Messages + ` m
				WHERE $3 = 'time' AND m.topic = $2 AND m.partition = cur.partition
					AND m.created_at >= $4 AND m.transaction_id < x.xmin
				ORDER BY m.transaction_id, m."offset"
				LIMIT 1
			) f
			UNION ALL
			SELECT 2, '0'::xid8, 0::bigint WHERE $3 = 'earliest'
			UNION ALL
			SELECT 3, x.below, 9223372036854775807::bigint WHERE $3 IN ('latest', 'time')
		) c
		ORDER BY c.choice
		LIMIT 1
	) t
), updated AS (
	UPDATE ` + t.Offsets + ` o
	SET acked_transaction_id = target.tx, acked_offset = target.off, epoch = o.epoch + 1, updated_at = pg_catalog.now(),
		head_deliveries = 0, acked_above = '{}', waiting = '{}', handed_out = NULL,
		session_id = CASE WHEN target.live_owner IS NULL THEN NULL ELSE o.session_id END
	FROM target
	WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = target.partition
		AND NOT target.changed
		AND o.session_id IS NOT DISTINCT FROM target.snap_session_id AND o.epoch = target.snap_epoch
		AND ($5 OR target.live_owner IS NULL)
	RETURNING o.partition
), notified AS (
	SELECT pg_catalog.pg_notify($6, $7) FROM (SELECT 1 FROM updated LIMIT 1) u WHERE $6 <> ''
)
SELECT target.partition, target.session_id, CASE WHEN NOT target.changed THEN target.live_owner END,
	target.acked_transaction_id::text, target.acked_offset, target.tx::text, target.off,
	EXISTS (SELECT 1 FROM updated u WHERE u.partition = target.partition), target.changed
FROM target, (SELECT pg_catalog.count(*) FROM notified) n
ORDER BY target.partition`,
		Args: []any{group, topic, to, at, force, notifyChannel, notification, bounds},
	}
}
