package pglease

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// MaintainerParams identify the session that claims or holds the
// maintainer's row.
type MaintainerParams struct {
	SessionID uuid.UUID
	Epoch     int64
	// NotifyChannel, when not empty, is notified with "e" when a release
	// frees the row, to wake the other candidates.
	NotifyChannel string
}

// MoveDueParams bound one run of [MaintenanceAdapter.MoveDueMessages].
type MoveDueParams struct {
	Limit         int
	NotifyChannel string
}

// RetentionPartition names one partition of a retention class: it holds
// the messages of the class that expire in [Start, Start + slot).
type RetentionPartition struct {
	Class int
	Start time.Time
	End   time.Time
}

// MaintenanceAdapter builds the statements of the maintainer (see
// [MaintenanceConfig]) and of delayed publishing. [DefaultSchemaAdapter]
// implements it; a Subscriber whose adapter does not runs no maintenance,
// and a Publisher refuses delayed messages.
type MaintenanceAdapter interface {
	// ClaimMaintainer makes p.SessionID the maintainer if the row is free:
	// no owner, the owner's session gone, or expired (then deleted in the
	// same statement, as ClaimOffsets does), or already p.SessionID's.
	// Returns one row: epoch bigint (NULL when not claimed), holder uuid
	// (the owner before the statement), holder_expires_in_ms bigint (NULL
	// when the holder has no session row).
	ClaimMaintainer(p MaintainerParams) Query
	// MaintainerHolder reads, without locking or writing anything, who
	// holds the maintainer's row: one row with holder uuid (NULL when
	// free) and holder_expires_in_ms bigint (NULL when the holder has no
	// session row). Candidates run it while a live session holds the row,
	// and ClaimMaintainer only when it looks free.
	MaintainerHolder() Query
	// ReleaseMaintainer frees the row if p.SessionID still holds it at
	// p.Epoch, and notifies.
	ReleaseMaintainer(p MaintainerParams) Query

	// InsertDelayed stores messages with their p.DueAt times, to be moved
	// into the messages table when due, and notifies "d" + the earliest
	// due time in Unix milliseconds.
	InsertDelayed(p InsertMessagesParams) Query
	// MoveDueMessages moves up to p.Limit due messages, oldest due first,
	// into the messages table, placed as InsertMessages places them, and
	// notifies their (topic, partition) rows. Returns one row: moved
	// bigint, next_due_in_ms bigint (NULL when nothing else waits).
	MoveDueMessages(p MoveDueParams) Query

	// DeleteIdleGroups deletes the offset rows of consumer groups that
	// have no live session and whose rows were all last written more than
	// idleFor ago. Returns one row per group: consumer_group text, rows
	// bigint.
	DeleteIdleGroups(idleFor time.Duration) Query

	// RetentionLanes returns one row per retention class with a row in
	// the retention table: class smallint, covered_until timestamptz,
	// max_retention_us bigint (the longest retention of the class's
	// topics; NULL when no topic has the class), now timestamptz.
	RetentionLanes() Query
	// RetentionPartitions returns one row per partition of a retention
	// class: class integer, start_unix bigint, detach_pending bool.
	RetentionPartitions() Query
	// DetachedRetentionPartitions returns one row per table that is named
	// as a retention partition of the messages table, in its schema, but
	// is no partition any more (a detach whose drop did not follow):
	// class integer, start_unix bigint.
	DetachedRetentionPartitions() Query
	// CreateRetentionPartition returns the statements, run in one
	// transaction, that add the partition and record that its class is
	// covered up to its end. They need the owner's privileges.
	CreateRetentionPartition(p RetentionPartition) []string
	// UnacknowledgedInPartition counts, per consumer group, topic and
	// partition, the messages of the retention partition after the
	// group's position: consumer_group text, topic text, partition
	// integer, messages bigint. It reads the partition through the
	// messages table (no privilege on the partition is needed).
	UnacknowledgedInPartition(p RetentionPartition) Query
	// DetachRetentionPartition detaches the partition without blocking
	// readers (CONCURRENTLY, outside a transaction), or, with finalize,
	// completes a detach that was interrupted. It needs the owner's
	// privileges.
	DetachRetentionPartition(p RetentionPartition, finalize bool) string
	// DropRetentionPartition drops a detached partition. It needs the
	// owner's privileges.
	DropRetentionPartition(p RetentionPartition) string

	// MaintainerAccess tells how the connected role can do the
	// maintainer's work. Returns one row (none when the messages table
	// is missing): role text (current_user), owner text (the messages
	// table's owner), owns bool (the role has the owner's privileges: it
	// runs the partition DDL itself), missing text[] (what it lacks of
	// the grants of [GrantSQL] to do the work through the owner's
	// functions instead, one entry each; empty when nothing).
	MaintainerAccess() Query
	// CallAddRetentionPartition does what CreateRetentionPartition does,
	// through the owner's function (schema version 7): one row, created
	// bool (false when the partition exists already).
	CallAddRetentionPartition(p RetentionPartition) Query
	// CallExpireRetentionPartition detaches (not concurrently: a function
	// runs in a transaction; waiting at most a lock_timeout for the
	// messages table) and drops the partition, or finishes a detach left
	// pending, through the owner's function: one row, dropped bool (false
	// when it is no partition of the messages table).
	CallExpireRetentionPartition(p RetentionPartition) Query
	// CallDropDetachedPartition drops a detached retention partition
	// (see DetachedRetentionPartitions) through the owner's function: one
	// row, dropped bool (false when there is no table of that name).
	CallDropDetachedPartition(p RetentionPartition) Query
	// DeleteExpiredKept deletes, row by row and at most limit rows, the
	// messages in the partition of messages kept forever whose topic has a
	// retention now and that are older than it. Returns one row with a
	// NULL consumer_group and the number of rows deleted, then one per
	// (consumer group, topic, partition) with the number of those rows
	// after the group's position: consumer_group text, topic text,
	// partition integer, messages bigint.
	DeleteExpiredKept(limit int) Query
}

