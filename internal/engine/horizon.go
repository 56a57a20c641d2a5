package engine

import (
	"context"
	"time"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// horizon is what holds back a row's delivery, as a Subscriber logs it
// when delivery stalls: (TopicOnly) the position a publisher of the row's
// topic registered and that publisher's transaction, on Citus a backend
// of the topic's worker; without TopicOnly (a driver that reads no
// registrations) the xmin horizon and the oldest running writing
// transaction that holds it back. Holder nil: none found.
type horizon struct {
	Xmin      uint64
	Holder    *horizonHolder
	TopicOnly bool
}

// horizonHolder is what the stall log names of the holding transaction:
// PID 0 and GID for a prepared transaction; Age and XactStart are zero
// when the role may not see the backend's details; Node the Citus worker
// whose backend PID is (empty on a single node).
type horizonHolder struct {
	PID                               int
	GID, ApplicationName, State, Node string
	XactStart                         time.Time
	Age                               time.Duration
}

// readHorizon reads what holds back the delivery of a row: the publisher
// of its topic and partition whose registration holds the position bound
// lowest (Xmin its registered position, TopicOnly true), on Citus on the
// topic's worker.
func readHorizon(ctx context.Context, q pgsql.Querier, t pgsql.Driver, row rowKey) (horizon, error) {
	r, topicOnly, err := t.BoundHolder(ctx, q, row.topic, row.partition)
	if err != nil || r.PID == nil && r.GID == nil {
		return horizon{Xmin: r.Xmin, TopicOnly: topicOnly}, err
	}
	hh := &horizonHolder{}
	if r.PID != nil {
		hh.PID = int(*r.PID)
	}
	if r.GID != nil {
		hh.GID = *r.GID
	}
	if r.AppName != nil {
		hh.ApplicationName = *r.AppName
	}
	if r.State != nil {
		hh.State = *r.State
	}
	if r.Node != nil {
		hh.Node = *r.Node
	}
	if r.XactStart != nil {
		hh.XactStart = *r.XactStart
	}
	if r.AgeSeconds != nil {
		hh.Age = time.Duration(*r.AgeSeconds * float64(time.Second))
	}
	return horizon{Xmin: r.Xmin, Holder: hh, TopicOnly: topicOnly}, nil
}
