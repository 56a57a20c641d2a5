package wmsqlimport

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// ErrNotWatermillSQLSchema is wrapped by the errors of [Run]
// for a source table that is not watermill-sql's default PostgreSQL schema
// (v3 or v4): a missing table, a missing or unknown column, a column of
// another type. The error names the table and the column.
var ErrNotWatermillSQLSchema = errors.New("pglease: not watermill-sql's default PostgreSQL schema")

// Names of the import's own tables, in the schema of the pglease tables
// ([pglease.Tables.Schema]). The import creates them
// (CREATE TABLE IF NOT EXISTS); they are not part of the migrations.
const (
	// RunsTable records, per topic, each run of the import: which
	// watermill-sql positions it copied and where they are in pglease.
	RunsTable = "pglease_import_watermill_sql"
	// GroupsTable records, per (topic, consumer group), the
	// position the import gave the group's offset row, so that a later
	// run can tell whether the group has consumed in pglease since.
	GroupsTable = "pglease_import_watermill_sql_groups"
)

// importBatch is how many messages the import reads and writes per
// statement.
const importBatch = 5000

// Config configures [Run].
type Config struct {
	// Topics sets the watermill-sql topics to import (tables
	// "watermill_<topic>" and "watermill_offsets_<topic>" in the source's
	// search_path), default none. Either Topics or All.
	Topics []string
	// All sets whether every watermill-sql topic of the source's
	// search_path is imported, default false: the Topics. With All, the
	// topics whose messages and offsets tables are owned by SourceOwner
	// are imported; the others are skipped and listed in Report.Skipped
	// (another role of the database may create tables named watermill_*
	// in a schema of the search_path).
	All bool
	// SourceOwner sets the role whose tables All imports, default "": the
	// role the source connection runs as (watermill-sql creates its tables
	// as the application's role).
	SourceOwner string
	// Tables sets the names of the pglease tables and their schema,
	// default pglease.Tables{}: the default names in the connection's
	// search_path. The import's own tables ([RunsTable], [GroupsTable])
	// are created in its Schema.
	Tables pglease.Tables
	// SchemaAdapter is the former name of Tables. Set one of the two:
	// both set to different tables is an error.
	//
	// Deprecated: use Tables. The field will be removed in the next minor
	// release.
	SchemaAdapter pglease.Tables
	// DryRun sets whether the import is rolled back, default false. A dry
	// run's report says what a real run would have done, and nothing
	// changes.
	DryRun bool
}

// Report is what [Run] did, per topic.
type Report struct {
	DryRun bool          `json:"dry_run"`
	Topics []TopicReport `json:"topics"`
	// Skipped are the tables Config.All found but did not import:
	// owned by another role than Config.SourceOwner.
	Skipped []SkippedTable `json:"skipped,omitempty"`
}

// SkippedTable is a watermill-sql table that [Run] with
// Config.All did not import, and why.
type SkippedTable struct {
	Table  string `json:"table"`
	Owner  string `json:"owner"`
	Reason string `json:"reason"`
}

// TopicReport is the import of one topic.
type TopicReport struct {
	Topic       string `json:"topic"`
	SourceTable string `json:"source_table"`
	// SourceKind is the schema found: "transaction_id" (v3 and v4,
	// ordered by transaction id and offset), "offset" (earlier v3,
	// ordered by offset) or "queue" (v4's delayed pub/sub and queue
	// schema: no consumer groups, an acked column).
	SourceKind string `json:"source_kind"`
	// Run counts the runs that imported the topic, this one included.
	Run int `json:"run"`
	// Messages were copied into the messages table, Delayed into the
	// delayed messages table (queue tables only).
	Messages int64 `json:"messages"`
	Delayed  int64 `json:"delayed"`
	// TransactionID is the pglease transaction id the messages of this run
	// were stored with (their offsets count up from 1 per topic).
	TransactionID uint64        `json:"transaction_id"`
	Groups        []GroupReport `json:"groups"`
	// Warnings say what could not be carried exactly.
	Warnings []string `json:"warnings,omitempty"`
}

