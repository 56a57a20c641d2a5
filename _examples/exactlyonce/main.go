// Command exactlyonce consumes payments and, for each one, credits an
// account, records the payment and publishes a receipt, all in one
// PostgreSQL transaction together with the consumer group's position
// (pglease.TxHandler, built on pglease.AckInTx). The first attempt at one
// payment fails after it wrote its effects: the transaction rolls back, the
// Router nacks the message, and the second attempt applies it once. At the
// end it checks that every payment was applied exactly once.
//
// It reads the PostgreSQL connection string from DATABASE_URL; run it with
// `go run ./internal/cmd/localpg run -- go run ./_examples/exactlyonce`, which starts
// a throwaway local PostgreSQL and sets it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/watermill-pglease"
)

const payments = 20

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
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

	// The application's own tables, in the same database as pglease's.
	// A run of its own: topics and accounts named after it.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	paymentsTopic, receiptsTopic := "payments-"+run, "receipts-"+run
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_accounts (
	id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS example_payments (
	message_uuid text NOT NULL, account text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return err
	}
	account := "acct-" + run

	publisher, err := pglease.NewPublisher(pool, pglease.PublisherConfig{AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	defer publisher.Close()
	var batch []*message.Message
	for i := 1; i <= payments; i++ {
		batch = append(batch, message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i))))
	}
	if err := publisher.Publish(paymentsTopic, batch...); err != nil {
		return err
	}
	fmt.Printf("published %d payments to %q (amounts 1 to %d, %d in total)\n",
		payments, paymentsTopic, payments, payments*(payments+1)/2)

	subscriber, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{
		ConsumerGroup:    "ledger",
		InitializeSchema: true,
		NackResendDelay:  10 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}

	var (
		mu       sync.Mutex
		failed   bool
		attempts int
		done     = make(chan struct{})
		applied  int
	)
	// handle runs inside the transaction that TxHandler opens; what it
	// writes with tx, the receipt it returns and the group's position
	// commit together.
	handle := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		amount, err := strconv.ParseInt(string(msg.Payload), 10, 64)
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO example_accounts (id, balance) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET balance = example_accounts.balance + EXCLUDED.balance`, account, amount); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO example_payments (message_uuid, account, amount) VALUES ($1, $2, $3)`,
			msg.UUID, account, amount); err != nil {
			return nil, err
		}
		mu.Lock()
		attempts++
		failNow := amount == 7 && !failed
		failed = failed || failNow
		mu.Unlock()
		if failNow {
			// After writing: the rollback undoes it, and the Router
			// delivers the payment again.
			return nil, errors.New("payment 7 fails once, after its effects were written")
		}
		receipt := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("received %d", amount)))
		return []*message.Message{receipt}, nil
	}
	router.AddConsumerHandler("ledger", paymentsTopic, subscriber,
		func(msg *message.Message) error {
			err := pglease.TxHandler(pool, pglease.TxHandlerConfig{PublishTopic: receiptsTopic}, handle)(msg)
			if err == nil {
				mu.Lock()
				applied++
				if applied == payments {
					close(done)
				}
				mu.Unlock()
			}
			return err
		})

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-done:
	case err := <-runErr:
		return fmt.Errorf("router stopped early: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("timed out waiting for the payments")
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

	var balance, rows, receipts int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM example_accounts WHERE id = $1`, account).Scan(&balance); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM example_payments WHERE account = $1`, account).Scan(&rows); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglease_messages WHERE topic = $1`, receiptsTopic).Scan(&receipts); err != nil {
		return err
	}
	fmt.Printf("%d handler attempts; balance %d, %d payment rows, %d receipts\n", attempts, balance, rows, receipts)
	if balance != payments*(payments+1)/2 || rows != payments || receipts != payments {
		return fmt.Errorf("not exactly once: balance %d, %d payment rows, %d receipts", balance, rows, receipts)
	}
	fmt.Println("every payment applied exactly once")
	return nil
}
