// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// splitForLanes: a short request's one large range is cut so every lane copies a share; the
// pieces cover exactly the ranges' bytes, in order, each inside its range (so the offer's and a
// one-hop read's checks hold for it); ranges too small to share are left whole, and no job
// exceeds inPlaceBatchBytes.
func TestRMAInPlace_SplitForLanes(t *testing.T) {
	cases := []struct {
		desc      string
		gets      []rmaRegion
		lanes     int
		wantN     int
		wantBatch int64
	}{
		{"one 32-token block (4 MiB), two lanes: two jobs", []rmaRegion{{src: 1 << 30, dst: 8 << 20, n: 4 << 20}}, 2, 2, 2 << 20},
		{"one 4 MiB range, four lanes: four jobs", []rmaRegion{{src: 0, dst: 0, n: 4 << 20}}, 4, 4, 1 << 20},
		{"one lane: whole", []rmaRegion{{src: 0, dst: 4096, n: 4 << 20}}, 1, 1, 4 << 20},
		{"one block's layer (128 KiB): too small to share", []rmaRegion{{src: 64 << 10, dst: 0, n: 128 << 10}}, 2, 1, inPlaceSplitMin},
		{"many small ranges: left whole, batched", []rmaRegion{{0, 0, 64 << 10}, {1 << 20, 1 << 20, 64 << 10}, {3 << 20, 2 << 20, 64 << 10}}, 2, 3, inPlaceSplitMin},
		{"a 512 MiB request: jobs of inPlaceBatchBytes", []rmaRegion{{0, 0, 200 << 20}, {300 << 20, 200 << 20, 312 << 20}}, 2, 25 + 39, inPlaceBatchBytes},
		{"an odd size: pieces end where the range does", []rmaRegion{{src: 100, dst: 200, n: 3<<20 + 6}}, 2, 2, 1572864 + 4096 - 1572864%4096},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got, batch := splitForLanes(c.gets, c.lanes)
			require.Equal(t, c.wantBatch, batch)
			require.Len(t, got, c.wantN)
			i := 0
			for _, g := range c.gets {
				at := int64(0)
				for at < g.n {
					p := got[i]
					require.Equal(t, g.src+at, p.src, "piece %d", i)
					require.Equal(t, g.dst+at, p.dst, "piece %d", i)
					require.Positive(t, p.n)
					require.LessOrEqual(t, p.n, batch)
					at += p.n
					i++
				}
				require.Equal(t, g.n, at, "the pieces of a range cover it exactly")
			}
			require.Equal(t, len(got), i)
		})
	}
}

// runHere (a short in-place read copied on its transfer's own loop) is fenced as a mover's
// copy is: before fence it copies and reports through the mailbox; after it, the copy is
// refused untouched (errCopyRefused), so Engine.Close never unmaps memory under it.
func TestMoverPool_RunHereIsFenced(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		t.Run(map[bool]string{false: "before fence: copied", true: "after fence: refused"}[fenced], func(t *testing.T) {
			p := newMoverPool()
			defer p.close()
			if fenced {
				require.Zero(t, p.fence(context.Background()))
			}
			src := []byte("0123456789abcdef")
			x := &xfer{pool: make([]byte, len(src))}
			rec := &opRec{buf: src, batch: []rmaRegion{{src: 4, dst: 0, n: 8}}}
			p.runHere(x, rec)
			evs := x.box.Take(nil)
			require.Len(t, evs, 1)
			require.True(t, evs[0].moved)
			require.Same(t, rec, evs[0].op)
			if fenced {
				require.ErrorIs(t, rec.moveErr, errCopyRefused)
				require.Equal(t, make([]byte, len(src)), x.pool, "a refused copy touches nothing")
				return
			}
			require.NoError(t, rec.moveErr)
			require.Equal(t, []byte("456789ab"), x.pool[:8])
			require.Zero(t, p.fence(context.Background()), "no copy left running")
		})
	}
}
