// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/internal/hopstamp"
	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
	"github.com/kvxfer/kvxfer/native"
)

// PeerEnv marks a process started as a loopback run's peer. The real binary ignores it; a
// test binary uses it to serve as the peer instead of running the tests, so a run can be
// tested end to end without a build.
const PeerEnv = "KVXBENCH_PEER"

// runBudget bounds a whole run: every scenario for its duration (three times over, for the
// baseline and set-up), plus the peers' start and the pools' first touch.
func runBudget(c RunConfig) time.Duration {
	n := time.Duration(len(c.Prompts) * len(c.Concurrency))
	if c.Latency {
		n += time.Duration(len(latencyScenarios(c.Dims)))
	}
	return n*(3*c.Duration+15*time.Second) + 2*c.ConnectTimeout + time.Minute
}

// Loopback is `kvxbench run`: this process is the decode end; it starts --prefill-tp
// prefill peers by re-executing itself, meets them on a control connection, measures the
// baseline and the transfers, and ends the peers.
func Loopback(ctx context.Context, cfg RunConfig, o Output, perftestBin string, out *Outputs, add func(Result) error) error {
	ctx, cancel := context.WithTimeout(ctx, runBudget(cfg))
	defer cancel()
	var rows *[]hopRow
	if cfg.Hops {
		dir, err := os.MkdirTemp("", "kvxbench-hops-")
		if err != nil {
			return fmt.Errorf("--hops: %w", err)
		}
		defer os.RemoveAll(dir)
		cfg.HopsDir, rows = dir, new([]hopRow)
		hopstamp.Start()
		defer func() { printHops(out.Stderr, cfg, *rows) }() // after the peers exited (below)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("open the control port: %w", err)
	}
	defer ln.Close()

	peers, err := startPeers(ctx, cfg, ln.Addr().String())
	defer peers.stop()
	if err != nil {
		return err
	}
	ctrls, err := acceptPeers(ln.(*net.TCPListener), cfg, peers)
	defer func() {
		for _, c := range ctrls {
			_ = c.send(message{Bye: true})
			c.Close()
		}
	}()
	if err != nil {
		return err
	}
	return driveDecode(ctx, cfg, o, perftestBin, "", ctrls, out, add, rows)
}

// driveDecode makes the decode end's engine, exchanges engine addresses with every prefill
// rank, and measures every scenario with its baseline. remoteHost is the prefill host of a
// two-host run, empty for a loopback run.
//
// hops, where not nil, gets each timed row's request ids (run --hops).
func driveDecode(ctx context.Context, cfg RunConfig, o Output, perftestBin, remoteHost string, ctrls []*control, out *Outputs, add func(Result) error, hops *[]hopRow) error {
	eng, err := newEngineSide(cfg, roleDecode, 0)
	if err != nil {
		for _, c := range ctrls {
			c.sendError(err)
		}
		return err
	}
	defer eng.Close()
	d := &decodeEnd{cfg: cfg, eng: eng, ctrls: ctrls, remoteHost: remoteHost, rng: rand.New(rand.NewPCG(cfg.Seed, 0xdec0de)), hopRows: hops}
	for r, c := range ctrls {
		addr, err := c.exchangeAddr(eng.Address())
		if err != nil {
			return fmt.Errorf("prefill rank %d: %w", r, err)
		}
		peer, err := eng.Connect(ctx, addr)
		if err != nil {
			return fmt.Errorf("connect to prefill rank %d's engine: %w", r, err)
		}
		d.peers = append(d.peers, peer)
	}
	return measureTransfers(ctx, d, o, perftestBin, out, add)
}