// Group actions of an [GroupReport].
const (
	GroupCreated   = "created"   // the offset row was created
	GroupMoved     = "moved"     // a row the import created earlier, never consumed from, follows the source forward
	GroupUnchanged = "unchanged" // as the import left it before
	GroupKept      = "kept"      // the group consumes in pglease already: left alone
)

// GroupReport is one consumer group of an imported topic.
type GroupReport struct {
	ConsumerGroup string `json:"consumer_group"`
	// SourceTransactionID and SourceOffset are the group's acknowledged
	// position in watermill-sql.
	SourceTransactionID uint64 `json:"source_transaction_id"`
	SourceOffset        int64  `json:"source_offset"`
	// Position is the group's pglease position after the import.
	Position pglease.Position `json:"position"`
	Action   string           `json:"action"`
}

// wmPosition is a position in a watermill-sql topic: (transaction id,
// offset), the transaction id 0 for tables ordered by offset alone.
type wmPosition struct {
	TransactionID uint64
	Offset        int64
}

func (p wmPosition) compare(o wmPosition) int {
	switch {
	case p.TransactionID < o.TransactionID:
		return -1
	case p.TransactionID > o.TransactionID:
		return 1
	case p.Offset < o.Offset:
		return -1
	case p.Offset > o.Offset:
		return 1
	}
	return 0
}

func (p wmPosition) String() string { return fmt.Sprintf("%d:%d", p.TransactionID, p.Offset) }

// importRun is one run of the import of a topic, as recorded
// ([pgsql.ImportRun]) with watermill-sql's positions as wmPosition.
type importRun struct {
	Run           int
	TransactionID uint64
	FirstOffset   int64
	LastOffset    int64
	From          wmPosition // copied after
	To            wmPosition // and up to
}

func (r importRun) empty() bool { return r.FirstOffset > r.LastOffset }

func (r importRun) row() pgsql.ImportRun {
	return pgsql.ImportRun{Run: r.Run, TransactionID: r.TransactionID, FirstOffset: r.FirstOffset, LastOffset: r.LastOffset,
		From: pgsql.Position(r.From), To: pgsql.Position(r.To)}
}

// wmSource is one watermill-sql topic as found in the source.
type wmSource struct {
	topic         string
	messagesTable string
	offsetsTable  string // "" when there is none (queue schema, or no subscriber ever ran)
	kind          pgsql.WMKind
	payloadType   string // json, jsonb, text or bytea
}

