package pgsql

import (
	"fmt"
	"math"
	"strconv"
)

// partitionOf is the partition of message m among the count given (a
// format of fmt.Sprintf): its key's hash, else its UUID's, modulo.
const partitionOf = `((COALESCE(m.hash, pg_catalog.hashtext(m.uuid))::bigint & 4294967295) %% (%s)::bigint)::integer`

// InsertMessages is the statement of [InsertMessages] on a single node:
// it registers the partitions its rows go to before they take their
// positions (see [Tables.insertMessages]).
func (t *Tables) InsertMessages(p InsertMessagesParams) Stmt {
	return t.insertMessages(p, registerPerStatement)
}

// insertMessages is the statement of [InsertMessages]; register says
// whether and how it registers its partitions itself (a single node since
// schema version 18; see registering): a sub-statement evaluated before
// the first row is produced calls the registration function once per
// topic, with the partitions the rows go to, and the rows say so by
// writing needs_registration NULL, so that the position trigger's WHEN
// clause lets them through without a test of the registration mark
// (decision 0008, "Registered inserts"); since version 20 the
// sub-statement also takes the statement's one position. Without it
// (Citus), every row is tested as before.
//
// When all messages have one topic (a single Publish call), the topic is
// sent once instead of once per message, and its partition count is read
// once; a topic with one partition (any topic never created) skips the
// modulo and sends one notification without looking at the hashes. The
// hashes travel as int4, their bits reinterpreted (h & 0xffffffff gives the
// uint32 back): measured, a fifth of the statement's cost was the wider
// int8 array and the per-row arithmetic.
func (t *Tables) insertMessages(p InsertMessagesParams, register registering) Stmt {
	hashes := hashesOf(p)
	if oneTopic(p.Topics) {
		r, reg := registers(register, ", reg"), ""
		switch register {
		case registerPerRow:
			reg = `, ` + t.registered(register, `SELECT `+t.RegisterFunction()+`($1::text, CASE WHEN p.n = 1 THEN ARRAY[0]
	ELSE ARRAY(SELECT DISTINCT `+fmt.Sprintf(partitionOf, "p.n")+` FROM unnest($2::text[], $5::int4[]) AS m(uuid, hash)) END) AS ok
	FROM p`)
		case registerPerStatement:
			reg = `, ` + t.registered(register, `SELECT CASE WHEN p.n = 1 THEN `+t.registerOne("$1::text")+`
	ELSE `+t.RegisterFunction()+`($1::text, ARRAY(SELECT DISTINCT `+fmt.Sprintf(partitionOf, "p.n")+` FROM unnest($2::text[], $5::int4[]) AS m(uuid, hash))) END AS ok
	FROM p`)
		}
		insert := `INSERT INTO ` + t.Messages + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at` + r.column + `)
SELECT $1::text, CASE WHEN p.n = 1 THEN 0 ELSE ` + fmt.Sprintf(partitionOf, "p.n") + ` END,
	m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb, p.rc, p.exp` + r.value + `
FROM p` + r.join + `, unnest($2::text[], $3::bytea[], $4::text[], $5::int4[]) WITH ORDINALITY AS m(uuid, payload, metadata, hash, n)
ORDER BY m.n`
		count := `p AS (SELECT COALESCE(tp.partitions, 1) AS n, ` + t.placement("tp", "r") + `
	FROM (SELECT 1) one LEFT JOIN ` + t.Topics + ` tp ON tp.topic = $1::text
	CROSS JOIN LATERAL (` + t.placementCheck("tp") + `) r)` + reg
		if p.NotifyChannel == "" {
			return Stmt{SQL: `WITH ` + count + `
` + insert, Args: []any{p.Topics[0], p.UUIDs, p.Payloads, p.Metadata, hashes}}
		}
		// One notification per distinct partition: "m" + topic for
		// partition 0 (what Subscribers of schema versions before 4
		// listen for), "n" + partition + ":" + topic for the others.
		return Stmt{
			SQL: `WITH ` + count + `, inserted AS (
` + insert + `
)
SELECT pg_catalog.pg_notify($6, ` + kind(NotifyMessages) + ` || $1::text) FROM p WHERE p.n = 1
UNION ALL
SELECT pg_catalog.pg_notify($6, ` + messagesPayload("t.partition", "$1::text") + `)
FROM (SELECT DISTINCT ` + fmt.Sprintf(partitionOf, "(SELECT n FROM p)") + ` AS partition
	FROM unnest($2::text[], $5::int4[]) AS m(uuid, hash)
	WHERE (SELECT n FROM p) > 1) t`,
			Args: []any{p.Topics[0], p.UUIDs, p.Payloads, p.Metadata, hashes, p.NotifyChannel},
		}
	}
	return t.insertManyTopics(p, hashes, `CROSS JOIN LATERAL (`+t.placementCheck("tp")+`) r`, t.placement("tp", "r"), register)
}

// insertManyTopics is the statement of [InsertMessages] for the messages
// of several topics, hashes the partition hashes as sent. placed is what
// follows the join of the topics row tp in the FROM list, placement the
// columns rc and exp it gives (see placement). register is
// insertMessages's.
func (t *Tables) insertManyTopics(p InsertMessagesParams, hashes []int32, placed, placement string, register registering) Stmt {
	partitions := `COALESCE((SELECT tp.partitions FROM ` + t.Topics + ` tp WHERE tp.topic = m.topic), 1)`
	r := registers(register, "\nCROSS JOIN reg")
	insert := `INSERT INTO ` + t.Messages + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at` + r.column + `)
SELECT m.topic, ` + fmt.Sprintf(partitionOf, "COALESCE(tp.partitions, 1)") + `, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb,
	` + placement + r.value + `
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[]) WITH ORDINALITY AS m(topic, uuid, payload, metadata, hash, n)
LEFT JOIN ` + t.Topics + ` tp ON tp.topic = m.topic
` + placed + r.join + `
ORDER BY m.n`
	if p.NotifyChannel == "" {
		if register != noRegistration {
			insert = `WITH ` + t.registerTopics(register, `unnest($1::text[], $2::text[], $5::int4[]) AS m(topic, uuid, hash)`) + `
` + insert
		}
		return Stmt{SQL: insert, Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes}}
	}
	with := `WITH `
	if register != noRegistration {
		with += t.registerTopics(register, `unnest($1::text[], $2::text[], $5::int4[]) AS m(topic, uuid, hash)`) + `, `
	}
	return Stmt{
		SQL: with + `inserted AS (
` + insert + `
)
SELECT pg_catalog.pg_notify($6, ` + messagesPayload("t.partition", "t.topic") + `)
FROM (SELECT DISTINCT m.topic, ` + fmt.Sprintf(partitionOf, partitions) + ` AS partition
	FROM unnest($1::text[], $2::text[], $5::int4[]) AS m(topic, uuid, hash)) t`,
		Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes, p.NotifyChannel},
	}
}

