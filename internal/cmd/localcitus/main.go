// Command localcitus starts a throwaway Citus cluster (a coordinator and
// two workers, see pgrepl.StartCitus), runs a command with the cluster in
// its environment, and stops the cluster when the command ends:
//
//	go run ./internal/cmd/localcitus -- go test -run Citus .
//
// -workers N starts N workers instead of two.
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
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pglease/watermill-pglease/internal/pgrepl"
)

func main() { os.Exit(run()) }

func run() int {
	args := os.Args[1:]
	nWorkers := 0 // pgrepl's default
	if len(args) > 1 && args[0] == "-workers" {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "localcitus: -workers takes a number of workers, at least 1")
			return 2
		}
		nWorkers, args = n, args[2:]
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: localcitus [-workers N] -- command [args...]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cluster, err := pgrepl.StartCitus(ctx, pgrepl.CitusOptions{
		Workers: nWorkers,
		Logf:    func(format string, a ...any) { fmt.Fprintf(os.Stderr, "localcitus: "+format+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcitus:", err)
		return 1
	}
	defer func() {
		if err := cluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "localcitus: stop:", err)
		}
	}()
	workers := make([]string, len(cluster.Workers))
	for i, w := range cluster.Workers {
		workers[i] = w.DSN()
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"PGLEASE_TEST_DSN="+cluster.Coordinator.DSN(),
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
