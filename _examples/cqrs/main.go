// Command cqrs runs Watermill's CQRS component on pglease: an event bus
// publishes OrderPlaced events, and two event handlers of that event each
// receive every one of them. It exits non-zero when a handler misses an
// event.
//
// Each handler gets a Subscriber of its own whose consumer group is the
// handler's name (EventProcessorConfig.SubscriberConstructor). The
// Subscribers of one group share a topic's messages, so one Subscriber for
// every handler, or a Subscriber each that all leave ConsumerGroup empty,
// would give each event to one handler only.
//
// It reads the PostgreSQL connection string from DATABASE_URL (`make pg`
// starts a throwaway local PostgreSQL and sets it).
package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

// OrderPlaced is the event. Run tells this run's events from those an
// earlier run left in the same database (a new group starts at the
// beginning of a topic).
type OrderPlaced struct {
	Run     string `json:"run"`
	OrderID int    `json:"order_id"`
}

const events = 10

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return fmt.Errorf("DATABASE_URL is not set (run `make pg`, which starts a local PostgreSQL)")
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

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	marshaler := cqrs.JSONMarshaler{}

	// One Subscriber per handler, its group the handler's name. They are
	// closed at the end: Close deletes each one's session at once instead
	// of leaving it to expire.
	var subscribers []*pglease.Subscriber
	defer func() {
		for _, s := range subscribers {
			_ = s.Close()
		}
	}()
	processor, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(p cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) {
			return p.EventName, nil
		},
		SubscriberConstructor: func(p cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			s, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
				ConsumerGroup:    p.HandlerName,
				InitializeSchema: true,
			}, logger)
			if err == nil {
				subscribers = append(subscribers, s)
			}
			return s, err
		},
		Marshaler: marshaler,
		Logger:    logger,
	})
	if err != nil {
		return err
	}

	runID := watermill.NewShortUUID()
	var (
		mu   sync.Mutex
		seen = map[string]map[int]bool{}
		done = make(chan struct{})
	)
	handlers := []string{"send-confirmation", "update-sales-report"}
	for _, name := range handlers {
		seen[name] = map[int]bool{}
		err := processor.AddHandlers(cqrs.NewEventHandler(name, func(_ context.Context, e *OrderPlaced) error {
			if e.Run != runID {
				return nil // left over from an earlier run
			}
			mu.Lock()
			defer mu.Unlock()
			seen[name][e.OrderID] = true
			fmt.Printf("%s: order %d\n", name, e.OrderID)
			for _, h := range handlers {
				if len(seen[h]) < events {
					return nil
				}
			}
			close(done)
			return nil
		}))
		if err != nil {
			return err
		}
	}

	bus, err := cqrs.NewEventBusWithConfig(publisher, cqrs.EventBusConfig{
		GeneratePublishTopic: func(p cqrs.GenerateEventPublishTopicParams) (string, error) {
			return p.EventName, nil
		},
		Marshaler: marshaler,
		Logger:    logger,
	})
	if err != nil {
		return err
	}
	for i := 1; i <= events; i++ {
		if err := bus.Publish(ctx, &OrderPlaced{Run: runID, OrderID: i}); err != nil {
			return err
		}
	}

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-done:
		fmt.Printf("each of %d handlers received all %d events\n", len(handlers), events)
	case err := <-runErr:
		return fmt.Errorf("router stopped early: %w", err)
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("timed out: events received per handler: %s %d, %s %d (of %d each)",
			handlers[0], len(seen[handlers[0]]), handlers[1], len(seen[handlers[1]]), events)
	}
	if err := router.Close(); err != nil {
		return err
	}
	return <-runErr
}
