package engine

import (
	"encoding/json"
	"fmt"
)

// The metadata keys the engine reads and sets; the root package spells
// them out under the same names, for godoc (TestMetadataKeysAreTheEngines).
const (
	// PartitionKeyMetadata gives a message's partition key, and its
	// ordering key when none is configured.
	PartitionKeyMetadata = "partition_key"
	// DeliveryAttemptMetadata is set on every message handed out: the
	// delivery attempt, from 1.
	DeliveryAttemptMetadata = "_pglease_delivery_attempt"
)

// KeyHash is the hash that places a key in a topic's partitions: the
// 32-bit FNV-1a hash of its bytes (hash/fnv's New32a, computed here
// without its allocations: every Publish hashes). It must not change: it
// places the keys of messages stored by every release
// (TestKeyHashIsFNV1a).
func KeyHash(key string) uint32 {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= prime32
	}
	return h
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
