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
		{"negative sync timeout", DeviceConfig{Runtime: new(cuda.Runtime), SyncTimeout: -time.Second}, "ucx.DeviceConfig.SyncTimeout"},
		{"negative bind timeout", DeviceConfig{Runtime: new(cuda.Runtime), BindTimeout: -time.Second}, "ucx.DeviceConfig.BindTimeout"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			d, err := NewDevice(tc.cfg)
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
	probe, err := New(Config{TLS: "posix,cma,self", StagingBytes: 64 << 10})
	require.NoError(t, err)
	has := probe.DeviceMemory()
	require.NoError(t, probe.Close(true))
	switch os.Getenv("KVX_EXPECT_UCX_CUDA") {
	case "0":
		require.False(t, has, "UCX %s reports CUDA memory, KVX_EXPECT_UCX_CUDA=0 says it must not", native.UCXVersion())
	case "1":
		require.True(t, has, "UCX %s reports no CUDA memory, KVX_EXPECT_UCX_CUDA=1 says it must", native.UCXVersion())
	}
	if has {
		t.Skipf("UCX %s reaches CUDA memory: the device path is covered by the gpu-tagged tests", native.UCXVersion())
	}
	d, err := NewDevice(DeviceConfig{Runtime: new(cuda.Runtime), UCX: Config{TLS: "posix,cma,self"}})
	require.Nil(t, d)
	require.ErrorIs(t, err, ErrDeviceMemory)
	require.ErrorIs(t, err, native.ErrMemoryType)
	require.ErrorIs(t, err, native.ErrNotSupported)
	var de *DeviceMemoryError
	require.ErrorAs(t, err, &de)
	require.Contains(t, err.Error(), "libucx-cu12", "the error names the fix")
}

// fakeDeviceTransport is a DeviceTransport over a real Transport whose device region
// was never allocated: enough to exercise every check made before a device address is used.
func fakeDeviceTransport(t *testing.T) *DeviceTransport {
	t.Helper()
	tr, err := New(Config{TLS: "posix,cma,self", StagingBytes: 64 << 10})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close(true)) })
	return &DeviceTransport{Transport: tr, headers: make([]byte, 1<<20), composed: map[transport.OpID]transport.OpID{},
		movers: map[transport.RequestID]int{}, cfg: DeviceConfig{SyncTimeout: time.Second}}
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
			var err error = &DeviceMemoryError{Reason: "test: wedged"}
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
// Transport callback rules (transport.MemoryBusy at most before the one final report, which carries the
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
