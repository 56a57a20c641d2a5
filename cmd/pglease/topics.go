package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/pglease/watermill-pglease/admin"
)

type topicsCmd struct{}

func (c *topicsCmd) flags(*flag.FlagSet)       {}
func (c *topicsCmd) check(*flag.FlagSet) error { return nil }

func (c *topicsCmd) run(ctx context.Context, e *cmdEnv) error {
	topics, err := e.insp.Topics(ctx)
	if err != nil {
		return err
	}
	if e.json {
		return writeJSON(e.stdout, nonNil(topics))
	}
	if len(topics) == 0 {
		fmt.Fprintln(e.stdout, "No topics: nothing was published, created or subscribed to yet.")
		return nil
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tRETENTION\tGROUPS\tNEWEST")
	for _, t := range topics {
		retention := "-"
		if t.Retention > 0 {
			retention = t.Retention.String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", displayName(t.Topic), t.Partitions, retention, t.Groups, newest(t))
	}
	return tw.Flush()
}

func newest(t admin.TopicInfo) string {
	if t.NewestAt == nil {
		return "-"
	}
	return formatTime(*t.NewestAt)
}