var _ MaintenanceAdapter = DefaultSchemaAdapter{}

// maintainerRow is the name of the maintainer's row.
const maintainerRow = "maintainer"

// ClaimMaintainer implements [MaintenanceAdapter]: a compare-and-swap on
// (session_id, epoch), like ClaimOffsets, so that two claims never both
// succeed and a claim from an expired holder conflicts with its heartbeat
// on the session row's lock.
func (a DefaultSchemaAdapter) ClaimMaintainer(p MaintainerParams) Query {
	return Query{
		SQL: `WITH cur AS (
	SELECT m.session_id, m.epoch, s.id IS NOT NULL AS owner_exists, s.expires_at
	FROM ` + a.maintenance() + ` m
	LEFT JOIN ` + a.sessions() + ` s ON s.id = m.session_id
	WHERE m.name = $1
),
expired AS (
	DELETE FROM ` + a.sessions() + ` s
	WHERE s.id = (SELECT session_id FROM cur) AND s.id <> $2 AND s.expires_at < now()
	RETURNING s.id
),
claimed AS (
	UPDATE ` + a.maintenance() + ` m
	SET session_id = $2, epoch = m.epoch + 1, updated_at = now()
	FROM cur
	WHERE m.name = $1 AND m.session_id IS NOT DISTINCT FROM cur.session_id AND m.epoch = cur.epoch
		AND (cur.session_id IS NULL OR cur.session_id = $2 OR NOT cur.owner_exists
			OR cur.session_id IN (SELECT id FROM expired))
	RETURNING m.epoch
)
SELECT (SELECT epoch FROM claimed), cur.session_id,
	ceil(extract(epoch FROM cur.expires_at - now()) * 1000)::bigint
FROM cur`,
		Args: []any{maintainerRow, p.SessionID},
	}
}