// registering is how an insert statement registers the partitions its
// rows go to (decision 0008): not at all (Citus, the statement a TxHandler
// queues, a schema before version 18: the trigger registers each row),
// itself with a position per row (schema versions 18 and 19), or itself
// with one position for the statement (since 20).
type registering int

const (
	noRegistration registering = iota
	registerPerRow
	registerPerStatement
)

// registration is what an insert that registers its partitions itself
// (see insertMessages) adds: the column needs_registration (and with one
// position per statement transaction_id), the values from the
// sub-statement reg's one row, and the join of reg (to the FROM list).
// The zero value adds nothing.
type registration struct{ column, value, join string }

// registers is the registration of an insert that joins reg with join.
func registers(reg registering, join string) registration {
	switch reg {
	case registerPerRow:
		return registration{", needs_registration", ", CASE WHEN reg.ok THEN NULL ELSE true END", join}
	case registerPerStatement:
		return registration{", needs_registration, transaction_id", ", CASE WHEN reg.ok THEN NULL ELSE true END, reg.pos", join}
	}
	return registration{}
}

// registered is the sub-statement reg of an insert that registers its
// partitions: query registers them and returns one row with ok. With one
// position per statement, reg's row has pos too, the position every row
// of the statement takes: from the sequence, by the function
// <messages>_next_position, called with ok once query is done (behind
// OFFSET 0, so that its row is produced first, and pos projected from
// it); the rows are ordered by their offsets within it. The trigger's
// WHEN clause lets them through: their position is the session's last
// value. A reader passes all of a statement's rows or none, as it did
// with transaction ids before schema version 14 (decision 0008, "Cheaper
// positions").
func (t *Tables) registered(reg registering, query string) string {
	if reg != registerPerStatement {
		return `reg AS (` + query + `)`
	}
	return `reg AS (SELECT r.ok, ` + t.NextPositionFunction() + `(r.ok) AS pos
	FROM (` + query + `
	OFFSET 0) r)`
}

// registerOne is the registration of partition 0 of topic (an
// expression of type text) written out in the statement: what
// <messages>_register(topic, ARRAY[0]) does (migration 20's
// 0020_register.plpgsql), without the function call, which cost a
// one-message insert about a quarter of its server time (a PL/pgSQL call
// with a SET clause, whose expressions are prepared again in every
// transaction; benchmarks/positions.md). Only topics of one partition,
// the common case, take it; the function stays the one registration of
// several partitions and of the position trigger.
//
// The steps are the function's, in its order, each a branch of one CASE
// (which evaluates its conditions in order and stops at the first true):
// nothing when this transaction registered the key before (its mark in
// the setting pglease.registered); else v, the last value the sequence
// handed out, read by a query (an InitPlan, run when the branch needs
// it) and locked shared under the tag 0x70 in the top byte; then the
// key of the topic's partition, shared; then the mark. The locks return
// void, never NULL, so each branch goes on to the next. The sequence is
// named as the statement names the messages table: an unqualified name
// follows the session's search_path like the insert's target (a
// session's temporary sequence of that name gives a lower or higher v,
// which holds back or passes only that session's own messages, as
// writing NULL without registering could before).
func (t *Tables) registerOne(topic string) string {
	k := t.partitionKey(topic, "0")
	return `CASE WHEN pg_catalog.strpos(COALESCE(pg_catalog.current_setting('pglease.registered', true), ''), ',' || ` + k.mark + `) > 0 THEN true
		WHEN pg_catalog.pg_advisory_xact_lock_shared(8070450532247928832 | (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
			FROM ` + t.PositionSequence() + ` s)) IS NULL THEN NULL
		WHEN pg_catalog.pg_advisory_xact_lock_shared(` + k.root + `, ` + k.key + `) IS NULL THEN NULL
		ELSE pg_catalog.set_config('pglease.registered',
			COALESCE(NULLIF(pg_catalog.current_setting('pglease.registered', true), ''), ',') || ` + k.mark + `, true) IS NOT NULL END`
}

// partitionKey is the registration's key of a partition (topic and
// partition SQL expressions, text and integer) as the statements write it
// out (the functions of migrations 17 and 20 compute the same): the
// advisory key's two int4 halves, root from the messages table's oid
// and key the hash of "topic:partition", and mark, what the setting
// pglease.registered holds for it after a comma ("oid:hash,").
type partitionKey struct{ root, key, mark string }

func (t *Tables) partitionKey(topic, partition string) partitionKey {
	oid := quoteLiteral(t.Messages) + `::pg_catalog.regclass::pg_catalog.oid`
	key := `pg_catalog.hashtext(` + topic + ` || ':' || ` + partition + `::text)`
	return partitionKey{
		root: `(` + oid + `::bigint - CASE WHEN ` + oid + `::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer`,
		key:  key,
		mark: oid + `::text || ':' || ` + key + `::text || ','`,
	}
}

// registerTopics is the sub-statement reg of an insert of several topics:
// it registers, per topic, the partitions of the rows of rows (a FROM item
// m with topic, uuid and hash), computed as the insert computes them.
func (t *Tables) registerTopics(reg registering, rows string) string {
	return t.registerPartitions(reg, `SELECT m.topic, pg_catalog.array_agg(DISTINCT `+fmt.Sprintf(partitionOf, "COALESCE(tp.partitions, 1)")+`) AS partitions
		FROM `+rows+` LEFT JOIN `+t.Topics+` tp ON tp.topic = m.topic
		GROUP BY m.topic`)
}

// registerPartitions is the sub-statement reg of an insert that registers,
// per topic, the partitions that grouped (a query of rows topic,
// partitions) gives.
func (t *Tables) registerPartitions(reg registering, grouped string) string {
	return t.registered(reg, `SELECT pg_catalog.bool_and(`+t.RegisterFunction()+`(d.topic, d.partitions)) AS ok
	FROM (`+grouped+`) d`)
}

// hashesOf is p.PartitionHashes as the statements send them: int4, their
// bits reinterpreted; nil (NULL) without keys.
func hashesOf(p InsertMessagesParams) []int32 {
	if p.PartitionHashes == nil {
		return nil
	}
	hashes := make([]int32, len(p.UUIDs))
	for i := range hashes {
		if i < len(p.PartitionHashes) {
			hashes[i] = int32(p.PartitionHashes[i])
		}
	}
	return hashes
}

