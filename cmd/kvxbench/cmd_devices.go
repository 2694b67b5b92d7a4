// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// cmdDevices is `kvxbench devices`: the GPUs NVML reports (cuda/gpuinfo), the ones
// --device picks from. A host without the NVIDIA driver gets one line that says so.
func cmdDevices(_ context.Context, args []string, out *outputs) error {
	fs := newFlagSet("devices", "devices [--json]", out)
	asJSON := fs.Bool("json", false, "print one JSON object (driver, gpus, nvlink_pairs) instead of the table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("devices takes no arguments, got %q", fs.Args())
	}
	return bench.ListDevices(out, *asJSON)
}
