package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

var uiFuncs = template.FuncMap{
	"name":     displayName,
	"pos":      formatPosition,
	"time":     formatTime,
	"dur":      formatDuration,
	"expires":  formatExpiresIn,
	"orDash":   orDash,
	"lagSecs":  formatLagSeconds,
	"preview":  func(m admin.StoredMessage) string { return abbreviate(payloadPreview(m), 120) },
	"metadata": func(m admin.StoredMessage) string { return abbreviate(formatStoredMetadata(m), 120) },
	"keys":     sortedKeys,
	"q":        url.QueryEscape,
	"short":    func(id uuid.UUID) string { return id.String()[:8] },
	"secs":     func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"add":      func(a, b int) int { return a + b },
}

// groupSummary is one consumer group on the overview.
type groupSummary struct {
	Name          string  `json:"group"`
	Members       int     `json:"members"`
	Rows          int     `json:"rows"`
	Owned         int     `json:"owned"`
	Lag           int64   `json:"lag"`
	MaxLagSeconds float64 `json:"max_lag_seconds"`
	Pending       bool    `json:"pending"`
}

type overviewBody struct {
	// Groups is the page of groups shown: uiGroupsPage after GroupsAfter
	// (Paged: not the first page); TotalGroups counts every group.
	Groups      []groupSummary
	TotalGroups int
	GroupsAfter string
	Paged       bool
	// NextAfter is the ?after= of the next page (HasNext: there is one).
	NextAfter string
	HasNext   bool
	// SampledAt is when the groups' lag was read by the sampler (zero:
	// read for this page); SampleTook how long that read took.
	SampledAt  time.Time
	SampleTook time.Duration
	SampleAge  time.Duration // how long before the page the sample was read
	Sessions   []admin.SessionInfo
	More       int // sessions not listed
	Live       int
	Maintainer *admin.SessionInfo
}

// startedSince reports whether a live session is younger than age.
func startedSince(sessions []admin.SessionInfo, age time.Duration) bool {
	for _, s := range sessions {
		if s.Alive && s.Age < age {
			return true
		}
	}
	return false
}

// summarize folds the lag rows and sessions into one line per group.
func summarize(lag []admin.LagInfo, sessions []admin.SessionInfo) []groupSummary {
	return withMembers(nil, lag, sessions)
}

