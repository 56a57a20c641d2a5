//go:build !linux

package main

import "os/exec"

// stopWithParent does nothing where the kernel cannot kill a child with
// its parent: a killed benchmark may leave a server behind there.
func stopWithParent(cmd *exec.Cmd) {}
