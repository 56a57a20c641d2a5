// Package cgroup puts processes into control groups of their own with a
// CPU quota, and reads the CPU time each group used: the simulated cluster
// of the Citus benchmark gives each node and each client process a share
// of the machine as if it had a machine of its own.
//
// It uses cgroup v1's cpu and cpuacct controllers (cpu.cfs_quota_us,
// cpuacct.usage) when /sys/fs/cgroup/cpu is writable, else cgroup v2's
// cpu controller (cpu.max, cpu.stat) when /sys/fs/cgroup is a writable v2
// hierarchy. When neither is, [Open] returns a [Set] that puts nothing
// anywhere: [Set.Available] is false and [Set.Reason] says why, and the
// caller runs without quotas.
//
// The groups of a Set lie under one group named after it, made by Open and
// removed with everything in it by [Set.Close]. Meant for tests and
// benchmarks, as root.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Root is where the cgroup file systems are mounted.
var Root = "/sys/fs/cgroup"

// period is the CFS period of a quota: the quota is cpus × period of CPU
// time per period.
const period = 100 * time.Millisecond

// removeTries bounds the attempts to remove a group whose processes are
// still on their way out, each removeWait apart.
const (
	removeTries = 100
	removeWait  = 20 * time.Millisecond
)

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Set is the groups made under one parent group. Its methods are not safe
// for concurrent use.
type Set struct {
	version int    // 1 or 2; 0 when not available
	reason  string // why not available
	// dirs are the parent group's directories: v1 cpu (and cpuacct when
	// a hierarchy of its own), v2 the one.
	dirs   []string
	groups []*Group
}

// Group is one group of a [Set].
type Group struct {
	s    *Set
	name string
	cpus float64
	dirs []string // as Set.dirs: cpu first, then cpuacct if apart
}

// Open makes the parent group name (letters, digits, '_', '.', '-') and
// returns its Set. When no writable CPU controller is found it returns a
// Set that is not [Set.Available], and no error.
func Open(name string) (*Set, error) {
	if !validName.MatchString(name) {
		return nil, fmt.Errorf("cgroup: group name %q: letters, digits, '_', '.' and '-' only, up to 64", name)
	}
	var reasons []string
	// cgroup v1: the cpu controller's hierarchy, and cpuacct's when it is
	// another (mounted apart, or together as cpu,cpuacct).
	cpu := filepath.Join(Root, "cpu")
	if _, err := os.Stat(filepath.Join(cpu, "cpu.cfs_quota_us")); err == nil {
		dirs := []string{filepath.Join(cpu, name)}
		acct := filepath.Join(Root, "cpuacct")
		if same, err := sameDir(cpu, acct); err == nil && !same {
			if _, err := os.Stat(filepath.Join(acct, "cpuacct.usage")); err == nil {
				dirs = append(dirs, filepath.Join(acct, name))
			}
		}
		s := &Set{version: 1, dirs: dirs}
		err := s.mkdirs()
		if err == nil {
			return s, nil
		}
		reasons = append(reasons, "cgroup v1: "+err.Error())
	} else {
		reasons = append(reasons, "cgroup v1: no cpu controller at "+cpu)
	}
	// cgroup v2: the unified hierarchy at Root, its cpu controller
	// enabled for the parent group's children.
	if ctrl, err := os.ReadFile(filepath.Join(Root, "cgroup.controllers")); err == nil {
		if !hasWord(string(ctrl), "cpu") {
			reasons = append(reasons, "cgroup v2: the cpu controller is not available at "+Root)
		} else {
			s := &Set{version: 2, dirs: []string{filepath.Join(Root, name)}}
			err := writeFile(filepath.Join(Root, "cgroup.subtree_control"), "+cpu")
			if err == nil {
				err = s.mkdirs()
			}
			if err == nil {
				err = writeFile(filepath.Join(s.dirs[0], "cgroup.subtree_control"), "+cpu")
				if err != nil {
					_ = os.Remove(s.dirs[0])
				}
			}
			if err == nil {
				return s, nil
			}
			reasons = append(reasons, "cgroup v2: "+err.Error())
		}
	} else {
		reasons = append(reasons, "cgroup v2: no unified hierarchy at "+Root)
	}
	return &Set{reason: strings.Join(reasons, "; ")}, nil
}

// Available reports whether the Set puts processes into groups with
// quotas. When false, its groups do nothing and report no usage.
func (s *Set) Available() bool { return s.version != 0 }

// Reason says why the Set is not available ("" when it is).
func (s *Set) Reason() string { return s.reason }

// Version returns the cgroup version used: 1, 2, or 0 when not available.
func (s *Set) Version() int { return s.version }

