package pglease_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// The test binary runs as a subscriber process ("helper") when helperEnv is
// set; TestMain sends it here. Its settings come as JSON in
// helperConfigEnv. It records every message it processes in processedTable
// (see history_test.go) and talks to the test on its standard streams:
//
//	stdout: "ready"            every subscription is running
//	        "holding <uuid>"   a message whose holdMetadata names this
//	                           process was recorded and is held, not acked,
//	                           until "go"
//	        "stopped"          after "cancel": every Subscribe context was
//	                           cancelled; the Subscribers stay open
//	        "closed <duration>" after SIGTERM: everything closed (in that
//	                           time), exiting 0
//	        "maintainer ..."   with ReportMaintainer: see reportMaintainer
//	stdin:  "go"               ack the held message
//	        "cancel"           end every subscription gracefully
//	stderr: the library's log (debug level)
//
// On SIGTERM (modeRouter) it shuts down gracefully: it stops taking new
// messages (those handed out from then on are nacked, unprocessed), lets
// the message under way finish and ack, then closes the Router and the
// Subscribers, so that its Subscribers have nothing to wait for. modeReadme
// has no such gate: there the Subscribers wait for the handlers under way
// (DrainTimeout).
const (
	helperEnv       = "PGLEASE_HELPER"
	helperConfigEnv = "PGLEASE_HELPER_CONFIG"
	// holdMetadata names the helper that holds the message.
	holdMetadata = "pglease_test_hold"

	// modeRouter consumes every topic through a Watermill Router, one
	// handler per (Subscriber, topic).
	modeRouter = "router"
	// modeChurn reads the channels directly and, after every few messages
	// it processes, ends the subscription and subscribes again, so that
	// ownership of the topics keeps moving between Subscribers.
	modeChurn = "churn"
	// modeRoam gives each Subscriber Slots subscriptions at a time, each to
	// a random topic of Topics, ended after a random number of messages in
	// [ChurnMin, ChurnMax] or a random time up to HoldMax, whichever comes
	// first, and replaced by a subscription to another random topic. With
	// RenewMax set, each Subscriber is closed after a random time up to
	// RenewMax and replaced by a new one, with a new session.
	modeRoam = "roam"
	// modeTx consumes with pglease.TxHandler: see runTx.
	modeTx = "tx"
	// modeReadme is the README's Router pattern and nothing of the
	// helper's own: see runReadme.
	modeReadme = "readme"
	// modeRetry consumes under a failure policy (Retry): see runRetry.
	modeRetry = "retry"
)

// helperConfig is what a helper process runs.
type helperConfig struct {
	Name         string // label of the process in processedTable
	DSN          string
	Schema       string
	Group        string
	Topics       []string
	Subscribers  int // Subscribers in the process, each on every topic (default 1)
	Mode         string
	SessionTTL   time.Duration
	PollInterval time.Duration
	Work         time.Duration // simulated processing time per message
	// ChurnMin and ChurnMax bound how many messages a subscription
	// processes in modeChurn and modeRoam before it ends and subscribes
	// again.
	ChurnMin, ChurnMax int
	// Slots, HoldMax and RenewMax shape modeRoam (see there). Slots
	// defaults to 1, HoldMax to 1s.
	Slots    int
	HoldMax  time.Duration
	RenewMax time.Duration
	// NoKeepalive leaves out modeRouter's keepalive subscription, so that
	// each Subscriber's set of topics is exactly Topics: fair share splits
	// a set of topics among the members of the group that subscribe to
	// that same set, and a keepalive topic of each process's own would
	// make every set different. Without it, "cancel" closes the Router.
	NoKeepalive bool
	// DeriveTopic is where modeTx publishes one derived message per
	// message it processes.
	DeriveTopic string
	// MaxInFlight is the Subscribers' MaxInFlight (default 1).
	MaxInFlight int
	// BatchSize is the Subscribers' BatchSize (default DefaultBatchSize).
	BatchSize int
	// ReportMaintainer makes the helper print whether one of the
	// Subscribers it starts with is the maintainer each time that
	// changes: see reportMaintainer.
	ReportMaintainer bool
	// Retry is the Subscribers' failure policy; PoisonHang and
	// HangInMove shape modeRetry (see runRetry).
	Retry      pglease.RetryConfig
	PoisonHang bool
	HangInMove bool
	// HangAt is a step of the poison message's attempts at which
	// modeRetry reports and waits until the process is killed (see
	// runRetry): a failure step (pglease.FailureStep...), hangHandler or
	// hangMove.
	HangAt string
	// CommitInterval is the Subscribers' CommitInterval (default: the
	// library's).
	CommitInterval time.Duration
}