// classesOf is a condition on m.retention_class that keeps the classes
// whose partitions may hold messages of topic: 0 and the topic's range of
// classes, read by the statement itself. Each bound is a scalar sub-select,
// which PostgreSQL prunes partitions by when the statement starts (an
// array of classes would not prune), so a reader scans only the partition
// kept forever for a topic that never had a retention, and that and its
// class's partitions for one that has. Reading the bounds in the statement
// that reads the messages is safe: a message of a class was written after
// the topics row that gave it the class had committed, so a snapshot that
// sees the message sees the class.
func (t *Tables) classesOf(topic string) string {
	bound := func(col string) string {
		return `COALESCE((SELECT tc.` + col + ` FROM ` + t.Topics + ` tc WHERE tc.topic = ` + topic + `), 0)`
	}
	return `(m.retention_class = 0 OR m.retention_class BETWEEN ` + bound("classes_from") + ` AND ` + bound("classes_to") + `)`
}

// placementCheck is a one-row query, lateral to the topics row tp (NULL
// for a topic without settings), that decides where a message published
// now goes: ok is true when the topic has a retention and a partition of
// its class covers now + retention (the maintainer keeps them ahead) and
// may be used (usable_until: every transaction that could route without
// it has ended; see migration 13), ck
// is the time the expiry counts from. Otherwise the message goes to the
// partition of messages kept forever, from which the maintainer deletes
// it, row by row, once its retention has passed. A topic without retention
// pays nothing more than the columns: the usable_until lookup runs only
// for topics with a retention class.
func (t *Tables) placementCheck(tp string) string {
	return `SELECT CASE WHEN ` + tp + `.retention_class > 0
		THEN k.ck + ` + tp + `.retention < (SELECT l.usable_until FROM ` + t.Retention + ` l
			WHERE l.retention_class = ` + tp + `.retention_class)
		ELSE false END AS ok, k.ck
	FROM (SELECT pg_catalog.clock_timestamp() AS ck) k`
}

// placementJoined is placementCheck on the retention row l, which the
// statement joins to the topics row tp (NULL without one) instead of
// reading it in a sub-select: Citus refuses a correlated sub-select in an
// INSERT ... SELECT whose FROM list holds a lateral sub-query. The
// decision is placementCheck's: a topic whose class has no retention row
// (usable_until NULL) is not ok.
func placementJoined(tp, l string) string {
	return `SELECT CASE WHEN ` + tp + `.retention_class > 0
		THEN k.ck + ` + tp + `.retention < ` + l + `.usable_until
		ELSE false END AS ok, k.ck
	FROM (SELECT pg_catalog.clock_timestamp() AS ck) k`
}

// placement is the retention_class and expires_at values of a message,
// from the topics row tp and placementCheck's row r.
func (t *Tables) placement(tp, r string) string {
	return `CASE WHEN ` + r + `.ok THEN ` + tp + `.retention_class ELSE 0 END AS rc,
	CASE WHEN ` + r + `.ok THEN ` + r + `.ck + ` + tp + `.retention ELSE 'infinity' END AS exp`
}

// UpsertTopic is the statement of [UpsertTopic]. Besides the partition count it
// sets the retention (both ways); a change of retention is notified with
// "t" + topic, for the maintainer, and a retention class gets its row in
// the retention table, so that the maintainer adds its partitions.
func (t *Tables) UpsertTopic(p TopicParams) Stmt {
	return t.upsertTopic(p, "", "", "pg_catalog.now()")
}

// upsertTopic is the statement of [Driver.UpsertTopic], the updated_at
// column set by the expressions given: insertedAt (a column list's
// tail) and valuesAt (a VALUES list's) on insert, updatedAt on update.
func (t *Tables) upsertTopic(p TopicParams, insertedAt, valuesAt, updatedAt string) Stmt {
	return Stmt{
		SQL: `WITH old AS (
	SELECT partitions, retention FROM ` + t.Topics + ` WHERE topic = $1
), up AS (
	INSERT INTO ` + t.Topics + ` AS t (topic, partitions, retention, retention_class, classes_from, classes_to, key_window, key_class` + insertedAt + `)
	VALUES ($1, $2, $4::bigint::float8 * interval '1 microsecond', $5::smallint, $5::smallint, $5::smallint,
		NULLIF($6::bigint, 0)::float8 * interval '1 microsecond', NULLIF($7::smallint, 0)` + valuesAt + `)
	ON CONFLICT (topic) DO UPDATE SET partitions = EXCLUDED.partitions, retention = EXCLUDED.retention,
		retention_class = EXCLUDED.retention_class, key_window = EXCLUDED.key_window, key_class = EXCLUDED.key_class,
		classes_from = CASE WHEN EXCLUDED.retention_class = 0 THEN t.classes_from
			WHEN t.classes_from = 0 THEN EXCLUDED.retention_class
			ELSE LEAST(t.classes_from, EXCLUDED.retention_class) END,
		classes_to = GREATEST(t.classes_to, EXCLUDED.retention_class),
		updated_at = ` + updatedAt + `
		WHERE t.partitions <= EXCLUDED.partitions
			AND (t.partitions < EXCLUDED.partitions OR t.retention <> EXCLUDED.retention
				OR t.key_window IS DISTINCT FROM EXCLUDED.key_window)
	RETURNING partitions, retention
), lane AS (
	INSERT INTO ` + t.Retention + ` (retention_class) SELECT c FROM (VALUES ($5::smallint), ($7::smallint)) v(c) WHERE c > 0
	ON CONFLICT (retention_class) DO NOTHING
), notified AS (
	SELECT pg_catalog.pg_notify($3, ` + kind(NotifyPartitions) + ` || $1) FROM up
	WHERE $3 <> '' AND up.partitions > COALESCE((SELECT partitions FROM old), 0)
	UNION ALL
	SELECT pg_catalog.pg_notify($3, ` + kind(NotifyRetention) + ` || $1) FROM up
	WHERE $3 <> '' AND up.retention IS DISTINCT FROM COALESCE((SELECT retention FROM old), '0')
)
SELECT (SELECT partitions FROM old), (SELECT partitions FROM up), (SELECT pg_catalog.count(*) FROM notified)`,
		Args: []any{p.Topic, p.Partitions, p.NotifyChannel, p.Retention.Microseconds(), int16(p.RetentionClass),
			p.KeyWindow.Microseconds(), int16(p.KeyClass)},
	}
}

// TopicPartitions is the statement of [TopicPartitions].
func (t *Tables) TopicPartitions(p TopicsParams) Stmt {
	return Stmt{
		SQL: `SELECT t.topic, COALESCE(tp.partitions, 1)
FROM pg_catalog.unnest($1::text[]) AS t(topic)
LEFT JOIN ` + t.Topics + ` tp ON tp.topic = t.topic`,
		Args: []any{p.Topics},
	}
}

func oneTopic(topics []string) bool {
	for _, t := range topics[1:] {
		if t != topics[0] {
			return false
		}
	}
	return len(topics) > 0
}

