// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// rmaConfig lets the tiny test pools (1 KiB blocks) take the RMA mode.
func rmaConfig() Config {
	cfg := directConfig()
	cfg.Tuning.RMAMinRegionBytes = 512
	cfg.Tuning.DirectChunkBytes = 1 << 20
	return cfg
}

func TestRMAMovesTheReferenceBytesWithGetsOrFallsBack(t *testing.T) {
	cases := []struct {
		desc             string
		srcIDs, dstIDs   []int32
		dstOrder         layout.Order
		chunk            int64
		held             []int
		disableOnSender  bool
		disableOnRecv    bool
		streamingSender  bool
		wantPath         Path
		wantGets         int // data operations on the network (gets, or IOV chunks on fallback)
		wantHeldUntouch  bool
		wantBytesOnWire  int
		wantChunksOnWire int
	}{
		{desc: "block-major both sides, scattered ids: one get per block", srcIDs: blocks(1, 9, 5, 13), dstIDs: blocks(2, 7, 3, 11),
			dstOrder: layout.BlockMajor, chunk: 1 << 20, wantPath: PathRMA, wantGets: 4},
		{desc: "consecutive ids on both sides: the blocks coalesce into one get", srcIDs: blocks(1, 2, 3, 4), dstIDs: blocks(5, 6, 7, 8),
			dstOrder: layout.BlockMajor, chunk: 1 << 20, wantPath: PathRMA, wantGets: 1},
		{desc: "gets are at most DirectChunkBytes", srcIDs: blocks(1, 2, 3, 4), dstIDs: blocks(5, 6, 7, 8),
			dstOrder: layout.BlockMajor, chunk: 1000, wantPath: PathRMA, wantGets: 5},
		{desc: "partial transfer: held blocks are neither read nor written", srcIDs: blocks(1, 9, 5, 13), dstIDs: blocks(2, 7, 3, 11),
			dstOrder: layout.BlockMajor, chunk: 1 << 20, held: []int{0, 2}, wantPath: PathRMA, wantGets: 2},
		{desc: "layout conversion: ranges too small, IOV messages", srcIDs: blocks(1, 2, 3, 4), dstIDs: blocks(5, 6, 7, 8),
			dstOrder: layout.LayerMajor, chunk: 1 << 20, wantPath: PathDirect, wantGets: 1},
		{desc: "receiver disables rma: IOV messages", srcIDs: blocks(1, 2, 3, 4), dstIDs: blocks(5, 6, 7, 8),
			dstOrder: layout.BlockMajor, chunk: 1 << 20, disableOnRecv: true, wantPath: PathDirect, wantGets: 1},
		{desc: "sender disables rma: it declines, IOV messages", srcIDs: blocks(1, 2, 3, 4), dstIDs: blocks(5, 6, 7, 8),
			dstOrder: layout.BlockMajor, chunk: 1 << 20, disableOnSender: true, wantPath: PathDirect, wantGets: 1},
		{desc: "streaming sender declines, IOV messages", srcIDs: blocks(1, 2, 3, 4), dstIDs: blocks(5, 6, 7, 8),
			dstOrder: layout.BlockMajor, chunk: 1 << 20, streamingSender: true, wantPath: PathDirect, wantGets: 1},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src := newKVPool(t, testDims, layout.BlockMajor, nil, c.srcIDs, 9)
			dst := newKVPool(t, testDims, c.dstOrder, nil, c.dstIDs, 0)
			scfg, rcfg := rmaConfig(), rmaConfig()
			scfg.Tuning.DisableRMA, rcfg.Tuning.DisableRMA = c.disableOnSender, c.disableOnRecv
			rcfg.Tuning.DirectChunkBytes = c.chunk
			p, w := directPair(t, scfg, rcfg, src, dst)
			hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: c.streamingSender})
			require.NoError(t, err)
			if c.streamingSender {
				require.NoError(t, hs.MarkLayersReady(int(testDims.NumLayers)))
			}
			hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: c.held})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.wantPath, hr.Path())
			require.Equal(t, c.wantPath, hs.Path())

			sp, dp := src.plan, dst.plan
			if len(c.held) > 0 {
				sp, err = kvplan.WithoutPositions(src.plan, c.held)
				require.NoError(t, err)
				dp, err = kvplan.WithoutPositions(dst.plan, c.held)
				require.NoError(t, err)
				kept, err := kvplan.WithoutPositions(dst.plan, notIn(c.held, len(dst.plan.Blocks())))
				require.NoError(t, err)
				b := make([]byte, kept.Bytes())
				require.NoError(t, layouttest.ReferenceGather(kept, dst.mem, b))
				require.Equal(t, make([]byte, len(b)), b, "a held block was written")
			}
			want, got := make([]byte, sp.Bytes()), make([]byte, dp.Bytes())
			require.NoError(t, layouttest.ReferenceGather(sp, src.mem, want))
			require.NoError(t, layouttest.ReferenceGather(dp, dst.mem, got))
			require.Equal(t, want, got, "every byte")
			bytes, ops := w.total()
			require.Equal(t, len(want), bytes, "bare stream bytes, no header, nothing twice")
			require.Equal(t, c.wantGets, ops)
			require.Equal(t, hr.Status().Total, hr.Status().Bytes)
			require.Equal(t, hs.Status().Total, hs.Status().Bytes)
			require.Zero(t, p.net.Pending(), "every operation has its final verdict")
		})
	}
}