// measureTransfers runs every scenario that fits in memory, each beside ucx_perftest at its
// message size, and hands each result to add.
func measureTransfers(ctx context.Context, d *decodeEnd, o Output, perftestBin string, out *Outputs, add func(Result) error) error {
	cfg := d.cfg
	d.direct = true
	for k := range cfg.decodeRanks() {
		pool, direct, err := d.eng.NewPool(cfg.Decode.SpanBytes())
		if err != nil {
			return fmt.Errorf("decode KV pool of rank %d: %w", k, err)
		}
		d.pools, d.direct = append(d.pools, pool), d.direct && direct
	}
	d.pool = d.pools[0]
	var scenarios []scenario
	for _, t := range cfg.Prompts {
		for _, c := range cfg.Concurrency {
			scenarios = append(scenarios, scenario{tokens: t, concurrency: c})
		}
	}
	if cfg.Latency {
		scenarios = append(scenarios, latencyScenarios(cfg.Decode.Dims())...)
	}
	fit := scenarios[:0]
	for _, s := range scenarios {
		if need := blocksFor(Shape{Dims: cfg.Decode.Dims()}, s.tokens) * int64(s.concurrency); need > cfg.Decode.NumBlocks {
			fmt.Fprintf(out.Stderr, "kvxbench: note: skipped %s: it needs %s of decode pool, over --max-memory\n",
				s.name(cfg), humanBytes(need*cfg.Decode.BlockBytes()))
			continue
		}
		fit = append(fit, s)
	}
	scenarios = fit
	bar := newProgress(out.Stderr, len(scenarios), 2*cfg.Duration)
	defer bar.done()
	baselines := map[int64]float64{}
	runPerftest := perftest.Run
	if d.remoteHost != "" {
		runPerftest = func(ctx context.Context, pc perftest.Config) (perftest.Result, error) {
			return runRemotePerftest(ctx, d.ctrls[0], d.remoteHost, pc)
		}
	}
	limits := newRunLimits(runPerftest, latencyPerftest(cfg, perftestBin),
		int64(float64(cfg.Duration.Seconds())*4e9), native.Settings())
	for _, s := range scenarios {
		bar.step(s.name(cfg))
		res, err := d.measure(ctx, s, o, bar)
		if err != nil {
			return err
		}
		if perftestBin != "" && s.latency {
			if err := limits.set(ctx, &res, res.Bytes/int64(len(d.ctrls)*cfg.decodeRanks()), cfg.TLS); err != nil { // one Send's bytes
				return err
			}
		} else if perftestBin != "" {
			g, ok := baselines[res.MessageBytes]
			if !ok {
				iters, warmup := perftest.Iters(res.MessageBytes, int64(float64(cfg.Duration.Seconds())*4e9))
				pc := perftest.Config{Binary: perftestBin, Test: "tag_bw", Size: res.MessageBytes,
					TLS: cfg.TLS, Iters: iters, Warmup: warmup, Timeout: cfg.Duration*10 + 30*time.Second,
					MemType: perftestMemType(cfg)}
				var base perftest.Result
				if d.remoteHost != "" {
					base, err = runRemotePerftest(ctx, d.ctrls[0], d.remoteHost, pc)
				} else {
					base, err = perftest.Run(ctx, pc)
				}
				if err != nil {
					return fmt.Errorf("baseline: %w", err)
				}
				g = base.GBps
				baselines[res.MessageBytes] = g
			}
			res.setBaseline(perftestName(cfg.TLS), res.MessageBytes, g)
		}
		if cfg.GPU != nil {
			res.Env = runEnv(time.Now())
			res.Env.GPU = cfg.GPU
		}
		if err := add(res); err != nil {
			return err
		}
	}
	return nil
}

// runRemotePerftest measures the baseline between this host and the prefill host of a
// two-host run: the prefill end starts the server, this end runs the client against it.
func runRemotePerftest(ctx context.Context, c *control, host string, pc perftest.Config) (perftest.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, pc.Timeout)
	defer cancel()
	if err := c.send(message{PerftestServe: &perftestMsg{Test: pc.Test, Size: pc.Size, TLS: pc.TLS,
		Iters: pc.Iters, Warmup: pc.Warmup, Timeout: pc.Timeout, ErrorHandling: pc.ErrorHandling, Env: pc.Env}}); err != nil {
		return perftest.Result{}, err
	}
	m, err := c.recvMessage(0)
	if err != nil {
		return perftest.Result{}, err
	}
	if m.PerftestPort <= 0 {
		return perftest.Result{}, fmt.Errorf("%w: prefill host answered a perftest request without a port", errPeerNotKvxbench)
	}
	return perftest.RunClient(ctx, pc, host, m.PerftestPort)
}

// perftestName names the baseline in the table: the test and the transports it ran over.
func perftestName(tls string) string {
	if tls == "" {
		tls = "default"
	}
	return "perftest " + tls
}

// peerProcs are run's prefill processes.
type peerProcs struct {
	children []*proc.Child
	output   []*proc.Tail // the end of each one's stdout and stderr
	exited   chan int     // rank of a peer that exited
}

// startPeers re-executes this binary once per prefill rank as the hidden peer subcommand. Each
// peer runs in its own process group, killed by stop, so none outlives the run.
func startPeers(ctx context.Context, cfg RunConfig, controlAddr string) (*peerProcs, error) {
	p := &peerProcs{exited: make(chan int, cfg.PrefillTP)}
	exe, err := os.Executable()
	if err != nil {
		return p, fmt.Errorf("find this binary to start the peer: %w", err)
	}
	conf, err := cfg.encode()
	if err != nil {
		return p, fmt.Errorf("encode the peer's configuration: %w", err)
	}
	for rank := 0; rank < cfg.PrefillTP; rank++ {
		cmd := exec.Command(exe, "peer", "--control", controlAddr, "--rank", strconv.Itoa(rank),
			"--timeout", runBudget(cfg).String(), "--config", conf)
		cmd.Env = append(os.Environ(), PeerEnv+"=1")
		if cfg.TLS != "" {
			cmd.Env = append(cmd.Env, "UCX_TLS="+cfg.TLS)
		}
		output := proc.NewTail(proc.TailBytes)
		child, err := proc.Start(ctx, cmd, proc.Options{Group: true, Stdout: output, Stderr: output})
		if err != nil {
			return p, fmt.Errorf("start prefill peer %d: %w", rank, err)
		}
		p.children, p.output = append(p.children, child), append(p.output, output)
		go func() {
			<-child.Exited()
			p.exited <- rank
		}()
	}
	return p, nil
}

