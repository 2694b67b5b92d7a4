// SPDX-License-Identifier: Apache-2.0

package proc

import "syscall"

// dieWithParent has the kernel kill the child when its parent dies.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
