package main

import (
	"os/exec"
	"syscall"
)

// stopWithParent makes the kernel kill cmd's process when this process
// dies, so that a server the benchmark started (redis-server) does not
// outlive a benchmark that was killed.
func stopWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
