// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// Command enginepeer is the other process in the transfer tests and benchmarks that run two
// engines over UCX: a transfer.Engine over a ucx.Transport in its own process, started by a test
// (internal/peerproc.BuildEnginePeer), never by people. It lives under transfer/ because it
// imports transfer; native/internal/ucxpeer, the peer of native's own tests, stays below it.
//
// Protocol, one line at a time: enginepeer prints "ADDR <hex>" (its worker address); the test
// writes "PEER <hex>" (the test's); enginepeer prints "FILLED" once its pool is filled and in
// place, then moves request -id (and -repeat - 1 more, one after another) with that peer: -mode
// engine-send sends it, -mode engine-recv receives it and checks every byte when -check. -total
// is the request's block count (EngineDims), -chunk the staging slot size. It prints "GOT
// <bytes>" as the transfer moves (when -report > 0), "PATH <path>" (with -device) and "DONE
// <state> <OK|BAD|error>" at the end of each request (then "QUIESCED ..." with -quiesce-bound),
// "ERR <reason>" and exits 1 on any failure, and exits 0 once its standard input closes. On
// SIGTERM it leaves as a serving process in a rolling restart does: Drain for -drain, Close
// (which says goodbye to the test's engine), print "LEFT" and exit 0. Every wait is bounded by
// -timeout.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/internal/peerproc/uffd"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

type options struct {
	requestID          uint64
	repeat             int
	drain              time.Duration
	disableRMA         bool
	mode, tls, netDevs string
	total, chunk       int64
	report             int
	seed               uint64
	check              bool
	direct             bool
	caller             bool
	uffdTail           bool
	device             bool
	rmaWhereEmulated   bool
	disablePull        bool
	disableDirect      bool
	disableInPlace     bool
	directChunk        int64
	freeze             bool
	serve              bool
	quarantine         time.Duration
	quiesceBound       time.Duration
	timeout, keepalive time.Duration
}

// defaultOptions are the flags' defaults.
func defaultOptions() options {
	return options{mode: "engine-recv", tls: "posix,cma,self", total: 16, chunk: 4 << 20, report: 1, seed: 1, check: true,
		timeout: 60 * time.Second, keepalive: 200 * time.Millisecond, requestID: 1, repeat: 1, drain: 10 * time.Millisecond}
}

