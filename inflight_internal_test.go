package pglease

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// These tests need no database.

// windowScript drives an inflightWindow through steps written as text, one
// per line:
//
//	push a1 a2 b1 -1   messages with keys a, a, b and a keyless one (offsets 1..4)
//	out 1 3            next hands out exactly these offsets, in order, then nothing
//	ack 3              an Ack; "=> 2:5" checks that the prefix moved over 2 messages to offset 5, "=> -" that it did not move
//	nack 1             a Nack, due at once
type windowScript struct {
	t       *testing.T
	w       *inflightWindow
	entries map[int64]*windowEntry
	offset  int64
	now     time.Time
}

func runWindowScript(t *testing.T, maxOut int, script string) *inflightWindow {
	t.Helper()
	s := &windowScript{t: t, w: newInflightWindow(maxOut), entries: map[int64]*windowEntry{}, now: time.Unix(1000, 0)}
	for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
		f := strings.Fields(line)
		switch f[0] {
		case "push":
			for _, k := range f[1:] {
				s.offset++
				key := strings.TrimRight(k, "0123456789")
				if k == "-" || strings.HasPrefix(k, "-") {
					key = ""
				}
				s.entries[s.offset] = s.w.push(testMessage(s.offset, 1), key, 1)
			}
		case "out":
			var want, got []string
			want = f[1:]
			for {
				e, _ := s.w.next(s.now)
				if e == nil {
					break
				}
				s.w.handOut(e)
				got = append(got, fmt.Sprint(e.msg.pos.Offset))
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("%q: handed out %v, want %v", line, got, want)
			}
		case "ack", "nack":
			var off int64
			fmt.Sscan(f[1], &off)
			e := s.entries[off]
			if f[0] == "nack" {
				s.w.nack(e, s.now)
				continue
			}
			prefix, moved := s.w.ack(e)
			if len(f) == 4 {
				got := "-"
				if moved > 0 {
					got = fmt.Sprintf("%d:%d", moved, prefix.Offset)
				}
				if got != f[3] {
					t.Fatalf("%q: prefix moved %s, want %s", line, got, f[3])
				}
			}
		default:
			t.Fatalf("unknown step %q", line)
		}
	}
	return s.w
}

// TestInflightWindow: hand-out order, one message per key at a time, the
// limit, keyless messages as barriers, the contiguous prefix, and Nacks
// that hold their key while other keys go on.
func TestInflightWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		maxOut int
		script string
	}{
		{name: "one per key, in order", maxOut: 10, script: `
push a1 b1 a2 c1 b2
out 1 2 4
ack 2 => -
out 5
ack 1 => 2:2
out 3
ack 4 => -
ack 3 => 2:4
ack 5 => 1:5
out`},
		{name: "the limit", maxOut: 2, script: `
push a1 b1 c1 d1
out 1 2
ack 2 => -
out 3
ack 1 => 2:2
out 4
ack 3 => 1:3
ack 4 => 1:4`},
		{name: "a keyless message waits for all before it and holds all after it", maxOut: 10, script: `
push a1 b1 -1 c1 a2
out 1 2
ack 1 => 1:1
out
ack 2 => 1:2
out 3
ack 3 => 1:3
out 4 5
ack 5 => -
ack 4 => 2:5`},
		{name: "a nack holds its key, other keys go on", maxOut: 10, script: `
push a1 a2 b1 b2
out 1 3
nack 1
ack 3 => -
out 1 4
ack 4 => -
ack 1 => 1:1
out 2
ack 2 => 3:4`},
		{name: "acks above a gap stay in memory", maxOut: 4, script: `
push a1 b1 c1 d1
out 1 2 3 4
ack 4 => -
ack 3 => -
ack 2 => -
ack 1 => 4:4`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := runWindowScript(t, tc.maxOut, tc.script)
			if w.inFlight() < 0 || w.unsent() < 0 {
				t.Fatalf("in flight %d, unsent %d", w.inFlight(), w.unsent())
			}
		})
	}
}

// TestInflightWindowNackDue: a nacked message goes out again only once its
// delay is over; next says when to look again meanwhile.
func TestInflightWindowNackDue(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	w := newInflightWindow(4)
	a := w.push(testMessage(1, 1), "a", 1)
	w.push(testMessage(2, 1), "a", 1)
	e, _ := w.next(now)
	w.handOut(e)
	due := now.Add(100 * time.Millisecond)
	w.nack(a, due)
	if e, wake := w.next(now); e != nil || !wake.Equal(due) {
		t.Fatalf("next before the delay: %v, wake %v; want nothing until %v", e, wake, due)
	}
	if e, _ := w.next(due); e != a || e.attempt != 2 {
		t.Fatalf("next at the due time: %v, want the nacked message, attempt 2", e)
	}
	if !w.headOut() || w.inFlight() != 0 || w.unsent() != 1 {
		t.Fatalf("headOut %v, in flight %d, unsent %d; want true, 0, 1", w.headOut(), w.inFlight(), w.unsent())
	}
}

// TestInflightWindowHeadOfLineWait: a ready message held back by an
// earlier one of its key counts its wait from when it was first found
// held back to when it goes out.
func TestInflightWindowHeadOfLineWait(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	w := newInflightWindow(4)
	a1 := w.push(testMessage(1, 1), "a", 1)
	w.push(testMessage(2, 1), "a", 1)
	e, _ := w.next(now)
	w.handOut(e)
	if e, _ := w.next(now); e != nil {
		t.Fatalf("a2 handed out beside a1")
	}
	w.ack(a1)
	later := now.Add(30 * time.Millisecond)
	if e, _ := w.next(later); e == nil || e.msg.pos.Offset != 2 {
		t.Fatalf("a2 not handed out after a1's Ack")
	}
	if d := w.takeWait(); d != 30*time.Millisecond {
		t.Fatalf("head-of-line wait %s, want 30ms", d)
	}
	if d := w.takeWait(); d != 0 {
		t.Fatalf("head-of-line wait %s taken twice", d)
	}
}
