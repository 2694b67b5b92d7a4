// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// UsageError is bad command-line input; its message says what to fix.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Command is `kvxbench stress`: it parses args, runs the soak, and writes the summary table
// (or, with --json, the Report as JSON) to stdout; logs go to stderr. It returns nil when
// every invariant held, an error wrapping ErrBreach when one broke (the output lists them),
// a *UsageError for bad flags, and flag.ErrHelp after -h printed the flags.
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvxbench stress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	fs.DurationVar(&cfg.Duration, "duration", DefaultDuration, "how long new requests start; the drain and checks follow")
	fs.IntVar(&cfg.Concurrency, "concurrency", DefaultConcurrency, "requests in progress at once")
	faults := fs.String("faults", "all", "comma-separated faults to inject ("+joinFaults()+"), all, or none")
	fs.Uint64Var(&cfg.Seed, "seed", DefaultSeed, "seed of every random choice")
	fs.Float64Var(&cfg.LargeFraction, "large-fraction", DefaultLargeFraction, "share of requests larger than a staging slot")
	fs.Float64Var(&cfg.TPFraction, "tp-fraction", DefaultTPFraction, "share of requests received from two TP=2 prefill ranks")
	fs.Float64Var(&cfg.CancelFraction, "cancel-fraction", DefaultCancelFraction, "share of requests cancelled (fault cancel)")
	fs.Float64Var(&cfg.DeadlineFraction, "deadline-fraction", DefaultDeadlineFraction, "share of requests with a 1-20 ms deadline (fault deadline)")
	fs.Float64Var(&cfg.DirectFraction, "direct-fraction", DefaultDirectFraction, "share of requests whose pools take the one-copy path (RMA gets or IOV messages) instead of staging slots; 0 for none (in-process soak only)")
	fs.DurationVar(&cfg.TransferTimeout, "transfer-timeout", DefaultTransferTimeout, "deadline of the other requests")
	fs.DurationVar(&cfg.ProgressDeadline, "progress-deadline", DefaultProgressDeadline, "engines' progress deadline: health must turn within it")
	fs.DurationVar(&cfg.QuarantineTimeout, "quarantine-timeout", DefaultQuarantineTimeout, "engines' quarantine timeout")
	fs.DurationVar(&cfg.FreezeFor, "freeze", DefaultFreezeFor, "how long a frozen peer stays frozen (fault freeze)")
	fs.DurationVar(&cfg.Grace, "grace", DefaultGrace, "slack on every bound the checker enforces")
	fs.DurationVar(&cfg.RecoveryBound, "recovery", DefaultRecoveryBound, "health must be back within this after a peer is")
	routes := fs.String("paths", "all", "--processes: the routes of the mix, comma-separated (staging, pull, direct, rma, cma), or all")
	fs.BoolVar(&cfg.DecodeDisablesPull, "decode-no-pull", false, "--processes: decode never asks for the pull wire (staging by tagged messages only)")
	fs.DurationVar(&cfg.DrainFor, "drain-for", DefaultDrainFor, "deadline of a restarted engine's Drain before its Close (fault restart)")
	fs.DurationVar(&cfg.DeadPeerBound, "dead-peer-bound", DefaultDeadPeerBound, "a request to a peer known dead must fail within this (fault dead-peer)")
	fs.DurationVar(&cfg.FrozenSeenSlack, "frozen-seen-slack", DefaultFrozenSeenSlack, "a freeze with one path in flight must be seen within the progress deadline plus this (fault freeze-paths)")
	fs.IntVar(&cfg.LossPercent, "loss", DefaultLossPercent, "percent of packets the lossy link drops (fault partition)")
	fs.IntVar(&cfg.HungPeerFirst, "hung-peer-first", 0, "--processes: the prefill process (0 or 1) the first hung peer stops; 1 is the direct route's TP=1 sender (fault hung-peer)")
	maxHeapMiB := fs.Uint64("max-heap-mib", DefaultMaxHeapBytes>>20, "heap bound, MiB")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	processes := fs.Bool("processes", false, "run the prefill side as two peer processes over UCX (SIGSTOP, SIGKILL) instead of in-process engines")
	tls := fs.String("tls", "", "UCX_TLS for --processes (e.g. tcp,self); default UCX's choice")
	verbose := fs.Bool("v", false, "log faults and breaches to stderr as they happen")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return flag.ErrHelp
		}
		return &UsageError{Msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return &UsageError{Msg: fmt.Sprintf("stress takes no arguments, got %q", fs.Args())}
	}
	var err error
	if cfg.Faults, err = ParseFaults(*faults); err != nil {
		return &UsageError{Msg: err.Error()}
	}
	cfg.NoFaults = len(cfg.Faults) == 0
	if cfg.Routes, err = ParseRoutes(*routes); err != nil {
		return &UsageError{Msg: err.Error()}
	}
	cfg.NoDirect = cfg.DirectFraction == 0
	cfg.MaxHeapBytes = *maxHeapMiB << 20
	if *verbose {
		enc := zap.NewDevelopmentEncoderConfig()
		cfg.Logger = zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(stderr), zapcore.InfoLevel))
	}
	var rep *Report
	if *processes {
		if runProcesses == nil {
			return &UsageError{Msg: "--processes needs the UCX transport, which this binary was built without"}
		}
		rep, err = runProcesses(ctx, cfg, *tls, "")
	} else {
		rep, err = Run(ctx, cfg)
	}
	if rep == nil {
		if errors.Is(err, ErrInvalidConfig) {
			return &UsageError{Msg: err.Error()}
		}
		return err
	}
	var werr error
	if *asJSON {
		werr = rep.WriteJSON(stdout)
	} else {
		werr = rep.WriteTable(stdout)
	}
	if err != nil {
		return err
	}
	return werr
}

// runProcesses is RunProcesses where the UCX transport is built in, nil elsewhere.
var runProcesses func(ctx context.Context, cfg Config, tls, exe string) (*Report, error)

func joinFaults() string {
	names := make([]string, len(AllFaults))
	for i, f := range AllFaults {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}
