package pgsql

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// maintainerRow is the name of the maintainer's row.
const maintainerRow = "maintainer"

// ClaimMaintainer is the statement of [ClaimMaintainer]: a compare-and-swap on
// (session_id, epoch), like ClaimOffsets, so that two claims never both
// succeed and a claim from an expired holder conflicts with its heartbeat
// on the session row's lock.
func (t *Tables) ClaimMaintainer(p MaintainerParams) Stmt {
	return Stmt{
		SQL: `WITH cur AS (
	SELECT m.session_id, m.epoch, s.id IS NOT NULL AS owner_exists, s.expires_at
	FROM ` + t.Maintenance + ` m
	LEFT JOIN ` + t.Sessions + ` s ON s.id = m.session_id
	WHERE m.name = $1
),
expired AS (
	DELETE FROM ` + t.Sessions + ` s
	WHERE s.id = (SELECT session_id FROM cur) AND s.id <> $2 AND s.expires_at < pg_catalog.now()
	RETURNING s.id
),
claimed AS (
	UPDATE ` + t.Maintenance + ` m
	SET session_id = $2, epoch = m.epoch + 1, updated_at = pg_catalog.now()
	FROM cur
	WHERE m.name = $1 AND m.session_id IS NOT DISTINCT FROM cur.session_id AND m.epoch = cur.epoch
		AND (cur.session_id IS NULL OR cur.session_id = $2 OR NOT cur.owner_exists
			OR cur.session_id IN (SELECT id FROM expired))
	RETURNING m.epoch
)
SELECT (SELECT epoch FROM claimed), cur.session_id,
	pg_catalog.ceil(extract(epoch FROM cur.expires_at - pg_catalog.now()) * 1000::numeric)::bigint
FROM cur`,
		Args: []any{maintainerRow, p.SessionID},
	}
}

// MaintainerHolder is the statement of [MaintainerHolder]. It has no parameter
// (the row's name is a constant), so a connection reuses its plan: with
// the name as a parameter PostgreSQL planned it anew on most calls.
func (t *Tables) MaintainerHolder() Stmt {
	return Stmt{
		SQL: `SELECT m.session_id, pg_catalog.ceil(extract(epoch FROM s.expires_at - pg_catalog.now()) * 1000::numeric)::bigint
FROM ` + t.Maintenance + ` m
LEFT JOIN ` + t.Sessions + ` s ON s.id = m.session_id
WHERE m.name = ` + quoteLiteral(maintainerRow),
	}
}

// ReleaseMaintainer is the statement of [ReleaseMaintainer].
func (t *Tables) ReleaseMaintainer(p MaintainerParams) Stmt {
	return Stmt{
		SQL: `WITH released AS (
	UPDATE ` + t.Maintenance + ` SET session_id = NULL, updated_at = pg_catalog.now()
	WHERE name = $1 AND session_id = $2 AND epoch = $3
	RETURNING 1
)
SELECT pg_catalog.pg_notify($4, ` + kind(NotifyMaintainer) + `) FROM released WHERE $4 <> ''`,
		Args: []any{maintainerRow, p.SessionID, p.Epoch, p.NotifyChannel},
	}
}

// InsertDelayed is the statement of [InsertDelayed].
func (t *Tables) InsertDelayed(p InsertMessagesParams) Stmt {
	var hashes []int32 // nil: NULL, placed by the UUID when moved
	if p.PartitionHashes != nil {
		hashes = make([]int32, len(p.UUIDs))
		for i := range hashes {
			if i < len(p.PartitionHashes) {
				hashes[i] = int32(p.PartitionHashes[i])
			}
		}
	}
	return Stmt{
		SQL: `WITH ins AS (
	INSERT INTO ` + t.Delayed + ` (due_at, topic, partition_hash, uuid, payload, metadata)
	SELECT m.due, m.topic, m.hash, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb
	FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[], $6::timestamptz[])
		WITH ORDINALITY AS m(topic, uuid, payload, metadata, hash, due, n)
	ORDER BY m.n
	RETURNING due_at
)
SELECT pg_catalog.pg_notify($7, ` + kind(NotifyDelayed) + ` || (pg_catalog.floor(extract(epoch FROM x.due) * 1000::numeric)::bigint)::text)
FROM (SELECT pg_catalog.min(due_at) AS due FROM ins) x
WHERE $7 <> '' AND x.due IS NOT NULL`,
		Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes, p.DueAt, p.NotifyChannel},
	}
}

