package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

func TestDisplayName(t *testing.T) {
	for in, want := range map[string]string{
		"billing":       "billing",
		"orders.placed": "orders.placed",
		"a,b":           "a,b",
		"":              `""`,
		"two words":     `"two words"`,
		"tab\there":     `"tab\there"`,
		`"quoted"`:      `"\"quoted\""`,
		"bell\a":        `"bell\a"`,
		"zürich":        "zürich",
	} {
		assert.Equal(t, want, displayName(in), "displayName(%q)", in)
	}
}

func TestFormatPosition(t *testing.T) {
	assert.Equal(t, "0:0", formatPosition(pglease.Position{}))
	assert.Equal(t, "812:41", formatPosition(pglease.Position{TransactionID: 812, Offset: 41}))
	assert.Equal(t, "812:0", formatPosition(pglease.Position{TransactionID: 812}))
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0s",
		40 * time.Millisecond:                 "0s",
		1234 * time.Millisecond:               "1.2s",
		59*time.Second + 940*time.Millisecond: "59.9s",
		61*time.Second + 600*time.Millisecond: "1m2s",
		26*time.Hour + 3*time.Second:          "26h0m3s",
		-1500 * time.Millisecond:              "-1.5s",
	} {
		assert.Equal(t, want, formatDuration(d), "formatDuration(%v)", d)
	}
	assert.Equal(t, "8.7s", formatExpiresIn(8700*time.Millisecond))
	assert.Equal(t, "expired 2s ago", formatExpiresIn(-2*time.Second))
	assert.Equal(t, "expired 0s ago", formatExpiresIn(0))
}

func TestFormatLagSeconds(t *testing.T) {
	assert.Equal(t, "-", formatLagSeconds(admin.LagInfo{}))
	assert.Equal(t, "3.1", formatLagSeconds(admin.LagInfo{Lag: 2, LagSeconds: 3.14}))
}

func TestAbbreviate(t *testing.T) {
	assert.Equal(t, "SELECT 1", abbreviate("  SELECT\n\t 1 ", 20))
	assert.Equal(t, "UPDATE accounts S...", abbreviate("UPDATE accounts SET balance = 0", 20))
	assert.Equal(t, "ääääääää...", abbreviate("ääääääääääää", 11))
}

func TestQuoteLiteral(t *testing.T) {
	assert.Equal(t, `'tx-1'`, quoteLiteral("tx-1"))
	assert.Equal(t, `'it''s'`, quoteLiteral("it's"))
}

func TestFormatTime(t *testing.T) {
	assert.Equal(t, "-", formatTime(time.Time{}))
	at := time.Date(2026, 11, 23, 9, 41, 2, 500, time.FixedZone("CET", 3600))
	assert.Equal(t, "2026-11-23T08:41:02Z", formatTime(at))
}