// Run copies, for each watermill-sql topic, the messages
// that at least one consumer group has not acknowledged into pglease's
// topic of the same name (partition 0), in watermill-sql's order, and
// creates each group's pglease offset row so that it receives exactly the
// messages it had not acknowledged. Messages of v4's delayed pub/sub
// (queue tables) that are not acknowledged are carried too: those still
// delayed become pglease delayed messages. src is the database of
// watermill-sql, dst that of pglease (it may be the same database, but
// not the same *pgx.Conn: pass a pool or two connections); the pglease
// tables must exist ([pglease.Migrate]).
//
// Each topic is imported in one transaction of dst (its source tables
// read in one REPEATABLE READ transaction of src, begun once the topic's
// lock is held), which records what it copied in the
// import's own tables ([RunsTable], [GroupsTable], created on
// first use). A later run copies only the messages published to
// watermill-sql since, and moves the offset row of a group only forward,
// and only while no pglease Subscriber ever claimed it (and it is where
// the import left it); groups already consuming in pglease are left alone.
//
// Imported messages are stored with one transaction id per run and
// offsets counting up from 1 per topic. On a topic that no group consumes
// in pglease yet, the first run stores them before the topic's first
// pglease message (so that publishers may move to pglease before the
// import); otherwise with the import's own transaction id, after every
// message committed before it. Either way they lie before anything
// published to the topic later, and every position lies below the
// database's transaction counter.
//
// A source table that is not watermill-sql's default PostgreSQL schema
// is refused with an error wrapping [ErrNotWatermillSQLSchema] that names
// the table and column; topics imported before that error stay imported.
// It is safe to run again and concurrently: runs of one topic take turns,
// each reading the source only once its turn has come.
func Run(ctx context.Context, dst, src pglease.DB, config Config) (Report, error) {
	report := Report{DryRun: config.DryRun, Topics: []TopicReport{}}
	if check.NilDB(dst) || check.NilDB(src) {
		return report, fmt.Errorf("%w: wmsqlimport.Run needs a destination and a source (*pgxpool.Pool, *pgx.Conn)", pglease.ErrInvalidConfig)
	}
	if dst == src {
		if _, ok := dst.(*pgx.Conn); ok {
			return report, fmt.Errorf("%w: wmsqlimport.Run reads and writes at once: pass a pool, or two connections, not one *pgx.Conn twice", pglease.ErrInvalidConfig)
		}
	}
	if config.All == (len(config.Topics) > 0) {
		return report, fmt.Errorf("%w: wmsqlimport.Config needs either Topics or All", pglease.ErrInvalidConfig)
	}
	if config.Tables != (pglease.Tables{}) && config.SchemaAdapter != (pglease.Tables{}) && config.Tables != config.SchemaAdapter {
		return report, fmt.Errorf("%w: wmsqlimport.Config.Tables and wmsqlimport.Config.SchemaAdapter (the deprecated name of Tables) "+
			"are both set, to different tables: set Tables only", pglease.ErrInvalidConfig)
	}
	field := "Tables"
	if config.Tables == (pglease.Tables{}) {
		field, config.Tables = "SchemaAdapter", config.SchemaAdapter
	}
	if err := check.TableNames(pgsql.Names(config.Tables)); err != nil {
		return report, fmt.Errorf("%w: wmsqlimport.Config.%s: %w", pglease.ErrInvalidConfig, field, err)
	}
	for _, t := range config.Topics {
		if err := check.Topic(t, pglease.MaxTopicLength); err != nil {
			return report, fmt.Errorf("%w: %w", pglease.ErrInvalidTopic, err)
		}
	}

	sources, skipped, err := describeSources(ctx, src, config)
	if err != nil {
		return report, err
	}
	report.Skipped = skipped
	for _, s := range sources {
		t, err := importTopic(ctx, dst, src, config, s)
		if err != nil {
			return report, fmt.Errorf("import watermill-sql topic %q: %w", s.topic, check.MissingSchema(err))
		}
		report.Topics = append(report.Topics, t)
	}
	return report, nil
}

// describeSources finds the topics of config in the source (every
// watermill-sql topic of its search_path owned by config.SourceOwner with
// config.All, the others skipped) and checks their tables, before
// anything is imported.
func describeSources(ctx context.Context, src pglease.DB, config Config) ([]wmSource, []SkippedTable, error) {
	srcTx, err := src.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("import watermill-sql: begin on the source: %w", err)
	}
	defer func() { _ = srcTx.Rollback(context.WithoutCancel(ctx)) }()
	if err := pgsql.WMReadOnly(ctx, srcTx); err != nil {
		return nil, nil, fmt.Errorf("import watermill-sql: source transaction: %w", err)
	}
	topics := config.Topics
	var skipped []SkippedTable
	if config.All {
		tables, err := pgsql.WMTopicTables(ctx, srcTx)
		if err != nil {
			return nil, nil, fmt.Errorf("import watermill-sql: list the source's tables: %w", err)
		}
		for _, t := range tables {
			owner := config.SourceOwner
			if owner == "" {
				owner = t.CurrentUser
			}
			switch {
			case t.Owner != owner:
				skipped = append(skipped, SkippedTable{Table: t.Name, Owner: t.Owner,
					Reason: fmt.Sprintf("owned by %q, not by %q", t.Owner, owner)})
			case t.OffsetsOwner != nil && *t.OffsetsOwner != owner:
				skipped = append(skipped, SkippedTable{Table: t.Name, Owner: t.Owner,
					Reason: fmt.Sprintf("its offsets table is owned by %q, not by %q", *t.OffsetsOwner, owner)})
			default:
				topics = append(topics, strings.TrimPrefix(t.Name, "watermill_"))
			}
		}
	}
	sources := make([]wmSource, 0, len(topics))
	for _, topic := range topics {
		s, err := describeSource(ctx, srcTx, topic)
		if err != nil {
			return nil, nil, err
		}
		sources = append(sources, s)
	}
	return sources, skipped, nil
}

