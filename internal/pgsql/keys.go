package pgsql

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Idempotency keys (schema versions 15 and 21).
//
// A message published with a key is stored only if no message of its topic
// was stored with that key within the topic's key window: its retention
// when that is longer than a day, else a day. The keys table holds one row
// per (topic, key, slot), a slot being a span of the database's clock of
// the width of the topic's key class, and is partitioned by gen: 4 * class
// + the slot modulo 4. Class 0 (schema version 15) has slots of a day
// (KeySlotSeconds), gens 0 to 3, made by the migration; a topic whose
// retention is longer than a day has the class of its retention
// (RetentionClass: more than 2^(k-2) and at most 2^(k-1) seconds), from
// KeyClassMin to KeyClassMax, with slots of 2^(k-1) seconds, gens 4k to
// 4k+3 (schema version 21), made by the maintainer, through the owner's
// function, for the classes in use.
//
// The statement that publishes writes each key for two slots of its
// topic's class: the slot its transaction began in (pg_catalog.now()) and
// the one before, with INSERT ... ON CONFLICT DO NOTHING, and stores the
// message only when every row was new (where the statement is a
// transaction of its own, a strict statement without ON CONFLICT runs
// first: see strictFirst). Any two publishes of one key whose
// transactions began less than a slot apart share a slot, so that one of
// them finds the other's row in that slot's unique index: committed, it
// stores nothing; in progress, it waits for it to end, as PostgreSQL does
// for a unique index, and then stores nothing (the other committed) or
// stores (it rolled back). No advisory lock, no read of older slots; the
// rows of one statement are written in the order (slot, class, topic,
// key), so that two statements wait for each other in one direction only.
//
// A class's rows are written only once its retention row's keys_since is
// set: the maintainer sets it once the partitions are attached and no
// transaction that had the keys table open before still runs (one would
// route a row for them to none, as for the messages' partitions: see
// settle.go). Until then the topic's keys take class 0's rows; for two
// days after it, both (four rows per key), so that a key stored in day
// rows before (by this release before the partitions were there, or by a
// release before schema version 21, during a rolling upgrade too) is
// recognised for at least its day. A publisher never meets a missing
// partition, whether the maintainer runs or not.
//
// The maintainer forgets a class's slot by truncating its partition once
// it is two slots old (no publisher writes it any more, and its gen comes
// back only two slots later): rows live two to three slots, and a key is
// recognised for at least a slot, which is at least the window. No row is
// deleted, nothing is left to vacuum.

// KeySlotSeconds is the width of a slot of key class 0, the class of the
// topics without a retention longer than a day: the window within which
// their keys are recognised.
const KeySlotSeconds = 86400

// KeyClassMin and KeyClassMax bound the key classes of topics with a
// retention longer than a day: their retention classes (a day is in
// class 18; the longest retention, ten years, in class 30), clamped to
// these bounds.
const (
	KeyClassMin = 18
	KeyClassMax = 30
)

// KeyClassSeconds is the width of a slot of key class k.
func KeyClassSeconds(k int) int64 {
	if k == 0 {
		return KeySlotSeconds
	}
	return int64(1) << (k - 1)
}

// keysGenerations is the number of partitions of the keys table per key
// class.
const keysGenerations = 4

// keyGens are the gens of the keys table's partitions: class 0's and
// those of the classes of schema version 21.
func keyGens() []int {
	gens := []int{0, 1, 2, 3}
	for k := KeyClassMin; k <= KeyClassMax; k++ {
		for g := range keysGenerations {
			gens = append(gens, keysGenerations*k+g)
		}
	}
	return gens
}

// fnForgetKeys is the suffix of the name of the owner's function that
// empties the partitions of the keys two slots old.
const fnForgetKeys = "forget_keys"

// keysPartitionSuffix is the suffix of the name of partition gen of the
// keys table.
func keysPartitionSuffix(gen int) string { return "keys_" + strconv.Itoa(gen) }

// keysPartition returns the quoted, qualified name of partition gen of
// the keys table.
func (t *Tables) keysPartition(gen int) string { return t.partition(keysPartitionSuffix(gen)) }

// fnAddKeys is the suffix of the name of the owner's function that makes
// the partitions of a key class (schema version 21).
const fnAddKeys = "add_key_partitions"

