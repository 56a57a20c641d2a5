package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

// newTable returns a tabwriter for aligned columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// nonNil returns s, or an empty slice for nil, so that JSON shows [] and
// not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// displayName returns a consumer group or topic name for a table cell: as
// it is, or quoted in Go syntax when it is empty, starts with a quote or
// holds white space or unprintable characters (which would break the
// columns).
func displayName(s string) string {
	odd := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0
	if s == "" || odd || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	return s
}

// orDash returns s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// formatPosition prints a position as TRANSACTION:OFFSET. 0:0 is the
// beginning of a topic; X:0 (where a reset to the latest leaves it) lies
// before every message of transaction X and after those of older ones.
func formatPosition(p pglease.Position) string {
	return strconv.FormatUint(p.TransactionID, 10) + ":" + strconv.FormatInt(p.Offset, 10)
}

// formatDuration prints d to a tenth of a second below a minute, to the
// second above.
func formatDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + formatDuration(-d)
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// formatExpiresIn prints the time a session has left, or how long ago it
// expired.
func formatExpiresIn(d time.Duration) string {
	if d > 0 {
		return formatDuration(d)
	}
	return "expired " + formatDuration(-d) + " ago"
}

// formatTime prints t in UTC, RFC 3339 to the second; "-" for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// formatLagSeconds prints the age of the oldest message after a position,
// "-" without one.
func formatLagSeconds(l admin.LagInfo) string {
	if l.Lag == 0 {
		return "-"
	}
	return strconv.FormatFloat(l.LagSeconds, 'f', 1, 64)
}

// abbreviate puts q on one line (runs of white space become one space)
// and cuts it to at most n characters.
func abbreviate(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	r := []rune(q)
	if len(r) <= n {
		return q
	}
	return string(r[:n-3]) + "..."
}

// terminalWriter passes what the command prints to a terminal, escaping
// on the way every character a terminal would act on rather than show:
// control characters but new line and tab (escape sequences that set the
// window title, move the cursor, clear the screen or, on some terminals,
// write files start with ESC or a C1 control) and the bidirectional
// formatting characters (which show text in another order than it is).
// Each becomes \uXXXX, which is also valid inside a JSON string, and a
// byte that is not UTF-8 becomes \xXX. Everything pglease prints from the
// database (names, metadata, payloads, query texts, owners, errors) goes
// through it, whatever the command. Safe for concurrent use; Flush at the
// end writes a character cut between two writes.
type terminalWriter struct {
	mu      sync.Mutex
	w       io.Writer
	pending []byte // the start of a character whose rest has not come yet
	buf     []byte
}

func newTerminalWriter(w io.Writer) *terminalWriter { return &terminalWriter{w: w} }

func (t *terminalWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := slices.Concat(t.pending, p) // pending is replaced below
	// Keep an incomplete last character for the next write.
	cut := len(in)
	for i := len(in) - 1; i >= 0 && i >= len(in)-utf8.UTFMax; i-- {
		if utf8.RuneStart(in[i]) {
			if !utf8.FullRune(in[i:]) {
				cut = i
			}
			break
		}
	}
	t.buf = appendTerminalSafe(t.buf[:0], in[:cut])
	t.pending = append([]byte(nil), in[cut:]...)
	if _, err := t.w.Write(t.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is left of an incomplete character, escaped.
func (t *terminalWriter) Flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) == 0 {
		return nil
	}
	_, err := t.w.Write(appendTerminalSafe(nil, t.pending))
	t.pending = nil
	return err
}

// appendTerminalSafe appends b to dst with the characters a terminal
// acts on escaped (see terminalWriter).
func appendTerminalSafe(dst, b []byte) []byte {
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size == 1:
			dst = fmt.Appendf(dst, `\x%02x`, b[0])
		case r == '\n' || r == '\t':
			dst = append(dst, b[0])
		case unicode.Is(unicode.Cc, r) || isBidiControl(r):
			dst = fmt.Appendf(dst, `\u%04x`, r)
		default:
			dst = append(dst, b[:size]...)
		}
		b = b[size:]
	}
	return dst
}

// isBidiControl reports whether r is a bidirectional formatting character.
func isBidiControl(r rune) bool {
	return r == '\u061c' || r == '\u200e' || r == '\u200f' || (r >= '\u202a' && r <= '\u202e') || (r >= '\u2066' && r <= '\u2069')
}