// MaintainerHolder implements [MaintenanceAdapter]. It has no parameter
// (the row's name is a constant), so a connection reuses its plan: with
// the name as a parameter PostgreSQL planned it anew on most calls.
func (a DefaultSchemaAdapter) MaintainerHolder() Query {
	return Query{
		SQL: `SELECT m.session_id, ceil(extract(epoch FROM s.expires_at - now()) * 1000)::bigint
FROM ` + a.maintenance() + ` m
LEFT JOIN ` + a.sessions() + ` s ON s.id = m.session_id
WHERE m.name = ` + quoteLiteral(maintainerRow),
	}
}

// ReleaseMaintainer implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) ReleaseMaintainer(p MaintainerParams) Query {
	return Query{
		SQL: `WITH released AS (
	UPDATE ` + a.maintenance() + ` SET session_id = NULL, updated_at = now()
	WHERE name = $1 AND session_id = $2 AND epoch = $3
	RETURNING 1
)
SELECT pg_notify($4, 'e') FROM released WHERE $4 <> ''`,
		Args: []any{maintainerRow, p.SessionID, p.Epoch, p.NotifyChannel},
	}
}

// InsertDelayed implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) InsertDelayed(p InsertMessagesParams) Query {
	var hashes []int32 // nil: NULL, placed by the UUID when moved
	if p.PartitionHashes != nil {
		hashes = make([]int32, len(p.UUIDs))
		for i := range hashes {
			if i < len(p.PartitionHashes) {
				hashes[i] = int32(p.PartitionHashes[i])
			}
		}
	}
	return Query{
		SQL: `WITH ins AS (
	INSERT INTO ` + a.delayed() + ` (due_at, topic, partition_hash, uuid, payload, metadata)
	SELECT m.due, m.topic, m.hash, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb
	FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[], $6::timestamptz[])
		WITH ORDINALITY AS m(topic, uuid, payload, metadata, hash, due, n)
	ORDER BY m.n
	RETURNING due_at
)
SELECT pg_notify($7, 'd' || floor(extract(epoch FROM x.due) * 1000)::bigint)
FROM (SELECT min(due_at) AS due FROM ins) x
WHERE $7 <> '' AND x.due IS NOT NULL`,
		Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes, p.DueAt, p.NotifyChannel},
	}
}

// MoveDueMessages implements [MaintenanceAdapter]. The due rows are
// deleted and inserted into the messages table by one statement, and
// rows another transaction has locked are skipped, so two movers running
// at once never move a message twice. The notifications are a plain
// SELECT in a WITH clause, which PostgreSQL runs only if the statement
// reads it: the result's first column does (adding 0 times its count).
func (a DefaultSchemaAdapter) MoveDueMessages(p MoveDueParams) Query {
	return Query{
		SQL: `WITH due AS (
	DELETE FROM ` + a.delayed() + ` d
	WHERE d.id IN (SELECT x.id FROM ` + a.delayed() + ` x WHERE x.due_at <= now()
		ORDER BY x.due_at, x.id LIMIT $1 FOR UPDATE SKIP LOCKED)
	RETURNING d.id, d.due_at, d.topic, d.partition_hash, d.uuid, d.payload, d.metadata
), placed AS (
	SELECT d.id, d.due_at, d.topic, d.uuid, d.payload, d.metadata,
		((COALESCE(d.partition_hash, hashtext(d.uuid))::bigint & 4294967295) % COALESCE(tp.partitions, 1))::integer AS partition,
		` + a.placement("tp", "r") + `
	FROM due d
	LEFT JOIN ` + a.topics() + ` tp ON tp.topic = d.topic
	CROSS JOIN LATERAL (` + a.placementCheck("tp") + `) r
), ins AS (
	INSERT INTO ` + a.messages() + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at)
	SELECT topic, partition, uuid, payload, metadata, rc, exp FROM placed ORDER BY due_at, id
	RETURNING topic, partition
), notified AS (
	SELECT pg_notify($2, CASE WHEN t.partition = 0 THEN 'm' || t.topic ELSE 'n' || t.partition || ':' || t.topic END)
	FROM (SELECT DISTINCT topic, partition FROM ins) t
	WHERE $2 <> ''
)
SELECT (SELECT count(*) FROM ins) + 0 * (SELECT count(*) FROM notified),
	(SELECT ceil(extract(epoch FROM x.due_at - now()) * 1000)::bigint FROM ` + a.delayed() + ` x
		WHERE NOT (x.id = ANY (ARRAY(SELECT id FROM due)))
		ORDER BY x.due_at, x.id LIMIT 1)`,
		Args: []any{p.Limit, p.NotifyChannel},
	}
}

// DeleteIdleGroups implements [MaintenanceAdapter]. A row written after
// the statement's snapshot (a claim or commit of a session that just
// started) is re-checked on its new version and kept.
func (a DefaultSchemaAdapter) DeleteIdleGroups(idleFor time.Duration) Query {
	return Query{
		SQL: `WITH idle AS (
	SELECT o.consumer_group FROM ` + a.offsets() + ` o
	GROUP BY o.consumer_group
	HAVING max(o.updated_at) < now() - $1::bigint * interval '1 microsecond'
		AND NOT EXISTS (SELECT 1 FROM ` + a.sessions() + ` s
			WHERE s.consumer_group = o.consumer_group AND s.expires_at > now())
), gone AS (
	DELETE FROM ` + a.offsets() + ` o USING idle
	WHERE o.consumer_group = idle.consumer_group
		AND o.updated_at < now() - $1::bigint * interval '1 microsecond'
	RETURNING o.consumer_group
)
SELECT consumer_group, count(*) FROM gone GROUP BY consumer_group ORDER BY consumer_group`,
		Args: []any{idleFor.Microseconds()},
	}
}

// RetentionLanes implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) RetentionLanes() Query {
	return Query{SQL: `SELECT l.retention_class, GREATEST(l.covered_until, '1970-01-01 00:00:00+00'),
	(SELECT ceil(extract(epoch FROM max(t.retention)) * 1000000)::bigint FROM ` + a.topics() + ` t
		WHERE t.retention_class = l.retention_class), now()