// keysPlaceholders are the placeholders of migration 21: the quoted bare
// names of every partition by gen + 1 (NULL for no partition), the
// classes' bounds and the name of the function that makes a class's
// partitions.
func (t *Tables) keysPlaceholders(values map[string]string) {
	names := make([]string, keysGenerations*(KeyClassMax+1))
	for i := range names {
		names[i] = "NULL"
	}
	for _, g := range keyGens() {
		names[g] = quoteLiteral(pgx.Identifier{t.partitionName(keysPartitionSuffix(g))}.Sanitize())
	}
	values["keys_partition_names"] = "ARRAY[" + strings.Join(names, ", ") + "]::text[]"
	values["keys_class_min"] = strconv.Itoa(KeyClassMin)
	values["keys_class_max"] = strconv.Itoa(KeyClassMax)
	values["fn_add_keys_literal"] = quoteLiteral(t.partitionName(fnAddKeys))
	// The keys table's name alone, quoted: the owner's functions qualify
	// it with the messages table's schema (their search_path is
	// pg_catalog's).
	values["keys_name_quoted"] = quoteLiteral(pgx.Identifier{t.partitionName("keys")}.Sanitize())
}

// keyed reports whether a message of p has an idempotency key.
func keyed(p InsertMessagesParams) bool {
	for _, k := range p.Keys {
		if k != "" {
			return true
		}
	}
	return false
}

// keysOf is p.Keys with one element per message ("" for none).
func keysOf(p InsertMessagesParams) []string {
	if len(p.Keys) == len(p.UUIDs) {
		return p.Keys
	}
	out := make([]string, len(p.UUIDs))
	copy(out, p.Keys)
	return out
}

// keysWritten is the part of a keyed statement that writes the keys: the
// common table expressions f (the first message of each distinct (topic,
// key) among m, the messages), c (those with their topic's key class, 0
// until the class's keys_since is set, and whether the day rows are
// written too: for two days after it), k (the rows written) and fresh
// (the ordinals n of the messages whose keys were new in every row). m
// has the columns topic, key (uuid, NULL without) and n. Strict, the
// insert has no ON CONFLICT clause: a key stored already fails the
// statement (unique_violation) instead of being left out (see
// strictFirst).
func (t *Tables) keysWritten(strict bool) string {
	return t.keysWrittenFrom(strict, `SELECT f.topic, f.key, f.n, `+keyClassColumns("kt.c", "kl")+`
	FROM f LEFT JOIN (SELECT tp.topic, `+keyClassOf("tp")+` AS c FROM `+t.Topics+` tp
		WHERE `+keyWindowOf("tp")+` > interval '1 day') kt ON kt.topic = f.topic
	LEFT JOIN `+t.Retention+` kl ON kl.retention_class = kt.c`)
}

// keyClassColumns are the columns class and by_day of the common table
// expression c of keysWritten, from c, the key class of the topic's key
// window when it is longer than a day (NULL otherwise), and the retention
// row kl of that class (NULL without one).
func keyClassColumns(c, kl string) string {
	return `CASE WHEN ` + kl + `.keys_since IS NOT NULL THEN LEAST(` + c + `, ` + strconv.Itoa(KeyClassMax) + `) ELSE 0 END AS class,
		` + kl + `.keys_since > pg_catalog.now() - interval '2 days' IS TRUE AS by_day`
}

// keysWrittenFrom is keysWritten with c's query given: the columns topic,
// key and n of f's rows, with their class and by_day (keyClassColumns).
func (t *Tables) keysWrittenFrom(strict bool, classes string) string {
	return `s AS (` + keysClock + `),
f AS (SELECT DISTINCT ON (m.topic, m.key) m.topic, m.key, m.n FROM m WHERE m.key IS NOT NULL ORDER BY m.topic, m.key, m.n),
c AS (` + classes + `),
k AS (` + t.keysInsert(strict, "c", "s") + `),
fresh AS (` + keysFresh + `)`
}

// keysClock is the query of the clock of the keys' slots: one row, at,
// the seconds of the transaction's start (pg_catalog.now()).
const keysClock = `SELECT extract(epoch FROM pg_catalog.now()) AS at`

