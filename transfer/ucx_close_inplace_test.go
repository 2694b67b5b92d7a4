// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// TestL1_UCXCloseWaitsForACopyReadingThePeer closes an engine, the receiver's or the sender's,
// over UCX shared memory while a receiver's copy out of the sender's memory is held mid-read:
// half of it copied, the rest not. On the pull-in-place row it is the receiver's Mover
// scattering a chunk out of the sender's slot mapped here (its Scatter held); on the
// RMA-in-place rows a range of the sender's pool copied out of its mapping here
// (Engine.peerCopy), on a mover worker (a 20 MiB request) or on the transfer's loop (4 MiB,
// copyShared); on the CMA row a process_vm_readv of the sender's caller-registered pool into
// the receiver's (ucxhooks.WrapCMAReadv). These copies take about a millisecond unheld, too
// short for closeMidTransfer to catch one running.
//
// Closing the receiver: its transport's close frees the pools it allocated, the receiver's
// among them on the in-place rows (mappedKV), and releases its registrations (the sender's
// memory mapped here stays mapped while a view holds its key, ucx.Transport.MapRemote); so
// while the copy is held Close must not return, the receiver's handle must not be quiescent (its pool is
// still being written), and on the in-place rows the transport's close must not even begin
// (Close's fence of its mover pool waits for the copy); on the CMA row it begins, and waits in
// the transport for the read (closeCMA). Closing the sender: its Close returns within its bound
// with the copy still held (nothing of the sender's waits on a peer's read), and the
// receiver's handle, told of the close, stays quarantined, not quiescent, until the copy
// returns (the abort waits for copies that read the peer, xfer.movingPeer, and its end for
// every copy, before the view of the sender's memory goes back). Then the copy goes on, the
// other engine closes, and, as closeMidTransfer checks: the process lives, every handle ends
// (terminal, or quarantined for good and poisoned), each one not done when Close began either
// completed or ends for a reason naming the close (closeEndedBy), and no slot is lost.
func TestL1_UCXCloseWaitsForACopyReadingThePeer(t *testing.T) {
	rows := []struct {
		name string
		pc   closePath
		cma  bool
		// layers: the KV's; 20 makes a request of 20 MiB, over inPlaceLoopBytes, whose ranges
		// read in place all go to the mover workers (copyInPlace); at 4 (4 MiB) its loop copies
		// some of them (copyShared). where: which copy is held, the first on a mover worker
		// or the first on a transfer's loop; "": the first.
		layers int64
		where  string
	}{
		{"pull in place", closePaths[2], false, 4, ""},
		{"RMA in place, a mover's copy", closePaths[5], false, 20, "mover"},
		{"RMA in place, the loop's copy", closePaths[5], false, 4, "loop"},
		{"CMA", closePath{name: "CMA", cfg: func(*Config) {}, path: PathRMA}, true, 4, ""},
	}
	for _, row := range rows {
		for _, closeSender := range []bool{false, true} {
			side := map[bool]string{true: "sender", false: "receiver"}[closeSender]
			t.Run(row.name+"/close the "+side, func(t *testing.T) {
				pc := row.pc
				require.True(t, strings.HasPrefix(row.name, pc.name), "the closePaths row")
				dims := layout.Dims{NumLayers: row.layers, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
				cfg := ucxTestConfig()
				cfg.SlotBytes, cfg.Tuning.PipelineDepth, cfg.Tuning.CancelGrace = 1<<20, 4, time.Microsecond
				cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
				cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
				// The receiver's Close waits up to 5/8 of CloseTimeout for the held transfer to
				// settle before its goodbye (settleBeforeGoodbye), then fences its movers within
				// 3/4 of it: 8s leaves the fence the window below, with room on a loaded host.
				cfg.CloseTimeout = 8 * time.Second
				pc.cfg(&cfg)
				read := &heldRead{entered: make(chan struct{}), release: make(chan struct{}), returned: make(chan struct{})}
				switch row.where {
				case "mover":
					read.want = onMoverWorker
				case "loop":
					read.want = func() bool { return !onMoverWorker() }
				}
				mk := func(receiver bool) (closeSide, *closeNoted, *ucxEngine) {
					var noted *closeNoted
					u := newUCXEngineOver(t, "posix,cma,self", "", cfg, func(i ucxImpl) Transport {
						noted = &closeNoted{ucxImpl: i, closing: make(chan struct{}), closed: make(chan struct{})}
						return noted
					}, func(c *ucx.Config) { c.CMAReadTimeout = time.Minute }) // a held read is not a blocked one
					if row.cma {
						ucxhooks.Hooks.AllowSameProcessCMA(u.tr) // both engines in this process
					}
					side := closeSide{e: u.e, self: u.tr.Self()}
					side.kv = func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
						if !row.cma {
							k := mappedKV(t, u, dims, layout.BlockMajor, ids, seed)
							return k.mem, k.plan
						}
						k := newUCXKV(t, dims, layout.BlockMajor, ids, seed)
						mem := mmapPool(t, len(k.mem), "anon") // registered, never mapped by a peer: process_vm_readv
						copy(mem, k.mem)
						r, err := u.tr.RegisterHost(mem)
						require.NoError(t, err)
						return r.Pool(), k.plan
					}
					if !receiver {
						return side, noted, u
					}
					switch {
					case pc.pull:
						side.mover = func(_ RequestID, pool []byte) Mover {
							return heldScatter{Mover: newHostMover(pool), pool: pool, read: read}
						}
					case row.cma:
						ucxhooks.Hooks.WrapCMAReadv(u.tr, read.wrapReadv)
					default:
						u.e.peerCopy = read.copy
					}
					return side, noted, u
				}
				src, srcNoted, _ := mk(false)
				dst, dstNoted, dstU := mk(true)
				t.Cleanup(read.let) // before the engines close (cleanups run last first), also when the test failed
				first, firstNoted, second, closer := dst.e, dstNoted, src.e, dst.self
				if closeSender {
					first, firstNoted, second, closer = src.e, srcNoted, dst.e, src.self
				}

				const transfers, nBlocks = 3, 32
				var hs, received []*Handle // hs: each Send, then its Receive
				var dmems [][]byte
				for i := range int32(transfers) {
					smem, splan := src.kv(t, seqBlocks(i*nBlocks%64, nBlocks), uint64(i+1))
					dmem, dplan := dst.kv(t, seqBlocks(64-nBlocks, nBlocks), 0)
					id := RequestID(600 + i)
					s, err := src.e.Send(bg, src.spec(Spec{ID: id, Peer: dst.self, Plan: splan}, smem))
					require.NoError(t, err)
					r, err := dst.e.Receive(bg, dst.spec(Spec{ID: id, Peer: src.self, Plan: dplan}, dmem))
					require.NoError(t, err)
					hs, received, dmems = append(hs, s, r), append(received, r), append(dmems, dmem)
				}
				waitClosed(t, read.entered, "a copy out of the sender's memory held mid-read")
				var held *Handle // the Receive whose pool the held copy writes
				for i, m := range dmems {
					if a := uintptr(unsafe.Pointer(unsafe.SliceData(m))); read.dst >= a && read.dst < a+uintptr(len(m)) {
						held = received[i]
					}
				}
				require.NotNil(t, held, "the held copy writes one of the Receives' pools")
				require.False(t, isClosed(held.Done()), "the held copy's Receive is not done")
				require.Equal(t, pc.path, held.Path(), "the held copy's Receive is on the path")
				if pc.pull {
					require.True(t, held.Pulled(), "the held copy's Receive is pulled")
					slots := dstU.tr.StagingMemory()
					a := uintptr(unsafe.Pointer(unsafe.SliceData(slots)))
					require.False(t, read.src >= a && read.src < a+uintptr(len(slots)),
						"the held scatter reads the sender's slot mapped here, not a slot of the receiver's")
				}
				at := make([]closeSeen, len(hs))
				for i, h := range hs {
					at[i] = closeSeen{done: isClosed(h.Done()), st: h.Status()}
				}

				closed := make(chan error, 1)
				go func() { closed <- first.Close() }()
				// From where the receiver's Close waits for the copy (its movers' fence, in place;
				// its transport's close, CMA), or the sender's Close returned, the copy stays held
				// a while: nothing may end under it then.
				const window = 300 * time.Millisecond
				switch {
				case closeSender:
					select {
					case err := <-closed:
						require.NoError(t, err)
					case <-time.After(cfg.CloseTimeout + 5*time.Second):
						t.Fatal("the sender's Close waited for the receiver's copy past CloseTimeout")
					}
					require.False(t, isClosed(read.returned), "the copy is still held")
				case row.cma:
					waitClosed(t, firstNoted.closing, "the receiver's transport's close began")
				default:
					eventually(t, func() bool { return moversFenced(first) }, "the receiver's Close fenced its movers")
				}
				closeReturned, trClosed := (<-chan error)(closed), (<-chan struct{})(firstNoted.closed)
				if closeSender { // both have, as they should
					closeReturned, trClosed = nil, nil
				}
				select {
				case err := <-closeReturned:
					t.Fatalf("the receiver's Close returned (%v) while a copy into its pool was held mid-read", err)
				case <-trClosed:
					t.Fatal("the receiver's transport closed while a copy into its pool was held mid-read")
				case <-held.Quiesced():
					t.Fatalf("the held copy's Receive is quiescent while its copy is held mid-read: %+v", held.Status())
				case <-time.After(window):
				}
				if !closeSender && !row.cma {
					require.False(t, isClosed(firstNoted.closing), "the receiver's transport's close began while a copy out of the sender's memory mapped there was held mid-read")
				}
				if isClosed(held.Done()) {
					require.Equal(t, Quarantined, held.Status().State, "done while its copy is held: quarantined until it returns")
				}
				read.let()
				waitClosed(t, read.returned, "the held copy returned")
				if !closeSender {
					select {
					case err := <-closed:
						require.NoError(t, err)
					case <-time.After(10 * time.Second):
						t.Fatal("the receiver's Close did not return once the copy had")
					}
				}
				waitClosed(t, held.Quiesced(), "the held copy's Receive quiescent once its copy returned")
				require.NoError(t, second.Close())
				if row.cma {
					require.NotZero(t, ucxOf(dstU.tr).CMAStats().Gets, "the reads went by process_vm_readv")
				}

				ended := 0
				for i, h := range hs {
					waitClosedWithin(t, h.Done(), "done after both engines closed", 20*time.Second)
					st := h.Status()
					require.True(t, st.State.Terminal() || st.State == Quarantined && st.BlocksPoisoned,
						"request %d ends terminal, or quarantined for good with its blocks poisoned: %+v", h.ID(), st)
					if h.Path() != PathUndecided {
						require.Equal(t, pc.path, h.Path(), "request %d", h.ID())
					}
					if at[i].done {
						require.Equal(t, Completed, at[i].st.State, "request %d ended before Close began, not completed: the path failed by itself: %v", h.ID(), at[i].st.Err)
						continue
					}
					if st.State == Completed {
						continue
					}
					ended++
					require.True(t, closeEndedBy(st.Err, h.eng == first, closer, hs[i^1].Status().Err),
						"request %d (on the engine closed %s), not done when Close began, ends %v for a reason that does not name the close: %v",
						h.ID(), map[bool]string{true: "first", false: "second"}[h.eng == first], st.State, st.Err)
				}
				if !closeSender {
					require.NotEqual(t, Completed, held.Status().State, "the receive stopped mid-copy by its engine's Close")
				}
				require.NotZero(t, ended, "Close ended none of the transfers")
				t.Logf("held copy's receive ended %v (%v); %d handles ended by Close", held.Status().State, held.Status().Err, ended)
				for _, e := range []*Engine{src.e, dst.e} {
					requireSlotsAccounted(t, e)
				}
			})
		}
	}
}