FROM ` + a.retention() + ` l
ORDER BY l.retention_class`}
}

// RetentionPartitions implements [MaintenanceAdapter]: the partitions
// named after a class and a start time (see CreateRetentionPartition).
func (a DefaultSchemaAdapter) RetentionPartitions() Query {
	return Query{
		SQL: `SELECT r.m[1]::integer, r.m[2]::bigint, i.inhdetachpending
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT regexp_match(c.relname, '_r([0-9]+)_([0-9]+)$') AS m) r
WHERE i.inhparent = to_regclass($1) AND r.m IS NOT NULL
ORDER BY 1, 2`,
		Args: []any{a.messages()},
	}
}

func (a DefaultSchemaAdapter) retentionPartition(p RetentionPartition) string {
	return a.partition(fmt.Sprintf("r%d_%d", p.Class, p.Start.Unix()))
}

// timestampLiteral is t as a timestamptz literal, whatever the session's
// TimeZone and DateStyle.
func timestampLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999") + "+00'"
}

// DetachedRetentionPartitions implements [MaintenanceAdapter]: the tables
// of the messages table's schema whose name is the one partitionName
// gives a class and a start (computed by the statement as it computes it),
// that are no partition and that have the messages table's expires_at.
func (a DefaultSchemaAdapter) DetachedRetentionPartitions() Query {
	base := a.MessagesTable
	if base == "" {
		base = DefaultMessagesTable
	}
	sum := sha256.Sum256([]byte(base))
	return Query{
		SQL: `SELECT r.m[1]::integer, r.m[2]::bigint
FROM pg_class p
JOIN pg_class c ON c.relnamespace = p.relnamespace AND c.relkind = 'r' AND NOT c.relispartition
CROSS JOIN LATERAL (SELECT regexp_match(c.relname, '_r([0-9]{1,5})_([0-9]{1,12})$') AS m) r
CROSS JOIN LATERAL (SELECT 'r' || r.m[1]::integer || '_' || r.m[2]::bigint AS suffix) s
WHERE p.oid = to_regclass($1) AND r.m IS NOT NULL
	AND c.relname = CASE WHEN octet_length($2::text || '_' || s.suffix) <= 63 THEN $2::text || '_' || s.suffix
		ELSE convert_from(substring(convert_to($2::text, 'UTF8') FROM 1 FOR 53 - octet_length(s.suffix)), 'UTF8')
			|| '_' || $3::text || '_' || s.suffix END
	AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
	AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'expires_at' AND NOT a.attisdropped)
