package main

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	pglease "github.com/pglease/watermill-pglease"
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
func formatLagSeconds(l pglease.LagInfo) string {
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