// heldRead holds the first copy out of a peer's memory that reaches it, mid-read: after the
// first half is copied, until let; dst and src are that copy's destination and source (set
// before entered closes), returned closes once its second half is copied.
type heldRead struct {
	taken    atomic.Bool
	letOnce  sync.Once
	entered  chan struct{}
	release  chan struct{}
	returned chan struct{}
	dst, src uintptr
	want     func() bool // whether the copy calling may be the one held; nil: any
}

func (r *heldRead) let() { r.letOnce.Do(func() { close(r.release) }) }

// read runs a copy from src into dst as first then rest, held between them when it is the first.
func (r *heldRead) read(dst, src uintptr, first, rest func()) {
	if r.want != nil && (r.taken.Load() || !r.want()) {
		first()
		rest()
		return
	}
	first()
	if !r.taken.CompareAndSwap(false, true) {
		rest()
		return
	}
	r.dst, r.src = dst, src
	close(r.entered)
	<-r.release
	rest()
	close(r.returned)
}

// copy is Engine.peerCopy: a range read in place, held mid-copy.
func (r *heldRead) copy(dst, src []byte) {
	h := len(dst) / 2
	r.read(uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(unsafe.Pointer(unsafe.SliceData(src))),
		func() { copy(dst[:h], src[:h]) }, func() { copy(dst[h:], src[h:]) })
}

