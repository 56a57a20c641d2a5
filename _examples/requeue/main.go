// Command requeue retries failed messages later, with Watermill's own
// components on pglease. A handler fails the first two attempts at each
// order. Its middlewares, DelayOnError (inner) then PoisonQueue (outer),
// give the failed message a delay (1s, then 2s) and publish it to a
// requeue topic; pglease holds it there until it is due. A requeuer on the
// same Router then publishes it back to the topic it failed on, where the
// handler gets it again. At the end the program checks that every order
// succeeded once and that no retry came before its due time. (Watermill
// writes the due time in whole seconds, rounded down: a retry can come up
// to a second sooner after its failure than the delay says.)
//
// It reads the PostgreSQL connection string from DATABASE_URL; run it with
// `go run ./internal/cmd/localpg run -- go run ./_examples/requeue`, which starts a
// throwaway local PostgreSQL and sets it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/components/requeuer"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

const (
	orders   = 5
	failures = 2 // each order fails this many times, then succeeds
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// attempt is one call of the handler.
type attempt struct {
	at      time.Time
	due     time.Time // when the retry was due (zero on the first attempt)
	delay   string    // the delay DelayOnError gave the previous failure
	retries string    // the requeuer's count
}

func run() error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return fmt.Errorf("DATABASE_URL is not set (run it through `go run ./internal/cmd/localpg run --`, which starts a local PostgreSQL)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := watermill.NewStdLogger(false, false)

	// A run of its own: topics named after it.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	ordersTopic, requeueTopic := "orders-"+run, "requeue-"+run

	publisher, err := pglease.NewPublisher(pool, pglease.PublisherConfig{AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	defer publisher.Close()
	// One Subscriber serves both topics. Every Subscriber is also a
	// candidate for the maintainer, which moves delayed messages into
	// their topic when they are due.
	subscriber, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "fulfilment",
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}

	var (
		mu        sync.Mutex
		attempts  = map[string][]attempt{}
		succeeded int
		done      = make(chan struct{})
	)
	handler := router.AddConsumerHandler("fulfil", ordersTopic, subscriber, func(msg *message.Message) error {
		a := attempt{at: time.Now(), delay: msg.Metadata.Get(delay.DelayedForKey), retries: msg.Metadata.Get(requeuer.RetriesKey)}
		a.due, _ = time.Parse(time.RFC3339, msg.Metadata.Get(delay.DelayedUntilKey))
		mu.Lock()
		defer mu.Unlock()
		attempts[msg.UUID] = append(attempts[msg.UUID], a)
		n := len(attempts[msg.UUID])
		if n <= failures {
			return fmt.Errorf("attempt %d fails", n)
		}
		if n == failures+1 {
			succeeded++
			if succeeded == orders {
				close(done)
			}
		}
		return nil
	})
	// Middleware added first runs outermost: DelayOnError sets the delay
	// metadata on the failed message, then PoisonQueue publishes it to the
	// requeue topic and acknowledges it on the orders topic.
	poison, err := middleware.PoisonQueue(publisher, requeueTopic)
	if err != nil {
		return err
	}
	retryLater := middleware.DelayOnError{InitialInterval: time.Second, Multiplier: 2, MaxInterval: 4 * time.Second}
	handler.AddMiddleware(poison, retryLater.Middleware)

	// The requeuer adds its handler to the same Router: it receives a
	// message from the requeue topic once it is due, counts the retry in
	// its metadata and publishes it back to the topic it failed on.
	if _, err := requeuer.NewRequeuer(requeuer.Config{
		Subscriber:     subscriber,
		SubscribeTopic: requeueTopic,
		Publisher:      publisher,
		GeneratePublishTopic: func(p requeuer.GeneratePublishTopicParams) (string, error) {
			if topic := p.Message.Metadata.Get(middleware.PoisonedTopicKey); topic != "" {
				return topic, nil
			}
			return "", errors.New("no poisoned-topic metadata")
		},
		Router: router,
	}, logger); err != nil {
		return err
	}

	start := time.Now()
	var ids []string
	for i := 1; i <= orders; i++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		ids = append(ids, msg.UUID)
		if err := publisher.Publish(ordersTopic, msg); err != nil {
			return err
		}
	}
	fmt.Printf("published %d orders to %q; each fails %d times, then succeeds\n", orders, ordersTopic, failures)

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-done:
	case err := <-runErr:
		return fmt.Errorf("router stopped early: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("timed out waiting for the orders")
	}
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-runErr; err != nil {
		return err
	}
	if err := subscriber.Close(); err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	var wrong []string
	for i, id := range ids {
		var line []string
		for n, a := range attempts[id] {
			at := fmt.Sprintf("%.1fs", a.at.Sub(start).Seconds())
			if n == 0 {
				line = append(line, at)
				continue
			}
			line = append(line, fmt.Sprintf("%s (retry %s, delayed %s)", at, a.retries, a.delay))
			if a.due.IsZero() || a.at.Before(a.due) || a.retries != strconv.Itoa(n) {
				wrong = append(wrong, fmt.Sprintf("order %d, attempt %d: at %s, due %s, retries %q",
					i+1, n+1, a.at.Format(time.RFC3339Nano), a.due.Format(time.RFC3339), a.retries))
			}
		}
		fmt.Printf("order %d: attempts at %s\n", i+1, strings.Join(line, ", "))
		if len(attempts[id]) != failures+1 {
			wrong = append(wrong, fmt.Sprintf("order %d: %d attempts, want %d", i+1, len(attempts[id]), failures+1))
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("retries went wrong:\n%s", strings.Join(wrong, "\n"))
	}
	fmt.Println("every order succeeded once, each retry no earlier than its due time")
	return nil
}
