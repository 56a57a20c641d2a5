package pglease_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/watermill-pglease/internal/pgtest"
	"github.com/pglease/watermill-pglease/internal/testkit"
)

// TestExamplesRun runs each program of _examples against the test database:
// each checks its own outcome and exits non-zero when it is wrong. One
// that is a module of its own (cqrs: Watermill's CQRS component imports
// protobuf packages the library does not require) runs in its directory.
func TestExamplesRun(t *testing.T) {
	// The examples work in the tables of the public schema, which no other
	// test of this package uses; they run one after the other.
	parallel(t)
	pgtest.SkipShort(t)
	for _, dir := range []string{"./_examples/basic", "./_examples/exactlyonce", "./_examples/requeue", "./_examples/cqrs"} {
		t.Run(dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "run", dir)
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				cmd = exec.CommandContext(ctx, "go", "run", ".")
				cmd.Dir = dir
			}
			// GOWORK=off: the example module builds on its own go.mod.
			cmd.Env = append(os.Environ(), "DATABASE_URL="+testkit.DSN, "GOWORK=off")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "go run %s:\n%s", dir, out)
		})
	}
}
