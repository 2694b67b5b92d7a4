// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"time"

	"github.com/kvxfer/kvxfer/transfer/observe"
)

// cmdServe is the prefill end of a two-host run: it opens the control port, prints its
// address, waits (bounded by --wait) for one connect, and answers it.
func cmdServe(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	fs := newFlagSet("serve", "serve [--listen HOST:PORT] [flags]", out)
	f.register(fs, time.Second)
	listen := fs.String("listen", "127.0.0.1:0", "control address to listen on (loopback unless given: on two hosts, pass the address the decode host reaches, or :PORT for every interface); port 0 picks a free one")
	wait := fs.Duration("wait", 10*time.Minute, "how long to wait for kvxbench connect")
	var disc discoveryFlags
	disc.register(fs.FlagSet, "name", "kvxbench-prefill", "with --discovery: the name to publish this serve under (connect --peer)")
	advertise := fs.String("advertise", "", "with --discovery: the control address to publish (default: the one listened on)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("serve takes no arguments, got %q", fs.Args())
	}
	if *wait <= 0 {
		return usagef("--wait = %v: must be positive", *wait)
	}
	if f.prefillTP != 1 {
		return usagef("--prefill-tp: a two-host run has one prefill rank; heterogeneous TP is measured by run")
	}
	cfg, err := f.resolve(envTLS)
	if err != nil {
		return err
	}
	// The probes answer from now on (live, not ready until the engine exists), not only once a
	// peer has connected.
	obs, err := newObservability(cfg.HTTP, rolePrefill, 0)
	if err != nil {
		return err
	}
	if obs != nil {
		obs.pending = observe.NewPending("waiting for kvxbench connect")
		obs.process = true
		cfg.processHTTP = obs
		defer obs.closeProcess()
	}
	if err := obs.listen(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", *listen, err)
	}
	defer ln.Close()
	fmt.Fprintf(out.stderr, "kvxbench: serving on %s; on the decode host run: kvxbench connect HOST:%d (with the same layout flags)\n",
		ln.Addr(), ln.Addr().(*net.TCPAddr).Port)
	if disc.target != "" {
		adv := *advertise
		if adv == "" {
			adv = ln.Addr().String()
		}
		httpAddr := ""
		if obs != nil {
			httpAddr = obs.srv.Addr()
		}
		withdraw, err := publishServe(ctx, disc, adv, httpAddr)
		if err != nil {
			return err
		}
		defer withdraw()
		fmt.Fprintf(out.stderr, "kvxbench: published as %s (control %s) in %s\n", disc.name, adv, disc.target)
	}
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(*wait)); err != nil {
		return err
	}
	conn, err := acceptCtx(ctx, ln)
	if err != nil {
		return fmt.Errorf("%w: no kvxbench connect within --wait %v: %v", errPeerUnreachable, *wait, err)
	}
	c := newControl(conn, cfg.ConnectTimeout)
	defer c.Close()
	if _, err := c.exchangeHello(hello{Role: rolePrefill, Layout: cfg.Prefill, TP: 1}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, runBudget(cfg))
	defer cancel()
	return servePrefill(ctx, c, cfg, 0)
}

// acceptCtx accepts one connection, giving up when ctx ends (an interrupt, say) or the
// listener's deadline passes.
func acceptCtx(ctx context.Context, ln net.Listener) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return conn, err
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
	case disc.target != "" && fs.NArg() == 0:
		var err error
		if addr, err = lookupServe(ctx, disc, f.connectTimeout); err != nil {
			return err
		}
	case disc.target != "":
		return usagef("connect: give either --discovery or HOST:PORT, not both")
	case fs.NArg() != 1:
		return usagef("connect needs the address serve printed: kvxbench connect [flags] HOST:PORT (or --discovery URL)")
	default:
		addr = fs.Arg(0)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("connect %q: %v (write HOST:PORT)", addr, err)
	}
	if f.prefillTP != 1 {
		return usagef("--prefill-tp: a two-host run has one prefill rank; heterogeneous TP is measured by run")
	}
	cfg, err := f.resolve(envTLS)
	if err != nil {
		return err
	}
	perftest, err := baselineBinary(fs, f.out.baseline, out)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, runBudget(cfg))
	defer cancel()
	c, err := dialControl(addr, cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	defer func() {
		_ = c.send(message{Bye: true})
		c.Close()
	}()
	if _, err := c.exchangeHello(hello{Role: roleDecode, Layout: cfg.Decode, TP: 1}); err != nil {
		return err
	}
	// The baseline's server runs on the serve host, started over the control connection.
	pr := &printer{w: out.stdout, json: f.out.json}
	if err := driveDecode(ctx, cfg, f.out, perftest, host, []*control{c}, out, pr.add); err != nil {
		return err
	}
	return pr.finish(f.out.plot)
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
	base, err := f.resolve(envTLS)
	if err != nil {
		return err
	}
	runs, err := sweepRuns(base, bts, bs)
	if err != nil {
		return err
	}
	perftest, err := baselineBinary(fs, f.out.baseline, out)
	if err != nil {
		return err
	}
	pr := &printer{w: out.stdout, json: f.out.json}
	for _, cfg := range runs {
		tpb := cfg.Dims.TokensPerBlock
		add := func(r Result) error {
			r.Op = fmt.Sprintf("sweep tpb=%d", tpb)
			r.Name = fmt.Sprintf("sweep %s tpb=%d blocks=%d c=%d", cfg.ShapeName, tpb, r.Tokens/tpb, r.Concurrency)
			return pr.add(r)
		}
		if err := sweepOne(ctx, cfg, f.out, perftest, out, add); err != nil {
			return fmt.Errorf("block size %d tokens: %w", tpb, err)
		}
	}
	return pr.finish(f.out.plot)
}

// sweepOne runs one block size of a sweep; tests replace it with an in-process run.
var sweepOne = runLoopback

// sweepRuns makes one run configuration per block size, with one prompt per batch size.
func sweepRuns(base runConfig, blockTokens, batches []int) ([]runConfig, error) {
	var runs []runConfig
	for _, bt := range blockTokens {
		s := shape{name: base.ShapeName, dims: base.Dims, order: base.Order}
		s.dims.TokensPerBlock = int64(bt)
		cfg := base
		cfg.Dims = s.dims
		cfg.Prompts = nil
		for _, b := range batches {
			cfg.Prompts = append(cfg.Prompts, int64(b)*int64(bt))
		}
		var err error
		cfg.Prefill, cfg.Decode, err = sizePools(s, cfg.Prompts, cfg.Concurrency, cfg.PrefillTP, cfg.MemCap, 0)
		if err != nil {
			return nil, fmt.Errorf("block size %d tokens: %w", bt, err)
		}
		runs = append(runs, cfg)
	}
	return runs, nil
}
