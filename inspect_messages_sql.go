package pglease

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// The statements of the message browser, replay and the console's writes:
// one function per statement, each taking a querier and returning typed
// rows. They are not part of the SchemaAdapter interfaces (the browser
// needs only the table names of a *pgsql.Tables).

// maxXID8 is the highest xid8: a position after every message.
const maxXID8 = "18446744073709551615"

// messageRow is one stored message as the browser's statements return it.
type messageRow struct {
	Partition     int32
	TransactionID string
	Offset        int64
	UUID          string
	Payload       []byte
	PayloadSize   int64
	Metadata      []byte
	CreatedAt     time.Time
	ExpiresAt     time.Time
}

// storedMessage converts a row; the payload was cut at preview bytes
// (negative: not cut).
func (r messageRow) storedMessage(topic string) (StoredMessage, error) {
	tx, err := parseXID8(r.TransactionID)
	if err != nil {
		return StoredMessage{}, err
	}
	m := StoredMessage{
		Topic: topic, Partition: r.Partition, Position: Position{TransactionID: tx, Offset: r.Offset},
		UUID: r.UUID, Payload: r.Payload, PayloadSize: int(r.PayloadSize), CreatedAt: r.CreatedAt,
		Metadata: map[string]string{},
	}
	m.PayloadTruncated = len(m.Payload) < m.PayloadSize
	if !r.ExpiresAt.IsZero() && r.ExpiresAt.Year() < 9999 {
		e := r.ExpiresAt
		m.ExpiresAt = &e
	}
	if len(r.Metadata) > 0 {
		if err := json.Unmarshal(r.Metadata, &m.Metadata); err != nil {
			return StoredMessage{}, err
		}
	}
	return m, nil
}

// messageColumns are the columns of messageRow, of the messages table m;
// the payload is cut at $preview bytes.
func messageColumns(preview string) string {
	return `m.partition, m.transaction_id::text, m."offset", m.uuid,
	CASE WHEN ` + preview + ` < 0 THEN m.payload ELSE substring(m.payload FROM 1 FOR ` + preview + `) END,
	COALESCE(octet_length(m.payload), 0)::bigint, m.metadata, m.created_at,
	CASE WHEN m.expires_at = 'infinity' THEN NULL ELSE m.expires_at END`
}

func scanMessageRow(row pgx.CollectableRow) (messageRow, error) {
	var r messageRow
	var expires *time.Time
	err := row.Scan(&r.Partition, &r.TransactionID, &r.Offset, &r.UUID, &r.Payload, &r.PayloadSize, &r.Metadata,
		&r.CreatedAt, &expires)
	if expires != nil {
		r.ExpiresAt = *expires
	}
	return r, err
}

// selectMessagesNewestFirst returns up to limit messages of topic (of one
// partition, or of all with partition -1) at or before the position
// (tx, off), newest first. Per partition it reads the primary key
// backwards from the position; the partitions are merged by position.
func selectMessagesNewestFirst(ctx context.Context, q querier, a *pgsql.Tables, topic string, partition int32,
	tx string, off int64, limit, preview int) ([]messageRow, error) {
	rows, err := q.Query(ctx, `SELECT l.* FROM generate_series(0,
		GREATEST(COALESCE((SELECT t.partitions FROM `+a.Topics+` t WHERE t.topic = $1), 1),
			$2::integer + 1) - 1) AS p(partition),
	LATERAL (
		SELECT `+messageColumns("$6::integer")+`
		FROM `+a.Messages+` m
		WHERE m.topic = $1 AND m.partition = p.partition AND `+a.ClassesOf("$1")+`
			AND (m.transaction_id, m."offset") <= ($3::text::xid8, $4::bigint)
		ORDER BY m.transaction_id DESC, m."offset" DESC
		LIMIT $5
	) l
WHERE $2 < 0 OR p.partition = $2
ORDER BY l.transaction_id::xid8 DESC, l."offset" DESC
LIMIT $5`, topic, partition, tx, off, limit, preview)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanMessageRow)
}

// selectMessagesByUUID returns the messages with the UUID, of topic (all
// topics when topic is empty: a scan of the whole table), oldest first.
func selectMessagesByUUID(ctx context.Context, q querier, a *pgsql.Tables, topic, id string, preview int) ([]messageRow, []string, error) {
	rows, err := q.Query(ctx, `SELECT `+messageColumns("$3::integer")+`, m.topic
FROM `+a.Messages+` m
WHERE m.uuid = $2 AND ($1 = '' OR m.topic = $1)
ORDER BY m.transaction_id, m."offset"`, topic, id, preview)
	if err != nil {
		return nil, nil, err
	}
	var topics []string
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (messageRow, error) {
		var r messageRow
		var expires *time.Time
		var t string
		err := row.Scan(&r.Partition, &r.TransactionID, &r.Offset, &r.UUID, &r.Payload, &r.PayloadSize, &r.Metadata,
			&r.CreatedAt, &expires, &t)
		if expires != nil {
			r.ExpiresAt = *expires
		}
		topics = append(topics, t)
		return r, err
	})
	return out, topics, err
}

