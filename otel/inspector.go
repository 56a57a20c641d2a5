package otel

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// Names of the gauges [RegisterInspector] observes: what the metrics
// module exports to Prometheus as pglease_consumergroup_lag,
// pglease_consumergroup_lag_seconds, pglease_xmin_horizon_age_seconds and
// pglease_xmin_horizon_age_known, read from the same [admin.Inspector]
// queries.
const (
	LagMetric             = "pglease.consumer_group.lag"
	LagAgeMetric          = "pglease.consumer_group.lag.age"
	HorizonAgeMetric      = "pglease.xmin_horizon.age"
	HorizonAgeKnownMetric = "pglease.xmin_horizon.age_known"
)

// InspectorConfig selects what [RegisterInspector] reads. The zero value
// is valid.
type InspectorConfig struct {
	// Filter selects the consumer groups and topics whose lag is
	// observed; the zero value: all. The database filters on it.
	Filter admin.LagFilter
	// Timeout bounds the queries of one collection. Default 5s.
	Timeout time.Duration
}

// RegisterInspector registers observable gauges read from insp on every
// collection of the meter provider's readers:
//
//	pglease.consumer_group.lag          {message}  messages after the group's position that every reader can see
//	pglease.consumer_group.lag.age      s          age of the oldest of them, 0 without one
//	pglease.xmin_horizon.age            s          oldest writing transaction, 0 without one; absent when unknown
//	pglease.xmin_horizon.age_known      1          0: one runs, but this role may not see its age
//
// The lag gauges carry messaging.system, messaging.consumer.group.name,
// messaging.destination.name and messaging.destination.partition.id.
// Register once per database, in one process (or a few): every
// collection runs the Inspector's Lag and Horizon queries. A query that
// fails leaves its gauges out of that collection and goes to the global
// error handler. Unregister with the returned Registration. The error
// wraps [pglease.ErrInvalidConfig].
func RegisterInspector(insp *admin.Inspector, config InspectorConfig, opts ...Option) (metric.Registration, error) {
	if insp == nil {
		return nil, fmt.Errorf("%w: RegisterInspector needs a *admin.Inspector, got nil", pglease.ErrInvalidConfig)
	}
	if config.Timeout < 0 {
		return nil, fmt.Errorf("%w: InspectorConfig.Timeout must not be negative, got %s", pglease.ErrInvalidConfig, config.Timeout)
	}
	if config.Timeout == 0 {
		config.Timeout = 5 * time.Second
	}
	m := newTelemetry(opts).meter
	lag, err := m.Int64ObservableGauge(LagMetric, metric.WithUnit("{message}"),
		metric.WithDescription("Messages after the consumer group's acknowledged position on the partition that every reader can see (not yet acked)."))
	if err != nil {
		return nil, err
	}
	lagAge, err := m.Float64ObservableGauge(LagAgeMetric, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message not yet acked by the consumer group on the partition; 0 when it has none."))
	if err != nil {
		return nil, err
	}
	horizonAge, err := m.Float64ObservableGauge(HorizonAgeMetric, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest running writing transaction, which holds back vacuum, and on Citus delivery on every topic of its worker (on a single server delivery waits only for open publishers of the same partition); 0 when none runs; absent when this role may not see it."))
	if err != nil {
		return nil, err
	}
	horizonKnown, err := m.Int64ObservableGauge(HorizonAgeKnownMetric, metric.WithUnit("1"),
		metric.WithDescription("1 if pglease.xmin_horizon.age is known; 0 if a writing transaction holds the horizon back but this role may not see its start (grant it pg_read_all_stats)."))
	if err != nil {
		return nil, err
	}
	system := semconv.MessagingSystemKey.String(System)
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, config.Timeout)
		defer cancel()
		rows, err := insp.Lag(ctx, config.Filter)
		if err != nil {
			handle(fmt.Errorf("pglease otel: %w", err))
		}
		for _, l := range rows {
			attrs := metric.WithAttributes(system,
				semconv.MessagingConsumerGroupName(l.ConsumerGroup),
				semconv.MessagingDestinationName(l.Topic),
				semconv.MessagingDestinationPartitionID(itoa32(l.Partition)))
			o.ObserveInt64(lag, l.Lag, attrs)
			o.ObserveFloat64(lagAge, l.LagSeconds, attrs)
		}
		h, err := insp.Horizon(ctx)
		if err != nil {
			handle(fmt.Errorf("pglease otel: %w", err))
			return nil
		}
		age, known := horizonAgeOf(h)
		only := metric.WithAttributes(system)
		if known {
			o.ObserveFloat64(horizonAge, age, only)
			o.ObserveInt64(horizonKnown, 1, only)
		} else {
			o.ObserveInt64(horizonKnown, 0, only)
		}
		return nil
	}, lag, lagAge, horizonAge, horizonKnown)
}

// horizonAgeOf is the age in seconds of the transaction that holds h
// back (0 when none does) and whether it is known.
func horizonAgeOf(h admin.Horizon) (float64, bool) {
	switch {
	case h.Holder == nil:
		return 0, true
	case !h.Holder.AgeKnown:
		return 0, false
	}
	return max(h.Holder.Age.Seconds(), 0), true
}