// SelectMessages is the statement of [SelectMessages].
//
// Offsets are assigned before commit, so they commit out of order; only rows
// of transactions older than every running one (below pg_snapshot_xmin) are
// returned, ordered by (transaction_id, offset), so a row can never appear
// behind a position already consumed.
//
// The pending check needs no comparison with p.After: xmin never moves
// back, and p.After's transaction was below an earlier xmin, so every row at
// or above the current xmin lies after p.After. (With the comparison, the
// index scan would start at p.After and walk the whole backlog.)
//
// The pending row reads the highest transaction id at or above xmin (one
// step of a backward index scan). At or above the snapshot's xmax, no
// transaction of this database can have written it (the trigger of
// migration 12 gives every row its inserting transaction's id): the row
// is reported as future, with its position and UUID, and pending is then
// whether a row lies between xmin and xmax (one more probe, made only
// then). Such a row is never returned while the counter is below it.
//
// A last row reports that the statement ran elsewhere than p.Here, or
// that p.After lies at or above the transaction counter: the position was
// read on a history this database is not on (see [Here]).
func (t *Tables) SelectMessages(p SelectMessagesParams) Stmt {
	return t.selectMessages(hereIs(7), append(selectMessagesArgs(p), formatXID8(p.Bound)), `$8::text::xid8`, t.positionCounter())
}

// SelectMessagesBound is SelectMessages below a new bound, as two
// statements to send together in one implicit transaction (see
// singleNode.selectBelowNewBound): the first computes the partition's bound,
// returns it and sets it, local to the transaction, in pglease.read_bound;
// the second is SelectMessages reading below that setting.
//
// The bound's statement takes the bound function's fast path itself (see
// fastBound) and calls the function only when that does not give the
// bound.
func (t *Tables) SelectMessagesBound(p SelectMessagesParams) (bound, read Stmt) {
	bound = Stmt{SQL: `SELECT x.b, pg_catalog.set_config('pglease.read_bound', x.b::text, true)
FROM (SELECT COALESCE(` + t.fastBound(`$1::text`, `$2::integer`, `n.next`) + `,
		(SELECT b.bounds[1] FROM ` + t.PositionBoundFunction() + `(ARRAY[$1::text], ARRAY[$2::integer]) b)) AS b
	FROM (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END AS next FROM ` + t.PositionSequence() + ` s
	OFFSET 0) n) x`,
		Args: []any{p.Topic, p.Partition}}
	read = t.selectMessages(hereIs(7), selectMessagesArgs(p), `pg_catalog.current_setting('pglease.read_bound')::xid8`,
		t.positionCounter())
	return bound, read
}

// fastBound is the bound function's fast path for one partition
// (migration 17, 0017_position_bound.plpgsql), written out in the
// statement: an expression that is next (the value just above the last
// one the sequence handed out, read before it) when no transaction holds
// the key of the topic's partition, else NULL, and NULL wherever the
// function would not take its fast path: a transaction not at READ
// COMMITTED (the function then refuses it) or one that registered the
// key itself (its own lock would not conflict). Whether a transaction
// holds the key: an instant's exclusive session lock on it, released at
// once, succeeds only if none does. Measured, the function's call (a
// PL/pgSQL call with a SET clause) cost a read more server time than the
// read itself (benchmarks/positions.md); the function stays the bound of
// a held key, which reads pg_locks, and of several partitions.
//
// One CASE, so that the steps run in the function's order and stop at
// the first that decides; next must be read before (a column of a
// sub-select behind OFFSET 0, as the statement does).
func (t *Tables) fastBound(topic, partition, next string) string {
	k := t.partitionKey(topic, partition)
	return `CASE WHEN pg_catalog.current_setting('transaction_isolation') <> 'read committed'
		OR pg_catalog.strpos(COALESCE(pg_catalog.current_setting('pglease.registered', true), ''), ',' || ` + k.mark + `) > 0 THEN NULL
		WHEN pg_catalog.pg_try_advisory_lock(` + k.root + `, ` + k.key + `)
			THEN CASE WHEN pg_catalog.pg_advisory_unlock(` + k.root + `, ` + k.key + `) THEN ` + next + ` END END`
}

// selectMessagesArgs are the arguments of [Tables.SelectMessages]: $1 to
// $7.
func selectMessagesArgs(p SelectMessagesParams) []any {
	maxBytes := p.MaxMessageBytes
	if maxBytes <= 0 {
		maxBytes = math.MaxInt64
	}
	return []any{p.Topic, p.Partition, formatXID8(p.After.TransactionID), p.After.Offset, p.Limit, maxBytes, p.Here}
}

// selectMessages is the statement of [Driver.SelectMessages], onHere the
// condition that it runs where the position was read, bound the position
// below which rows are read (xid8), counter the position no row of this
// database has reached yet, read by the statement (xid8).
func (t *Tables) selectMessages(onHere string, args []any, bound, counter string) Stmt {
	// Neither octet_length of a payload nor pg_column_size of metadata
	// reads a TOASTed value, only its header: a message left out costs
	// its index entry and heap tuple, not its bytes. $6 is cast to bigint:
	// left to the server, it would take the type of size, integer, which
	// cannot hold math.MaxInt64 (no bound) nor any bound past 2 GiB.
	const size = `(COALESCE(pg_catalog.octet_length(m.payload), 0) + COALESCE(pg_catalog.pg_column_size(m.metadata), 0))`
	return Stmt{
		// The ORDER BY names the table's columns, qualified: a bare
		// transaction_id would sort by the text output column.
		SQL: `(SELECT m."offset", m.transaction_id::text AS transaction_id_text, m.uuid,
	CASE WHEN ` + size + ` <= $6::bigint THEN m.payload END, m.metadata::text AS metadata_text,
	false AS pending, false AS future, ` + size + ` AS size, false AS went_back
FROM ` + t.Messages + ` m
WHERE m.topic = $1 AND m.partition = $2 AND ` + t.classesOf("$1") + `
	AND (m.transaction_id, m."offset") > ($3::text::xid8, $4::bigint)
	AND m.transaction_id < ` + bound + `
ORDER BY m.transaction_id, m."offset"
LIMIT $5)
UNION ALL
SELECT CASE WHEN t.future THEN t."offset" END, CASE WHEN t.future THEN t.transaction_id::text END,
	CASE WHEN t.future THEN t.uuid END, NULL, NULL,
	CASE WHEN t.future THEN EXISTS (SELECT FROM ` + t.Messages + ` m
		WHERE m.topic = $1 AND m.partition = $2 AND ` + t.classesOf("$1") + `
			AND m.transaction_id >= ` + bound + `
			AND m.transaction_id < ` + counter + `)
	ELSE true END,
	t.future, NULL, false
FROM (SELECT m."offset", m.transaction_id, m.uuid,
		m.transaction_id >= ` + counter + ` AS future
	FROM ` + t.Messages + ` m
	WHERE m.topic = $1 AND m.partition = $2 AND ` + t.classesOf("$1") + `
		AND m.transaction_id >= ` + bound + `
	ORDER BY m.transaction_id DESC
	LIMIT 1) t
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, false, false, NULL, true
WHERE NOT (` + onHere + ` AND $3::text::xid8 < ` + counter + `)`,
		Args: args,
	}
}

