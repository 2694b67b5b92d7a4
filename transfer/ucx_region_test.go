// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// pageKinds are the ways a serving process maps its KV cache: plain anonymous memory,
// transparent huge pages (madvise), and hugetlbfs pages (MAP_HUGETLB, which needs pages
// reserved in /proc/sys/vm/nr_hugepages).
var pageKinds = []string{"anon", "thp", "hugetlb"}

// mmapPool maps n bytes outside Go the way kind says, unmapped at the end of the test (after
// the cleanups registered later, such as the region's Unregister). It skips hugetlb where the
// host reserves no huge pages, saying so.
func mmapPool(t testing.TB, n int, kind string) []byte {
	t.Helper()
	const huge = 2 << 20
	flags := syscall.MAP_ANON | syscall.MAP_PRIVATE
	size := n
	if kind != "anon" {
		size = (n + huge - 1) / huge * huge
	}
	if kind == "hugetlb" {
		flags |= syscall.MAP_HUGETLB
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, flags)
	if kind == "hugetlb" && err != nil {
		t.Skipf("hugetlbfs pages: mmap(MAP_HUGETLB) of %d bytes: %v (HugePages_Total in /proc/meminfo is 0 unless pages are reserved with vm.nr_hugepages)", size, err)
	}
	require.NoError(t, err)
	if kind == "thp" {
		require.NoError(t, syscall.Madvise(mem, 14 /* MADV_HUGEPAGE */))
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	return mem[:n:n]
}

// callerKV is newUCXKV with the pool moved into memory the test mapped itself and registered
// with u's transport, as a serving process hands over its own KV cache.
func callerKV(t testing.TB, u *ucxEngine, d layout.Dims, o layout.Order, blockIDs []int32, seed uint64, kind string) (*ucxKV, *ucx.Region) {
	t.Helper()
	k := newUCXKV(t, d, o, blockIDs, seed)
	mem := mmapPool(t, len(k.mem), kind)
	copy(mem, k.mem)
	r, err := u.tr.RegisterHost(mem)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Unregister()) })
	k.mem = r.Pool()
	return k, r
}

// Pools in memory the caller mapped (anonymous, transparent huge pages, hugetlbfs where the
// host reserves pages) and registered, over UCX shared memory and TCP: the transfer takes the
// RMA mode on both sides, every byte checked, no staging slot used; and once it is quiescent
// the caller unregisters both regions, nothing left registered.
func TestUCXRegion_CallerMappedPoolsTakeRMA(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.Tuning.RMAMinRegionBytes = 64 << 10
			cfg.Tuning.DirectChunkBytes = 1 << 20
			cfg.Tuning.RMAWhereEmulated = true // the RMA mode from caller memory, over TCP too
			src := newUCXEngine(t, tr.tls, tr.dev, cfg)
			dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
			for i, kind := range pageKinds {
				t.Run(kind, func(t *testing.T) {
					sb, rb := make([]int32, 21), make([]int32, 21)
					for j := range sb {
						sb[j], rb[j] = int32(j*3)%64, int32(63-j)
					}
					s, _ := callerKV(t, src, dims, layout.BlockMajor, sb, uint64(i+1), kind)
					r, _ := callerKV(t, dst, dims, layout.BlockMajor, rb, 0, kind)
					hs, hr := startKV(t, src, dst, RequestID(1500+i), s, r)
					waitQuiesced(t, hr, 20*time.Second)
					waitQuiesced(t, hs, 20*time.Second)
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
					require.Equal(t, PathRMA, hr.Path())
					require.Equal(t, PathRMA, hs.Path())
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					for _, e := range []*Engine{src.e, dst.e} {
						require.Zero(t, e.pool.Stats().Leased)
					}
				})
			}
			t.Run("caller memory to AllocatePool memory and back", func(t *testing.T) {
				ids := seqBlocks(0, 16)
				s, _ := callerKV(t, src, dims, layout.BlockMajor, ids, 9, "anon")
				r := mappedKV(t, dst, dims, layout.BlockMajor, ids, 0)
				hs, hr := startKV(t, src, dst, 1510, s, r)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, PathRMA, hr.Path())
				require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
				back, _ := callerKV(t, src, dims, layout.BlockMajor, ids, 0, "anon")
				hs, hr = startKV(t, dst, src, 1511, r, back)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, PathRMA, hr.Path())
				require.True(t, bytes.Equal(r.stream(t), back.stream(t)), "every byte")
			})
		})
	}
}

