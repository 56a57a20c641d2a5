package simcluster_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/simcluster"
)

// TestCitusSimulated starts a cluster of two workers with a quota and a
// delay: Citus's node table holds the proxies' addresses, not the
// servers', so a statement the coordinator sends to a worker crosses a
// proxy (a round trip to each worker takes at least twice the delay);
// each node's processes, backends started later included, are in its own
// group; and Close removes the groups and stops the proxies.
func TestCitusSimulated(t *testing.T) {
	pgtest.SkipShort(t)
	if os.Getenv("PGLEASE_TEST_CITUS") == "" {
		t.Skip("starts a Citus cluster of its own: run `make test-citus`")
	}
	if !pgrepl.CitusInstalled() {
		t.Fatal(pgrepl.ErrNoCitus)
	}
	const delay = 20 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := simcluster.Start(ctx, simcluster.Options{Workers: 2, CPU: 0.5, Delay: delay, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()
	if len(c.Nodes) != 3 || len(c.Workers()) != 2 {
		t.Fatalf("%d nodes, %d workers; want a coordinator and 2 workers", len(c.Nodes), len(c.Workers()))
	}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	// The node table lists the addresses clients get: the proxies'.
	var registered []string
	rows, err := conn.Query(ctx, `SELECT nodename || ':' || nodeport FROM pg_catalog.pg_dist_node ORDER BY groupid`)
	if err != nil {
		t.Fatal(err)
	}
	registered, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range c.Nodes {
		cfg, err := pgx.ParseConfig(n.DSN)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	}
	if !slices.Equal(registered, want) {
		t.Fatalf("pg_dist_node lists %v; the nodes' proxies are %v", registered, want)
	}

	// A statement on every worker: the coordinator's connections cross
	// the proxies.
	start := time.Now()
	var n int
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.run_command_on_workers('SELECT 1') WHERE success`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); n != 2 || took < 2*delay {
		t.Fatalf("run_command_on_workers: %d workers answered in %s; want 2, each through a proxy of %s each way", n, took, delay)
	}

	// Every process of each node is in its group, the backend just
	// started for this connection included.
	if !c.Quotas {
		t.Logf("no quotas: %s", c.QuotaNote)
	} else {
		var backend int
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&backend); err != nil {
			t.Fatal(err)
		}
		if g := cpuGroup(t, backend); !strings.HasSuffix(g, "/coordinator") {
			t.Fatalf("the coordinator's backend %d is in the group %q", backend, g)
		}
		used, err := c.Usage()
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range c.Nodes {
			if used[node.Name] <= 0 {
				t.Errorf("%s used no CPU time by its group's account", node.Name)
			}
		}
	}
	groups := groupDirs(t)
	if c.Quotas && len(groups) == 0 {
		t.Fatal("no group of the cluster found under /sys/fs/cgroup")
	}
	addrs := want

	closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if _, err := os.Stat(g); !os.IsNotExist(err) {
			t.Errorf("the group %s is left after Close (%v)", g, err)
		}
	}
	for _, a := range addrs {
		if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			_ = conn.Close()
			t.Errorf("%s still accepts connections after Close", a)
		}
	}
}

// cpuGroup returns the cgroup of pid in the cpu controller's hierarchy
// (v1), or the unified one.
func cpuGroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	unified := ""
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpu" {
				return parts[2]
			}
		}
		if parts[1] == "" {
			unified = parts[2]
		}
	}
	return unified
}

// groupDirs returns the parent groups the simulated clusters of this
// process made.
func groupDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	for _, root := range []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup"} {
		m, err := filepath.Glob(filepath.Join(root, "pglease-sim-"+strconv.Itoa(os.Getpid())+"-*"))
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, m...)
	}
	return dirs
}