// subAppName and recAppName are the application_name of the helper's
// Subscriber pool and of its recording pool, so that tests can find (and
// terminate) the Subscriber's connections alone.
func (c helperConfig) subAppName() string { return "pglease-sub-" + c.Name + "-" + c.Schema }
func (c helperConfig) recAppName() string { return "pglease-rec-" + c.Name + "-" + c.Schema }

func (c helperConfig) named(name string) helperConfig {
	c.Name = name
	return c
}

var errHelperClosing = errors.New("helper is shutting down")

func runHelperProcess() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	var cfg helperConfig
	if err := json.Unmarshal([]byte(os.Getenv(helperConfigEnv)), &cfg); err != nil {
		return fail(fmt.Errorf("%s: %w", helperConfigEnv, err))
	}
	if cfg.Subscribers == 0 {
		cfg.Subscribers = 1
	}
	if cfg.Slots == 0 {
		cfg.Slots = 1
	}
	if cfg.HoldMax == 0 {
		cfg.HoldMax = time.Second
	}
	h := &helperChild{
		cfg:    cfg,
		pid:    os.Getpid(),
		goCmd:  make(chan struct{}, 16),
		cancel: make(chan struct{}, 1),
		out:    bufio.NewWriter(os.Stdout),
	}
	ctx := context.Background()
	subPool, err := helperPool(ctx, cfg.DSN, cfg.subAppName(), int32(4+2*cfg.Subscribers*cfg.Slots))
	if err != nil {
		return fail(err)
	}
	defer subPool.Close()
	h.subPool = subPool
	recPool, err := helperPool(ctx, cfg.DSN, cfg.recAppName(), 8)
	if err != nil {
		return fail(err)
	}
	defer recPool.Close()
	h.rec = recPool
	h.recSQL = recordSQL(cfg.Schema)

	h.logger = watermill.NewStdLoggerWithOut(os.Stderr, true, false).With(watermill.LogFields{"proc": cfg.Name})
	for i := 0; i < cfg.Subscribers; i++ {
		sub, err := h.newSubscriber(i)
		if err != nil {
			return fail(err)
		}
		h.subs = append(h.subs, sub)
	}

	if cfg.ReportMaintainer {
		stop := h.reportMaintainer()
		defer stop()
	}

	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go h.readCommands()

	switch cfg.Mode {
	case modeRouter:
		err = h.runRouter(term)
	case modeChurn:
		err = h.runChurn(term)
	case modeRoam:
		err = h.runRoam(term)
	case modeTx:
		err = h.runTx(term)
	case modeReadme:
		err = h.runReadme(term)
	case modeRetry:
		err = h.runRetry(term)
	default:
		err = fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

func helperPool(ctx context.Context, dsn, app string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, cfg)
}

// helperChild is the state of a helper process.
type helperChild struct {
	cfg     helperConfig
	pid     int
	logger  watermill.LoggerAdapter
	subPool *pgxpool.Pool
	// subs are the Subscribers the helper starts with; modeRoam closes
	// them and goes on with new ones of its own.
	subs   []*pglease.Subscriber
	rec    *pgxpool.Pool
	recSQL string
	goCmd  chan struct{}
	cancel chan struct{}

	outMu sync.Mutex
	out   *bufio.Writer

	gateMu  sync.Mutex
	closing bool
	working sync.WaitGroup
}

