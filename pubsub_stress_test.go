//go:build stress

package pglease_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// TestStressPubSub runs the universal suite ten times in parallel (set
// STRESS_TEST_COUNT to change it). Run it with `make stress`.
func TestStressPubSub(t *testing.T) {
	c := newConformance(t)
	features := c.features()
	if raceDetector {
		features.RestartServiceCommand = nil // see TestPubSub
	}
	tests.TestPubSubStressTest(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, t.Name()) },
		c.pubSub,
	)
}