// keysInsert is the insert of keysWritten's rows (k), reading the rows of
// c from the FROM item c and the clock from the FROM item s (names of
// common table expressions, or sub-queries with those aliases); it
// returns the topic and key of each row written.
func (t *Tables) keysInsert(strict bool, c, s string) string {
	conflict := `
	ON CONFLICT DO NOTHING`
	if strict {
		conflict = ""
	}
	return `
	INSERT INTO ` + t.Keys + ` (topic, key, slot, gen)
	SELECT w.topic, w.key, w.slot, (` + strconv.Itoa(keysGenerations) + ` * w.class + w.slot % ` + strconv.Itoa(keysGenerations) + `)::smallint
	FROM (SELECT z.topic, z.key, z.class,
			pg_catalog.floor(s.at / CASE WHEN z.class = 0 THEN ` + strconv.Itoa(KeySlotSeconds) + `::bigint ELSE 1::bigint << (z.class - 1) END)::bigint - x.back AS slot
		FROM (SELECT c.topic, c.key, CASE WHEN y.day THEN 0 ELSE c.class END AS class
			FROM ` + c + ` CROSS JOIN (VALUES (false), (true)) y(day) WHERE NOT y.day OR c.by_day) z
		CROSS JOIN ` + s + ` CROSS JOIN (VALUES (0), (1)) x(back)) w
	ORDER BY w.slot, w.class, w.topic, w.key` + conflict + `
	RETURNING topic, key
`
}

// keysFresh is the query of keysWritten's fresh: the ordinals n of the
// rows of c whose key k wrote in every row.
const keysFresh = `SELECT c.n FROM c JOIN (SELECT k.topic, k.key, pg_catalog.count(*) AS written FROM k GROUP BY k.topic, k.key) w
	ON w.topic = c.topic AND w.key = c.key
	WHERE w.written = CASE WHEN c.by_day THEN 4 ELSE 2 END`

// The schema versions that changed what a topic's keys are recognised
// for, which the Inspector's topic rows read as the schema has them.
const (
	// KeysVersion added idempotency keys, kept for a day.
	KeysVersion = 15
	// KeyClassesVersion added the key classes: a topic with a retention
	// longer than a day recognises its keys for its retention, once the
	// maintainer has made its class's partitions (the retention table's
	// keys_since).
	KeyClassesVersion = 21
	// KeyWindowVersion added the topics' key_window and key_class
	// (TopicConfig.KeyWindow).
	KeyWindowVersion = 22
)

// topicKeyColumns are the columns of a topics row t that tell how long
// its keys are recognised, on a schema of version schema: its key_window
// in microseconds (0 when not set, or before KeyWindowVersion) and
// whether the partitions of its key class may be used (the retention row
// kl of keyClassOf(t) has keys_since; false before KeyClassesVersion),
// and the join of kl. Columns a schema lacks are constants, so that the
// statement runs on the schemas of earlier releases.
func (t *Tables) topicKeyColumns(schema int, tp string) (columns, join string) {
	switch {
	case schema >= KeyWindowVersion:
		return `COALESCE(pg_catalog.floor(extract(epoch FROM ` + tp + `.key_window) * 1000000::numeric)::bigint, 0), kl.keys_since IS NOT NULL`,
			`
LEFT JOIN ` + t.Retention + ` kl ON kl.retention_class = ` + keyClassOf(tp)
	case schema >= KeyClassesVersion:
		return `0::bigint, kl.keys_since IS NOT NULL`, `
LEFT JOIN ` + t.Retention + ` kl ON kl.retention_class = ` + tp + `.retention_class`
	default:
		return `0::bigint, false`, ""
	}
}

// keyWindowOf is the key window of the topics row tp: the longer of its
// retention and its key_window (schema version 22; NULL when neither is
// set).
func keyWindowOf(tp string) string {
	return `GREATEST(` + tp + `.retention, ` + tp + `.key_window)`
}

// keyClassOf is the retention class of the key window of the topics row
// tp (keyWindowOf): the class of the longer of the two is the higher
// class.
func keyClassOf(tp string) string {
	return `GREATEST(` + tp + `.retention_class, ` + tp + `.key_class)`
}

