// Package simcluster starts a Citus cluster (or one plain PostgreSQL) on
// this machine as if each node had a machine of its own: each node's
// processes in a control group with a CPU quota (internal/cgroup), and a
// delaying proxy (internal/tcpproxy) in front of each node, registered as
// the node's address in Citus's node table, so that the coordinator
// reaches the workers, and the workers each other, across a network of
// that latency. Clients connect through the proxies too ([Cluster.DSN]).
// Everything listens on 127.0.0.1 on free ports and is removed by
// [Cluster.Close], control groups included.
//
// internal/cmd/localcitus starts one for tests (-workers, -cpu, -delay),
// and the Citus benchmark (benchmarks/citusscale) one per configuration it
// measures.
package simcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/pglease/watermill-pglease/internal/cgroup"
	"github.com/pglease/watermill-pglease/internal/pgrepl"
	"github.com/pglease/watermill-pglease/internal/tcpproxy"
)

// Options configures [Start].
type Options struct {
	// Workers is the number of Citus workers; 0 starts one plain
	// PostgreSQL server instead of a Citus cluster (the reference).
	Workers int
	// CPU is each node's quota in CPUs (0.25: a quarter of one CPU's
	// time); 0: none.
	CPU float64
	// Delay is the latency that each node's proxy adds to each direction;
	// 0: no proxies, the nodes are reached directly. At most
	// [tcpproxy.MaxDelay].
	Delay time.Duration
	// Settings are more server settings for every node.
	Settings map[string]string
	// Logf, when set, receives a line for each step.
	Logf func(format string, args ...any)
}

// Node is one server of a [Cluster].
type Node struct {
	// Name is "coordinator", "workerN" or "postgres".
	Name string
	// DSN is the node's URL, through its proxy when there is one.
	DSN string
	// Group is the node's control group (without effect when
	// [Cluster.Quotas] is false).
	Group *cgroup.Group

	node *pgrepl.Node
}

// Cluster is a cluster started by [Start].
type Cluster struct {
	// DSN is where applications connect: the coordinator's URL, or the
	// plain server's, through its proxy when there is one.
	DSN string
	// Nodes are the coordinator (or the plain server) and the workers,
	// in that order.
	Nodes []*Node
	// Quotas reports whether the nodes run under their CPU quotas; when
	// false, QuotaNote says why not.
	Quotas    bool
	QuotaNote string

	opts    Options
	groups  *cgroup.Set
	proxies map[*pgrepl.Node]*tcpproxy.Proxy
	citus   *pgrepl.Citus
	single  *pgrepl.Cluster
}

