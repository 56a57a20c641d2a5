//go:build stress

package pglease_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// TestStressFailover repeats the failover and restore tests on fresh clusters,
// PGLEASE_STRESS_FAILOVERS times (default 5). Run it with `make stress`.
func TestStressFailover(t *testing.T) {
	n := 5
	if v, err := strconv.Atoi(os.Getenv("PGLEASE_STRESS_FAILOVERS")); err == nil && v > 0 {
		n = v
	}
	for i := range n {
		t.Run(fmt.Sprintf("lagging/%d", i), TestFailoverToALaggingStandbyDeliversWhatIsPublishedAfter)
		t.Run(fmt.Sprintf("synchronous/%d", i), TestSynchronousFailoverLosesNoPublishedMessage)
		t.Run(fmt.Sprintf("copy/%d", i), TestCopyStartedAsItIsDeliversWhatIsPublishedAfter)
	}
}
