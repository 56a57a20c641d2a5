package pgsql

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of the message browser, replay and the console's writes
// (pglease's Inspector: Messages, MessagesByUUID, TopicDetail,
// TopicMessages, Replay, DeleteGroupOffsets). Each is built by an
// unexported method of Tables and run by the function of the same name.

// BrowseRow is one stored message as the browser's statements return it.
type BrowseRow struct {
	// Topic is set by [MessagesByUUID] only (the others read one topic).
	Topic       string
	Partition   int32
	Position    Position
	UUID        string
	Payload     []byte // cut at the statement's preview bytes
	PayloadSize int64  // before the cut
	Metadata    []byte // JSON, nil for NULL
	CreatedAt   time.Time
	ExpiresAt   *time.Time // nil: kept until acknowledged
}

// browseColumns are the columns of BrowseRow, of the messages table m;
// the payload is cut at preview bytes (an SQL expression; negative: not
// cut).
func browseColumns(preview string) string {
	return `m.partition, m.transaction_id::text, m."offset", m.uuid,
	CASE WHEN ` + preview + ` < 0 THEN m.payload ELSE substring(m.payload FROM 1 FOR ` + preview + `) END,
	COALESCE(pg_catalog.octet_length(m.payload), 0)::bigint, m.metadata, m.created_at,
	CASE WHEN m.expires_at = 'infinity' THEN NULL ELSE m.expires_at END`
}

// scanBrowse scans the columns of browseColumns, then extra.
func scanBrowse(row pgx.CollectableRow, extra ...any) (BrowseRow, error) {
	var r BrowseRow
	dest := append([]any{&r.Partition, (*xid8)(&r.Position.TransactionID), &r.Position.Offset, &r.UUID, &r.Payload, &r.PayloadSize, &r.Metadata,
		&r.CreatedAt, &r.ExpiresAt}, extra...)
	err := row.Scan(dest...)
	return r, err
}

func scanBrowseRow(row pgx.CollectableRow) (BrowseRow, error) { return scanBrowse(row) }

// BrowseParams are the arguments of [MessagesNewestFirst].
type BrowseParams struct {
	Topic     string
	Partition int32    // -1: every partition
	At        Position // the newest position returned
	Limit     int
	Preview   int // payload bytes returned; negative: all
}

func (t *Tables) messagesNewestFirst(p BrowseParams) Stmt {
	return Stmt{SQL: `SELECT l.* FROM pg_catalog.generate_series(0,
		GREATEST(COALESCE((SELECT t.partitions FROM ` + t.Topics + ` t WHERE t.topic = $1), 1),
			$2::integer + 1) - 1) AS p(partition),
	LATERAL (
		SELECT ` + browseColumns("$6::integer") + `
		FROM ` + t.Messages + ` m
		WHERE m.topic = $1 AND m.partition = p.partition AND ` + t.classesOf("$1") + `
			AND (m.transaction_id, m."offset") <= ($3::text::xid8, $4::bigint)
		ORDER BY m.transaction_id DESC, m."offset" DESC
		LIMIT $5
	) l
WHERE $2 < 0 OR p.partition = $2
ORDER BY l.transaction_id::xid8 DESC, l."offset" DESC
LIMIT $5`, Args: []any{p.Topic, p.Partition, formatXID8(p.At.TransactionID), p.At.Offset, p.Limit, p.Preview}}
}

// MessagesNewestFirst returns up to p.Limit messages of p.Topic (of one
// partition, or of all with partition -1) at or before p.At, newest
// first. Per partition it reads the primary key backwards from the
// position; the partitions are merged by position.
func (d singleNode) MessagesNewestFirst(ctx context.Context, q Querier, p BrowseParams) ([]BrowseRow, error) {
	return collect(ctx, q, d.t.messagesNewestFirst(p), scanBrowseRow)
}

func (t *Tables) messagesByUUID(topic, id string, preview, limit int) Stmt {
	return Stmt{SQL: `SELECT ` + browseColumns("$3::integer") + `, m.topic
FROM ` + t.Messages + ` m
WHERE m.uuid = $2 AND ($1 = '' OR m.topic = $1)
ORDER BY m.transaction_id DESC, m."offset" DESC
LIMIT NULLIF($4::bigint, -1)`, Args: []any{topic, id, preview, limit}}
}

