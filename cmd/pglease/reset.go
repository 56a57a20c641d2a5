package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

var resetSpec = commandSpec{
	name:     "reset-offsets",
	summary:  "move a consumer group's positions on a topic",
	synopsis: "--group GROUP --topic TOPIC (--to-earliest | --to-latest | --to-time TIME | --skip POSITION [--partition N]) [--force] [--dry-run] [--json]",
	help: `Moves the acknowledged positions of every partition of one consumer group on
one topic, in one transaction, and prints each partition's old and new
position. Rows that do not exist yet are created, so a reset also sets where
a new group starts.

  --to-earliest  deliver the topic again from its first message
  --to-latest    skip every message visible now
  --to-time T    skip the messages stored before T (RFC 3339); with none
                 stored at or after T, as --to-latest
  --skip P       skip exactly one message, at position P (TRANSACTION:OFFSET,
                 as pglease lag and pglease messages show it) of partition
                 --partition (default 0): every other message is still
                 delivered. For a message that fails every time.

While a live Subscriber owns a partition of the topic the reset is refused
(exit status 1) and nothing changes. With --force it is applied anyway: the
owner is fenced (the row's epoch is bumped, so its later commits are
refused); it gives its partitions up after the messages in flight and claims
them again from the new positions. A message it handed out before the reset
may still be processed once. --dry-run shows what would change and rolls
back.`,
	new: func() subcommand { return &resetCmd{} },
}

type resetCmd struct {
	group, topic     onceString
	earliest, latest bool
	at               onceString
	force, dryRun    bool
	skip             onceString
	partition        int

	// Set by check.
	to     admin.ResetTo
	toName string     // earliest, latest or time
	toTime *time.Time // with toName "time"
	skipAt pglease.Position
}

// skipOutput is the JSON of pglease reset-offsets --skip.
type skipOutput struct {
	Group   string               `json:"group"`
	Topic   string               `json:"topic"`
	Force   bool                 `json:"force"`
	DryRun  bool                 `json:"dry_run"`
	Skipped admin.SkippedMessage `json:"skipped"`
}

// resetOutput is the JSON of pglease reset-offsets.
type resetOutput struct {
	Group  string     `json:"group"`
	Topic  string     `json:"topic"`
	To     string     `json:"to"`             // earliest, latest or time
	Time   *time.Time `json:"time,omitempty"` // with to: time
	Force  bool       `json:"force"`
	DryRun bool       `json:"dry_run"`
	// Partitions is what was done to each partition (with dry_run: what
	// would have been done).
	Partitions []admin.OffsetReset `json:"partitions"`
}

// refusedError is a reset refused because a live session owns a row; hint
// says what to do.
type refusedError struct {
	err  error
	hint string
}

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

func (c *resetCmd) flags(fs *flag.FlagSet) {
	fs.Var(&c.group, "group", "the consumer `GROUP` (required; --group \"\" is the group named \"\")")
	fs.Var(&c.topic, "topic", "the `TOPIC` (required)")
	fs.BoolVar(&c.earliest, "to-earliest", false, "deliver the topic again from its first message")
	fs.BoolVar(&c.latest, "to-latest", false, "skip every message visible now")
	fs.Var(&c.at, "to-time", "skip the messages stored before this RFC 3339 `TIME`, e.g. 2026-11-23T08:00:00Z")
	fs.Var(&c.skip, "skip", "skip exactly one message, at this `POSITION` (TRANSACTION:OFFSET) of --partition")
	fs.IntVar(&c.partition, "partition", 0, "the `PARTITION` of --skip")
	fs.BoolVar(&c.force, "force", false, "reset rows that a live Subscriber owns too, fencing it")
	fs.BoolVar(&c.dryRun, "dry-run", false, "show what would change, and change nothing")
}

func (c *resetCmd) check(*flag.FlagSet) error {
	if !c.group.set {
		return usageErrorf(`--group is required (--group "" selects the group named "")`)
	}
	if !c.topic.set || c.topic.value == "" {
		return usageErrorf("--topic is required")
	}
	var tos []string
	if c.earliest {
		tos = append(tos, "--to-earliest")
		c.to, c.toName = admin.ResetToEarliest, "earliest"
	}
	if c.latest {
		tos = append(tos, "--to-latest")
		c.to, c.toName = admin.ResetToLatest, "latest"
	}
	if c.at.set {
		tos = append(tos, "--to-time")
	}
	if c.skip.set {
		tos = append(tos, "--skip")
	}
	switch {
	case len(tos) == 0:
		return usageErrorf("say where to: one of --to-earliest, --to-latest, --to-time and --skip is required")
	case len(tos) > 1:
		return usageErrorf("give only one of --to-earliest, --to-latest, --to-time and --skip, not %s", strings.Join(tos, " and "))
	case c.skip.set:
		pos, err := parsePosition(c.skip.value)
		if err != nil {
			return usageErrorf("--skip: %v", err)
		}
		if c.partition < 0 || c.partition > math.MaxInt32 {
			return usageErrorf("--partition %d is not a partition", c.partition)
		}
		c.skipAt = pos
	case c.at.set:
		t, err := time.Parse(time.RFC3339, c.at.value)
		if err != nil {
			return usageErrorf("--to-time %q is not an RFC 3339 time such as 2026-11-23T08:00:00Z or 2026-11-23T09:00:00+01:00", c.at.value)
		}
		c.to, c.toName, c.toTime = admin.ResetToTime(t), "time", &t
	}
	return nil
}

