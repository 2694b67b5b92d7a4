// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package main

import "os/exec"

// dieWithParent does nothing here: only Linux has a parent-death signal. The prefill process
// still stops and reaps the decode process on every exit path it runs.
func dieWithParent(*exec.Cmd) {}
