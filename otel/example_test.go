package otel_test

import (
	"context"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	pglease "github.com/pglease/watermill-pglease"
	pgleaseotel "github.com/pglease/watermill-pglease/otel"
)

// Wrap the Publisher and instrument the Subscriber's config: a request's
// trace goes on through PostgreSQL into the handler.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	otelapi.SetTextMapPropagator(propagation.TraceContext{})

	publisher, err := pglease.NewPublisher(pool, pglease.PublisherConfig{}, nil)
	if err != nil {
		panic(err)
	}
	sub, err := pglease.NewSubscriber(pool, pgleaseotel.Instrument(pglease.SubscriberConfig{ConsumerGroup: "billing"}), nil)
	if err != nil {
		panic(err)
	}
	pub := pgleaseotel.WrapPublisher(publisher)

	// Publishing in a request: the message carries the request's trace.
	http.HandleFunc("/orders", func(w http.ResponseWriter, r *http.Request) {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"id":1}`))
		msg.SetContext(r.Context())
		if err := pub.Publish("orders", msg); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})

	// Consuming: msg.Context() holds the process span, linked to the
	// request's send span.
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(pgleaseotel.Middleware())
	router.AddConsumerHandler("billing", "orders", sub, func(msg *message.Message) error {
		_ = msg.Context() // start the handler's spans from it
		return nil
	})
	_ = router.Run(ctx)
}