// newSubscriber returns a Subscriber of the helper's group; i numbers it
// in processedTable and in the log.
func (h *helperChild) newSubscriber(i int) (*pglease.Subscriber, error) {
	return pglease.NewSubscriber(h.subPool, pglease.SubscriberConfig{
		ConsumerGroup:    h.cfg.Group,
		SessionTTL:       h.cfg.SessionTTL,
		PollInterval:     h.cfg.PollInterval,
		NackResendDelay:  10 * time.Millisecond,
		MaxInFlight:      h.cfg.MaxInFlight,
		BatchSize:        h.cfg.BatchSize,
		CommitInterval:   h.cfg.CommitInterval,
		Retry:            h.cfg.Retry,
		InitializeSchema: true,
		Tables:           pglease.Tables{Schema: h.cfg.Schema},
	}, h.logger.With(watermill.LogFields{"sub": i}))
}

func (h *helperChild) say(line string) {
	h.outMu.Lock()
	defer h.outMu.Unlock()
	_, _ = h.out.WriteString(line + "\n")
	_ = h.out.Flush()
}

// reportMaintainer samples, every 10 ms until the returned stop is called,
// whether one of h.subs is the maintainer (Stats().Maintainer), and prints
// each change:
//
//	"maintainer true <at> <terms>"          seen to be at <at>
//	"maintainer false <at> <last> <terms>"  seen not to be at <at>, last
//	                                        seen to be at <last>
//
// with times in Unix nanoseconds and terms the sum of MaintainerTerms. A
// new term between two samples is a change too: false, then true. stop
// takes a last sample, after the mode closed the Subscribers.
func (h *helperChild) reportMaintainer() (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var was bool
		var terms uint64
		var last time.Time
		sample := func() {
			now := time.Now()
			is, n := false, uint64(0)
			for _, sub := range h.subs {
				st := sub.Stats()
				is = is || st.Maintainer
				n += st.MaintainerTerms
			}
			if was && (!is || n != terms) {
				h.say(fmt.Sprintf("maintainer false %d %d %d", now.UnixNano(), last.UnixNano(), terms))
				was = false
			}
			if is && !was {
				h.say(fmt.Sprintf("maintainer true %d %d", now.UnixNano(), n))
			}
			was, terms = is, n
			if is {
				last = now
			}
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-tick.C:
			case <-done:
				sample()
				return
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

func (h *helperChild) readCommands() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "go":
			h.goCmd <- struct{}{}
		case "cancel":
			h.cancel <- struct{}{}
		}
	}
}

// enter admits one message into processing unless the helper is shutting
// down; leave ends it. drain stops admitting and waits for those admitted.
func (h *helperChild) enter() bool {
	h.gateMu.Lock()
	defer h.gateMu.Unlock()
	if h.closing {
		return false
	}
	h.working.Add(1)
	return true
}

func (h *helperChild) leave() { h.working.Done() }

func (h *helperChild) drain() {
	h.gateMu.Lock()
	h.closing = true
	h.gateMu.Unlock()
	h.working.Wait()
}

// record stores that subscriber sub processed msg of topic, on the
// message's context: a handler that follows its message's context stops
// when the library cancels it (ownership lost, subscription ended).
func (h *helperChild) record(sub int, topic string, msg *message.Message, received time.Time) error {
	return h.recordOn(msg.Context(), sub, topic, msg, received)
}

// recordOn is record on ctx.
func (h *helperChild) recordOn(ctx context.Context, sub int, topic string, msg *message.Message, received time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	partition, ok := pglease.MessagePartitionFromCtx(msg.Context())
	if !ok {
		return errors.New("delivered message without its partition in its context")
	}
	_, err := h.rec.Exec(ctx, h.recSQL, h.cfg.Name, sub, h.pid, streamName(topic, partition), msg.UUID, received,
		h.cfg.Group, topic, partition)
	return err
}

