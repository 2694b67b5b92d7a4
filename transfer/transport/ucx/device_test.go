// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

func TestUCXDevice_ConfigNamesTheField(t *testing.T) {
	cases := []struct {
		desc  string
		cfg   DeviceConfig
		field string
	}{
		{"no CUDA runtime", DeviceConfig{}, "ucx.DeviceConfig.Runtime"},
		{"negative staging", DeviceConfig{Runtime: new(cuda.Runtime), StagingBytes: -1}, "ucx.DeviceConfig.StagingBytes"},
		{"negative sync timeout", DeviceConfig{Runtime: new(cuda.Runtime), syncTimeout: -time.Second}, "ucx.DeviceConfig.syncTimeout"},
		{"negative bind timeout", DeviceConfig{Runtime: new(cuda.Runtime), bindTimeout: -time.Second}, "ucx.DeviceConfig.bindTimeout"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			d, err := newDevice(tc.cfg)
			require.Nil(t, d)
			var ce *transport.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tc.field, ce.Field)
			require.ErrorIs(t, err, transport.ErrInvalidConfig)
		})
	}
}

// Without a CUDA-enabled UCX, asking for device memory is one clear error that names the
// fix, raised before any GPU call (the runtime here is an unopened one, which would fail any
// call made on it), and it leaves nothing open.
func TestUCXDevice_WithoutCUDAUCXIsATypedError(t *testing.T) {
	// What this UCX reaches with the CUDA transports named (only where the build is expected
	// to have them: UCX 1.13 has none to name).
	switch os.Getenv("KVX_EXPECT_UCX_CUDA") {
	case "0":
		probe, err := newTransport(Config{TLS: "posix,cma,self", StagingBytes: 64 << 10})
		require.NoError(t, err)
		has := probe.DeviceMemory()
		require.NoError(t, probe.Close(true))
		require.False(t, has, "UCX %s reports CUDA memory, KVX_EXPECT_UCX_CUDA=0 says it must not", native.UCXVersion())
	case "1":
		probe, err := newTransport(Config{TLS: "posix,cma,self,cuda_copy,cuda_ipc", StagingBytes: 64 << 10})
		require.NoError(t, err)
		has := probe.DeviceMemory()
		require.NoError(t, probe.Close(true))
		require.True(t, has, "UCX %s reports no CUDA memory, KVX_EXPECT_UCX_CUDA=1 says it must", native.UCXVersion())
	}
	// A transport list that names no CUDA transport reaches no device memory with any UCX
	// (1.22 with "posix,cma,self" reports none, the first GPU run found): a typed error that
	// names both fixes.
	d, err := newDevice(DeviceConfig{Runtime: new(cuda.Runtime), UCX: Config{TLS: "posix,cma,self"}})
	require.Nil(t, d)
	require.ErrorIs(t, err, ErrDeviceMemory)
	require.ErrorIs(t, err, native.ErrMemoryType)
	require.ErrorIs(t, err, native.ErrNotSupported)
	var de *deviceMemoryError
	require.ErrorAs(t, err, &de)
	require.Contains(t, err.Error(), "libucx-cu12", "the error names the fix")
	require.Contains(t, err.Error(), "cuda_copy", "the error names the transport list's fix")
}

// fakeDeviceTransport is a deviceTransport over a real ucxTransport whose device region
// was never allocated: enough to exercise every check made before a device address is used.
func fakeDeviceTransport(t *testing.T) *deviceTransport {
	t.Helper()
	tr, err := newTransport(Config{TLS: "posix,cma,self", StagingBytes: 64 << 10})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close(true)) })
	return &deviceTransport{ucxTransport: tr, headers: make([]byte, 1<<20), composed: map[transport.OpID]transport.OpID{},
		movers: map[transport.RequestID]int{}, cfg: DeviceConfig{syncTimeout: time.Second}}
}