// MessagesByUUID returns the messages with the UUID id, of topic (all
// topics when topic is empty: a scan of the whole table), newest first,
// with their topics: at most limit of them (-1: all). On Citus the
// messages of every topic are ordered by the time they were stored (see
// citusMessagesByUUID).
func (d singleNode) MessagesByUUID(ctx context.Context, q Querier, topic, id string, preview, limit int) ([]BrowseRow, error) {
	return messagesByUUID(ctx, q, d.t.messagesByUUID(topic, id, preview, limit))
}

// messagesByUUID runs s, a statement of [Driver.MessagesByUUID].
func messagesByUUID(ctx context.Context, q Querier, s Stmt) ([]BrowseRow, error) {
	return collect(ctx, q, s, func(row pgx.CollectableRow) (BrowseRow, error) {
		var topic string
		r, err := scanBrowse(row, &topic)
		r.Topic = topic
		return r, err
	})
}

// ReplayParams are the arguments of [DeleteMessagesForReplay].
type ReplayParams struct {
	Topic string
	// Filter is a JSON object the messages' metadata must contain ("{}"
	// for all).
	Filter []byte
	// ToOriginal takes only the messages whose metadata names their
	// original topic under one of OriginalTopicKeys.
	ToOriginal bool
	// OriginalTopicKeys are Watermill's PoisonedTopicKey and the failure
	// policy's DeadLetterSourceTopicMetadata: constants, built into the
	// statement's text (never values from users).
	OriginalTopicKeys []string
	Limit             int
}

// replayCondition is the condition on the messages m that replay takes
// ($1: the topic, $2: the filter, $3: ToOriginal).
func (t *Tables) replayCondition(p ReplayParams) string {
	original := ""
	for _, k := range p.OriginalTopicKeys {
		original += `NULLIF(m.metadata->>` + quoteLiteral(k) + `, ''), `
	}
	return `m.topic = $1 AND ` + t.classesOf("$1") + ` AND COALESCE(m.metadata, '{}') @> $2::text::jsonb
		AND (NOT $3 OR COALESCE(` + original + `'') <> '')`
}

func (t *Tables) deleteMessagesForReplay(p ReplayParams) Stmt {
	return Stmt{SQL: `WITH sel AS (
	SELECT m.tableoid, m.ctid FROM ` + t.Messages + ` m
	WHERE ` + t.replayCondition(p) + `
	ORDER BY m.transaction_id, m."offset"
	LIMIT $4
	FOR UPDATE
), del AS (
	DELETE FROM ` + t.Messages + ` m USING sel
	WHERE m.tableoid = sel.tableoid AND m.ctid = sel.ctid
	RETURNING m.*
)
SELECT ` + browseColumns("-1") + ` FROM del m
ORDER BY m.transaction_id, m."offset"`, Args: []any{p.Topic, string(p.Filter), p.ToOriginal, p.Limit}}
}

// DeleteMessagesForReplay deletes up to p.Limit messages of p.Topic whose
// metadata contains p.Filter, oldest first, and returns them, whole. The
// rows are locked first, so a replay running at the same time waits and
// then finds them gone: each message is taken by one replay. On Citus
// the statement is routed to the topic's worker whole and deletes the
// rows by primary key.
func (d singleNode) DeleteMessagesForReplay(ctx context.Context, q Querier, p ReplayParams) ([]BrowseRow, error) {
	return collect(ctx, q, d.t.deleteMessagesForReplay(p), scanBrowseRow)
}

// TopicDetailRow is the row of [TopicDetail].
type TopicDetailRow struct {
	Partitions  int32
	RetentionUs int64
	Delayed     int64
	NextDueAt   *time.Time
	// KeyWindowUs and KeyClassReady are TopicRow's: the topic's
	// key_window (0: not set, or a schema before KeyWindowVersion), and
	// whether publishers may use the partitions of its key class (false
	// before KeyClassesVersion).
	KeyWindowUs   int64
	KeyClassReady bool
}

