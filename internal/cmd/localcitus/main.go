// Command localcitus starts a throwaway Citus cluster (a coordinator and
// two workers, see pgrepl.StartCitus), runs a command with the cluster in
// its environment, and stops the cluster when the command ends:
//
//	go run ./internal/cmd/localcitus -- go test -run Citus .
//
// -workers N starts N workers instead of two. -cpu Q and -delay D
// simulate nodes on machines of their own (internal/simcluster): each node
// in a control group of its own with a quota of Q CPUs (say 0.25), and a
// proxy in front of each node that delays each direction by D (say
// 0.5ms), registered as the node's address in Citus's node table, so that
// the coordinator reaches the workers through it; the command connects
// through the proxies too. Without a writable CPU controller, -cpu says
// so and the nodes run without quotas. The groups and proxies are removed
// when the command ends. -set name=value (repeatable) adds a server
// setting on every node, e.g. -set
// shared_preload_libraries=citus,pg_stat_statements.
//
// The command gets PGLEASE_TEST_DSN (the coordinator's URL, where
// applications connect), PGLEASE_TEST_CITUS_WORKERS (the workers' URLs,
// space-separated) and PGLEASE_TEST_CITUS=1, which enables the tests that
// need Citus. Its exit status is the command's. When Citus is not
// installed it fails, saying where its source and install script are
// expected (`make test-citus` installs it first).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pglease/watermill-pglease/internal/simcluster"
)

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("localcitus", flag.ContinueOnError)
	nWorkers := fs.Int("workers", 2, "the number of workers, at least 1")
	cpu := fs.Float64("cpu", 0, "each node's CPU quota in CPUs (0.25: a quarter of a CPU); 0: none")
	delay := fs.Duration("delay", 0, "the latency each node's proxy adds to each direction (0.5ms); 0: no proxies")
	settings := map[string]string{}
	fs.Func("set", "a server setting for every node, name=value (repeatable)", func(v string) error {
		name, value, ok := strings.Cut(v, "=")
		if !ok || name == "" {
			return fmt.Errorf("want name=value, got %q", v)
		}
		settings[name] = value
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: localcitus [-workers N] [-cpu Q] [-delay D] [-set name=value]... -- command [args...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	args := fs.Args()
	if *nWorkers < 1 {
		fmt.Fprintln(os.Stderr, "localcitus: -workers takes a number of workers, at least 1")
		return 2
	}
	if *cpu < 0 || *delay < 0 {
		fmt.Fprintln(os.Stderr, "localcitus: -cpu and -delay must not be negative")
		return 2
	}
	if len(args) == 0 {
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "localcitus: "+format+"\n", a...) }
	cluster, err := simcluster.Start(ctx, simcluster.Options{Workers: *nWorkers, CPU: *cpu, Delay: *delay, Settings: settings, Logf: logf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcitus:", err)
		return 1
	}
	defer func() {
		if err := cluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "localcitus: stop:", err)
		}
	}()
	var workers []string
	for _, w := range cluster.Workers() {
		workers = append(workers, w.DSN)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"PGLEASE_TEST_DSN="+cluster.DSN,
		"PGLEASE_TEST_CITUS_WORKERS="+strings.Join(workers, " "),
		"PGLEASE_TEST_CITUS=1")
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	// A command that ignores the interrupt is killed 10 s later.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "localcitus:", err)
		return 1
	}
	return 0
}
