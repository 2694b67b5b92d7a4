// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package gpuinfo_test

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/cuda/gpuinfo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dgx is go-nvml's mock DGX H100 with what the mock leaves unset filled in the way the real
// machine answers: distinct bus ids, 18 active NVLinks per GPU, and every pair NVLink- and
// P2P-connected through the NVSwitches. nvlinkDown lists GPUs whose links are down.
func dgx(free []uint64, nvlinkDown ...int) nvml.Interface {
	s := dgxh100.New()
	down := map[int]bool{}
	for _, i := range nvlinkDown {
		down[i] = true
	}
	index := map[nvml.Device]int{}
	for i, d := range s.Devices {
		index[d] = i
	}
	for i, d := range s.Devices {
		md := d.(*server.Device)
		md.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{Domain: 0, Bus: uint32(0x18 + 0x10*i), Device: 0}, nvml.SUCCESS
		}
		md.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if down[i] {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		md.GetP2PStatusFunc = func(other nvml.Device, idx nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			if idx == nvml.P2P_CAPS_INDEX_NVLINK && (down[i] || down[index[other]]) {
				return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		if free != nil {
			md.MemoryInfo.Free = free[i]
		}
	}
	return s
}

func TestDiscoverDGXH100(t *testing.T) {
	topo, err := gpuinfo.Discover(dgx(nil))
	require.NoError(t, err)
	require.Len(t, topo.GPUs, 8)
	seen := map[string]bool{}
	for i, g := range topo.GPUs {
		require.Equal(t, i, g.Index)
		require.Contains(t, g.Name, "H100")
		require.Equal(t, 9, g.ComputeMajor)
		require.Greater(t, g.MemoryTotal, uint64(70<<30))
		require.Equal(t, 18, g.NVLinks)
		require.Equal(t, fmt.Sprintf("00000000:%02x:00.0", 0x18+0x10*i), g.PCIBusID)
		require.False(t, seen[g.UUID], "duplicate UUID")
		seen[g.UUID] = true
		for j := range topo.GPUs {
			if i != j {
				require.Equal(t, gpuinfo.Link{P2P: true, NVLink: true}, topo.Links[i][j])
			}
		}
	}
	require.Contains(t, topo.String(), "8 x")
	require.Contains(t, topo.String(), "28 NVLink-connected pairs")
}

func TestStagingGPUFollowsMemoryAndNVLink(t *testing.T) {
	const gib = 1 << 30
	free := []uint64{1 * gib, 40 * gib, 60 * gib, 10 * gib, 70 * gib, 5 * gib, 5 * gib, 5 * gib}
	topo, err := gpuinfo.Discover(dgx(free, 4))
	require.NoError(t, err)
	cases := []struct {
		desc string
		kv   int
		need uint64
		want int
	}{
		{"room on the KV's own GPU", 1, 8 * gib, 1},
		{"no room: the NVLink peer with most free memory (GPU 4's links are down)", 0, 8 * gib, 2},
		{"no GPU has room: host staging", 0, 100 * gib, -1},
		{"GPU without NVLink and without room: host staging", 4, 80 * gib, -1},
		{"index out of range", 9, 1, -1},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, c.want, topo.StagingGPU(c.kv, c.need))
		})
	}
	require.Equal(t, 0, topo.GPUs[4].NVLinks)
}

func TestDiscoverErrorsAreTyped(t *testing.T) {
	missing := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := gpuinfo.Discover(missing)
	require.ErrorIs(t, err, gpuinfo.ErrNVMLNotFound)

	broken := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST },
	}
	_, err = gpuinfo.Discover(broken)
	require.ErrorIs(t, err, gpuinfo.ErrNVML)
	require.NotErrorIs(t, err, gpuinfo.ErrNVMLNotFound)
	require.Contains(t, err.Error(), "nvmlDeviceGetCount")
}

// On the real library: a host without the NVIDIA driver gives ErrNVMLNotFound, never a
// panic; a host with one lists at least one GPU.
func TestDiscoverRealHost(t *testing.T) {
	topo, err := gpuinfo.Discover(nvml.New())
	if err != nil {
		require.ErrorIs(t, err, gpuinfo.ErrNVMLNotFound, "only a missing driver may fail discovery here")
		return
	}
	require.NotEmpty(t, topo.GPUs)
}
