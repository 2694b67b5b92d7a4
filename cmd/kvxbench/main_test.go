// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
)

// TestMain lets the test binary stand in for kvxbench when run re-executes itself as its peer
// (peerEnv set): it runs Main with the arguments instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(bench.PeerEnv) == "1" {
		os.Exit(Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// runMain runs the CLI in-process with a bound, and returns its exit code and outputs.
func runMain(t *testing.T, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// Bad input gets one clear line on stderr, a non-zero exit, no stack trace and no hang.
func TestBadInputIsAClearMessageAndNonZeroExit(t *testing.T) {
	cases := []struct {
		desc string
		args []string
		code int
		want string
	}{
		{"unknown subcommand", []string{"frobnicate"}, exitUsage, `unknown subcommand "frobnicate"`},
		{"unknown preset", []string{"gather", "--model", "gpt-9"}, exitUsage, `unknown model preset "gpt-9": choose one of llama3-8b, llama3-70b-tp8, deepseek-v3`},
		{"unknown flag", []string{"gather", "--frob"}, exitUsage, "flag provided but not defined: -frob"},
		{"zero duration", []string{"gather", "--duration", "0"}, exitUsage, "--duration = 0s: must be positive"},
		{"negative duration on run", []string{"run", "--duration", "-1s"}, exitUsage, "--duration = -1s: must be positive"},
		{"impossible kv factor", []string{"gather", "--kv-factor", "3"}, exitUsage, "impossible layout: --kv-factor = 3: must be 1 (MLA) or 2 (K and V)"},
		{"zero heads", []string{"run", "--heads", "0"}, exitUsage, "--heads = 0: must be positive"},
		{"an unknown pool owner", []string{"run", "--pool", "engine"}, exitUsage, `--pool "engine": choose transport or caller`},
		{"caller pools with staging", []string{"run", "--pool", "caller", "--staging"}, exitUsage, "--pool caller registers host pools for the direct path"},
		{"bad dtype", []string{"gather", "--dtype", "fp64"}, exitUsage, `--dtype "fp64"`},
		{"bad order", []string{"gather", "--order", "diagonal"}, exitUsage, `--order "diagonal"`},
		{"bad prompts", []string{"gather", "--prompts", "1k,zero"}, exitUsage, `--prompts: "zero" is not a positive token count`},
		{"bad concurrency", []string{"run", "--concurrency", "0"}, exitUsage, `--concurrency: "0" is not a positive integer`},
		{"bad slot size", []string{"gather", "--slot-size", "lots"}, exitUsage, `--slot-size: "lots" is not a size`},
		{"pool too small", []string{"gather", "--pool-blocks", "2"}, exitUsage, "--pool-blocks = 2: the run needs at least 512 blocks"},
		{"png plot", []string{"gather", "--plot", "out.png"}, exitUsage, "only .svg is drawn"},
		{"device memory without CUDA", []string{"gather", "--memory", "device", "--prompts", "64"}, exitError, "device memory needs libkvxcuda.so and a GPU"},
		{"device transfers without a GPU or a CUDA UCX", []string{"run", "--memory", "device"}, exitError, "kvxbench: --memory device: "},
		{"odd prefill TP", []string{"run", "--prefill-tp", "3"}, exitUsage, "--prefill-tp = 3"},
		{"negative lanes", []string{"run", "--lanes", "-1"}, exitUsage, "--lanes = -1"},
		{"too many lanes", []string{"run", "--lanes", "65"}, exitUsage, "--lanes = 65"},
		{"TCP segment past the receive buffer", []string{"run", "--tcp-segment", "2MiB"}, exitUsage, "--tcp-segment = 2097152"},
		{"caller pages neither thp nor 4k", []string{"run", "--pool", "caller", "--caller-pages", "1g"}, exitUsage, "--caller-pages \"1g\""},
		{"shared-memory FIFO not a power of two", []string{"run", "--shm-fifo", "100"}, exitUsage, "--shm-fifo = 100"},
		{"TCP segment too small", []string{"run", "--tcp-segment", "4KiB"}, exitUsage, "--tcp-segment = 4096"},
		{"bad decode order", []string{"run", "--decode-order", "diagonal"}, exitUsage, `--decode-order "diagonal"`},
		{"MLA heads do not split over TP 2", []string{"run", "--model", "deepseek-v3", "--prefill-tp", "2"}, exitUsage, "the pool's 1 heads do not split evenly"},
		{"odd decode TP", []string{"run", "--decode-tp", "3"}, exitUsage, "--decode-tp = 3"},
		{"TP above 1 on both ends", []string{"run", "--decode-tp", "2", "--prefill-tp", "2"}, exitUsage, "--decode-tp 2 with --prefill-tp 2"},
		{"MLA heads do not split over decode TP 2", []string{"run", "--model", "deepseek-v3", "--decode-tp", "2"}, exitUsage, "--decode-tp 2: the pool's 1 heads do not split evenly"},
		{"decode TP on device memory", []string{"run", "--decode-tp", "2", "--memory", "device"}, exitUsage, "--decode-tp 2: host memory only"},
		{"decode TP on two hosts", []string{"connect", "--decode-tp", "2", "h:1"}, exitUsage, "a two-host run has one decode rank"},
		{"connect without address", []string{"connect"}, exitUsage, "connect needs the address serve printed"},
		{"connect to a bad address", []string{"connect", "nowhere"}, exitUsage, `connect "nowhere"`},
		{"TP on two hosts", []string{"connect", "--prefill-tp", "2", "h:1"}, exitUsage, "a two-host run has one prefill rank"},
		{"stray argument", []string{"gather", "extra"}, exitUsage, `gather takes no arguments`},
		{"a device that is not auto or an ordinal", []string{"run", "--memory", "device", "--device", "gpu0"}, exitUsage, `--device "gpu0": give auto or a device ordinal`},
		{"sweep with its own prompts", []string{"sweep", "--prompts", "4k"}, exitUsage, "drop --prompts"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			code, stdout, stderr := runMain(t, 10*time.Second, tc.args...)
			require.Equal(t, tc.code, code, "stderr: %s", stderr)
			require.Contains(t, stderr, tc.want)
			require.Empty(t, stdout)
			require.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "one line, got %q", stderr)
			require.NotContains(t, stderr, "goroutine")
			require.True(t, strings.HasPrefix(stderr, "kvxbench: "))
		})
	}
}

