package engine

import (
	"math/rand/v2"
	"time"
)

// maxRetryBackoff caps the wait between retries of failed statements.
const maxRetryBackoff = time.Second

// backoff is a capped exponential backoff with full jitter. The zero value
// is not usable; build it with newBackoff. Not safe for concurrent use.
type backoff struct {
	min, max time.Duration
	next     time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff {
	if lo <= 0 {
		lo = time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	return &backoff{min: lo, max: hi, next: lo}
}

// delay returns the next wait, a random duration in [d/2, d] where d doubles
// from min up to max.
func (b *backoff) delay() time.Duration {
	d := b.next
	b.next *= 2
	if b.next > b.max {
		b.next = b.max
	}
	half := d / 2
	return half + rand.N(half+1)
}

// reset starts again from min after a success.
func (b *backoff) reset() { b.next = b.min }

// sleep waits for d, or until a or b is closed (a nil channel is never
// closed); it reports whether the whole delay passed.
func sleep(d time.Duration, a, b <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-a:
		return false
	case <-b:
		return false
	}
}