// SelectMessagesAt is the statement of [Driver.SelectMessagesAt].
func (t *Tables) SelectMessagesAt(p SelectMessagesAtParams) Stmt {
	return t.selectMessagesAt(hereIs(5), selectMessagesAtArgs(p), t.positionCounter())
}

// selectMessagesAtArgs are the arguments of [Tables.SelectMessagesAt]: $1
// to $6.
func selectMessagesAtArgs(p SelectMessagesAtParams) []any {
	txIDs := make([]string, len(p.Positions))
	offsets := make([]int64, len(p.Positions))
	var top uint64
	for i, pos := range p.Positions {
		txIDs[i] = formatXID8(pos.TransactionID)
		offsets[i] = pos.Offset
		top = max(top, pos.TransactionID)
	}
	return []any{p.Topic, p.Partition, txIDs, offsets, p.Here, formatXID8(top)}
}

// selectMessagesAt reads the messages at the positions $3 and $4 (pairs of
// a transaction id and an offset), whole, in the columns of
// [Tables.selectMessages], so that one scan reads both. It needs no
// position bound: every position was read below one before. The two
// arrays select a superset of the pairs when several are asked for (the
// reader keeps only the pairs it asked for); the index on (topic,
// partition, transaction_id, offset) takes both as array conditions. A
// last row reports that the statement ran elsewhere than the position was
// read (onHere), or that the highest position asked for ($6) lies at or
// above the transaction counter (counter).
func (t *Tables) selectMessagesAt(onHere string, args []any, counter string) Stmt {
	const size = `(COALESCE(pg_catalog.octet_length(m.payload), 0) + COALESCE(pg_catalog.pg_column_size(m.metadata), 0))`
	return Stmt{
		SQL: `(SELECT m."offset", m.transaction_id::text AS transaction_id_text, m.uuid, m.payload,
	m.metadata::text AS metadata_text, false AS pending, false AS future, ` + size + ` AS size, false AS went_back
FROM ` + t.Messages + ` m
WHERE m.topic = $1 AND m.partition = $2 AND ` + t.classesOf("$1") + `
	AND m.transaction_id = ANY ($3::text[]::xid8[]) AND m."offset" = ANY ($4::bigint[])
ORDER BY m.transaction_id, m."offset")
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, false, false, NULL, true
WHERE NOT (` + onHere + ` AND $6::text::xid8 < ` + counter + `)`,
		Args: args,
	}
}

// positionCounter is the position no row of this database has reached
// yet, read from the sequence by the statement (xid8): the value the
// sequence hands out next. A row at or above it was not written by this
// database's history (see [Here]).
func (t *Tables) positionCounter() string {
	return `(SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END FROM ` + t.PositionSequence() + ` s)::text::xid8`
}

// PositionBounds is the statement of [Driver.PositionBounds].
func (t *Tables) PositionBounds(topics []string, partitions []int32) Stmt {
	return Stmt{SQL: `SELECT b.bounds FROM ` + t.PositionBoundFunction() + `($1::text[], $2::integer[]) b`,
		Args: []any{topics, partitionsOf(topics, partitions)}}
}

// VisibleTopics is the statement of [VisibleTopics].
//
// On a single node it looks for a committed message after each position
// below the counter read by the statement, not below the position bound:
// it decides only whether to wake the row's consumer, whose read computes
// the bound, and a bound of its own would cost the idle poll a second
// statement. A row held by an open publisher of its topic, with committed
// messages above, is reported, and its consumer's read finds them pending.
//
// Each row looks for its first visible message in a LATERAL sub-select
// ordered as the primary key and limited to one row: a probe of the index
// per row, whatever the size of the table. Written as EXISTS, the planner
// chose a hash semi-join over a sequential scan of the whole messages
// table, from 3 idle topics on (measured: 47 ms per poll on 50,000
// messages, 300 ms on 170,000, each idle poll of each Subscriber).
func (t *Tables) VisibleTopics(p VisibleTopicsParams) Stmt {
	txIDs := make([]string, len(p.Positions))
	offsets := make([]int64, len(p.Positions))
	for i, pos := range p.Positions {
		txIDs[i] = formatXID8(pos.TransactionID)
		offsets[i] = pos.Offset
	}
	return Stmt{
		SQL: `SELECT t.n
FROM unnest($1::text[], $4::integer[], $2::text[], $3::bigint[]) WITH ORDINALITY AS t(topic, partition, tx, off, n)
CROSS JOIN LATERAL (SELECT 1 FROM ` + t.Messages + ` m
	WHERE m.topic = t.topic AND m.partition = t.partition AND ` + t.classesOf("t.topic") + `
		AND (m.transaction_id, m."offset") > (t.tx::xid8, t.off)
		AND m.transaction_id < ` + t.positionCounter() + `
	ORDER BY m.transaction_id, m."offset"
	LIMIT 1) visible`,
		Args: []any{p.Topics, txIDs, offsets, partitionsOf(p.Topics, p.Partitions)},
	}
}

// partitionsOf returns partitions, or partition 0 for each topic when it is
// nil.
func partitionsOf(topics []string, partitions []int32) []int32 {
	if partitions != nil {
		return partitions
	}
	return make([]int32, len(topics))
}

// CreateSession is the statement of [CreateSession]. Its row is the
// notifications sent (0 or 1) and where the database is (markColumns),
// read by the statement that made the session: the identity that every
// statement on the session's claims is fenced by.
func (t *Tables) CreateSession(p SessionParams) Stmt {
	return Stmt{
		SQL: `WITH replaced AS (
	DELETE FROM ` + t.Sessions + ` WHERE id = $5
), inserted AS (
	INSERT INTO ` + t.Sessions + ` (id, consumer_group, owner, expires_at, protocol)
	VALUES ($1, $2, $3, pg_catalog.now() + $4::bigint::float8 * interval '1 microsecond', $7)
	RETURNING consumer_group
), notified AS (
	SELECT pg_catalog.pg_notify($6, ` + kind(NotifyGroup) + ` || consumer_group) FROM inserted WHERE $6 <> ''
)
SELECT (SELECT pg_catalog.count(*) FROM notified), ` + markColumns,
		Args: []any{p.SessionID, p.ConsumerGroup, p.Owner, p.TTL.Microseconds(), p.ReplacesSessionID, p.NotifyChannel, p.Protocol},
	}
}

// HeartbeatSession is the statement of [HeartbeatSession].
func (t *Tables) HeartbeatSession(p SessionParams) Stmt {
	return Stmt{
		SQL: `WITH beat AS (
	UPDATE ` + t.Sessions + `
	SET expires_at = pg_catalog.now() + $2::bigint::float8 * interval '1 microsecond'
	WHERE id = $1 AND expires_at > pg_catalog.now()
	RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM beat), ` + markColumns,
		Args: []any{p.SessionID, p.TTL.Microseconds()},
	}
}