// rmaPools are a block-major pair whose blocks are scattered, so each is a get of its own.
func rmaPools(t testing.TB, seed uint64) (src, dst *kvPool) {
	return newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 9, 5, 13), seed),
		newKVPool(t, testDims, layout.BlockMajor, nil, blocks(2, 7, 3, 11), 0)
}

// A cancel, a deadline or a lost peer while gets are on the wire: the receiver's memory is
// quiet only once every get has its final verdict; the sender's pool stays exposed (its
// blocks not quiesced) until the receiver says it stopped reading, or the peer is gone.
func TestRMAStopsWhileGetsAreOutstanding(t *testing.T) {
	cases := []struct {
		desc           string
		stop           func(p *pair) // with a get hung on the wire
		wantCancel     CancelOutcome
		resume         bool // the hung get completes later
		wantRecv       State
		wantRecvErr    error
		wantSend       State
		wantSendErr    error
		recvQuietEarly bool // the receiver quiesces before any resume
	}{
		{desc: "receiver cancels", stop: func(p *pair) {}, wantCancel: CancelRequestedInFlight, resume: true,
			wantRecv: Cancelled, wantSend: Cancelled, wantSendErr: ErrPeerAborted},
		{desc: "sender cancels", stop: func(p *pair) {}, wantCancel: CancelRequestedInFlight, resume: true,
			wantRecv: Failed, wantRecvErr: ErrPeerAborted, wantSend: Cancelled},
		{desc: "sender lost", stop: func(p *pair) { p.net.LosePeer("prefill") }, recvQuietEarly: true,
			wantRecv: Failed, wantRecvErr: ErrPeerLost, wantSend: Failed, wantSendErr: ErrPeerLost},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := rmaPools(t, uint64(20+i))
			cfg := rmaConfig()
			cfg.Tuning.QuarantineTimeout = 10 * time.Second
			p, w := directPair(t, cfg, cfg, src, dst)
			w.fault = mem.Fault{Hang: true}
			hs, hr := p.start(t, 1, src, dst)
			eventually(t, func() bool { return p.net.OnWire() >= 4 }, "four gets hung on the wire")
			require.Equal(t, PathRMA, hr.Path())
			switch c.desc {
			case "receiver cancels":
				require.Equal(t, c.wantCancel, p.dst.Cancel(1))
			case "sender cancels":
				require.Equal(t, c.wantCancel, p.src.Cancel(1))
			}
			c.stop(p)
			if c.recvQuietEarly {
				waitClosed(t, hr.Quiesced(), "receiver quiesced")
			} else {
				waitClosed(t, hr.Done(), "receiver done")
				waitClosed(t, hs.Done(), "sender done")
				quiet(t, p.net)
				require.False(t, isClosed(hr.Quiesced()), "receiver quiesced while its gets may still write its blocks")
				require.False(t, isClosed(hs.Quiesced()), "sender quiesced while the receiver may still read its blocks")
			}
			if c.resume {
				p.net.Resume()
			}
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, c.wantRecv)
			requireState(t, hs, c.wantSend)
			if c.wantRecvErr != nil {
				require.ErrorIs(t, hr.Status().Err, c.wantRecvErr)
			}
			if c.wantSendErr != nil {
				require.ErrorIs(t, hs.Status().Err, c.wantSendErr)
			}
			require.False(t, hr.Status().BlocksPoisoned)
			require.False(t, hs.Status().BlocksPoisoned)
			require.Zero(t, p.net.Pending())
		})
	}
}

