// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// fakeNet is an in-process stand-in for the engine and its transport: a Send and the
// matching Receive sub (same id, same pair of ends), in either order, are copied chunk by
// chunk through a staging buffer with the two ends' movers, as the engine's staging mode
// does. It lets the driver's rounds, checks and timing be tested without UCX.
type fakeNet struct {
	mu      sync.Mutex
	slot    int64
	sends   map[fakeKey]*fakeOp
	recvs   map[fakeKey]*fakeOp
	corrupt func(id uint64, buf []byte) // if set, may damage a chunk on the wire
	drop    bool                        // if set, receives complete without writing
	wg      sync.WaitGroup
}

type fakeKey struct {
	id       uint64
	from, to peerRef
}

type fakeOp struct {
	plan *layout.Plan
	m    mover
	h    *fakeHandle
}

type fakeHandle struct {
	mu      sync.Mutex
	pending int
	err     error
	done    chan struct{}
}

func newFakeHandle(n int) *fakeHandle { return &fakeHandle{pending: n, done: make(chan struct{})} }

func (h *fakeHandle) finish(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil && h.err == nil {
		h.err = err
	}
	h.pending--
	if h.pending == 0 {
		close(h.done)
	}
}

func (h *fakeHandle) Done() <-chan struct{}     { return h.done }
func (h *fakeHandle) Quiesced() <-chan struct{} { return h.done }
func (h *fakeHandle) Release()                  {}
func (h *fakeHandle) Path() string              { return "" }
func (h *fakeHandle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

type fakeEnd struct {
	net  *fakeNet
	name peerRef
}

func (e *fakeEnd) NewPool(n int64) ([]byte, bool, error) { return make([]byte, n), false, nil }

func (n *fakeNet) end(name string) *fakeEnd { return &fakeEnd{net: n, name: peerRef(name)} }

func (e *fakeEnd) Address() []byte { return []byte(e.name) }
func (e *fakeEnd) Connect(_ context.Context, addr []byte) (peerRef, error) {
	return peerRef(addr), nil
}
func (e *fakeEnd) Close() error { return nil }

func (e *fakeEnd) Send(_ context.Context, id uint64, secret []byte, to peerRef, p *layout.Plan, m mover) (pendingXfer, error) {
	h := newFakeHandle(1)
	e.net.post(fakeKey{id: id, from: e.name, to: to}, &fakeOp{plan: p, m: m, h: h}, true)
	return h, nil
}

func (e *fakeEnd) Receive(_ context.Context, id uint64, secret []byte, subs []recvSub, m mover) (pendingXfer, error) {
	h := newFakeHandle(len(subs))
	for _, s := range subs {
		e.net.post(fakeKey{id: id, from: s.peer, to: e.name}, &fakeOp{plan: s.plan, m: m, h: h}, false)
	}
	return h, nil
}

func (n *fakeNet) post(k fakeKey, op *fakeOp, send bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	mine, theirs := n.sends, n.recvs
	if !send {
		mine, theirs = n.recvs, n.sends
	}
	other, ok := theirs[k]
	if !ok {
		mine[k] = op
		return
	}
	delete(theirs, k)
	s, r := op, other
	if !send {
		s, r = other, op
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		err := n.copy(k.id, s, r)
		s.h.finish(err)
		r.h.finish(err)
	}()
}

func (n *fakeNet) copy(id uint64, s, r *fakeOp) error {
	if err := layout.Compatible(s.plan, r.plan); err != nil {
		return err
	}
	chunks, err := kvplan.Chunks(s.plan, n.slot)
	if err != nil {
		return err
	}
	buf := make([]byte, n.slot)
	for _, c := range chunks {
		b := buf[:c.Length]
		if err := s.m.Gather(s.plan, c.Offset, b); err != nil {
			return err
		}
		if n.corrupt != nil {
			n.corrupt(id, b)
		}
		if n.drop {
			continue
		}
		if err := r.m.Scatter(r.plan, b, c.Offset); err != nil {
			return err
		}
	}
	return nil
}

// runFake runs the decode driver against tp prefill ends in this process, over real control
// connections and the fake engine, and returns what it printed.
func runFake(t *testing.T, cfg RunConfig, n *fakeNet, o Output) (string, error) {
	t.Helper()
	var stdout bytes.Buffer
	pr := NewPrinter(&stdout, o.JSON)
	err := runFakeWith(t, cfg, n, o, pr.Add)
	if err == nil {
		err = pr.Finish(o.Plot)
	}
	return stdout.String(), err
}

// runFakeWith is runFake handing each result to add.
func runFakeWith(t *testing.T, cfg RunConfig, n *fakeNet, o Output, add func(Result) error) error {
	t.Helper()
	var prefill []engineSide
	for r := range cfg.PrefillTP {
		prefill = append(prefill, n.end(fmt.Sprintf("prefill%d", r)))
	}
	err := runDriver(t, cfg, n.end("decode"), prefill, o, add)
	n.wg.Wait()
	return err
}

// runDriver runs the decode driver against one prefill end per engine, in this process, over
// real control connections, and hands each result to add.
func runDriver(t *testing.T, cfg RunConfig, decodeEng engineSide, prefill []engineSide, o Output, add func(Result) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := &decodeEnd{cfg: cfg, eng: decodeEng, rng: rand.New(rand.NewPCG(1, 2))}
	errs := make(chan error, len(prefill))
	for r, eng := range prefill {
		a, b := tcpPair(t)
		dc, pc := newControl(a, 5*time.Second), newControl(b, 5*time.Second)
		defer dc.Close()
		defer pc.Close()
		d.ctrls = append(d.ctrls, dc)
		d.peers = append(d.peers, peerRef(eng.Address()))
		p, err := newPrefillEnd(cfg, r, eng, peerRef(decodeEng.Address()))
		require.NoError(t, err)
		go func() { errs <- p.serve(ctx, pc) }()
	}
	var stderr bytes.Buffer
	err := measureTransfers(ctx, d, o, "", &Outputs{Stdout: discard{}, Stderr: &stderr}, add)
	for _, c := range d.ctrls {
		if err == nil {
			require.NoError(t, c.send(message{Bye: true}))
		} else {
			c.Close()
		}
	}
	for range prefill {
		select {
		case perr := <-errs:
			if err == nil {
				require.NoError(t, perr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a prefill end did not stop")
		}
	}
	return err
}

// The driver measures every scenario, checks every byte that landed, and prints one result
// per scenario, for same-TP and for two prefill ranks feeding one decode rank.
func TestDriverMeasuresAndVerifiesEveryScenario(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, c := range []struct {
		desc                string
		prefillTP, decodeTP int
		suffix              string
	}{
		{"same TP", 1, 1, ""},
		{"two prefill ranks feed one decode rank", 2, 1, "tp2>1"},
		{"one prefill rank feeds two decode ranks", 1, 2, "tp1>2"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := smallRun(t, func(s *runSpec) { s.prefillTP, s.decodeTP = c.prefillTP, c.decodeTP })
			n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
			out, err := runFake(t, cfg, n, Output{JSON: true, Duration: 20 * time.Millisecond, MaxIters: 50})
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 4, "two prompts by two concurrencies")
			for i, line := range lines {
				var r Result
				require.NoError(t, json.Unmarshal([]byte(line), &r))
				require.True(t, r.Verified)
				require.GreaterOrEqual(t, r.Requests, minIters)
				require.Greater(t, r.GBps, 0.0)
				require.Greater(t, r.GatherUs, 0.0)
				require.Greater(t, r.ScatterUs, 0.0)
				tokens := []int64{64, 64, 128, 128}[i]
				require.Equal(t, tokens*4*2*8*128*2, r.Bytes, "4 layers, K and V, 8 heads, 128 dims, BF16")
				require.Equal(t, []int{1, 4, 1, 4}[i], r.Concurrency)
				if c.suffix != "" {
					require.Contains(t, r.Name, c.suffix)
				}
				if c.decodeTP > 1 {
					require.Equal(t, c.decodeTP, r.DecodeTP)
					// each decode rank's Send carries half the bytes: the baseline's message
					require.Equal(t, min(r.Bytes/2, cfg.SlotBytes), r.MessageBytes)
				} else {
					require.Zero(t, r.DecodeTP)
				}
			}
			require.Empty(t, n.sends, "every send matched")
			require.Empty(t, n.recvs, "every receive matched")
		})
	}
}

// A transfer that damages one byte, or writes nothing, fails the check and the run.
func TestDriverCatchesDamagedAndMissingBytes(t *testing.T) {
	skipWithoutHostCopy(t)
	cases := []struct {
		desc string
		set  func(n *fakeNet)
	}{
		{"one byte flipped in one request", func(n *fakeNet) {
			n.corrupt = func(id uint64, b []byte) {
				if id == 2 {
					b[len(b)/2] ^= 1
				}
			}
		}},
		{"nothing written", func(n *fakeNet) { n.drop = true }},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := smallRun(t, func(s *runSpec) { s.prompts, s.concurrency = []int64{64}, []int{1} })
			n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
			tc.set(n)
			_, err := runFake(t, cfg, n, Output{Duration: 20 * time.Millisecond, MaxIters: 50})
			require.ErrorContains(t, err, "verification failed")
		})
	}
}