// withMembers adds to groups (folded before, without members) the lag
// rows and the live sessions, one line per group, sorted by name.
func withMembers(groups []groupSummary, lag []admin.LagInfo, sessions []admin.SessionInfo) []groupSummary {
	byName := map[string]*groupSummary{}
	for i := range groups {
		g := groups[i]
		byName[g.Name] = &g
	}
	get := func(n string) *groupSummary {
		g := byName[n]
		if g == nil {
			g = &groupSummary{Name: n}
			byName[n] = g
		}
		return g
	}
	for _, l := range lag {
		g := get(l.ConsumerGroup)
		g.Rows++
		g.Lag += l.Lag
		g.MaxLagSeconds = max(g.MaxLagSeconds, l.LagSeconds)
		g.Pending = g.Pending || l.Pending
		if l.Owner != "" {
			g.Owned++
		}
	}
	for _, s := range sessions {
		if s.Alive {
			get(s.ConsumerGroup).Members++
		}
	}
	out := make([]groupSummary, 0, len(byName))
	for _, g := range byName {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// overview shows every group's lag as the sampler last read it (the
// read of every row's lag is the expensive one: it runs once per
// interval, however many pages are open), or reads it when no sample
// was taken yet or a live session started after the sample (its claims,
// and its group, are not in it); the sessions and the horizon are read
// for each page.
func (s *uiServer) overview(ctx context.Context, r *http.Request, d *pageData) (string, error) {
	d.Title, d.Nav = "Overview", "overview"
	sessions, err := s.insp.Sessions(ctx)
	if err != nil {
		return "", err
	}
	var b overviewBody
	groups, at, took := s.sampler.summary()
	if at.IsZero() || startedSince(sessions, time.Since(at)) {
		lag, err := s.insp.Lag(ctx, admin.LagFilter{})
		if err != nil {
			return "", err
		}
		b.Groups = summarize(lag, sessions)
	} else {
		b.Groups, b.SampledAt, b.SampleTook = withMembers(groups, nil, sessions), at, took
		b.SampleAge = time.Since(at)
	}
	for i, ss := range sessions {
		if ss.Alive {
			b.Live++
		}
		if ss.Maintainer {
			b.Maintainer = &sessions[i]
		}
	}
	b.pageGroups(r.URL.Query())
	b.Sessions = sessions
	if len(sessions) > maxOverviewSessions {
		b.Sessions, b.More = sessions[:maxOverviewSessions], len(sessions)-maxOverviewSessions
	}
	d.Body = b
	return "overview.html", nil
}

// maxTopicChoices is how many topics the reset form of a group's page
// offers in a list; a group with more has the name typed.
const maxTopicChoices = 200

// uiGroupsPage is how many groups a page of the overview lists.
const uiGroupsPage = 100

// pageGroups keeps of b.Groups (sorted by name) the page of uiGroupsPage
// after ?after=.
func (b *overviewBody) pageGroups(q url.Values) {
	b.TotalGroups = len(b.Groups)
	start := 0
	if after, ok := q["after"]; ok {
		b.GroupsAfter, b.Paged = strings.Join(after, ""), true
		start = sort.Search(len(b.Groups), func(i int) bool { return b.Groups[i].Name > b.GroupsAfter })
	}
	end := min(start+uiGroupsPage, len(b.Groups))
	b.Groups = b.Groups[start:end]
	if end < b.TotalGroups {
		b.NextAfter, b.HasNext = b.Groups[len(b.Groups)-1].Name, true
	}
}

type groupBody struct {
	Summary groupSummary
	// Rows is the page of rows shown: maxGroupRows from From; More
	// counts the rows after it, TotalRows every row.
	Rows      []admin.LagInfo
	From      int
	More      int
	TotalRows int
	// Topics are the group's topics that the reset form offers, at most
	// maxTopicChoices of them; TopicCount counts them all (above
	// maxTopicChoices the form asks for the name instead).
	Topics     []string
	TopicCount int
	Chart      template.HTML
	Members    []admin.SessionInfo
	// The reset preview, when one was asked for.
	Preview *resetPreview
	// DeletePreview counts the rows a deletion would remove.
	DeletePreview *int64
}

type resetPreview struct {
	Topic, To, Time string
	Force           bool
	Partitions      []admin.OffsetReset
}

// groupData reads a group's page, its rows from the from-th.
func (s *uiServer) groupData(ctx context.Context, group string, from int) (*groupBody, error) {
	lag, err := s.insp.Lag(ctx, admin.LagFilter{ConsumerGroups: []string{group}})
	if err != nil {
		return nil, err
	}
	sessions, err := s.insp.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	b := &groupBody{}
	var mine []admin.SessionInfo
	for _, ss := range sessions {
		if ss.ConsumerGroup == group {
			mine = append(mine, ss)
		}
	}
	sums := summarize(lag, mine)
	if len(sums) == 0 {
		return nil, &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no consumer group %q: it has no offsets rows and no sessions", group)}
	}
	b.Summary, b.Members = sums[0], mine
	seen := map[string]bool{}
	for _, l := range lag {
		if !seen[l.Topic] {
			seen[l.Topic] = true
			if len(b.Topics) < maxTopicChoices {
				b.Topics = append(b.Topics, l.Topic)
			}
		}
	}
	b.TopicCount = len(seen)
	from = min(from, len(lag))
	end := min(from+maxGroupRows, len(lag))
	b.Rows, b.From, b.More, b.TotalRows = lag[from:end], from, len(lag)-end, len(lag)
	b.Chart = lagChart(s.sampler.series(group))
	return b, nil
}

func (s *uiServer) group(ctx context.Context, r *http.Request, d *pageData) (string, error) {
	name := r.URL.Query().Get("name")
	d.Title, d.Nav = "Group "+displayName(name), "overview"
	from := 0
	if f := r.URL.Query().Get("from"); f != "" {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return "", badRequest("from %q is not a row number", f)
		}
		from = n
	}
	b, err := s.groupData(ctx, name, from)
	if err != nil {
		return "", err
	}
	d.Body = b
	return "group.html", nil
}

// uiTopicsPage is how many topics a page of the topics list shows.
const uiTopicsPage = 100

type topicsBody struct {
	admin.TopicPage
	// After is the topic the page starts after (Paged: not the first page).
	After string
	Paged bool
	// NextAfter is the ?after= of the next page (HasNext: there is one).
	NextAfter string
	HasNext   bool
}

// topics lists a page of uiTopicsPage topics: the first, or those after
// ?after=; it counts them all and links the next page.
func (s *uiServer) topics(ctx context.Context, r *http.Request, d *pageData) (string, error) {
	d.Title, d.Nav = "Topics", "topics"
	b := topicsBody{}
	p := admin.TopicsParams{Limit: uiTopicsPage}
	if after, ok := r.URL.Query()["after"]; ok {
		b.After, b.Paged = strings.Join(after, ""), true
		p.After = &b.After
	}
	page, err := s.insp.TopicsPage(ctx, p)
	if err != nil {
		return "", err
	}
	b.TopicPage = page
	if page.Next != nil {
		b.NextAfter, b.HasNext = *page.Next, true
	}
	d.Body = b
	return "topics.html", nil
}

type topicBody struct {
	Detail     admin.TopicDetail
	Partition  string // "" for all
	Partitions []int
	Page       admin.MessagePage
	UUID       string
	Found      []admin.StoredMessage
	From       string
	Poisoned   int // messages of the page naming an original topic
	Replay     *replayPreview
}

type replayPreview struct {
	To         string
	ToOriginal bool
	Filter     string
	Limit      int
	Messages   []admin.ReplayedMessage
}

func (s *uiServer) topicData(ctx context.Context, q url.Values) (*topicBody, error) {
	name := q.Get("name")
	detail, err := s.insp.TopicDetail(ctx, name)
	if err != nil {
		if errors.Is(err, pglease.ErrInvalidTopic) {
			return nil, badRequest("%v", err)
		}
		return nil, err
	}
	b := &topicBody{Detail: detail, Partition: q.Get("partition"), UUID: strings.TrimSpace(q.Get("uuid")), From: q.Get("from")}
	for p := range detail.Partitions {
		b.Partitions = append(b.Partitions, p)
	}
	p := admin.MessagesParams{Topic: name, Limit: 50, PreviewBytes: 120}
	if b.Partition != "" {
		n, err := strconv.ParseInt(b.Partition, 10, 32)
		if err != nil || n < 0 {
			return nil, badRequest("partition %q is not a partition number", b.Partition)
		}
		part := int32(n)
		p.Partition = &part
	}
	if b.From != "" {
		pos, err := parsePosition(b.From)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		p.From = &pos
	}
	if b.Page, err = s.insp.Messages(ctx, p); err != nil {
		return nil, err
	}
	for _, m := range b.Page.Messages {
		if m.Metadata[admin.PoisonedTopicKey] != "" {
			b.Poisoned++
		}
	}
	if b.UUID != "" {
		if b.Found, err = s.insp.FindMessages(ctx, admin.FindMessagesParams{Topic: name, UUID: b.UUID, Limit: maxFound, PreviewBytes: 1}); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (s *uiServer) topic(ctx context.Context, r *http.Request, d *pageData) (string, error) {
	q := r.URL.Query()
	d.Title, d.Nav = "Topic "+displayName(q.Get("name")), "topics"
	b, err := s.topicData(ctx, q)
	if err != nil {
		return "", err
	}
	d.Body = b
	return "topic.html", nil
}

// The message page reads at most maxShownPayload bytes of a payload (the
// database cuts it), and shows at most maxHexPayload of them in hex; a
// look-up by UUID lists at most maxFound messages.
const (
	maxShownPayload = 1 << 20
	maxHexPayload   = 256 << 10
	maxFound        = 100
)

type messageBody struct {
	Message admin.StoredMessage
	// Text is the payload as text, Hex its hex dump: only the one of View.
	Text   string
	IsText bool
	Hex    string
	View   string
	// Shown is how many bytes of the payload are shown.
	Shown int
}

// message shows one message of a topic: the one at ?position=, or the
// newest with ?uuid=. It reads at most maxShownPayload bytes of its
// payload, and renders only the view asked for.
func (s *uiServer) message(ctx context.Context, r *http.Request, d *pageData) (string, error) {
	q := r.URL.Query()
	topic, id := q.Get("topic"), q.Get("uuid")
	d.Title, d.Nav = "Message "+id, "topics"
	if topic == "" {
		return "", badRequest("say which topic: ?topic=")
	}
	var pos pglease.Position
	if p := q.Get("position"); p != "" {
		var err error
		if pos, err = parsePosition(p); err != nil {
			return "", badRequest("%v", err)
		}
	} else {
		found, err := s.insp.FindMessages(ctx, admin.FindMessagesParams{Topic: topic, UUID: id, Limit: 1, PreviewBytes: 1})
		if err != nil {
			return "", lookupError(err)
		}
		if len(found) == 0 {
			return "", &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no message %q on topic %q", id, topic)}
		}
		pos = found[0].Position
	}
	page, err := s.insp.Messages(ctx, admin.MessagesParams{Topic: topic, From: &pos, Limit: 1, PreviewBytes: maxShownPayload})
	if err != nil {
		return "", lookupError(err)
	}
	if len(page.Messages) == 0 || page.Messages[0].Position != pos || (id != "" && page.Messages[0].UUID != id) {
		return "", &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no message %q at %s on topic %q", id, formatPosition(pos), topic)}
	}
	m := page.Messages[0]
	b := messageBody{Message: m, View: q.Get("view"), Shown: len(m.Payload)}
	if b.View != "hex" {
		b.Text, b.IsText = payloadText(m.Payload)
	} else {
		_, b.IsText = payloadText(m.Payload)
	}
	if !b.IsText {
		b.View = "hex"
	}
	if b.View == "hex" {
		shown := m.Payload
		if len(shown) > maxHexPayload {
			shown = shown[:maxHexPayload]
		}
		b.Hex, b.Shown = hex.Dump(shown), len(shown)
	}
	d.Body = b
	return "message.html", nil
}

// lookupError makes a bad topic a bad request.
func lookupError(err error) error {
	if errors.Is(err, pglease.ErrInvalidTopic) {
		return badRequest("%v", err)
	}
	return err
}

// reset previews (dry run) or, confirmed, applies a reset of a group's
// offsets on a topic.
func (s *uiServer) reset(ctx context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error {
	f := r.PostForm
	group, topic, to := f.Get("group"), f.Get("topic"), f.Get("to")
	force, confirm := f.Get("force") == "on", f.Get("confirm") == "yes"
	var target admin.ResetTo
	switch to {
	case "earliest":
		target = admin.ResetToEarliest
	case "latest":
		target = admin.ResetToLatest
	case "time":
		t, err := time.Parse(time.RFC3339, strings.TrimSpace(f.Get("time")))
		if err != nil {
			return badRequest("the time %q is not RFC 3339, such as 2026-11-23T08:00:00Z", f.Get("time"))
		}
		target = admin.ResetToTime(t)
	default:
		return badRequest("say where to reset to: earliest, latest or time")
	}
	action := fmt.Sprintf("reset-offsets group=%q topic=%q to=%s force=%t", group, topic, target, force)
	p := admin.ResetOffsetsParams{ConsumerGroup: group, Topic: topic, To: target, Force: force}
	var (
		resets []admin.OffsetReset
		err    error
	)
	if confirm {
		resets, err = s.insp.ResetOffsets(ctx, p)
	} else {
		resets, err = s.dryRunReset(ctx, p)
	}
	b, gerr := s.groupData(ctx, group, 0)
	if gerr != nil {
		return gerr
	}
	d.Title, d.Nav, d.Body = "Group "+displayName(group), "overview", b
	if err != nil {
		s.logWrite(r, d, action, "failed: "+err.Error())
		if errors.Is(err, admin.ErrOwnedByLiveSession) {
			err = &httpError{status: http.StatusConflict, msg: err.Error() + ". Nothing was changed. Tick \"force\" to fence the owners."}
		}
		var he *httpError
		if !errors.As(err, &he) {
			err = badRequest("%v", err)
		}
		d.Error = err.Error()
		s.render(w, he2status(err), "group.html", d)
		return nil
	}
	if confirm {
		s.logWrite(r, d, action, "applied to "+count(len(resets), "partition"))
		s.redirect(w, r, "/group", url.Values{"name": {group}}, fmt.Sprintf("Reset %s on %s to %s: %s.", displayName(group), displayName(topic), target, count(len(resets), "partition")))
		return nil
	}
	s.logWrite(r, d, action, "previewed (dry run)")
	b.Preview = &resetPreview{Topic: topic, To: to, Time: f.Get("time"), Force: force, Partitions: resets}
	s.render(w, http.StatusOK, "group.html", d)
	return nil
}

func he2status(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.status
	}
	return http.StatusInternalServerError
}

// dryRunReset runs the reset in a transaction that is rolled back.
func (s *uiServer) dryRunReset(ctx context.Context, p admin.ResetOffsetsParams) ([]admin.OffsetReset, error) {
	return withRollback(ctx, s, func(insp *admin.Inspector) ([]admin.OffsetReset, error) {
		return insp.ResetOffsets(ctx, p)
	})
}

// withRollback runs f on an Inspector of a transaction that is rolled
// back: what f writes is never committed.
func withRollback[T any](ctx context.Context, s *uiServer, f func(*admin.Inspector) (T, error)) (T, error) {
	var zero T
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return zero, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	insp, err := admin.NewInspector(tx, s.tables)
	if err != nil {
		return zero, err
	}
	return f(insp)
}

// parseFilter parses "k=v, k2=v2" (commas or new lines between pairs).
func parseFilter(s string) (map[string]string, error) {
	var out map[string]string
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' }) {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", part)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// replay previews (dry run) or, confirmed, replays messages of a topic.
func (s *uiServer) replay(ctx context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error {
	f := r.PostForm
	from := f.Get("from")
	p := admin.ReplayParams{From: from, ToOriginal: f.Get("where") == "original", DryRun: f.Get("confirm") != "yes"}
	if !p.ToOriginal {
		p.To = strings.TrimSpace(f.Get("to"))
	}
	filter, err := parseFilter(f.Get("filter"))
	if err != nil {
		return badRequest("filter: %v", err)
	}
	p.Metadata = filter
	if l := strings.TrimSpace(f.Get("limit")); l != "" {
		if p.Limit, err = strconv.Atoi(l); err != nil || p.Limit < 1 {
			return badRequest("limit %q is not a positive number", l)
		}
	}
	action := fmt.Sprintf("replay from=%q to=%q to_original=%t filter=%q limit=%d", from, p.To, p.ToOriginal, f.Get("filter"), p.Limit)
	done, rerr := s.insp.Replay(ctx, p)
	q := url.Values{"name": {from}}
	b, err := s.topicData(ctx, q)
	if err != nil {
		return err
	}
	d.Title, d.Nav, d.Body = "Topic "+displayName(from), "topics", b
	if rerr != nil {
		s.logWrite(r, d, action, "failed: "+rerr.Error())
		d.Error = rerr.Error()
		s.render(w, http.StatusBadRequest, "topic.html", d)
		return nil
	}
	if !p.DryRun {
		s.logWrite(r, d, action, "replayed "+count(len(done), "message"))
		s.redirect(w, r, "/topic", q, fmt.Sprintf("Replayed %s from %s.", count(len(done), "message"), displayName(from)))
		return nil
	}
	s.logWrite(r, d, action, "previewed (dry run): "+count(len(done), "message"))
	b.Replay = &replayPreview{To: p.To, ToOriginal: p.ToOriginal, Filter: f.Get("filter"), Limit: p.Limit, Messages: done}
	s.render(w, http.StatusOK, "topic.html", d)
	return nil
}

// deleteGroup previews or, confirmed, deletes an idle group's offsets.
func (s *uiServer) deleteGroup(ctx context.Context, w http.ResponseWriter, r *http.Request, d *pageData) error {
	group := r.PostForm.Get("group")
	confirm := r.PostForm.Get("confirm") == "yes"
	action := fmt.Sprintf("delete-group-offsets group=%q", group)
	var (
		n   int64
		err error
	)
	if confirm {
		n, err = s.insp.DeleteGroupOffsets(ctx, group)
	} else {
		n, err = withRollback(ctx, s, func(insp *admin.Inspector) (int64, error) { return insp.DeleteGroupOffsets(ctx, group) })
	}
	if err != nil {
		s.logWrite(r, d, action, "failed: "+err.Error())
		if errors.Is(err, admin.ErrOwnedByLiveSession) {
			return &httpError{status: http.StatusConflict, msg: err.Error()}
		}
		return err
	}
	if confirm {
		s.logWrite(r, d, action, "deleted "+count(int(n), "row"))
		s.redirect(w, r, "/", nil, fmt.Sprintf("Deleted the %d offsets rows of group %s.", n, displayName(group)))
		return nil
	}
	s.logWrite(r, d, action, "previewed (dry run): "+count(int(n), "row"))
	b, err := s.groupData(ctx, group, 0)
	if err != nil {
		return err
	}
	b.DeletePreview = &n
	d.Title, d.Nav, d.Body = "Group "+displayName(group), "overview", b
	s.render(w, http.StatusOK, "group.html", d)
	return nil
}

// count says "1 message", "2 messages".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