ORDER BY 1, 2`,
		Args: []any{a.messages(), base, hex.EncodeToString(sum[:4])},
	}
}

// CreateRetentionPartition implements [MaintenanceAdapter]. The table is
// created on its own and then attached, which takes a SHARE UPDATE
// EXCLUSIVE lock on the messages table: publishers and readers go on
// (CREATE TABLE ... PARTITION OF would block them). A maintainer that is
// a member of the owner role, not the owner, gives the partition to the
// owner, so that the owner's functions can drop it later.
func (a DefaultSchemaAdapter) CreateRetentionPartition(p RetentionPartition) []string {
	part := a.retentionPartition(p)
	return []string{
		`SET LOCAL lock_timeout = '5s'`,
		`CREATE TABLE ` + part + ` (LIKE ` + a.messages() + ` INCLUDING DEFAULTS)`,
		`ALTER TABLE ` + part + ` ADD PRIMARY KEY (topic, partition, transaction_id, "offset")`,
		doBlock(`DECLARE
	owner name := (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(` + quoteLiteral(a.messages()) + `));
BEGIN
	IF owner <> current_user THEN
		EXECUTE format('ALTER TABLE %s OWNER TO %I', ` + quoteLiteral(part) + `, owner);
	END IF;
END`),
		`ALTER TABLE ` + a.messages() + ` ATTACH PARTITION ` + part + `
	FOR VALUES FROM (` + fmt.Sprint(p.Class) + `, ` + timestampLiteral(p.Start) + `) TO (` +
			fmt.Sprint(p.Class) + `, ` + timestampLiteral(p.End) + `)`,
		`UPDATE ` + a.retention() + ` SET covered_until = ` + timestampLiteral(p.End) + `, updated_at = now()
WHERE retention_class = ` + fmt.Sprint(p.Class) + ` AND covered_until < ` + timestampLiteral(p.End),
	}
}

// UnacknowledgedInPartition implements [MaintenanceAdapter]. The bounds
// are the partition's: PostgreSQL prunes every other partition (when it
// plans the statement, or, on a generic plan, when it starts it).
func (a DefaultSchemaAdapter) UnacknowledgedInPartition(p RetentionPartition) Query {
	return Query{
		SQL: `SELECT o.consumer_group, o.topic, o.partition, count(*)
FROM ` + a.messages() + ` m
JOIN ` + a.offsets() + ` o ON o.topic = m.topic AND o.partition = m.partition
WHERE m.retention_class = $1::smallint AND m.expires_at >= $2::timestamptz AND m.expires_at < $3::timestamptz
	AND (m.transaction_id, m."offset") > (o.acked_transaction_id, o.acked_offset)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3`,
		Args: []any{int16(p.Class), p.Start, p.End},
	}
}

// MaintainerAccess implements [MaintenanceAdapter]. It checks the grants
// of GrantSQL one privilege at a time; an object that does not exist (the
// functions before schema version 7) is reported as missing.
func (a DefaultSchemaAdapter) MaintainerAccess() Query {
	var kinds, names, shown, privs []string
	for _, g := range a.runtimeGrants() {
		name := g.name
		if g.kind == "schema" {
			name = a.Schema // has_schema_privilege takes the name as it is
		}
		for _, priv := range g.privs {
			kinds, names, shown, privs = append(kinds, g.kind), append(names, name), append(shown, g.name), append(privs, priv)
		}
	}
	return Query{
		SQL: `SELECT current_user::text, pg_get_userbyid(c.relowner)::text, pg_has_role(current_user, c.relowner, 'USAGE'),
	ARRAY(SELECT CASE WHEN g.exists THEN g.priv || ' on ' || g.kind || ' ' || g.shown
			ELSE g.kind || ' ' || g.shown || ' (missing: run pglease.Migrate)' END
		FROM (SELECT x.n, x.kind, x.shown, x.priv, CASE x.kind
				WHEN 'schema' THEN (SELECT has_schema_privilege(ns.oid, x.priv) FROM pg_namespace ns WHERE ns.nspname = x.name)
				WHEN 'table' THEN has_table_privilege(to_regclass(x.name), x.priv)
				ELSE has_function_privilege(to_regprocedure(x.name), x.priv) END AS ok,
			CASE x.kind
				WHEN 'schema' THEN EXISTS (SELECT 1 FROM pg_namespace ns WHERE ns.nspname = x.name)
				WHEN 'table' THEN to_regclass(x.name) IS NOT NULL
				ELSE to_regprocedure(x.name) IS NOT NULL END AS exists
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS x(kind, name, shown, priv, n)) g
		WHERE g.ok IS NOT TRUE
		ORDER BY g.n)
