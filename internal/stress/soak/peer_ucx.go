// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package main

import (
	"os"

	"github.com/kvxfer/kvxfer/internal/stress"
)

// The soak binary is also the peer process of its own --processes mode.
func init() {
	if code, ran := stress.RunPeerFromEnv(); ran {
		os.Exit(code)
	}
}
