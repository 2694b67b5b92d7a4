// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/kvxfer/kvxfer/transfer/observe"
)

// ServeOptions are serve's own settings beside the run's.
type ServeOptions struct {
	// Listen is the control address to listen on (port 0 picks a free one).
	Listen string
	// Wait bounds the wait for a connect.
	Wait time.Duration
	// Discovery, when its Target is set, is where the control address is published, under
	// Discovery.Name.
	Discovery Discovery
	// Advertise is the control address published (default: the one listened on).
	Advertise string
}

// Serve is the prefill end of a two-host run: it opens the control port, prints its
// address, waits (bounded by o.Wait) for one Connect, and answers it.
func Serve(ctx context.Context, cfg RunConfig, o ServeOptions, out *Outputs) error {
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
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.Listen, err)
	}
	defer ln.Close()
	fmt.Fprintf(out.Stderr, "kvxbench: serving on %s; on the decode host run: kvxbench connect HOST:%d (with the same layout flags)\n",
		ln.Addr(), ln.Addr().(*net.TCPAddr).Port)
	if disc := o.Discovery; disc.Target != "" {
		adv := o.Advertise
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
		fmt.Fprintf(out.Stderr, "kvxbench: published as %s (control %s) in %s\n", disc.Name, adv, disc.Target)
	}
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(o.Wait)); err != nil {
		return err
	}
	conn, err := acceptCtx(ctx, ln)
	if err != nil {
		return fmt.Errorf("%w: no kvxbench connect within --wait %v: %v", errPeerUnreachable, o.Wait, err)
	}
	c := newControl(conn, cfg.ConnectTimeout)
	defer c.Close()
	if _, err := c.exchangeHello(hello{Role: rolePrefill, Layout: cfg.Prefill, TP: 1, KeyID: cfg.keyID()}); err != nil {
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

// Connect is the decode end of a two-host run: it connects to Serve's control address addr,
// checks the two layouts agree, and measures every scenario, the baseline's server running
// on the serve host.
func Connect(ctx context.Context, cfg RunConfig, addr, perftestBin string, o Output, out *Outputs) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return Usagef("connect %q: %v (write HOST:PORT)", addr, err)
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
	if _, err := c.exchangeHello(hello{Role: roleDecode, Layout: cfg.Decode, TP: 1, KeyID: cfg.keyID()}); err != nil {
		return err
	}
	// The baseline's server runs on the serve host, started over the control connection.
	pr := NewPrinter(out.Stdout, o.JSON)
	if err := driveDecode(ctx, cfg, o, perftestBin, host, []*control{c}, out, pr.Add, nil); err != nil {
		return err
	}
	return pr.Finish(o.Plot)
}

// Sweep measures transfers over block size by batch size, like nixlbench, for tuning: one
// loopback run per configuration of SweepRuns, each request batch blocks long.
func Sweep(ctx context.Context, runs []RunConfig, o Output, perftestBin string, out *Outputs) error {
	pr := NewPrinter(out.Stdout, o.JSON)
	for _, cfg := range runs {
		tpb := cfg.Dims.TokensPerBlock
		add := func(r Result) error {
			r.Op = fmt.Sprintf("sweep tpb=%d", tpb)
			r.Name = fmt.Sprintf("sweep %s tpb=%d blocks=%d c=%d", cfg.ShapeName, tpb, r.Tokens/tpb, r.Concurrency)
			return pr.Add(r)
		}
		if err := sweepOne(ctx, cfg, o, perftestBin, out, add); err != nil {
			return fmt.Errorf("block size %d tokens: %w", tpb, err)
		}
	}
	return pr.Finish(o.Plot)
}

// sweepOne runs one block size of a sweep; tests replace it with an in-process run.
var sweepOne = Loopback

// SweepRuns makes one run configuration per block size, with one prompt per batch size.
func SweepRuns(base RunConfig, blockTokens, batches []int) ([]RunConfig, error) {
	var runs []RunConfig
	for _, bt := range blockTokens {
		s := Shape{Name: base.ShapeName, Dims: base.Dims, Order: base.Order}
		s.Dims.TokensPerBlock = int64(bt)
		cfg := base
		cfg.Dims = s.Dims
		cfg.Prompts = nil
		cfg.Latency = false // a sweep's rows are its block sizes by batches
		for _, b := range batches {
			cfg.Prompts = append(cfg.Prompts, int64(b)*int64(bt))
		}
		var err error
		cfg.Prefill, cfg.Decode, err = SizePools(s, cfg.Prompts, cfg.Concurrency, cfg.PrefillTP, 1, cfg.MemCap, 0, false)
		if err != nil {
			return nil, fmt.Errorf("block size %d tokens: %w", bt, err)
		}
		runs = append(runs, cfg)
	}
	return runs, nil
}
