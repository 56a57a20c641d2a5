package admin_test

import (
	"os"
	"testing"

	"github.com/pglease/watermill-pglease/internal/testkit"
)

// The helpers of the Inspector's tests are those of the root package's
// tests, in internal/testkit and internal/pgtest.

func TestMain(m *testing.M) {
	os.Exit(testkit.Main(m, "admin"))
}

// parallel marks a test that may run beside the other parallel ones (see
// the rule of the root package's parallel helper).
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
}
