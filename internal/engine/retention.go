package engine

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// retentionLookahead is how many slots of a retention class the
// maintainer keeps ready beyond the longest retention of the class's
// topics. Few: every partition costs each read of the class's topics a
// probe, and a message whose slot is not ready yet is not lost (it goes
// to the partition kept forever and is deleted row by row).
const retentionLookahead = 2

// retentionStepTime bounds each step of removing an expired partition
// (the count, the detach, the drop) on its own: a long transaction that
// holds the messages table or the partition delays that partition only.
const retentionStepTime = 10 * time.Second

// RetentionClass is the class of a retention: class k > 0 holds the
// retentions of more than 2^(k-2) and at most 2^(k-1) seconds (class 1:
// up to 1 s). Messages of one class share partitions, one per time slot
// of the class (retentionSlot) by expiry time, and a partition is dropped
// once its slot has passed. The slot is at most half the class's shortest
// retention (at least 1 s), so a message lives at most half as long again
// as its retention (plus the maintainer's period), and a class has about
// half a dozen partitions whatever its retention: every read of a topic
// with a retention probes each of them, and fewer, wider slots measured
// faster (drain 0.84x of a topic without retention with 1 s slots for a
// 5 s retention and 9 partitions, 0.98-1.06x with 2 s slots and 6).
func RetentionClass(r time.Duration) int {
	if r <= 0 {
		return 0
	}
	s := (r + time.Second - 1) / time.Second
	return 1 + bits.Len64(uint64(s-1))
}

// retentionSlot is the width of the time slot of class k's partitions.
func retentionSlot(k int) time.Duration {
	return time.Second << max(0, k-3)
}

// retentionLane is one row of the retention table.
type retentionLane struct {
	class   int
	covered time.Time
	usable  time.Time
	longest time.Duration // 0: no topic has the class
}

// settleRecheck is how often a retention round runs while partitions
// wait for the transactions that had the messages table open when they
// were attached to end (see usePartitions).
const settleRecheck = 200 * time.Millisecond

// pendingUse is what a retention class's publishers wait for before they
// place messages up to until: the transactions that held a lock on the
// messages table once the partitions up to until were attached.
type pendingUse struct {
	until   time.Time
	holders []string
}

