package pgsql

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite the golden files of testdata/ with the current output")

// TestStatementsAreUnchanged builds every statement, with its arguments,
// for the default names and for names that need quoting and shortening,
// and compares them with testdata/statements_*.txt, written by the release
// before the statements moved here (main 8ae95f9, from the methods of
// pglease.Tables). It needs no database.
func TestStatementsAreUnchanged(t *testing.T) {
	for name, n := range goldenNames() {
		checkGolden(t, name+": the statements", filepath.Join("testdata", "statements_"+name+".txt"), dumpStatements(NewTables(n)))
	}
}

// checkGolden compares got with the golden file at path (with
// -update-golden, writes it there instead); on a difference it writes got
// beside it, as path.got, and fails the test naming what differs.
func checkGolden(t *testing.T, what, path, got string) {
	t.Helper()
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		_ = os.WriteFile(path+".got", []byte(got), 0o644)
		t.Errorf("%s differ from the golden file; diff %s.got with it", what, path)
	}
}

func dumpStatements(a *Tables) string {
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
	s("NotifyChannel", a.NotifyChannel)
	s("SchemaLockKey", a.LockKey)
	s("VersionTable", a.Version)
	one := InsertMessagesParams{Topics: []string{"t", "t"}, UUIDs: []string{"u1", "u2"}, Payloads: [][]byte{[]byte("a"), nil},
		Metadata: []string{`{"a":"b"}`, ""}}
	q("InsertMessages one", a.InsertMessages(one))
	one.NotifyChannel = "ch"
	q("InsertMessages one notify", a.InsertMessages(one))
	one.PartitionHashes = []uint32{1, 4294967295}
	q("InsertMessages one notify hashes", a.InsertMessages(one))
	many := InsertMessagesParams{Topics: []string{"t", "u"}, UUIDs: []string{"u1", "u2"}, Payloads: [][]byte{[]byte("a"), nil},
		Metadata: []string{`{"a":"b"}`, ""}}
	q("InsertMessages many", a.InsertMessages(many))
	many.NotifyChannel = "ch"
	many.PartitionHashes = []uint32{7}
	q("InsertMessages many notify hashes", a.InsertMessages(many))
	q("UpsertTopic", a.UpsertTopic(TopicParams{Topic: "t", Partitions: 3, Retention: time.Hour, RetentionClass: 5, NotifyChannel: "ch"}))
	q("TopicPartitions", a.TopicPartitions(TopicsParams{Topics: []string{"a", "b"}}))
	q("SelectMessages", a.SelectMessages(SelectMessagesParams{Topic: "t", Partition: 2, After: Position{TransactionID: 18446744073709551615, Offset: 9}, Limit: 100}))
	q("SelectMessages max", a.SelectMessages(SelectMessagesParams{Topic: "t", After: Position{TransactionID: 5, Offset: 9}, Limit: 100, MaxMessageBytes: 1000}))
	bound, read := a.SelectMessagesBound(SelectMessagesParams{Topic: "t", Partition: 2, After: Position{TransactionID: 5, Offset: 9}, Limit: 100})
	q("SelectMessagesBound bound", bound)
	q("SelectMessagesBound read", read)
	q("SelectMessagesAt", a.SelectMessagesAt(SelectMessagesAtParams{Topic: "t", Partition: 2, Positions: []Position{{5, 9}, {7, 11}}, Here: "h"}))
	q("VisibleTopics", a.VisibleTopics(VisibleTopicsParams{Topics: []string{"a", "b"}, Positions: []Position{{1, 2}, {3, 4}}}))
	q("VisibleTopics partitions", a.VisibleTopics(VisibleTopicsParams{Topics: []string{"a", "b"}, Partitions: []int32{1, 2}, Positions: []Position{{1, 2}, {3, 4}}}))
	sp := SessionParams{SessionID: id, NotifyChannel: "ch", SubscriptionHash: -5, SubscriptionSize: 3, ReplacesSessionID: id2,
		ConsumerGroup: "g", Owner: "host/1", TTL: 10 * time.Second}
	q("CreateSession", a.CreateSession(sp))
	q("HeartbeatSession", a.HeartbeatSession(sp))
	q("DeleteSession", a.DeleteSession(sp))
	q("DeleteExpiredSessions", a.DeleteExpiredSessions(sp))
	q("SetSubscriptions", a.SetSubscriptions(sp))
	q("GroupMembers", a.GroupMembers(GroupParams{ConsumerGroup: "g"}))
	q("OffsetOwners", a.OffsetOwners(OffsetsParams{ConsumerGroup: "g", Topics: []string{"a", "b"}}))
	op := OffsetsParams{ConsumerGroup: "g", Topics: []string{"a", "b"}, SessionID: id, Limit: 10, Latest: true}
	q("EnsureOffsets", a.EnsureOffsets(op))
	q("ClaimOffsets", a.ClaimOffsets(op))
	op.Partitions = []int32{0, 3}
	q("ClaimOffsets partitions", a.ClaimOffsets(op))
	p := OffsetParams{ConsumerGroup: "g", Topic: "t", Partition: 1, SessionID: id, Epoch: 7, Position: Position{11, 12}, Version: "(0,1)"}
	q("CommitOffset", a.CommitOffset(p))
	q("ReleaseOffset", a.ReleaseOffset(p))
	q("CountHeadDelivery", a.CountHeadDelivery(p))
	q("AckOffset", a.AckOffset(p))
	above := p
	above.Above = true
	q("AckOffsetAbove", a.AckOffset(above))
	q("LoadWaiting", a.LoadWaiting(p))
	q("LoadHandedOut", a.LoadHandedOut(p))
	q("MarkHandedOut", a.MarkHandedOut(p))
	wp := WaitingParams{OffsetParams: p, Attempts: 2, Failed: true, Delay: 1500 * time.Millisecond, Reason: "r",
		Drop: []Position{{9, 10}}}
	q("RecordWaiting failed", a.RecordWaiting(wp))
	wp.Failed = false
	q("RecordWaiting attempt", a.RecordWaiting(wp))
	q("DeadLetterOffset", a.DeadLetterOffset(wp))
	p.NotifyChannel = "ch"
	q("ReleaseOffset notify", a.ReleaseOffset(p))
	mp := MaintainerParams{SessionID: id, Epoch: 3, NotifyChannel: "ch"}
	q("ClaimMaintainer", a.ClaimMaintainer(mp))
	q("MaintainerHolder", a.MaintainerHolder())
	q("ReleaseMaintainer", a.ReleaseMaintainer(mp))
	d := InsertMessagesParams{Topics: []string{"t", "u"}, UUIDs: []string{"u1", "u2"}, Payloads: [][]byte{[]byte("a"), nil},
		Metadata: []string{`{"a":"b"}`, ""}, NotifyChannel: "ch", DueAt: []time.Time{at, at.Add(time.Second)}}
	q("InsertDelayed", a.InsertDelayed(d))
	d.PartitionHashes = []uint32{1, 2}
	q("InsertDelayed hashes", a.InsertDelayed(d))
	q("MoveDueMessages", a.MoveDueMessages(MoveDueParams{Limit: 100, NotifyChannel: "ch"}))
	q("DeleteIdleGroups", a.DeleteIdleGroups(time.Hour))
	q("RetentionLanes", a.RetentionLanes())
	q("RetentionPartitions", a.RetentionPartitions())
	q("DetachedRetentionPartitions", a.DetachedRetentionPartitions())
	rp := RetentionPartition{Class: 4, Start: time.Unix(1700000000, 0), End: time.Unix(1700000016, 0)}
	for i, st := range a.CreateRetentionPartition(rp) {
		s(fmt.Sprintf("CreateRetentionPartition %d", i), st)
	}
	q("UnacknowledgedInPartition", a.UnacknowledgedInPartition(rp))
	q("MaintainerAccess", a.MaintainerAccess())
	q("CallAddRetentionPartition", a.CallAddRetentionPartition(rp))
	q("CallExpireRetentionPartition", a.CallExpireRetentionPartition(rp))
	q("CallDropDetachedPartition", a.CallDropDetachedPartition(rp))
	s("DetachRetentionPartition", a.DetachRetentionPartition(rp, false))
	s("DetachRetentionPartition finalize", a.DetachRetentionPartition(rp, true))
	s("DropRetentionPartition", a.DropRetentionPartition(rp))
	q("DeleteExpiredKept", a.DeleteExpiredKept(500))
	q("InspectSessions", a.InspectSessions())
	q("InspectLag", a.InspectLag([]string{"g"}, []string{"t"}))
	q("InspectLag all", a.InspectLag(nil, nil))
	q("InspectWaiting", a.InspectWaiting([]string{"g"}, []string{"t"}))
	q("InspectHorizon", a.InspectHorizon())
	q("OpenPublishers", a.OpenPublishers())
	latest := len(a.Migrations())
	q("InspectTopics", a.InspectTopics(latest))
	q("InspectTopicsPage", a.InspectTopicsPage(TopicsPageParams{Schema: latest, After: "a", Limit: 10}))
	// On the schemas of the releases before the key window and before
	// the key classes.
	q("InspectTopics schema 21", a.InspectTopics(KeyWindowVersion-1))
	q("InspectTopics schema 20", a.InspectTopics(KeyClassesVersion-1))
	for _, to := range []string{"earliest", "latest", "time"} {
		// "o1:gt" is the reset notification of group "g" on topic "t".
		q("ResetOffsets "+to, a.ResetOffsets("g", "t", to, at, false, "ch", "o1:gt", []int64{5}))
		q("ResetOffsets force "+to, a.ResetOffsets("g", "t", to, at, true, "ch", "o1:gt", []int64{5}))
	}
	for _, m := range a.Migrations() {
		s(fmt.Sprintf("Migration %d %s", m.Version, m.Description), m.SQL)
	}
	for i, st := range a.Prepare() {
		s(fmt.Sprintf("Prepare %d", i), st)
	}
	dumpMovedStatements(a, q)
	dumpAdminStatements(a, q, s)
	dumpKeyedStatements(&b, a, true)
	return b.String()
}