// markColumns are where the database is: the columns of [ClusterMark].
const markColumns = `pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text,
	pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::text, pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8),
	` + here

// DeleteSession is the statement of [DeleteSession].
func (t *Tables) DeleteSession(p SessionParams) Stmt {
	return Stmt{
		SQL: `WITH deleted AS (
	DELETE FROM ` + t.Sessions + ` WHERE id = $1 RETURNING consumer_group
)
SELECT pg_catalog.pg_notify($2, ` + kind(NotifyGroup) + ` || consumer_group) FROM deleted WHERE $2 <> ''`,
		Args: []any{p.SessionID, p.NotifyChannel},
	}
}

// SetSubscriptions is the statement of [SetSubscriptions].
func (t *Tables) SetSubscriptions(p SessionParams) Stmt {
	return Stmt{
		SQL: `WITH updated AS (
	UPDATE ` + t.Sessions + ` SET subscription_hash = $2, subscription_size = $3
	WHERE id = $1
	RETURNING consumer_group
)
SELECT pg_catalog.pg_notify($4, ` + kind(NotifyGroup) + ` || consumer_group) FROM updated WHERE $4 <> ''`,
		Args: []any{p.SessionID, p.SubscriptionHash, p.SubscriptionSize, p.NotifyChannel},
	}
}

// GroupMembers is the statement of [GroupMembers].
func (t *Tables) GroupMembers(p GroupParams) Stmt {
	return Stmt{
		SQL: `SELECT id, created_at, pg_catalog.ceil(extract(epoch FROM expires_at - pg_catalog.now()) * 1000::numeric)::bigint,
	subscription_hash, subscription_size, owner, protocol
FROM ` + t.Sessions + `
WHERE consumer_group = $1 AND expires_at > pg_catalog.now()`,
		Args: []any{p.ConsumerGroup},
	}
}

// OffsetOwners is the statement of [OffsetOwners]: the group's rows of
// the topics $2, found by the primary key's prefix.
func (t *Tables) OffsetOwners(p OffsetsParams) Stmt {
	return Stmt{
		SQL: `SELECT o.topic, o.partition, o.session_id, o.epoch
FROM ` + t.Offsets + ` o
WHERE o.consumer_group = $1 AND o.topic = ANY ($2::text[])`,
		Args: []any{p.ConsumerGroup, p.Topics},
	}
}

// DeleteExpiredSessions is the statement of [DeleteExpiredSessions].
//
// Since schema version 8 no index covers expires_at (an index on it made
// every heartbeat a non-HOT update), so this is a sequential scan of the
// sessions table: one row per live Subscriber, at fillfactor 10 about
// seven to a page. Measured: 0.6 ms for 1,000 sessions, 3 ms for 10,000.
// The maintainer runs it once per MaintenanceConfig.Interval; only where
// no Subscriber may maintain does every Subscriber run it, every tenth
// heartbeat. The other readers of expires_at find their rows by id (the
// claims' join, the maintainer's election) or by consumer group
// (GroupMembers, the removal of idle groups).
func (t *Tables) DeleteExpiredSessions(p SessionParams) Stmt {
	return Stmt{
		SQL:  `DELETE FROM ` + t.Sessions + ` WHERE expires_at < pg_catalog.now() - $1::bigint::float8 * interval '1 microsecond'`,
		Args: []any{p.TTL.Microseconds()},
	}
}

// EnsureOffsets is the statement of [EnsureOffsets].
//
// With p.Latest, a new group starts just below the partition's position
// bound (decision 0008), read by the statement: (bound - 1, the largest
// offset), so that every message at or above the bound is delivered and
// the position is below the counter. Whether the group has a row of the
// topic is decided on
// the statement's snapshot, so the rows of a topic created by one
// statement all start at the same place. Callers pass every partition of
// a topic to the same statement: split over two, a new group's rows of
// the second would start at the beginning, the first's rows existing.
func (t *Tables) EnsureOffsets(p OffsetsParams) Stmt {
	return Stmt{
		SQL: `INSERT INTO ` + t.Offsets + ` AS o (consumer_group, topic, partition, acked_transaction_id, acked_offset)
SELECT $1, t.topic, t.partition,
	CASE WHEN l.latest THEN (b.bounds[t.n] - 1)::text::xid8 ELSE '0'::xid8 END,
	CASE WHEN l.latest THEN 9223372036854775807 ELSE 0 END
FROM unnest($2::text[], $3::integer[]) WITH ORDINALITY AS t(topic, partition, n)
CROSS JOIN (SELECT f.bounds FROM ` + t.PositionBoundFunction() + `($2::text[], $3::integer[]) f) b
CROSS JOIN LATERAL (SELECT $4 AND NOT EXISTS (SELECT 1 FROM ` + t.Offsets + ` g WHERE g.consumer_group = $1 AND g.topic = t.topic) AS latest) l
ORDER BY t.topic, t.partition
ON CONFLICT (consumer_group, topic, partition) DO NOTHING
RETURNING o.topic, o.partition, o.acked_transaction_id::text`,
		Args: []any{p.ConsumerGroup, p.Topics, partitionsOf(p.Topics, p.Partitions), p.Latest},
	}
}