// The sender's deadline passes while the receiver's gets hang: the sender is quarantined
// (its blocks may still be read) and quiesces only when the receiver releases them.
func TestRMASenderDeadlineQuarantinesUntilRelease(t *testing.T) {
	src, dst := rmaPools(t, 30)
	scfg, rcfg := rmaConfig(), rmaConfig()
	scfg.TransferTimeout = 100 * time.Millisecond
	scfg.Tuning.QuarantineTimeout = 10 * time.Second
	p, w := directPair(t, scfg, rcfg, src, dst)
	w.fault = mem.Fault{Hang: true}
	hs, hr := p.start(t, 1, src, dst)
	waitClosed(t, hs.Done(), "sender done")
	requireState(t, hs, Quarantined, ErrDeadline)
	waitClosed(t, hr.Done(), "receiver done: the sender's abort reached it")
	require.False(t, isClosed(hs.Quiesced()))
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced on the receiver's release")
	requireState(t, hs, Failed)
	require.False(t, hs.Status().BlocksPoisoned)
}

// L9 on the RMA mode: a get whose quiescence is never known leaves the receiver's blocks
// poisoned for good; the sender is released all the same (a late read lands in memory
// nobody uses).
func TestL9_RMAUnknownQuiescenceNeverQuiescesTheReceiversBlocks(t *testing.T) {
	src, dst := rmaPools(t, 31)
	scfg, rcfg := rmaConfig(), rmaConfig()
	rcfg.TransferTimeout = 100 * time.Millisecond
	rcfg.Tuning.QuarantineTimeout = 100 * time.Millisecond
	p, w := directPair(t, scfg, rcfg, src, dst)
	w.fault = mem.Fault{Hang: true, NeverQuiesce: true}
	hs, hr := p.start(t, 1, src, dst)
	waitClosed(t, hr.Done(), "receiver done")
	eventually(t, func() bool { return hr.Status().BlocksPoisoned }, "receiver's blocks poisoned")
	requireState(t, hr, Quarantined)
	waitClosed(t, hs.Quiesced(), "sender quiesced on the release")
	quiet(t, p.net)
	require.False(t, isClosed(hr.Quiesced()), "unknown quiescence told the caller to free its blocks")
}

