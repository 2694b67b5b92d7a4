// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
)

func TestDeviceRun_FlagValidation(t *testing.T) {
	cases := []struct {
		desc    string
		args    []string
		usage   string // the usage error expected; empty: the flags resolve
		wantMem string
	}{
		{"host memory is the default", nil, "", "host"},
		{"device memory resolves", []string{"--memory", "device"}, "", "device"},
		{"an unknown memory is a usage error", []string{"--memory", "gpu"}, `--memory "gpu": choose host or device`, ""},
		{"device memory always stages", []string{"--memory", "device", "--staging"}, "--memory device always stages", ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			args := append([]string{"--prompts", "64", "--concurrency", "1", "--max-memory", "256MiB", "--layers", "2"}, tc.args...)
			cfg, err := resolveForTest(t, args...)
			if tc.usage != "" {
				var ue *usageError
				require.ErrorAs(t, err, &ue)
				require.ErrorContains(t, err, tc.usage)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantMem, cfg.Memory)
			want := ""
			if tc.wantMem == "device" {
				want = "cuda"
			}
			require.Equal(t, want, perftestMemType(cfg), "the baseline moves the same kind of memory")
		})
	}
}

func TestDeviceRun_PerftestMovesDeviceMemory(t *testing.T) {
	host := perftestConfig{test: "tag_bw", size: 4096, iters: 10, warmup: 1}
	require.NotContains(t, host.args(1234), "-m")
	dev := host
	dev.memType = "cuda"
	args := dev.args(1234)
	require.Equal(t, []string{"-m", "cuda"}, args[len(args)-2:])
}

// Without a GPU (or its libraries), --memory device stops before any peer starts, with one
// line that says what is missing and how a GPU host runs it.
func TestDeviceRun_NoGPUIsOneLine(t *testing.T) {
	saved := openCUDA
	t.Cleanup(func() { openCUDA = saved })
	openCUDA = func() (*cuda.Runtime, error) {
		return nil, fmt.Errorf("%w: the driver reports 0 devices\n(second line)", cuda.ErrNoDevice)
	}
	cfg, err := resolveForTest(t, "--memory", "device", "--prompts", "64", "--concurrency", "1", "--max-memory", "256MiB", "--layers", "2")
	require.NoError(t, err)

	err = checkDeviceRun(cfg, false)
	require.Error(t, err)
	if errors.Is(err, errDeviceNotBuilt) {
		return // a build without cgo says so first
	}
	msg := err.Error()
	require.NotContains(t, msg, "\n", "one line")
	require.Contains(t, msg, "no usable GPU")
	require.Contains(t, msg, "0 devices")
	require.Contains(t, msg, "make gpu-test", "the fix is named")

	var ue *usageError
	require.ErrorAs(t, checkDeviceRun(cfg, true), &ue, "--stream has no device mode")
	cfg.Memory = "host"
	require.NoError(t, checkDeviceRun(cfg, false), "host runs are not probed")
}

// With a GPU but a UCX that cannot reach CUDA memory (Debian's), the probe names the UCX and
// the fix. The runtime here is a stand-in: the probe only opens and closes it.
func TestDeviceRun_UCXWithoutCUDAIsOneLine(t *testing.T) {
	if !engineBuilt {
		t.Skip("a build without cgo has no UCX to probe (TestDeviceRun_NoGPUIsOneLine covers its error)")
	}
	saved := openCUDA
	t.Cleanup(func() { openCUDA = saved })
	openCUDA = func() (*cuda.Runtime, error) { return new(cuda.Runtime), nil }
	cfg, err := resolveForTest(t, "--memory", "device", "--prompts", "64", "--concurrency", "1", "--max-memory", "256MiB", "--layers", "2", "--tls", "posix,cma,self")
	require.NoError(t, err)
	err = checkDeviceRun(cfg, false)
	if err == nil {
		t.Skip("this UCX reaches CUDA memory: make gpu-test runs the device transfer")
	}
	msg := err.Error()
	require.NotContains(t, msg, "\n", "one line")
	require.Contains(t, msg, "UCX cannot move device memory")
	require.Contains(t, msg, "libucx-cu12")
	require.True(t, strings.HasPrefix(msg, "--memory device:"), msg)
}