// ClaimOffsets is the statement of [ClaimOffsets].
//
// The statement decides on each row as its snapshot shows it and writes
// only if the row is still in that state when it gets the row lock, a
// compare-and-swap on (session_id, epoch). So a concurrent claim that
// committed first always makes this one fail, whatever the statement's
// snapshot shows of the sessions table. (Re-checking a sub-select on the
// sessions table instead, as an UPDATE's WHERE clause would after waiting
// for a concurrent claim, reads the old snapshot: a session created after
// it is invisible there and would count as gone.)
//
// A row is free when it has no owner, when its owner's session row is gone
// (a session row exists before its first claim commits, so an owner
// missing from the snapshot was deleted), or when the owner's session has
// expired: then the statement deletes that session row and claims only if
// the delete went through. The delete and the owner's heartbeat conflict on
// the session row's lock: either the heartbeat commits first and the
// delete, re-checking the extended expiry, does nothing (no claim), or the
// delete commits first and the heartbeat finds no row (the owner learns
// that its session is lost). A session may also claim a row it already
// owns, bumping the epoch, so that a claim whose outcome was lost in
// transit can be retried.
//
// A row whose acknowledged position lies ahead of the database's
// transaction counter (positions copied from another cluster) is not
// claimed and reported as 'f'.
//
// Run elsewhere than p.Here (the session was made on another server or
// timeline: see [Here]), the statement claims nothing and returns one
// row, of kind 'w'.
//
// The statement looks at the rows in (topic, partition) order and stops
// after p.Limit rows that it can claim (or that are missing or ahead of the
// counter), so that the rows it locks are bounded and two claimers lock
// common rows in the same order.
func (t *Tables) ClaimOffsets(p OffsetsParams) Stmt {
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + hereIs(6) + ` AS ok
), cur AS (
	SELECT t.topic, t.partition, o.consumer_group IS NULL AS missing, o.session_id, o.epoch,
		s.id IS NOT NULL AS owner_exists, s.owner,
		COALESCE(o.acked_transaction_id >= ` + t.positionCounter() + `, false) AS future
	FROM unnest($2::text[], $5::integer[]) AS t(topic, partition)
	LEFT JOIN ` + t.Offsets + ` o ON o.consumer_group = $1 AND o.topic = t.topic AND o.partition = t.partition
	LEFT JOIN ` + t.Sessions + ` s ON s.id = o.session_id
	WHERE (o.consumer_group IS NULL OR o.session_id IS NULL OR o.session_id = $3 OR s.id IS NULL
		OR s.expires_at < pg_catalog.now())
		AND (SELECT ok FROM here)
	ORDER BY t.topic, t.partition
	LIMIT $4
),
expired AS (
	DELETE FROM ` + t.Sessions + ` s
	WHERE s.id IN (SELECT cur.session_id FROM cur WHERE NOT cur.future AND cur.session_id <> $3)
		AND s.expires_at < pg_catalog.now()
	RETURNING s.id
),
claimed AS (
	UPDATE ` + t.Offsets + ` o
	SET session_id = $3, epoch = o.epoch + 1, updated_at = pg_catalog.now()
	FROM cur
	WHERE o.consumer_group = $1 AND o.topic = cur.topic AND o.partition = cur.partition
		AND NOT cur.missing AND NOT cur.future
		AND o.session_id IS NOT DISTINCT FROM cur.session_id AND o.epoch = cur.epoch
		AND (cur.session_id IS NULL OR cur.session_id = $3 OR NOT cur.owner_exists
			OR cur.session_id IN (SELECT id FROM expired))
	RETURNING o.topic, o.partition, o.epoch, o.acked_transaction_id, o.acked_offset,
		` + aboveAfter("o.acked_above", "o.acked_transaction_id", "o.acked_offset") + ` AS acked_above
)
SELECT 'c', c.topic, c.partition, c.epoch, c.acked_transaction_id::text, c.acked_offset,
	EXISTS (SELECT 1 FROM ` + t.Messages + ` m
		WHERE m.topic = c.topic AND m.partition = c.partition
			AND (m.transaction_id, m."offset") > (c.acked_transaction_id, c.acked_offset)),
	NULLIF(cur.session_id, $3), cur.owner, c.acked_above
FROM claimed c JOIN cur ON cur.topic = c.topic AND cur.partition = c.partition
UNION ALL
SELECT CASE WHEN cur.missing THEN 'm' WHEN cur.future THEN 'f' ELSE 'l' END, cur.topic, cur.partition,
	NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM cur WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.topic = cur.topic AND c.partition = cur.partition)
UNION ALL
SELECT 'w', '', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM here WHERE NOT ok`,
		Args: []any{p.ConsumerGroup, p.Topics, p.SessionID, p.Limit, partitionsOf(p.Topics, p.Partitions), p.Here},
	}
}

// aboveAfter is the entries of the acked_above array arr ("xid:offset",
// see [AboveEntry]) that lie after the position (tx, off), each once: what
// is left to skip of them above that position.
func aboveAfter(arr, tx, off string) string {
	return `ARRAY(SELECT DISTINCT a FROM pg_catalog.unnest(` + arr + `) a
		WHERE (pg_catalog.split_part(a, ':', 1)::xid8, pg_catalog.split_part(a, ':', 2)::bigint) > (` + tx + `, ` + off + `))`
}

// keptAboveSet is the SET item of a release that adds the positions of
// the text[] parameter $above to acked_above and keeps of them, and of
// those already there, the ones after both the row's position and the one
// written ($6, $7), so the array never holds a position at or before the
// row's. It is computed from the old row, like forwardSet.
func keptAboveSet(above int) string {
	return keptAboveSetOf(`$`+strconv.Itoa(above)+`::text[]`, `$6::text::xid8`, `$7::bigint`)
}

// keptAboveSetOf is keptAboveSet with the positions added (text[]) and
// the position written (xid8, bigint) given as SQL expressions.
func keptAboveSetOf(above, tx, off string) string {
	return `acked_above = ARRAY(SELECT DISTINCT a FROM pg_catalog.unnest(acked_above || ` + above + `) a
		WHERE (pg_catalog.split_part(a, ':', 1)::xid8, pg_catalog.split_part(a, ':', 2)::bigint) > (acked_transaction_id, acked_offset)
			AND (pg_catalog.split_part(a, ':', 1)::xid8, pg_catalog.split_part(a, ':', 2)::bigint) > (` + tx + `, ` + off + `))`
}

// AboveEntries are positions as acked_above entries ([AboveEntry]).
func AboveEntries(ps []Position) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = AboveEntry(p)
	}
	return out
}

// forwardSet is the SET list that moves the acknowledged position to
// ($6, $7) only if that lies ahead: the columns are computed from the old
// row, so they move together or not at all. Moved, head_deliveries counts
// the claims that handed out the message after the new position: 1 when
// the boolean parameter $headOut says this claim has (see
// [OffsetParams.HeadOut]), else 0.
func forwardSet(headOut int) string {
	return forwardSetOf(`$6::text::xid8`, `$7::bigint`, `$`+strconv.Itoa(headOut)+`::boolean`)
}

// forwardSetOf is forwardSet with the position (xid8, bigint) and
// headOut (boolean) given as SQL expressions.
func forwardSetOf(tx, off, headOut string) string {
	ahead := `(acked_transaction_id, acked_offset) < (` + tx + `, ` + off + `)`
	return `acked_transaction_id = CASE WHEN ` + ahead + ` THEN ` + tx + ` ELSE acked_transaction_id END,
	acked_offset = CASE WHEN ` + ahead + ` THEN ` + off + ` ELSE acked_offset END,
	head_deliveries = CASE WHEN ` + ahead + ` THEN CASE WHEN ` + headOut + ` THEN 1 ELSE 0 END
		ELSE head_deliveries END`
}

// notFuture refuses to write a position ($6) that is not below the
// database's transaction counter. Every position a Subscriber reads lies
// below the xmin horizon of the moment it was read, and the counter only
// grows, so such a position was read on another history: the database
// failed over to a standby that lagged, or was restored. Written, it would
// skip what the database hands those transaction ids out to now.
func (t *Tables) notFuture() string { return `$6::text::xid8 < ` + t.positionCounter() }

