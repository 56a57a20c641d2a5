package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/admin"
)

var messagesSpec = commandSpec{
	name:     "messages",
	summary:  "browse a topic's stored messages, newest first, or look one up by UUID",
	synopsis: "--topic TOPIC [--partition P] [--limit N] [--from-position TX:OFFSET] [--uuid ID] [--preview-bytes N] [--json]",
	help: `Lists the stored messages of a topic, newest first (by position, the order in
which a consumer group receives them, each partition on its own): position,
partition, UUID, when it was stored, payload size, a preview of the payload
(as text, or as hex when it is not printable text) and the metadata. A page
ends with the --from-position of the next, older page. Messages of
transactions still behind the xmin horizon are shown too.

--uuid shows the messages with that UUID whole (of --topic; the UUID is not
indexed, so the topic's messages are read). --json prints the page (payloads
in base64) with "next", the position of the next page, and "topic": its
partitions, retention, key windows ("key_window_ns",
"effective_key_window_ns" and "pending_key_window_ns", as pglease topics
--json has them), stored and delayed messages.`,
	new: func() subcommand { return &messagesCmd{} },
}

// messagesOutput is the JSON of pglease messages: the topic's settings
// (its key windows among them), stored and delayed messages (what the
// console's topic page shows), and the page.
type messagesOutput struct {
	Topic admin.TopicDetail `json:"topic"`
	admin.MessagePage
}

type messagesCmd struct {
	topic        onceString
	partition    int
	limit        int
	from         onceString
	uuid         string
	previewBytes int

	fromPos *pglease.Position // set by check
}

func (c *messagesCmd) flags(fs *flag.FlagSet) {
	fs.Var(&c.topic, "topic", "the `TOPIC` (required)")
	fs.IntVar(&c.partition, "partition", -1, "only this `PARTITION` (default: every partition)")
	fs.IntVar(&c.limit, "limit", admin.DefaultMessagesLimit, "show at most `N` messages")
	fs.Var(&c.from, "from-position", "start at this `TX:OFFSET` (a page's next position) and go back")
	fs.StringVar(&c.uuid, "uuid", "", "show the messages with this `UUID`, whole")
	fs.IntVar(&c.previewBytes, "preview-bytes", 64, "show this many `BYTES` of each payload (-1: all of it)")
}

func (c *messagesCmd) check(*flag.FlagSet) error {
	if !c.topic.set || c.topic.value == "" {
		return usageErrorf("--topic is required")
	}
	if c.limit < 1 || c.limit > admin.MaxMessagesLimit {
		return usageErrorf("--limit must be between 1 and %d, got %d", admin.MaxMessagesLimit, c.limit)
	}
	if c.partition < -1 {
		return usageErrorf("--partition must not be negative, got %d", c.partition)
	}
	if c.previewBytes == 0 || c.previewBytes < -1 {
		return usageErrorf("--preview-bytes must be positive or -1, got %d", c.previewBytes)
	}
	if c.from.set {
		p, err := parsePosition(c.from.value)
		if err != nil {
			return usageErrorf("--from-position: %v", err)
		}
		c.fromPos = &p
	}
	return nil
}

// parsePosition parses TRANSACTION:OFFSET, as formatPosition prints it.
func parsePosition(s string) (pglease.Position, error) {
	txText, offText, ok := strings.Cut(s, ":")
	tx, err1 := strconv.ParseUint(txText, 10, 64)
	off, err2 := strconv.ParseInt(offText, 10, 64)
	if !ok || err1 != nil || err2 != nil || off < 0 {
		return pglease.Position{}, fmt.Errorf("%q is not a position TRANSACTION:OFFSET such as 7421:1093", s)
	}
	return pglease.Position{TransactionID: tx, Offset: off}, nil
}

