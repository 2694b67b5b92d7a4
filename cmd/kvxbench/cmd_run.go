// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/internal/streambench"
)

func envTLS() string { return os.Getenv("UCX_TLS") }

func cmdRun(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	var sf streamFlags
	fs := newFlagSet("run", "run [flags]", out)
	f.register(fs, time.Second)
	sf.register(fs)
	hops := fs.Bool("hops", false, "stamp each request's hops in both processes (the engine's steps, the UCX workers' wakes) and print each row's per-hop medians on stderr, joined by wall clock (docs/benchmarks.md); a worker's stamps are right at concurrency 1 only")
	hopsRaw := fs.String("hops-raw", "", "with --hops (which it implies), also write every stamp of both processes and each timed row's request ids to this file, as JSON: a row's tail taken apart request by request (docs/bench.md)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("run takes no arguments, got %q", fs.Args())
	}
	if err := sf.check(); err != nil {
		return err
	}
	cfg, note, err := f.resolveDevice()
	if err != nil {
		return err
	}
	if err := bench.CheckDeviceRun(cfg, sf.on); err != nil { // --memory device: a GPU and a CUDA UCX, or one line
		return err
	}
	printNote(out, note)
	if sf.on {
		return bench.Stream(ctx, cfg, sf.StreamOptions, f.out.Output, out)
	}
	perftest, err := baselineBinary(fs, f.out.Baseline, out)
	if err != nil {
		return err
	}
	pr := bench.NewPrinter(out.Stdout, f.out.JSON)
	cfg.Hops, cfg.HopsRaw = *hops || *hopsRaw != "", *hopsRaw
	if err := bench.Loopback(ctx, cfg, f.out.Output, perftest, out, pr.Add); err != nil {
		return err
	}
	return pr.Finish(f.out.Plot)
}

// streamFlags are run's --stream flags: layer-wise streaming measured beside simulated
// prefill (internal/streambench), instead of the loopback run.
type streamFlags struct {
	on bool
	bench.StreamOptions
}

func (f *streamFlags) register(fs *flagSet) {
	fs.BoolVar(&f.on, "stream", false, "measure layer-wise streaming instead: how much of each prompt's transfer hides behind simulated prefill (exposed time against the plain transfer)")
	fs.DurationVar(&f.LayerCompute, "layer-compute", 0, "with --stream: simulated prefill time per layer (default: the plain transfer time over the layer count, measured first)")
	fs.BoolVar(&f.Busy, "busy-compute", false, "with --stream: spin the CPU through each layer's compute instead of sleeping (a host that is busy too)")
	fs.IntVar(&f.Runs, "stream-runs", 3, "with --stream: plain and streamed transfers per prompt; medians are reported")
	fs.StringVar(&f.Transport, "stream-transport", streambench.TransportUCX, "with --stream: ucx (two engines over UCX in this process) or mem (the engine's in-memory transport)")
}

func (f *streamFlags) check() error {
	switch {
	case f.LayerCompute < 0:
		return usagef("--layer-compute = %v: must not be negative", f.LayerCompute)
	case f.Runs < 1:
		return usagef("--stream-runs = %d: must be at least 1", f.Runs)
	case f.Transport != streambench.TransportUCX && f.Transport != streambench.TransportMem:
		return usagef("--stream-transport %q: choose %s or %s", f.Transport, streambench.TransportUCX, streambench.TransportMem)
	}
	return nil
}

// baselineBinary finds ucx_perftest when the baseline is on. Missing, it is an error only
// when --baseline was given explicitly; by default the run goes on without it, with a note.
func baselineBinary(fs *flagSet, want bool, out *outputs) (string, error) {
	if !want {
		return "", nil
	}
	path, err := perftest.Find()
	if err == nil {
		return path, nil
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "baseline" })
	if explicit {
		return "", fmt.Errorf("--baseline: %w", err)
	}
	fmt.Fprintf(out.Stderr, "kvxbench: note: no baseline: %v\n", err)
	return "", nil
}

// cmdPeer is the hidden subcommand run starts: a prefill end that connects back to its parent.
func cmdPeer(ctx context.Context, args []string, out *outputs) error {
	var a bench.PeerArgs
	fs := newFlagSet("peer", "peer --control ADDR --rank N --config JSON (started by run)", out)
	a.Register(fs.FlagSet)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return bench.Peer(ctx, a)
}