func (c *resetCmd) run(ctx context.Context, e *cmdEnv) error {
	insp := e.insp
	if c.dryRun {
		// The reset runs in a transaction of its own (a savepoint in
		// this one), which is rolled back: its notification is not sent.
		tx, err := e.conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("begin the dry run: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if insp, err = admin.NewInspector(tx, e.tables); err != nil {
			return err
		}
	}
	if c.skip.set {
		return c.runSkip(ctx, e, insp)
	}
	resets, err := insp.ResetOffsets(ctx, admin.ResetOffsetsParams{
		ConsumerGroup: c.group.value,
		Topic:         c.topic.value,
		To:            c.to,
		Force:         c.force,
	})
	if errors.Is(err, admin.ErrOwnedByLiveSession) {
		return &refusedError{err: err, hint: "Nothing was changed. With --force the reset is applied anyway: the owners are fenced,\n" +
			"give their partitions up after the messages in flight and claim them again from the new positions."}
	}
	if err != nil {
		return err
	}
	if e.json {
		return writeJSON(e.stdout, resetOutput{
			Group: c.group.value, Topic: c.topic.value, To: c.toName, Time: c.toTime,
			Force: c.force, DryRun: c.dryRun, Partitions: nonNil(resets),
		})
	}
	return c.print(e.stdout, resets)
}

// runSkip moves the group past the one message of --skip.
func (c *resetCmd) runSkip(ctx context.Context, e *cmdEnv, insp *admin.Inspector) error {
	s, err := insp.SkipMessage(ctx, admin.SkipMessageParams{ConsumerGroup: c.group.value, Topic: c.topic.value,
		Partition: int32(c.partition), Position: c.skipAt, Force: c.force})
	if errors.Is(err, admin.ErrOwnedByLiveSession) {
		return &refusedError{err: err, hint: "Nothing was changed. With --force the message is skipped anyway: the owner is fenced,\n" +
			"gives the partition up after the messages in flight and claims it again, without that message."}
	}
	if err != nil {
		return err
	}
	if e.json {
		return writeJSON(e.stdout, skipOutput{Group: c.group.value, Topic: c.topic.value, Force: c.force, DryRun: c.dryRun, Skipped: s})
	}
	w := e.stdout
	what := fmt.Sprintf("consumer group %s skip message %s of topic %s partition %d", strconv.Quote(c.group.value),
		formatPosition(s.Position), strconv.Quote(c.topic.value), s.Partition)
	if c.dryRun {
		fmt.Fprintf(w, "Dry run, nothing was changed: would make %s.\n", what)
	} else {
		fmt.Fprintf(w, "Made %s; its position stays %s, the messages before and after it are delivered.\n", what, formatPosition(s.From))
	}
	if s.PreviousOwnerSession != uuid.Nil {
		verb := "Fenced"
		if c.dryRun {
			verb = "Would fence"
		}
		fmt.Fprintf(w, "%s %s (session %s) on partition %d; it claims it again without that message.\n",
			verb, s.PreviousOwner, s.PreviousOwnerSession, s.Partition)
	}
	return nil
}

func (c *resetCmd) print(w io.Writer, resets []admin.OffsetReset) error {
	to := c.toName
	if c.toTime != nil {
		to = "the first message stored at or after " + c.toTime.Format(time.RFC3339Nano)
	}
	if c.dryRun {
		fmt.Fprintf(w, "Dry run, nothing was changed: would reset consumer group %s on topic %s to %s.\n",
			strconv.Quote(c.group.value), strconv.Quote(c.topic.value), to)
	} else {
		fmt.Fprintf(w, "Reset consumer group %s on topic %s to %s.\n", strconv.Quote(c.group.value), strconv.Quote(c.topic.value), to)
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tPREVIOUS-OWNER")
	type owner struct {
		name    string
		session uuid.UUID
	}
	var (
		owners []owner
		parts  = map[owner][]string{}
	)
	for _, r := range resets {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", r.Partition, formatPosition(r.From), formatPosition(r.To), orDash(r.PreviousOwner))
		if r.PreviousOwnerSession != uuid.Nil {
			o := owner{r.PreviousOwner, r.PreviousOwnerSession}
			if parts[o] == nil {
				owners = append(owners, o)
			}
			parts[o] = append(parts[o], strconv.Itoa(int(r.Partition)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(owners) == 0 {
		return nil
	}
	verb := "Fenced"
	if c.dryRun {
		verb = "Would fence"
	}
	for _, o := range owners {
		p := parts[o]
		what := "partition " + p[0]
		if len(p) > 1 {
			what = "partitions " + strings.Join(p, ", ")
		}
		fmt.Fprintf(w, "%s %s (session %s) on %s.\n", verb, o.name, o.session, what)
	}
	fmt.Fprintln(w, "A fenced owner gives its partitions up after the messages in flight and claims them\nagain from the new positions.")
	return nil
}
