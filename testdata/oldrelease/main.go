// Command oldmember is a member of a consumer group built from an earlier
// release of pglease by TestRollingDeploy (rolling_test.go): the test
// copies this file into a checkout of that release and builds it there.
// It uses only API that every release since schema version 8 has, so that
// it builds against any of them.
//
// Its settings come as JSON in PGLEASE_OLD_MEMBER. With Setup set, it
// creates the tables of its release and the topics, and exits. Otherwise
// it consumes Topics through a Watermill Router and records every message
// it processes with RecordSQL, and talks to the test on its standard
// streams, as the helper processes of process_test.go do:
//
//	stdout: "ready"             every handler is running
//	        "closed <duration>" after SIGTERM: everything closed, exiting 0
//	stderr: the library's log (info level)
//
// On SIGTERM it stops taking new messages (those handed out from then on
// are nacked, unprocessed), lets the messages under way finish and ack,
// then closes the Router and the Subscriber.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

type config struct {
	Name         string
	DSN          string
	Schema       string
	Group        string
	Topics       []string
	Partitions   map[string]int // Setup: the topics' partition counts
	SessionTTL   time.Duration
	PollInterval time.Duration
	Work         time.Duration
	// RecordSQL is run for each message processed with: Name, 0, the
	// process id, the stream (topic, or topic#partition), the message's
	// UUID, when it was received, Group, the topic and the partition.
	RecordSQL string
	Setup     bool
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "oldmember:", err)
		os.Exit(2)
	}
}

func run() error {
	var cfg config
	if err := json.Unmarshal([]byte(os.Getenv("PGLEASE_OLD_MEMBER")), &cfg); err != nil {
		return fmt.Errorf("PGLEASE_OLD_MEMBER: %w", err)
	}
	ctx := context.Background()
	pool, err := newPool(ctx, cfg.DSN, 10)
	if err != nil {
		return err
	}
	defer pool.Close()
	rec, err := newPool(ctx, cfg.DSN, 4)
	if err != nil {
		return err
	}
	defer rec.Close()
	adapter := pglease.DefaultSchemaAdapter{Schema: cfg.Schema} // named Tables since
	if cfg.Setup {
		for _, topic := range cfg.Topics {
			if err := pglease.CreateTopic(ctx, pool, topic, pglease.TopicConfig{Partitions: cfg.Partitions[topic],
				SchemaAdapter: adapter, InitializeSchema: true}); err != nil {
				return err
			}
		}
		return nil
	}

	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false).With(watermill.LogFields{"proc": cfg.Name})
	sub, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    cfg.Group,
		SessionTTL:       cfg.SessionTTL,
		PollInterval:     cfg.PollInterval,
		InitializeSchema: true,
		SchemaAdapter:    adapter,
	}, logger)
	if err != nil {
		return err
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)

	var (
		mu      sync.Mutex
		closing bool
		working sync.WaitGroup
	)
	enter := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if closing {
			return false
		}
		working.Add(1)
		return true
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	for _, topic := range cfg.Topics {
		router.AddConsumerHandler(topic, topic, sub, func(msg *message.Message) error {
			if !enter() {
				return errors.New("shutting down") // nacked: the next owner delivers it
			}
			defer working.Done()
			received := time.Now()
			time.Sleep(cfg.Work)
			partition, ok := pglease.MessagePartitionFromCtx(msg.Context())
			if !ok {
				return errors.New("delivered message without its partition in its context")
			}
			stream := topic
			if partition != 0 {
				stream = fmt.Sprintf("%s#%d", topic, partition)
			}
			rctx, cancel := context.WithTimeout(msg.Context(), 10*time.Second)
			defer cancel()
			_, err := rec.Exec(rctx, cfg.RecordSQL, cfg.Name, 0, os.Getpid(), stream, msg.UUID, received,
				cfg.Group, topic, partition)
			return err
		})
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return fmt.Errorf("router stopped before running: %w", err)
	}
	fmt.Println("ready")
	select {
	case <-term:
	case err := <-runErr:
		return fmt.Errorf("router stopped by itself: %v", err)
	}
	began := time.Now()
	mu.Lock()
	closing = true
	mu.Unlock()
	working.Wait()
	if err := router.Close(); err != nil {
		return err
	}
	if err := sub.Close(); err != nil {
		return err
	}
	fmt.Println("closed " + time.Since(began).String())
	return nil
}

func newPool(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, cfg)
}
