package engine

import (
	"testing"
	"time"
)

// TestOutageState: the failures of one outage give one Error, then an
// Info at most every repeat, and the first success one recovery line; a
// failure of an attempt sent before that recovery begins no new outage.
func TestOutageState(t *testing.T) {
	t.Parallel()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		fail      bool
		sent, now float64
		want      outageEvent
		lasted    time.Duration // of a recovery
		failures  int           // of a recovery
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "successes only", steps: []step{{now: 1, want: outageQuiet}, {now: 2, want: outageQuiet}}},
		{name: "an 8 s restart retried every second", steps: []step{
			{fail: true, sent: 0, now: 0.1, want: outageBegan},
			{fail: true, sent: 1, now: 1.1, want: outageQuiet},
			{fail: true, sent: 2, now: 2.1, want: outageQuiet},
			{fail: true, sent: 7, now: 7.1, want: outageQuiet},
			{now: 8.1, want: outageRecovered, lasted: 8 * time.Second, failures: 4},
			{now: 9, want: outageQuiet},
		}},
		{name: "a long outage says so every repeat", steps: []step{
			{fail: true, sent: 0, now: 0, want: outageBegan},
			{fail: true, sent: 10, now: 10, want: outageQuiet},
			{fail: true, sent: 15, now: 15, want: outageGoesOn},
			{fail: true, sent: 20, now: 20, want: outageQuiet},
			{fail: true, sent: 30, now: 30, want: outageGoesOn},
			{now: 31, want: outageRecovered, lasted: 31 * time.Second, failures: 5},
		}},
		{name: "a slow attempt of the last outage fails after the recovery", steps: []step{
			{fail: true, sent: 0, now: 0, want: outageBegan},
			{now: 2, want: outageRecovered, lasted: 2 * time.Second, failures: 1},
			{fail: true, sent: 1, now: 3, want: outageQuiet},
			{now: 4, want: outageQuiet},
			{fail: true, sent: 5, now: 5, want: outageBegan},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s outageState
			for i, st := range tc.steps {
				if st.fail {
					if got := s.fail(at(st.sent), at(st.now), 15*time.Second); got != st.want {
						t.Errorf("step %d: failure gives %d, want %d", i, got, st.want)
					}
					continue
				}
				got, lasted, failures := s.succeed(at(st.now))
				if got != st.want || lasted != st.lasted || failures != st.failures {
					t.Errorf("step %d: success gives %d after %s and %d failures, want %d after %s and %d",
						i, got, lasted, failures, st.want, st.lasted, st.failures)
				}
			}
		})
	}
}