func (c *messagesCmd) run(ctx context.Context, e *cmdEnv) error {
	if c.uuid != "" {
		found, err := e.insp.MessagesByUUID(ctx, c.topic.value, c.uuid)
		if err != nil {
			return err
		}
		if e.json {
			return writeJSON(e.stdout, nonNil(found))
		}
		if len(found) == 0 {
			fmt.Fprintf(e.stdout, "No message %s on topic %s.\n", strconv.Quote(c.uuid), displayName(c.topic.value))
			return nil
		}
		for _, m := range found {
			printMessage(e.stdout, m)
		}
		return nil
	}
	p := admin.MessagesParams{Topic: c.topic.value, From: c.fromPos, Limit: c.limit, PreviewBytes: c.previewBytes}
	if c.partition >= 0 {
		part := int32(c.partition)
		p.Partition = &part
	}
	page, err := e.insp.Messages(ctx, p)
	if err != nil {
		return err
	}
	if e.json {
		detail, err := e.insp.TopicDetail(ctx, c.topic.value)
		if err != nil {
			return err
		}
		return writeJSON(e.stdout, messagesOutput{Topic: detail, MessagePage: page})
	}
	if len(page.Messages) == 0 {
		fmt.Fprintf(e.stdout, "No messages on topic %s here.\n", displayName(c.topic.value))
		return nil
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "POSITION\tPARTITION\tUUID\tSTORED\tSIZE\tPAYLOAD\tMETADATA")
	for _, m := range page.Messages {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\n", formatPosition(m.Position), m.Partition, displayName(m.UUID),
			formatTime(m.CreatedAt), m.PayloadSize, orDash(abbreviate(payloadPreview(m), 60)), orDash(abbreviate(formatStoredMetadata(m), 80)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != nil {
		fmt.Fprintf(e.stdout, "\nOlder messages: --from-position %s\n", formatPosition(*page.Next))
	}
	return nil
}

// printMessage prints one message whole.
func printMessage(w io.Writer, m admin.StoredMessage) {
	tw := newTable(w)
	fmt.Fprintf(tw, "uuid\t%s\n", m.UUID)
	fmt.Fprintf(tw, "topic\t%s\n", displayName(m.Topic))
	fmt.Fprintf(tw, "partition\t%d\n", m.Partition)
	fmt.Fprintf(tw, "position\t%s\n", formatPosition(m.Position))
	fmt.Fprintf(tw, "stored\t%s\n", formatTime(m.CreatedAt))
	if m.ExpiresAt != nil {
		fmt.Fprintf(tw, "expires\t%s\n", formatTime(*m.ExpiresAt))
	}
	if m.RawMetadata != "" {
		fmt.Fprintf(tw, "metadata as stored\t%s (not a JSON object of strings: Subscribers skip this message)\n", m.RawMetadata)
	}
	keys := sortedKeys(m.Metadata)
	for _, k := range keys {
		fmt.Fprintf(tw, "metadata %s\t%s\n", displayName(k), m.Metadata[k])
	}
	fmt.Fprintf(tw, "payload\t%d bytes\n", m.PayloadSize)
	_ = tw.Flush()
	text, isText := payloadText(m.Payload)
	if isText {
		fmt.Fprintf(w, "%s\n\n", text)
	} else {
		fmt.Fprintf(w, "%s\n", hex.Dump(m.Payload))
	}
}

// payloadText returns the payload as text, and whether it is printable
// UTF-8 text (else it is shown in hex).
func payloadText(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		// A preview may end in the middle of a character.
		trimmed := b
		for range utf8.UTFMax {
			if len(trimmed) == 0 || utf8.Valid(trimmed) {
				break
			}
			trimmed = trimmed[:len(trimmed)-1]
		}
		if !utf8.Valid(trimmed) {
			return "", false
		}
		b = trimmed
	}
	s := string(b)
	for _, r := range s {
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return "", false
		}
	}
	return s, true
}

// payloadPreview is a message's payload on one line: text, or "hex:"
// and its hex digits.
func payloadPreview(m admin.StoredMessage) string {
	if s, ok := payloadText(m.Payload); ok {
		return s
	}
	return "hex:" + hex.EncodeToString(m.Payload)
}

// formatStoredMetadata is a message's metadata on one line: key=value
// pairs, or "raw:" and the metadata as stored when it is not a JSON
// object of strings.
func formatStoredMetadata(m admin.StoredMessage) string {
	if m.RawMetadata != "" {
		return "raw:" + m.RawMetadata
	}
	return formatMetadata(m.Metadata)
}

func formatMetadata(md map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(md) {
		parts = append(parts, k+"="+md[k])
	}
	return strings.Join(parts, " ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
