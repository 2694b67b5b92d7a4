// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package proc

import "syscall"

// dieWithParent does nothing here: only Linux has a parent-death signal.
func dieWithParent(*syscall.SysProcAttr) {}