// process handles one message: work, record, ack. It reports whether the
// message was acked; a failed record nacks it, to be delivered again.
func (h *helperChild) process(sub int, topic string, msg *message.Message) bool {
	received := time.Now()
	time.Sleep(h.cfg.Work)
	if err := h.record(sub, topic, msg, received); err != nil {
		msg.Nack()
		return false
	}
	if msg.Metadata.Get(holdMetadata) == h.cfg.Name {
		h.say("holding " + msg.UUID)
		<-h.goCmd
	}
	msg.Ack()
	return true
}

func (h *helperChild) runRouter(term <-chan os.Signal) error {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var handlers []*message.Handler
	for i, sub := range h.subs {
		for _, topic := range h.cfg.Topics {
			handlers = append(handlers, router.AddConsumerHandler(fmt.Sprintf("%d/%s", i, topic), topic, sub,
				func(msg *message.Message) error {
					if !h.enter() {
						return errHelperClosing // nacked: the next owner delivers it
					}
					defer h.leave()
					if !h.process(i, topic, msg) {
						return errors.New("message not recorded")
					}
					return nil
				}))
		}
		// A handler that is never stopped keeps the Router running after
		// "cancel" stopped the others: a Router whose handlers all stopped
		// closes itself, and with it the Subscribers.
		if !h.cfg.NoKeepalive {
			router.AddConsumerHandler(fmt.Sprintf("%d/keepalive", i), "keepalive-"+h.cfg.Name, sub,
				func(*message.Message) error { return nil })
		}
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return fmt.Errorf("router stopped before running: %w", err)
	}
	h.say("ready")
	for {
		select {
		case <-term:
			began := time.Now()
			h.drain()
			drained := time.Now()
			if err := router.Close(); err != nil {
				return err
			}
			routerClosed := time.Now()
			for _, sub := range h.subs {
				if err := sub.Close(); err != nil {
					return err
				}
			}
			fmt.Fprintf(os.Stderr, "helper: closing took %s (drain %s, Router.Close %s, Subscriber.Close %s)\n",
				time.Since(began), drained.Sub(began), routerClosed.Sub(drained), time.Since(routerClosed))
			h.say("closed " + time.Since(began).String())
			return nil
		case <-h.cancel:
			h.drain()
			for _, hd := range handlers {
				hd.Stop()
			}
			for _, hd := range handlers {
				<-hd.Stopped()
			}
			h.say("stopped")
		case err := <-runErr:
			return fmt.Errorf("router stopped by itself: %v", err)
		}
	}
}

// runReadme runs the README's Router pattern as it is: one handler per
// (Subscriber, topic) that works, records the message and returns nil (the
// Router acks), Run with a context that SIGTERM cancels, then the
// Subscribers closed (the README's defers). The handler's work does not
// follow its message's context (like the README's, which prints), and the
// helper has no gate of its own: on SIGTERM the Router and the
// Subscribers deal with the handlers under way as they do.
func (h *helperChild) runReadme(term <-chan os.Signal) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := make(chan time.Time, 1)
	go func() {
		<-term
		began <- time.Now()
		cancel()
	}()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	for i, sub := range h.subs {
		for _, topic := range h.cfg.Topics {
			router.AddConsumerHandler(fmt.Sprintf("%d/%s", i, topic), topic, sub, func(msg *message.Message) error {
				received := time.Now()
				time.Sleep(h.cfg.Work)
				return h.recordOn(context.Background(), i, topic, msg, received)
			})
		}
	}
	go func() {
		select {
		case <-router.Running():
			h.say("ready")
		case <-ctx.Done():
		}
	}()
	if err := router.Run(ctx); err != nil {
		return err
	}
	for _, sub := range h.subs {
		if err := sub.Close(); err != nil {
			return err
		}
	}
	h.say("closed " + time.Since(<-began).String())
	return nil
}