// faultNth numbers the control messages of kind (from peer from, or any where from is empty)
// from 1 and gives the n-th the fault f(n) (none where f is nil); every other message goes to
// w as usual. It returns how many such messages have been sent so far.
func faultNth(p *pair, w *wireBytes, kind wire.Kind, from Peer, f func(n int) mem.Fault) func() int {
	var mu sync.Mutex
	n := 0
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind != kind || (from != "" && fp.From != from) {
			return w.judge(fp)
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		if f == nil {
			return mem.Fault{}
		}
		return f(n)
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// fakeRMASender answers every request with FlagRMA with the offer a test made, as a
// confused or hostile sender would.
type fakeRMASender struct {
	tr    transport.Transport                         // any transport: it only sends control messages
	offer func(ri *wire.RequestInfo) []*wire.RMAOffer // one offer, or its parts
}

func (f fakeRMASender) OnControl(from Peer, msg []byte) {
	m, err := wire.Decode(msg)
	if answerHello(f.tr, from, m) {
		return
	}
	if ri, ok := m.(*wire.RequestInfo); err == nil && ok && ri.Flags&wire.FlagRMA != 0 {
		for _, o := range f.offer(ri) {
			b, err := o.AppendBinary(nil)
			if err == nil {
				_ = f.tr.SendControl(from, b)
			}
		}
	}
}

func (fakeRMASender) OnPeerLost(Peer, error) {}

// An offer that does not describe memory the receiver may read fails the request with a
// typed error before any get is posted; one whose key names a smaller pool than it claims is
// refused by the transport, never read past. An offer in parts whose parts disagree is
// refused the same way.
func TestRMABadOfferIsRejected(t *testing.T) {
	good := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 9, 5, 13), 40)
	offer := func(ri *wire.RequestInfo) *wire.RMAOffer {
		return &wire.RMAOffer{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce}, Addr: 1 << 20, PoolBytes: int64(len(good.mem)),
			Layout: good.plan.Layout(), Selection: good.plan.Selection(), Blocks: append([]int32(nil), good.plan.Blocks()...),
			Key: []byte("not a key")}
	}
	mk := func(f func(o *wire.RMAOffer)) func(ri *wire.RequestInfo) []*wire.RMAOffer {
		return func(ri *wire.RequestInfo) []*wire.RMAOffer {
			o := offer(ri)
			f(o)
			return []*wire.RMAOffer{o}
		}
	}
	// mkParts sends the good offer as two parts of two blocks, changed by f.
	mkParts := func(f func(a, b *wire.RMAOffer)) func(ri *wire.RequestInfo) []*wire.RMAOffer {
		return func(ri *wire.RequestInfo) []*wire.RMAOffer {
			a, b := offer(ri), offer(ri)
			a.Flags, a.Total, a.Blocks = wire.RMAOfferPart, 4, a.Blocks[:2]
			b.Flags, b.Total, b.First, b.Blocks = wire.RMAOfferPart, 4, 2, b.Blocks[2:]
			f(a, b)
			return []*wire.RMAOffer{a, b}
		}
	}
	cases := []struct {
		desc    string
		offer   func(ri *wire.RequestInfo) []*wire.RMAOffer
		wantErr error
	}{
		{"parts naming different keys", mkParts(func(a, b *wire.RMAOffer) { b.Key = []byte("another key") }), errBadRMAOffer},
		{"parts naming different pools", mkParts(func(a, b *wire.RMAOffer) { b.Addr += 4096 }), errBadRMAOffer},
		{"parts of different totals", mkParts(func(a, b *wire.RMAOffer) { b.Total = 5 }), errBadRMAOffer},
		{"parts naming different layouts", mkParts(func(a, b *wire.RMAOffer) { b.Layout.StrideBlock *= 2 }), errBadRMAOffer},
		{"parts giving one position two ids", mkParts(func(a, b *wire.RMAOffer) { b.First = 1 }), errBadRMAOffer},
		{"assembled parts with a block outside the pool", mkParts(func(a, b *wire.RMAOffer) { b.Blocks[1] = 64 }), errBadRMAOffer},
		{"assembled parts with a key the transport does not know", mkParts(func(a, b *wire.RMAOffer) {}), ErrInvalidSpec},
		{"block id outside the pool", mk(func(o *wire.RMAOffer) { o.Blocks[2] = 64 }), errBadRMAOffer},
		{"negative block id", mk(func(o *wire.RMAOffer) { o.Blocks[0] = -1 }), errBadRMAOffer},
		{"duplicate block", mk(func(o *wire.RMAOffer) { o.Blocks[1] = o.Blocks[0] }), errBadRMAOffer},
		{"pool smaller than its layout", mk(func(o *wire.RMAOffer) { o.PoolBytes = 4096 }), errBadRMAOffer},
		{"zero element size", mk(func(o *wire.RMAOffer) { o.Layout.ElemSize = 0 }), errBadRMAOffer},
		{"overlapping strides", mk(func(o *wire.RMAOffer) { o.Layout.StrideBlock = 8 }), errBadRMAOffer},
		{"selection outside the layout", mk(func(o *wire.RMAOffer) { o.Selection.LayerEnd = 9 }), errBadRMAOffer},
		{"fewer blocks than requested", mk(func(o *wire.RMAOffer) { o.Blocks = o.Blocks[:3] }), errBadRMAOffer},
		{"address range wraps", mk(func(o *wire.RMAOffer) { o.Addr = ^uint64(0) - 100 }), errBadRMAOffer},
		{"a key the transport does not know", mk(func(o *wire.RMAOffer) {}), ErrInvalidSpec},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			evil := n.Transport("prefill")
			require.NoError(t, evil.Bind(fakeRMASender{tr: evil, offer: c.offer}))
			evil.AllowDirect(good.mem)
			dtr := n.Transport("decode")
			e, err := New(dtr, rmaConfig())
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.Close()); require.NoError(t, evil.Close(true)) })
			dst := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(2, 7, 3, 11), 0)
			dtr.AllowDirect(dst.mem)
			w := &wireBytes{}
			n.SetFault(w.judge)
			hr, err := e.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			requireState(t, hr, Failed, c.wantErr)
			_, ops := w.total()
			require.Zero(t, ops, "no get was made")
			require.Equal(t, make([]byte, len(dst.mem)), dst.mem, "nothing written")
			if errors.Is(hr.Status().Err, ErrProtocol) {
				require.EqualValues(t, 1, e.Health().Numbers.ProtocolRefusals, "the refused offer is counted")
			}
		})
	}
}

