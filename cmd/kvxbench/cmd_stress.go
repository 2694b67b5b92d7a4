// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/kvxfer/kvxfer/internal/stress"
)

// A `kvxbench stress --processes` run starts this binary again as its peer processes, with
// stress.PeerEnv set; serve as one before anything else runs.
func init() {
	if code, ran := stress.RunPeerFromEnv(); ran {
		os.Exit(code)
	}
}

// cmdStress is `kvxbench stress`: the fault soak of package internal/stress (docs/stress.md).
// It exits non-zero on any breached invariant; the output lists each.
func cmdStress(ctx context.Context, args []string, out *outputs) error {
	err := stress.Command(ctx, args, out.Stdout, out.Stderr)
	var ue *stress.UsageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return errHelpShown
	case errors.As(err, &ue):
		return usagef("stress: %s", ue.Msg)
	}
	return err
}