// bindFlags binds fs's flags to o, each defaulting to o's value: a RUN line of -serve parses
// onto a copy of the process's own options.
func bindFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.mode, "mode", o.mode, "engine-send or engine-recv")
	fs.StringVar(&o.tls, "tls", o.tls, "UCX_TLS")
	fs.StringVar(&o.netDevs, "net-devices", o.netDevs, "UCX_NET_DEVICES (tcp: lo)")
	fs.Int64Var(&o.total, "total", o.total, "blocks of the request")
	fs.Int64Var(&o.chunk, "chunk", o.chunk, "bytes per staging slot")
	fs.IntVar(&o.report, "report", o.report, "print GOT as the bytes moved change (0: never)")
	fs.Uint64Var(&o.seed, "seed", o.seed, "test pattern seed")
	fs.BoolVar(&o.check, "check", o.check, "a receiver verifies the test pattern")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on the whole run")
	fs.DurationVar(&o.keepalive, "keepalive", o.keepalive, "UCX keepalive interval")
	fs.Uint64Var(&o.requestID, "id", o.requestID, "request id")
	fs.BoolVar(&o.direct, "direct", o.direct, "the KV pool is mapped by the transport (AllocatePool), so the one-copy path may run")
	fs.BoolVar(&o.caller, "caller", o.caller, "the KV pool is mapped by this process (mmap) and registered with the transport (RegisterHost), as a serving process's own KV cache")
	fs.BoolVar(&o.uffdTail, "uffd-tail", o.uffdTail, "with -caller: the pool's second half is backed by a userfaultfd nobody serves, so a peer's process_vm_readv of it blocks until this process exits")
	fs.BoolVar(&o.device, "device", o.device, "the KV pool is in cudaMalloc memory of GPU 0 registered with the transport (RegisterDevice), moved by gets GPU to GPU (needs a CUDA-enabled UCX)")
	fs.BoolVar(&o.rmaWhereEmulated, "rma-where-emulated", o.rmaWhereEmulated, "a receiver keeps the RMA mode where UCX emulates gets (TCP), as the tests of that mode want")
	fs.IntVar(&o.repeat, "repeat", o.repeat, "requests id, id+1, ... moved one after another")
	fs.BoolVar(&o.disableRMA, "disable-rma", o.disableRMA, "the direct path sends IOV messages instead of RMA gets (transfer.Config.Tuning.DisableRMA)")
	fs.DurationVar(&o.drain, "drain", o.drain, "on SIGTERM, how long to Drain before Close")
	fs.BoolVar(&o.disablePull, "disable-pull", o.disablePull, "Config.Tuning.DisablePull: a sender declines the pull wire")
	fs.BoolVar(&o.disableDirect, "disable-direct", o.disableDirect, "Config.Tuning.DisableDirect: a receiver takes the staging path")
	fs.BoolVar(&o.disableInPlace, "disable-in-place", o.disableInPlace, "Config.Tuning.DisableInPlaceReads: a receiver reads a mapped pool or slot with gets, not in place")
	fs.Int64Var(&o.directChunk, "direct-chunk", o.directChunk, "Config.Tuning.DirectChunkBytes: the most bytes one direct message or get carries (0: the default)")
	fs.BoolVar(&o.freeze, "freeze", o.freeze, "a receiver stops its own process (SIGSTOP) once its request has moved bytes and before it is done, "+
		"printing \"FREEZE stopped\" first (or \"FREEZE missed\" when the request ended first): the frozen peer of the health tests, caught mid-transfer")
	fs.DurationVar(&o.quarantine, "quarantine", o.quarantine, "Config.Tuning.QuarantineTimeout (0: the default)")
	fs.DurationVar(&o.quiesceBound, "quiesce-bound", o.quiesceBound, "after each DONE, wait this long for the handle to quiesce and print "+
		"\"QUIESCED <true|false> <poisoned slots> <blocks poisoned>\" (0: no such line)")
}

func main() {
	o := defaultOptions()
	bindFlags(flag.CommandLine, &o)
	flag.BoolVar(&o.serve, "serve", false, "print \"READY\", then run one engine per \"RUN <flags>\" line on stdin (the flags above, "+
		"over this command line's), each printing ADDR, taking PEER, moving its requests and closing, then \"CLOSED\"; exit 0 when stdin closes")
	flag.Parse()
	stdin := bufio.NewScanner(os.Stdin)
	stdin.Buffer(make([]byte, 1<<16), 1<<20)
	if err := serve(o, stdin); err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
}

// serve is one engine's run, or with -serve one per RUN line.
func serve(o options, stdin *bufio.Scanner) error {
	if !o.serve {
		return runEngine(o, stdin)
	}
	fmt.Println("READY")
	for stdin.Scan() {
		args, ok := strings.CutPrefix(stdin.Text(), "RUN")
		if !ok {
			return fmt.Errorf("want RUN <flags>, got %q", stdin.Text())
		}
		ro := o
		fs := flag.NewFlagSet("RUN", flag.ContinueOnError)
		bindFlags(fs, &ro)
		if err := fs.Parse(strings.Fields(args)); err != nil {
			return err
		}
		if err := runEngine(ro, stdin); err != nil {
			return err
		}
		fmt.Println("CLOSED")
	}
	return nil
}

// EngineDims is the model the engine modes move: 32 layers, 8 KV heads of 128 BF16, 16-token
// blocks (Llama-3-8B), in a block-major pool of -blocks blocks. The tests use the same.
func EngineDims(blocks int64) layout.Dims {
	return layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: blocks}
}

// EnginePool returns the pool a side starts with: the sender's filled from seed, the
// receiver's zeroed. The tests rebuild the sender's to check every byte.
func EnginePool(blocks int64, seed uint64, fill bool) ([]byte, *layout.Plan, error) {
	l := layout.Packed(EngineDims(blocks), layout.BlockMajor)
	mem := make([]byte, l.SpanBytes())
	if fill {
		var key [32]byte
		key[0], key[1] = byte(seed), byte(seed>>8)
		_, _ = rand.NewChaCha8(key).Read(mem) // never fails
	}
	ids := make([]int32, blocks)
	for i := range ids {
		ids[i] = int32(i)
	}
	p, err := layout.NewPlan(l, l.All(), ids)
	return mem, p, err
}

