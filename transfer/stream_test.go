// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// streamDims has 4 layers of 16 blocks: 8 KiB a layer, about nine 976-byte chunks with
// fastConfig's 1 KiB slots, so a layer boundary falls inside a plain chunk.
var streamDims = layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 4, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 40}

func streamPools(t testing.TB, dstOrder layout.Order) (src, dst *kvPool) {
	return newKVPool(t, streamDims, layout.BlockMajor, nil, seqBlocks(2, 16), 7),
		newKVPool(t, streamDims, dstOrder, nil, seqBlocks(20, 16), 0)
}

// fakeSignal is a ReadySignal a test fires by hand; it counts queries to show they are polls.
type fakeSignal struct {
	fired   atomic.Bool
	queries atomic.Int64
	err     error
}

func (s *fakeSignal) Query() (bool, error) {
	s.queries.Add(1)
	if s.err != nil {
		return false, s.err
	}
	return s.fired.Load(), nil
}

// settled waits a little and requires the sender's moved bytes to stay at want: no chunk of an
// unready layer leaves.
func requireMovedStays(t *testing.T, h *Handle, want int64) {
	t.Helper()
	eventually(t, func() bool { return h.Status().Bytes == want }, "ready layers moved")
	time.Sleep(30 * time.Millisecond)
	require.Equal(t, want, h.Status().Bytes, "bytes of an unready layer moved")
}

func TestStreamedSendGivesTheReferenceBytesLayerByLayer(t *testing.T) {
	cases := []struct {
		desc          string
		dstOrder      layout.Order
		signals       bool // readiness by polled signal rather than MarkLayersReady
		receiveStream bool // the receiver asks for layer-aligned chunks
	}{
		{"marked by call, layer-major receiver", layout.LayerMajor, false, true},
		{"marked by call, block-major receiver", layout.BlockMajor, false, true},
		{"polled signals", layout.LayerMajorNHD, true, true},
		{"receiver not streaming: chunks straddle layers", layout.LayerMajor, false, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p := newPair(t, fastConfig(), fastConfig())
			src, dst := streamPools(t, c.dstOrder)
			perLayer := src.plan.Bytes() / streamDims.NumLayers
			spec := Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true}
			var sigs []*fakeSignal
			if c.signals {
				for l := 1; l <= int(streamDims.NumLayers); l++ {
					s := &fakeSignal{}
					sigs = append(sigs, s)
					spec.Ready = append(spec.Ready, LayerSignal{End: l, Signal: s})
				}
			}
			hs, err := p.src.Send(bg, spec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: c.receiveStream})
			require.NoError(t, err)

			requireMovedStays(t, hs, 0)
			for l := 1; l <= int(streamDims.NumLayers); l++ {
				if c.signals {
					sigs[l-1].fired.Store(true)
				} else {
					require.NoError(t, hs.MarkLayersReady(l))
				}
				if l == int(streamDims.NumLayers) {
					break
				}
				want := int64(l) * perLayer
				if !c.receiveStream {
					chunk := fastConfig().SlotBytes - transport.DataHeaderBytes
					want = want / chunk * chunk // plain chunks: only those wholly inside ready layers
				}
				requireMovedStays(t, hs, want)
				if c.receiveStream {
					eventually(t, func() bool { return hr.LayersReady() == l }, "receiver's layers ready")
				}
				require.Equal(t, l, hs.LayersReady())
			}
			waitClosed(t, hs.Quiesced(), "sender")
			waitClosed(t, hr.Quiesced(), "receiver")
			requireState(t, hs, Completed)
			requireState(t, hr, Completed)
			require.Equal(t, int(streamDims.NumLayers), hr.LayersReady())
			require.Equal(t, src.stream(t), dst.stream(t))
			if c.signals {
				require.Greater(t, sigs[0].queries.Load(), int64(1), "a signal not yet fired is polled again")
			}
			require.NoError(t, hs.Release())
			require.NoError(t, hr.Release())
		})
	}
}

