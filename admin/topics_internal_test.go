package admin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestKeyWindows: how long a topic recognises its keys, from its
// retention and its key window, whether the maintainer has made its key
// class's partitions, and the schema's version. No database.
func TestKeyWindows(t *testing.T) {
	const day, week = 24 * time.Hour, 7 * 24 * time.Hour
	for _, c := range []struct {
		name                 string
		schema               int
		retention, keyWindow time.Duration
		ready                bool
		effective, pending   time.Duration
	}{
		{name: "neither: a day", schema: 22, effective: day},
		{name: "neither, ready", schema: 22, ready: true, effective: day},
		{name: "short retention: a day", schema: 22, retention: time.Hour, effective: day},
		{name: "short window: a day", schema: 22, keyWindow: 12 * time.Hour, effective: day},
		{name: "window of a day", schema: 22, keyWindow: day, effective: day},
		{name: "window", schema: 22, keyWindow: 72 * time.Hour, ready: true, effective: 72 * time.Hour},
		{name: "window, partitions not made yet", schema: 22, keyWindow: 72 * time.Hour, effective: day, pending: 72 * time.Hour},
		{name: "retention over the window", schema: 22, retention: week, keyWindow: 2 * time.Hour, ready: true, effective: week},
		{name: "window over the retention", schema: 22, retention: 36 * time.Hour, keyWindow: week, ready: true, effective: week},
		{name: "retention, not made yet", schema: 22, retention: week, effective: day, pending: week},
		{name: "a later schema", schema: 30, retention: week, ready: true, effective: week},
		{name: "schema 21: the retention", schema: 21, retention: week, ready: true, effective: week},
		{name: "schema 21, not made yet", schema: 21, retention: week, effective: day, pending: week},
		{name: "schema 20: a day", schema: 20, retention: week, effective: day},
		{name: "schema 15: a day", schema: 15, effective: day},
		{name: "schema 14: no keys", schema: 14, retention: week, ready: true},
	} {
		effective, pending := keyWindows(c.schema, c.retention, c.keyWindow, c.ready)
		assert.Equal(t, c.effective, effective, "%s: effective", c.name)
		assert.Equal(t, c.pending, pending, "%s: pending", c.name)
	}
}