func TestUCXDevice_PostRefusesWhatItCannotMove(t *testing.T) {
	d := fakeDeviceTransport(t)
	slot := d.StagingMemory()[4096 : 4096+transport.DataHeaderBytes+1024]
	noop := func(transport.Completion) { t.Error("a refused post must never call back") }
	cases := []struct {
		desc  string
		setup func()
		buf   []byte
		want  error
	}{
		{"a request without a DeviceMover", func() {}, slot, ErrDeviceMemory},
		{"Go memory outside the header region", func() { d.movers[7] = 1 }, make([]byte, 4096), ErrUnregistered},
		{"a slot holding only a header", func() { d.movers[7] = 1 }, slot[:transport.DataHeaderBytes], ErrUnregistered},
		{"a GPU that overran its sync timeout", func() {
			var err error = &deviceMemoryError{Reason: "test: wedged"}
			d.wedged.Store(&err)
		}, slot, ErrDeviceMemory},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			tc.setup()
			for _, post := range []func(transport.Peer, transport.Tag, []byte, func(transport.Completion)) (transport.OpID, error){d.PostSend, d.PostRecv} {
				id, err := post(PeerFromAddress([]byte{1, 2, 3}), transport.Tag{Request: 7}, tc.buf, noop)
				require.Zero(t, id)
				require.ErrorIs(t, err, tc.want)
			}
		})
	}
	require.Empty(t, d.composed)
}

func TestUCXDevice_MoverChecksItsBuffers(t *testing.T) {
	d := fakeDeviceTransport(t)
	_, err := d.NewMover(1, cuda.Mem{})
	require.ErrorIs(t, err, ErrDeviceMemory, "an empty device pool")

	m, err := d.NewMover(1, cuda.Mem{Addr: 1 << 40, Size: 1 << 20})
	require.NoError(t, err)
	m2, err := d.NewMover(1, cuda.Mem{Addr: 1 << 40, Size: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, 2, d.movers[1], "two movers of one request (a Send and a Receive in one engine)")
	// A staging buffer outside the header region is refused before any GPU call.
	require.ErrorIs(t, m.Gather(nil, 0, make([]byte, 64)), ErrDeviceMemory)
	require.ErrorIs(t, m.Scatter(nil, make([]byte, 64), 0), ErrDeviceMemory)
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close twice is harmless")
	require.Equal(t, 1, d.movers[1])
	require.NoError(t, m2.Close())
	require.NotContains(t, d.movers, transport.RequestID(1), "the last Close ends the request's right to post")
}

// The two messages of a device chunk must look like one operation to the engine: the
// transport.Transport callback rules (transport.MemoryBusy at most before the one final report, which carries the
// worst verdict and the first error) hold for every order of their reports.
func TestUCXDevice_ChunkReportsFollowTheCallbackRules(t *testing.T) {
	errA, errB := errors.New("header failed"), errors.New("payload failed")
	cases := []struct {
		desc    string
		reports []transport.Completion
		want    []transport.Completion
	}{
		{"both succeed", []transport.Completion{{Bytes: 40}, {Bytes: 1000}},
			[]transport.Completion{{Bytes: 1040}}},
		{"one fails while the other is out", []transport.Completion{{Err: errA}, {Bytes: 1000}},
			[]transport.Completion{{Err: errA, Memory: transport.MemoryBusy}, {Err: errA}}},
		{"both fail: the first error is kept", []transport.Completion{{Err: errB}, {Err: errA}},
			[]transport.Completion{{Err: errB, Memory: transport.MemoryBusy}, {Err: errB}}},
		{"busy is forwarded once", []transport.Completion{{Err: transport.ErrCancelled, Memory: transport.MemoryBusy}, {Err: transport.ErrCancelled, Memory: transport.MemoryBusy}, {Err: transport.ErrCancelled}, {Bytes: 40}},
			[]transport.Completion{{Err: transport.ErrCancelled, Memory: transport.MemoryBusy}, {Err: transport.ErrCancelled}}},
		{"unknown quiescence wins", []transport.Completion{{Bytes: 40}, {Err: errB, Memory: transport.MemoryUnknown}},
			[]transport.Completion{{Err: errB, Memory: transport.MemoryUnknown}}},
		{"unknown first, then done", []transport.Completion{{Err: errA, Memory: transport.MemoryUnknown}, {Bytes: 1000}},
			[]transport.Completion{{Err: errA, Memory: transport.MemoryBusy}, {Err: errA, Memory: transport.MemoryUnknown}}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			var got []transport.Completion
			forgot := 0
			c := &deviceChunk{done: func(comp transport.Completion) { got = append(got, comp) }, forget: func() { forgot++ }}
			for _, r := range tc.reports {
				c.report(r)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, 1, forgot, "the chunk leaves the cancel table exactly once")
			finals := 0
			for _, comp := range got {
				if comp.Memory != transport.MemoryBusy {
					finals++
				}
			}
			require.Equal(t, 1, finals, "exactly one final report")
			require.NotEqual(t, transport.MemoryBusy, got[len(got)-1].Memory, "the final report is last")
		})
	}
}