// MoveDueMessages is the statement of [MoveDueMessages]. The due rows are
// deleted and inserted into the messages table by one statement, and
// rows another transaction has locked are skipped, so two movers running
// at once never move a message twice. The notifications are a plain
// SELECT in a WITH clause, which PostgreSQL runs only if the statement
// reads it: the result's first column does (adding 0 times its count).
// Where the messages table is distributed by Citus, the calls of
// pg_notify are cast to text ([asCitus]): Citus keeps each WITH
// clause as an intermediate result, and runs the notifying one on the
// coordinator, where the Subscribers listen. The moved messages take
// their positions on their workers (the trigger of DistributeScript), as
// published ones do. On a single node the statement registers the moved
// messages' partitions and takes one position for them, as pglease's
// insert does (see registering; register is the Driver's), so that the
// trigger lets its rows through without a call each.
func (t *Tables) MoveDueMessages(p MoveDueParams) Stmt {
	return t.moveDueMessages(p, registerPerStatement)
}

// moveDueMessages is MoveDueMessages, registering as register says.
func (t *Tables) moveDueMessages(p MoveDueParams, register registering) Stmt {
	r, reg := registers(register, "\n\tCROSS JOIN reg"), ""
	if register != noRegistration {
		reg = ", " + t.registerPartitions(register, `SELECT topic, pg_catalog.array_agg(DISTINCT partition) AS partitions FROM placed GROUP BY topic`)
	}
	return Stmt{
		SQL: `WITH due AS (
	DELETE FROM ` + t.Delayed + ` d
	WHERE d.id IN (SELECT x.id FROM ` + t.Delayed + ` x WHERE x.due_at <= pg_catalog.now()
		ORDER BY x.due_at, x.id LIMIT $1 FOR UPDATE SKIP LOCKED)
	RETURNING d.id, d.due_at, d.topic, d.partition_hash, d.uuid, d.payload, d.metadata
), placed AS (
	SELECT d.id, d.due_at, d.topic, d.uuid, d.payload, d.metadata,
		((COALESCE(d.partition_hash, pg_catalog.hashtext(d.uuid))::bigint & 4294967295) % (COALESCE(tp.partitions, 1))::bigint)::integer AS partition,
		` + t.placement("tp", "r") + `
	FROM due d
	LEFT JOIN ` + t.Topics + ` tp ON tp.topic = d.topic
	CROSS JOIN LATERAL (` + t.placementCheck("tp") + `) r
)` + reg + `, ins AS (
	INSERT INTO ` + t.Messages + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at` + r.column + `)
	SELECT placed.topic, placed.partition, placed.uuid, placed.payload, placed.metadata, placed.rc, placed.exp` + r.value + `
	FROM placed` + r.join + `
	ORDER BY placed.due_at, placed.id
	RETURNING topic, partition
), notified AS (
	SELECT pg_catalog.pg_notify($2, ` + messagesPayload("t.partition", "t.topic") + `)
	FROM (SELECT DISTINCT topic, partition FROM ins) t
	WHERE $2 <> ''
)
SELECT (SELECT pg_catalog.count(*) FROM ins) + 0 * (SELECT pg_catalog.count(*) FROM notified),
	(SELECT pg_catalog.ceil(extract(epoch FROM x.due_at - pg_catalog.now()) * 1000::numeric)::bigint FROM ` + t.Delayed + ` x
		WHERE NOT (x.id = ANY (ARRAY(SELECT id FROM due)))
		ORDER BY x.due_at, x.id LIMIT 1)`,
		Args: []any{p.Limit, p.NotifyChannel},
	}
}

// DeleteIdleGroups is the statement of [DeleteIdleGroups]. A row written after
// the statement's snapshot (a claim or commit of a session that just
// started) is re-checked on its new version and kept. Where the offsets
// table is distributed by Citus it is citusDeleteIdleGroups.
func (t *Tables) DeleteIdleGroups(idleFor time.Duration) Stmt {
	return Stmt{
		SQL: `WITH idle AS (
	SELECT o.consumer_group FROM ` + t.Offsets + ` o
	GROUP BY o.consumer_group
	HAVING pg_catalog.max(o.updated_at) < pg_catalog.now() - $1::bigint::float8 * interval '1 microsecond'
		AND NOT EXISTS (SELECT 1 FROM ` + t.Sessions + ` s
			WHERE s.consumer_group = o.consumer_group AND s.expires_at > pg_catalog.now())
), gone AS (
	DELETE FROM ` + t.Offsets + ` o USING idle
	WHERE o.consumer_group = idle.consumer_group
		AND o.updated_at < pg_catalog.now() - $1::bigint::float8 * interval '1 microsecond'
	RETURNING o.consumer_group
)
SELECT consumer_group, pg_catalog.count(*) FROM gone GROUP BY consumer_group ORDER BY consumer_group`,
		Args: []any{idleFor.Microseconds()},
	}
}

// RetentionLanes is the statement of [RetentionLanes].
func (t *Tables) RetentionLanes() Stmt {
	return Stmt{SQL: `SELECT l.retention_class, GREATEST(l.covered_until, '1970-01-01 00:00:00+00'),
	GREATEST(l.usable_until, '1970-01-01 00:00:00+00'),
	(SELECT pg_catalog.ceil(extract(epoch FROM pg_catalog.max(t.retention)) * 1000000::numeric)::bigint FROM ` + t.Topics + ` t
		WHERE t.retention_class = l.retention_class), pg_catalog.now()
