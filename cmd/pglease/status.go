package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/pglease/watermill-pglease/admin"
)

var statusSpec = commandSpec{
	name:     "status",
	summary:  "the sessions (one per live Subscriber), what holds delivery back, and the xmin horizon",
	synopsis: "[--warn-after DURATION] [--json]",
	help: `Shows every consumer session (one per Subscriber: its group, owner process,
age, time left without a heartbeat and the (group, topic, partition) rows it
owns), then what holds delivery back: the open publishers. A transaction
that published and has not ended holds back the messages stored after its
own, in the partitions it published to only; on Citus each is listed on
the worker where it published, with the coordinator's session whose
transaction it is. (On Citus tables distributed by an earlier release,
whose positions are the workers' transaction ids, the xmin horizon of each
worker instead: no message of a transaction at or above it is delivered
yet, on any topic of that worker.) When such a transaction is older than
--warn-after, it says so and names it.`,
	new: func() subcommand { return &statusCmd{} },
}

const (
	// defaultWarnAfter is the age from which status reports the oldest
	// writing transaction as holding delivery back: pglease's own
	// transactions last milliseconds.
	defaultWarnAfter = 5 * time.Second
	// queryWidth is how much of the holder's query status prints.
	queryWidth = 60
)

type statusCmd struct {
	warnAfter time.Duration
}

// statusOutput is the JSON of pglease status.
type statusOutput struct {
	Sessions []admin.SessionInfo `json:"sessions"`
	Horizon  admin.Horizon       `json:"horizon"`
	// Waiting are the rows with messages waiting for their next attempt
	// under a failure policy.
	Waiting []admin.WaitingInfo `json:"waiting"`
	// DeliveryHeldBack reports a horizon holder older than --warn-after;
	// nil when the holder's age cannot be read (a role without
	// pg_read_all_stats does not see when other roles' transactions
	// began).
	DeliveryHeldBack *bool `json:"delivery_held_back"`
}

// newStatusOutput judges what holds delivery back against warnAfter: the
// oldest open publisher where delivery is held back per topic, else the
// horizon's holder.
func newStatusOutput(sessions []admin.SessionInfo, h admin.Horizon, warnAfter time.Duration) statusOutput {
	out := statusOutput{Sessions: nonNil(sessions), Horizon: h}
	holder := deliveryHolder(h)
	held := false
	switch {
	case holder == nil:
	case !holderAgeKnown(holder):
		return out
	default:
		held = holder.Age >= warnAfter
	}
	out.DeliveryHeldBack = &held
	return out
}

// deliveryHolder is the transaction that holds delivery back the longest:
// the oldest open publisher where delivery is held back per topic, else the
// horizon's holder; nil when none.
func deliveryHolder(h admin.Horizon) *admin.HorizonHolder {
	if !h.PerTopic {
		return h.Holder
	}
	if len(h.Publishers) == 0 {
		return nil
	}
	return &h.Publishers[0].HorizonHolder
}

// holderAgeKnown reports whether the holder's start time could be read:
// pg_stat_activity hides it (and the state and query) of other roles'
// backends from a role without pg_read_all_stats. A prepared
// transaction's is always known.
func holderAgeKnown(hh *admin.HorizonHolder) bool {
	return hh.GID != "" || !hh.XactStart.IsZero()
}

func (c *statusCmd) flags(fs *flag.FlagSet) {
	fs.DurationVar(&c.warnAfter, "warn-after", defaultWarnAfter,
		"say that delivery is held back when the oldest writing transaction is older than this `DURATION`")
}

func (c *statusCmd) check(*flag.FlagSet) error {
	if c.warnAfter < 0 {
		return usageErrorf("--warn-after must not be negative, got %s", c.warnAfter)
	}
	return nil
}

func (c *statusCmd) run(ctx context.Context, e *cmdEnv) error {
	sessions, err := e.insp.Sessions(ctx)
	if err != nil {
		return err
	}
	h, err := e.insp.Horizon(ctx)
	if err != nil {
		return err
	}
	waiting, err := e.insp.Waiting(ctx, admin.LagFilter{})
	if err != nil {
		return err
	}
	out := newStatusOutput(sessions, h, c.warnAfter)
	out.Waiting = nonNil(waiting)
	if e.json {
		return writeJSON(e.stdout, out)
	}
	printSessions(e.stdout, out.Sessions)
	if len(out.Waiting) > 0 {
		fmt.Fprintln(e.stdout)
		printWaiting(e.stdout, out.Waiting)
	}
	fmt.Fprintln(e.stdout)
	printHorizon(e.stdout, out, c.warnAfter)
	return nil
}

