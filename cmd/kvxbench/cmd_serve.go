// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"net"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// discoveryFlags are --discovery and the serve's name in it (--name on serve, --peer on
// connect).
type discoveryFlags struct{ bench.Discovery }

func (d *discoveryFlags) register(fs *flag.FlagSet, nameFlag, nameDefault, nameUsage string) {
	fs.StringVar(&d.Target, "discovery", "", "registry the two ends meet through: etcd://HOST:PORT[,HOST:PORT]/PREFIX, or an embedded registry's http://HOST:PORT (docs/deploy.md)")
	fs.StringVar(&d.Name, nameFlag, nameDefault, nameUsage)
}

// cmdServe is the prefill end of a two-host run: it opens the control port, prints its
// address, waits (bounded by --wait) for one connect, and answers it.
func cmdServe(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	var o bench.ServeOptions
	fs := newFlagSet("serve", "serve [--listen HOST:PORT] [flags]", out)
	f.register(fs, time.Second)
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:0", "control address to listen on (loopback unless given: on two hosts, pass the address the decode host reaches, or :PORT for every interface); port 0 picks a free one")
	fs.DurationVar(&o.Wait, "wait", 10*time.Minute, "how long to wait for kvxbench connect")
	var disc discoveryFlags
	disc.register(fs.FlagSet, "name", "kvxbench-prefill", "with --discovery: the name to publish this serve under (connect --peer)")
	fs.StringVar(&o.Advertise, "advertise", "", "with --discovery: the control address to publish (default: the one listened on)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("serve takes no arguments, got %q", fs.Args())
	}
	if o.Wait <= 0 {
		return usagef("--wait = %v: must be positive", o.Wait)
	}
	if f.prefillTP != 1 {
		return usagef("--prefill-tp: a two-host run has one prefill rank; heterogeneous TP is measured by run")
	}
	if f.decodeTP != 1 {
		return usagef("--decode-tp: a two-host run has one decode rank; heterogeneous TP is measured by run")
	}
	cfg, note, err := f.resolveDevice()
	if err != nil {
		return err
	}
	printNote(out, note)
	o.Discovery = disc.Discovery
	return bench.Serve(ctx, cfg, o, out)
}

// cmdConnect is the decode end of a two-host run: it connects to serve's control port,
// checks the two layouts agree, and drives the scenarios.
func cmdConnect(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	fs := newFlagSet("connect", "connect [flags] HOST:PORT | connect --discovery URL [--peer NAME] [flags]", out)
	f.register(fs, time.Second)
	var disc discoveryFlags
	disc.register(fs.FlagSet, "peer", "kvxbench-prefill", "with --discovery: the name of the serve to look up")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var addr string
	switch {
	case disc.Target != "" && fs.NArg() == 0:
		var err error
		if addr, err = bench.LookupServe(ctx, disc.Discovery, f.connectTimeout); err != nil {
			return err
		}
	case disc.Target != "":
		return usagef("connect: give either --discovery or HOST:PORT, not both")
	case fs.NArg() != 1:
		return usagef("connect needs the address serve printed: kvxbench connect [flags] HOST:PORT (or --discovery URL)")
	default:
		addr = fs.Arg(0)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("connect %q: %v (write HOST:PORT)", addr, err)
	}
	if f.prefillTP != 1 {
		return usagef("--prefill-tp: a two-host run has one prefill rank; heterogeneous TP is measured by run")
	}
	if f.decodeTP != 1 {
		return usagef("--decode-tp: a two-host run has one decode rank; heterogeneous TP is measured by run")
	}
	cfg, note, err := f.resolveDevice()
	if err != nil {
		return err
	}
	printNote(out, note)
	perftest, err := baselineBinary(fs, f.out.Baseline, out)
	if err != nil {
		return err
	}
	return bench.Connect(ctx, cfg, addr, perftest, f.out.Output, out)
}

// cmdSweep measures transfers over block size by batch size, like nixlbench, for tuning:
// one loopback run per block size, each request batch blocks long.
func cmdSweep(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	fs := newFlagSet("sweep", "sweep [--block-tokens 16,32,64,128] [--batch 1,4,16,64] [flags]", out)
	f.register(fs, time.Second)
	blockTokens := fs.String("block-tokens", "16,32,64,128", "tokens per block to sweep, comma-separated (each is one run with its own pools)")
	batches := fs.String("batch", "1,4,16,64", "blocks per request to sweep, comma-separated")
	if err := fs.Set("concurrency", "1"); err != nil {
		return err
	}
	fs.Lookup("concurrency").DefValue = "1"
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("sweep takes no arguments, got %q", fs.Args())
	}
	var conflict string
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "prompts" || fl.Name == "tokens-per-block" || fl.Name == "pool-blocks" {
			conflict = fl.Name
		}
	})
	if conflict != "" {
		return usagef("sweep sets prompts and pools from --block-tokens and --batch; drop --%s", conflict)
	}
	bts, err := parseInts("block-tokens", *blockTokens)
	if err != nil {
		return err
	}
	bs, err := parseInts("batch", *batches)
	if err != nil {
		return err
	}
	base, note, err := f.resolveDevice()
	if err != nil {
		return err
	}
	printNote(out, note)
	runs, err := bench.SweepRuns(base, bts, bs)
	if err != nil {
		return err
	}
	perftest, err := baselineBinary(fs, f.out.Baseline, out)
	if err != nil {
		return err
	}
	return bench.Sweep(ctx, runs, f.out.Output, perftest, out)
}