// onHistory is the condition of a fenced statement on position $6 and
// the session's identity $here: the statement runs where the session was
// made, and the position is not ahead of the counter (notFuture). When it
// does not hold, the statement writes nothing and says so: the database
// went back (see [Here]).
func (t *Tables) onHistory(here int) string {
	return `(` + hereIs(here) + ` AND ` + t.notFuture() + `)`
}

// CommitOffset is the statement of [CommitOffset].
//
// While a transaction holds the vacuum horizon (a pg_dump, a long report),
// every commit leaves a version of the row behind that nothing can
// remove, and a lookup by the primary key visits all of them: the index
// entry of each page they span, and the chain of versions on each page.
// Measured with 100 rows and 3,000 versions of each, commits by the key ran
// at a quarter of their first rate. So the statement first updates the
// version at p.Version (a TID scan: that one tuple) and looks the row up
// by its key only when that updated nothing: no hint, or the version was
// replaced (a claim, AckInTx, a delivery count, a release) or moved
// (VACUUM FULL). The key lookup is gated on the first update returning
// nothing, so it is not even started when the hint held. Both updates
// have the same conditions, so the outcome is the keyed statement's
// either way: if a concurrent transaction changed the row, PostgreSQL
// re-checks the conditions on its latest version (and a hint whose
// version another transaction replaced before this statement's snapshot
// finds nothing visible, and the key lookup decides).
//
// Its rows are the version written (none: ownership lost), or one row with
// a NULL version and true when onHistory refused the statement.
func (t *Tables) CommitOffset(p OffsetParams) Stmt {
	update := `UPDATE ` + t.Offsets + `
	SET ` + forwardSet(10) + `, updated_at = pg_catalog.now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND (SELECT ok FROM here)`
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + t.onHistory(9) + ` AS ok
), hinted AS (
	` + update + ` AND ctid = NULLIF($8, '')::tid
	RETURNING ctid
), keyed AS (
	` + update + ` AND NOT EXISTS (SELECT 1 FROM hinted)
	RETURNING ctid
)
SELECT ctid::text, false FROM hinted
UNION ALL
SELECT ctid::text, false FROM keyed
UNION ALL
SELECT NULL, true FROM here WHERE NOT ok`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Position.Offset, p.Version, p.Here, p.HeadOut},
	}
}

// ReleaseOffset is the statement of [ReleaseOffset]. Its one row is
// whether onHistory held, and the rows released: none when ownership was
// lost, or when onHistory refused the statement (which wrote nothing).
// [ScanRelease] reads it. It adds p.AckedAbove to acked_above
// (keptAboveSet).
func (t *Tables) ReleaseOffset(p OffsetParams) Stmt {
	sql := `WITH here AS (
	SELECT ` + t.onHistory(8) + ` AS ok
), released AS (
	UPDATE ` + t.Offsets + `
	SET ` + forwardSet(9) + `,
		` + keptAboveSet(10) + `,
		session_id = NULL, updated_at = pg_catalog.now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND (SELECT ok FROM here)
	RETURNING topic
)`
	args := []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
		formatXID8(p.Position.TransactionID), p.Position.Offset, p.Here, p.HeadOut, AboveEntries(p.AckedAbove)}
	if p.NotifyChannel == "" {
		return Stmt{SQL: sql + `
SELECT (SELECT ok FROM here), (SELECT pg_catalog.count(*) FROM released)`, Args: args}
	}
	return Stmt{
		SQL: sql + `, notified AS (
	SELECT topic, pg_catalog.pg_notify($11, ` + kind(NotifyReleased) + ` || topic) FROM released
)
SELECT (SELECT ok FROM here), (SELECT pg_catalog.count(topic) FROM notified)`,
		Args: append(args, p.NotifyChannel),
	}
}

// CountHeadDelivery is the statement of [CountHeadDelivery].
//
// Its row is whether onHistory held, and the new count (NULL: ownership
// lost).
func (t *Tables) CountHeadDelivery(p OffsetParams) Stmt {
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + t.onHistory(8) + ` AS ok
), counted AS (
	UPDATE ` + t.Offsets + ` SET head_deliveries = head_deliveries + 1
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND session_id = $4 AND epoch = $5
		AND acked_transaction_id = $6::text::xid8 AND acked_offset = $7 AND (SELECT ok FROM here)
	RETURNING head_deliveries
)
SELECT (SELECT ok FROM here), (SELECT head_deliveries FROM counted)`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Position.Offset, p.Here},
	}
}

// AckOffset is the statement of [AckOffset]. The UPDATE finds the row in the
// statement's snapshot; if a claim changed it since, PostgreSQL re-checks
// the WHERE clause on the latest version, which is the one cur locked and
// read, so the decision and the write are made on the same version. With
// p.Above it writes the position into acked_above instead, keeping the
// entries that lie after the row's position (those at or before it are
// covered by the position: dropped here, so the array holds at most the
// positions acknowledged above an unacknowledged message).
func (t *Tables) AckOffset(p OffsetParams) Stmt {
	set := `acked_transaction_id = $6::text::xid8, acked_offset = $7, head_deliveries = 0`
	if p.Above {
		set = `acked_above = pg_catalog.array_append(ARRAY(SELECT a FROM pg_catalog.unnest(cur.acked_above) a
		WHERE (pg_catalog.split_part(a, ':', 1)::xid8, pg_catalog.split_part(a, ':', 2)::bigint)
			> (cur.acked_transaction_id, cur.acked_offset)), $9::text)`
	}
	return Stmt{
		SQL: `WITH here AS (
	SELECT ` + t.onHistory(8) + ` AS ok
), cur AS (
	SELECT session_id, epoch, acked_transaction_id, acked_offset, acked_above,
		$9::text = ANY(acked_above) AS recorded
	FROM ` + t.Offsets + `
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3
	FOR UPDATE
), advanced AS (
	UPDATE ` + t.Offsets + ` o
	SET ` + set + `, updated_at = pg_catalog.now()
	FROM cur
	WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3
		AND cur.session_id = $4 AND cur.epoch = $5
		AND (cur.acked_transaction_id, cur.acked_offset) < ($6::text::xid8, $7::bigint)
		AND NOT cur.recorded
		AND (SELECT ok FROM here)
	RETURNING 1
)
SELECT cur.session_id, cur.epoch, cur.acked_transaction_id::text, cur.acked_offset, EXISTS (SELECT 1 FROM advanced),
	(SELECT ok FROM here), cur.recorded
FROM cur`,
		Args: []any{p.ConsumerGroup, p.Topic, p.Partition, p.SessionID, p.Epoch,
			formatXID8(p.Position.TransactionID), p.Position.Offset, p.Here, AboveEntry(p.Position)},
	}
}

// AboveEntry is how a position is written in acked_above: "xid:offset".
func AboveEntry(pos Position) string {
	return formatXID8(pos.TransactionID) + ":" + strconv.FormatInt(pos.Offset, 10)
}