// retentionRound drops the partitions whose every message has expired
// (after counting what each consumer group had not acknowledged), adds
// the partitions each class in use needs ahead. It returns when to run
// again (0: nothing to watch but new settings).
func (m *maintainer) retentionRound(ctx context.Context) (time.Duration, error) {
	sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
	defer cancel()
	var lanes []retentionLane
	var now time.Time
	laneRows, err := m.driver.RetentionLanes(sctx, m.pool)
	if err != nil {
		return 0, fmt.Errorf("read retention classes: %w", check.MissingSchema(err))
	}
	for _, r := range laneRows {
		l := retentionLane{class: int(r.Class), covered: r.CoveredUntil, usable: r.UsableUntil}
		if r.LongestUs != nil {
			l.longest = time.Duration(*r.LongestUs) * time.Microsecond
		}
		now = r.Now
		lanes = append(lanes, l)
	}
	retained := false
	for _, l := range lanes {
		retained = retained || l.longest > 0
	}
	m.retained.Store(retained)
	if len(lanes) == 0 {
		return 0, nil
	}

	type part struct {
		pgsql.RetentionPartition
		pending bool
	}
	var parts []part
	partRows, err := m.driver.RetentionPartitions(sctx, m.pool)
	if err != nil {
		return 0, fmt.Errorf("read retention partitions: %w", err)
	}
	for _, r := range partRows {
		parts = append(parts, part{slotPartition(r), r.DetachPending})
	}

	var next time.Duration
	soon := func(d time.Duration) {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	type slotKey struct {
		class int
		start int64
	}
	have := map[slotKey]bool{}
	for _, p := range parts {
		have[slotKey{p.Class, p.Start.Unix()}] = true
	}

	// Partitions ahead first: publishers need them, and an expired
	// partition that cannot be removed now (a long transaction holds it)
	// must not hold them back. A failure stops only its own class.
	var errs []error
	for i, l := range lanes {
		if l.longest <= 0 {
			continue
		}
		slot := retentionSlot(l.class)
		soon(slot)
		secs := int64(slot / time.Second)
		start := time.Unix(now.Unix()/secs*secs, 0)
		if l.covered.After(start) {
			start = l.covered
		}
		until := now.Add(l.longest + retentionLookahead*slot)
		for n := 0; start.Before(until) && n < maxPartitionsRound; n++ {
			p := pgsql.RetentionPartition{Class: l.class, Start: start, End: start.Add(slot)}
			if !have[slotKey{p.Class, p.Start.Unix()}] {
				if err := m.createPartition(ctx, p); err != nil {
					errs = append(errs, err)
					break
				}
				// createPartition raised covered_until to p.End.
				lanes[i].covered = p.End
			}
			start = p.End
		}
	}
	// Publishers may use them once no transaction could route without them.
	if err := m.usePartitions(ctx, lanes); err != nil {
		errs = append(errs, err)
	}
	// The key classes of the topics whose retention is longer than a day.
	keysWaiting, err := m.keyClassRound(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	if len(m.settling) > 0 || keysWaiting {
		soon(settleRecheck)
	}

	// Then the expired ones, each on its own: one that fails or waits
	// out its bound does not stop the others. A detach left pending
	// blocks every other detach of the table until it is finished: those
	// go first.
	slices.SortStableFunc(parts, func(a, b part) int {
		switch {
		case a.pending == b.pending:
			return 0
		case a.pending:
			return -1
		default:
			return 1
		}
	})
	for _, p := range parts {
		if p.End.After(now) {
			soon(p.End.Sub(now) + 20*time.Millisecond) // just after it expires
			continue
		}
		if err := m.expirePartition(ctx, p.RetentionPartition, p.pending); err != nil {
			errs = append(errs, err)
		}
	}
	// And those detached but never dropped (a drop that failed, a
	// maintainer that stopped in between, a detach by hand).
	m.dropDetached(ctx)
	return next, errors.Join(errs...)
}

// usePartitions raises each class's usable_until to its covered_until
// once the transactions that held a lock on the messages table after the
// partitions were attached have ended: PostgreSQL reads a table's
// partitions in a transaction when it first locks the table, so one that
// had the table open before a partition was attached would route a row
// for it to none, an error that aborts it (an outbox transaction that
// publishes again). The holders are read after the attach committed (the
// covered_until read or raised by this round); a transaction that locks
// the table later sees the partitions. While holders run (a long
// transaction), the class's messages beyond usable_until go to the
// partition kept forever, from which the maintainer deletes them once
// expired: nothing waits.
func (m *maintainer) usePartitions(ctx context.Context, lanes []retentionLane) error {
	if m.settling == nil {
		m.settling = map[int]pendingUse{}
	}
	sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
	defer cancel()
	for _, l := range lanes {
		p, pending := m.settling[l.class]
		if pending && !p.until.After(l.usable) {
			delete(m.settling, l.class)
			pending = false
		}
		if !l.covered.After(l.usable) {
			continue
		}
		if pending {
			running, err := pgsql.LockHoldersRunning(sctx, m.pool, p.holders)
			if err != nil {
				return fmt.Errorf("read the transactions that had the messages table open: %w", err)
			}
			if running {
				continue
			}
			if _, err := m.driver.SetUsableUntil(sctx, m.pool, l.class, p.until); err != nil {
				return fmt.Errorf("let publishers use the partitions of class %d: %w", l.class, err)
			}
			delete(m.settling, l.class)
			if !l.covered.After(p.until) {
				continue
			}
		}
		holders, err := m.driver.MessagesLockHolders(sctx, m.pool)
		if err != nil {
			return fmt.Errorf("read the transactions that have the messages table open: %w", err)
		}
		if len(holders) > 0 {
			m.settling[l.class] = pendingUse{until: l.covered, holders: holders}
			continue
		}
		if _, err := m.driver.SetUsableUntil(sctx, m.pool, l.class, l.covered); err != nil {
			return fmt.Errorf("let publishers use the partitions of class %d: %w", l.class, err)
		}
	}
	return nil
}

// createPartition adds p, by the owner's DDL or, for a role that does not
// own the tables, through the owner's function.
func (m *maintainer) createPartition(ctx context.Context, p pgsql.RetentionPartition) error {
	sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
	defer cancel()
	created := true
	var err error
	if m.delegated {
		created, err = m.driver.CallAddRetentionPartition(sctx, m.pool, p)
	} else {
		err = m.driver.CreateRetentionPartition(sctx, m.pool, p)
	}
	if err != nil {
		return fmt.Errorf("add the retention partition of class %d from %s: %w", p.Class, p.Start.UTC().Format(time.RFC3339), err)
	}
	if !created {
		return nil // another maintainer did
	}
	m.stats.partitionsCreated.Add(1)
	m.logger.Trace("Added a retention partition", watermill.LogFields{"class": p.Class, "from": p.Start, "to": p.End})
	return nil
}

// expirePartition counts, per consumer group, the messages of p that the
// group had not acknowledged (they are skipped: logged at Error level and
// counted), then detaches p and drops it: by the owner's DDL, which
// detaches without blocking readers (CONCURRENTLY), or, for a role that
// does not own the tables, through the owner's function, which detaches
// in its transaction (waiting at most its lock_timeout for the messages
// table, during which publishers and readers queue behind it).
func (m *maintainer) expirePartition(ctx context.Context, p pgsql.RetentionPartition, pending bool) error {
	fields := watermill.LogFields{"class": p.Class, "from": p.Start, "to": p.End}
	if !pending {
		// Counting is for the log: when it fails or takes longer than its
		// bound, the partition is removed all the same.
		if err := m.countSkipped(ctx, p); err != nil && ctx.Err() == nil {
			m.logger.Error("Cannot count what consumer groups had not acknowledged in an expired retention partition; removing it all the same",
				err, fields)
		}
	}
	if m.delegated {
		sctx, cancel := context.WithTimeout(ctx, retentionStepTime)
		defer cancel()
		dropped, err := m.driver.CallExpireRetentionPartition(sctx, m.pool, p)
		if err != nil {
			return fmt.Errorf("detach and drop an expired retention partition: %w", err)
		}
		if !dropped {
			return nil // another maintainer did
		}
	} else {
		// Each step has its own bound. A DETACH ... CONCURRENTLY cut off
		// by it is left pending, and the next round finishes it first.
		dctx, cancel := context.WithTimeout(ctx, retentionStepTime)
		err := m.driver.DetachRetentionPartition(dctx, m.pool, p, pending)
		cancel()
		if err != nil {
			return fmt.Errorf("detach an expired retention partition (pending before: %t): %w", pending, err)
		}
		dctx, cancel = context.WithTimeout(ctx, retentionStepTime)
		err = m.driver.DropRetentionPartition(dctx, m.pool, p)
		cancel()
		if err != nil {
			return fmt.Errorf("drop an expired retention partition (detached: dropped by a later round): %w", err)
		}
	}
	m.stats.partitionsDropped.Add(1)
	m.logger.Debug("Dropped an expired retention partition", fields)
	return nil
}

// countSkipped counts, per consumer group, the messages of p the group had
// not acknowledged, and reports them (they are skipped), within
// retentionStepTime.
func (m *maintainer) countSkipped(ctx context.Context, p pgsql.RetentionPartition) error {
	sctx, cancel := context.WithTimeout(ctx, retentionStepTime)
	defer cancel()
	rows, err := m.driver.UnacknowledgedInPartition(sctx, m.pool, p)
	if err != nil {
		return fmt.Errorf("read skipped messages: %w", err)
	}
	m.reportSkipped(rows, "its retention partition expired")
	return nil
}

// dropDetached drops the retention partitions that were detached but not
// dropped (a maintainer stopped between its detach and its drop): no
// read sees their messages any more. Failures are logged: the next
// housekeeping tries again.
func (m *maintainer) dropDetached(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
	defer cancel()
	rows, err := m.driver.DetachedRetentionPartitions(sctx, m.pool)
	if err != nil {
		if ctx.Err() == nil {
			m.logger.Error("Cannot look for detached retention partitions", err, nil)
		}
		return
	}
	for _, r := range rows {
		p := slotPartition(r)
		dropped := true
		if m.delegated {
			dropped, err = m.driver.CallDropDetachedPartition(sctx, m.pool, p)
		} else {
			err = m.driver.DropRetentionPartition(sctx, m.pool, p)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.logger.Error("Cannot drop a detached retention partition; the next round tries again", err,
				watermill.LogFields{"class": p.Class, "from": p.Start})
			continue
		}
		if dropped {
			m.stats.partitionsDropped.Add(1)
			m.logger.Info("Dropped a retention partition left detached", watermill.LogFields{"class": p.Class, "from": p.Start})
		}
	}
}

// slotPartition is the retention partition of a row that names its class
// and start.
func slotPartition(r pgsql.PartitionRow) pgsql.RetentionPartition {
	st := time.Unix(r.Start, 0)
	return pgsql.RetentionPartition{Class: int(r.Class), Start: st, End: st.Add(retentionSlot(int(r.Class)))}
}

// reportSkipped reports the rows with a group (reportSkippedRows) and
// returns the messages of the row without one (a statement's total; 0
// when there is none).
func (m *maintainer) reportSkipped(rows []pgsql.SkippedRow, why string) int64 {
	var total int64
	var skipped []pgsql.SkippedRow
	for _, r := range rows {
		if r.ConsumerGroup == nil {
			total = r.Messages
		} else {
			skipped = append(skipped, r)
		}
	}
	m.reportSkippedRows(skipped, why)
	return total
}

// reportSkippedRows logs and counts messages that consumer groups skip
// because retention removed them before they were acknowledged.
func (m *maintainer) reportSkippedRows(skipped []pgsql.SkippedRow, why string) {
	var more int64
	for i, r := range skipped {
		m.stats.retentionSkipped.Add(uint64(r.Messages))
		if i < maxSkipLogs {
			m.logger.Error("Consumer group skips messages removed by retention", ErrSkippedByRetention, watermill.LogFields{
				"skipping_group": *r.ConsumerGroup, "topic": *r.Topic, "partition": *r.Partition, "messages": r.Messages, "reason": why})
		} else {
			more += r.Messages
		}
	}
	if more > 0 {
		m.logger.Error("More consumer groups skip messages removed by retention", ErrSkippedByRetention,
			watermill.LogFields{"messages": more, "reason": why})
	}
}

// deleteExpiredKept deletes, in bounded batches, expired messages of
// topics with a retention from the partition of messages kept forever
// (published before the topic had a retention, or while no partition of
// its class covered their expiry).
func (m *maintainer) deleteExpiredKept(ctx context.Context) error {
	for range keptDeleteRounds {
		sctx, cancel := context.WithTimeout(ctx, maintenanceStmtTime)
		rows, err := m.driver.DeleteExpiredKept(sctx, m.pool, keptDeleteLimit)
		cancel()
		if err != nil {
			return fmt.Errorf("delete expired messages kept forever: %w", err)
		}
		deleted := m.reportSkipped(rows, "deleted past its retention")
		m.stats.rowsDeleted.Add(uint64(deleted))
		if deleted < keptDeleteLimit {
			return nil
		}
	}
	return nil
}