// L9 for the DeviceMover: a copy whose end cannot be told is unknown quiescence. A kernel that
// launched but whose event could not be recorded behind it (or whose event reports a fault)
// may still write its slot and the caller's pool, so Gather and Scatter fail with an error
// matching transport.ErrQuiescenceUnknown (the engine then poisons both) and the transport
// stops trusting the GPU; a kernel that failed to launch runs nothing, and its error is plain.
// The CUDA calls are cudatest's fake, each answer injected.
func TestL9_DeviceMoverCopyOfUnknownEndIsUnknownQuiescence(t *testing.T) {
	l := layout.Packed(layout.Dims{NumLayers: 1, KVFactor: 2, NumHeads: 1, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 4}, layout.BlockMajor)
	plan, err := layout.NewPlan(l, l.All(), []int32{1, 3})
	require.NoError(t, err)
	fault := func(code int32) func() int32 { return func() int32 { return code } }
	cases := []struct {
		desc        string
		faults      cudatest.Faults
		wantErr     bool
		wantUnknown bool // ErrQuiescenceUnknown, and the transport wedged
	}{
		{desc: "launched, recorded, done"},
		{desc: "the kernel fails to launch: nothing runs", wantErr: true,
			faults: cudatest.Faults{Launch: func(string) int32 { return cudatest.Launch }}},
		{desc: "launched, the event cannot be recorded behind it", wantErr: true, wantUnknown: true,
			faults: cudatest.Faults{EventRecord: fault(cudatest.Launch)}},
		{desc: "launched and recorded, the event reports a fault", wantErr: true, wantUnknown: true,
			faults: cudatest.Faults{EventQuery: fault(cudatest.Launch)}},
	}
	for _, c := range cases {
		for _, op := range []string{"gather", "scatter"} {
			t.Run(c.desc+"/"+op, func(t *testing.T) {
				d := fakeDeviceTransport(t)
				faults := c.faults
				d.rt = cudatest.NewRuntime(&faults)
				var err error
				d.dev, err = d.rt.Alloc(int64(len(d.headers)))
				require.NoError(t, err)
				d.stream, err = d.rt.NewStream()
				require.NoError(t, err)
				m, err := d.NewMover(7, cuda.Mem{Addr: 1 << 44, Size: kvplan.PoolSpan(plan)})
				require.NoError(t, err)
				t.Cleanup(func() { _ = m.Close() })
				slot := d.StagingMemory()[4096 : 4096+plan.Bytes()]
				move := func() error {
					if op == "gather" {
						return m.Gather(plan, 0, slot)
					}
					return m.Scatter(plan, slot, 0)
				}
				err = move()
				if !c.wantErr {
					require.NoError(t, err)
					require.Nil(t, d.wedged.Load())
					return
				}
				require.Error(t, err)
				require.Equal(t, c.wantUnknown, errors.Is(err, transport.ErrQuiescenceUnknown), "%v", err)
				require.Equal(t, c.wantUnknown, d.wedged.Load() != nil, "the transport stops trusting the GPU")
				if c.wantUnknown {
					faults = cudatest.Faults{} // the GPU answers again: the transport still refuses
					require.ErrorIs(t, move(), ErrDeviceMemory, "a copy after an unknown end")
				}
			})
		}
	}
}

// TestUCXDevice_RendezvousByGets: a device transport's context pulls large device messages by
// a get_zcopy rendezvous whatever the UCX loaded (UCX 1.22's host default is am), the scheme
// the first GPU run measured at 21.6 GB/s over cuda_ipc (docs/gpu-results.md); a host
// transport keeps native's per-version default.
func TestUCXDevice_RendezvousByGets(t *testing.T) {
	require.Equal(t, "get_zcopy", deviceUCX(Config{}).rendezvous)
	require.Equal(t, "am", deviceUCX(Config{rendezvous: "am"}).rendezvous, "a scheme already set stays")
	require.Empty(t, Config{}.rendezvous, "a host transport leaves the choice to native")
}