// sweep runs one configuration per block size, a prompt of batch blocks each, and names each
// result by block size and batch.
func TestSweepCoversBlockSizeByBatch(t *testing.T) {
	skipWithoutHostCopy(t)
	old := sweepOne
	defer func() { sweepOne = old }()
	var ran []int64
	sweepOne = func(ctx context.Context, cfg RunConfig, o Output, perftestBin string, out *Outputs, add func(Result) error) error {
		ran = append(ran, cfg.Dims.TokensPerBlock)
		n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
		return runFakeWith(t, cfg, n, o, add)
	}
	plot := t.TempDir() + "/sweep.svg"
	base := runFor(t, runSpec{layers: 2, concurrency: []int{1}, memCap: 256 << 20})
	runs, err := SweepRuns(base, []int{16, 64}, []int{1, 8})
	require.NoError(t, err)
	var stdout bytes.Buffer
	err = Sweep(context.Background(), runs, Output{Duration: 5 * time.Millisecond, MaxIters: 10000, Plot: plot},
		"", &Outputs{Stdout: &stdout, Stderr: discard{}})
	require.NoError(t, err)
	require.Equal(t, []int64{16, 64}, ran)
	for _, name := range []string{"tpb=16 blocks=1 c=1", "tpb=16 blocks=8 c=1", "tpb=64 blocks=1 c=1", "tpb=64 blocks=8 c=1"} {
		require.Contains(t, stdout.String(), "sweep custom(llama3-8b) "+name)
	}
	require.FileExists(t, plot)
}