// wrapReadv is for ucxhooks.WrapCMAReadv: a process_vm_readv of one range into one (a get's
// piece), longer than the one-byte probe, is two calls, held between them.
func (r *heldRead) wrapReadv(readv ucxhooks.CMAReadv) ucxhooks.CMAReadv {
	return func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
		if len(local) != 1 || len(remote) != 1 || local[0].Len < 2 || int(local[0].Len) != remote[0].Len {
			return readv(pid, local, remote, flags)
		}
		n := int(local[0].Len)
		h := n / 2
		var read int
		var err error
		part := func(off, k int) {
			if err != nil || read != off {
				return
			}
			l := []unix.Iovec{{Base: (*byte)(unsafe.Add(unsafe.Pointer(local[0].Base), off))}}
			l[0].SetLen(k)
			var got int
			got, err = readv(pid, l, []unix.RemoteIovec{{Base: remote[0].Base + uintptr(off), Len: k}}, flags)
			read += got
		}
		r.read(uintptr(unsafe.Pointer(local[0].Base)), remote[0].Base, func() { part(0, h) }, func() { part(h, n-h) })
		if read > 0 {
			return read, nil // a short read: the transport reads the rest
		}
		return read, err
	}
}

// heldScatter is a Mover whose scatters go in two halves, the first one held between them.
type heldScatter struct {
	Mover
	pool []byte
	read *heldRead
}

