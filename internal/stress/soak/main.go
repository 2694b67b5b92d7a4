// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvxfer/kvxfer/internal/stress"
)

func main() {
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
