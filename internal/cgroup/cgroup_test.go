package cgroup_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/watermill-pglease/internal/cgroup"
)

// TestQuota puts a busy process into a group of a fifth of a CPU: the
// kernel throttles the group, its usage grows, and Close removes the
// groups with the process still running (moved out of them).
func TestQuota(t *testing.T) {
	if _, err := cgroup.Open("bad/name"); err == nil {
		t.Fatal("a group name with a slash was accepted")
	}
	s, err := cgroup.Open("pglease-cgroup-test-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Available() {
		t.Skipf("no writable CPU controller: %s", s.Reason())
	}
	defer s.Close()
	if _, err := s.New("too-much", -1); err == nil {
		t.Fatal("a negative quota was accepted")
	}
	g, err := s.New("busy", 0.2)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		used, err := g.Usage()
		if err != nil {
			t.Fatal(err)
		}
		if used > 50*time.Millisecond && throttled(t, s, g) > 0 {
			t.Logf("used %s, throttled %d times", used, throttled(t, s, g))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the busy process's group used %s and was throttled %d times", used, throttled(t, s, g))
		}
		time.Sleep(10 * time.Millisecond)
	}
	dirs := groupDirs(t, cmd.Process.Pid)
	if len(dirs) == 0 {
		t.Fatal("the process is in no group named busy")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is left after Close (%v)", d, err)
			continue
		}
		if _, err := os.Stat(filepath.Dir(d)); !os.IsNotExist(err) {
			t.Errorf("the parent group %s is left after Close (%v)", filepath.Dir(d), err)
		}
	}
	if left := groupDirs(t, cmd.Process.Pid); len(left) > 0 {
		t.Fatalf("the process is still in %v after Close", left)
	}
}

// throttled returns nr_throttled of g's cpu.stat.
func throttled(t *testing.T, s *cgroup.Set, g *cgroup.Group) int {
	t.Helper()
	dir := filepath.Join(cgroup.Root, "cpu")
	if s.Version() == 2 {
		dir = cgroup.Root
	}
	var path string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == g.Name() && strings.Contains(p, "pglease-cgroup-test-") {
			path = filepath.Join(p, "cpu.stat")
			return filepath.SkipAll
		}
		return nil
	})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "nr_throttled "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// groupDirs returns the directories of the groups named busy that /proc
// lists for pid.
func groupDirs(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasSuffix(parts[2], "/busy") {
			continue
		}
		switch parts[1] {
		case "cpu", "cpuacct", "cpu,cpuacct":
			dirs = append(dirs, filepath.Join(cgroup.Root, parts[1], parts[2]))
		case "":
			dirs = append(dirs, filepath.Join(cgroup.Root, parts[2]))
		}
	}
	return dirs
}
