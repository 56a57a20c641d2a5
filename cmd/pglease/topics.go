package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/pglease/watermill-pglease/admin"
)

var topicsSpec = commandSpec{
	name:     "topics",
	summary:  "topics with their partitions, retention, key window, consumer groups and newest message",
	synopsis: "[--limit N] [--after TOPIC | --all] [--json]",
	help: `Lists the topics that have messages, settings (pglease.CreateTopic) or
offsets rows, in byte order of their names: each one's partition count, its
retention, its key window, the number of consumer groups with offsets on it
and when its newest message was stored (UTC). It lists a page of --limit
topics (100 by default), then how many there are and, when more follow, the
command that lists the next page (--after the last topic listed). --all
lists every page, one at a time.

KEY-WINDOW is how long the topic recognises an idempotency key, so how long
after a Publish a retry of it is left out: the longest of its retention, its
TopicConfig.KeyWindow and a day. Marked *, the topic asks for a longer one
that the maintainer has not made the partitions of yet: its keys are kept
for a day until it has. "-": the schema has no idempotency keys.

With --json it prints an object: "topics" (the page), "total" (every
topic) and "next" (the --after of the next page; absent on the last). A
topic has "key_window_ns" (its KeyWindow as set, 0 for none),
"effective_key_window_ns" (KEY-WINDOW) and, while one waits for the
maintainer, "pending_key_window_ns".`,
	new: func() subcommand { return &topicsCmd{} },
}

type topicsCmd struct {
	limit int
	after onceString
	all   bool
}

func (c *topicsCmd) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.limit, "limit", admin.DefaultTopicsPage, fmt.Sprintf("list at most `N` topics (1 to %d)", admin.MaxTopicsPage))
	fs.Var(&c.after, "after", "list the topics after this `TOPIC` (the next page: the line at the end names it)")
	fs.BoolVar(&c.all, "all", false, "list every topic, a page of --limit at a time")
}

func (c *topicsCmd) check(*flag.FlagSet) error {
	if c.limit < 1 || c.limit > admin.MaxTopicsPage {
		return usageErrorf("--limit must be 1 to %d, got %d", admin.MaxTopicsPage, c.limit)
	}
	if c.all && c.after.set {
		return usageErrorf("--all lists from the first topic: it does not go with --after")
	}
	return nil
}

func (c *topicsCmd) run(ctx context.Context, e *cmdEnv) error {
	p := admin.TopicsParams{Limit: c.limit}
	if c.after.set {
		p.After = &c.after.value
	}
	page, err := e.insp.TopicsPage(ctx, p)
	if err != nil {
		return err
	}
	if !c.all {
		if e.json {
			page.Topics = nonNil(page.Topics)
			return writeJSON(e.stdout, page)
		}
		printTopics(e, page, p.After)
		return nil
	}
	// Every page, one at a time: printed as a table, a page is not kept.
	all := admin.TopicPage{Topics: []admin.TopicInfo{}}
	for {
		if e.json {
			all.Topics = append(all.Topics, page.Topics...)
		} else {
			printTopicsTable(e, page.Topics)
		}
		all.Total = page.Total
		if page.Next == nil {
			break
		}
		p.After = page.Next
		if page, err = e.insp.TopicsPage(ctx, p); err != nil {
			return err
		}
	}
	if e.json {
		return writeJSON(e.stdout, all)
	}
	if all.Total == 0 {
		fmt.Fprintln(e.stdout, "No topics: nothing was published, created or subscribed to yet.")
		return nil
	}
	fmt.Fprintf(e.stdout, "%s in all.\n", count(int(all.Total), "topic"))
	return nil
}

// printTopics prints a page of topics as a table and the line that counts
// them and names the next page (after: the page's --after; nil for the
// first).
func printTopics(e *cmdEnv, page admin.TopicPage, after *string) {
	if page.Total == 0 {
		fmt.Fprintln(e.stdout, "No topics: nothing was published, created or subscribed to yet.")
		return
	}
	printTopicsTable(e, page.Topics)
	switch {
	case len(page.Topics) == 0:
		fmt.Fprintf(e.stdout, "No topics after %s; %s in all.\n", displayName(deref(after)), count(int(page.Total), "topic"))
	case page.Next != nil:
		fmt.Fprintf(e.stdout, "Listed %d of %s; the next page: pglease topics --after %s\n",
			len(page.Topics), count(int(page.Total), "topic"), shellQuote(*page.Next))
	case after != nil:
		fmt.Fprintf(e.stdout, "Listed %d of %s: the last page.\n", len(page.Topics), count(int(page.Total), "topic"))
	default:
		fmt.Fprintf(e.stdout, "%s.\n", count(int(page.Total), "topic"))
	}
}

// printTopicsTable prints topics as a table (nothing for none), and, when
// a topic's longer key window waits for the maintainer, the line that
// says what its * means.
func printTopicsTable(e *cmdEnv, topics []admin.TopicInfo) {
	if len(topics) == 0 {
		return
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tRETENTION\tKEY-WINDOW\tGROUPS\tNEWEST")
	pending := false
	for _, t := range topics {
		retention := "-"
		if t.Retention > 0 {
			retention = t.Retention.String()
		}
		pending = pending || t.PendingKeyWindow > 0
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", displayName(t.Topic), t.Partitions, retention, keyWindow(t), t.Groups, newest(t))
	}
	_ = tw.Flush()
	if pending {
		fmt.Fprintln(e.stdout, pendingKeyWindowNote)
	}
}

// pendingKeyWindowNote is the line under a table of topics one of which
// is marked *.
const pendingKeyWindowNote = `* The topic asks for a longer key window (pending_key_window_ns in --json) whose partitions the
  maintainer (one of the running Subscribers) has not made yet: until it has, its keys are kept for a day.`

// keyWindow is the KEY-WINDOW cell of t: its effective key window, marked
// * while a longer one waits for the maintainer; "-" without keys.
func keyWindow(t admin.TopicInfo) string {
	switch {
	case t.EffectiveKeyWindow == 0:
		return "-"
	case t.PendingKeyWindow > 0:
		return t.EffectiveKeyWindow.String() + "*"
	default:
		return t.EffectiveKeyWindow.String()
	}
}

// shellQuote quotes s for a POSIX shell unless it is a plain word.
func shellQuote(s string) string {
	plain := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("._-/:=@+", r)
	}) < 0
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func newest(t admin.TopicInfo) string {
	if t.NewestAt == nil {
		return "-"
	}
	return formatTime(*t.NewestAt)
}
