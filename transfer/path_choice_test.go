// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// Where the transport emulates gets from the sender (UCX over TCP), the receiver takes tagged
// IOV messages, never asking for an offer, unless Config.Tuning.RMAWhereEmulated keeps the RMA mode;
// Path says which ran on both sides, and every byte arrives either way.
func TestRMAWhereGetsAreEmulatedTheReceiverTakesMessages(t *testing.T) {
	for _, c := range []struct {
		desc      string
		emulated  bool
		keepRMA   bool
		wantPath  Path
		wantOffer bool // the receiver asked for one, so the sender offered
	}{
		{"native gets: rma", false, false, PathRMA, true},
		{"emulated gets: direct messages", true, false, PathDirect, false},
		{"emulated gets, RMAWhereEmulated: rma", true, true, PathRMA, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := rmaPools(t, 41)
			scfg, rcfg := rmaConfig(), rmaConfig()
			rcfg.Tuning.RMAWhereEmulated = c.keepRMA
			p, w := directPair(t, scfg, rcfg, src, dst)
			p.net.Endpoint("decode").EmulateGets("prefill", c.emulated)
			offers := faultNth(p, w, wire.KindRMAOffer, "", nil)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.wantPath, hr.Path())
			require.Equal(t, c.wantPath, hs.Path())
			require.Equal(t, c.wantOffer, offers() > 0, "the sender was asked for an offer")
			want, got := make([]byte, src.plan.Bytes()), make([]byte, dst.plan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(src.plan, src.mem, want))
			require.NoError(t, layouttest.ReferenceGather(dst.plan, dst.mem, got))
			require.Equal(t, want, got, "every byte")
			_, ops := w.total()
			require.Positive(t, ops)
		})
	}
}

// A transport that stripes gets over lanes (RMALanes) gets a small request cut so every lane
// has two gets, never under 1 MiB; one lane keeps DirectChunkBytes. Eight consecutive 1 MiB
// blocks on both sides are one 8 MiB range.
func TestRMAGetsCutForLanes(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 128, NumBlocks: 24}
	for _, c := range []struct{ lanes, wantGets int }{{1, 1}, {2, 4}, {4, 8}, {16, 8}} {
		t.Run(fmt.Sprintf("lanes=%d", c.lanes), func(t *testing.T) {
			src := newKVPool(t, dims, layout.BlockMajor, nil, blocks(1, 2, 3, 4, 5, 6, 7, 8), 3)
			dst := newKVPool(t, dims, layout.BlockMajor, nil, blocks(11, 12, 13, 14, 15, 16, 17, 18), 0)
			cfg := rmaConfig()
			cfg.Tuning.DirectChunkBytes = 64 << 20
			p, w := directPair(t, cfg, cfg, src, dst)
			p.net.Endpoint("decode").SetGetLanes(c.lanes)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			require.Equal(t, PathRMA, hr.Path())
			want, got := make([]byte, src.plan.Bytes()), make([]byte, dst.plan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(src.plan, src.mem, want))
			require.NoError(t, layouttest.ReferenceGather(dst.plan, dst.mem, got))
			require.Equal(t, want, got, "every byte")
			bytes, gets := w.total()
			require.Equal(t, len(want), bytes)
			require.Equal(t, c.wantGets, gets)
		})
	}
}

// A receiver whose pool holds the stream in pieces under Config.Tuning.DirectMinRunBytes (a
// token-major layout: one row of one head per piece) takes staging, which moves such pieces
// faster than IOV entries; with pieces at least that long, or the bound off (None), it takes the
// direct path. Path says which ran on both sides, and every byte arrives either way.
func TestDirectLeavesPiecesUnderDirectMinRunBytesToStaging(t *testing.T) {
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 32, ElemSize: 2, TokensPerBlock: 8, NumBlocks: 8}
	row := dims.HeadDim * dims.ElemSize // 64 bytes: the NHD layout's piece
	for _, c := range []struct {
		desc     string
		dstOrder layout.Order
		minRun   int64
		want     Path
	}{
		{"NHD pieces under the default bound: staging", layout.LayerMajorNHD, 0, PathStaging},
		{"NHD pieces, bound off: direct", layout.LayerMajorNHD, tuning.None, PathDirect},
		{"NHD pieces at the bound: direct", layout.LayerMajorNHD, row, PathDirect},
		{"NHD pieces one byte under the bound: staging", layout.LayerMajorNHD, row + 1, PathStaging},
		{"block-major pieces (2 KiB) at the default bound: direct", layout.BlockMajor, 0, PathDirect},
		{"block-major pieces one byte under the bound: staging", layout.BlockMajor, row*dims.NumHeads*dims.TokensPerBlock + 1, PathStaging},
		{"block-major pieces at the bound: direct", layout.BlockMajor, row * dims.NumHeads * dims.TokensPerBlock, PathDirect},
	} {
		t.Run(c.desc, func(t *testing.T) {
			src := newKVPool(t, dims, layout.BlockMajor, nil, blocks(1, 2, 3), 17)
			dst := newKVPool(t, dims, c.dstOrder, nil, blocks(4, 5, 6), 0)
			scfg, rcfg := directConfig(), directConfig()
			rcfg.Tuning.DirectMinRunBytes = c.minRun
			p, _ := directPair(t, scfg, rcfg, src, dst)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.want, hr.Path())
			require.Equal(t, c.want, hs.Path())
			want, got := make([]byte, src.plan.Bytes()), make([]byte, dst.plan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(src.plan, src.mem, want))
			require.NoError(t, layouttest.ReferenceGather(dst.plan, dst.mem, got))
			require.Equal(t, want, got, "every byte")
		})
	}
}