func printSessions(w io.Writer, sessions []admin.SessionInfo) {
	live := 0
	for _, s := range sessions {
		if s.Alive {
			live++
		}
	}
	if len(sessions) == 0 {
		fmt.Fprintln(w, "Sessions: none (no Subscriber is running)")
		return
	}
	if live == len(sessions) {
		fmt.Fprintf(w, "Sessions: %d live\n", live)
	} else {
		fmt.Fprintf(w, "Sessions: %d live, %d expired (kept until taken over or cleaned up)\n", live, len(sessions)-live)
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "GROUP\tSESSION\tOWNER\tAGE\tEXPIRES-IN\tROWS")
	var maintainer *admin.SessionInfo
	for i, s := range sessions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", displayName(s.ConsumerGroup), s.ID, orDash(s.Owner),
			formatDuration(s.Age), formatExpiresIn(s.ExpiresIn), s.RowsHeld)
		if s.Maintainer {
			maintainer = &sessions[i]
		}
	}
	_ = tw.Flush()
	switch {
	case maintainer == nil:
		fmt.Fprintln(w, "Maintainer: none (delayed messages wait and retention removes nothing until a Subscriber is elected)")
	case !maintainer.Alive:
		fmt.Fprintf(w, "Maintainer: session %s of %s, expired: another Subscriber takes over\n", maintainer.ID, orDash(maintainer.Owner))
	default:
		fmt.Fprintf(w, "Maintainer: session %s of %s\n", maintainer.ID, orDash(maintainer.Owner))
	}
}

