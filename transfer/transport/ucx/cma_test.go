// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/cmastats"
	"github.com/kvxfer/kvxfer/transfer/internal/vectorget"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/transporttest"
)

// mmapRegion maps n bytes outside Go, as a serving process maps its KV cache, unmapped when
// the test ends (after the transports' Close, which unregisters what is still registered:
// call it before making them).
func mmapRegion(t testing.TB, n int) []byte {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	return mem
}

// registered registers mem with tr and returns the pool.
func registered(t testing.TB, tr *ucxTransport, mem []byte) []byte {
	t.Helper()
	r, err := tr.RegisterHost(mem)
	require.NoError(t, err)
	return r.Pool()
}

// cmaGet posts one get of len(dst) bytes at off of a's pool into dst from b, and returns its id.
func cmaGet(t *testing.T, a, b *ucxTransport, rb *ucxRecorder, pool []byte, off int, dst []byte) transport.OpID {
	t.Helper()
	addr, key, err := a.RMAKey(pool)
	require.NoError(t, err)
	id, err := post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.PostGet(a.Self(), transport.Tag{Request: 7, Seq: 1}, key, addr+uint64(off), dst, d)
	})
	require.NoError(t, err)
	return id
}

// awaitCMAFinal waits for op id's final completion and returns every report it had.
func awaitCMAFinal(t *testing.T, rb *ucxRecorder, id transport.OpID) []transport.Completion {
	t.Helper()
	require.Eventually(t, func() bool { return finals(rb.reportsOf(id)) == 1 }, 10*time.Second, time.Millisecond)
	return rb.reportsOf(id)
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>11)
	}
}

// A get from a pool the peer registered (not allocated) over shared memory is read with
// process_vm_readv, every byte; from a pool UCX allocated it stays a UCX get (posix maps it),
// and over TCP (no cma entry in the peer's address) too.
func TestUCXCMA_RegisteredPoolsReadByProcessVMReadv(t *testing.T) {
	const n, off = 4<<20 + 4096, 1000
	for _, c := range []struct {
		desc      string
		tls, dev  string
		allocated bool
		wantCMA   bool
	}{
		{"shm, registered pool", "posix,cma,self", "", false, true},
		{"shm, allocated pool", "posix,cma,self", "", true, false},
		{"tcp, registered pool", "tcp,self", "lo", false, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			srcMem, dstMem := mmapRegion(t, n), mmapRegion(t, n)
			a, b, _, rb := newUCXPair(t, c.tls, c.dev)
			b.cma.allowSelf = true // both ends in this process; cma_peer_test.go has two
			pool := registered(t, a, srcMem)
			if c.allocated {
				var err error
				pool, err = a.AllocatePool(n)
				require.NoError(t, err)
			}
			fill(pool, 3)
			dst := registered(t, b, dstMem)[:n-off]
			id := cmaGet(t, a, b, rb, pool, off, dst)
			cs := awaitCMAFinal(t, rb, id)
			require.Len(t, cs, 1)
			require.NoError(t, cs[0].Err)
			require.Equal(t, transport.MemoryDone, cs[0].Memory)
			require.Equal(t, n-off, cs[0].Bytes)
			require.Equal(t, pool[off:], dst, "every byte")
			st := b.CMAStats()
			if c.wantCMA {
				require.Equal(t, cmastats.Stats{Gets: 1, Bytes: n - off}, st)
			} else {
				require.Zero(t, st.Gets)
			}
		})
	}
}

// cmaPair is a shared-memory pair whose a exposes a registered pool of n bytes (filled) and
// whose b reads into a registered buffer, its process_vm_readv replaced by readv (before the
// first get) when not nil.
func cmaPair(t *testing.T, n int, readv func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)) (a, b *ucxTransport, rb *ucxRecorder, pool, dst []byte) {
	t.Helper()
	srcMem, dstMem := mmapRegion(t, n), mmapRegion(t, n)
	a, b, _, rb = newUCXPair(t, "posix,cma,self", "")
	pool, dst = registered(t, a, srcMem), registered(t, b, dstMem)
	fill(pool, 9)
	b.cma.allowSelf = true // both ends in this process; cma_peer_test.go has two
	if readv != nil {
		b.cma.readv = readv
	}
	return a, b, rb, pool, dst
}

// The kernel refusing process_vm_readv (EPERM: Yama's ptrace_scope, another user) at the
// first read of a key leaves that key to UCX: its gets complete through UCX's emulation,
// every byte, and the refusal is counted once, not asked again per get.
func TestUCXCMA_RefusedFallsBackToUCX(t *testing.T) {
	calls := 0
	var mu sync.Mutex
	a, b, rb, pool, dst := cmaPair(t, 1<<20, func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return -1, unix.EPERM
	})
	for i := range 3 {
		clear(dst)
		id := cmaGet(t, a, b, rb, pool, 0, dst)
		cs := awaitCMAFinal(t, rb, id)
		require.NoError(t, cs[len(cs)-1].Err, "get %d", i)
		require.Equal(t, pool, dst, "every byte, get %d", i)
	}
	require.Equal(t, cmastats.Stats{Refused: 1}, b.CMAStats())
	mu.Lock()
	require.Equal(t, 1, calls, "asked once per key")
	mu.Unlock()
}

