package pglease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// TestIdlePollProbesTheIndex: the idle poll of a Subscriber (VisibleTopics)
// costs a few index blocks per idle topic, not a read of the whole
// messages table: with 100,000 messages it reads far fewer blocks than the
// table has. (Written as EXISTS, it was planned as a hash semi-join over a
// sequential scan of the table.)
func TestIdlePollProbesTheIndex(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	pool := newPool(t, 4)
	adapter := newSchema(t, pool)
	pub := newPublisher(t, pool, adapter)
	const topics, perTopic, idle = 100, 1000, 25
	for i := range topics {
		msgs := make([]*message.Message, perTopic)
		for j := range msgs {
			msgs[j] = message.NewMessage(watermill.NewUUID(), []byte(`{"pad":"................................................"}`))
		}
		require.NoError(t, pub.Publish(fmt.Sprintf("idle-%03d", i), msgs...))
	}
	messages := table(adapter, pglease.DefaultMessagesTable)
	_, err := pool.Exec(ctx, `ANALYZE `+messages)
	require.NoError(t, err)
	var pages int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(relpages)::bigint FROM pg_class
		WHERE oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`, messages).Scan(&pages))

	// Every idle topic at its end: nothing visible after the position.
	p := pgsql.VisibleTopicsParams{}
	for i := range idle {
		topic := fmt.Sprintf("idle-%03d", i)
		var pos pgsql.Position
		var tx string
		require.NoError(t, pool.QueryRow(ctx, `SELECT transaction_id::text, "offset" FROM `+messages+`
			WHERE topic = $1 ORDER BY transaction_id DESC, "offset" DESC LIMIT 1`, topic).Scan(&tx, &pos.Offset))
		_, err := fmt.Sscan(tx, &pos.TransactionID)
		require.NoError(t, err)
		p.Topics = append(p.Topics, topic)
		p.Positions = append(p.Positions, pos)
	}
	q := tablesOf(adapter).VisibleTopics(p)
	var plan []struct {
		Plan struct {
			SharedHit  int64 `json:"Shared Hit Blocks"`
			SharedRead int64 `json:"Shared Read Blocks"`
		}
	}
	var out []byte
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q.SQL, q.Args...).Scan(&out))
	require.NoError(t, json.Unmarshal(out, &plan))
	blocks := plan[0].Plan.SharedHit + plan[0].Plan.SharedRead
	t.Logf("idle poll of %d topics: %d blocks read; the messages table has %d pages", idle, blocks, pages)
	require.Greater(t, pages, int64(1000))
	require.Less(t, blocks, int64(8*idle), "blocks read by one idle poll")
}