// runEngine is -mode engine-send / engine-recv: an Engine over a ucx.Transport moving request
// -id with the peer named on stdin, printing "GOT <bytes>" as it moves and
// "DONE <state> <OK|BAD|error>" at the end.
func runEngine(o options, stdin *bufio.Scanner) error {
	if o.mode != "engine-send" && o.mode != "engine-recv" {
		return fmt.Errorf("-mode %q: want engine-send or engine-recv", o.mode)
	}
	tr, err := ucx.New(ucx.Config{TLS: o.tls, NetDevices: o.netDevs,
		KeepaliveInterval: o.keepalive, StagingBytes: 8 * o.chunk,
		// A sender serves gets over TCP too (as an engine of an earlier build did): the
		// tests' receivers that keep the RMA mode there (-rma-where-emulated on their side)
		// read it; a receiver of this build without ServeEmulatedRMA never asks.
		ServeEmulatedRMA: true})
	if err != nil {
		return err
	}
	eng, err := transfer.New(tr, transfer.Config{
		SlotBytes:       o.chunk,
		MaxConcurrent:   4,
		StagingMemory:   tr.StagingMemory(),
		TransferTimeout: o.timeout,
		QueueTimeout:    o.timeout,
		Tuning: tuning.Config{PipelineDepth: 2, NumSlots: 8, QuarantineTimeout: o.quarantine,
			DisableDirect: o.disableDirect, DisableRMA: o.disableRMA, DisablePull: o.disablePull, DisableInPlaceReads: o.disableInPlace,
			RMAWhereEmulated: o.rmaWhereEmulated, DirectChunkBytes: o.directChunk},
	})
	if err != nil {
		return err
	}
	var unmap []byte // -caller's mapping, unmapped once the engine (and its transport) closed
	defer func() {
		_ = eng.Close()
		if unmap != nil {
			_ = syscall.Munmap(unmap)
		}
	}()
	if !o.serve { // a serving peer's engines come and go; it has no departure of its own
		leaveOnTerm(eng, o.drain)
	}
	fmt.Printf("ADDR %s\n", hex.EncodeToString(tr.WorkerAddress()))
	if !stdin.Scan() {
		return fmt.Errorf("no PEER line on stdin")
	}
	peerHex, ok := strings.CutPrefix(stdin.Text(), "PEER ")
	if !ok {
		return fmt.Errorf("want PEER <hex>, got %q", stdin.Text())
	}
	blocks := o.total
	send := o.mode == "engine-send"
	pool, plan, err := EnginePool(blocks, o.seed, send)
	if err != nil {
		return err
	}
	if o.direct { // the same bytes, in memory UCX mapped: the engine may hand it to UCX in place
		mapped, err := tr.AllocatePool(int64(len(pool)))
		if err != nil {
			return err
		}
		copy(mapped, pool)
		pool = mapped
	}
	if o.caller { // the same bytes, in memory this process mapped and registered with UCX
		mapped, err := syscall.Mmap(-1, 0, len(pool), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return err
		}
		unmap = mapped
		copy(mapped, pool)
		region, err := tr.RegisterHost(mapped)
		if err != nil {
			return err
		}
		pool = region.Pool()
		if o.uffdTail {
			if err := uffd.Block(pool[len(pool)/2/4096*4096:]); err != nil {
				return err
			}
		}
	}
	var dev *deviceKV
	if o.device {
		if dev, err = newDeviceKV(tr, pool); err != nil {
			return err
		}
		defer func() { _ = dev.close() }()
	}
	// FILLED: the pool is filled and in place, so a test may time what follows from here (a
	// 512 MiB fill on a loaded 2-core host takes seconds).
	fmt.Println("FILLED")
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	for k := 0; k < o.repeat; k++ {
		if err := engineRequest(ctx, o, eng, transfer.Peer(peerHex), o.requestID+uint64(k), plan, pool, dev, send); err != nil {
			return err
		}
	}
	for stdin.Scan() { // the engine lives on until stdin closes, or a serving peer's CLOSE
		if o.serve && stdin.Text() == "CLOSE" {
			break
		}
	}
	return nil
}

