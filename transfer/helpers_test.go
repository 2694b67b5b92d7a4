// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"context"
	"crypto/subtle"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(peerproc.SharedBuilds(m)) } // each peer built once

// testDims is a small model: 2 layers, K and V, 4 heads of 8 FP16 elements, 4 tokens a block.
var testDims = layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 64}

// kvPool is one side's KV pool: its layout, memory, and a plan over some blocks.
type kvPool struct {
	l    layout.Layout
	mem  []byte
	plan *layout.Plan
}

func newKVPool(t testing.TB, d layout.Dims, o layout.Order, sel *layout.Selection, blocks []int32, fill uint64) *kvPool {
	t.Helper()
	l := layout.Packed(d, o)
	require.NoError(t, l.Validate())
	mem := make([]byte, l.SpanBytes())
	if fill != 0 {
		r := rand.New(rand.NewPCG(fill, fill))
		for i := range mem {
			mem[i] = byte(r.Uint32())
		}
	}
	s := l.All()
	if sel != nil {
		s = *sel
	}
	p, err := layout.NewPlan(l, s, blocks)
	require.NoError(t, err)
	return &kvPool{l: l, mem: mem, plan: p}
}

// nopInbound ignores control messages and peer failures.
type nopInbound struct{}

func (nopInbound) OnControl(Peer, []byte) {}
func (nopInbound) OnPeerLost(Peer, error) {}

func blocks(ids ...int32) []int32 { return ids }

func seqBlocks(from, n int32) []int32 {
	b := make([]int32, n)
	for i := range b {
		b[i] = from + int32(i)
	}
	return b
}

// stream is the plan's bytes by the reference gather.
func (p *kvPool) stream(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, p.plan.Bytes())
	require.NoError(t, layouttest.ReferenceGather(p.plan, p.mem, b))
	return b
}

// pair is a sender engine "prefill" and a receiver engine "decode" on one network.
type pair struct {
	net      *mem.Network
	src, dst *Engine
}

// fastConfig keeps the timers that end a wait on an event short (CancelGrace, RetryInterval),
// so failure tests run in milliseconds, and the deadlines far: a test whose outcome is a
// deadline (TransferTimeout, QueueTimeout, ProgressDeadline, QuarantineTimeout) sets that one
// short itself. Under a loaded CI host a process stalls for seconds; a 2 s TransferTimeout
// then ended transfers a test expected to complete or to fail another way (stop 30's
// TestPullValidatedRead_SenderReusesASlotMidRead).
func fastConfig() Config {
	return Config{
		SlotBytes: 1024, MaxConcurrent: 4, TransferTimeout: time.Minute,
		QueueTimeout: time.Minute, ProgressDeadline: time.Minute, CloseTimeout: 30 * time.Second,
		Tuning: tuning.Config{
			PipelineDepth: 2, QuarantineTimeout: 30 * time.Second,
			CancelGrace: 20 * time.Millisecond, RetryInterval: 20 * time.Millisecond,
			DirectMinRunBytes: tuning.None, // the test layouts' rows are a few hundred bytes: every path stays reachable
		},
	}
}

func newPair(t testing.TB, src, dst Config) *pair {
	t.Helper()
	n := mem.NewNetwork()
	a, err := New(n.Transport("prefill"), src)
	require.NoError(t, err)
	b, err := New(n.Transport("decode"), dst)
	require.NoError(t, err)
	p := &pair{net: n, src: a, dst: b}
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		requireSlotsAccounted(t, a)
		requireSlotsAccounted(t, b)
	})
	return p
}

// requireSlotsAccounted checks L5 after everything ended: no slot is still leased.
func requireSlotsAccounted(t testing.TB, e *Engine) {
	t.Helper()
	st := e.pool.Stats()
	require.Equal(t, st.Total, st.Free+st.Leased+st.Poisoned)
	require.Zero(t, st.Leased, "a slot lease outlived every transfer")
}

func waitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	waitClosedWithin(t, ch, what, 10*time.Second)
}

// waitClosedWithin is waitClosed with another bound: for a transfer over UCX whose bytes a
// loaded host's -race run moves slower than 10s allows.
func waitClosedWithin(t testing.TB, ch <-chan struct{}, what string, d time.Duration) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not close within %v", what, d)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// eventually polls cond until it holds or 10s pass.
func eventually(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

var bg = context.Background()

func waitQuiesced(t testing.TB, h *Handle, d time.Duration) {
	t.Helper()
	select {
	case <-h.Quiesced():
	case <-time.After(d):
		t.Fatalf("request %d not quiesced within %v: %+v", h.ID(), d, h.Status())
	}
}

// rowGroup runs a test's rows a few at a time, each a subtest on a goroutine of its own
// (t.Run may be called from several goroutines): rows that mostly wait, on a peer process, a
// deadline or a grace, overlap their waits, and the test takes less wall time for the same
// checks. A row in a group must hold its own engines and peers and share nothing it changes
// (no t.Setenv, no package state). Its width is the group's, not go test's -parallel (the
// host's cores, for t.Parallel), and its rows run while the parent's loop goes on: the
// parent defers wait, so that every row ends before the parent does.
type rowGroup struct {
	t     *testing.T
	slots chan struct{}
	rows  sync.WaitGroup
}

// newRowGroup is a group of t's rows, width at once.
func newRowGroup(t *testing.T, width int) *rowGroup {
	return &rowGroup{t: t, slots: make(chan struct{}, width)}
}

// run starts row f as the subtest name once fewer than the width run, and returns.
func (g *rowGroup) run(name string, f func(t *testing.T)) {
	g.slots <- struct{}{}
	g.rows.Go(func() {
		defer func() { <-g.slots }()
		g.t.Run(name, f)
	})
}

// wait returns once every row started has ended.
func (g *rowGroup) wait() { g.rows.Wait() }

// flipEveryByte inverts every byte of b, a word at a time (crypto/subtle's XOR): a byte loop
// over a 256 MiB pool takes seconds of CPU under -race.
func flipEveryByte(b []byte) {
	ones := bytes.Repeat([]byte{0xff}, 1<<20)
	for off := 0; off < len(b); off += len(ones) {
		n := min(len(ones), len(b)-off)
		subtle.XORBytes(b[off:off+n], b[off:off+n], ones[:n])
	}
}