// TestStreamMidStreamFailuresFollowTheLifecycle: a streaming send stopped after its first
// layer, with the others never ready, ends by the same rules as any transfer.
func TestStreamMidStreamFailuresFollowTheLifecycle(t *testing.T) {
	cases := []struct {
		desc      string
		timeout   time.Duration
		signalErr bool
		act       func(p *pair, hs *Handle)
		sender    State
		senderErr []error
		receiver  State
		recvErr   []error
	}{
		{"cancel", 0, false, func(p *pair, hs *Handle) {
			require.Equal(t, CancelRequestedInFlight, p.src.Cancel(hs.ID()))
		}, Cancelled, []error{ErrCancelled}, Failed, []error{ErrPeerAborted}},
		{"deadline with a never-ready layer", 150 * time.Millisecond, false, func(*pair, *Handle) {},
			Failed, []error{ErrDeadline}, Failed, []error{ErrPeerAborted, ErrDeadline}},
		{"peer death", 0, false, func(p *pair, _ *Handle) { p.net.LosePeer("decode") },
			Failed, []error{ErrPeerLost}, Failed, []error{ErrPeerLost}},
		{"receiver cancels", 0, false, func(p *pair, hs *Handle) {
			require.Equal(t, CancelRequestedInFlight, p.dst.Cancel(hs.ID()))
		}, Cancelled, []error{ErrPeerAborted, ErrCancelled}, Cancelled, []error{ErrCancelled}},
		{"signal fails", 0, true, func(*pair, *Handle) {},
			Failed, []error{errReadySignal}, Failed, []error{ErrPeerAborted}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p := newPair(t, fastConfig(), fastConfig())
			src, dst := streamPools(t, layout.LayerMajor)
			perLayer := src.plan.Bytes() / streamDims.NumLayers
			first := &fakeSignal{}
			first.fired.Store(true)
			second := &fakeSignal{}
			if c.signalErr {
				second.err = errors.New("cudaErrorLaunchFailure")
			}
			spec := Spec{ID: 9, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true, Timeout: c.timeout,
				Ready: []LayerSignal{{End: 1, Signal: first}, {End: 2, Signal: second}}}
			hs, err := p.src.Send(bg, spec)
			require.NoError(t, err)
			// The receiver's own deadline is the default, so it hears why the sender stopped.
			hr, err := p.dst.Receive(bg, Spec{ID: 9, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
			require.NoError(t, err)
			if !c.signalErr {
				eventually(t, func() bool { return hr.LayersReady() == 1 && hs.Status().Bytes == perLayer }, "first layer over")
			}
			c.act(p, hs)
			waitClosed(t, hs.Quiesced(), "sender")
			waitClosed(t, hr.Quiesced(), "receiver")
			requireState(t, hs, c.sender, c.senderErr...)
			requireState(t, hr, c.receiver, c.recvErr...)
			require.Less(t, hr.LayersReady(), int(streamDims.NumLayers))
			require.NoError(t, hs.Release())
			require.NoError(t, hr.Release())
		})
	}
}

// TestL12_StreamWaitingOnTheModelIsNotAStall: a streaming send whose layers are not ready is
// waiting on the model, not wedged, so it alone does not make the engine unhealthy; the same
// send stuck on the wire does.
func TestL12_StreamWaitingOnTheModelIsNotAStall(t *testing.T) {
	cfg := fastConfig()
	cfg.ProgressDeadline = 50 * time.Millisecond
	for _, wireStuck := range []bool{false, true} {
		name := map[bool]string{false: "waiting on the model", true: "stuck on the wire"}[wireStuck]
		t.Run(name, func(t *testing.T) {
			p := newPair(t, cfg, cfg)
			src, dst := streamPools(t, layout.LayerMajor)
			hs, err := p.src.Send(bg, Spec{ID: 4, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true})
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, Spec{ID: 4, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
			require.NoError(t, err)
			require.NoError(t, hs.MarkLayersReady(1))
			eventually(t, func() bool { return hr.LayersReady() == 1 }, "first layer over")
			if wireStuck {
				p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
				require.NoError(t, hs.MarkLayersReady(2))
			}
			time.Sleep(4 * cfg.ProgressDeadline)
			h := p.src.Health()
			if wireStuck {
				require.False(t, h.Healthy, "a send stuck on the wire is a stall")
				require.Contains(t, h.Reason, "no transfer progressed")
				p.net.SetFault(nil)
				p.net.Resume()
			} else {
				require.True(t, h.Healthy, h.Reason)
				require.Equal(t, int64(1), h.Numbers.AwaitingReady)
				require.True(t, p.dst.Health().Healthy, p.dst.Health().Reason)
			}
			require.NoError(t, hs.MarkLayersReady(int(streamDims.NumLayers)))
			waitClosed(t, hs.Quiesced(), "sender")
			waitClosed(t, hr.Quiesced(), "receiver")
			requireState(t, hs, Completed)
			requireState(t, hr, Completed)
			require.Equal(t, src.stream(t), dst.stream(t))
			require.Zero(t, p.src.Health().Numbers.AwaitingReady)
			require.NoError(t, hs.Release())
			require.NoError(t, hr.Release())
		})
	}
}

func TestPartialReceiveMovesOnlyTheBlocksItLacks(t *testing.T) {
	cases := []struct {
		desc         string
		held         []int
		stream       bool
		receiveFirst bool // the request (with its held positions) waits for the Send
	}{
		{"prefix hit", []int{0, 1, 2, 3, 4}, false, false},
		{"prefix hit, request before the send", []int{0, 1, 2, 3, 4}, false, true},
		{"scattered, unsorted", []int{9, 0, 3, 15}, false, true},
		{"all but one", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15}, false, false},
		{"prefix hit, streamed, every layer marked before the request", []int{0, 1, 2, 3}, true, false},
		{"prefix hit, streamed, request before the send", []int{0, 1, 2, 3}, true, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p := newPair(t, fastConfig(), fastConfig())
			src, dst := streamPools(t, layout.LayerMajor)
			// The receiver's held blocks hold something the sender would never send there.
			for i := range dst.mem {
				dst.mem[i] = 0xA5
			}
			before := append([]byte(nil), dst.mem...)
			send := func() *Handle {
				hs, err := p.src.Send(bg, Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: c.stream})
				require.NoError(t, err)
				if c.stream {
					require.NoError(t, hs.MarkLayersReady(int(streamDims.NumLayers)))
				}
				return hs
			}
			var hs *Handle
			if !c.receiveFirst {
				hs = send()
			}
			hr, err := p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: c.held, Stream: c.stream})
			require.NoError(t, err)
			if c.receiveFirst {
				time.Sleep(10 * time.Millisecond) // the request arrives first and is kept
				hs = send()
			}
			waitClosed(t, hs.Quiesced(), "sender")
			waitClosed(t, hr.Quiesced(), "receiver")
			requireState(t, hs, Completed)
			requireState(t, hr, Completed)

			srcPart, err := kvplan.WithoutPositions(src.plan, c.held)
			require.NoError(t, err)
			dstPart, err := kvplan.WithoutPositions(dst.plan, c.held)
			require.NoError(t, err)
			want := make([]byte, srcPart.Bytes())
			require.NoError(t, layouttest.ReferenceGather(srcPart, src.mem, want))
			got := make([]byte, dstPart.Bytes())
			require.NoError(t, layouttest.ReferenceGather(dstPart, dst.mem, got))
			require.Equal(t, want, got, "the blocks the receiver lacked")
			require.Equal(t, srcPart.Bytes(), hs.Status().Total, "the sender trimmed its plan the same way")
			require.Equal(t, dstPart.Bytes(), hr.Status().Total)
			require.Equal(t, srcPart.Bytes(), hs.Status().Bytes)

			// Writing the expected blocks over the old pool must give exactly the new one:
			// nothing else, held blocks included, was touched.
			require.NoError(t, layouttest.ReferenceScatter(dstPart, want, before))
			require.Equal(t, before, dst.mem)
			require.NoError(t, hs.Release())
			require.NoError(t, hr.Release())
		})
	}
}