// topicDetail is the statement of [TopicDetail] on a schema of version
// schema (the key window's columns as topicKeyColumns reads them, so that
// it runs on the schemas of earlier releases).
func (t *Tables) topicDetail(topic string, schema int) Stmt {
	keyColumns, keyJoin := t.topicKeyColumns(schema, "t")
	return Stmt{SQL: `SELECT COALESCE(t.partitions, 1),
	COALESCE(pg_catalog.floor(extract(epoch FROM t.retention) * 1000000::numeric)::bigint, 0),
	(SELECT pg_catalog.count(*) FROM ` + t.Delayed + ` d WHERE d.topic = $1),
	(SELECT pg_catalog.min(d.due_at) FROM ` + t.Delayed + ` d WHERE d.topic = $1),
	` + keyColumns + `
FROM (SELECT 1) one LEFT JOIN ` + t.Topics + ` t ON t.topic = $1` + keyJoin, Args: []any{topic}}
}

// TopicDetail reads a topic's settings, its key window among them, and
// its delayed messages (a scan of the delayed table, which holds only
// messages not yet due), on a schema of version schema (SchemaVersion).
func (d singleNode) TopicDetail(ctx context.Context, q Querier, topic string, schema int) (TopicDetailRow, error) {
	s := d.t.topicDetail(topic, schema)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return TopicDetailRow{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[TopicDetailRow])
}

// TopicCountRow is one topic of [CountTopicMessages]: its stored
// messages, counted up to a cap.
type TopicCountRow struct {
	Topic    string
	Messages int64
	Capped   bool // more than the cap: Messages is the cap
}

func (t *Tables) countTopicMessages(topics []string, capPerTopic int64) Stmt {
	names := `WITH RECURSIVE mt AS (
	(SELECT topic FROM ` + t.Messages + ` ORDER BY topic LIMIT 1)
	UNION ALL
	SELECT (SELECT m.topic FROM ` + t.Messages + ` m WHERE m.topic > mt.topic ORDER BY m.topic LIMIT 1)
	FROM mt WHERE mt.topic IS NOT NULL
)`
	args := []any{capPerTopic}
	if topics != nil {
		names = `WITH mt AS (SELECT DISTINCT t COLLATE "C" AS topic FROM pg_catalog.unnest($2::text[]) t)`
		args = append(args, topics)
	}
	return Stmt{SQL: names + `
SELECT mt.topic, least(c.n, $1), c.n > $1
FROM mt, LATERAL (SELECT pg_catalog.count(*) AS n FROM (SELECT 1 FROM ` + t.Messages + ` m WHERE m.topic = mt.topic LIMIT $1 + 1) x) c
WHERE mt.topic IS NOT NULL
ORDER BY mt.topic`, Args: args}
}

// CountTopicMessages counts the stored messages of topics (nil: every
// topic that has some), reading at most capPerTopic+1 index entries per
// topic (an index-only scan of the primary key; every topic's name is
// found by skipping from one to the next). On Citus the topics with
// messages are read on every shard, then each topic is counted by a
// statement routed to its worker.
func (d singleNode) CountTopicMessages(ctx context.Context, q Querier, topics []string, capPerTopic int64) ([]TopicCountRow, error) {
	return collect(ctx, q, d.t.countTopicMessages(topics, capPerTopic), pgx.RowToStructByPos[TopicCountRow])
}

func (t *Tables) estimateTopicMessages(topic string) Stmt {
	return Stmt{SQL: `EXPLAIN (FORMAT JSON) SELECT 1 FROM ` + t.Messages + ` m WHERE m.topic = $1::text`, Args: []any{topic}}
}

