package admin_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// BenchmarkTopicMessages times what the pglease_topic_messages gauge costs
// a scrape: Inspector.TopicMessages on PGLEASE_BENCH_TOPICS topics
// (default 100,000) of 3 messages each, plus one topic of 50,000 (over
// the exact-count bound, so estimated), and a page of the message browser
// on that big topic, from the newest message and from deep inside it.
//
//	go run ./internal/cmd/localpg run -- go test -run '^$' -bench TopicMessages -benchtime 5x .
func BenchmarkTopicMessages(b *testing.B) {
	topics := benchTopics(b)
	const perTopic, big = 3, 50_000
	ctx := context.Background()
	pool, adapter := testkit.BenchSetup(b, "setup")
	msgs := testkit.Table(adapter, pglease.DefaultMessagesTable)
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload)
SELECT 'topic-' || lpad(t::text, 6, '0'), t || '-' || k, '\x00'::bytea
FROM generate_series(1, %d) t, generate_series(1, %d) k`, msgs, topics, perTopic),
		fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload)
SELECT 'big', 'big-' || k, '\x00'::bytea FROM generate_series(1, %d) k`, msgs, big),
		`VACUUM ANALYZE ` + msgs,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(b, err)
	}
	insp, err := admin.NewInspector(pool, adapter)
	require.NoError(b, err)

	b.Run("Gauge", func(b *testing.B) {
		for range b.N {
			counts, err := insp.TopicMessages(ctx, admin.TopicMessagesParams{})
			require.NoError(b, err)
			require.Len(b, counts, topics+1)
			require.True(b, counts[0].Estimated, "the big topic is estimated")
			require.Greater(b, counts[0].Messages, int64(admin.DefaultExactCountUpTo))
		}
	})
	b.Run("GaugeOneTopic", func(b *testing.B) {
		for range b.N {
			counts, err := insp.TopicMessages(ctx, admin.TopicMessagesParams{Topics: []string{"topic-000042"}})
			require.NoError(b, err)
			require.Equal(b, []admin.TopicMessageCount{{Topic: "topic-000042", Messages: perTopic}}, counts)
		}
	})
	page, err := insp.Messages(ctx, admin.MessagesParams{Topic: "big", Limit: admin.MaxMessagesLimit})
	require.NoError(b, err)
	for range 20 {
		page, err = insp.Messages(ctx, admin.MessagesParams{Topic: "big", From: page.Next, Limit: admin.MaxMessagesLimit})
		require.NoError(b, err)
	}
	deep := page.Next
	b.Run("PageNewest", func(b *testing.B) {
		for range b.N {
			p, err := insp.Messages(ctx, admin.MessagesParams{Topic: "big", Limit: 50})
			require.NoError(b, err)
			require.Len(b, p.Messages, 50)
		}
	})
	b.Run("PageDeep", func(b *testing.B) {
		for range b.N {
			p, err := insp.Messages(ctx, admin.MessagesParams{Topic: "big", From: deep, Limit: 50})
			require.NoError(b, err)
			require.Len(b, p.Messages, 50)
		}
	})
}