// Columns of watermill-sql's default PostgreSQL tables, with the types
// accepted for each.
var (
	wmMessageColumns = map[string][]string{
		"offset":         {"bigint", "integer"},
		"uuid":           {"character varying", "text", "uuid"},
		"created_at":     {"timestamp without time zone", "timestamp with time zone"},
		"payload":        {"json", "jsonb", "bytea", "text"},
		"metadata":       {"json", "jsonb"},
		"transaction_id": {"xid8"},
		"acked":          {"boolean"},
	}
	wmOffsetColumns = map[string][]string{
		"consumer_group":                {"character varying", "text"},
		"offset_acked":                  {"bigint", "integer"},
		"last_processed_transaction_id": {"xid8"},
		"offset_consumed":               {"bigint", "integer"}, // earlier v3
	}
)

// checkColumns refuses a table whose columns are not among known, or
// lack one of required.
func checkColumns(table string, cols []pgsql.WMColumn, known map[string][]string, required ...string) (map[string]string, error) {
	types := make(map[string]string, len(cols))
	for _, c := range cols {
		accepted, ok := known[c.Name]
		if !ok {
			return nil, fmt.Errorf("%w: table %q has column %q, which watermill-sql's default PostgreSQL schema does not have",
				ErrNotWatermillSQLSchema, table, c.Name)
		}
		base := c.Type
		if i := strings.IndexByte(base, '('); i >= 0 {
			base = base[:i]
		}
		found := false
		for _, t := range accepted {
			found = found || t == base
		}
		if !found {
			return nil, fmt.Errorf("%w: column %q of table %q is %s, expected %s",
				ErrNotWatermillSQLSchema, c.Name, table, c.Type, strings.Join(accepted, " or "))
		}
		types[c.Name] = base
	}
	for _, r := range required {
		if _, ok := types[r]; !ok {
			return nil, fmt.Errorf("%w: table %q has no column %q", ErrNotWatermillSQLSchema, table, r)
		}
	}
	return types, nil
}

// describeSource finds the tables of topic in the source and which of
// watermill-sql's schemas they have.
func describeSource(ctx context.Context, q pgsql.Querier, topic string) (wmSource, error) {
	s := wmSource{topic: topic, messagesTable: "watermill_" + topic}
	cols, err := pgsql.WMTableColumns(ctx, q, s.messagesTable)
	if err != nil {
		return s, fmt.Errorf("import watermill-sql topic %q: %w", topic, err)
	}
	if len(cols) == 0 {
		return s, fmt.Errorf("import watermill-sql topic %q: %w: no table %q in the source's search_path",
			topic, ErrNotWatermillSQLSchema, s.messagesTable)
	}
	types, err := checkColumns(s.messagesTable, cols, wmMessageColumns, "offset", "uuid", "created_at", "payload", "metadata")
	if err != nil {
		return s, fmt.Errorf("import watermill-sql topic %q: %w", topic, err)
	}
	s.payloadType = types["payload"]
	_, hasXID := types["transaction_id"]
	_, hasAcked := types["acked"]
	switch {
	case hasXID && hasAcked:
		return s, fmt.Errorf("import watermill-sql topic %q: %w: table %q has both column \"transaction_id\" and column \"acked\"",
			topic, ErrNotWatermillSQLSchema, s.messagesTable)
	case hasAcked:
		s.kind = pgsql.WMKindQueue
		return s, nil
	case hasXID:
		s.kind = pgsql.WMKindXID
	default:
		s.kind = pgsql.WMKindOffset
	}
	offsets := "watermill_offsets_" + topic
	cols, err = pgsql.WMTableColumns(ctx, q, offsets)
	if err != nil {
		return s, fmt.Errorf("import watermill-sql topic %q: %w", topic, err)
	}
	if len(cols) == 0 {
		return s, nil // no subscriber ever ran: no groups
	}
	required := []string{"consumer_group", "offset_acked"}
	if s.kind == pgsql.WMKindXID {
		required = append(required, "last_processed_transaction_id")
	}
	if _, err := checkColumns(offsets, cols, wmOffsetColumns, required...); err != nil {
		return s, fmt.Errorf("import watermill-sql topic %q: %w", topic, err)
	}
	s.offsetsTable = offsets
	return s, nil
}