// blockingReadv lets the one-byte first read through and holds every other read until
// release closes, saying on entered when one began.
func blockingReadv(entered chan<- struct{}, release <-chan struct{}) func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error) {
	return func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
		if remote[0].Len > 1 {
			entered <- struct{}{}
			<-release
		}
		return unix.ProcessVMReadv(pid, local, remote, flags)
	}
}

// waitEntered waits, bounded, for a held read to begin.
func waitEntered(t *testing.T, entered <-chan struct{}) {
	t.Helper()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no get reached process_vm_readv")
	}
}

// Cancel while process_vm_readv runs reports MemoryBusy at once, as a UCX get does, and the
// final completion (MemoryDone) once the read returned; nothing is left in the transport.
func TestUCXCMA_CancelWhileReadingReportsBusyThenFinal(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	a, b, rb, pool, dst := cmaPair(t, 1<<20, blockingReadv(entered, release))
	id := cmaGet(t, a, b, rb, pool, 0, dst)
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
	require.Equal(t, pool, dst, "the read that ran to its end")
	b.mu.Lock()
	require.Empty(t, b.ops)
	b.mu.Unlock()
}

// A peer gone under the read (ESRCH) fails the get as a lost peer, a bad remote range
// (EFAULT) as a bad region; each is final, the region is free again and no op is left.
func TestUCXCMA_FailedReadsFailTheGet(t *testing.T) {
	for _, c := range []struct {
		desc string
		err  error
		want error
	}{
		{"peer gone", unix.ESRCH, transport.ErrPeerLost},
		{"bad range", unix.EFAULT, transport.ErrBadRegion},
	} {
		t.Run(c.desc, func(t *testing.T) {
			a, b, rb, pool, dst := cmaPair(t, 1<<20, func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
				if remote[0].Len > 1 {
					return -1, c.err
				}
				return unix.ProcessVMReadv(pid, local, remote, flags)
			})
			id := cmaGet(t, a, b, rb, pool, 0, dst)
			cs := awaitCMAFinal(t, rb, id)
			require.Len(t, cs, 1)
			require.ErrorIs(t, cs[0].Err, c.want)
			require.Equal(t, transport.MemoryDone, cs[0].Memory)
			b.mu.Lock()
			mem, _, err := b.regionLocked(dst)
			require.NoError(t, err)
			require.Zero(t, mem.InUse(), "the region's hold released")
			require.Empty(t, b.ops)
			b.mu.Unlock()
			require.Zero(t, b.CMAStats().Gets)
		})
	}
}

// A forced Close while a read runs waits for it (one bounded syscall) and reports the get's
// final completion before it returns.
func TestUCXCMA_CloseWaitsForTheReadInFlight(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	a, b, rb, pool, dst := cmaPair(t, 1<<20, blockingReadv(entered, release))
	id := cmaGet(t, a, b, rb, pool, 0, dst)
	waitEntered(t, entered)
	closed := make(chan error, 1)
	go func() { closed <- b.Close(true) }()
	close(release)
	require.NoError(t, <-closed)
	cs := rb.reportsOf(id)
	require.Equal(t, 1, finals(cs), "final before Close returned: %v", cs)
	require.Equal(t, transport.MemoryDone, cs[len(cs)-1].Memory)
}

// The transport.Transport contract holds where every get takes the process_vm_readv route: the
// conformance suite over buffers in registered caller memory.
func TestConformance_CMA(t *testing.T) {
	var mu sync.Mutex
	var made []*ucxTransport
	transporttest.Run(t, transporttest.Harness{Pair: func(tb transporttest.TB) (a, b transporttest.Endpoint) {
		mk := func() transporttest.Endpoint {
			mem, err := syscall.Mmap(-1, 0, 8<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = syscall.Munmap(mem) })
			e := conformanceEndpoint(tb, "posix,cma,self", "")
			tr := e.Transport.(*ucxTransport)
			tr.cma.allowSelf = true // both ends in this process
			pool, err := tr.RegisterHost(mem)
			require.NoError(tb, err)
			mu.Lock()
			made = append(made, tr)
			mu.Unlock()
			var bmu sync.Mutex
			next := 0
			e.Buffer = func(n int) []byte {
				bmu.Lock()
				defer bmu.Unlock()
				off := (next + 63) &^ 63
				next = off + n
				return pool.Pool()[off : off+n : off+n]
			}
			return e
		}
		return mk(), mk()
	}})
	gets := uint64(0)
	for _, tr := range made {
		gets += tr.CMAStats().Gets
	}
	require.NotZero(t, gets, "the RMA check's get took the process_vm_readv route")
}

