package wmsqlimport_test

import (
	"os"
	"testing"

	"github.com/pglease/watermill-pglease/internal/testkit"
)

// The helpers of the import's tests are those of the root package's
// tests, in internal/testkit and internal/pgtest.

func TestMain(m *testing.M) {
	os.Exit(testkit.Main(m, "wmsqlimport"))
}
