// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda/gpuinfo"
)

// devices lists this host's GPUs as NVML reports them; on a host without the NVIDIA driver
// (this one, unless it has a GPU) it is one line saying there is no NVML, exit 1.
func TestDevicesSubcommand(t *testing.T) {
	topo, err := gpuinfo.Discover(nvml.New())
	code, stdout, stderr := runMain(t, 10*time.Second, "devices")
	if err != nil {
		require.ErrorIs(t, err, gpuinfo.ErrNVMLNotFound, "only a missing driver may fail discovery here")
		require.Equal(t, exitError, code, stderr)
		require.Empty(t, stdout)
		require.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
		require.Contains(t, stderr, "kvxbench: devices: no NVML on this host")
		return
	}
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, topo.GPUs[0].Name)
	require.Contains(t, stdout, "driver "+topo.Driver)

	code, stdout, stderr = runMain(t, 10*time.Second, "devices", "--json")
	require.Equal(t, exitOK, code, stderr)
	var host struct {
		GPUs []map[string]any `json:"gpus"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &host))
	require.Len(t, host.GPUs, len(topo.GPUs))
}
