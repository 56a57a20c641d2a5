package testkit

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// LogEntry is one line logged through a [CapturingLogger].
type LogEntry struct {
	At     time.Time // when it was logged
	Level  string
	Msg    string
	Err    error
	Fields watermill.LogFields
}

// CapturingLogger records every line at Info and above; the loggers of
// its With share its record.
type CapturingLogger struct {
	mu      *sync.Mutex
	entries *[]LogEntry
	fields  watermill.LogFields
}

// NewCapturingLogger returns a logger with an empty record.
func NewCapturingLogger() *CapturingLogger {
	return &CapturingLogger{mu: &sync.Mutex{}, entries: &[]LogEntry{}}
}

func (l *CapturingLogger) add(level, msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.entries = append(*l.entries, LogEntry{At: time.Now(), Level: level, Msg: msg, Err: err, Fields: l.fields.Add(fields)})
}

// Error records msg at level "error".
func (l *CapturingLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.add("error", msg, err, fields)
}

// Info records msg at level "info".
func (l *CapturingLogger) Info(msg string, fields watermill.LogFields) {
	l.add("info", msg, nil, fields)
}

// Debug records nothing.
func (l *CapturingLogger) Debug(string, watermill.LogFields) {}

// Trace records nothing.
func (l *CapturingLogger) Trace(string, watermill.LogFields) {}

// With returns a logger that adds fields to every line and records in l's
// record.
func (l *CapturingLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &CapturingLogger{mu: l.mu, entries: l.entries, fields: l.fields.Add(fields)}
}

// Find returns the first entry for which match holds.
func (l *CapturingLogger) Find(match func(LogEntry) bool) (LogEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range *l.entries {
		if match(e) {
			return e, true
		}
	}
	return LogEntry{}, false
}

// Entries returns a copy of the record, in the order of logging.
func (l *CapturingLogger) Entries() []LogEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LogEntry(nil), *l.entries...)
}

// Since returns the entries at level ("error", "info") logged at or
// after from, in the order of logging.
func (l *CapturingLogger) Since(level string, from time.Time) []LogEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LogEntry
	for _, e := range *l.entries {
		if e.Level == level && !e.At.Before(from) {
			out = append(out, e)
		}
	}
	return out
}
