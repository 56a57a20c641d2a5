package pgsql

import (
	"strconv"
	"strings"
)

// The payload of the notification of a reset of one consumer group's
// offsets: written by the admin package's Inspector (through
// [ResetOffsets]) and read by every Subscriber's listener.

// MaxNotifyPayload is the longest payload pg_notify accepts, in bytes
// (payloads must be shorter than 8000 bytes).
const MaxNotifyPayload = 7999

// ResetNotification returns the payload that tells the Subscribers of group
// that an operator reset the group's offsets on topic: [NotifyReset], the length of
// group in bytes (decimal), ":", group, then topic. The length says where
// the group ends, whatever bytes the group and the topic hold. A group too
// long for a payload gets the unscoped [NotifyResetAny] + topic of earlier versions,
// which every group's Subscribers of the topic act on.
func ResetNotification(group, topic string) string {
	p := string(rune(NotifyReset)) + strconv.Itoa(len(group)) + ":" + group + topic
	if len(p) > MaxNotifyPayload {
		return string(rune(NotifyResetAny)) + topic
	}
	return p
}

// ParseResetNotification reads what follows the kind of a payload of
// [ResetNotification].
func ParseResetNotification(s string) (group, topic string, ok bool) {
	n, rest, found := strings.Cut(s, ":")
	if !found || n == "" || len(n) > 4 || strings.TrimLeft(n, "0123456789") != "" {
		return "", "", false
	}
	size, _ := strconv.Atoi(n) // at most 4 digits
	if size > len(rest) {
		return "", "", false
	}
	return rest[:size], rest[size:], true
}