func (h *helperChild) runChurn(term <-chan os.Signal) error {
	stop := make(chan struct{})
	var started, done sync.WaitGroup
	errs := make(chan error, len(h.subs)*len(h.cfg.Topics))
	for i, sub := range h.subs {
		for _, topic := range h.cfg.Topics {
			started.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				if err := h.churn(sub, i, topic, stop, started.Done); err != nil {
					errs <- err
				}
			}()
		}
	}
	started.Wait()
	h.say("ready")
	select {
	case <-term:
	case err := <-errs:
		return err
	}
	began := time.Now()
	close(stop)
	done.Wait()
	for _, sub := range h.subs {
		if err := sub.Close(); err != nil {
			return err
		}
	}
	h.say("closed " + time.Since(began).String())
	return nil
}

func (h *helperChild) runRoam(term <-chan os.Signal) error {
	stop := make(chan struct{})
	var started, done sync.WaitGroup
	errs := make(chan error, len(h.subs))
	for i := range h.subs {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			if err := h.roamSubscriber(i, stop, started.Done); err != nil {
				errs <- err
			}
		}()
	}
	started.Wait()
	h.say("ready")
	var err error
	select {
	case <-term:
	case err = <-errs:
	}
	began := time.Now()
	close(stop)
	done.Wait()
	if err != nil {
		return err
	}
	select {
	case err := <-errs:
		return err
	default:
	}
	h.say("closed " + time.Since(began).String())
	return nil
}

// roamSubscriber runs the subscriptions of Subscriber i until stop, then
// closes it. With RenewMax set, it closes the Subscriber after a random
// lifetime and goes on with a new one. started is called once the first
// Subscriber's subscriptions have begun.
func (h *helperChild) roamSubscriber(i int, stop <-chan struct{}, started func()) error {
	sub := h.subs[i]
	var once sync.Once
	for {
		renew := make(chan struct{})
		lifetime := time.AfterFunc(time.Duration(math.MaxInt64), func() { close(renew) })
		if h.cfg.RenewMax > 0 {
			lifetime.Reset(h.cfg.RenewMax/4 + rand.N(h.cfg.RenewMax*3/4))
		}
		pick := newTopicPicker(h.cfg.Topics)
		var slots, begun sync.WaitGroup
		errs := make(chan error, h.cfg.Slots)
		for range h.cfg.Slots {
			slots.Add(1)
			begun.Add(1)
			go func() {
				defer slots.Done()
				if err := h.roam(sub, i, pick, stop, renew, begun.Done); err != nil {
					errs <- err
				}
			}()
		}
		begun.Wait()
		once.Do(started)
		slots.Wait()
		lifetime.Stop()
		closeErr := sub.Close()
		select {
		case err := <-errs:
			return err
		default:
		}
		if closeErr != nil {
			return closeErr
		}
		select {
		case <-stop:
			return nil
		default:
		}
		var err error
		if sub, err = h.newSubscriber(i); err != nil {
			return err
		}
	}
}

// roam subscribes sub to one random topic after another until stop or
// renew is closed. Each subscription ends after a random number of
// messages in [ChurnMin, ChurnMax] or a random time up to HoldMax,
// whichever comes first, between messages; messages handed out after that
// are nacked unprocessed. begun is called after the first Subscribe call.
func (h *helperChild) roam(sub *pglease.Subscriber, i int, pick *topicPicker, stop, renew <-chan struct{}, begun func()) error {
	first := true
	for {
		topic := pick.take()
		ctx, cancel := context.WithCancel(context.Background())
		msgs, err := sub.Subscribe(ctx, topic)
		if first {
			begun()
			first = false
		}
		if err != nil {
			cancel()
			pick.put(topic)
			return fmt.Errorf("subscribe %d to %s: %w", i, topic, err)
		}
		quota := h.cfg.ChurnMin + rand.N(h.cfg.ChurnMax-h.cfg.ChurnMin+1)
		hold := time.NewTimer(time.Duration(1 + rand.N(int64(h.cfg.HoldMax))))
		ended := false
	loop:
		for quota > 0 {
			select {
			case msg, ok := <-msgs:
				if !ok {
					hold.Stop()
					cancel()
					return fmt.Errorf("subscription %d to %s closed by itself", i, topic)
				}
				if h.process(i, topic, msg) {
					quota--
				}
			case <-hold.C:
				break loop
			case <-stop:
				ended = true
				break loop
			case <-renew:
				ended = true
				break loop
			}
		}
		hold.Stop()
		cancel()
		for msg := range msgs {
			msg.Nack()
		}
		pick.put(topic)
		if ended {
			return nil
		}
		select {
		case <-stop:
			return nil
		case <-renew:
			return nil
		case <-time.After(time.Duration(rand.N(20)) * time.Millisecond):
		}
	}
}

