package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/watermill-pglease"
)

var moveShardSpec = commandSpec{
	name:     "move-shard",
	summary:  "on Citus, move a topic's shard to another worker without skipping or stalling",
	synopsis: "--topic TOPIC --to HOST:PORT [--margin N] [--dry-run] [--json]",
	help: `On the coordinator of a Citus cluster (the tables distributed by pglease migrate
--citus), moves the shard that holds TOPIC's messages and offsets, with the
shards co-located with it (other topics that hash alike), to the worker
HOST:PORT, as citus_move_shard_placement does with shard_transfer_mode
block_writes. First it raises that worker's position sequence to at least N
above the source worker's, and not at all when it is there already
(pglease.PrepareCitusShardMoveSQL; a setval, instant; N is at least 2^32):
positions come from the sequence of the topic's worker, and on a target whose
sequence is lower the messages published after the move would sort below the
consumer groups' positions and be skipped. The margin must exceed the
positions the source hands out while the move runs. Publishers of every topic
wait while the move runs (it blocks the shard's writes; the publish statement
reads the topics reference table). Subscribers of the moved topics find them
on another worker, log the move once at Info ("Shard of topic ... moved from
worker ... to worker ..."), claim their topics again from the committed
positions and may deliver again the message they had acknowledged and not
committed. Move shards one at a time with it rather than with
citus_rebalance_start. --dry-run prints the SQL and moves nothing. See
docs/scaling.md, "Moving shards".`,
	new: func() subcommand { return &moveShardCmd{} },
}

// moveShardCmd is pglease move-shard: on a Citus coordinator, moves the
// shard that holds a topic to another worker, raising that worker's
// position sequence first (pglease.PrepareCitusShardMoveSQL).
type moveShardCmd struct {
	topic  string
	to     string
	margin uint64
	dryRun bool

	host string
	port int
}

// moveShardOutput is the JSON of pglease move-shard.
type moveShardOutput struct {
	Topic  string `json:"topic"`
	Shard  int64  `json:"shard"`
	From   string `json:"from"`
	To     string `json:"to"`
	Margin uint64 `json:"margin"`
	DryRun bool   `json:"dry_run"`
	// Moved is false when the shard was on the target already.
	Moved bool `json:"moved"`
	// SQL is what the command runs (with dry_run: would run).
	SQL string `json:"sql,omitempty"`
}

func (c *moveShardCmd) unbounded() {}

func (c *moveShardCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.topic, "topic", "", "the topic whose shard moves (with its co-located shards: the topics that hash alike, their groups' offsets)")
	fs.StringVar(&c.to, "to", "", "the target worker, host:port as in pg_dist_node")
	fs.Uint64Var(&c.margin, "margin", 1000000, "positions the target's sequence is raised above the source worker's (when it is not there already; at least 2^32)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print what would run, and run nothing")
}

func (c *moveShardCmd) check(*flag.FlagSet) error {
	if c.topic == "" || c.to == "" {
		return errors.New("--topic and --to are required")
	}
	host, port, err := net.SplitHostPort(c.to)
	if err != nil {
		return fmt.Errorf("--to %q: want host:port: %w", c.to, err)
	}
	if c.port, err = strconv.Atoi(port); err != nil || c.port <= 0 || c.port > 65535 {
		return fmt.Errorf("--to %q: bad port", c.to)
	}
	c.host = host
	return nil
}

// moveSQL is the statement that moves the shard, blocking its writes
// while it copies (the logical replication mode needs a replica identity
// on every co-located table, and gains nothing for a rule that raises the
// target's position sequence right before).
const moveSQL = `SELECT pg_catalog.citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`

// moveShard raises the position sequence of the worker dstHost:dstPort
// to margin above the source's, when it is below
// (pglease.PrepareCitusShardMoveSQL), then moves shard from
// srcHost:srcPort there.
func moveShard(ctx context.Context, conn *pgx.Conn, shard int64, srcHost string, srcPort int, dstHost string, dstPort int, margin uint64) error {
	to := net.JoinHostPort(dstHost, strconv.Itoa(dstPort))
	if _, err := conn.Exec(ctx, pglease.PrepareCitusShardMoveSQL(srcHost, srcPort, dstHost, dstPort, margin)); err != nil {
		return fmt.Errorf("raise the position sequence of %s: %w", to, err)
	}
	if _, err := conn.Exec(ctx, moveSQL, shard, srcHost, srcPort, dstHost, dstPort); err != nil {
		return fmt.Errorf("move shard %d from %s to %s: %w", shard, net.JoinHostPort(srcHost, strconv.Itoa(srcPort)), to, err)
	}
	return nil
}

func (c *moveShardCmd) run(ctx context.Context, e *cmdEnv) error {
	messages := tablesOf(e.tables).Messages
	out := moveShardOutput{Topic: c.topic, To: net.JoinHostPort(c.host, strconv.Itoa(c.port)), Margin: c.margin, DryRun: c.dryRun}
	var (
		srcHost string
		srcPort int
	)
	err := e.conn.QueryRow(ctx, `SELECT p.shardid, p.nodename, p.nodeport FROM pg_catalog.pg_dist_shard_placement p
WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::text::regclass, $2::text)`, messages, c.topic).
		Scan(&out.Shard, &srcHost, &srcPort)
	if err != nil {
		return fmt.Errorf("find the shard of topic %q (is this the coordinator of a Citus cluster, the tables distributed?): %w", c.topic, err)
	}
	out.From = net.JoinHostPort(srcHost, strconv.Itoa(srcPort))
	prepare := pglease.PrepareCitusShardMoveSQL(srcHost, srcPort, c.host, c.port, c.margin)
	out.SQL = prepare + ";\n" + fmt.Sprintf("SELECT pg_catalog.citus_move_shard_placement(%d, %s, %d, %s, %d, shard_transfer_mode => 'block_writes');\n",
		out.Shard, quoteLiteral(srcHost), srcPort, quoteLiteral(c.host), c.port)
	if out.From == out.To {
		out.SQL = ""
	} else if !c.dryRun {
		if err := moveShard(ctx, e.conn, out.Shard, srcHost, srcPort, c.host, c.port, c.margin); err != nil {
			return err
		}
		out.Moved = true
	}
	if e.json {
		return writeJSON(e.stdout, out)
	}
	switch {
	case out.From == out.To:
		fmt.Fprintf(e.stdout, "Topic %s is on %s already (shard %d): nothing to move.\n", displayName(c.topic), out.To, out.Shard)
	case c.dryRun:
		fmt.Fprintf(e.stdout, "-- Topic %s: shard %d on %s; pglease move-shard would run what follows.\n%s", displayName(c.topic), out.Shard, out.From, out.SQL)
	default:
		fmt.Fprintf(e.stdout, "Moved shard %d (topic %s and its co-located shards) from %s to %s, its position sequence raised first.\n",
			out.Shard, displayName(c.topic), out.From, out.To)
	}
	return nil
}