func TestStreamAndPartialBadInputGivesTypedErrors(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	src, dst := streamPools(t, layout.LayerMajor)
	sig := &fakeSignal{}
	all := make([]int, len(dst.plan.Blocks()))
	for i := range all {
		all[i] = i
	}
	cases := []struct {
		desc    string
		receive bool
		spec    Spec
		want    error
		field   string
	}{
		{"held on a send", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Held: []int{0}}, ErrInvalidSpec, "Held"},
		{"held position out of range", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: []int{16}}, layout.ErrOutOfRange, "Held"},
		{"negative held position", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: []int{-1}}, layout.ErrOutOfRange, "Held"},
		{"held position twice", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: []int{3, 3}}, layout.ErrDuplicateBlock, "Held"},
		{"every block held", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: all}, ErrNothingToMove, "Held"},
		{"held with subs", true, Spec{ID: 1, Subs: []SubSpec{{Peer: "prefill", Plan: dst.plan}}, Pool: dst.mem, Held: []int{0}}, ErrInvalidSpec, "Held"},
		{"signals on a receive", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true,
			Ready: []LayerSignal{{End: 1, Signal: sig}}}, ErrInvalidSpec, "Ready"},
		{"signals without stream", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem,
			Ready: []LayerSignal{{End: 1, Signal: sig}}}, ErrInvalidSpec, "Ready"},
		{"signal ends fall", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true,
			Ready: []LayerSignal{{End: 2, Signal: sig}, {End: 2, Signal: sig}}}, layout.ErrOutOfRange, "Ready[1].End"},
		{"signal end past the layers", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true,
			Ready: []LayerSignal{{End: 5, Signal: sig}}}, layout.ErrOutOfRange, "Ready[0].End"},
		{"nil signal", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true,
			Ready: []LayerSignal{{End: 1}}}, ErrInvalidSpec, "Ready[0].Signal"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var err error
			if c.receive {
				_, err = p.dst.Receive(bg, c.spec)
			} else {
				_, err = p.src.Send(bg, c.spec)
			}
			require.ErrorIs(t, err, c.want)
			require.ErrorIs(t, err, ErrInvalidSpec)
			var se *specError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.field, se.Field)
		})
	}

	t.Run("MarkLayersReady on handles that do not stream, and out of range", func(t *testing.T) {
		hs, err := p.src.Send(bg, Spec{ID: 20, Peer: "decode", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		require.ErrorIs(t, hs.MarkLayersReady(1), errNotStreaming)
		hr, err := p.dst.Receive(bg, Spec{ID: 20, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
		require.NoError(t, err)
		require.ErrorIs(t, hr.MarkLayersReady(1), errNotStreaming, "a receive is told by its sender")
		waitClosed(t, hr.Quiesced(), "receiver")
		require.NoError(t, hs.Release())
		require.NoError(t, hr.Release())

		h, err := p.src.Send(bg, Spec{ID: 21, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true})
		require.NoError(t, err)
		require.ErrorIs(t, h.MarkLayersReady(5), layout.ErrOutOfRange)
		require.ErrorIs(t, h.MarkLayersReady(-1), layout.ErrOutOfRange)
		require.NoError(t, h.MarkLayersReady(2))
		require.NoError(t, h.MarkLayersReady(1), "a lower mark is no error and changes nothing")
		require.Equal(t, 2, h.LayersReady())
		require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(21))
		waitClosed(t, h.Quiesced(), "cancelled send")
		require.NoError(t, h.Release())
	})

	t.Run("held positions naming another request's block count", func(t *testing.T) {
		short := newKVPool(t, streamDims, layout.LayerMajor, nil, seqBlocks(20, 15), 0)
		hs, err := p.src.Send(bg, Spec{ID: 30, Peer: "decode", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		// 15 blocks, one held: 14 move; the sender has 16, so the counts disagree.
		hr, err := p.dst.Receive(bg, Spec{ID: 30, Peer: "prefill", Plan: short.plan, Pool: short.mem, Held: []int{0}})
		require.NoError(t, err)
		waitClosed(t, hs.Quiesced(), "sender")
		waitClosed(t, hr.Quiesced(), "receiver")
		requireState(t, hs, Failed, ErrIncompatible, layout.ErrIncompatible)
		requireState(t, hr, Failed, ErrIncompatible, ErrPeerAborted)
		require.NoError(t, hs.Release())
		require.NoError(t, hr.Release())
	})
}

func TestRequestInfoExtensionRoundTripsAndStaysOptional(t *testing.T) {
	h := wire.Header{Kind: wire.KindRequestInfo, Sub: 1, Request: 77}
	shape := kvplan.Shape{Layers: 32, KVFactor: 2, Blocks: 250, Heads: 8, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}
	cases := []struct {
		desc  string
		m     wire.RequestInfo
		bytes int
	}{
		{"plain request: no extension, as before", wire.RequestInfo{Header: h, Shape: shape, ChunkBytes: 4096, Depth: 2}, wire.RequestInfoBytes},
		{"layer cut only", wire.RequestInfo{Header: h, Shape: shape, ChunkBytes: 4096, Depth: 2, Flags: wire.FlagLayerCut}, wire.RequestInfoBytes + 8},
		{"held blocks", wire.RequestInfo{Header: h, Shape: shape, ChunkBytes: 4096, Depth: 2, Held: []int{0, 1, 2, 3, 200, 255}, HeldOf: 256}, wire.RequestInfoBytes + 8 + 32},
		{"both, odd count", wire.RequestInfo{Header: h, Shape: shape, ChunkBytes: 4096, Depth: 2, Flags: wire.FlagLayerCut, Held: []int{4}, HeldOf: 5}, wire.RequestInfoBytes + 8 + 1},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			b := wire.Encode(&c.m)
			require.Len(t, b, c.bytes)
			got, err := wire.Decode(b)
			require.NoError(t, err)
			require.Equal(t, &c.m, got)
		})
	}

	bad := func(desc string, mutate func(b []byte) []byte) {
		t.Run(desc, func(t *testing.T) {
			m := wire.RequestInfo{Header: h, Shape: shape, ChunkBytes: 4096, Depth: 2, Held: []int{1}, HeldOf: 5}
			_, err := wire.Decode(mutate(wire.Encode(&m)))
			require.ErrorIs(t, err, wire.ErrMalformed)
		})
	}
	bad("unknown flag", func(b []byte) []byte { b[wire.RequestInfoBytes] |= 0x80; return b })
	bad("bit past the bitmap", func(b []byte) []byte { b[len(b)-1] |= 0x40; return b })
	bad("truncated bitmap", func(b []byte) []byte { return b[:len(b)-1] })
	bad("half an extension", func(b []byte) []byte { return b[:wire.RequestInfoBytes+4] })
	bad("count without held blocks", func(b []byte) []byte { b[len(b)-1] = 0; return b })
	bad("empty extension", func(b []byte) []byte {
		b = b[:wire.RequestInfoBytes+8]
		clear(b[wire.RequestInfoBytes:])
		return b
	})

	_, err := (&wire.RequestInfo{Header: h, Shape: shape, ChunkBytes: 4096, Depth: 2, Held: []int{3, 1}, HeldOf: 5}).AppendBinary(nil)
	require.Error(t, err, "positions must rise")
}

// TestLayerCutChunksTileEachLayer: with FlagLayerCut both sides derive chunks that tile the
// stream in order, never cross a layer boundary and never exceed the slot's payload.
func TestLayerCutChunksTileEachLayer(t *testing.T) {
	cases := []struct {
		desc  string
		dims  layout.Dims
		chunk int64
	}{
		{"layer of several chunks, not a multiple", streamDims, 984},
		{"layer smaller than a chunk", streamDims, 1 << 20},
		{"layer exactly two chunks", streamDims, 4096},
		{"one-byte elements, odd chunk", layout.Dims{NumLayers: 3, KVFactor: 1, NumHeads: 3, HeadDim: 5, ElemSize: 1, TokensPerBlock: 7, NumBlocks: 9}, 101},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			kv := newKVPool(t, c.dims, layout.BlockMajor, nil, seqBlocks(0, int32(c.dims.NumBlocks)), 0)
			x := &xfer{plan: kv.plan}
			x.setChunks(c.chunk, true)
			perLayer := kv.plan.Bytes() / c.dims.NumLayers
			next := int64(0)
			for seq := range x.nChunks {
				off, n := x.chunkRange(seq)
				require.Equal(t, next, off, "chunk %d", seq)
				require.Positive(t, n)
				require.LessOrEqual(t, n, c.chunk)
				require.Zero(t, n%c.dims.ElemSize)
				require.Equal(t, off/perLayer, (off+n-1)/perLayer, "chunk %d crosses a layer boundary", seq)
				next = off + n
			}
			require.Equal(t, kv.plan.Bytes(), next)
		})
	}
}

