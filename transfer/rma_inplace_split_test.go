// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// splitForLanes: a short request's large ranges are cut into ranges of inPlacePieceBytes that
// its loop and movers share (copyShared), or of inPlaceCrowdedPieceBytes while other copies run
// (crowded), a large request's so every lane has a job, crowded or not; the
// pieces cover exactly the ranges' bytes, in order, each inside its range (so the offer's and
// a one-hop read's checks hold for it); ranges too small to cut are left whole, and no job
// exceeds inPlaceBatchBytes.
func TestRMAInPlace_SplitForLanes(t *testing.T) {
	cases := []struct {
		desc      string
		gets      []rmaRegion
		lanes     int
		crowded   bool
		wantN     int
		wantBatch int64
	}{
		{"one 32-token block (4 MiB), two lanes: ranges of inPlacePieceBytes", []rmaRegion{{src: 1 << 30, dst: 8 << 20, n: 4 << 20}}, 2, false, 16, inPlacePieceBytes},
		{"one 4 MiB range, four lanes: ranges of inPlacePieceBytes", []rmaRegion{{src: 0, dst: 0, n: 4 << 20}}, 4, false, 16, inPlacePieceBytes},
		{"one lane: whole", []rmaRegion{{src: 0, dst: 4096, n: 4 << 20}}, 1, false, 1, 4 << 20},
		{"one block's layer (128 KiB): one range", []rmaRegion{{src: 64 << 10, dst: 0, n: 128 << 10}}, 2, false, 1, inPlacePieceBytes},
		{"many small ranges: left whole", []rmaRegion{{0, 0, 64 << 10}, {1 << 20, 1 << 20, 64 << 10}, {3 << 20, 2 << 20, 64 << 10}}, 2, false, 3, inPlacePieceBytes},
		{"a short request's largest (inPlaceLoopBytes), two lanes: ranges of inPlacePieceBytes", []rmaRegion{{0, 0, 10 << 20}, {20 << 20, 10 << 20, 6 << 20}}, 2, false, 64, inPlacePieceBytes},
		{"a 512 MiB request: jobs of inPlaceBatchBytes", []rmaRegion{{0, 0, 200 << 20}, {300 << 20, 200 << 20, 312 << 20}}, 2, false, 25 + 39, inPlaceBatchBytes},
		{"a large request, one lane: jobs of inPlaceBatchBytes", []rmaRegion{{0, 0, 20 << 20}}, 1, false, 3, inPlaceBatchBytes},
		{"an odd size: the last piece ends where the range does", []rmaRegion{{src: 100, dst: 200, n: 3<<20 + 6}}, 2, false, 13, inPlacePieceBytes},
		{"a large odd size: pieces end where the range does", []rmaRegion{{src: 100, dst: 200, n: 17<<20 + 6}}, 2, false, 3, inPlaceBatchBytes},
		{"one 32-token block, two lanes, crowded: ranges of inPlaceCrowdedPieceBytes", []rmaRegion{{src: 1 << 30, dst: 8 << 20, n: 4 << 20}}, 2, true, 4, inPlaceCrowdedPieceBytes},
		{"a short request's largest, crowded: ranges of inPlaceCrowdedPieceBytes", []rmaRegion{{0, 0, 10 << 20}, {20 << 20, 10 << 20, 6 << 20}}, 2, true, 16, inPlaceCrowdedPieceBytes},
		{"one block's layer (128 KiB), crowded: one range", []rmaRegion{{src: 64 << 10, dst: 0, n: 128 << 10}}, 2, true, 1, inPlaceCrowdedPieceBytes},
		{"one lane, crowded: whole", []rmaRegion{{src: 0, dst: 4096, n: 4 << 20}}, 1, true, 1, 4 << 20},
		{"a 512 MiB request, crowded: jobs of inPlaceBatchBytes", []rmaRegion{{0, 0, 200 << 20}, {300 << 20, 200 << 20, 312 << 20}}, 2, true, 25 + 39, inPlaceBatchBytes},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got, batch := splitForLanes(c.gets, c.lanes, c.crowded)
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
			x := &xfer{eng: &Engine{}, pool: make([]byte, len(src))}
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

// help (a transfer's loop copying its own queued jobs instead of waiting for a worker) takes
// back only its transfer's copies that no worker has begun, runs them on the caller and reports
// each through the mailbox; another transfer's copy stays queued for the workers, and after
// fence there is nothing left to take (fence refused every queued copy).
func TestMoverPool_HelpTakesBackOnlyItsOwnUnbegunCopies(t *testing.T) {
	p := newMoverPool()
	p.limit = 1
	defer p.close()
	g := newGate(t)
	p.submit(&xfer{receive: true, mover: gateMover{g}}, &opRec{}) // the only worker, held
	waitClosed(t, g.entered, "the worker held")

	src := []byte("0123456789abcdef")
	x := &xfer{eng: &Engine{}, pool: make([]byte, len(src))}
	y := &xfer{eng: &Engine{}, pool: make([]byte, len(src))}
	x1 := &opRec{buf: src, batch: []rmaRegion{{src: 0, dst: 0, n: 4}}}
	yr := &opRec{buf: src, batch: []rmaRegion{{src: 8, dst: 8, n: 8}}}
	x2 := &opRec{buf: src, batch: []rmaRegion{{src: 4, dst: 4, n: 4}}}
	p.submit(x, x1)
	p.submit(y, yr)
	p.submit(x, x2)
	p.help(x)
	evs := x.box.Take(nil)
	require.Len(t, evs, 2)
	require.Same(t, x2, evs[0].op, "the last queued first")
	require.Same(t, x1, evs[1].op)
	require.Equal(t, []byte("01234567"), x.pool[:8])
	require.Empty(t, y.box.Take(nil), "another transfer's copy is not taken")

	g.let()
	eventually(t, func() bool { return y.box.Len() == 1 }, "the worker copied the other transfer's job")
	require.Equal(t, []byte("89abcdef"), y.pool[8:])
	require.Zero(t, p.fence(context.Background()))
	p.help(x) // nothing queued, fenced: returns at once
	require.Empty(t, x.box.Take(nil))
}