// engineRequest moves one request and prints its GOT and DONE lines.
func engineRequest(ctx context.Context, o options, eng *transfer.Engine, peer transfer.Peer, id uint64,
	plan *layout.Plan, pool []byte, dev *deviceKV, send bool) error {
	spec := transfer.Spec{ID: transfer.RequestID(id), Peer: peer, Plan: plan, Pool: pool, Timeout: o.timeout}
	if dev != nil {
		spec.Pool, spec.Device = nil, dev.spec()
	}
	var h *transfer.Handle
	var err error
	if send {
		h, err = eng.Send(ctx, spec)
	} else {
		h, err = eng.Receive(ctx, spec)
	}
	if err != nil {
		return err
	}
	if o.freeze && !send {
		if err := freezeMidway(ctx, h); err != nil {
			return err
		}
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last := int64(-1)
	for done := false; !done; {
		select {
		case <-h.Done():
			done = true
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("request %d not done within %v", id, o.timeout)
		}
		if b := h.Status().Bytes; b != last && b > 0 && o.report > 0 {
			fmt.Printf("GOT %d\n", b)
			last = b
		}
	}
	st := h.Status()
	verdict := "OK"
	switch {
	case st.Err != nil:
		verdict = st.Err.Error()
	case !send && o.check:
		want, _, _ := EnginePool(plan.Layout().NumBlocks, o.seed, true)
		got := pool
		if dev != nil {
			if got, err = dev.readBack(len(pool)); err != nil {
				return err
			}
		}
		if string(want) != string(got) {
			verdict = "BAD"
		}
	}
	if dev != nil {
		fmt.Printf("PATH %v\n", h.Path())
	}
	fmt.Printf("DONE %v %s\n", st.State, verdict)
	if o.quiesceBound > 0 {
		quiesced := false
		select {
		case <-h.Quiesced():
			quiesced = true
		case <-time.After(o.quiesceBound):
		}
		fmt.Printf("QUIESCED %v %d %v\n", quiesced, eng.Health().Numbers.PoisonedSlots, h.Status().BlocksPoisoned)
	}
	return nil
}

// freezeMidway is -freeze: it stops this process (SIGSTOP) as soon as h has moved some bytes
// but not all, printing "FREEZE stopped" first, or prints "FREEZE missed" when h ended first.
// A receiver that already has every byte is not stopped: its end may be on the wire (an RMA
// receiver sends Done right after its last get), and a sender completing on it while this
// process is stopped would be told the truth, not held back by the freeze.
// Once continued it prints "THAW <done>": whether h was done at that moment, which says the
// request may have ended in the instant before the stop (a test then cannot tell what the
// freeze held back).
func freezeMidway(ctx context.Context, h *transfer.Handle) error {
	tick := time.NewTicker(20 * time.Microsecond)
	defer tick.Stop()
	for {
		select {
		case <-h.Done():
			fmt.Println("FREEZE missed")
			return nil
		case <-ctx.Done():
			return fmt.Errorf("request %d moved no byte before its bound", h.ID())
		case <-tick.C:
		}
		if st := h.Status(); st.Bytes > 0 && st.Bytes < st.Total {
			break
		}
	}
	fmt.Println("FREEZE stopped")
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		return err
	}
	done := false
	select {
	case <-h.Done():
		done = true
	default:
	}
	fmt.Printf("THAW %v\n", done)
	return nil
}

// leaveOnTerm makes SIGTERM a graceful departure: Drain for drain, Close, "LEFT", exit 0.
func leaveOnTerm(eng *transfer.Engine, drain time.Duration) {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		<-term
		ctx, cancel := context.WithTimeout(context.Background(), drain)
		_ = eng.Drain(ctx)
		cancel()
		if err := eng.Close(); err != nil {
			fmt.Printf("CLOSE %v\n", err)
		}
		fmt.Println("LEFT")
		os.Exit(0)
	}()
}