// keptOut is the common table expression o of a keyed statement: each
// message of m with left_out, true when it has a key and is not the first
// of its key whose key was new (a join, not a correlated sub-select,
// which Citus refuses beside common table expressions).
const keptOut = `o AS (SELECT m.*, m.key IS NOT NULL AND fresh.n IS NULL AS left_out FROM m LEFT JOIN fresh ON fresh.n = m.n)`

// insertKeyed is the statement of [InsertMessages] when a message has an
// idempotency key: it stores the messages whose keys were not stored yet
// (and those without a key), and returns the ordinals (1-based) of those
// it left out. Notifications go out for the (topic, partition) pairs it
// wrote.
//
// It is one statement for both drivers, so that the statements a
// TxHandler queues (InsertKeyed) run on Citus too: the retention row is
// joined to the topics row (placementJoined) rather than read by a
// correlated sub-select, and pg_notify's result is cast to text (asCitus),
// both of which Citus needs and a single server does not mind. On Citus
// it opens a transaction on every worker, whatever the topics (see
// citusInsertKeyed, what the Citus driver runs instead where it can).
// Strict, see keysWritten; register, see insertKeyedPlaced.
func (t *Tables) insertKeyed(p InsertMessagesParams, strict bool, register registering) Stmt {
	return asCitus(t.insertKeyedPlaced(p, `LEFT JOIN `+t.Retention+` l ON l.retention_class = tp.retention_class
	CROSS JOIN LATERAL (`+placementJoined("tp", "l")+`) r`, strict, register))
}

// insertKeyedPlaced is insertKeyed, placed what follows the join of the
// topics row tp: it gives the placement row r (see insertManyTopics).
// register (a single node since schema version 18) registers the
// partitions of every message of the call before the rows take their
// positions, as insertMessages does (the messages left out too: a
// registration only holds their partitions back until the transaction
// ends), and the rows write needs_registration NULL.
func (t *Tables) insertKeyedPlaced(p InsertMessagesParams, placed string, strict bool, register registering) Stmt {
	r, reg := registers(register, "\n\tCROSS JOIN reg"), ""
	if register != noRegistration {
		reg = "\n" + t.registerTopics(register, "m") + ","
	}
	hashes := hashesOf(p)
	notify := ""
	if p.NotifyChannel != "" {
		// The partitions written, computed as the insert does (the
		// topics row read by the same snapshot) rather than returned by
		// it: RETURNING would need SELECT on the messages table, which a
		// publisher's role does not have.
		notify = `
UNION ALL
SELECT NULL FROM (SELECT pg_catalog.pg_notify($7, ` + messagesPayload("w.partition", "w.topic") + `) AS v
	FROM (SELECT DISTINCT m.topic, ` + fmt.Sprintf(partitionOf, "COALESCE(tp.partitions, 1)") + ` AS partition
		FROM o m LEFT JOIN ` + t.Topics + ` tp ON tp.topic = m.topic
		WHERE NOT m.left_out) w) x`
	}
	args := []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, hashes, keysOf(p)}
	if p.NotifyChannel != "" {
		args = append(args, p.NotifyChannel)
	}
	return Stmt{
		SQL: `WITH m AS (
	SELECT m.topic, m.uuid, m.payload, m.metadata, m.hash, NULLIF(m.k, '')::uuid AS key, m.n
	FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[], $6::text[]) WITH ORDINALITY AS m(topic, uuid, payload, metadata, hash, k, n)
),
` + t.keysWritten(strict) + `,
` + keptOut + `,` + reg + `
inserted AS (
	INSERT INTO ` + t.Messages + ` (topic, partition, uuid, payload, metadata, retention_class, expires_at` + r.column + `)
	SELECT m.topic, ` + fmt.Sprintf(partitionOf, "COALESCE(tp.partitions, 1)") + `, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb,
		` + t.placement("tp", "r") + r.value + `
	FROM o m
	LEFT JOIN ` + t.Topics + ` tp ON tp.topic = m.topic
	` + placed + r.join + `
	WHERE NOT m.left_out
	ORDER BY m.n
)
SELECT o.n FROM o WHERE o.left_out` + notify,
		Args: args,
	}
}