// topicPicker hands out random topics, each to one subscription of a
// Subscriber at a time while there are enough of them. It is safe for
// concurrent use.
type topicPicker struct {
	mu     sync.Mutex
	topics []string
	held   map[string]int
}

func newTopicPicker(topics []string) *topicPicker {
	return &topicPicker{topics: topics, held: map[string]int{}}
}

// take returns a random topic, one that is not held if there is one.
func (p *topicPicker) take() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var free []string
	for _, t := range p.topics {
		if p.held[t] == 0 {
			free = append(free, t)
		}
	}
	if len(free) == 0 {
		free = p.topics
	}
	t := free[rand.N(len(free))]
	p.held[t]++
	return t
}

func (p *topicPicker) put(topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held[topic]--
}

// churn subscribes sub to topic again and again: each subscription ends
// after it processed a random number of messages in [ChurnMin, ChurnMax].
// A subscription is only ever ended between messages, and messages handed
// out after that are nacked unprocessed, so every handover is clean.
func (h *helperChild) churn(sub *pglease.Subscriber, i int, topic string, stop <-chan struct{}, started func()) error {
	first := true
	for {
		ctx, cancel := context.WithCancel(context.Background())
		msgs, err := sub.Subscribe(ctx, topic)
		if first {
			started()
			first = false
		}
		if err != nil {
			cancel()
			return fmt.Errorf("subscribe %d to %s: %w", i, topic, err)
		}
		quota := h.cfg.ChurnMin + rand.N(h.cfg.ChurnMax-h.cfg.ChurnMin+1)
		stopped := false
		for quota > 0 && !stopped {
			select {
			case msg, ok := <-msgs:
				if !ok {
					cancel()
					return fmt.Errorf("subscription %d to %s closed by itself", i, topic)
				}
				if h.process(i, topic, msg) {
					quota--
				}
			case <-stop:
				stopped = true
			}
		}
		cancel()
		for msg := range msgs {
			msg.Nack()
		}
		if stopped {
			return nil
		}
		select {
		case <-stop:
			return nil
		case <-time.After(time.Duration(rand.N(20)) * time.Millisecond):
		}
	}
}

// ------------------------------------------------------------ test side

// lockedBuffer collects a helper's standard error.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// helperProc is a helper process started by a test. It is killed and
// reaped when the test ends, whatever state it is in.
type helperProc struct {
	cfg    helperConfig
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *lockedBuffer
	exited chan struct{}
	err    error // the exit status, once exited is closed
}

// startHelper starts a helper process running cfg and waits until it is
// ready.
func startHelper(t *testing.T, cfg helperConfig) *helperProc {
	t.Helper()
	h := launchHelper(t, cfg)
	h.waitLine(t, "ready", time.Minute)
	return h
}

// startHelpers starts a helper process for each of cfgs at once and waits
// until they are all ready: the processes start up in parallel.
func startHelpers(t *testing.T, cfgs ...helperConfig) []*helperProc {
	t.Helper()
	hs := make([]*helperProc, len(cfgs))
	for i, cfg := range cfgs {
		hs[i] = launchHelper(t, cfg)
	}
	for _, h := range hs {
		h.waitLine(t, "ready", time.Minute)
	}
	return hs
}

