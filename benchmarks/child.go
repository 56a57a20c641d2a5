package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The benchmark binary runs as a child process when childEnv is set (main
// sends it here), with its settings as JSON in that variable. A child is
// one pglease Subscriber in a process of its own: a group member that the
// balance workload can SIGKILL, the one Subscriber of a many-topics
// workload, whose Go heap no other workload's garbage skews, or a member
// of the partitions workload that handles messages (keyed). It talks to
// the parent on its standard streams:
//
//	stdout: "ready"              member, keyed: every Subscribe call returned
//	        "msg <key> <seq> <partition>"
//	                             keyed: a message handled, before its Ack
//	        "claimed <seconds>"  many: every topic is owned by the Subscriber,
//	                             that long after the first Subscribe call
//	        "heap <bytes>"       many, after "close": Go heap and stacks per
//	                             subscribed topic, after GC
//	        "closed <seconds>"   after "close": Close took that long (an
//	                             error it returned goes to stderr); then
//	                             the process exits
//	stdin:  "go"                 keyed: start reading the channel
//	        "close"              close the Subscriber and exit; so does the
//	                             end of standard input (the parent is gone)
//	stderr: errors, and the library's log with -v
const childEnv = "PGLEASE_BENCH_CHILD"

const (
	childMember = "member" // subscribe to Topics topics, then idle
	childMany   = "many"   // subscribe to Topics topics and time the claims
	childKeyed  = "keyed"  // subscribe to Topic, handle its messages after "go"
)

// childConfig is what a child process runs.
type childConfig struct {
	Role     string
	DSN      string
	Database string // the run's own database, if any
	Schema   string
	Conns    int
	Verbose  bool
	// Topics are named fmt.Sprintf(TopicFormat, i) for i in [0, Topics).
	TopicFormat string
	Topics      int
	// Topic and HandlerDelay are the keyed role's topic and the time its
	// handler takes per message.
	Topic        string
	HandlerDelay time.Duration
}

func (c childConfig) topic(i int) string { return fmt.Sprintf(c.TopicFormat, i) }

// runChild runs the child process and returns its exit status.
func runChild() int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "child: %s: %v\n", childEnv, err)
		return 2
	}
	if err := cfg.run(); err != nil {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", cfg.Role, err)
		return 1
	}
	return 0
}

func (c childConfig) pool(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	if c.Database != "" {
		pc.ConnConfig.Database = c.Database
	}
	pc.MaxConns = int32(conns)
	return pgxpool.NewWithConfig(ctx, pc)
}

