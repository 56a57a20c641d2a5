package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

var replaySpec = commandSpec{
	name:     "replay",
	summary:  "move poisoned or dead-lettered messages back to their topic (or to another)",
	synopsis: "--from POISON_TOPIC (--to TOPIC | --to-original) [--filter-metadata KEY=VALUE]... [--limit N] [--dry-run] [--json]",
	help: `Moves messages out of a topic (a poison topic of Watermill's PoisonQueue
middleware, or the dead-letter topic of a failure policy) and publishes them
again, oldest first, in one transaction: each is deleted from --from and
published, with its UUID, payload and metadata, to --to, or with
--to-original to the topic that the PoisonQueue recorded in its metadata
(` + admin.PoisonedTopicKey + `) or, without it, the one the dead-letter move recorded
(` + pglease.DeadLetterSourceTopicMetadata + `); messages with neither stay where they are.
All or nothing. Run twice, it publishes each message once: the second run
finds them gone. Consumer groups of --from skip the moved messages.

  --filter-metadata KEY=VALUE  only messages with this metadata; repeat to
                               require several
  --limit N                    move at most N messages (default ` + strconv.Itoa(admin.DefaultReplayLimit) + `)
  --dry-run                    show what would be moved, and move nothing`,
	new: func() subcommand { return &replayCmd{} },
}

type replayCmd struct {
	from, to   onceString
	toOriginal bool
	filters    stringList
	limit      int
	dryRun     bool

	metadata map[string]string // set by check
}

// replayOutput is the JSON of pglease replay.
type replayOutput struct {
	From       string                  `json:"from"`
	To         string                  `json:"to,omitempty"`
	ToOriginal bool                    `json:"to_original"`
	Filter     map[string]string       `json:"filter_metadata,omitempty"`
	DryRun     bool                    `json:"dry_run"`
	Messages   []admin.ReplayedMessage `json:"messages"`
}

func (c *replayCmd) flags(fs *flag.FlagSet) {
	fs.Var(&c.from, "from", "the `TOPIC` to take the messages from (required)")
	fs.Var(&c.to, "to", "publish them to this `TOPIC`")
	fs.BoolVar(&c.toOriginal, "to-original", false, "publish each to the topic its "+admin.PoisonedTopicKey+" metadata names")
	fs.Var(&c.filters, "filter-metadata", "only messages with this `KEY=VALUE` metadata; repeat for several")
	fs.IntVar(&c.limit, "limit", admin.DefaultReplayLimit, "move at most `N` messages")
	fs.BoolVar(&c.dryRun, "dry-run", false, "show what would be moved, and move nothing")
}

func (c *replayCmd) check(*flag.FlagSet) error {
	if !c.from.set || c.from.value == "" {
		return usageErrorf("--from is required")
	}
	switch {
	case c.to.set && c.toOriginal:
		return usageErrorf("give --to or --to-original, not both")
	case !c.to.set && !c.toOriginal:
		return usageErrorf("say where to: --to TOPIC or --to-original")
	case c.to.set && c.to.value == "":
		return usageErrorf("--to needs a topic")
	case c.to.value == c.from.value:
		return usageErrorf("--to is --from (%q)", c.from.value)
	case c.limit < 1:
		return usageErrorf("--limit must be at least 1, got %d", c.limit)
	}
	for _, f := range c.filters.values {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return usageErrorf("--filter-metadata %q is not KEY=VALUE", f)
		}
		if c.metadata == nil {
			c.metadata = map[string]string{}
		}
		if old, dup := c.metadata[k]; dup && old != v {
			return usageErrorf("--filter-metadata gives %s twice (%q and %q)", k, old, v)
		}
		c.metadata[k] = v
	}
	return nil
}

func (c *replayCmd) run(ctx context.Context, e *cmdEnv) error {
	done, err := e.insp.Replay(ctx, admin.ReplayParams{
		From: c.from.value, To: c.to.value, ToOriginal: c.toOriginal,
		Metadata: c.metadata, Limit: c.limit, DryRun: c.dryRun,
	})
	if err != nil {
		return err
	}
	if e.json {
		return writeJSON(e.stdout, replayOutput{From: c.from.value, To: c.to.value, ToOriginal: c.toOriginal,
			Filter: c.metadata, DryRun: c.dryRun, Messages: nonNil(done)})
	}
	verb := "Replayed"
	if c.dryRun {
		verb = "Dry run, nothing was changed: would replay"
	}
	if len(done) == 0 {
		fmt.Fprintf(e.stdout, "No messages to replay on topic %s.\n", displayName(c.from.value))
		return nil
	}
	fmt.Fprintf(e.stdout, "%s %s from topic %s:\n", verb, count(len(done), "message"), displayName(c.from.value))
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "UUID\tPOSITION\tSTORED\tTO\tREASON")
	for _, m := range done {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", displayName(m.UUID), formatPosition(m.Position), formatTime(m.CreatedAt),
			displayName(m.To), orDash(abbreviate(m.Metadata["reason_poisoned"], 60)))
	}
	return tw.Flush()
}
