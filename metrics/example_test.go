package metrics_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
	"github.com/pglease/watermill-pglease/metrics"
)

// Both collectors in one registry, with the Go runtime's, served on
// /metrics. Only the group "billing" is exported by the Collector.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	logger := watermill.NewStdLogger(false, false)

	subscriber, err := pglease.NewSubscriber(pool, pglease.SubscriberConfig{ConsumerGroup: "billing"}, logger)
	if err != nil {
		log.Fatal(err)
	}
	defer subscriber.Close()

	insp, err := admin.NewInspector(pool, pglease.Tables{})
	if err != nil {
		log.Fatal(err)
	}
	groups, err := metrics.NewCollector(insp, metrics.CollectorConfig{
		ConsumerGroups: []string{"billing"},
		Logger:         logger,
	})
	if err != nil {
		log.Fatal(err)
	}
	subs, err := metrics.NewSubscriberCollector(subscriber, metrics.SubscriberCollectorConfig{
		ConstLabels: prometheus.Labels{"subscriber": "billing-worker"},
	})
	if err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(groups, subs, collectors.NewGoCollector())
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	log.Fatal(http.ListenAndServe(":9091", nil))
}