// The two-host baseline: the prefill end starts ucx_perftest's server when asked over the
// control connection, the decode end runs the client against it (both on 127.0.0.1 here), the
// server with the client's settings: as UCX comes, or as the engine runs it (-e, and 1 MiB TCP
// segments, which a server with UCX's 64 KiB receive buffer cannot take: UCX 1.13 aborts it).
func TestRemotePerftestOverTheControlConnection(t *testing.T) {
	bin, err := perftest.Find()
	if err != nil {
		t.Skipf("ucx_perftest is not installed (Debian package ucx-utils): %v", err)
	}
	cases := []struct {
		desc string
		pc   perftest.Config
	}{
		{"as UCX comes", perftest.Config{Test: "tag_bw", Size: 256 << 10, TLS: "shm,self"}},
		{"as the engine runs it", perftest.Config{Test: "tag_bw", Size: 4 << 20, TLS: "tcp,self", ErrorHandling: true,
			Env: []string{"UCX_TCP_MAX_IOV=0", "UCX_TCP_RX_SEG_SIZE=1m", "UCX_TCP_TX_SEG_SIZE=1m", "UCX_NET_DEVICES=lo"}}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := smallRun(t)
			a, b := tcpPair(t)
			dc, pc := newControl(a, 5*time.Second), newControl(b, 5*time.Second)
			defer dc.Close()
			defer pc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
			served := make(chan error, 1)
			p, err := newPrefillEnd(cfg, 0, n.end("prefill0"), "decode")
			require.NoError(t, err)
			go func() { served <- p.serve(ctx, pc) }()
			c := tc.pc
			c.Binary, c.Iters, c.Warmup, c.Timeout = bin, 40, 4, 30*time.Second
			res, err := runRemotePerftest(ctx, dc, "127.0.0.1", c)
			require.NoError(t, err)
			require.Greater(t, res.GBps, 0.0)
			require.NoError(t, dc.send(message{Bye: true}))
			require.NoError(t, <-served)
		})
	}
}
