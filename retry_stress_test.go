//go:build stress

package pglease_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// TestStressRetryCrash repeats TestRetryCrashAtEveryStep's run of every
// step PGLEASE_STRESS_RETRY_CRASHES times (default 20). Run it with `make
// stress`.
func TestStressRetryCrash(t *testing.T) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("PGLEASE_STRESS_RETRY_CRASHES")); err == nil && v > 0 {
		n = v
	}
	for _, s := range retryCrashSteps {
		for i := range n {
			t.Run(fmt.Sprintf("%s/%d", s.name(), i), func(t *testing.T) { runRetryCrash(t, s) })
		}
	}
}