// printWaiting prints the rows whose messages wait for their next attempt.
func printWaiting(w io.Writer, rows []admin.WaitingInfo) {
	n := 0
	for _, r := range rows {
		n += r.Waiting
	}
	fmt.Fprintf(w, "Waiting for a retry (failure policy): %d message(s); later messages of their keys wait behind them\n", n)
	tw := newTable(w)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tWAITING\tATTEMPTS\tFIRST-FAILURE\tNEXT-ATTEMPT")
	for _, r := range rows {
		first, next := "-", "-"
		if r.WaitingSince != nil {
			first = formatTime(*r.WaitingSince)
		}
		if r.NextAttempt != nil {
			next = formatTime(*r.NextAttempt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", displayName(r.ConsumerGroup), displayName(r.Topic), r.Partition,
			r.Waiting, r.Attempts, first, next)
	}
	_ = tw.Flush()
}

// printPublishers prints the open publishers and whether they hold
// delivery back. On Citus each is a transaction on one worker, named by
// the coordinator's session whose transaction it is where known.
func printPublishers(w io.Writer, out statusOutput, warnAfter time.Duration) {
	pubs := out.Horizon.Publishers
	if len(pubs) == 0 {
		fmt.Fprintln(w, "Open publishers: none: no topic is held back")
		return
	}
	fmt.Fprintln(w, "Open publishers: each holds back the messages stored after its own, in the partitions it published to")
	citus := false
	for _, p := range pubs {
		citus = citus || p.Node != ""
	}
	tw := newTable(w)
	if citus {
		fmt.Fprintln(tw, "PID\tAPPLICATION\tSTATE\tAGE\tWORKER\tWORKER-PID\tHOLDS")
	} else {
		fmt.Fprintln(tw, "PID\tAPPLICATION\tSTATE\tAGE\tHOLDS")
	}
	for _, p := range pubs {
		s := publisherSession(p)
		who, age := strconv.Itoa(s.PID), "unknown"
		if p.GID != "" {
			who = "prepared " + strconv.Quote(p.GID)
		} else if citus && p.Client == nil {
			who = "-"
		}
		if holderAgeKnown(&p.HorizonHolder) {
			age = formatDuration(p.Age)
		}
		if citus {
			workerPID := strconv.Itoa(p.PID)
			if p.GID != "" {
				workerPID = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", who, orDash(s.ApplicationName), orDash(s.State), age,
				orDash(p.Node), workerPID, formatHeld(p))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", who, orDash(s.ApplicationName), orDash(s.State), age, formatHeld(p))
	}
	_ = tw.Flush()
	oldest := pubs[0]
	who, end := publisherWho(oldest)
	switch {
	case out.DeliveryHeldBack == nil:
		fmt.Fprintf(w, "Delivery may be held back on %s: %s published there, for how long this role cannot see.\n", formatHeld(oldest), who)
	case *out.DeliveryHeldBack:
		fmt.Fprintf(w, "DELIVERY IS HELD BACK on %s: %s has kept a transaction that published there open for %s.\n",
			formatHeld(oldest), who, formatDuration(oldest.Age))
		fmt.Fprintf(w, "Messages stored after its own are not delivered there until it ends; other topics are not held back:\n%s\n", end)
	default:
		fmt.Fprintf(w, "Delivery is not held back: the oldest open publisher is %s old (less than --warn-after %s).\n",
			formatDuration(oldest.Age), warnAfter)
	}
}

// publisherSession is the session to name for an open publisher: on
// Citus the coordinator's session whose transaction it is, where known;
// else its backend (on Citus, on the worker).
func publisherSession(p admin.OpenPublisher) admin.HorizonHolder {
	if p.Client != nil {
		return *p.Client
	}
	return p.HorizonHolder
}

// publisherWho names an open publisher in a sentence, and says how to end
// its transaction.
func publisherWho(p admin.OpenPublisher) (who, end string) {
	switch {
	case p.GID != "" && p.Node != "":
		return fmt.Sprintf("prepared transaction %s on worker %s", strconv.Quote(p.GID), p.Node),
			fmt.Sprintf("on worker %s, COMMIT PREPARED or ROLLBACK PREPARED %s.", p.Node, quoteLiteral(p.GID))
	case p.GID != "":
		return "prepared transaction " + strconv.Quote(p.GID),
			fmt.Sprintf("COMMIT PREPARED or ROLLBACK PREPARED %s.", quoteLiteral(p.GID))
	case p.Client != nil:
		return fmt.Sprintf("pid %d (on worker %s as pid %d)", p.Client.PID, p.Node, p.PID),
			fmt.Sprintf("commit or roll it back, or end it on the coordinator with\nSELECT pg_terminate_backend(%d).", p.Client.PID)
	case p.Node != "":
		return fmt.Sprintf("pid %d on worker %s", p.PID, p.Node),
			fmt.Sprintf("commit or roll it back, or end it on worker %s with\nSELECT pg_terminate_backend(%d).", p.Node, p.PID)
	}
	return fmt.Sprintf("pid %d", p.PID), fmt.Sprintf("commit or roll it back, or end it with\nSELECT pg_terminate_backend(%d).", p.PID)
}

// formatHeld names the partitions an open publisher holds back.
func formatHeld(p admin.OpenPublisher) string {
	const shown = 3
	var names []string
	for k, tp := range p.Partitions {
		if k == shown {
			break
		}
		names = append(names, fmt.Sprintf("%s/%d", strconv.Quote(tp.Topic), tp.Partition))
	}
	s := strings.Join(names, ", ")
	if rest := p.Held - len(names); rest > 0 {
		more := ""
		if s != "" {
			s += " and "
			more = "more "
		}
		s += fmt.Sprintf("%d %spartition", rest, more)
		if rest > 1 {
			s += "s"
		}
	}
	return s
}

func printHorizon(w io.Writer, out statusOutput, warnAfter time.Duration) {
	h := out.Horizon
	if h.PerTopic {
		printPublishers(w, out, warnAfter)
		fmt.Fprintln(w)
		printVacuumHorizon(w, h)
		return
	}
	fmt.Fprintln(w, "Xmin horizon: messages of transactions at or above xmin are not delivered yet")
	tw := newTable(w)
	fmt.Fprintf(tw, "xmin\t%d\n", h.Xmin)
	hh := h.Holder
	if h.Node != "" {
		// Citus: the horizon of the worker with the oldest holder, which
		// holds back the topics on that worker; with no holder, the
		// lowest horizon, which holds nothing back.
		if hh != nil {
			fmt.Fprintf(tw, "worker\t%s (of %d; its topics are held back)\n", h.Node, len(h.Workers))
		} else {
			fmt.Fprintf(tw, "worker\t%s (of %d; the lowest horizon)\n", h.Node, len(h.Workers))
		}
	}
	if hh == nil {
		fmt.Fprintf(tw, "held by\tnothing: no writing transaction is running, no topic is held back\n")
		_ = tw.Flush()
		return
	}
	known := holderAgeKnown(hh)
	if hh.GID != "" {
		fmt.Fprintf(tw, "held by\tprepared transaction %s\n", strconv.Quote(hh.GID))
	} else {
		fmt.Fprintf(tw, "held by\tpid %d\n", hh.PID)
		fmt.Fprintf(tw, "application\t%s\n", orDash(hh.ApplicationName))
	}
	fmt.Fprintf(tw, "state\t%s\n", orDash(hh.State))
	if known {
		fmt.Fprintf(tw, "age\t%s (since %s)\n", formatDuration(hh.Age), formatTime(hh.XactStart))
	} else {
		fmt.Fprintf(tw, "age\tunknown: hidden from this role (grant it pg_read_all_stats)\n")
	}
	if !hh.QueryStart.IsZero() && known {
		// The server's clock at the time of reading, from the holder's
		// start and age, so that the age does not depend on this
		// machine's clock.
		now := hh.XactStart.Add(hh.Age)
		fmt.Fprintf(tw, "query start\t%s (%s ago)\n", formatTime(hh.QueryStart), formatDuration(now.Sub(hh.QueryStart)))
	}
	if hh.GID == "" {
		fmt.Fprintf(tw, "query\t%s\n", orDash(abbreviate(hh.Query, queryWidth)))
	}
	printHorizonClient(tw, h.Client)
	_ = tw.Flush()
	fmt.Fprintln(w)
	who, end := fmt.Sprintf("pid %d", hh.PID), fmt.Sprintf("commit or roll it back, or end it with\nSELECT pg_terminate_backend(%d).", hh.PID)
	if hh.GID != "" {
		who = "prepared transaction " + strconv.Quote(hh.GID)
		end = fmt.Sprintf("COMMIT PREPARED or ROLLBACK PREPARED %s.", quoteLiteral(hh.GID))
	}
	if h.Node != "" {
		who += " on worker " + h.Node
	}
	if c := h.Client; c != nil {
		who = fmt.Sprintf("pid %d (on worker %s as pid %d)", c.PID, h.Node, hh.PID)
		end = fmt.Sprintf("commit or roll it back, or end it on the coordinator with\nSELECT pg_terminate_backend(%d).", c.PID)
	}
	switch {
	case out.DeliveryHeldBack == nil:
		fmt.Fprintf(w, "Delivery may be held back: %s runs a writing transaction, for how long this role cannot see.\n", who)
	case *out.DeliveryHeldBack:
		fmt.Fprintf(w, "DELIVERY IS HELD BACK: %s has kept a writing transaction open for %s.\n", who, formatDuration(hh.Age))
		fmt.Fprintf(w, "Messages stored by younger transactions are not delivered, on any topic,\nuntil it ends: %s\n", end)
	default:
		fmt.Fprintf(w, "Delivery is not held back: the oldest writing transaction is %s old (less than --warn-after %s).\n",
			formatDuration(hh.Age), warnAfter)
	}
}

// printVacuumHorizon prints the xmin horizon where it holds back vacuum
// only (a single server with positions from a sequence).
func printVacuumHorizon(w io.Writer, h admin.Horizon) {
	fmt.Fprintln(w, "Xmin horizon: holds back vacuum, not delivery")
	tw := newTable(w)
	fmt.Fprintf(tw, "xmin\t%d\n", h.Xmin)
	if h.Node != "" {
		// Citus: the horizon of the worker with the oldest holder.
		fmt.Fprintf(tw, "worker\t%s (of %d)\n", h.Node, len(h.Workers))
	}
	hh := h.Holder
	switch {
	case hh == nil:
		fmt.Fprintf(tw, "held by\tnothing: no writing transaction is running\n")
	case hh.GID != "":
		fmt.Fprintf(tw, "held by\tprepared transaction %s\n", strconv.Quote(hh.GID))
	default:
		age := "age unknown"
		if holderAgeKnown(hh) {
			age = formatDuration(hh.Age) + " old"
		}
		fmt.Fprintf(tw, "held by\tpid %d (%s, %s, %s)\n", hh.PID, orDash(hh.ApplicationName), orDash(hh.State), age)
		fmt.Fprintf(tw, "query\t%s\n", orDash(abbreviate(hh.Query, queryWidth)))
		printHorizonClient(tw, h.Client)
	}
	_ = tw.Flush()
}

// printHorizonClient prints, on Citus, the session on the coordinator
// whose distributed transaction the worker's holder runs (nil: none).
func printHorizonClient(tw io.Writer, c *admin.HorizonHolder) {
	if c == nil {
		return
	}
	fmt.Fprintf(tw, "for session\tpid %d on the coordinator (%s, %s)\n", c.PID, orDash(c.ApplicationName), orDash(c.State))
	fmt.Fprintf(tw, "its query\t%s\n", orDash(abbreviate(c.Query, queryWidth)))
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
