package pglease_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's
// times (100 on Linux).
const clockTicks = 100

// procCPU returns the CPU time of a process from /proc/pid/stat: its own
// (utime, stime) and, with children, that of its children it waited for
// (cutime, cstime), and its parent's pid.
func procCPU(pid int, children bool) (time.Duration, int, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // from the state, field 3
	ppid, _ := strconv.Atoi(f[1])
	n := 2 // utime, stime
	if children {
		n = 4 // cutime, cstime
	}
	var ticks int64
	for i := range n {
		v, _ := strconv.ParseInt(f[11+i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, ppid, nil
}

// serverCPU is the CPU time of the server pool is connected to: its
// postmaster's, its living processes' and those of its processes that
// ended (the postmaster waited for them). The server runs on this
// machine (localcitus).
func serverCPU(t *testing.T, ctx context.Context, pool *pgxpool.Pool) time.Duration {
	t.Helper()
	var backend int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&backend))
	_, postmaster, err := procCPU(backend, false)
	require.NoError(t, err)
	total, _, err := procCPU(postmaster, true)
	require.NoError(t, err)
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cpu, ppid, err := procCPU(pid, false); err == nil && ppid == postmaster {
			total += cpu
		}
	}
	return total
}

// TestCitusRoutedReadsCoordinatorCost measures what consuming costs the
// coordinator with and without the Subscriber's RouteToWorkers: its CPU
// time (every process of its server) and the statements it ran
// (pg_stat_statements) per read of messages, the same messages consumed
// by a group of each. A measurement, not a check: it runs with
// PGLEASE_MEASURE=1 and logs its figures, on a cluster whose nodes load
// pg_stat_statements:
//
//	PGLEASE_MEASURE=1 PGLEASE_PG_BINDIR= go run ./internal/cmd/localcitus \
//		-set shared_preload_libraries=citus,pg_stat_statements -- \
//		go test -count=1 -p 1 -v -run TestCitusRoutedReadsCoordinatorCost .
func TestCitusRoutedReadsCoordinatorCost(t *testing.T) {
	if os.Getenv("PGLEASE_MEASURE") == "" {
		t.Skip("a measurement: set PGLEASE_MEASURE=1")
	}
	const (
		perTopic  = 500
		batchSize = 10
	)
	pool, adapter := citusSchema(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public`)
	require.NoError(t, err)
	pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: adapter}, nil)
	require.NoError(t, err)
	defer pub.Close()
	topics := numberedTopics("cost", 0, 8)
	for _, topic := range topics {
		for i := 0; i < perTopic; i += 50 {
			var msgs []*message.Message
			for j := i; j < i+50; j++ {
				msgs = append(msgs, message.NewMessage(fmt.Sprintf("%s/%d", topic, j), nil))
			}
			require.NoError(t, pub.Publish(topic, msgs...))
		}
	}
	run := func(routed bool, round int) string {
		group := fmt.Sprintf("plain%d", round)
		if routed {
			group = fmt.Sprintf("routed%d", round)
		}
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: adapter,
			StartFrom: pglease.StartFromEarliest, BatchSize: batchSize, RouteToWorkers: routed}, nil)
		require.NoError(t, err)
		// Warm up: the session, the claims and the routes, one message
		// each (not counted).
		chans := map[string]<-chan *message.Message{}
		for _, topic := range topics {
			ch, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			chans[topic] = ch
			receiveUUIDs(t, ch, 1)
		}
		_, err = pool.Exec(ctx, `SELECT public.pg_stat_statements_reset()`)
		require.NoError(t, err)
		reads0, routed0, cpu0, began := pglease.Reads(sub), pglease.RoutedReads(sub), serverCPU(t, ctx, pool), time.Now()
		var wg sync.WaitGroup
		for _, topic := range topics {
			wg.Add(1)
			go func(ch <-chan *message.Message) {
				defer wg.Done()
				for range perTopic - 1 {
					select {
					case m := <-ch:
						m.Ack()
					case <-ctx.Done():
						return
					}
				}
			}(chans[topic])
		}
		wg.Wait()
		reads, cpu, took := pglease.Reads(sub)-reads0, serverCPU(t, ctx, pool)-cpu0, time.Since(began)
		var (
			calls      int64
			exec, plan float64
		)
		require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(sum(calls), 0)::bigint, COALESCE(sum(total_exec_time), 0)::float8,
			COALESCE(sum(total_plan_time), 0)::float8 FROM public.pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'`).
			Scan(&calls, &exec, &plan))
		routedReads := pglease.RoutedReads(sub) - routed0
		require.NoError(t, sub.Close())
		return fmt.Sprintf("routed=%v: %d messages in %s, %d reads (%d on the workers); coordinator CPU %s (%.0f µs per read), %d statements (%.2f per read), exec %.0f ms, plan %.0f ms",
			routed, len(topics)*(perTopic-1), took.Round(time.Millisecond), reads, routedReads, cpu,
			float64(cpu.Microseconds())/float64(max(reads, 1)), calls, float64(calls)/float64(max(reads, 1)), exec, plan)
	}
	for round := range 2 {
		t.Log(run(false, round))
		t.Log(run(true, round))
	}
}