// A region held by a transfer cannot be unregistered until the transfer's blocks are
// quiescent; then it can, and a second Unregister does nothing.
func TestUCXRegion_UnregisterWhileInUseRefused(t *testing.T) {
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
	src := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	dst := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	k := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 4), 3)
	mem := mmapPool(t, len(k.mem), "anon")
	region, err := src.tr.RegisterHost(mem)
	require.NoError(t, err)
	// No receiver asks for it yet: the Send waits, holding the pool.
	h, err := src.e.Send(bg, Spec{ID: 1520, Peer: dst.tr.Self(), Plan: k.plan, Pool: region.Pool(), Timeout: 10 * time.Second})
	require.NoError(t, err)
	err = region.Unregister()
	require.ErrorIs(t, err, transport.ErrRegionInUse)
	var re *transport.RegionError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "unregister", re.Op)
	require.True(t, ucxOf(src.tr).Direct(region.Pool()), "a refused Unregister changes nothing")
	src.e.Cancel(1520)
	waitQuiesced(t, h, 10*time.Second)
	require.NoError(t, region.Unregister())
	require.NoError(t, region.Unregister(), "twice")
	require.False(t, ucxOf(src.tr).Direct(mem), "unregistered memory is no longer the transport's")
	require.Zero(t, ucxhooks.Hooks.Registrations(src.tr))
}

// Duplicate and nested registrations share one UCX registration, counted per ucx.Region: the
// memory stays registered until the last of them is unregistered.
func TestUCXRegion_DuplicatesShareOneRegistration(t *testing.T) {
	u := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	page := os.Getpagesize()
	mem := mmapPool(t, 16*page, "anon")
	a, err := u.tr.RegisterHost(mem)
	require.NoError(t, err)
	b, err := u.tr.RegisterHost(mem)
	require.NoError(t, err)
	c, err := u.tr.RegisterHost(mem[4*page : 8*page])
	require.NoError(t, err)
	require.Equal(t, 1, ucxhooks.Hooks.Registrations(u.tr))
	ka, kb := mustKey(t, a), mustKey(t, c)
	require.Equal(t, ka, kb, "one key, packed once")
	require.NoError(t, a.Unregister())
	require.NoError(t, b.Unregister())
	require.True(t, ucxOf(u.tr).Direct(mem[4*page:8*page]), "the nested region still holds the registration")
	require.NoError(t, c.Unregister())
	require.False(t, ucxOf(u.tr).Direct(mem))
	require.Zero(t, ucxhooks.Hooks.Registrations(u.tr))
}

func mustKey(t testing.TB, r *ucx.Region) []byte {
	t.Helper()
	_, key := ucxhooks.Hooks.RegionKey(r)
	require.NotEmpty(t, key)
	return key
}

// Registrations that cannot work are refused with a typed error, and nothing stays
// registered: Go memory (cgo pointer rules), zero length, a start off a page, bounds that
// straddle another registration or the transport's own memory, device memory on a UCX without
// CUDA, and a registration after Close.
func TestUCXRegion_Refusals(t *testing.T) {
	u := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	page := os.Getpagesize()
	mem := mmapPool(t, 16*page, "anon")
	held, err := u.tr.RegisterHost(mem[4*page : 8*page])
	require.NoError(t, err)
	owned, err := u.tr.AllocatePool(int64(4 * page))
	require.NoError(t, err)
	goMem := make([]byte, 1<<20)
	cases := []struct {
		desc     string
		register func() (*ucx.Region, error)
		want     error
	}{
		{"Go heap memory", func() (*ucx.Region, error) { return u.tr.RegisterHost(goMem) }, transport.ErrGoMemory},
		{"zero length", func() (*ucx.Region, error) { return u.tr.RegisterHost(mem[:0]) }, transport.ErrBadRegion},
		{"start off a page", func() (*ucx.Region, error) { return u.tr.RegisterHost(mem[64 : 2*page]) }, transport.ErrBadRegion},
		{"straddles a registration's start", func() (*ucx.Region, error) { return u.tr.RegisterHost(mem[2*page : 6*page]) }, transport.ErrBadRegion},
		{"contains a registration", func() (*ucx.Region, error) { return u.tr.RegisterHost(mem) }, transport.ErrBadRegion},
		{"inside AllocatePool memory", func() (*ucx.Region, error) { return u.tr.RegisterHost(owned) }, transport.ErrBadRegion},
		{"inside the staging region", func() (*ucx.Region, error) { return u.tr.RegisterHost(u.tr.StagingMemory()) }, transport.ErrBadRegion},
		{"device memory, zero length", func() (*ucx.Region, error) { return u.tr.RegisterDevice(1<<40, 0) }, transport.ErrBadRegion},
		{"device memory, unaligned", func() (*ucx.Region, error) { return u.tr.RegisterDevice(1<<40+8, 4096) }, transport.ErrBadRegion},
	}
	if !ucxOf(u.tr).DeviceMemory() {
		cases = append(cases, struct {
			desc     string
			register func() (*ucx.Region, error)
			want     error
		}{"device memory on a UCX without CUDA", func() (*ucx.Region, error) { return u.tr.RegisterDevice(1<<40, 1<<20) }, ucx.ErrDeviceMemory})
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			r, err := c.register()
			require.Nil(t, r)
			require.ErrorIs(t, err, c.want)
			var re *transport.RegionError
			require.ErrorAs(t, err, &re)
			require.Equal(t, "register", re.Op)
			require.Equal(t, 1, ucxhooks.Hooks.Registrations(u.tr), "nothing registered")
		})
	}
	t.Run("device memory on a UCX without CUDA names the UCX", func(t *testing.T) {
		if ucxOf(u.tr).DeviceMemory() {
			t.Skip("this UCX reaches CUDA memory")
		}
		_, err := u.tr.RegisterDevice(1<<40, 1<<20)
		require.ErrorIs(t, err, native.ErrMemoryType)
		require.Contains(t, err.Error(), native.UCXVersion())
	})
	require.NoError(t, held.Unregister())
	require.NoError(t, u.e.Close())
	t.Run("after Close", func(t *testing.T) {
		_, err := u.tr.RegisterHost(mem)
		require.ErrorIs(t, err, ErrClosed)
	})
	require.Zero(t, ucxhooks.Hooks.Registrations(u.tr))
}