// insertDelayedKeyed is the statement of [InsertDelayed] when a message
// has an idempotency key; it returns the ordinals of the messages it left
// out, as insertKeyed. Strict, see keysWritten.
func (t *Tables) insertDelayedKeyed(p InsertMessagesParams, strict bool) Stmt {
	return asCitus(Stmt{
		SQL: `WITH m AS (
	SELECT m.topic, m.uuid, m.payload, m.metadata, m.hash, m.due, NULLIF(m.k, '')::uuid AS key, m.n
	FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[], $6::timestamptz[], $7::text[])
		WITH ORDINALITY AS m(topic, uuid, payload, metadata, hash, due, k, n)
),
` + t.keysWritten(strict) + `,
` + keptOut + `,
ins AS (
	INSERT INTO ` + t.Delayed + ` (due_at, topic, partition_hash, uuid, payload, metadata)
	SELECT m.due, m.topic, m.hash, m.uuid, m.payload, NULLIF(m.metadata, '')::jsonb
	FROM o m
	WHERE NOT m.left_out
	ORDER BY m.n
	RETURNING due_at
)
SELECT o.n FROM o WHERE o.left_out
UNION ALL
SELECT NULL FROM (SELECT pg_catalog.pg_notify($8, ` + kind(NotifyDelayed) + ` || (pg_catalog.floor(extract(epoch FROM x.due) * 1000::numeric)::bigint)::text) AS v
	FROM (SELECT pg_catalog.min(due_at) AS due FROM ins) x
	WHERE $8 <> '' AND x.due IS NOT NULL) y`,
		Args: []any{p.Topics, p.UUIDs, p.Payloads, p.Metadata, delayedHashesOf(p), p.DueAt, keysOf(p), p.NotifyChannel},
	})
}

// delayedHashesOf is p.PartitionHashes as InsertDelayed sends them: nil
// (NULL, placed by the UUID when moved) without keys.
func delayedHashesOf(p InsertMessagesParams) []int32 { return hashesOf(p) }

// InsertKeyed is the statement of [InsertKeyed] for either driver (what
// a TxHandler queues): that of InsertMessages without keys, insertKeyed's
// with. Without keys it is the statement that does not register its
// partitions itself (the position trigger tests its rows one by one), so
// that it runs on a distributed table too.
func (t *Tables) InsertKeyed(p InsertMessagesParams) Stmt {
	if keyed(p) {
		return t.insertKeyed(p, false, noRegistration)
	}
	return t.insertMessages(p, noRegistration)
}

// InsertDelayedKeyed is the statement of [InsertDelayedKeyed] on a
// single node: that of InsertDelayed without keys.
func (t *Tables) InsertDelayedKeyed(p InsertMessagesParams) Stmt {
	if keyed(p) {
		return t.insertDelayedKeyed(p, false)
	}
	return t.InsertDelayed(p)
}

// ForgetKeys is the statement of [ForgetKeys].
func (t *Tables) ForgetKeys() Stmt {
	return Stmt{SQL: `SELECT ` + t.function(fnForgetKeys) + `()`}
}

// strictFirst runs the keyed insert stmt(strict) on q and returns the
// 0-based indexes of the messages it left out. When q runs the statement
// in a transaction of its own (ownTransaction), the strict statement runs
// first: a key stored already fails it (unique_violation, after waiting
// for a writer of the key still in progress, as the tolerant one waits),
// which rolls back nothing but the statement, and the tolerant statement
// (ON CONFLICT DO NOTHING) runs then, and leaves those keys' messages out.
// A publish whose keys are new, all of them but a retried one's, so skips
// the speculative insertion of ON CONFLICT: measured, a fifth of the
// keyed statement's time (docs/decisions/0009-idempotency-keys.md).
// Anywhere else (a pgx.Tx, a connection inside a transaction) a failed
// statement would abort the caller's transaction: the tolerant statement
// runs alone.
func strictFirst(ctx context.Context, q Querier, stmt func(strict bool) Stmt) ([]int, error) {
	if ownTransaction(q) {
		out, err := skipped(ctx, q, stmt(true))
		if !isUniqueViolation(err) {
			return out, err
		}
	}
	return skipped(ctx, q, stmt(false))
}

