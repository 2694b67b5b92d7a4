// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda/gpuinfo"
)

// withNVML makes lib the NVML the device choice asks, and clears the CUDA variables that
// would take the choice away from it, for the test.
func withNVML(t *testing.T, lib nvml.Interface) {
	t.Helper()
	saved := nvmlLib
	t.Cleanup(func() { nvmlLib = saved })
	nvmlLib = func() nvml.Interface { return lib }
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	t.Setenv("CUDA_DEVICE_ORDER", "")
}

// dgxFree is go-nvml's mock DGX H100, with what the mock leaves unset answered as the real
// machine does (distinct bus ids, 18 NVLinks per GPU, every pair reachable), and these free
// memories (bytes) per GPU.
func dgxFree(free ...uint64) nvml.Interface {
	s := dgxh100.New()
	for i, d := range s.Devices {
		md := d.(*server.Device)
		md.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{Bus: uint32(0x18 + 0x10*i)}, nvml.SUCCESS
		}
		md.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		md.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		if i < len(free) {
			md.MemoryInfo.Free = free[i]
		}
	}
	return s
}

// --device auto takes the GPU with the most free memory NVML reports, and the run's report
// carries that GPU as NVML describes it; --device N takes N and describes it the same way.
func TestChooseDevice_AutoTakesTheGPUWithMostFreeMemory(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		desc   string
		device int
		want   int
	}{
		{"auto: GPU 5 has the most free memory", DeviceAuto, 5},
		{"an explicit ordinal is kept", 2, 2},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			withNVML(t, dgxFree(10*gib, 20*gib, 30*gib, 5*gib, 5*gib, 70*gib, 1*gib, 1*gib))
			ordinal, gpu, note, err := ChooseDevice(c.device)
			require.NoError(t, err)
			require.Equal(t, c.want, ordinal)
			require.NotNil(t, gpu)
			require.Equal(t, c.want, gpu.Index)
			require.Contains(t, gpu.Name, "H100")
			require.NotEmpty(t, gpu.Driver)
			require.Greater(t, gpu.MemoryBytes, uint64(70*gib))
			require.Empty(t, note)
		})
	}
}

// An ordinal the host does not have is bad input, naming what the host has.
func TestChooseDevice_UnknownOrdinalIsAUsageError(t *testing.T) {
	withNVML(t, dgxFree())
	_, _, _, err := ChooseDevice(8)
	var ue *UsageError
	require.ErrorAs(t, err, &ue)
	require.ErrorContains(t, err, "--device 8: this host has 8 GPUs")
}

// Without NVML (no NVIDIA driver: this host, or a mock that says so) the choice degrades to
// device 0 with a one-line note that says why, and the report has no GPU description; CUDA then
// opens the device or fails with its own message.
func TestChooseDevice_WithoutNVMLTakesDevice0WithANote(t *testing.T) {
	missing := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	for _, lib := range []struct {
		desc string
		lib  nvml.Interface
	}{{"a mock without the library", missing}, {"this host's NVML", nvml.New()}} {
		t.Run(lib.desc, func(t *testing.T) {
			if _, err := gpuinfo.Discover(lib.lib); err == nil {
				t.Skip("this host has NVML and a GPU: the mock case covers its absence")
			} else {
				require.ErrorIs(t, err, gpuinfo.ErrNVMLNotFound)
			}
			withNVML(t, lib.lib)
			ordinal, gpu, note, err := ChooseDevice(DeviceAuto)
			require.NoError(t, err)
			require.Zero(t, ordinal)
			require.Nil(t, gpu)
			require.NotContains(t, note, "\n", "one line")
			require.Contains(t, note, "--device auto: no NVML on this host")
			require.Contains(t, note, "taking device 0")
		})
	}
}

// Devices lists what NVML reports, as a table or as JSON; without NVML it is one error that
// says so.
func TestListDevices(t *testing.T) {
	withNVML(t, dgxFree())
	var stdout bytes.Buffer
	require.NoError(t, ListDevices(&Outputs{Stdout: &stdout, Stderr: discard{}}, false))
	require.Equal(t, 8+1, strings.Count(stdout.String(), "\n"), stdout.String())
	require.Contains(t, stdout.String(), "GPU 7")
	require.Contains(t, stdout.String(), "driver ")

	stdout.Reset()
	require.NoError(t, ListDevices(&Outputs{Stdout: &stdout, Stderr: discard{}}, true))
	var host HostGPUs
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &host))
	require.Len(t, host.GPUs, 8)

	withNVML(t, &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }})
	err := ListDevices(&Outputs{Stdout: &stdout, Stderr: discard{}}, false)
	require.True(t, errors.Is(err, ErrNoNVML), "%v", err)
	require.Contains(t, err.Error(), "no NVML on this host")
}