FROM pg_class c WHERE c.oid = to_regclass($5)`,
		Args: []any{kinds, names, shown, privs, a.messages()},
	}
}

// CallAddRetentionPartition implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) CallAddRetentionPartition(p RetentionPartition) Query {
	return Query{
		SQL:  `SELECT ` + a.function(fnAddPartition) + `($1::integer, $2::bigint, $3::bigint)`,
		Args: []any{int32(p.Class), p.Start.Unix(), p.End.Unix()},
	}
}

// CallExpireRetentionPartition implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) CallExpireRetentionPartition(p RetentionPartition) Query {
	return Query{
		SQL:  `SELECT ` + a.function(fnExpirePartition) + `($1::integer, $2::bigint)`,
		Args: []any{int32(p.Class), p.Start.Unix()},
	}
}

// CallDropDetachedPartition implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) CallDropDetachedPartition(p RetentionPartition) Query {
	return Query{
		SQL:  `SELECT ` + a.function(fnDropDetached) + `($1::integer, $2::bigint)`,
		Args: []any{int32(p.Class), p.Start.Unix()},
	}
}

// DetachRetentionPartition implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) DetachRetentionPartition(p RetentionPartition, finalize bool) string {
	mode := "CONCURRENTLY"
	if finalize {
		mode = "FINALIZE"
	}
	return `ALTER TABLE ` + a.messages() + ` DETACH PARTITION ` + a.retentionPartition(p) + ` ` + mode
}

// DropRetentionPartition implements [MaintenanceAdapter].
func (a DefaultSchemaAdapter) DropRetentionPartition(p RetentionPartition) string {
	return `DROP TABLE IF EXISTS ` + a.retentionPartition(p)
}

// DeleteExpiredKept implements [MaintenanceAdapter]. Per topic with a
// retention, the index scan walks the topic's kept rows from the oldest
// and stops after limit expired ones.
func (a DefaultSchemaAdapter) DeleteExpiredKept(limit int) Query {
	forever := a.partition("forever")
	return Query{
		SQL: `WITH gone AS (
	DELETE FROM ` + forever + ` f
	USING (
		SELECT x.ctid AS row_id FROM ` + a.topics() + ` t
		CROSS JOIN LATERAL (
			SELECT m.ctid FROM ` + forever + ` m
			WHERE m.topic = t.topic AND m.created_at < now() - t.retention
			ORDER BY m.topic, m.partition, m.transaction_id, m."offset"
			LIMIT $1
		) x
		WHERE t.retention_class > 0
		LIMIT $1
	) d
	WHERE f.ctid = d.row_id
	RETURNING f.topic, f.partition, f.transaction_id, f."offset"
)
SELECT NULL::text, NULL::text, NULL::integer, count(*) FROM gone
UNION ALL
(SELECT o.consumer_group, g.topic, g.partition, count(*)
FROM gone g
JOIN ` + a.offsets() + ` o ON o.topic = g.topic AND o.partition = g.partition
WHERE (g.transaction_id, g."offset") > (o.acked_transaction_id, o.acked_offset)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3)`,
		Args: []any{limit},
	}
}