// isUniqueViolation reports whether err is PostgreSQL's unique_violation:
// the strict keys' insert found a key stored already.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// ownTransaction reports whether a statement run on q is a transaction of
// its own: q is a pool, or a connection outside a transaction block. It
// does not know other Queriers (pgx.Tx, wrappers) and says false.
func ownTransaction(q Querier) bool {
	switch c := q.(type) {
	case *pgxpool.Pool:
		return true
	case *pgx.Conn:
		return c.PgConn().TxStatus() == 'I'
	}
	return false
}

// skipped runs s, a keyed insert, and returns the 0-based indexes of the
// messages it left out.
func skipped(ctx context.Context, q Querier, s Stmt) ([]int, error) {
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var n *int64
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		if n != nil {
			out = append(out, int(*n)-1)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// ForgetKeys empties, per key class, the partition of the keys table
// whose slot is two slots old, through the owner's function, and returns
// how many it emptied (those empty already are left alone).
func (d singleNode) ForgetKeys(ctx context.Context, q Querier) (int, error) {
	var n int32
	err := q.QueryRow(ctx, d.t.ForgetKeys().SQL).Scan(&n)
	return int(n), err
}

// KeyLanes is the statement of [Driver.KeyLanes].
func (t *Tables) KeyLanes() Stmt {
	return Stmt{SQL: `SELECT l.retention_class, l.keys_since IS NOT NULL
FROM ` + t.Retention + ` l
WHERE l.retention_class BETWEEN ` + strconv.Itoa(KeyClassMin) + ` AND ` + strconv.Itoa(KeyClassMax) + `
	AND EXISTS (SELECT 1 FROM ` + t.Topics + ` tp WHERE ` + keyClassOf("tp") + ` = l.retention_class AND ` + keyWindowOf("tp") + ` > interval '1 day')
ORDER BY 1`}
}

// KeyLane is a retention class whose topics keep their keys in its
// key class: whether its partitions may be used already.
type KeyLane struct {
	Class int16
	Ready bool
}

// KeyLanes returns the retention classes of key classes, those of the
// topics whose retention is longer than a day.
func (d singleNode) KeyLanes(ctx context.Context, q Querier) ([]KeyLane, error) {
	return collect(ctx, q, d.t.KeyLanes(), pgx.RowToStructByPos[KeyLane])
}

// AddKeyPartitions is the statement of [Driver.AddKeyPartitions].
func (t *Tables) AddKeyPartitions(class int) Stmt {
	return Stmt{SQL: `SELECT ` + t.function(fnAddKeys) + `($1::integer)`, Args: []any{int32(class)}}
}

// AddKeyPartitions makes the partitions of key class through the owner's
// function, and reports whether it made any.
func (d singleNode) AddKeyPartitions(ctx context.Context, q Querier, class int) (bool, error) {
	return queryBool(ctx, q, d.t.AddKeyPartitions(class))
}

// keysLockHolders is the statement of [Driver.KeysLockHolders].
func (t *Tables) keysLockHolders() Stmt {
	s := t.messagesLockHolders()
	s.Args = []any{t.Keys}
	return s
}

// KeysLockHolders returns the virtual transaction ids of the other
// transactions that hold a lock on the keys table, read after a class's
// partitions were attached.
func (d singleNode) KeysLockHolders(ctx context.Context, q Querier) ([]string, error) {
	s := d.t.keysLockHolders()
	var vxids []string
	err := q.QueryRow(ctx, s.SQL, s.Args...).Scan(&vxids)
	return vxids, err
}

// SetKeysSince is the statement of [Driver.SetKeysSince].
func (t *Tables) SetKeysSince(class int) Stmt {
	return Stmt{SQL: `UPDATE ` + t.Retention + ` SET keys_since = pg_catalog.now()
WHERE retention_class = $1 AND keys_since IS NULL`, Args: []any{int16(class)}}
}

// SetKeysSince lets the publishers of class's topics write their keys in
// its partitions, from now on, and reports whether it was not so already.
func (d singleNode) SetKeysSince(ctx context.Context, q Querier, class int) (bool, error) {
	n, err := exec(ctx, q, d.t.SetKeysSince(class))
	return n > 0, err
}
