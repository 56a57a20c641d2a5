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

// TestPublisherWho: an open publisher named in status's sentence, and how
// to end it: on a single server its pid; on Citus the coordinator's
// session where known, else its backend on the worker; a prepared
// transaction by its gid (on Citus, on its worker).
func TestPublisherWho(t *testing.T) {
	client := &admin.HorizonHolder{PID: 28817}
	for _, c := range []struct {
		p         admin.OpenPublisher
		who, ends string
	}{
		{admin.OpenPublisher{HorizonHolder: admin.HorizonHolder{PID: 7}}, "pid 7", "end it with\nSELECT pg_terminate_backend(7)."},
		{admin.OpenPublisher{HorizonHolder: admin.HorizonHolder{GID: "g'1"}}, `prepared transaction "g'1"`, "ROLLBACK PREPARED 'g''1'."},
		{admin.OpenPublisher{HorizonHolder: admin.HorizonHolder{PID: 41870}, Node: "w1:5432", Client: client},
			"pid 28817 (on worker w1:5432 as pid 41870)", "end it on the coordinator with\nSELECT pg_terminate_backend(28817)."},
		{admin.OpenPublisher{HorizonHolder: admin.HorizonHolder{PID: 41870}, Node: "w1:5432"},
			"pid 41870 on worker w1:5432", "end it on worker w1:5432 with\nSELECT pg_terminate_backend(41870)."},
		{admin.OpenPublisher{HorizonHolder: admin.HorizonHolder{GID: "citus_0_1"}, Node: "w1:5432"},
			`prepared transaction "citus_0_1" on worker w1:5432`, "on worker w1:5432, COMMIT PREPARED or ROLLBACK PREPARED 'citus_0_1'."},
	} {
		who, end := publisherWho(c.p)
		assert.Equal(t, c.who, who)
		assert.Contains(t, end, c.ends, who)
	}
}
