package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
)

var rebalanceSpec = commandSpec{
	name:     "rebalance",
	summary:  "on Citus, make the rebalancer's moves one at a time, each target's position sequence raised first",
	synopsis: "[--margin N] [--dry-run] [--json]",
	help: `On the coordinator of a Citus cluster, makes the moves that Citus's rebalancer
plans for the messages table and the shards co-located with it
(get_rebalance_table_shards_plan: to balance the workers, or to empty a
worker marked shouldhaveshards false), one at a time, each as pglease
move-shard does: the target's position sequence raised to at least N above
the source worker's first (a setval; N at least 2^32), then
citus_move_shard_placement with block_writes. Use it instead of
citus_rebalance_start, which runs its moves in the background without that
step: a topic moved to a worker whose sequence is lower would have its new
messages skipped. --dry-run prints the moves.`,
	new: func() subcommand { return &rebalanceCmd{} },
}

// rebalanceCmd is pglease rebalance: the moves of Citus's rebalancer
// (get_rebalance_table_shards_plan) for the messages table's co-located
// shards, one at a time, each target's position sequence raised first,
// which citus_rebalance_start cannot do between its moves.
type rebalanceCmd struct {
	margin uint64
	dryRun bool
}

// rebalanceMove is one move of pglease rebalance.
type rebalanceMove struct {
	Shard int64  `json:"shard"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// rebalanceOutput is the JSON of pglease rebalance.
type rebalanceOutput struct {
	Margin uint64          `json:"margin"`
	DryRun bool            `json:"dry_run"`
	Moves  []rebalanceMove `json:"moves"`
}

func (c *rebalanceCmd) unbounded() {}

func (c *rebalanceCmd) flags(fs *flag.FlagSet) {
	fs.Uint64Var(&c.margin, "margin", 1000000, "positions each target's sequence is raised above its source worker's (when it is not there already; at least 2^32)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print the moves, and move nothing")
}

func (c *rebalanceCmd) check(*flag.FlagSet) error { return nil }

func (c *rebalanceCmd) run(ctx context.Context, e *cmdEnv) error {
	messages := tablesOf(e.tables).Messages
	type move struct {
		shard            int64
		srcHost, dstHost string
		srcPort, dstPort int
	}
	rows, err := e.conn.Query(ctx, `SELECT shardid, sourcename, sourceport, targetname, targetport
FROM pg_catalog.get_rebalance_table_shards_plan(relation => $1::text::regclass)`, messages)
	if err != nil {
		return fmt.Errorf("read the rebalancer's plan (is this the coordinator of a Citus cluster, the tables distributed?): %w", err)
	}
	plan, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (move, error) {
		var m move
		err := row.Scan(&m.shard, &m.srcHost, &m.srcPort, &m.dstHost, &m.dstPort)
		return m, err
	})
	if err != nil {
		return fmt.Errorf("read the rebalancer's plan: %w", err)
	}
	out := rebalanceOutput{Margin: c.margin, DryRun: c.dryRun, Moves: []rebalanceMove{}}
	for _, m := range plan {
		mv := rebalanceMove{Shard: m.shard, From: net.JoinHostPort(m.srcHost, strconv.Itoa(m.srcPort)),
			To: net.JoinHostPort(m.dstHost, strconv.Itoa(m.dstPort))}
		if !c.dryRun {
			if err := moveShard(ctx, e.conn, m.shard, m.srcHost, m.srcPort, m.dstHost, m.dstPort, c.margin); err != nil {
				return fmt.Errorf("%w (%d of %d moves done)", err, len(out.Moves), len(plan))
			}
		}
		out.Moves = append(out.Moves, mv)
	}
	if e.json {
		return writeJSON(e.stdout, out)
	}
	switch {
	case len(plan) == 0:
		fmt.Fprintln(e.stdout, "The shards are balanced: nothing to move.")
	case c.dryRun:
		for _, mv := range out.Moves {
			fmt.Fprintf(e.stdout, "Would move shard %d from %s to %s.\n", mv.Shard, mv.From, mv.To)
		}
	default:
		for _, mv := range out.Moves {
			fmt.Fprintf(e.stdout, "Moved shard %d from %s to %s.\n", mv.Shard, mv.From, mv.To)
		}
		fmt.Fprintf(e.stdout, "%d moves, each target's position sequence raised first.\n", len(out.Moves))
	}
	return nil
}