// importTopic imports one topic in one transaction of dst. The source is
// read after the topic's lock is taken, in a REPEATABLE READ transaction
// of its own: so runs of one topic read it in the order in which they
// write, and a run that waited for another one sees at least what that
// one saw.
func importTopic(ctx context.Context, dst, src pglease.DB, config Config, s wmSource) (TopicReport, error) {
	out := TopicReport{Topic: s.topic, SourceTable: s.messagesTable, SourceKind: s.kind.String(), Groups: []GroupReport{}}
	a := pgsql.NewTables(pgsql.Names(config.Tables))
	err := pgx.BeginFunc(ctx, dst, func(tx pgx.Tx) error {
		if err := pgsql.ImportCreateTables(ctx, tx, a); err != nil {
			return fmt.Errorf("create the import's tables: %w", err)
		}
		if importBeforeLock != nil {
			importBeforeLock(s.topic)
		}
		if err := pgsql.ImportLockTopic(ctx, tx, a, s.topic); err != nil {
			return err
		}
		srcTx, err := src.Begin(ctx)
		if err != nil {
			return fmt.Errorf("begin on the source: %w", err)
		}
		defer func() { _ = srcTx.Rollback(context.WithoutCancel(ctx)) }()
		if err := pgsql.WMSnapshot(ctx, srcTx); err != nil {
			return fmt.Errorf("source transaction: %w", err)
		}
		var groups []pgsql.WMGroup
		if s.offsetsTable != "" {
			if groups, err = pgsql.WMGroups(ctx, srcTx, s.offsetsTable, s.kind == pgsql.WMKindXID); err != nil {
				return fmt.Errorf("read %q: %w", s.offsetsTable, err)
			}
		}
		if err := importTopicTx(ctx, tx, srcTx, a, s, groups, &out); err != nil {
			return err
		}
		if config.DryRun {
			return errDryRun
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		err = nil
	}
	return out, err
}

// importBeforeLock, when set, runs before an import takes a topic's lock
// (tests only).
var importBeforeLock func(topic string)

// errDryRun rolls back the transaction of a dry run.
var errDryRun = errors.New("dry run")

func importTopicTx(ctx context.Context, tx pgx.Tx, src pgsql.Querier, a *pgsql.Tables, s wmSource, groups []pgsql.WMGroup, out *TopicReport) error {
	state, err := pgsql.ImportReadTopic(ctx, tx, a, s.topic)
	if err != nil {
		return err
	}
	if state.Partitions != 1 {
		return fmt.Errorf("%w: the pglease topic has %d partitions; watermill-sql's order can only be kept in a topic of one",
			pglease.ErrInvalidConfig, state.Partitions)
	}
	rows, err := pgsql.ImportRuns(ctx, tx, a, s.topic)
	if err != nil {
		return err
	}
	runs := make([]importRun, 0, len(rows))
	for _, r := range rows {
		runs = append(runs, importRun{Run: r.Run, TransactionID: r.TransactionID, FirstOffset: r.FirstOffset,
			LastOffset: r.LastOffset, From: wmPosition(r.From), To: wmPosition(r.To)})
	}
	current := state.CurrentTx
	// Where this run's messages go: before the topic's first pglease
	// message while no group reads the topic in pglease, else after
	// everything committed before this transaction.
	run := importRun{Run: len(runs) + 1, TransactionID: current, FirstOffset: 1}
	if len(runs) == 0 && !state.HasOffsets && state.FirstTx != nil {
		if first := *state.FirstTx; first > 4 {
			run.TransactionID = first - 1
		}
	}
	for _, r := range runs {
		run.FirstOffset = max(run.FirstOffset, r.LastOffset+1)
	}
	// What to copy: after the last run, or, on the first, after the
	// position every group has acknowledged.
	if len(runs) > 0 {
		run.From = runs[len(runs)-1].To
	} else if len(groups) > 0 {
		run.From = wmPosition{TransactionID: groups[0].TransactionID, Offset: groups[0].Offset}
		for _, g := range groups[1:] {
			if p := (wmPosition{g.TransactionID, g.Offset}); p.compare(run.From) < 0 {
				run.From = p
			}
		}
	}
	run.To = run.From
	run.LastOffset = run.FirstOffset - 1

	// The groups whose acknowledged position lies in this run's range get
	// the offset of the last message copied at or before it.
	byPos := make([]int, len(groups))
	for i := range byPos {
		byPos[i] = i
	}
	sort.Slice(byPos, func(i, j int) bool {
		return wmPosition{groups[byPos[i]].TransactionID, groups[byPos[i]].Offset}.compare(
			wmPosition{groups[byPos[j]].TransactionID, groups[byPos[j]].Offset}) < 0
	})
	mapped := make([]int64, len(groups))
	next := 0 // in byPos
	var now time.Time
	if s.kind == pgsql.WMKindQueue {
		if now, err = pgsql.ImportNow(ctx, tx); err != nil {
			return err
		}
	}
	after := run.From
	for {
		msgs, err := pgsql.WMMessagesAfter(ctx, src, pgsql.WMMessagesParams{Table: s.messagesTable, Kind: s.kind,
			PayloadType: s.payloadType, After: pgsql.Position(after), Limit: importBatch})
		if err != nil {
			return fmt.Errorf("read %q: %w", s.messagesTable, err)
		}
		if len(msgs) == 0 {
			break
		}
		var (
			stored  = pgsql.ImportMessagesParams{Topic: s.topic, TransactionID: run.TransactionID}
			delayed pgsql.InsertMessagesParams
		)
		for _, m := range msgs {
			pos := wmPosition{m.TransactionID, m.Offset}
			for next < len(byPos) {
				g := groups[byPos[next]]
				if (wmPosition{g.TransactionID, g.Offset}).compare(pos) >= 0 {
					break
				}
				mapped[byPos[next]] = run.LastOffset
				next++
			}
			if m.DelayedUntil != nil && m.DelayedUntil.After(now) {
				delayed.Topics = append(delayed.Topics, s.topic)
				delayed.UUIDs = append(delayed.UUIDs, m.UUID)
				delayed.Payloads = append(delayed.Payloads, m.Payload)
				delayed.Metadata = append(delayed.Metadata, m.Metadata)
				delayed.DueAt = append(delayed.DueAt, *m.DelayedUntil)
			} else {
				run.LastOffset++
				stored.Offsets = append(stored.Offsets, run.LastOffset)
				stored.UUIDs = append(stored.UUIDs, m.UUID)
				stored.Payloads = append(stored.Payloads, m.Payload)
				stored.Metadata = append(stored.Metadata, m.Metadata)
				stored.CreatedAt = append(stored.CreatedAt, m.CreatedAt)
			}
			after, run.To = pos, pos
		}
		if len(stored.Offsets) > 0 {
			if err := pgsql.ImportInsertMessages(ctx, tx, a, stored); err != nil {
				return fmt.Errorf("store messages: %w", err)
			}
			out.Messages += int64(len(stored.Offsets))
		}
		if len(delayed.UUIDs) > 0 {
			delayed.NotifyChannel = a.NotifyChannel
			d, err := pgsql.OpenDriver(ctx, tx, a)
			if err != nil {
				return fmt.Errorf("store delayed messages: %w", err)
			}
			if err := d.InsertDelayed(ctx, tx, delayed); err != nil {
				return fmt.Errorf("store delayed messages: %w", err)
			}
			out.Delayed += int64(len(delayed.UUIDs))
		}
		if len(msgs) < importBatch {
			break
		}
	}
	for ; next < len(byPos); next++ {
		mapped[byPos[next]] = run.LastOffset
	}
	out.Run = run.Run
	out.TransactionID = run.TransactionID
	if len(runs) == 0 || out.Messages > 0 || out.Delayed > 0 {
		if err := pgsql.ImportInsertRun(ctx, tx, a, pgsql.ImportRunParams{Topic: s.topic, SourceTable: s.messagesTable, Kind: s.kind,
			Run: run.row(), Delayed: out.Delayed}); err != nil {
			return fmt.Errorf("record the run: %w", err)
		}
		runs = append(runs, run)
	} else {
		out.Run = len(runs)
	}
	if out.Messages > 0 {
		if err := pgsql.ImportNotify(ctx, tx, a, s.topic); err != nil {
			return err
		}
	}
	if len(groups) == 0 {
		return nil
	}

	offsetRows, err := pgsql.ImportOffsetRows(ctx, tx, a, s.topic)
	if err != nil {
		return err
	}
	existing := make(map[string]pgsql.ImportOffsetRow, len(offsetRows))
	for _, r := range offsetRows {
		existing[r.ConsumerGroup] = r
	}
	for i, g := range groups {
		source := wmPosition{g.TransactionID, g.Offset}
		pos, before, warning, err := importPosition(ctx, src, s, runs, run, mapped[i], source)
		if err != nil {
			return fmt.Errorf("position of group %q: %w", g.ConsumerGroup, err)
		}
		if warning != "" {
			out.Warnings = append(out.Warnings, fmt.Sprintf("group %q: %s", g.ConsumerGroup, warning))
		}
		ig := GroupReport{ConsumerGroup: g.ConsumerGroup, SourceTransactionID: g.TransactionID, SourceOffset: g.Offset}
		row, ok := existing[g.ConsumerGroup]
		switch {
		case !ok:
			created, err := pgsql.ImportCreateOffset(ctx, tx, a, g.ConsumerGroup, s.topic, pgsql.Position(pos))
			if err != nil {
				return fmt.Errorf("create the offset row of group %q: %w", g.ConsumerGroup, err)
			}
			if !created { // created by a Subscriber meanwhile
				ig.Action, ig.Position = GroupKept, pglease.Position{}
				out.Warnings = append(out.Warnings, fmt.Sprintf("group %q: its offset row was created by a Subscriber during the import and was left alone", g.ConsumerGroup))
				out.Groups = append(out.Groups, ig)
				continue
			}
			ig.Action, ig.Position = GroupCreated, pos
		case row.Recorded == nil || *row.Recorded != row.Position || row.Epoch != 0:
			ig.Action, ig.Position = GroupKept, pglease.Position(row.Position)
			out.Groups = append(out.Groups, ig)
			continue
		case pglease.Position(row.Position) == pos || before:
			// A group before every copied message stays where the import
			// put it: moved to this run's start, it would skip what was
			// published to pglease between the runs.
			ig.Action, ig.Position = GroupUnchanged, pglease.Position(row.Position)
		case positionLess(pos, pglease.Position(row.Position)):
			// The source is behind what an earlier run read (its offsets
			// were moved back, or it was restored): moved back, the group
			// would receive again what it acknowledged.
			ig.Action, ig.Position = GroupUnchanged, pglease.Position(row.Position)
			out.Warnings = append(out.Warnings, fmt.Sprintf("group %q: acknowledged %s in watermill-sql, behind the position an earlier run gave it: left there",
				g.ConsumerGroup, source))
			out.Groups = append(out.Groups, ig)
			continue
		default:
			moved, err := pgsql.ImportMoveOffset(ctx, tx, a, g.ConsumerGroup, s.topic, row.Position, pgsql.Position(pos))
			if err != nil {
				return fmt.Errorf("move the offset row of group %q: %w", g.ConsumerGroup, err)
			}
			if !moved { // claimed or moved meanwhile
				ig.Action, ig.Position = GroupKept, pglease.Position(row.Position)
				out.Groups = append(out.Groups, ig)
				continue
			}
			ig.Action, ig.Position = GroupMoved, pos
		}
		if err := pgsql.ImportRecordGroup(ctx, tx, a, s.topic, g.ConsumerGroup, pgsql.Position(ig.Position), pgsql.Position(source)); err != nil {
			return fmt.Errorf("record group %q: %w", g.ConsumerGroup, err)
		}
		out.Groups = append(out.Groups, ig)
	}
	return nil
}

// importPosition is the pglease position of a group that acknowledged
// source in watermill-sql: after the last message copied at or before
// source, before the first copied after it. runs are every run of the
// topic, this one (cur) included when it recorded anything; inCur is the
// offset mapped while copying, for a source position within cur. before
// reports that source lies before every copied message (or nothing was
// ever copied).
func importPosition(ctx context.Context, src pgsql.Querier, s wmSource, runs []importRun, cur importRun, inCur int64, source wmPosition) (pos pglease.Position, before bool, warning string, err error) {
	var copied []importRun
	for _, r := range runs {
		if !r.empty() {
			copied = append(copied, r)
		}
	}
	if len(copied) == 0 {
		// Nothing was ever copied: the group has acknowledged everything;
		// it starts where this run would have put messages.
		return pglease.Position{TransactionID: cur.TransactionID, Offset: cur.FirstOffset - 1}, true, "", nil
	}
	first, last := copied[0], copied[len(copied)-1]
	if source.compare(first.From) <= 0 {
		pos := pglease.Position{TransactionID: first.TransactionID, Offset: first.FirstOffset - 1}
		if source.compare(first.From) < 0 {
			return pos, true, fmt.Sprintf("acknowledged %s in watermill-sql, before the first message the import copied (after %s): it starts at that message",
				source, first.From), nil
		}
		return pos, true, "", nil
	}
	if source.compare(last.To) >= 0 {
		return pglease.Position{TransactionID: last.TransactionID, Offset: last.LastOffset}, false, "", nil
	}
	for _, r := range copied {
		if source.compare(r.From) <= 0 || source.compare(r.To) > 0 {
			continue
		}
		if r.Run == cur.Run {
			return pglease.Position{TransactionID: r.TransactionID, Offset: inCur}, false, "", nil
		}
		n, err := pgsql.WMCountBetween(ctx, src, s.messagesTable, s.kind, pgsql.Position(r.From), pgsql.Position(source))
		if err != nil {
			return pglease.Position{}, false, "", err
		}
		return pglease.Position{TransactionID: r.TransactionID, Offset: r.FirstOffset - 1 + n}, false, "", nil
	}
	// Between two runs (a run that copied nothing moved no range): after
	// the last run before source.
	pos = pglease.Position{TransactionID: first.TransactionID, Offset: first.FirstOffset - 1}
	for _, r := range copied {
		if r.To.compare(source) <= 0 {
			pos = pglease.Position{TransactionID: r.TransactionID, Offset: r.LastOffset}
		}
	}
	return pos, false, "", nil
}

// positionLess reports whether a comes before b in the delivery order.
func positionLess(a, b pglease.Position) bool {
	if a.TransactionID != b.TransactionID {
		return a.TransactionID < b.TransactionID
	}
	return a.Offset < b.Offset
}