// dumpMovedStatements adds the statements that moved here after the
// others (main 5f3da0a): the message browser's, replay's and
// ImportWatermillSQL's, which sat beside their callers in the root
// package. Their golden text was written at the move and checked byte for
// byte (SQL and arguments) against what the root's functions ran.
func dumpMovedStatements(a *Tables, q func(string, Stmt)) {
	last := Position{TransactionID: 18446744073709551615, Offset: 9223372036854775807}
	q("MessagesNewestFirst", a.messagesNewestFirst(BrowseParams{Topic: "t", Partition: -1, At: last, Limit: 21, Preview: 4096}))
	q("MessagesNewestFirst partition", a.messagesNewestFirst(BrowseParams{Topic: "t", Partition: 2, At: Position{11, 12}, Limit: 21, Preview: -1}))
	q("MessagesByUUID", a.messagesByUUID("t", "u1", 1024, 20))
	q("MessagesByUUID all topics", a.messagesByUUID("", "u1", -1, -1))
	rp := ReplayParams{Topic: "t", Filter: []byte(`{"a":"b"}`), OriginalTopicKeys: []string{"topic_poisoned", "_pglease_dead_letter_source_topic"}, Limit: 100}
	q("DeleteMessagesForReplay", a.deleteMessagesForReplay(rp))
	rp.ToOriginal = true
	q("DeleteMessagesForReplay to original", a.deleteMessagesForReplay(rp))
	q("TopicDetail", a.topicDetail("t", len(a.Migrations())))
	q("TopicDetail schema 21", a.topicDetail("t", KeyWindowVersion-1))
	q("TopicDetail schema 20", a.topicDetail("t", KeyClassesVersion-1))
	q("CountTopicMessages", a.countTopicMessages([]string{"a", "b"}, 10000))
	q("CountTopicMessages all", a.countTopicMessages(nil, 10000))
	q("EstimateTopicMessages", a.estimateTopicMessages("t"))
	q("LockGroupOffsets", a.lockGroupOffsets("g"))
	q("GroupLiveOwners", a.groupLiveOwners("g"))
	q("DeleteGroupOffsets", a.deleteGroupOffsets("g", []GroupOffsetRow{{Topic: "t", Partition: 0}, {Topic: "u", Partition: 1}}))

	q("WMTableColumns", wmTableColumns("watermill_t"))
	q("WMTopicTables", wmTopicTables())
	q("WMGroups", wmGroups("watermill_offsets_t", true))
	q("WMGroups offset", wmGroups("watermill_offsets_t", false))
	for _, k := range []WMKind{WMKindXID, WMKindOffset, WMKindQueue} {
		for _, payload := range []string{"bytea", "json"} {
			q("WMMessagesAfter "+k.String()+" "+payload, wmMessagesAfter(WMMessagesParams{Table: "watermill_t", Kind: k,
				PayloadType: payload, After: Position{11, 12}, Limit: 5000}))
		}
		q("WMCountBetween "+k.String(), wmCountBetween("watermill_t", k, Position{11, 12}, Position{13, 14}))
	}
	q("ImportCreateTables", a.importCreateTables())
	q("ImportLockTopic", a.importLockTopic("t"))
	q("ImportRuns", a.importRuns("t"))
	run := ImportRun{Run: 2, TransactionID: 5, FirstOffset: 3, LastOffset: 7, From: Position{11, 12}, To: Position{13, 14}}
	q("ImportInsertRun", a.importInsertRun(ImportRunParams{Topic: "t", SourceTable: "watermill_t", Kind: WMKindQueue, Run: run, Delayed: 4}))
	q("ImportReadTopic", a.importReadTopic("t"))
	q("ImportOffsetRows", a.importOffsetRows("t"))
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	q("ImportInsertMessages", a.importInsertMessages(ImportMessagesParams{Topic: "t", TransactionID: 5, Offsets: []int64{1, 2},
		UUIDs: []string{"u1", "u2"}, Payloads: [][]byte{[]byte("a"), nil}, Metadata: []string{`{"a":"b"}`, ""},
		CreatedAt: []time.Time{at, at.Add(time.Second)}}))
	q("ImportNotify", a.importNotify("t"))
	q("ImportCreateOffset", a.importCreateOffset("g", "t", Position{11, 12}))
	q("ImportMoveOffset", a.importMoveOffset("g", "t", Position{11, 12}, Position{13, 14}))
	q("ImportRecordGroup", a.importRecordGroup("t", "g", Position{11, 12}, Position{13, 14}))
	q("ImportNow", importNow())
}

// dumpAdminStatements adds the statements that the admin packages and the
// pglease command ran themselves before they moved here: their golden
// text is what those callers ran.
func dumpAdminStatements(a *Tables, q func(string, Stmt), s func(string, string)) {
	q("DisableJIT", jitOff())
	q("WMReadOnly", wmReadOnly())
	q("WMSnapshot", wmSnapshot())
	q("TablesOwner", a.tablesOwner())
	s("MigrationScript", a.MigrationScript([]Migration{{Version: 7, Description: "it's a test", SQL: "SELECT 1"},
		{Version: 8, Description: "second", SQL: "SELECT 2;\n"}}))
}
