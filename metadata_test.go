package pglease_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	pglease "github.com/pglease/watermill-pglease"
	"github.com/pglease/watermill-pglease/internal/engine"
)

// TestMetadataKeysAreTheEngines: the root spells its metadata keys out
// for godoc; the engine, which sets and reads them, must use the same.
func TestMetadataKeysAreTheEngines(t *testing.T) {
	assert.Equal(t, pglease.DeliveryAttemptMetadata, engine.DeliveryAttemptMetadata)
	assert.Equal(t, pglease.PartitionKeyMetadata, engine.PartitionKeyMetadata)
}
