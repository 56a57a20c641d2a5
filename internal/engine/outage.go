package engine

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// outageRepeat is how often at most a component still failing says so
// again (at Info) after the Error that began its outage.
const outageRepeat = 15 * time.Second

// Components of a Subscriber that log their outages (the "component"
// field of the lines).
const (
	componentSession   = "consumer session"      // the session keeper: heartbeats, new sessions
	componentGroup     = "consumer group"        // the group member: claims, offset rows, members
	componentConsumers = "consumers"             // reads, commits and releases of the topics
	componentIdlePoll  = "idle poll"             // the poll of idle topics
	componentListener  = "notification listener" // the LISTEN connection of the process
	componentMaintain  = "maintainer"            // delayed messages, retention, housekeeping
)

// outageEvent is what a failure or a success means for the log.
type outageEvent int

const (
	outageQuiet     outageEvent = iota // nothing to say above Debug
	outageBegan                        // the first failure: Error
	outageGoesOn                       // still failing, outageRepeat since the last line: Info
	outageRecovered                    // the first success after failures: Info, with how long
)

// outageState is the pure part of outageLog: when the current outage
// began (zero: none), when it was last logged, how many attempts failed
// in it, and when the last one ended. Not safe for concurrent use.
type outageState struct {
	since     time.Time
	logged    time.Time
	failures  int
	recovered time.Time
}

// fail records at now the failure of an attempt sent at sent. An attempt
// sent before the last outage ended (a slow one of that outage, or of
// another goroutine sharing the log) does not begin a new outage.
func (s *outageState) fail(sent, now time.Time, repeat time.Duration) outageEvent {
	if s.since.IsZero() {
		if sent.Before(s.recovered) {
			return outageQuiet
		}
		s.since, s.logged, s.failures = now, now, 1
		return outageBegan
	}
	s.failures++
	if now.Sub(s.logged) >= repeat {
		s.logged = now
		return outageGoesOn
	}
	return outageQuiet
}

// succeed records a success at now; after failures it returns
// outageRecovered, how long the outage lasted and how many attempts
// failed in it.
func (s *outageState) succeed(now time.Time) (outageEvent, time.Duration, int) {
	if s.since.IsZero() {
		return outageQuiet, 0, 0
	}
	d, n := now.Sub(s.since), s.failures
	s.since, s.failures, s.recovered = time.Time{}, 0, now
	return outageRecovered, d, n
}

// outageLog logs the failures of one component that retries: the first
// failure of an outage at Error, the next ones at Info at most every
// outageRepeat (Debug otherwise), and the first success after them at
// Info with how long the outage lasted. A database restart then costs one
// Error line per component, not one per attempt. Safe for concurrent use.
type outageLog struct {
	logger    watermill.LoggerAdapter
	component string
	repeat    time.Duration

	mu sync.Mutex
	st outageState
}

func newOutageLog(logger watermill.LoggerAdapter, component string) *outageLog {
	return &outageLog{logger: logger.With(watermill.LogFields{"component": component}), component: component,
		repeat: outageRepeat}
}

// failed logs the failure err of an attempt sent at sent; msg says what
// failed and that it is retried.
func (o *outageLog) failed(sent time.Time, msg string, err error, fields watermill.LogFields) {
	o.mu.Lock()
	ev := o.st.fail(sent, time.Now(), o.repeat)
	since, failures := o.st.since, o.st.failures
	o.mu.Unlock()
	switch ev {
	case outageBegan:
		o.logger.Error(msg, err, fields)
	case outageGoesOn:
		o.logger.Info(msg, fields.Add(watermill.LogFields{"error": err.Error(),
			"failing_for": time.Since(since).Round(time.Millisecond).String(), "failures": failures}))
	default:
		o.logger.Debug(msg, fields.Add(watermill.LogFields{"error": err.Error()}))
	}
}

// ok records a success: after failures, it logs the recovery.
func (o *outageLog) ok() {
	o.mu.Lock()
	ev, d, n := o.st.succeed(time.Now())
	o.mu.Unlock()
	if ev == outageRecovered {
		o.logger.Info(o.component+" recovered after "+d.Round(time.Millisecond).String(),
			watermill.LogFields{"outage": d.Round(time.Millisecond).String(), "failures": n})
	}
}

// ongoing reports whether the component is failing: its outage was
// logged and no success followed.
func (o *outageLog) ongoing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.st.since.IsZero()
}