// TestL9_StreamDeadlineWithAHungChunkQuarantinesThenPoisons: mid-stream, a chunk hangs on
// the wire and the next layer never comes; the deadline quarantines the send (Done closes,
// memory pinned), and the slot the transport never lets go of is poisoned, never released.
func TestL9_StreamDeadlineWithAHungChunkQuarantinesThenPoisons(t *testing.T) {
	cfg := fastConfig()
	cfg.Tuning.QuarantineTimeout = 100 * time.Millisecond
	p := newPair(t, cfg, cfg)
	src, dst := streamPools(t, layout.LayerMajor)
	// The deadline runs from the first slot lease, before layer 1 moves and layer 2's chunk
	// hangs: 2s (was 300ms) so a loaded host's stall does not end the send before the waits
	// below see those.
	hs, err := p.src.Send(bg, Spec{ID: 12, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true, Timeout: 2 * time.Second})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 12, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
	require.NoError(t, err)
	require.NoError(t, hs.MarkLayersReady(1))
	eventually(t, func() bool { return hr.LayersReady() == 1 }, "first layer over")
	p.net.SetFault(dataOnly(mem.Fault{Hang: true, NeverQuiesce: true}))
	require.NoError(t, hs.MarkLayersReady(2)) // layers 3 and 4 never come
	eventually(t, func() bool { return p.net.OnWire() > 0 }, "a chunk of layer 2 hung")

	waitClosed(t, hs.Done(), "sender's outcome")
	require.ErrorIs(t, hs.Status().Err, ErrDeadline)
	waitClosed(t, hs.Quiesced(), "sender quiesced after poisoning")
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	requireState(t, hs, Failed, ErrQuarantined, ErrDeadline)
	require.Positive(t, p.src.pool.Stats().Poisoned, "the hung slot is poisoned, not released")
	require.Zero(t, p.src.pool.Stats().Leased)
	require.Equal(t, 1, hr.LayersReady(), "no later layer was reported ready")
	require.NoError(t, hs.Release())
	require.NoError(t, hr.Release())
}