// A read that returned but whose process is gone by then (its pidfd says so: the pid may name
// another process now) fails the get as a lost peer, whatever bytes it read.
func TestUCXCMA_ProcessGoneAfterTheReadFailsTheGet(t *testing.T) {
	a, b, rb, pool, dst := cmaPair(t, 1<<20, nil)
	var mu sync.Mutex
	checks := 0
	b.cma.alive = func(pidfd int) error {
		mu.Lock()
		defer mu.Unlock()
		if checks++; checks > 2 { // the proof and the first read (one byte) saw it alive
			return unix.ESRCH
		}
		return unix.PidfdSendSignal(pidfd, 0, nil, 0)
	}
	id := cmaGet(t, a, b, rb, pool, 0, dst)
	cs := awaitCMAFinal(t, rb, id)
	require.Len(t, cs, 1)
	require.ErrorIs(t, cs[0].Err, transport.ErrPeerLost)
	require.Equal(t, transport.MemoryDone, cs[0].Memory)
	require.Zero(t, b.CMAStats().Gets)
	// The peer's keys go at once, on every lane, though its endpoints still look alive: the
	// read proved the process gone, and UCX's keepalive may take long to say so.
	b.mu.Lock()
	keys := len(b.rma.keys)
	b.mu.Unlock()
	require.Zero(t, keys, "keys of a peer whose process is gone")
}

// The pidfd a key's route holds is closed with the key: here, when the transport closes.
func TestUCXCMA_PidfdClosedWithTheKey(t *testing.T) {
	a, b, rb, pool, dst := cmaPair(t, 1<<20, nil)
	id := cmaGet(t, a, b, rb, pool, 0, dst)
	cs := awaitCMAFinal(t, rb, id)
	require.NoError(t, cs[0].Err)
	b.mu.Lock()
	fd := -1
	for kid, k := range b.rma.keys {
		if kid.lane == 0 && k.cma.use {
			fd = k.cma.pidfd
		}
	}
	b.mu.Unlock()
	require.Positive(t, fd, "the route holds a pidfd")
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err, "open while the key lives")
	require.NoError(t, b.Close(true))
	_, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.ErrorIs(t, err, unix.EBADF, "closed with the key")
}

// UCX packs no address into the key of host memory registered over shared memory: every pool
// a peer registers has the same key, and the proof taken at the first read through it names
// the ranges registered then. A pool the peer registers after that proof is read by
// process_vm_readv too, every byte (the reader asks the peer again before it refuses a range
// outside those proven); a read of the peer's memory outside every pool it registered is still
// refused, nothing read.
func TestUCXCMA_PoolRegisteredAfterTheProofIsRead(t *testing.T) {
	const n = 1 << 20
	a, b, rb, pool, dst := cmaPair(t, n, nil)
	id := cmaGet(t, a, b, rb, pool, 0, dst)
	cs := awaitCMAFinal(t, rb, id)
	require.NoError(t, cs[len(cs)-1].Err)
	require.Equal(t, pool, dst)

	later := registered(t, a, mmapRegion(t, n))
	fill(later, 21)
	_, k1, err := a.RMAKey(pool)
	require.NoError(t, err)
	_, k2, err := a.RMAKey(later)
	require.NoError(t, err)
	require.Equal(t, k1, k2, "one key for both pools: the case this test is about")
	dst2 := registered(t, b, mmapRegion(t, n))
	id = cmaGet(t, a, b, rb, later, 0, dst2)
	cs = awaitCMAFinal(t, rb, id)
	require.NoError(t, cs[len(cs)-1].Err)
	require.Equal(t, later, dst2, "every byte")
	require.Equal(t, cmastats.Stats{Gets: 2, Bytes: 2 * n}, b.CMAStats(), "both read by process_vm_readv")

	secret := mmapRegion(t, n) // a's memory, never registered
	fill(secret, 33)
	clear(dst2)
	_, err = post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.PostGet(a.Self(), transport.Tag{Request: 7, Seq: 2}, k1, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(secret)))), dst2, d)
	})
	var re *cmaRangeError
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, err, transport.ErrProtocol)
	require.Equal(t, make([]byte, n), dst2, "nothing read")
	require.Equal(t, uint64(2), b.CMAStats().Gets)

	// A vector get (PostGetVector) of a pool registered later still is read too: it asks the
	// peer again as a get does.
	third := registered(t, a, mmapRegion(t, n))
	fill(third, 27)
	addr3, k3, err := a.RMAKey(third)
	require.NoError(t, err)
	require.Equal(t, k1, k3)
	dst3 := registered(t, b, mmapRegion(t, n))
	src := []vectorget.Range{{Addr: addr3 + n/2, Len: n / 2}, {Addr: addr3, Len: n / 2}}
	local := [][]byte{dst3[: n/2 : n/2], dst3[n/2:]}
	id, err = post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.postGetVector(a.Self(), transport.Tag{Request: 7, Seq: 3}, k3, src, local, d)
	})
	require.NoError(t, err)
	cs = awaitCMAFinal(t, rb, id)
	require.NoError(t, cs[len(cs)-1].Err)
	require.Equal(t, third[n/2:], dst3[:n/2], "every byte, in the vector's order")
	require.Equal(t, third[:n/2], dst3[n/2:])
	require.Equal(t, uint64(3), b.CMAStats().Gets, "read by process_vm_readv")
}
