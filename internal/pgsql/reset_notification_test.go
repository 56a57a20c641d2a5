package pgsql

import (
	"strings"
	"testing"
)

// These tests need no database.

// TestResetNotificationRoundTrip: the group and the topic of a reset
// notification come back as they were sent, whatever they hold (a
// separator, digits, the text of another payload); a group too long for a
// notification falls back to the unscoped payload of earlier versions.
func TestResetNotificationRoundTrip(t *testing.T) {
	for _, tc := range []struct{ group, topic string }{
		{"", "t"},
		{"billing", "orders"},
		{"12:ab", "3:x"},
		{"a:b", ":c"},
		{"x", "xorders"},
		{"g", "0:"},
		{"ünïcødé", "tö:pïc"},
		{strings.Repeat("g", MaxNotifyPayload-len("o7999:t")), "t"},
	} {
		p := ResetNotification(tc.group, tc.topic)
		if p[0] != NotifyReset {
			t.Fatalf("ResetNotification(%q, %q) = %q: not of kind %q", tc.group, tc.topic, p, NotifyReset)
		}
		group, topic, ok := ParseResetNotification(p[1:])
		if !ok || group != tc.group || topic != tc.topic {
			t.Errorf("ParseResetNotification(%q) = %q, %q, %v; want %q, %q", p[1:], group, topic, ok, tc.group, tc.topic)
		}
	}
	long := strings.Repeat("g", MaxNotifyPayload)
	if p := ResetNotification(long, "orders"); p != "xorders" {
		t.Errorf("a group too long for a notification: got a payload of %d bytes starting %.10q, want %q", len(p), p, "xorders")
	}
}

// TestParseResetNotificationRefusesMalformed: a payload that
// ResetNotification cannot have made names no group.
func TestParseResetNotificationRefusesMalformed(t *testing.T) {
	for _, s := range []string{"", ":", "orders", ":orders", "5:ab", "-1:ab", "+1:ab", "1 :ab", "99999:ab", "1a:b"} {
		if group, topic, ok := ParseResetNotification(s); ok {
			t.Errorf("ParseResetNotification(%q) = %q, %q, true; want false", s, group, topic)
		}
	}
}
