// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
)

// Where the transport maps the sender's offered pool into this process, the RMA receiver
// copies the ranges itself: every byte arrives, no get carries one (only the read of the
// generation word), the path is still RMA, and the sender's exposure ends with the receiver's
// Done. With DisableInPlaceReads, or a transport that maps nothing, the ranges are gets.
func TestRMAReadsTheOfferedPoolInPlace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mapping bool
		off     bool
		inPlace bool
		convert bool // block-major to layer-major: 256-byte ranges
		want    Path
	}{
		{name: "mapped", mapping: true, inPlace: true, want: PathRMA},
		{name: "mapped, DisableInPlaceReads", mapping: true, off: true, want: PathRMA},
		{name: "not mapped", mapping: false, want: PathRMA},
		{name: "conversion, mapped: small ranges in place", mapping: true, inPlace: true, convert: true, want: PathRMA},
		{name: "conversion, not mapped: IOV messages", convert: true, want: PathDirect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := rmaConfig()
			cfg.Tuning.DisableInPlaceReads = tc.off
			src, dst := rmaPools(t, 71)
			if tc.convert {
				cfg.Tuning.RMAMinRegionBytes, cfg.Tuning.InPlaceMinRegionBytes = 64<<10, 128
				src, dst = pools(t, 71)
			}
			p, k := runMappedPair(t, cfg, tc.mapping, src, dst, tc.want)
			if tc.want != PathRMA {
				return
			}
			require.Equal(t, 1, k.count(genRead), "the generation word read after the ranges")
			if tc.inPlace {
				require.Zero(t, k.count(wire.KindData), "a range read with a get")
			} else {
				require.NotZero(t, k.count(wire.KindData))
			}
			require.Zero(t, p.net.Pending())
		})
	}
}

// runMappedPair moves request 1 from src to dst over a mem pair with both ends' pools allowed
// direct, the peers' pools mapped here or not: both ends complete, on path want, with every
// byte. It returns the pair and the count of what crossed the wire.
func runMappedPair(t *testing.T, cfg Config, mapping bool, src, dst *kvPool, want Path) (*pair, *kindCounter) {
	t.Helper()
	p := newPair(t, cfg, cfg)
	for _, ep := range []string{"prefill", "decode"} {
		p.net.Endpoint(Peer(ep)).MapPeers(mapping)
	}
	p.net.Endpoint("prefill").AllowDirect(src.mem)
	p.net.Endpoint("decode").AllowDirect(dst.mem)
	k := countKinds(p, nil)
	hs, hr := p.start(t, 1, src, dst)
	waitClosed(t, hr.Quiesced(), "receive quiesced")
	waitClosed(t, hs.Quiesced(), "send quiesced")
	requireState(t, hr, Completed)
	requireState(t, hs, Completed)
	require.Equal(t, want, hr.Path())
	require.Equal(t, src.stream(t), dst.stream(t), "every byte")
	return p, k
}

// A receiver reading a short request in place copies it on its own loop, sharing its ranges
// with as many movers as the transport has lanes (copyShared): with the engine's only mover
// worker held by another copy, a 1 MiB request read in place still completes, every byte, over
// one lane or several. The movers' shares no worker began come back empty, and the request
// completes only once every one is back (no copy counted as running, none reading the
// sender's pool), with the generation word read once, after the last range.
func TestRMAInPlaceReadCopiesOnItsLoopWhileTheWorkersAreBusy(t *testing.T) {
	for _, lanes := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("%d lanes", lanes), func(t *testing.T) {
			dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
			src := newKVPool(t, dims, layout.BlockMajor, nil, blocks(1, 2, 3, 4), 81) // 256 KiB blocks
			dst := newKVPool(t, dims, layout.BlockMajor, nil, blocks(4, 5, 6, 7), 0)
			p := newPair(t, rmaConfig(), rmaConfig())
			for _, ep := range []string{"prefill", "decode"} {
				p.net.Endpoint(Peer(ep)).MapPeers(true)
			}
			p.net.Endpoint("decode").SetGetLanes(lanes)
			p.net.Endpoint("prefill").AllowDirect(src.mem)
			p.net.Endpoint("decode").AllowDirect(dst.mem)
			k := countKinds(p, nil)

			movers := p.dst.movers
			movers.mu.Lock()
			movers.limit = 1 // one worker, held below
			movers.mu.Unlock()
			g := newGate(t)
			held := &xfer{receive: true, mover: gateMover{g}}
			movers.submit(held, &opRec{})
			waitClosed(t, g.entered, "the only worker held by another copy")

			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receive quiesced while the worker was held")
			requireState(t, hr, Completed)
			require.Equal(t, PathRMA, hr.Path())
			require.Equal(t, src.stream(t), dst.stream(t))
			x := hr.subs[0]
			require.Zero(t, x.moving, "a copy still counted as running")
			require.Zero(t, x.movingPeer, "a copy still counted as reading the sender's pool")
			require.Equal(t, 1, k.count(genRead), "the generation word read once")
			g.let()
			waitClosed(t, hs.Quiesced(), "send quiesced")
			requireState(t, hs, Completed)
		})
	}
}

// gateMover's Scatter waits at its gate and copies nothing.
type gateMover struct{ *gate }

func (gateMover) Gather(*layout.Plan, int64, []byte) error { return nil }
func (m gateMover) Scatter(*layout.Plan, []byte, int64) error {
	m.stick()
	return nil
}