FROM ` + t.Retention + ` l
ORDER BY l.retention_class`}
}

// RetentionPartitions is the statement of [RetentionPartitions]: the partitions
// named after a class and a start time (see CreateRetentionPartition).
func (t *Tables) RetentionPartitions() Stmt {
	return Stmt{
		SQL: `SELECT r.m[1]::integer, r.m[2]::bigint, i.inhdetachpending
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_catalog.regexp_match(c.relname, '_r([0-9]+)_([0-9]+)$') AS m) r
WHERE i.inhparent = pg_catalog.to_regclass($1)::oid AND r.m IS NOT NULL
ORDER BY 1, 2`,
		Args: []any{t.Messages},
	}
}

func (t *Tables) retentionPartition(p RetentionPartition) string {
	return t.partition(fmt.Sprintf("r%d_%d", p.Class, p.Start.Unix()))
}

// timestampLiteral is t as a timestamptz literal, whatever the session's
// TimeZone and DateStyle.
func timestampLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999") + "+00'"
}

// DetachedRetentionPartitions is the statement of [DetachedRetentionPartitions]: the tables
// of the messages table's schema whose name is the one partitionName
// gives a class and a start (computed by the statement as it computes it:
// the shortened names' prefixes, by the suffix's length, are $3), that are
// no partition and that have the messages table's expires_at.
func (t *Tables) DetachedRetentionPartitions() Stmt {
	base := t.MessagesTable
	if base == "" {
		base = DefaultMessagesTable
	}
	sum := sha256.Sum256([]byte(base))
	// Suffixes are "r" + class + "_" + start: 4 to 19 bytes.
	prefixes := make([]string, 24)
	for i := range prefixes {
		prefixes[i] = cutName(base, 63-(i+1)-10) + "_" + hex.EncodeToString(sum[:4]) + "_"
	}
	return Stmt{
		SQL: `SELECT r.m[1]::integer, r.m[2]::bigint
FROM pg_catalog.pg_class p
JOIN pg_catalog.pg_class c ON c.relnamespace = p.relnamespace AND c.relkind = 'r' AND NOT c.relispartition
CROSS JOIN LATERAL (SELECT pg_catalog.regexp_match(c.relname::text, '_r([0-9]{1,5})_([0-9]{1,12})$'::text) AS m) r
CROSS JOIN LATERAL (SELECT 'r'::text || (r.m[1]::integer)::text || '_'::text || (r.m[2]::bigint)::text AS suffix) s
WHERE p.oid = pg_catalog.to_regclass($1::text)::oid AND r.m IS NOT NULL
	AND c.relname::text = CASE WHEN pg_catalog.octet_length($2::text || '_'::text || s.suffix) <= 63 THEN $2::text || '_'::text || s.suffix
		ELSE ($3::text[])[pg_catalog.octet_length(s.suffix)] || s.suffix END
	AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid)
	AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'expires_at'::name AND NOT a.attisdropped)