func (m heldScatter) Scatter(p *layout.Plan, src []byte, off int64) error {
	h := len(src) / 2
	var err1, err2 error
	m.read.read(uintptr(unsafe.Pointer(unsafe.SliceData(m.pool))), uintptr(unsafe.Pointer(unsafe.SliceData(src))),
		func() { err1 = m.Mover.Scatter(p, src[:h], off) }, func() { err2 = m.Mover.Scatter(p, src[h:], off+int64(h)) })
	if err1 != nil {
		return err1
	}
	return err2
}

// ScatterReadsAnyHostMemory implements anySourceScatterer, as the host mover does.
func (heldScatter) ScatterReadsAnyHostMemory() bool { return true }

// closeNoted is a UCX transport that notes when its Close begins and when it returned.
type closeNoted struct {
	ucxImpl
	once            sync.Once
	closing, closed chan struct{}
}

func (c *closeNoted) Close(force bool) error {
	first := false
	c.once.Do(func() { first = true; close(c.closing) })
	err := c.ucxImpl.Close(force)
	if first {
		close(c.closed)
	}
	return err
}

// onMoverWorker reports whether the calling goroutine is one of an engine's mover workers
// (moverPool.work), not a transfer's loop (runHere, help).
func onMoverWorker() bool {
	buf := make([]byte, 16<<10)
	return bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("(*moverPool).work("))
}

// moversFenced reports whether e's Close has fenced its mover pool.
func moversFenced(e *Engine) bool {
	e.movers.mu.Lock()
	defer e.movers.mu.Unlock()
	return e.movers.fenced
}
