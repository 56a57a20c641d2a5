package pgtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These tests need no database and no Docker engine.

// TestNoDockerSaysWhatToDo: without PGLEASE_TEST_DSN and with no Docker
// engine answering, the error names the variable, `make test` and why the
// Docker engine could not be used.
func TestNoDockerSaysWhatToDo(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "docker.sock") // nothing listens there
	err := dockerAvailable("unix://"+sock, time.Second)
	if err == nil {
		t.Fatalf("dockerAvailable(%s) = nil, want an error", sock)
	}
	msg := noDatabaseError(err).Error()
	for _, want := range []string{EnvDSN, "make test", "Docker engine check", sock} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not mention %q:\n%s", want, msg)
		}
	}
}

// TestDockerHostSchemes: DOCKER_HOST values that cannot be checked are
// refused with the value in the error.
func TestDockerHostSchemes(t *testing.T) {
	for _, host := range []string{"ssh://me@box", "npipe:////./pipe/docker_engine"} {
		err := dockerAvailable(host, time.Second)
		if err == nil || !strings.Contains(err.Error(), host) {
			t.Errorf("dockerAvailable(%q) = %v, want an error naming it", host, err)
		}
	}
}

// TestContainerProgramIsBeside: the container program's directory is found
// from this package's source, and holds a module of its own.
func TestContainerProgramIsBeside(t *testing.T) {
	dir, err := containerDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"go.mod", "main.go"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the container program: %v", err)
		}
	}
}
