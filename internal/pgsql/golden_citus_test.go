package pgsql

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestCitusStatementsAreUnchanged builds the statements whose text
// differs where the tables are distributed by Citus, for the default
// names and for names that need quoting, and compares them with
// testdata/statements_citus_*.txt. The others are the single-node
// statements, checked by TestStatementsAreUnchanged. It needs no
// database.
func TestCitusStatementsAreUnchanged(t *testing.T) {
	for name, n := range goldenNames() {
		checkGolden(t, name+": the Citus statements", filepath.Join("testdata", "statements_citus_"+name+".txt"), dumpCitusStatements(NewTables(n)))
	}
}

func goldenNames() map[string]Names {
	return map[string]Names{
		"default": {},
		"custom": {
			Schema:                `My "App"`,
			MessagesTable:         "messages_with_a_rather_long_name_that_needs_shortening_xyz",
			ConsumerSessionsTable: "Sessions",
			ConsumerOffsetsTable:  "offsets's",
			SchemaVersionTable:    "version",
			TopicsTable:           "topics",
			DelayedTable:          "delayed",
			MaintenanceTable:      "maint",
			RetentionTable:        "retention",
		},
	}
}

func dumpCitusStatements(t *Tables) string {
	a := NewCitus(t).(citus)
	var b strings.Builder
	q := func(name string, q Stmt) {
		fmt.Fprintf(&b, "== %s\n%s\n-- args: %v\n\n", name, q.SQL, q.Args)
	}
	s := func(name string, sql string) {
		fmt.Fprintf(&b, "== %s\n%s\n\n", name, sql)
	}
	id := uuid.MustParse("11111111-2222-3333-4444-555555555555")
	id2 := uuid.MustParse("66666666-2222-3333-4444-555555555555")
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	many := InsertMessagesParams{Topics: []string{"t", "u"}, UUIDs: []string{"u1", "u2"}, Payloads: [][]byte{[]byte("a"), nil},
		Metadata: []string{`{"a":"b"}`, ""}}
	q("InsertMessages many", a.insertMessagesStmt(many))
	many.NotifyChannel = "ch"
	many.PartitionHashes = []uint32{1, 4294967295}
	q("InsertMessages many notify hashes", a.insertMessagesStmt(many))
	routed := Routed{d: a}
	q("Routed topics", routed.topicsStmt([]string{"t", "u"}))
	q("Routed usable", routed.usableStmt([]int16{3, 5}))
	inf := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	in5 := pgtype.Timestamptz{Time: at, Valid: true}
	rs, _ := routed.insertValuesStmt(many, "t", []int{0, 1}, routedPlacement{partitions: 1, expires: inf})
	q("Routed insert, one partition", rs)
	rs, _ = routed.insertValuesStmt(many, "t", []int{0, 1}, routedPlacement{partitions: 3, class: 5, expires: in5})
	q("Routed insert, partition hashes", rs)
	many.PartitionHashes = nil
	rs, _ = routed.insertValuesStmt(many, "t", []int{1}, routedPlacement{partitions: 3, expires: inf})
	q("Routed insert, partitions by UUID", rs)
	many.PartitionHashes = []uint32{1, 4294967295}
	q("InspectSettings", citusInspectSettings())
	q("UpsertTopic", a.upsertTopicStmt(TopicParams{Topic: "t", Partitions: 3, Retention: time.Hour, RetentionClass: 5, NotifyChannel: "ch"}))
	q("SelectMessages", a.selectMessagesStmt(SelectMessagesParams{Topic: "t", Partition: 2, After: Position{TransactionID: 18446744073709551615, Offset: 9}, Limit: 100, Here: "h"}))
	q("SelectMessages max worker", a.selectMessagesStmt(SelectMessagesParams{Topic: "t", After: Position{TransactionID: 5, Offset: 9}, Limit: 100, MaxMessageBytes: 1000, Here: "h", WorkerHere: "w"}))
	q("SelectMessagesAt", a.selectMessagesAtStmt(SelectMessagesAtParams{Topic: "t", Partition: 2, Positions: []Position{{5, 9}, {7, 11}}, Here: "h"}))
	q("SelectMessagesAt worker", a.selectMessagesAtStmt(SelectMessagesAtParams{Topic: "t", Positions: []Position{{5, 9}}, Here: "h", WorkerHere: "w"}))
	sp := SessionParams{SessionID: id, NotifyChannel: "ch", SubscriptionHash: -5, SubscriptionSize: 3, ReplacesSessionID: id2,
		ConsumerGroup: "g", Owner: "host/1", TTL: 10 * time.Second}
	q("CreateSession", a.createSessionStmt(sp))
	q("DeleteSession", a.deleteSessionStmt(sp))
	q("SetSubscriptions", a.setSubscriptionsStmt(sp))
	q("MoveDueMessages", a.moveDueMessagesStmt(MoveDueParams{Limit: 100, NotifyChannel: "ch"}))
	q("DeleteIdleGroups", a.citusDeleteIdleGroups(time.Hour))
	rp := RetentionPartition{Class: 4, Start: time.Unix(1700000000, 0), End: time.Unix(1700000016, 0)}
	s("DetachRetentionPartition", a.citusDetachRetentionPartition(rp))
	s("DetachRetentionPartition finalize", a.citusDetachRetentionPartition(rp))

	q("citusCountTopic", a.citusCountTopic("t", 10000))
	q("citusMessagesByUUID", a.citusMessagesByUUID("u1", 1024, 20))
	q("citusDeleteMessagesForReplay", a.citusDeleteMessagesForReplay(ReplayParams{Topic: "t", Filter: []byte(`{"a":"b"}`), OriginalTopicKeys: []string{"topic_poisoned", "_pglease_dead_letter_source_topic"}, Limit: 100, ToOriginal: true}))
	q("citusGroupTopics", a.citusGroupTopics("g"))
	q("citusLockGroupTopic", a.citusLockGroupTopic("g", "t"))
	q("citusLagTopics", a.citusLagTopics([]string{"g"}, []string{"t"}))
	q("citusInspectLag", a.citusInspectLag([]string{"g"}, "t"))
	latest := len(a.t.Migrations())
	q("citusInspectTopics", a.citusInspectTopics(latest, []string{"a", "b"}, []time.Time{at, at}))
	q("citusInspectTopicsPage", a.citusInspectTopicsPage(TopicsPageParams{Schema: latest, After: "a", Limit: 10}, []string{"a", "b"}, []time.Time{at, at}))
	q("citusInspectTopics schema 21", a.citusInspectTopics(KeyWindowVersion-1, []string{"a", "b"}, []time.Time{at, at}))
	s("citusWorkerCommand", a.citusWorkerCommand(true))
	q("citusBoundHolder", a.citusBoundHolderStmt("t", 2))
	q("citusPositions", a.citusPositionsStmt())
	q("citusKeyNames", a.citusKeyNamesStmt([]int64{1, 4294967295}))
	q("citusClients", a.citusClientsStmt([]int64{10000000123}))
	vp := VisibleTopicsParams{Topics: []string{"a", "b", "c"}, Positions: []Position{{1, 2}, {3, 4}, {5, 6}}}
	q("citusVisible", a.citusVisibleStmt(vp, []int32{0, 1, 2}, []int{2, 0}))
	s("citusVisibleProbe", a.citusVisibleProbe())
	q("citusReleaseCheck", a.citusReleaseCheckStmt("g", []string{"t", "u"}))
	rel := []OffsetParams{
		{ConsumerGroup: "g", Topic: "t", Partition: 1, SessionID: id, Epoch: 3, Position: Position{5, 9}, HeadOut: true,
			AckedAbove: []Position{{5, 11}, {6, 0}}, NotifyChannel: "ch"},
		{ConsumerGroup: "g", Topic: "u", SessionID: id, Epoch: 4, Position: Position{7, 1}, NotifyChannel: "ch"},
	}
	q("citusRelease", a.citusReleaseStmt(rel, []int{1, 0}))
	rel[0].NotifyChannel = ""
	q("citusRelease no notification", a.citusReleaseStmt(rel, []int{0}))
	q("citusDeleteIdleGroups", a.citusDeleteIdleGroups(time.Hour))
	q("citusRetainedTopics", a.citusRetainedTopics())
	q("citusDeleteExpiredKept", a.citusDeleteExpiredKept("t", 500))
	s("citusDetachRetentionPartition", a.citusDetachRetentionPartition(rp))
	s("DistributeScript", t.DistributeScript())
	dumpKeyedStatements(&b, a.t, false)
	keyed := InsertMessagesParams{Topics: []string{"t", "u"}, UUIDs: []string{"u1", "u2"}, Keys: []string{"11111111-2222-3333-4444-555555555555", ""}}
	q("citusKeys", a.citusKeysStmt(keyed, false))
	q("citusKeys strict", a.citusKeysStmt(keyed, true))
	return b.String()
}