func (c childConfig) run() error {
	ctx := context.Background()
	pool, err := c.pool(ctx, c.Conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if c.Verbose {
		logger = watermill.NewStdLoggerWithOut(os.Stderr, false, false).With(watermill.LogFields{"child": os.Getpid()})
	}
	sub, err := newPgleaseSubscriber(pool, c.Schema, false, logger, nil)
	if err != nil {
		return err
	}
	defer sub.Close()
	start, closing := make(chan struct{}), make(chan struct{})
	go func() {
		// "close", or the end of standard input: the parent is gone.
		sc := bufio.NewScanner(os.Stdin)
		started := false
		for sc.Scan() && sc.Text() != "close" {
			if sc.Text() == "go" && !started {
				started = true
				close(start)
			}
		}
		close(closing)
	}()

	var heapBefore uint64
	if c.Role == childMany {
		heapBefore = heapAfterGC()
	}
	began := time.Now()
	for i := range c.Topics {
		// No message is published to these topics: nobody needs to read
		// the channels.
		if _, err := sub.Subscribe(ctx, c.topic(i)); err != nil {
			return fmt.Errorf("subscribe to %s: %w", c.topic(i), err)
		}
	}
	switch c.Role {
	case childMember:
		fmt.Println("ready")
	case childKeyed:
		// Topics is 0: the one topic is subscribed to here.
		if err := c.consumeKeyed(ctx, sub, start, closing); err != nil {
			return err
		}
	case childMany:
		if err := c.waitClaimed(ctx, closing); err != nil {
			return err
		}
		fmt.Printf("claimed %.6f\n", time.Since(began).Seconds())
	default:
		return fmt.Errorf("unknown role %q", c.Role)
	}

	<-closing
	if c.Role == childMany {
		perTopic := float64(int64(heapAfterGC())-int64(heapBefore)) / float64(c.Topics)
		fmt.Printf("heap %.1f\n", perTopic)
	}
	t0 := time.Now()
	err = sub.Close()
	took := time.Since(t0)
	if err != nil {
		// Measured all the same: the parent counts what was not released.
		first, _, _ := strings.Cut(err.Error(), "\n")
		fmt.Fprintf(os.Stderr, "child %s: Close after %s: %s\n", c.Role, took.Round(time.Millisecond), first)
	}
	fmt.Printf("closed %.6f\n", took.Seconds())
	return nil
}

// waitClaimed waits until every topic of the group is owned. It polls on a
// small pool of its own, at most every 50 ms and at most a tenth of the
// time (counting 100,000 rows takes a while, and the claims share the
// machine's cores with the count).
func (c childConfig) waitClaimed(ctx context.Context, closing <-chan struct{}) error {
	pool, err := c.pool(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := ownedCountSQL(c.Schema)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		t0 := time.Now()
		var n int
		if err := pool.QueryRow(ctx, q, consumerGroup).Scan(&n); err != nil {
			return fmt.Errorf("count owned topics: %w", err)
		}
		if n >= c.Topics {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d topics claimed after 5 minutes", n, c.Topics)
		}
		select {
		case <-time.After(max(50*time.Millisecond, 10*time.Since(t0))):
		case <-closing:
			return errors.New("told to close before every topic was claimed")
		}
	}
}

// heapAfterGC is the Go heap and stacks in use after two collections, as
// the library's TestManyTopicsInOneProcess measures it.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

// child is a child process as the parent sees it.
type child struct {
	cfg    childConfig
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	exited chan struct{}
	err    error // the exit status, once exited is closed
}

// startChild starts the benchmark binary as a child process running cfg
// (its DSN, database and verbosity are filled in from e). Stop it with
// stop, whatever happened.
func startChild(e *env, cfg childConfig) (*child, error) {
	cfg.DSN, cfg.Database, cfg.Verbose = e.cfg.dsn, e.database, e.cfg.verbose
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the benchmark binary to run a child process: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	c := &child{cfg: cfg, cmd: cmd, lines: make(chan string, 16), exited: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a child process: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// waitLine waits for the child to print a line starting with prefix and
// returns the rest of the line.
func (c *child) waitLine(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				<-c.exited
				return "", fmt.Errorf("child %s exited (%v) before printing %q", c.cfg.Role, c.err, prefix)
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return rest, nil
			}
		case <-deadline.C:
			return "", fmt.Errorf("child %s did not print %q within %s", c.cfg.Role, prefix, timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// waitNumber waits for a line "prefix<number>" and returns the number.
func (c *child) waitNumber(ctx context.Context, prefix string, timeout time.Duration) (float64, error) {
	rest, err := c.waitLine(ctx, prefix, timeout)
	if err != nil {
		return 0, err
	}
	var v float64
	if _, err := fmt.Sscan(rest, &v); err != nil {
		return 0, fmt.Errorf("child %s: %q: %w", c.cfg.Role, prefix+rest, err)
	}
	return v, nil
}

// tell writes one command line to the child.
func (c *child) tell(line string) error {
	_, err := io.WriteString(c.stdin, line+"\n")
	return err
}

// kill ends the child with SIGKILL, at once: its session is not deleted
// and its topics are not released.
func (c *child) kill() error {
	if err := c.cmd.Process.Kill(); err != nil {
		return err
	}
	<-c.exited
	return nil
}

// wait waits for the child to exit after "close" and returns its status.
func (c *child) wait(timeout time.Duration) error {
	select {
	case <-c.exited:
		return c.err
	case <-time.After(timeout):
		return fmt.Errorf("child %s did not exit within %s", c.cfg.Role, timeout)
	}
}

// stop kills the child unless it has exited, and reaps it.
func (c *child) stop() {
	select {
	case <-c.exited:
	default:
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}
