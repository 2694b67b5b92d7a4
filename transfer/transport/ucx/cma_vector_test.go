// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/transfer/internal/vectorget"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// strided cuts n bytes into pieces of piece bytes, every other one of a span twice as wide
// when gaps: what a TP=2 rank's half of a token's heads is in a TP=1 layer-major-nhd pool.
// It returns each piece's offset.
func strided(n, piece int, gaps bool) []int {
	step := piece
	if gaps {
		step *= 2
	}
	var offs []int
	for off := 0; off+piece <= n; off += step {
		offs = append(offs, off)
	}
	return offs
}

// vectorGet posts one vector get from a's pool (pieces at srcOffs of piece bytes) into dst
// (pieces at dstOffs) on b, and returns its id and error.
func vectorGet(t *testing.T, a, b *ucxTransport, rb *ucxRecorder, pool []byte, srcOffs []int, dst []byte, dstOffs []int, piece int) (transport.OpID, error) {
	t.Helper()
	addr, key, err := a.RMAKey(pool)
	require.NoError(t, err)
	src := make([]vectorget.Range, len(srcOffs))
	for i, o := range srcOffs {
		src[i] = vectorget.Range{Addr: addr + uint64(o), Len: piece}
	}
	d := make([][]byte, len(dstOffs))
	for i, o := range dstOffs {
		d[i] = dst[o : o+piece : o+piece]
	}
	require.True(t, b.vectorGets(a.Self(), key), "the route is proven")
	return post(t, rb, func(done func(transport.Completion)) (transport.OpID, error) {
		return b.postGetVector(a.Self(), transport.Tag{Request: 9, Seq: 1}, key, src, d, done)
	})
}

// A vector get reads every piece of a strided source into a strided destination, byte i of
// the one to byte i of the other, in one operation over process_vm_readv: more pieces than
// one call's iovecs take (1024) and more bytes than one piece of the read bound (4 MiB), from
// a registered pool and from one UCX allocated (which UCX maps, and whose plain gets stay
// UCX's); bytes between the destination's pieces stay untouched. The kernel stopping short
// (a partial read at an iovec's end) is read on from there.
func TestUCXCMA_VectorGetsReadEveryPiece(t *testing.T) {
	const n, piece = 12 << 20, 1 << 10
	for _, c := range []struct {
		desc               string
		allocated, partial bool
		srcGaps, dstGaps   bool
	}{
		{"registered, TP=2 half into a TP=1 pool", false, false, false, true},
		{"registered, TP=1 pool's half out", false, false, true, false},
		{"registered, both strided", false, false, true, true},
		{"allocated, TP=2 half into a TP=1 pool", true, false, false, true},
		{"registered, the kernel stops short", false, true, true, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			var readv func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error)
			var calls, short int
			var mu sync.Mutex
			readv = func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
				mu.Lock()
				calls++
				mu.Unlock()
				require.LessOrEqual(t, len(local), cmaIOVMax)
				require.LessOrEqual(t, len(remote), cmaIOVMax)
				if c.partial && len(remote) > 1 { // as the kernel does at a fault: up to an iovec's end
					mu.Lock()
					short++
					mu.Unlock()
					remote = remote[:len(remote)/2]
				}
				return unix.ProcessVMReadv(pid, local, remote, flags)
			}
			a, b, rb, pool, dst := cmaPair(t, 2*n, readv)
			if c.allocated {
				var err error
				pool, err = a.AllocatePool(2 * n)
				require.NoError(t, err)
				fill(pool, 9)
			}
			for i := range dst {
				dst[i] = 0xEE
			}
			srcOffs, dstOffs := strided(2*n, piece, c.srcGaps), strided(2*n, piece, c.dstGaps)
			k := min(len(srcOffs), len(dstOffs))
			srcOffs, dstOffs = srcOffs[:k], dstOffs[:k]
			id, err := vectorGet(t, a, b, rb, pool, srcOffs, dst, dstOffs, piece)
			require.NoError(t, err)
			cs := awaitCMAFinal(t, rb, id)
			require.Len(t, cs, 1)
			require.NoError(t, cs[0].Err)
			require.Equal(t, transport.MemoryDone, cs[0].Memory)
			require.Equal(t, k*piece, cs[0].Bytes)
			want := make([]byte, len(dst))
			for i := range want {
				want[i] = 0xEE
			}
			for i := range k {
				copy(want[dstOffs[i]:dstOffs[i]+piece], pool[srcOffs[i]:srcOffs[i]+piece])
			}
			require.Equal(t, want, dst, "every piece where it belongs, nothing else written")
			st := b.CMAStats()
			require.Equal(t, uint64(1), st.Gets)
			require.Equal(t, uint64(k*piece), st.Bytes)
			mu.Lock()
			require.Greater(t, calls, k/cmaIOVMax, "at most %d iovecs a call", cmaIOVMax)
			if c.partial {
				require.NotZero(t, short)
			}
			mu.Unlock()
			b.mu.Lock()
			require.Empty(t, b.ops)
			mem, _, err := b.regionLocked(dst)
			require.NoError(t, err)
			require.Zero(t, mem.InUse(), "the region's hold released")
			b.mu.Unlock()
		})
	}
}

