// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// Command ucxpeer is the other process in kvxfer's two-process UCX tests and benchmarks. It is
// started by a test, never by people.
//
// Protocol, one line at a time: ucxpeer prints "ADDR <hex>" (its worker address); the test
// writes "PEER <hex>" (the test's); then ucxpeer moves -total bytes in -chunk messages with at
// most -window in flight, tag TagBase|i for chunk i:
//
//	-mode sink    receive them (into one region when -check, else a ring of -window slots),
//	              verify the test pattern when -check, send the test an ack ("OK" or "BAD
//	              ...") with tag AckTag, print "DONE <ack>";
//	-mode source  send them (pattern-filled when -check), then wait for the test's ack and
//	              print "DONE <ack>".
//
// It uses package native only: the engine's own two-process peer is transfer/internal/enginepeer.
//
// It prints "GOT <i>" as chunks complete (every -report chunks), "ERR <reason>" and exits 1 on
// any failure, and exits 0 after DONE once its standard input closes. Every wait is bounded by
// -timeout.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/native"
)

// Tags of the test protocol (mirrored in the tests that drive ucxpeer).
const (
	TagBase = uint64(0x4b58) << 48
	AckTag  = TagBase | 0xffffffff
)

type options struct {
	mode, tls, netDevices string
	total, chunk          int64
	window, report        int
	seed                  uint64
	check                 bool
	timeout, keepalive    time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "sink", "sink or source")
	flag.StringVar(&o.tls, "tls", "posix,cma,self", "UCX_TLS")
	flag.StringVar(&o.netDevices, "net-devices", "", "UCX_NET_DEVICES (tcp: lo)")
	flag.Int64Var(&o.total, "total", 64<<20, "bytes to move")
	flag.Int64Var(&o.chunk, "chunk", 4<<20, "bytes per message")
	flag.IntVar(&o.window, "window", 8, "messages in flight")
	flag.IntVar(&o.report, "report", 1, "print GOT every this many chunks")
	flag.Uint64Var(&o.seed, "seed", 1, "test pattern seed")
	flag.BoolVar(&o.check, "check", true, "fill and verify the test pattern")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "bound on the whole run")
	flag.DurationVar(&o.keepalive, "keepalive", 200*time.Millisecond, "UCX keepalive interval")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.chunk <= 0 || o.total <= 0 || o.total%o.chunk != 0 || o.window <= 0 || o.report <= 0 {
		return fmt.Errorf("-total must be a positive multiple of -chunk, -window and -report positive")
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	uc, err := native.NewContext(native.ContextConfig{TLS: o.tls, NetDevices: o.netDevices, KeepaliveInterval: o.keepalive})
	if err != nil {
		return err
	}
	w, err := uc.NewWorker(native.WorkerConfig{})
	if err != nil {
		return err
	}
	fmt.Printf("ADDR %s\n", hex.EncodeToString(w.Address()))

	stdin := bufio.NewScanner(os.Stdin)
	stdin.Buffer(make([]byte, 1<<16), 1<<20)
	if !stdin.Scan() {
		return fmt.Errorf("no PEER line on stdin")
	}
	peerHex, ok := strings.CutPrefix(stdin.Text(), "PEER ")
	if !ok {
		return fmt.Errorf("want PEER <hex>, got %q", stdin.Text())
	}
	peerAddr, err := hex.DecodeString(peerHex)
	if err != nil {
		return err
	}
	ep, err := w.Connect(ctx, peerAddr)
	if err != nil {
		return err
	}
	regionSize := o.chunk * int64(o.window)
	if o.check {
		regionSize = o.total
	}
	mem, err := uc.Allocate(regionSize)
	if err != nil {
		return err
	}
	// Touch every page now: a page fault inside the transfer would be measured as transport
	// time. A source writes the pattern it sends; a sink writes a different one, so a chunk
	// that never arrived cannot pass the check.
	fillSeed := o.seed
	if o.mode == "sink" {
		fillSeed = ^o.seed
	}
	if err := mem.FillPattern(0, regionSize, 0, fillSeed); err != nil {
		return err
	}
	var ack string
	switch o.mode {
	case "sink":
		ack, err = sink(ctx, o, w, ep, mem)
	case "source":
		ack, err = source(ctx, o, w, ep, mem)
	default:
		err = fmt.Errorf("unknown -mode %q", o.mode)
	}
	if err != nil {
		return err
	}
	fmt.Printf("DONE %s\n", ack)
	// Stay until the test closes stdin, so the test decides when the endpoint goes away.
	for stdin.Scan() {
	}
	_ = ep.Close(ctx)
	_ = w.Close()
	_ = mem.Close()
	return uc.Close()
}

// slot is where chunk i lives in the region.
func slot(o options, i int64) int64 {
	if o.check {
		return i * o.chunk
	}
	return (i % int64(o.window)) * o.chunk
}

// pump keeps at most window operations from post in flight over n chunks, reporting progress.
func pump(ctx context.Context, o options, post func(i int64) *native.Request) error {
	n := o.total / o.chunk
	inflight := make([]*native.Request, 0, o.window)
	next := int64(0)
	for done := int64(0); done < n; done++ {
		for next < n && len(inflight) < o.window {
			inflight = append(inflight, post(next))
			next++
		}
		if err := inflight[0].Wait(ctx); err != nil {
			return fmt.Errorf("chunk %d: %w", done, err)
		}
		inflight = inflight[1:]
		if done%int64(o.report) == 0 {
			fmt.Printf("GOT %d\n", done)
		}
	}
	return nil
}

func sink(ctx context.Context, o options, w *native.Worker, ep *native.Endpoint, mem *native.Memory) (string, error) {
	err := pump(ctx, o, func(i int64) *native.Request {
		return ep.TagRecv(mem, slot(o, i), o.chunk, TagBase|uint64(i), ^uint64(0))
	})
	if err != nil {
		return "", err
	}
	ack := "OK"
	if o.check {
		bad, err := mem.CheckPattern(0, o.total, 0, o.seed)
		if err != nil {
			return "", err
		}
		if bad >= 0 {
			ack = fmt.Sprintf("BAD byte %d", bad)
		}
	}
	if err := ep.TagSendBytes([]byte(ack), AckTag).Wait(ctx); err != nil {
		return "", fmt.Errorf("ack: %w", err)
	}
	return ack, nil
}

func source(ctx context.Context, o options, w *native.Worker, ep *native.Endpoint, mem *native.Memory) (string, error) {
	ackReq := w.TagRecvBytes(ep, 256, AckTag, ^uint64(0))
	err := pump(ctx, o, func(i int64) *native.Request {
		return ep.TagSend(mem, slot(o, i), o.chunk, TagBase|uint64(i))
	})
	if err != nil {
		return "", err
	}
	if err := ackReq.Wait(ctx); err != nil {
		return "", fmt.Errorf("ack: %w", err)
	}
	return string(ackReq.Data()), nil
}