// The handshake's control messages are best-effort: a lost offer or decline is sent again
// when the receiver repeats its request, and the transfer completes on the path it would
// have taken.
func TestRMALostHandshakeMessagesAreResent(t *testing.T) {
	cases := []struct {
		desc            string
		disableOnSender bool
		wantPath        Path
	}{
		{"lost offer", false, PathRMA},
		{"lost decline", true, PathDirect},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := rmaPools(t, uint64(50+i))
			scfg := rmaConfig()
			scfg.Tuning.DisableRMA = c.disableOnSender
			p, w := directPair(t, scfg, rmaConfig(), src, dst)
			offers := faultNth(p, w, wire.KindRMAOffer, "", func(n int) mem.Fault { return mem.Fault{Drop: n == 1} })
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.wantPath, hr.Path())
			require.GreaterOrEqual(t, offers(), 2, "the dropped answer went again")
			require.Equal(t, src.stream(t), dst.stream(t))
		})
	}
}

// A request of more blocks than one offer message carries is offered in parts of
// rmaMaxOfferBlocks, or fewer where the transport's control messages are smaller
// (ControlBound), which the receiver assembles; every byte lands where the sender's
// (shuffled) block list says. Parts that arrive twice or out of order assemble all the same,
// and losing one only delays the transfer: the receiver's repeated request brings all of
// them again.
func TestRMAOfferInParts(t *testing.T) {
	tiny := layout.Dims{NumLayers: 1, KVFactor: 1, NumHeads: 1, HeadDim: 4, ElemSize: 2, TokensPerBlock: 1, NumBlocks: 8192}
	cases := []struct {
		desc       string
		blocks     int32
		maxControl int
		fault      func(n int) mem.Fault // for the n-th offer message (from 1)
		wantParts  int                   // offer messages on the wire: exactly, or at least with a fault
	}{
		{"at the bound: one message", rmaMaxOfferBlocks, 0, nil, 1},
		{"one block over: two parts", rmaMaxOfferBlocks + 1, 0, nil, 2},
		{"a 128k-token request of 16-token blocks: eleven parts", 8192, 0, nil, 11},
		{"control messages of 1 KiB: parts sized to them", 2000, 1024, nil, 2000/((1024-wire.OfferFixedBytes-wire.OfferBodyBytes-wire.OfferPartBytes-2*mem.RMAKeyBytes-wire.OfferGenBytes)/4) + 1},
		{"a lost part is sent again", 3 * rmaMaxOfferBlocks, 0, func(n int) mem.Fault { return mem.Fault{Drop: n == 2} }, 3 + 3},
		{"parts twice and out of order", 8192, 0, func(n int) mem.Fault {
			return mem.Fault{Duplicate: n%3 == 0, Delay: time.Duration(n%2) * 20 * time.Millisecond}
		}, 11},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			srcIDs := seqBlocks(0, c.blocks)
			r.Shuffle(len(srcIDs), func(a, b int) { srcIDs[a], srcIDs[b] = srcIDs[b], srcIDs[a] })
			src := newKVPool(t, tiny, layout.BlockMajor, nil, srcIDs, uint64(70+i))
			dst := newKVPool(t, tiny, layout.BlockMajor, nil, seqBlocks(8192-c.blocks, c.blocks), 0)
			cfg := rmaConfig()
			cfg.Tuning.RMAMinRegionBytes = 1
			p, w := directPair(t, cfg, cfg, src, dst)
			p.net.SetMaxControl(c.maxControl) // SendControl refuses more: a part too large would decline the offer
			offers := faultNth(p, w, wire.KindRMAOffer, "", c.fault)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, PathRMA, hr.Path())
			require.Equal(t, src.stream(t), dst.stream(t))
			if c.fault != nil {
				require.GreaterOrEqual(t, offers(), c.wantParts)
			} else {
				require.Equal(t, c.wantParts, offers())
			}
		})
	}
}