// stop gives each peer a moment to exit after its bye, then kills its process group, and
// reaps it (both bounded).
func (p *peerProcs) stop() {
	for _, c := range p.children {
		_ = c.Stop(2*time.Second, peerReapBound)
	}
}

// peerReapBound is how long a killed peer may take to be reaped.
const peerReapBound = 10 * time.Second

// acceptPeers waits, within the connect timeout, for every prefill peer to connect and
// exchanges hellos. A peer that dies first is reported with the last lines it printed.
func acceptPeers(ln *net.TCPListener, cfg RunConfig, peers *peerProcs) ([]*control, error) {
	deadline := time.Now().Add(cfg.ConnectTimeout)
	// Peers connect in any order; ctrls is indexed by rank, since rank r fills its own slice
	// of the decode pool's heads.
	ctrls := make([]*control, cfg.PrefillTP)
	var all []*control // every accepted connection, to close on failure
	for len(all) < cfg.PrefillTP {
		if err := ln.SetDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
			return all, err
		}
		conn, err := ln.Accept()
		if err == nil {
			c := newControl(conn, cfg.ConnectTimeout)
			all = append(all, c)
			theirs, err := c.exchangeHello(hello{Role: roleDecode, Layout: cfg.Decode, TP: cfg.decodeRanks(), KeyID: cfg.keyID()})
			if err != nil {
				return all, fmt.Errorf("prefill peer: %w", err)
			}
			if theirs.Rank < 0 || theirs.Rank >= cfg.PrefillTP || ctrls[theirs.Rank] != nil {
				return all, fmt.Errorf("%w: a second or unknown prefill rank %d", errPeerIncompatible, theirs.Rank)
			}
			ctrls[theirs.Rank] = c
			continue
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return all, fmt.Errorf("accept a peer: %w", err)
		}
		select {
		case rank := <-peers.exited:
			return all, fmt.Errorf("%w: prefill peer %d exited before connecting: %s", errPeerUnreachable, rank, proc.LastLines(peers.output[rank].String(), 3))
		default:
		}
		if time.Now().After(deadline) {
			return all, fmt.Errorf("%w: %d of %d prefill peers connected within --connect-timeout %v", errPeerUnreachable, len(all), cfg.PrefillTP, cfg.ConnectTimeout)
		}
	}
	return ctrls, nil
}

// PeerArgs are the arguments of kvxbench's hidden peer subcommand, as startPeers writes them:
// a prefill end that connects back to the run that started it.
type PeerArgs struct {
	Control string        // the parent's control address
	Rank    int           // this prefill rank
	Config  string        // the run's RunConfig, as JSON
	Timeout time.Duration // the most this peer lives
}

// Register defines the peer's flags on fs, the names startPeers passes.
func (a *PeerArgs) Register(fs *flag.FlagSet) {
	fs.StringVar(&a.Control, "control", "", "the parent's control address")
	fs.IntVar(&a.Rank, "rank", 0, "this prefill rank")
	fs.StringVar(&a.Config, "config", "", "the run's configuration, as JSON")
	fs.DurationVar(&a.Timeout, "timeout", 10*time.Minute, "the most this peer lives")
}

// Peer is the second process of a loopback run: a prefill end that connects back to its
// parent, says hello as its rank, and serves until the parent says bye.
func Peer(ctx context.Context, a PeerArgs) error {
	if a.Control == "" || a.Config == "" {
		return Usagef("peer is started by `kvxbench run`; it needs --control and --config")
	}
	if a.Timeout <= 0 {
		return Usagef("--timeout = %v: must be positive", a.Timeout)
	}
	cfg, err := decodeRunConfig(a.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.Timeout)
	defer cancel()
	c, err := dialControl(a.Control, cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.exchangeHello(hello{Role: rolePrefill, Layout: cfg.Prefill, Rank: a.Rank, TP: cfg.PrefillTP, KeyID: cfg.keyID()}); err != nil {
		return err
	}
	return servePrefill(ctx, c, cfg, a.Rank)
}

// servePrefill is the prefill end after the hello, shared by peer and serve: it makes its
// engine, exchanges engine addresses, and answers the decode end until bye.
func servePrefill(ctx context.Context, c *control, cfg RunConfig, rank int) error {
	if cfg.HopsDir != "" {
		hopstamp.Start()
		defer func() { _ = writeHops(cfg.HopsDir, rank) }() // the decode end reads it once this process exited
	}
	eng, err := newEngineSide(cfg, rolePrefill, rank)
	if err != nil {
		c.sendError(err)
		return err
	}
	defer eng.Close()
	addr, err := c.exchangeAddr(eng.Address())
	if err != nil {
		return err
	}
	peer, err := eng.Connect(ctx, addr)
	if err != nil {
		return fmt.Errorf("connect to the decode engine: %w", err)
	}
	p, err := newPrefillEnd(cfg, rank, eng, peer)
	if err != nil {
		c.sendError(err)
		return err
	}
	return p.serve(ctx, c)
}
