// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/kvxfer/kvxfer/internal/stress"
)

func main() {
	quietUCX()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := stress.Command(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var ue *stress.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
}

// quietUCX restarts a --processes run with UCX_LOG_LEVEL=fatal unless the caller chose a
// level. UCX reads it when the library loads, before main, and by default logs to stdout:
// every unexpected message a killed peer leaves behind would land in the --json output.
func quietUCX() {
	if _, set := os.LookupEnv("UCX_LOG_LEVEL"); set {
		return
	}
	if !slices.Contains(os.Args[1:], "--processes") && !slices.Contains(os.Args[1:], "-processes") {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return // keep going, noisily
	}
	_ = syscall.Exec(exe, os.Args, append(os.Environ(), "UCX_LOG_LEVEL=fatal")) // returns only on failure
}