// deleteMessagesForReplay deletes up to limit messages of topic whose
// metadata contains filter (a JSON object; "{}" for all), oldest first,
// and returns them. With toOriginal only messages that name their
// original topic (Watermill's PoisonedTopicKey) are taken. The rows are
// locked first, so a replay running at the same time waits and then finds
// them gone: each message is taken by one replay.
func deleteMessagesForReplay(ctx context.Context, q querier, a *pgsql.Tables, topic string, filter []byte,
	toOriginal bool, limit int) ([]messageRow, error) {
	rows, err := q.Query(ctx, `WITH sel AS (
	SELECT m.tableoid, m.ctid FROM `+a.Messages+` m
	WHERE m.topic = $1 AND `+a.ClassesOf("$1")+` AND COALESCE(m.metadata, '{}') @> $2::text::jsonb
		AND (NOT $3 OR COALESCE(m.metadata->>`+pgsql.QuoteLiteral(poisonedTopicKey)+`, '') <> '')
	ORDER BY m.transaction_id, m."offset"
	LIMIT $4
	FOR UPDATE
), del AS (
	DELETE FROM `+a.Messages+` m USING sel
	WHERE m.tableoid = sel.tableoid AND m.ctid = sel.ctid
	RETURNING m.*
)
SELECT `+messageColumns("-1")+` FROM del m
ORDER BY m.transaction_id, m."offset"`, topic, string(filter), toOriginal, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanMessageRow)
}

// topicDetailRow is what selectTopicDetail reads of one topic.
type topicDetailRow struct {
	Partitions  int32
	RetentionUs int64
	Delayed     int64
	NextDueAt   *time.Time
}

// selectTopicDetail reads a topic's settings and its delayed messages (a
// scan of the delayed table, which holds only messages not yet due).
func selectTopicDetail(ctx context.Context, q querier, a *pgsql.Tables, topic string) (topicDetailRow, error) {
	rows, err := q.Query(ctx, `SELECT COALESCE(t.partitions, 1),
	COALESCE(floor(extract(epoch FROM t.retention) * 1000000)::bigint, 0),
	(SELECT count(*) FROM `+a.Delayed+` d WHERE d.topic = $1),
	(SELECT min(d.due_at) FROM `+a.Delayed+` d WHERE d.topic = $1)
FROM (SELECT 1) one LEFT JOIN `+a.Topics+` t ON t.topic = $1`, topic)
	if err != nil {
		return topicDetailRow{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[topicDetailRow])
}

// topicCountRow is one topic's stored messages, counted up to a cap.
type topicCountRow struct {
	Topic    string
	Messages int64
	Capped   bool
}

// countTopicMessages counts the stored messages of topics (nil: every
// topic that has some), reading at most capPerTopic+1 index entries per
// topic (an index-only scan of the primary key; every topic's name is
// found by skipping from one to the next).
func countTopicMessages(ctx context.Context, q querier, a *pgsql.Tables, topics []string, capPerTopic int64) ([]topicCountRow, error) {
	names := `WITH RECURSIVE mt AS (
	(SELECT topic FROM ` + a.Messages + ` ORDER BY topic LIMIT 1)
	UNION ALL
	SELECT (SELECT m.topic FROM ` + a.Messages + ` m WHERE m.topic > mt.topic ORDER BY m.topic LIMIT 1)
	FROM mt WHERE mt.topic IS NOT NULL
)`
	args := []any{capPerTopic}
	if topics != nil {
		names = `WITH mt AS (SELECT DISTINCT t COLLATE "C" AS topic FROM unnest($2::text[]) t)`
		args = append(args, topics)
	}
	rows, err := q.Query(ctx, names+`
SELECT mt.topic, least(c.n, $1), c.n > $1
FROM mt, LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM `+a.Messages+` m WHERE m.topic = mt.topic LIMIT $1 + 1) x) c
WHERE mt.topic IS NOT NULL
ORDER BY mt.topic`, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[topicCountRow])
}

// estimateTopicMessages returns the planner's estimate of the rows of
// topic, from the table's statistics; it plans a query and runs nothing.
func estimateTopicMessages(ctx context.Context, q querier, a *pgsql.Tables, topic string) (int64, error) {
	rows, err := q.Query(ctx, `EXPLAIN (FORMAT JSON) SELECT 1 FROM `+a.Messages+` m WHERE m.topic = $1::text`, topic)
	if err != nil {
		return 0, err
	}
	plan, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[[]byte])
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

// groupOffsetRow is one offsets row of a consumer group, locked, with its
// owner if alive.
type groupOffsetRow struct {
	Topic     string
	Partition int32
	LiveOwner *string
}

// lockGroupOffsets locks every offsets row of group and waits for
// concurrent claims and commits to end.
func lockGroupOffsets(ctx context.Context, q querier, a *pgsql.Tables, group string) ([]groupOffsetRow, error) {
	rows, err := q.Query(ctx, `SELECT o.topic, o.partition, NULL::text FROM `+a.Offsets+` o
WHERE o.consumer_group = $1 ORDER BY o.topic, o.partition FOR UPDATE`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[groupOffsetRow])
}

// selectGroupLiveOwners returns the rows of group owned by a live session.
// Run after lockGroupOffsets, in a statement of its own (a fresh snapshot,
// which sees every claim that committed before the lock was taken).
func selectGroupLiveOwners(ctx context.Context, q querier, a *pgsql.Tables, group string) ([]groupOffsetRow, error) {
	rows, err := q.Query(ctx, `SELECT o.topic, o.partition, s.owner FROM `+a.Offsets+` o
JOIN `+a.Sessions+` s ON s.id = o.session_id AND s.expires_at > now()
WHERE o.consumer_group = $1 ORDER BY o.topic, o.partition`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[groupOffsetRow])
}

// deleteGroupOffsets deletes the offsets rows of group.
func deleteGroupOffsets(ctx context.Context, q querier, a *pgsql.Tables, group string) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM `+a.Offsets+` WHERE consumer_group = $1`, group)
	return tag.RowsAffected(), err
}