func TestHelpListsSubcommandsAndPresets(t *testing.T) {
	code, stdout, _ := runMain(t, 5*time.Second, "help")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"run", "gather", "sweep", "serve", "connect", "llama3-8b", "llama3-70b-tp8", "deepseek-v3"} {
		require.Contains(t, stdout, want)
	}
	require.NotContains(t, stdout, "peer ", "the peer subcommand is internal")

	code, stdout, _ = runMain(t, 5*time.Second, "help", "gather")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "-slot-size")
	require.Contains(t, stdout, "-no-verify")

	code, _, stderr := runMain(t, 5*time.Second, "gather", "-h")
	require.Equal(t, exitOK, code)
	require.Contains(t, stderr, "Usage: kvxbench gather")

	// The flags spelled as a user tries them first list the subcommands, not run's flags.
	for _, flag := range []string{"--help", "-h", "-help"} {
		code, stdout, _ = runMain(t, 5*time.Second, flag)
		require.Equal(t, exitOK, code, flag)
		for _, want := range []string{"Subcommands:", "run", "gather", "sweep", "serve", "connect", "stress"} {
			require.Contains(t, stdout, want, flag)
		}
	}
}

// A small gather run end to end: every result verified, the memcpy baseline beside it, both
// output formats and the plot.
func TestGatherRunsVerifiedAgainstMemcpy(t *testing.T) {
	skipWithoutHostCopy(t)
	plot := t.TempDir() + "/gather.svg"
	code, stdout, stderr := runMain(t, time.Minute, "gather", "--prompts", "64,256", "--duration", "20ms", "--layers", "4",
		"--slot-size", "1MiB", "--json", "--plot", plot)
	require.Equal(t, exitOK, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 4, "gather and scatter for two prompts")
	for _, line := range lines {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		for _, field := range []string{"name", "bytes", "gbps", "p50_us", "p99_us", "baseline_gbps", "ratio"} {
			require.Contains(t, r, field)
		}
		require.Equal(t, true, r["verified"])
		require.Greater(t, r["gbps"].(float64), 0.0)
		require.Equal(t, "memcpy", r["baseline"])
	}
	require.Contains(t, lines[0], `"name":"gather custom(llama3-8b) 64"`)
	require.Contains(t, lines[0], `"bytes":1048576`) // 64 tokens = 2 blocks of 4 layers of 128 KiB
	svg, err := os.ReadFile(plot)
	require.NoError(t, err)
	require.Contains(t, string(svg), "<svg")

	code, stdout, stderr = runMain(t, time.Minute, "gather", "--model", "deepseek-v3", "--prompts", "128", "--layers", "8",
		"--duration", "10ms", "--baseline=false", "--order", "layer-major")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "gather custom(deepseek-v3) 128")
	require.Contains(t, stdout, "verified")
	require.NotContains(t, stdout, "memcpy", "no baseline asked for")
}

// skipWithoutHostCopy skips a test that moves bytes through native.HostGather in a build
// without cgo, where the C copy is absent (native.ErrNotSupported); any other error fails.
func skipWithoutHostCopy(t *testing.T) {
	t.Helper()
	l := layouttest.Llama3_8B(1)
	p, err := layout.NewPlan(l, l.All(), []int32{0})
	require.NoError(t, err)
	err = native.HostGather(p, make([]byte, l.SpanBytes()), 0, make([]byte, 1))
	if errors.Is(err, native.ErrNotSupported) {
		t.Skipf("this build has no host gather: %v", err)
	}
	require.NoError(t, err)
}

// An interrupt (the context Main runs under ends) stops a run promptly with exit 130 and one
// line that says so.
func TestInterruptEndsPromptly(t *testing.T) {
	skipWithoutHostCopy(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := Main(ctx, []string{"gather", "--layers", "2", "--prompts", "64", "--duration", "1m"}, &stdout, &stderr)
	require.Equal(t, exitInterrupted, code, stderr.String())
	require.Contains(t, stderr.String(), "kvxbench: interrupted")
	require.Less(t, time.Since(start), 10*time.Second)
}