ORDER BY 1, 2`,
		Args: []any{t.Messages, base, prefixes},
	}
}

// CreateRetentionPartition is the statement of [CreateRetentionPartition]. The table is
// created on its own and then attached, which takes a SHARE UPDATE
// EXCLUSIVE lock on the messages table: publishers and readers go on
// (CREATE TABLE ... PARTITION OF would block them). A maintainer that is
// a member of the owner role, not the owner, gives the partition to the
// owner, so that the owner's functions can drop it later.
// It copies the messages table's CHECK constraints (schema version 12),
// which ATTACH PARTITION requires.
func (t *Tables) CreateRetentionPartition(p RetentionPartition) []string {
	part := t.retentionPartition(p)
	return []string{
		`SET LOCAL lock_timeout = '5s'`,
		`CREATE TABLE ` + part + ` (LIKE ` + t.Messages + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		`ALTER TABLE ` + part + ` ADD PRIMARY KEY (topic, partition, transaction_id, "offset")`,
		doBlock(`DECLARE
	owner name := (SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass(` + quoteLiteral(t.Messages) + `)::oid);
BEGIN
	IF owner <> current_user THEN
		EXECUTE pg_catalog.format('ALTER TABLE %s OWNER TO %I', ` + quoteLiteral(part) + `, owner);
	END IF;
END`),
		`ALTER TABLE ` + t.Messages + ` ATTACH PARTITION ` + part + `
	FOR VALUES FROM (` + fmt.Sprint(p.Class) + `, ` + timestampLiteral(p.Start) + `) TO (` +
			fmt.Sprint(p.Class) + `, ` + timestampLiteral(p.End) + `)`,
		`UPDATE ` + t.Retention + ` SET covered_until = ` + timestampLiteral(p.End) + `, updated_at = pg_catalog.now()
WHERE retention_class = ` + fmt.Sprint(p.Class) + ` AND covered_until < ` + timestampLiteral(p.End),
	}
}

// UnacknowledgedInPartition is the statement of [UnacknowledgedInPartition]. The bounds
// are the partition's: PostgreSQL prunes every other partition (when it
// plans the statement, or, on a generic plan, when it starts it).
func (t *Tables) UnacknowledgedInPartition(p RetentionPartition) Stmt {
	return Stmt{
		SQL: `SELECT o.consumer_group, o.topic, o.partition, pg_catalog.count(*)
FROM ` + t.Messages + ` m
JOIN ` + t.Offsets + ` o ON o.topic = m.topic AND o.partition = m.partition
WHERE m.retention_class = $1::smallint AND m.expires_at >= $2::timestamptz AND m.expires_at < $3::timestamptz
	AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3`,
		Args: []any{int16(p.Class), p.Start, p.End},
	}
}

// MaintainerAccess is the statement of [MaintainerAccess]. It checks the grants
// of GrantSQL one privilege at a time; an object that does not exist (the
// functions before schema version 7) is reported as missing.
func (t *Tables) MaintainerAccess() Stmt {
	var kinds, names, shown, privs []string
	for _, g := range t.runtimeGrants() {
		name := g.name
		if g.kind == "schema" {
			name = t.Schema // has_schema_privilege takes the name as it is
		}
		for _, priv := range g.privs {
			kinds, names, shown, privs = append(kinds, g.kind), append(names, name), append(shown, g.name), append(privs, priv)
		}
	}
	return Stmt{
		SQL: `SELECT current_user::text, pg_catalog.pg_get_userbyid(c.relowner)::text, pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE'),
	ARRAY(SELECT CASE WHEN g.exists THEN g.priv || ' on ' || g.kind || ' ' || g.shown
			ELSE g.kind || ' ' || g.shown || ' (missing: run pglease.Migrate)' END
		FROM (SELECT x.n, x.kind, x.shown, x.priv, CASE x.kind
				WHEN 'schema' THEN (SELECT pg_catalog.has_schema_privilege(ns.oid, x.priv) FROM pg_namespace ns WHERE ns.nspname = x.name)
				WHEN 'table' THEN pg_catalog.has_table_privilege(pg_catalog.to_regclass(x.name), x.priv)
				ELSE pg_catalog.has_function_privilege(pg_catalog.to_regprocedure(x.name), x.priv) END AS ok,
			CASE x.kind
				WHEN 'schema' THEN EXISTS (SELECT 1 FROM pg_namespace ns WHERE ns.nspname = x.name)
				WHEN 'table' THEN pg_catalog.to_regclass(x.name) IS NOT NULL
				ELSE pg_catalog.to_regprocedure(x.name) IS NOT NULL END AS exists
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS x(kind, name, shown, priv, n)) g
		WHERE g.ok IS NOT TRUE
		ORDER BY g.n)
FROM pg_class c WHERE c.oid = pg_catalog.to_regclass($5)::oid`,
		Args: []any{kinds, names, shown, privs, t.Messages},
	}
}

// CallAddRetentionPartition is the statement of [CallAddRetentionPartition].
func (t *Tables) CallAddRetentionPartition(p RetentionPartition) Stmt {
	return Stmt{
		SQL:  `SELECT ` + t.function(fnAddPartition) + `($1::integer, $2::bigint, $3::bigint)`,
		Args: []any{int32(p.Class), p.Start.Unix(), p.End.Unix()},
	}
}

// CallExpireRetentionPartition is the statement of [CallExpireRetentionPartition].
func (t *Tables) CallExpireRetentionPartition(p RetentionPartition) Stmt {
	return Stmt{
		SQL:  `SELECT ` + t.function(fnExpirePartition) + `($1::integer, $2::bigint)`,
		Args: []any{int32(p.Class), p.Start.Unix()},
	}
}

// CallDropDetachedPartition is the statement of [CallDropDetachedPartition].
func (t *Tables) CallDropDetachedPartition(p RetentionPartition) Stmt {
	return Stmt{
		SQL:  `SELECT ` + t.function(fnDropDetached) + `($1::integer, $2::bigint)`,
		Args: []any{int32(p.Class), p.Start.Unix()},
	}
}

// DetachRetentionPartition is the statement of [DetachRetentionPartition];
// where the messages table is distributed by Citus,
// citusDetachRetentionPartition (finalize does not apply: no detach is
// left pending there).
func (t *Tables) DetachRetentionPartition(p RetentionPartition, finalize bool) string {
	mode := "CONCURRENTLY"
	if finalize {
		mode = "FINALIZE"
	}
	return `ALTER TABLE ` + t.Messages + ` DETACH PARTITION ` + t.retentionPartition(p) + ` ` + mode
}

// DropRetentionPartition is the statement of [DropRetentionPartition].
func (t *Tables) DropRetentionPartition(p RetentionPartition) string {
	return `DROP TABLE IF EXISTS ` + t.retentionPartition(p)
}

// DeleteExpiredKept is the statement of [DeleteExpiredKept]. Per topic with a
// retention, the index scan walks the topic's kept rows from the oldest
// and stops after limit expired ones.
func (t *Tables) DeleteExpiredKept(limit int) Stmt {
	forever := t.partition("forever")
	return Stmt{
		SQL: `WITH gone AS (
	DELETE FROM ` + forever + ` f
	USING (
		SELECT x.ctid AS row_id FROM ` + t.Topics + ` t
		CROSS JOIN LATERAL (
			SELECT m.ctid FROM ` + forever + ` m
			WHERE m.topic = t.topic AND m.created_at < pg_catalog.now() - t.retention
			ORDER BY m.topic, m.partition, m.transaction_id, m."offset"
			LIMIT $1
		) x
		WHERE t.retention_class > 0
		LIMIT $1
	) d
	WHERE f.ctid = d.row_id
	RETURNING f.topic, f.partition, f.transaction_id, f."offset"
)
SELECT NULL::text, NULL::text, NULL::integer, pg_catalog.count(*) FROM gone
UNION ALL
(SELECT o.consumer_group, g.topic, g.partition, pg_catalog.count(*)
FROM gone g
JOIN ` + t.Offsets + ` o ON o.topic = g.topic AND o.partition = g.partition
WHERE (g.transaction_id, g."offset") > (o.acked_transaction_id, o.acked_offset)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3)`,
		Args: []any{limit},
	}
}
