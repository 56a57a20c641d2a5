package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/pglease/watermill-pglease/admin"
)

var lagSpec = commandSpec{
	name:     "lag",
	summary:  "owner, position and lag of each (group, topic, partition)",
	synopsis: "[--group GROUP]... [--topic TOPIC]... [--json]",
	help: `Shows, for each (consumer group, topic, partition) row, the live session's
owner process, the acknowledged position (TRANSACTION:OFFSET; 0:0 is the
beginning, TRANSACTION:0 is after every message of transactions before
TRANSACTION), the number of messages after it (LAG) and the age in seconds of
the oldest of them (LAG-SECONDS). PENDING (shown when a row has it) means that
committed messages wait for an open transaction that published to the
partition before them (on Citus: behind the worker's xmin horizon): see
pglease status. WAITING
(shown when a row has it) counts the messages that failed and wait for their
next attempt under a failure policy (SubscriberConfig.Retry), with the most
attempts counted among them (ATTEMPTS) and the earliest next attempt
(NEXT-ATTEMPT, on the database's clock).

--group and --topic may be repeated to select several; names are taken as
they are (no comma splitting), and --group "" selects the group named "".`,
	new: func() subcommand { return &lagCmd{} },
}

type lagCmd struct {
	groups, topics stringList
	byGroup        bool
}

func (c *lagCmd) flags(fs *flag.FlagSet) {
	fs.Var(&c.groups, "group", "show only this consumer `GROUP`; repeat for several (default: all)")
	fs.Var(&c.topics, "topic", "show only this `TOPIC`; repeat for several (default: all)")
	fs.BoolVar(&c.byGroup, "by-group", false, "one line per consumer group, as the console's overview: live members, rows, owned rows, total lag, oldest lag, pending")
}

func (c *lagCmd) check(*flag.FlagSet) error { return nil }

func (c *lagCmd) run(ctx context.Context, e *cmdEnv) error {
	rows, err := e.insp.Lag(ctx, admin.LagFilter{ConsumerGroups: c.groups.values, Topics: c.topics.values})
	if err != nil {
		return err
	}
	if c.byGroup {
		return c.printGroups(ctx, e, rows)
	}
	if e.json {
		return writeJSON(e.stdout, nonNil(rows))
	}
	if len(rows) == 0 {
		fmt.Fprintln(e.stdout, "No offsets rows: no consumer group has subscribed to these topics yet.")
		return nil
	}
	pending, waiting := false, false
	for _, l := range rows {
		pending = pending || l.Pending
		waiting = waiting || l.Waiting > 0
	}
	tw := newTable(e.stdout)
	fmt.Fprint(tw, "GROUP\tTOPIC\tPARTITION\tOWNER\tPOSITION\tLAG\tLAG-SECONDS")
	if pending {
		fmt.Fprint(tw, "\tPENDING")
	}
	if waiting {
		fmt.Fprint(tw, "\tWAITING\tATTEMPTS\tNEXT-ATTEMPT")
	}
	fmt.Fprintln(tw)
	for _, l := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s", displayName(l.ConsumerGroup), displayName(l.Topic), l.Partition,
			orDash(l.Owner), formatPosition(l.Position), l.Lag, formatLagSeconds(l))
		if pending {
			fmt.Fprintf(tw, "\t%s", yesNo(l.Pending))
		}
		if waiting {
			next := "-"
			if l.NextAttempt != nil {
				next = l.NextAttempt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "\t%d\t%d\t%s", l.Waiting, l.Attempts, next)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pending {
		fmt.Fprintln(e.stdout, "\nPENDING: committed messages wait behind an older open transaction; see pglease status.")
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printGroups prints the lag rows folded per consumer group, with the
// group's live members: what the console's overview shows.
func (c *lagCmd) printGroups(ctx context.Context, e *cmdEnv, rows []admin.LagInfo) error {
	sessions, err := e.insp.Sessions(ctx)
	if err != nil {
		return err
	}
	groups := summarize(rows, sessions)
	if len(c.groups.values) > 0 || len(c.topics.values) > 0 {
		// Only the groups with rows of the filter, not every live member's.
		groups = slices.DeleteFunc(groups, func(g groupSummary) bool { return g.Rows == 0 })
	}
	if e.json {
		return writeJSON(e.stdout, nonNil(groups))
	}
	if len(groups) == 0 {
		fmt.Fprintln(e.stdout, "No consumer groups.")
		return nil
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "GROUP\tMEMBERS\tROWS\tOWNED\tLAG\tMAX-LAG-SECONDS\tPENDING")
	for _, g := range groups {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", displayName(g.Name), g.Members, g.Rows, g.Owned, g.Lag,
			formatLagSeconds(admin.LagInfo{Lag: g.Lag, LagSeconds: g.MaxLagSeconds}), yesNo(g.Pending))
	}
	return tw.Flush()
}
