// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// TestHostMoverMatchesReference gathers and scatters every layout order, partial selections
// and odd ranges, and compares with the element-by-element reference.
func TestHostMoverMatchesReference(t *testing.T) {
	sel := layout.Selection{LayerBegin: 1, LayerEnd: 2, HeadBegin: 1, HeadEnd: 3}
	cases := []struct {
		desc string
		o    layout.Order
		sel  *layout.Selection
	}{
		{"block-major, all", layout.BlockMajor, nil},
		{"layer-major, all", layout.LayerMajor, nil},
		{"NHD, all", layout.LayerMajorNHD, nil},
		{"block-major, some layers and heads", layout.BlockMajor, &sel},
		{"NHD, some layers and heads", layout.LayerMajorNHD, &sel},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p := newKVPool(t, testDims, c.o, c.sel, blocks(5, 0, 17, 3), uint64(i+1))
			want := p.stream(t)
			m := newHostMover(p.mem)
			for _, r := range [][2]int64{{0, p.plan.Bytes()}, {3, 77}, {p.plan.Bytes() - 5, 5}, {64, 640}} {
				got := make([]byte, r[1])
				require.NoError(t, m.Gather(p.plan, r[0], got))
				require.Equal(t, want[r[0]:r[0]+r[1]], got, "gather [%d,+%d)", r[0], r[1])
				got = make([]byte, r[1]) // the cgo-free fallback agrees too
				require.NoError(t, goCopy(p.plan, p.mem, r[0], got, true))
				require.Equal(t, want[r[0]:r[0]+r[1]], got, "Go gather [%d,+%d)", r[0], r[1])
			}
			// Scatter the stream back in odd pieces into an empty pool: the same bytes land.
			q := newKVPool(t, testDims, c.o, c.sel, blocks(5, 0, 17, 3), 0)
			mq := newHostMover(q.mem)
			for off := int64(0); off < int64(len(want)); off += 37 {
				end := min(off+37, int64(len(want)))
				require.NoError(t, mq.Scatter(q.plan, want[off:end], off))
			}
			require.Equal(t, want, q.stream(t))
			g := newKVPool(t, testDims, c.o, c.sel, blocks(5, 0, 17, 3), 0)
			for off := int64(0); off < int64(len(want)); off += 41 {
				end := min(off+41, int64(len(want)))
				require.NoError(t, goCopy(g.plan, g.mem, off, want[off:end], false))
			}
			require.Equal(t, want, g.stream(t))
			require.ErrorIs(t, m.Gather(p.plan, p.plan.Bytes()-1, make([]byte, 2)), layout.ErrOutOfRange)
			require.ErrorIs(t, newHostMover(p.mem[:10]).Gather(p.plan, 0, make([]byte, 2)), layout.ErrBufferTooSmall)
		})
	}
}