// L10 on the RMA mode: a receiver that gave up (its deadline, or a cancel) before the Send was
// made has told the sender's engine so; the early request it left there must not start the
// Send, or the sender would expose its pool to a receiver that will never read it nor say it
// stopped, and its blocks could never be freed (they stayed poisoned, never quiescent: found
// by the soak's direct mode). The Send ends unanswered, quiescent, its blocks the caller's.
func TestL10_RMAReceiverGoneBeforeTheSendExposesNothing(t *testing.T) {
	for _, how := range []string{"deadline", "cancel"} {
		t.Run(how, func(t *testing.T) {
			src, dst := rmaPools(t, 80)
			cfg := rmaConfig()
			p, _ := directPair(t, cfg, cfg, src, dst)
			spec := Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem}
			if how == "deadline" {
				spec.Timeout = time.Millisecond
			}
			hr, err := p.dst.Receive(bg, spec)
			require.NoError(t, err)
			if how == "cancel" {
				eventually(t, func() bool { return hr.Status().State == Advertised }, "request sent")
				p.dst.Cancel(1)
			}
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			eventually(t, func() bool { // its abort reached the sender's engine
				p.src.mu.Lock()
				defer p.src.mu.Unlock()
				return p.src.pending[routeKey{"decode", 1}].abort != nil
			}, "the early request marked aborted")
			hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Timeout: 200 * time.Millisecond})
			require.NoError(t, err)
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			st := hs.Status()
			want := Failed
			if how == "cancel" {
				want = Cancelled // the receiver withdrew its request: nothing failed here
			}
			require.Equal(t, want, st.State, "%v", st.Err)
			require.ErrorIs(t, st.Err, ErrPeerAborted, "the Send ends at once, on the receiver's word")
			require.False(t, st.BlocksPoisoned)
			require.NotEqual(t, PathRMA, hs.Path(), "the pool was never offered")
		})
	}
}

// L10 on the RMA mode: a receiver that declines the offer (its layout does not line up) after
// the sender has aborted (its deadline) still releases the sender's pool: the decline says it
// will never read it, and so does the receiver's end. Before, an aborting sender ignored the
// decline and waited for a release that never came, and its blocks stayed poisoned for good
// (found by the soak's direct mode).
func TestL10_RMADeclineAfterTheSendersDeadlineReleasesThePool(t *testing.T) {
	src := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 2, 3, 4), 90)
	dst := newKVPool(t, testDims, layout.LayerMajor, nil, blocks(5, 6, 7, 8), 0) // ranges too small: a decline
	cfg := rmaConfig()
	p, w := directPair(t, cfg, cfg, src, dst)
	faultNth(p, w, wire.KindRequestInfo, "decode", func(n int) mem.Fault {
		if n >= 2 { // the decline (and any repeat): held past the sender's deadline
			return mem.Fault{Delay: 150 * time.Millisecond}
		}
		return mem.Fault{}
	})
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	require.False(t, hs.Status().BlocksPoisoned, "%v", hs.Status().Err)
	require.NotEqual(t, Completed, hs.Status().State)
}

// L12 with L9: a transfer whose caller's blocks are poisoned for good (unknown quiescence) is
// one the engine has given up on: the handle stays quarantined forever and its blocks are
// never to be used again. Such transfers leave the quarantine budget, which is for transfers
// still waiting (or a few of them would leave a working engine unhealthy for the rest of its
// life: the 30-minute soak's one-copy mode found decode unhealthy long after every peer was
// back), and their blocks have a budget of their own, PoisonedBlockBudget, past which the
// engine is unhealthy for good: the pool is losing blocks.
func TestL12_BlocksPoisonedForGoodHaveABudgetOfTheirOwn(t *testing.T) {
	scfg, rcfg := rmaConfig(), rmaConfig()
	rcfg.TransferTimeout = 100 * time.Millisecond
	rcfg.Tuning.QuarantineTimeout = 100 * time.Millisecond
	rcfg.Tuning.QuarantineBudget = 1
	rcfg.Tuning.PoisonedBlockBudget = 8 // two requests of four blocks
	p, w := directPair(t, scfg, rcfg, nil, nil)
	w.fault = mem.Fault{Hang: true, NeverQuiesce: true}
	for id := RequestID(1); id <= 3; id++ {
		src, dst := rmaPools(t, 32+uint64(id)) // poisoned blocks are never used again
		p.net.Endpoint("prefill").AllowDirect(src.mem)
		p.net.Endpoint("decode").AllowDirect(dst.mem)
		_, hr := p.start(t, id, src, dst)
		waitClosed(t, hr.Done(), "receiver done")
		eventually(t, func() bool { return p.dst.Health().Numbers.BlocksPoisoned == int64(id) }, "receiver's blocks poisoned")
		h := p.dst.Health()
		require.Equal(t, int64(id), h.Numbers.Quarantined, "they stay quarantined")
		require.Equal(t, 4*int64(id), h.Numbers.PoisonedBlocks)
		require.Equal(t, 8, h.Numbers.PoisonedBudget)
		if id < 3 {
			require.True(t, h.Healthy, "within both budgets: %s", h.Reason)
			continue
		}
		require.False(t, h.Healthy)
		require.Equal(t, "12 KV blocks poisoned for good (in 3 transfers), over the budget of 8", h.Reason,
			"the quarantine budget of 1 does not count them")
	}
}
