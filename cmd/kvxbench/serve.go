// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"time"
)

// cmdServe is the prefill end of a two-host run: it opens the control port, prints its
// address, waits (bounded by --wait) for one connect, and answers it.
func cmdServe(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	fs := newFlagSet("serve", "serve [--listen HOST:PORT] [flags]", out)
	f.register(fs, 2*time.Second)
	listen := fs.String("listen", ":0", "control address to listen on; port 0 picks a free one")
	wait := fs.Duration("wait", 10*time.Minute, "how long to wait for kvxbench connect")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("serve takes no arguments, got %q", fs.Args())
	}
	if *wait <= 0 {
		return usagef("--wait = %v: must be positive", *wait)
	}
	cfg, err := f.resolve(envTLS)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", *listen, err)
	}
	defer ln.Close()
	fmt.Fprintf(out.stderr, "kvxbench: serving on %s; on the decode host run: kvxbench connect HOST:%d (with the same layout flags)\n",
		ln.Addr(), ln.Addr().(*net.TCPAddr).Port)
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
	fs := newFlagSet("connect", "connect [flags] HOST:PORT", out)
	f.register(fs, 2*time.Second)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("connect needs the address serve printed: kvxbench connect [flags] HOST:PORT")
	}
	addr := fs.Arg(0)
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("connect %q: %v (write HOST:PORT)", addr, err)
	}
	cfg, err := f.resolve(envTLS)
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
	// The ucx_perftest baseline between two hosts needs its server started on the serve
	// host, which the control protocol does not do yet: connect runs without it.
	return driveDecode(ctx, cfg, f.out, "", []*control{c}, out)
}

// cmdSweep measures transfers over block size by batch size, like nixlbench, for tuning.
func cmdSweep(ctx context.Context, args []string, out *outputs) error {
	var f transferFlags
	fs := newFlagSet("sweep", "sweep [flags]", out)
	f.register(fs, time.Second)
	blockSizes := fs.String("tokens-per-block-list", "16,32,64,128", "block sizes in tokens to sweep, comma-separated")
	batches := fs.String("batch", "1,4,16,64", "blocks per request to sweep, comma-separated")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("sweep takes no arguments, got %q", fs.Args())
	}
	if _, err := parseInts("tokens-per-block-list", *blockSizes); err != nil {
		return err
	}
	if _, err := parseInts("batch", *batches); err != nil {
		return err
	}
	if _, err := f.resolve(envTLS); err != nil {
		return err
	}
	return errEngineMissing
}