// EstimateTopicMessages returns the planner's estimate of the rows of
// topic, from the table's statistics; it plans a query and runs nothing.
// On Citus it is the estimate of the plan on the topic's worker, from the
// shard's statistics; 0 when the plan holds none.
func (d singleNode) EstimateTopicMessages(ctx context.Context, q Querier, topic string) (int64, error) {
	plan, err := explain(ctx, q, d.t.estimateTopicMessages(topic))
	if err != nil {
		return 0, err
	}
	var parsed []struct {
		Plan struct {
			Rows json.Number `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &parsed); err != nil || len(parsed) == 0 {
		return 0, err
	}
	f, err := strconv.ParseFloat(parsed[0].Plan.Rows.String(), 64)
	return int64(f), err
}

// explain runs s, an EXPLAIN (FORMAT JSON), and returns the plan.
func explain(ctx context.Context, q Querier, s Stmt) ([]byte, error) {
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[[]byte])
}

// GroupOffsetRow is one offsets row of a consumer group, with its owner
// if alive.
type GroupOffsetRow struct {
	Topic     string
	Partition int32
	LiveOwner *string
}

func (t *Tables) lockGroupOffsets(group string) Stmt {
	return Stmt{SQL: `SELECT o.topic, o.partition, NULL::text FROM ` + t.Offsets + ` o
WHERE o.consumer_group = $1 ORDER BY o.topic, o.partition FOR UPDATE`, Args: []any{group}}
}

// LockGroupOffsets locks every offsets row of group and waits for
// concurrent claims and commits to end (LiveOwner is nil: see
// [GroupLiveOwners]). On Citus the rows are locked topic by topic, each
// on its worker (see the Citus driver's LockGroupOffsets).
func (d singleNode) LockGroupOffsets(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error) {
	return collect(ctx, q, d.t.lockGroupOffsets(group), pgx.RowToStructByPos[GroupOffsetRow])
}

func (t *Tables) groupLiveOwners(group string) Stmt {
	return Stmt{SQL: `SELECT o.topic, o.partition, s.owner FROM ` + t.Offsets + ` o
JOIN ` + t.Sessions + ` s ON s.id = o.session_id AND s.expires_at > pg_catalog.now()
WHERE o.consumer_group = $1 ORDER BY o.topic, o.partition`, Args: []any{group}}
}

// GroupLiveOwners returns the rows of group owned by a live session, the
// rows [LockGroupOffsets] locked and any created since. Run it after
// [LockGroupOffsets], in a statement of its own (a fresh snapshot, which
// sees every claim that committed before the lock was taken).
func (d singleNode) GroupLiveOwners(ctx context.Context, q Querier, group string) ([]GroupOffsetRow, error) {
	return collect(ctx, q, d.t.groupLiveOwners(group), pgx.RowToStructByPos[GroupOffsetRow])
}

func (t *Tables) deleteGroupOffsets(group string, locked []GroupOffsetRow) Stmt {
	topics, partitions := make([]string, len(locked)), make([]int32, len(locked))
	for i, r := range locked {
		topics[i], partitions[i] = r.Topic, r.Partition
	}
	return Stmt{SQL: `WITH locked AS (
	SELECT k.topic, k.partition FROM unnest($2::text[], $3::integer[]) AS k(topic, partition)
),
others AS (
	SELECT o.topic, o.partition FROM ` + t.Offsets + ` o
	WHERE o.consumer_group = $1
		AND NOT EXISTS (SELECT 1 FROM locked k WHERE k.topic = o.topic AND k.partition = o.partition)
),
deleted AS (
	DELETE FROM ` + t.Offsets + ` o USING locked k
	WHERE o.consumer_group = $1 AND o.topic = k.topic AND o.partition = k.partition
		AND NOT EXISTS (SELECT 1 FROM others)
	RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM deleted),
	ARRAY(SELECT o.topic FROM others o ORDER BY o.topic, o.partition),
	ARRAY(SELECT o.partition FROM others o ORDER BY o.topic, o.partition)`, Args: []any{group, topics, partitions}}
}

// DeleteGroupOffsetsResult is the outcome of [DeleteGroupOffsets].
type DeleteGroupOffsetsResult struct {
	Deleted int64
	// Others are the rows of the group that were not locked (LiveOwner
	// nil): when there are any, nothing was deleted.
	Others []GroupOffsetRow
}

// DeleteGroupOffsets deletes the rows of group that [LockGroupOffsets]
// locked (locked, by key), unless the group has other rows, created
// since the lock was taken, on the statement's snapshot: then it deletes
// nothing and returns them. Rows that commit after that snapshot are
// left alone.
func (d singleNode) DeleteGroupOffsets(ctx context.Context, q Querier, group string, locked []GroupOffsetRow) (DeleteGroupOffsetsResult, error) {
	s := d.t.deleteGroupOffsets(group, locked)
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err != nil {
		return DeleteGroupOffsetsResult{}, err
	}
	return pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (DeleteGroupOffsetsResult, error) {
		var (
			r          DeleteGroupOffsetsResult
			topics     []string
			partitions []int32
		)
		if err := row.Scan(&r.Deleted, &topics, &partitions); err != nil {
			return r, err
		}
		for i := range topics {
			r.Others = append(r.Others, GroupOffsetRow{Topic: topics[i], Partition: partitions[i]})
		}
		return r, nil
	})
}