// launchHelper starts a helper process running cfg; it is not ready yet.
func launchHelper(t *testing.T, cfg helperConfig) *helperProc {
	t.Helper()
	if cfg.DSN == "" {
		cfg.DSN = testkit.DSN
	}
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperConfigEnv+"="+string(js))
	return launchProcess(t, cfg, cmd)
}

// launchProcess starts cmd, a process that talks to the test as a helper
// does; cfg names it (cfg.Name).
func launchProcess(t *testing.T, cfg helperConfig, cmd *exec.Cmd) *helperProc {
	t.Helper()
	h := &helperProc{cfg: cfg, cmd: cmd, lines: make(chan string, 1024), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = h.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	h.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
		h.err = cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // also ends a stopped process
		<-h.exited
		logs := h.stderr.String()
		if strings.Contains(logs, "WARNING: DATA RACE") {
			t.Errorf("helper %s: the race detector found a data race:\n%s", cfg.Name, logs)
		} else if t.Failed() || os.Getenv("PGLEASE_TEST_HELPER_LOG") != "" {
			t.Logf("log of helper %s (pid %d):\n%s", cfg.Name, cmd.Process.Pid, tail(logs, 200))
		}
		// The whole log, which the test output cuts to its tail.
		if dir := os.Getenv("PGLEASE_TEST_HELPER_LOG_DIR"); dir != "" {
			name := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+cfg.Name+".log")
			if err := os.WriteFile(name, []byte(logs), 0o644); err != nil {
				t.Errorf("write the log of helper %s: %v", cfg.Name, err)
			}
		}
	})
	return h
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = append([]string{fmt.Sprintf("[... %d lines]", len(parts)-lines)}, parts[len(parts)-lines:]...)
	}
	return strings.Join(parts, "\n")
}

func (h *helperProc) pid() int { return h.cmd.Process.Pid }

// waitLine waits for the process to print a line starting with prefix and
// returns that line.
func (h *helperProc) waitLine(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				<-h.exited
				t.Fatalf("helper %s exited (%v) before printing %q; log:\n%s", h.cfg.Name, h.err, prefix, tail(h.stderr.String(), 50))
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			t.Fatalf("helper %s did not print %q within %s", h.cfg.Name, prefix, timeout)
		}
	}
}

func (h *helperProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Signal(sig), "signal %s to helper %s", sig, h.cfg.Name)
}

// command writes one line to the process's standard input. A stopped
// process reads it when it continues.
func (h *helperProc) command(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(h.stdin, line+"\n")
	require.NoError(t, err, "command %q to helper %s", line, h.cfg.Name)
}

// close sends SIGTERM, waits for a clean exit and returns how long the
// process took to close its Router and Subscribers.
func (h *helperProc) close(t *testing.T) time.Duration {
	t.Helper()
	h.signal(t, syscall.SIGTERM)
	line := h.waitLine(t, "closed ", 30*time.Second)
	took, err := time.ParseDuration(strings.TrimPrefix(line, "closed "))
	require.NoError(t, err)
	select {
	case <-h.exited:
		require.NoError(t, h.err, "helper %s exit status", h.cfg.Name)
	case <-time.After(30 * time.Second):
		t.Fatalf("helper %s did not exit after closing", h.cfg.Name)
	}
	return took
}