// New makes a group in s whose processes together get at most cpus CPUs
// (0.25: a quarter of one CPU's time; 0: no quota).
func (s *Set) New(name string, cpus float64) (*Group, error) {
	if !validName.MatchString(name) {
		return nil, fmt.Errorf("cgroup: group name %q: letters, digits, '_', '.' and '-' only, up to 64", name)
	}
	if cpus < 0 || cpus > 1024 {
		return nil, fmt.Errorf("cgroup: a quota of %g CPUs: it lies between 0 (none) and 1024", cpus)
	}
	g := &Group{s: s, name: name, cpus: cpus}
	if !s.Available() {
		return g, nil
	}
	for _, d := range s.dirs {
		g.dirs = append(g.dirs, filepath.Join(d, name))
	}
	for _, d := range g.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			if rerr := g.remove(); rerr != nil {
				return nil, fmt.Errorf("cgroup: %w (and removing what was made: %w)", err, rerr)
			}
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	s.groups = append(s.groups, g)
	if cpus == 0 {
		return g, nil
	}
	quota := int64(cpus * float64(period/time.Microsecond))
	var err error
	if s.version == 1 {
		if err = writeFile(filepath.Join(g.dirs[0], "cpu.cfs_period_us"), strconv.FormatInt(int64(period/time.Microsecond), 10)); err == nil {
			err = writeFile(filepath.Join(g.dirs[0], "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10))
		}
	} else {
		err = writeFile(filepath.Join(g.dirs[0], "cpu.max"), fmt.Sprintf("%d %d", quota, period/time.Microsecond))
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: the quota of %s: %w", name, err)
	}
	return g, nil
}

// Name returns the group's name.
func (g *Group) Name() string { return g.name }

// CPUs returns the group's quota in CPUs (0: none).
func (g *Group) CPUs() float64 { return g.cpus }

// Add moves the process pid (all its threads) into g. Its children forked
// from then on are in g too.
func (g *Group) Add(pid int) error {
	for _, d := range g.dirs {
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			// A process that exited meanwhile is not an error.
			if errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "no such process") {
				return nil
			}
			return fmt.Errorf("cgroup: add process %d to %s: %w", pid, g.name, err)
		}
	}
	return nil
}

// Usage returns the CPU time the processes of g have used since it was
// made, those gone included. It is 0 when the Set is not available.
func (g *Group) Usage() (time.Duration, error) {
	if len(g.dirs) == 0 {
		return 0, nil
	}
	if g.s.version == 1 {
		b, err := os.ReadFile(filepath.Join(g.dirs[len(g.dirs)-1], "cpuacct.usage"))
		if err != nil {
			return 0, fmt.Errorf("cgroup: usage of %s: %w", g.name, err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cgroup: usage of %s: %w", g.name, err)
		}
		return time.Duration(ns), nil
	}
	f, err := os.Open(filepath.Join(g.dirs[0], "cpu.stat"))
	if err != nil {
		return 0, fmt.Errorf("cgroup: usage of %s: %w", g.name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroup: usage of %s: %w", g.name, err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("cgroup: usage of %s: no usage_usec in cpu.stat", g.name)
}

// Close removes every group of s and the parent group. Processes still in
// a group are moved to the root group first (they keep running, without a
// quota). Later calls do nothing.
func (s *Set) Close() error {
	var errs []error
	for _, g := range s.groups {
		if err := g.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	s.groups = nil
	for _, d := range s.dirs {
		if err := removeDir(d, filepath.Dir(d)); err != nil {
			errs = append(errs, err)
		}
	}
	s.dirs = nil
	s.version = 0
	if s.reason == "" {
		s.reason = "closed"
	}
	return errors.Join(errs...)
}

func (g *Group) remove() error {
	var errs []error
	for _, d := range g.dirs {
		if err := removeDir(d, filepath.Dir(filepath.Dir(d))); err != nil {
			errs = append(errs, err)
		}
	}
	g.dirs = nil
	return errors.Join(errs...)
}

// removeDir moves the processes of the group d to the group root (the
// root of its hierarchy) and removes d, retrying while processes are on
// their way out.
func removeDir(d, root string) error {
	var err error
	for range removeTries {
		if procs, rerr := os.ReadFile(filepath.Join(d, "cgroup.procs")); rerr == nil {
			for _, pid := range strings.Fields(string(procs)) {
				_ = writeFile(filepath.Join(root, "cgroup.procs"), pid)
			}
		}
		err = os.Remove(d)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(removeWait)
	}
	return fmt.Errorf("cgroup: remove %s: %w", d, err)
}

func (s *Set) mkdirs() error {
	for i, d := range s.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			for _, made := range s.dirs[:i] {
				_ = os.Remove(made)
			}
			return err
		}
	}
	return nil
}

func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

func sameDir(a, b string) (bool, error) {
	ra, err := filepath.EvalSymlinks(a)
	if err != nil {
		return false, err
	}
	rb, err := filepath.EvalSymlinks(b)
	if err != nil {
		return false, err
	}
	return ra == rb, nil
}

func hasWord(s, w string) bool {
	for _, f := range bytes.Fields([]byte(s)) {
		if string(f) == w {
			return true
		}
	}
	return false
}