// Start starts the cluster; call [Cluster.Close] when done. On error
// everything it started is removed.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Workers < 0 {
		return nil, fmt.Errorf("simcluster: Workers must not be negative, got %d", opts.Workers)
	}
	if opts.CPU < 0 {
		return nil, fmt.Errorf("simcluster: CPU must not be negative, got %g", opts.CPU)
	}
	if opts.Delay < 0 || opts.Delay > tcpproxy.MaxDelay {
		return nil, fmt.Errorf("simcluster: Delay must lie between 0 and %s, got %s", tcpproxy.MaxDelay, opts.Delay)
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	c := &Cluster{opts: opts, proxies: map[*pgrepl.Node]*tcpproxy.Proxy{}}
	defer func() {
		if err != nil {
			if cerr := c.Close(); cerr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, cerr)
			}
		}
	}()
	if opts.CPU > 0 {
		c.groups, err = cgroup.Open("pglease-sim-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
		if err != nil {
			return nil, err
		}
		c.Quotas = c.groups.Available()
		if !c.Quotas {
			c.QuotaNote = "no CPU quotas, the nodes share the machine: " + c.groups.Reason()
			logf("simcluster: %s", c.QuotaNote)
		}
	} else {
		c.QuotaNote = "no CPU quotas asked for"
	}
	byNode := map[*pgrepl.Node]*Node{}
	started := func(n *pgrepl.Node) error {
		node := &Node{Name: n.Name(), node: n}
		byNode[n] = node
		c.Nodes = append(c.Nodes, node)
		if c.groups == nil {
			return nil
		}
		g, err := c.groups.New(n.Name(), opts.CPU)
		if err != nil {
			return err
		}
		node.Group = g
		pids, err := n.Processes()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			if err := node.Group.Add(pid); err != nil {
				return err
			}
		}
		return nil
	}
	address := func(n *pgrepl.Node) (string, int, error) {
		if opts.Delay == 0 {
			return "127.0.0.1", n.Port(), nil
		}
		p, err := tcpproxy.StartOptions(net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port())), tcpproxy.Options{Delay: opts.Delay})
		if err != nil {
			return "", 0, err
		}
		c.proxies[n] = p
		host, port, err := net.SplitHostPort(p.Addr())
		if err != nil {
			return "", 0, err
		}
		portNum, err := strconv.Atoi(port)
		return host, portNum, err
	}
	if opts.Workers == 0 {
		c.single, err = pgrepl.StartSingle(ctx, pgrepl.Options{Settings: opts.Settings, Logf: opts.Logf})
		if err != nil {
			return nil, err
		}
		if err := started(c.single.Primary); err != nil {
			return nil, err
		}
		c.Nodes[0].Name = "postgres"
		if _, _, err := address(c.single.Primary); err != nil {
			return nil, err
		}
	} else {
		c.citus, err = pgrepl.StartCitus(ctx, pgrepl.CitusOptions{
			Workers:  opts.Workers,
			Settings: opts.Settings,
			Logf:     opts.Logf,
			Started:  started,
			Address:  address,
		})
		if err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		n.DSN = n.node.DSN()
		if p := c.proxies[n.node]; p != nil {
			n.DSN = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", p.Addr())
		}
	}
	c.DSN = c.Nodes[0].DSN
	logf("simcluster: %d worker(s), %g CPU per node (%s), %s each way between nodes; clients connect to %s",
		opts.Workers, opts.CPU, map[bool]string{true: "enforced", false: c.QuotaNote}[c.Quotas], opts.Delay, c.DSN)
	return c, nil
}

// Workers returns the worker nodes.
func (c *Cluster) Workers() []*Node {
	if len(c.Nodes) < 2 {
		return nil
	}
	return c.Nodes[1:]
}

// Usage returns the CPU time each node's processes have used, by node
// name; nil when the quotas are not enforced (the groups do not exist).
func (c *Cluster) Usage() (map[string]time.Duration, error) {
	if !c.Quotas {
		return nil, nil
	}
	u := map[string]time.Duration{}
	for _, n := range c.Nodes {
		d, err := n.Group.Usage()
		if err != nil {
			return nil, err
		}
		u[n.Name] = d
	}
	return u, nil
}

// ClientGroup makes a control group for a client process with the nodes'
// quota, named name; without quotas it returns a group that does
// nothing. It is removed by Close.
func (c *Cluster) ClientGroup(name string) (*cgroup.Group, error) {
	if c.groups == nil {
		return (&cgroup.Set{}).New(name, 0) // a group of no Set: does nothing
	}
	return c.groups.New(name, c.opts.CPU)
}

// Close stops the servers, then the proxies, and removes the control
// groups. It may be called more than once.
func (c *Cluster) Close() error {
	var errs []error
	if c.citus != nil {
		errs = append(errs, c.citus.Close())
		c.citus = nil
	}
	if c.single != nil {
		errs = append(errs, c.single.Close())
		c.single = nil
	}
	for n, p := range c.proxies {
		errs = append(errs, p.Close())
		delete(c.proxies, n)
	}
	if c.groups != nil {
		errs = append(errs, c.groups.Close())
	}
	return errors.Join(errs...)
}
