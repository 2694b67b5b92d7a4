// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

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
			p := newPair(t, cfg, cfg)
			for _, ep := range []string{"prefill", "decode"} {
				p.net.Endpoint(Peer(ep)).MapPeers(tc.mapping)
			}
			p.net.Endpoint("prefill").AllowDirect(src.mem)
			p.net.Endpoint("decode").AllowDirect(dst.mem)
			k := countKinds(p, nil)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receive quiesced")
			waitClosed(t, hs.Quiesced(), "send quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, tc.want, hr.Path())
			require.Equal(t, src.stream(t), dst.stream(t))
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