// alive reports whether the process is still running.
func (h *helperProc) alive() bool {
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

func (h *helperProc) logs() string { return h.stderr.String() }

// TestExclusiveOwnershipAcrossProcesses runs two Subscribers of one group in
// two processes: the standby processes nothing while the owner lives, and a
// clean close of the owner hands the topic over at once, exactly after its
// last acked message.
func TestExclusiveOwnershipAcrossProcesses(t *testing.T) {
	pool := newPool(t, 5)
	adapter := newSchema(t, pool)
	instrument(t, pool, adapter)
	pub := newPublisher(t, pool, adapter)
	const group, topic = "billing", "orders"
	cfg := helperConfig{Schema: adapter.Schema, Group: group, Topics: []string{topic}, Mode: modeRouter,
		SessionTTL: 10 * time.Second, PollInterval: pglease.DefaultPollInterval}

	a := startHelper(t, cfg.named("A"))
	waitFor(t, 10*time.Second, "A to claim the topic", func() bool { return ownerPID(pool, adapter, group, topic) == a.pid() })
	startHelper(t, cfg.named("B"))
	publishN(t, pub, topic, 20)
	waitProcessed(t, pool, adapter, []string{topic}, 10*time.Second)
	n, err := countProcessed(pool, adapter, "B", time.Time{})
	require.NoError(t, err)
	require.Zero(t, n, "the standby process processed messages while the owner was alive")

	a.close(t)
	closedAt := time.Now()
	publishN(t, pub, topic, 5)
	waitProcessed(t, pool, adapter, []string{topic}, cfg.SessionTTL/2)
	t.Logf("handover after Close: %s (session TTL %s)", time.Since(closedAt), cfg.SessionTTL)

	h := loadHistory(t, pool, adapter, group)
	sum := h.verify(t, []string{topic})
	require.Zero(t, sum.duplicates)
	recs := h.recordsOf("B")
	require.Len(t, recs, 5)
	require.Equal(t, 20, recs[0].idx, "B starts right after A's last acked message")
}

// TestCleanShutdownDeliversNothingTwice: a process that runs the README's
// Router pattern (modeReadme, 20 ms handlers) and gets SIGTERM mid-run
// while messages are out: the Subscriber hands nothing more out, waits for
// the handlers under way to finish, and releases their Acks, so the next
// process delivers none of them again, with MaxInFlight 1 and 32.
func TestCleanShutdownDeliversNothingTwice(t *testing.T) {
	parallel(t)
	if testing.Short() {
		t.Skip("runs helper processes for several seconds")
	}
	for _, tc := range []struct{ maxInFlight, messages, termAfter int }{
		{maxInFlight: 1, messages: 300, termAfter: 40},
		{maxInFlight: 32, messages: 3000, termAfter: 600},
	} {
		t.Run(fmt.Sprintf("MaxInFlight %d", tc.maxInFlight), func(t *testing.T) {
			pool := newPool(t, 5)
			adapter := newSchema(t, pool)
			instrument(t, pool, adapter)
			pub := newPublisher(t, pool, adapter)
			msgs := make([]*message.Message, tc.messages)
			for i := range msgs {
				msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
				msgs[i].Metadata.Set(pglease.PartitionKeyMetadata, fmt.Sprintf("k%02d", i%64))
			}
			require.NoError(t, pub.Publish("t", msgs...))
			cfg := helperConfig{Schema: adapter.Schema, Group: "g", Topics: []string{"t"}, Mode: modeReadme,
				// A clean hand-over does not wait for the TTL; a long one keeps
				// a process slowed by a loaded machine from self-fencing,
				// which is an unclean end (redelivery allowed).
				Work: 20 * time.Millisecond, SessionTTL: 10 * time.Second, PollInterval: 100 * time.Millisecond,
				MaxInFlight: tc.maxInFlight}
			a := startHelper(t, cfg.named("A"))
			waitProgress(t, pool, adapter, "A", time.Time{}, tc.termAfter, time.Minute)
			took := a.close(t)
			b := startHelper(t, cfg.named("B"))
			waitProcessed(t, pool, adapter, []string{"t"}, 2*time.Minute)
			b.close(t)

			recs := loadKeyed(t, pool, adapter, "t")
			seen := map[string]int{}
			var dups []string
			for _, r := range recs {
				if seen[r.uuid]++; seen[r.uuid] == 2 {
					dups = append(dups, r.uuid)
				}
			}
			nA, _, _ := throughput(recs, "A")
			t.Logf("A processed %d messages and closed in %s after SIGTERM; %d processed twice", nA, took, len(dups))
			require.Len(t, seen, tc.messages, "messages lost")
			require.Empty(t, dups, "messages processed twice after a clean shutdown")
			require.Zero(t, checkKeyOrder(recs), "a key handled out of order or two of a key at once")
		})
	}
}
