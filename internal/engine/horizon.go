package engine

import (
	"context"
	"time"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// horizon is the cluster's xmin horizon and the oldest running writing
// transaction that holds it back (holder nil: none), as a Subscriber logs
// it when delivery stalls. The admin package's Inspector.Horizon reads the
// same statement for operators, with every column.
type horizon struct {
	Xmin   uint64
	Holder *horizonHolder
}

// horizonHolder is what the stall log names of the holding transaction:
// PID 0 and GID for a prepared transaction; Age and XactStart are zero
// when the role may not see the backend's details.
type horizonHolder struct {
	PID                         int
	GID, ApplicationName, State string
	XactStart                   time.Time
	Age                         time.Duration
}

// readHorizon reads the xmin horizon and the transaction holding it back.
func readHorizon(ctx context.Context, q pgsql.Querier, t pgsql.Driver) (horizon, error) {
	r, err := t.InspectHorizon(ctx, q)
	if err != nil || r.PID == nil {
		return horizon{Xmin: r.Xmin}, err
	}
	hh := &horizonHolder{PID: int(*r.PID)}
	if r.GID != nil {
		hh.GID = *r.GID
	}
	if r.AppName != nil {
		hh.ApplicationName = *r.AppName
	}
	if r.State != nil {
		hh.State = *r.State
	}
	if r.XactStart != nil {
		hh.XactStart = *r.XactStart
	}
	if r.AgeSeconds != nil {
		hh.Age = time.Duration(*r.AgeSeconds * float64(time.Second))
	}
	return horizon{Xmin: r.Xmin, Holder: hh}, nil
}