// A region the caller never unregistered is unmapped by the transport's Close, which then
// succeeds (UCX's context refuses to close with regions mapped): nothing leaks.
func TestUCXRegion_CloseUnregistersTheRest(t *testing.T) {
	tr, err := ucx.New(ucx.Config{TLS: "posix,cma,self", StagingBytes: 1 << 20})
	require.NoError(t, err)
	mem := mmapPool(t, 1<<20, "anon")
	r, err := tr.RegisterHost(mem)
	require.NoError(t, err)
	require.NoError(t, tr.Close(false))
	require.Zero(t, ucxhooks.Hooks.Registrations(tr))
	require.NoError(t, r.Unregister(), "after Close: nothing to do")
	require.Equal(t, uintptr(unsafe.Pointer(&mem[0])), uintptr(r.Addr()))
}

// Caller-registered memory on one side, the peer process's own on the other, each direction,
// over shared memory and TCP: the one-copy path the engine chooses by default (the RMA mode
// over shared memory; IOV messages over TCP, where UCX 1.13 would emulate the gets), every
// byte checked by the receiving side. The peer registers its pool too with -caller.
func TestUCXRegion_TwoProcessesEveryByteChecked(t *testing.T) {
	const blocks = 16 // 32 MiB
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		for _, mode := range []string{"engine-send", "engine-recv"} {
			t.Run(tr.name+"/"+mode, func(t *testing.T) {
				peer := peerproc.Start(t, bin, append(ucxPeerArgs(tr.tls, tr.dev, mode, blocks, 81, 30*time.Second), "-caller")...)
				local := newUCXEngine(t, tr.tls, tr.dev, ucxPeerTestConfig())
				peer.Connect(t, string(local.tr.Self()))
				goPool, plan := ucxEnginePool(t, blocks, 5, mode == "engine-recv")
				mem := mmapPool(t, len(goPool), "anon")
				copy(mem, goPool)
				region, err := local.tr.RegisterHost(mem)
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, region.Unregister()) })
				spec := Spec{ID: 81, Peer: Peer(peer.Addr), Plan: plan, Pool: region.Pool(), Timeout: 30 * time.Second}
				var h *Handle
				if mode == "engine-send" {
					h, err = local.e.Receive(bg, spec)
				} else {
					h, err = local.e.Send(bg, spec)
				}
				require.NoError(t, err)
				waitQuiesced(t, h, 30*time.Second)
				require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
				want := PathRMA
				if ucxOf(local.tr).GetsEmulated(Peer(peer.Addr)) {
					want = PathDirect
				}
				require.Equal(t, want, h.Path())
				require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 30*time.Second))
				if mode == "engine-send" {
					want, _ := ucxEnginePool(t, blocks, 5, true)
					require.True(t, bytes.Equal(want, region.Pool()), "every byte")
				}
			})
		}
	}
}

// BenchmarkUCXRegion_Register times RegisterHost (ucp_mem_map of caller memory and the key
// packed once) and Unregister of one region of $KVX_REGISTER_BYTES (default 1 GiB) that the
// process mapped and touched, on shared memory's transports. docs/benchmarks.md has figures.
func BenchmarkUCXRegion_Register(b *testing.B) {
	size := int64(1 << 30)
	if s := os.Getenv("KVX_REGISTER_BYTES"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		require.NoError(b, err)
		size = n
	}
	tr, err := ucx.New(ucx.Config{TLS: "posix,cma,self", StagingBytes: 1 << 20})
	require.NoError(b, err)
	defer func() { require.NoError(b, tr.Close(false)) }()
	mem := mmapPool(b, int(size), "anon")
	for i := 0; i < len(mem); i += os.Getpagesize() {
		mem[i] = 1 // resident, as a KV cache in use is
	}
	var reg, unreg time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		r, err := tr.RegisterHost(mem)
		require.NoError(b, err)
		t1 := time.Now()
		require.NoError(b, r.Unregister())
		reg, unreg = reg+t1.Sub(t0), unreg+time.Since(t1)
	}
	b.ReportMetric(float64(reg.Microseconds())/float64(b.N), "register-us")
	b.ReportMetric(float64(unreg.Microseconds())/float64(b.N), "unregister-us")
}
