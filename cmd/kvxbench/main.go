// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// Exit codes. Bad input is told apart from a failed run so scripts can tell a typo from a
// regression.
const (
	exitOK    = 0
	exitError = 1 // the benchmark ran and failed, or its environment cannot run it
	exitUsage = 2 // bad flags, unknown preset, impossible layout
	// exitInterrupted follows the shell's convention for a process ended by SIGINT.
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is bad input: the message says what to fix, and the exit code is exitUsage.
// Package bench returns the same type for input it refuses once the flags are parsed.
type usageError = bench.UsageError

func usagef(format string, a ...any) error { return bench.Usagef(format, a...) }

// command is one subcommand: its name, a one-line summary, and the function that parses its
// flags and runs it.
type command struct {
	name    string
	summary string
	hidden  bool
	run     func(ctx context.Context, args []string, out *outputs) error
}

// outputs carries the writers a subcommand prints to: results on stdout, everything else
// (progress, warnings, errors) on stderr, so `--json` output can be piped as is.
type outputs = bench.Outputs

func commands() []command {
	return []command{
		{name: "run", summary: "loopback transfer between two processes on this host (the default)", run: cmdRun},
		{name: "gather", summary: "host or device gather and scatter alone, against memcpy of the same bytes", run: cmdGather},
		{name: "sweep", summary: "transfer bandwidth over block size by batch size, for tuning", run: cmdSweep},
		{name: "serve", summary: "the prefill end of a two-host run; prints the address for connect", run: cmdServe},
		{name: "connect", summary: "the decode end of a two-host run: connect ADDR", run: cmdConnect},
		{name: "memcpy", summary: "the host's copy rate with 1..N threads over shared mappings, to read --lanes against", run: cmdMemcpy},
		{name: "devices", summary: "the GPUs NVML reports, which --memory device --device picks from", run: cmdDevices},
		{name: "stress", summary: "fault soak: cancel storms, frozen, killed and partitioned peers; fails on any breach", run: cmdStress},
		{name: "peer", summary: "internal: the second process of run", hidden: true, run: cmdPeer},
	}
}

// Main runs kvxbench with args (without the program name) and returns the exit code. It never
// panics on bad input and never calls os.Exit, so tests drive it in-process.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	out := &outputs{Stdout: stdout, Stderr: stderr}
	name := "run"
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			// The top-level help lists the subcommands; `help run` (or `run -h`) lists run's flags.
			return help(args[1:], out)
		}
		if args[0] != "" && args[0][0] != '-' {
			name, args = args[0], args[1:]
		}
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, args, out)
		if err != nil && ctx.Err() != nil {
			// Whatever failed last (often a peer's broken pipe, since the peers were
			// stopped first) is a consequence: say what happened.
			fmt.Fprintf(stderr, "kvxbench: interrupted (%v)\n", err)
			return exitInterrupted
		}
		return report(err, out)
	}
	fmt.Fprintf(stderr, "kvxbench: unknown subcommand %q; `kvxbench help` lists them\n", name)
	return exitUsage
}

// report prints err, if any, as one line and maps it to an exit code. No stack traces: a
// failure the user can act on is a sentence, not a panic.
func report(err error, out *outputs) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelpShown):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(out.Stderr, "kvxbench: %v\n", err)
		return exitUsage
	default:
		fmt.Fprintf(out.Stderr, "kvxbench: %v\n", err)
		return exitError
	}
}

// errHelpShown ends a subcommand after -h printed its usage.
var errHelpShown = errors.New("help shown")

func help(args []string, out *outputs) int {
	if len(args) > 0 {
		for _, c := range commands() {
			if c.name == args[0] {
				// Each subcommand prints its own flags for -h.
				return report(c.run(context.Background(), []string{"-h"}, &outputs{Stdout: out.Stdout, Stderr: out.Stdout}), out)
			}
		}
		fmt.Fprintf(out.Stderr, "kvxbench: no help for unknown subcommand %q\n", args[0])
		return exitUsage
	}
	fmt.Fprintf(out.Stdout, "kvxbench measures kvxfer against the limits of this machine, in the same run.\n\n")
	fmt.Fprintf(out.Stdout, "Usage: kvxbench [subcommand] [flags]\n\nSubcommands:\n")
	for _, c := range commands() {
		if !c.hidden {
			fmt.Fprintf(out.Stdout, "  %-8s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintf(out.Stdout, "  %-8s %s\n", "help", "this text; `help SUBCOMMAND` lists its flags")
	fmt.Fprintf(out.Stdout, "\nModel presets (--model):\n")
	for _, p := range bench.Presets {
		fmt.Fprintf(out.Stdout, "  %-16s %s\n", p.Name, p.Summary)
	}
	return exitOK
}
