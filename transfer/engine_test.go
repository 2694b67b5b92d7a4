// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// TestTransferMovesTheStream moves a request between pools of different orders, with the
// sender or the receiver called first, through slots smaller than the stream.
func TestTransferMovesTheStream(t *testing.T) {
	cases := []struct {
		desc          string
		srcOrd, dstOr layout.Order
		receiveFirst  bool
		slot          int64
	}{
		{"send first, same order", layout.BlockMajor, layout.BlockMajor, false, 1024},
		{"receive first, block-major to layer-major", layout.BlockMajor, layout.LayerMajor, true, 1024},
		{"send first, to NHD, slot smaller than a block", layout.LayerMajor, layout.LayerMajorNHD, false, 200},
		{"one chunk", layout.BlockMajor, layout.LayerMajorNHD, true, 1 << 20},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.SlotBytes = c.slot
			p := newPair(t, cfg, cfg)
			src := newKVPool(t, testDims, c.srcOrd, nil, blocks(3, 9, 1, 40), uint64(i+1))
			dst := newKVPool(t, testDims, c.dstOr, nil, blocks(7, 0, 63, 12), 0)
			id := RequestID(100 + i)
			var hs, hr *Handle
			var err error
			if c.receiveFirst {
				hr, err = p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
			}
			hs, err = p.src.Send(bg, Spec{ID: id, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			if !c.receiveFirst {
				hr, err = p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
			}
			for _, h := range []*Handle{hs, hr} {
				waitClosed(t, h.Quiesced(), "quiesced")
				st := h.Status()
				require.Equal(t, Completed, st.State, "%v", st.Err)
				require.NoError(t, st.Err)
				require.Equal(t, src.plan.Bytes(), st.Bytes)
				require.Equal(t, st.Total, st.Bytes)
			}
			require.Equal(t, src.stream(t), dst.stream(t))
		})
	}
}