// A vector get whose lists disagree, or whose pieces are not all in one registered region, is
// refused before anything is read.
func TestUCXCMA_VectorGetsRefuseBadLists(t *testing.T) {
	a, b, rb, pool, dst := cmaPair(t, 1<<20, nil)
	addr, key, err := a.RMAKey(pool)
	require.NoError(t, err)
	require.True(t, b.vectorGets(a.Self(), key))
	other := make([]byte, 4096) // Go memory: no registered region
	for _, c := range []struct {
		desc string
		src  []vectorget.Range
		dst  [][]byte
	}{
		{"totals differ", []vectorget.Range{{Addr: addr, Len: 4096}}, [][]byte{dst[:2048]}},
		{"an empty range", []vectorget.Range{{Addr: addr, Len: 0}, {Addr: addr, Len: 4096}}, [][]byte{dst[:4096]}},
		{"a piece outside every region", []vectorget.Range{{Addr: addr, Len: 8192}}, [][]byte{dst[:4096], other}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			clear(dst)
			_, err := post(t, rb, func(done func(transport.Completion)) (transport.OpID, error) {
				return b.postGetVector(a.Self(), transport.Tag{Request: 9, Seq: 1}, key, c.src, c.dst, done)
			})
			require.Error(t, err)
			require.Equal(t, make([]byte, len(dst)), dst, "nothing read")
		})
	}
	require.Zero(t, b.CMAStats().Gets)
}

// Cancel while a vector get's process_vm_readv runs reports MemoryBusy at once and the final
// completion when the piece returns; no further piece is read, and nothing is left behind.
func TestUCXCMA_VectorGetCancelWhileReading(t *testing.T) {
	const n, piece = 12 << 20, 1 << 10
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls int
	var mu sync.Mutex
	a, b, rb, pool, dst := cmaPair(t, 2*n, func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
		if remote[0].Len > 1 { // not the route's one-byte probe
			mu.Lock()
			calls++
			mu.Unlock()
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
		return unix.ProcessVMReadv(pid, local, remote, flags)
	})
	offs := strided(2*n, piece, true)
	id, err := vectorGet(t, a, b, rb, pool, offs, dst, offs, piece)
	require.NoError(t, err)
	waitEntered(t, entered)
	b.Cancel(id)
	require.Eventually(t, func() bool { return len(rb.reportsOf(id)) == 1 }, 10*time.Second, time.Millisecond)
	busy := rb.reportsOf(id)[0]
	require.Equal(t, transport.MemoryBusy, busy.Memory)
	require.ErrorIs(t, busy.Err, transport.ErrCancelled)
	close(release)
	cs := awaitCMAFinal(t, rb, id)
	require.Len(t, cs, 2)
	require.Equal(t, transport.MemoryDone, cs[1].Memory)
	require.ErrorIs(t, cs[1].Err, transport.ErrCancelled, "stopped after its piece")
	mu.Lock()
	require.LessOrEqual(t, calls, cmaPieceBytes/(cmaIOVMax*piece), "no call past the first piece")
	mu.Unlock()
	b.mu.Lock()
	require.Empty(t, b.ops)
	b.mu.Unlock()
	require.Zero(t, b.CMAStats().Gets)
}
