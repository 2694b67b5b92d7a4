// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the decode process if the prefill process dies without
// reaping it (SIGKILL, a crash), the one exit path no deferred stop can cover.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
