package engine

import (
	"strings"
	"testing"
	"time"
)

// TestWentBack: which changes between two heartbeats mean that the
// database is not the one read before, later in the same history.
func TestWentBack(t *testing.T) {
	base := clusterMark{systemID: "7712", timeline: "00000001", here: "00000001:100", lsn: 5000, xmax: 900}
	with := func(f func(*clusterMark)) clusterMark {
		m := base
		f(&m)
		return m
	}
	for _, tc := range []struct {
		name      string
		prev, cur clusterMark
		want      string // "" or a part of the reason
		restarted bool
	}{
		{"first reading", clusterMark{}, base, "", false},
		{"same", base, base, "", false},
		{"moved on", base, with(func(m *clusterMark) { m.lsn, m.xmax = 9000, 1000 }), "", false},
		{"system identifier unknown now", base, with(func(m *clusterMark) { m.systemID = "" }), "", false},
		{"system identifier unknown before", with(func(m *clusterMark) { m.systemID = "" }), with(func(m *clusterMark) { m.systemID = "42" }), "", false},
		{"another cluster", base, with(func(m *clusterMark) { m.systemID = "42"; m.lsn = 9000 }), "another cluster", false},
		{"promoted standby", base, with(func(m *clusterMark) {
			m.timeline, m.here = "00000002", "00000002:100"
			m.lsn, m.xmax = 9000, 1000
		}), "a new timeline (2, was 1)", false},
		{"WAL went back", base, with(func(m *clusterMark) { m.lsn = 4000; m.xmax = 950 }), "WAL went back 1000 bytes", false},
		{"counter went back", base, with(func(m *clusterMark) { m.xmax = 800 }), "transaction counter went back 100", false},
		{"copy started behind", base, with(func(m *clusterMark) { m.here = "00000001:200"; m.lsn = 4000 }), "WAL went back", false},
		{"recovered from a crash that lost nothing seen", base, with(func(m *clusterMark) {
			m.here = "00000001:100:2"
			m.lsn, m.xmax = 9000, 1000
		}), "recovered from a crash", true},
		{"restarted, or a copy that went past", base, with(func(m *clusterMark) {
			m.here = "00000001:200"
			m.lsn, m.xmax = 9000, 1000
		}), "restarted or recovered from a crash, or a copy of it started", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, restarted := wentBack(tc.prev, tc.cur)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("wentBack = %q, want %q", got, tc.want)
			}
			if restarted != tc.restarted {
				t.Fatalf("wentBack says restarted = %t, want %t", restarted, tc.restarted)
			}
		})
	}
}

// TestDueWait: how long the maintainer waits for the next delayed message.
func TestDueWait(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want time.Duration
	}{
		{-5, 0}, {0, 0}, {1500, 1500 * time.Millisecond},
		{maxDueWait.Milliseconds(), maxDueWait},
		{253402300799000, maxDueWait}, // 9999-12-31: overflowed into a negative wait
	} {
		if got := dueWait(tc.ms); got != tc.want {
			t.Errorf("dueWait(%d) = %s, want %s", tc.ms, got, tc.want)
		}
	}
}
