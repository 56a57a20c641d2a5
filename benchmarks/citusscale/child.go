package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// childConfig is what a client process runs: a Publisher ("pub") or a
// Subscriber ("sub") of its topics. It reads commands on standard input
// and answers each on standard output:
//
//	pub: "flat <duration ns> <batch>"  publish flat out, a goroutine per
//	                                   topic: "done <messages>"
//	     "rflat <duration ns> <batch>" flat, with RouteToWorkers (Route)
//	     "warm 0 0"                    a message per topic by each Publisher
//	                                   (catalog reads, connections): "done <messages>"
//	     "rate <msgs/s> <duration ns>" publish at that rate in all, one
//	                                   message per call: "done <messages>"
//	sub: "drain <n>"   subscribe to every topic (first time only) and
//	                   wait until n more messages were delivered: "drained <n>"
//	     "lat"         record latencies from now on: "lat"
//	     "wait <n>"    wait until n messages were delivered since "lat": "waited <n>"
//	     "report"      "latencies <ns> <ns> ..." of the recorded ones
//
// It starts with "ready" and exits at the end of its input.
type childConfig struct {
	Role    string
	DSN     string
	Topics  []string
	Verbose bool
	// Route: a second Publisher, with RouteToWorkers, for "rflat".
	Route bool
}

// sentKey is the metadata key of a message's publish time (Unix ns).
const sentKey = "sent"

// maxLatencies bounds the latencies a consumer keeps.
const maxLatencies = 1 << 20

func runChild(js string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "citusscale child:", err)
		return 2
	}
	if err := cfg.run(); err != nil {
		fmt.Fprintf(os.Stderr, "citusscale child %s: %v\n", cfg.Role, err)
		return 1
	}
	return 0
}

func (c childConfig) run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(len(c.Topics) + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if c.Verbose {
		logger = watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	}
	tables := pglease.Tables{Schema: schema}
	in := bufio.NewScanner(os.Stdin)
	switch c.Role {
	case "pub":
		pub, err := pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables}, logger)
		if err != nil {
			return err
		}
		defer pub.Close()
		rpub := pub
		if c.Route {
			if rpub, err = pglease.NewPublisher(pool, pglease.PublisherConfig{Tables: tables, RouteToWorkers: true}, logger); err != nil {
				return err
			}
			defer rpub.Close()
		}
		fmt.Println("ready")
		for in.Scan() {
			f := strings.Fields(in.Text())
			if len(f) != 3 {
				return fmt.Errorf("command %q", in.Text())
			}
			p, mode := pub, f[0]
			if mode == "rflat" {
				p, mode = rpub, "flat"
			}
			if mode == "warm" { // a message per topic by each Publisher, unmeasured
				n, err := c.publish(pub, "one", f[1], f[2])
				if err == nil && rpub != pub {
					var m int64
					m, err = c.publish(rpub, "one", f[1], f[2])
					n += m
				}
				if err != nil {
					return err
				}
				fmt.Println("done", n)
				continue
			}
			n, err := c.publish(p, mode, f[1], f[2])
			if err != nil {
				return err
			}
			fmt.Println("done", n)
		}
	case "sub":
		sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: group, Tables: tables}, logger)
		if err != nil {
			return err
		}
		defer sub.Close()
		s := &consumer{}
		fmt.Println("ready")
		subscribed := false
		var mark int64 // the count at the last "lat"
		for in.Scan() {
			f := strings.Fields(in.Text())
			switch {
			case len(f) == 2 && (f[0] == "drain" || f[0] == "wait"):
				n, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					return err
				}
				from := s.count.Load()
				if f[0] == "wait" {
					from = mark // n counts from the "lat" command
				}
				target := from + n
				if !subscribed {
					subscribed = true
					for _, t := range c.Topics {
						ch, err := sub.Subscribe(ctx, t)
						if err != nil {
							return err
						}
						go s.consume(ch)
					}
				}
				deadline := time.Now().Add(phaseLimit)
				for s.count.Load() < target {
					if time.Now().After(deadline) {
						return fmt.Errorf("%d of %d messages after %s", s.count.Load()-from, n, phaseLimit)
					}
					time.Sleep(time.Millisecond)
				}
				fmt.Println(map[string]string{"drain": "drained", "wait": "waited"}[f[0]], n)
			case len(f) == 1 && f[0] == "lat":
				s.mu.Lock()
				s.recording, s.latencies = true, s.latencies[:0]
				s.mu.Unlock()
				mark = s.count.Load()
				fmt.Println("lat")
			case len(f) == 1 && f[0] == "report":
				s.mu.Lock()
				var b strings.Builder
				b.WriteString("latencies")
				for _, d := range s.latencies {
					b.WriteByte(' ')
					b.WriteString(strconv.FormatInt(int64(d), 10))
				}
				s.mu.Unlock()
				fmt.Println(b.String())
			default:
				return fmt.Errorf("command %q", in.Text())
			}
		}
	default:
		return fmt.Errorf("role %q", c.Role)
	}
	return in.Err()
}

type consumer struct {
	count     atomic.Int64
	mu        sync.Mutex
	recording bool
	latencies []time.Duration
}

func (s *consumer) consume(ch <-chan *message.Message) {
	for msg := range ch {
		now := time.Now()
		if sent, err := strconv.ParseInt(msg.Metadata.Get(sentKey), 10, 64); err == nil {
			s.mu.Lock()
			if s.recording && len(s.latencies) < maxLatencies {
				s.latencies = append(s.latencies, now.Sub(time.Unix(0, sent)))
			}
			s.mu.Unlock()
		}
		msg.Ack()
		s.count.Add(1)
	}
}

// publish runs a "flat" or "rate" command and returns the number of
// messages published.
func (c childConfig) publish(pub *pglease.Publisher, mode, a, b string) (int64, error) {
	x, err := strconv.ParseFloat(a, 64)
	if err != nil {
		return 0, err
	}
	y, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		return 0, err
	}
	var (
		total    atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	began := time.Now()
	for i, topic := range c.Topics {
		wg.Go(func() {
			var err error
			switch mode {
			case "flat": // x: duration in ns, y: batch
				end := began.Add(time.Duration(x))
				for time.Now().Before(end) && err == nil {
					msgs := make([]*message.Message, y)
					for j := range msgs {
						msgs[j] = newMessage()
					}
					if err = pub.Publish(topic, msgs...); err == nil {
						total.Add(y)
					}
				}
			case "one": // a message
				if err = pub.Publish(topic, newMessage()); err == nil {
					total.Add(1)
				}
			case "rate": // x: messages per second in all, y: duration in ns
				interval := time.Duration(float64(len(c.Topics)) / x * float64(time.Second))
				// The topics' goroutines take turns, spread over the interval.
				next := began.Add(interval * time.Duration(i) / time.Duration(len(c.Topics)))
				end := began.Add(time.Duration(y))
				// Until the end, whatever was missed: a publisher that falls
				// behind skips the ticks it missed instead of catching up.
				for next.Before(end) && err == nil {
					time.Sleep(time.Until(next))
					if err = pub.Publish(topic, newMessage()); err == nil {
						total.Add(1)
					}
					next = next.Add(interval)
					if now := time.Now(); next.Before(now) {
						next = now
					}
				}
			default:
				err = fmt.Errorf("mode %q", mode)
			}
			if err != nil {
				errOnce.Do(func() { firstErr = err })
			}
		})
	}
	wg.Wait()
	return total.Load(), firstErr
}

func newMessage() *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte("payload of a benchmark message"))
	m.Metadata.Set(sentKey, strconv.FormatInt(time.Now().UnixNano(), 10))
	return m
}
