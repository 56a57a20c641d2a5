// Command basic publishes a few messages with pglease and consumes them
// through a Watermill Router, printing each one, then stops by itself.
//
// It reads the PostgreSQL connection string from DATABASE_URL; `make demo`
// starts a throwaway local PostgreSQL and sets it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

const (
	topic    = "orders.placed"
	messages = 10
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return fmt.Errorf("DATABASE_URL is not set (run `make demo`, which starts a local PostgreSQL)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := watermill.NewStdLogger(false, false)

	publisher, err := pglease.NewPublisher(pool, pglease.PublisherConfig{AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	defer publisher.Close()

	subscriber, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "demo", // a new group starts at the beginning of the topic
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	// On every return, also an early one: Close deletes the session row at
	// once instead of leaving it to expire. Closing twice is harmless.
	defer subscriber.Close()

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}

	// The handler stops the router once it has seen every message this run
	// published.
	want := map[string]bool{}
	done := make(chan struct{})
	router.AddConsumerHandler("print", topic, subscriber, func(msg *message.Message) error {
		if !want[msg.UUID] {
			return nil // left over from an earlier run on the same database
		}
		fmt.Printf("consumed %s: %s (metadata: %v)\n", msg.UUID, msg.Payload, msg.Metadata)
		delete(want, msg.UUID)
		if len(want) == 0 {
			close(done)
		}
		return nil
	})

	var batch []*message.Message
	for i := 1; i <= messages; i++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order": %d}`, i)))
		msg.Metadata.Set("source", "example")
		want[msg.UUID] = true
		batch = append(batch, msg)
	}
	// One Publish call stores all messages atomically, in order.
	if err := publisher.Publish(topic, batch...); err != nil {
		return err
	}
	fmt.Printf("published %d messages to %q\n", len(batch), topic)

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()

	select {
	case <-done:
		fmt.Println("all messages consumed")
	case err := <-runErr:
		return fmt.Errorf("router stopped early: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("timed out waiting for messages")
	}
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-runErr; err != nil {
		return err
	}
	return subscriber.Close()
}
