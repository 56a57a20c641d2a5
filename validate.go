package pglease

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pglease/watermill-pglease/internal/check"
)

// MaxTopicLength is the longest topic name accepted, in bytes.
const MaxTopicLength = 255

func validateTopic(topic string) error {
	if err := check.Topic(topic, MaxTopicLength); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTopic, err)
	}
	return nil
}

// validText reports whether PostgreSQL can store s in a text or jsonb value.
func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// decodeMetadata decodes a message's stored metadata (nil or JSON null:
// none). It fails on anything but a JSON object of strings, which
// pglease never writes (a row inserted by hand or by another program).
func decodeMetadata(raw []byte) (map[string]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var md map[string]string
	if err := json.Unmarshal(raw, &md); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUndecodableMetadata, err)
	}
	return md, nil
}
