// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/stretchr/testify/require"
)

func resolveForTest(t *testing.T, args ...string) (bench.RunConfig, error) {
	t.Helper()
	var f transferFlags
	fs := newFlagSet("run", "run", &outputs{Stdout: discard{}, Stderr: discard{}})
	f.register(fs, time.Second)
	require.NoError(t, parseFlags(fs, args))
	return f.resolve(func() string { return "" })
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestDeviceRun_FlagValidation(t *testing.T) {
	cases := []struct {
		desc    string
		args    []string
		usage   string // the usage error expected; empty: the flags resolve
		wantMem string
		staging bool // the run keeps to the staging path (device: the old mode, kernels and device slots)
	}{
		{"host memory is the default", nil, "", "host", false},
		{"device memory resolves", []string{"--memory", "device"}, "", "device", false},
		{"an unknown memory is a usage error", []string{"--memory", "gpu"}, `--memory "gpu": choose host or device`, "", false},
		{"device memory with --staging keeps to device staging slots", []string{"--memory", "device", "--staging"}, "", "device", true},
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
			require.Equal(t, tc.staging, cfg.Staging)
		})
	}
}

// Scenarios that do not fit in --max-memory are refused at start-up when none fits, and
// skipped with a note when others do.
func TestMaxMemory(t *testing.T) {
	_, err := resolveForTest(t, "--max-memory", "1MiB")
	require.ErrorContains(t, err, "--max-memory 1 MiB: no scenario fits")

	cfg, err := resolveForTest(t, "--layers", "4", "--prompts", "64,1k", "--concurrency", "1,16", "--max-memory", "64MiB")
	require.NoError(t, err)
	// 1k tokens at c=16 would need 16*32 blocks of 512 KiB: 256 MiB. The largest that fits
	// is 1k at c=1 or 64 at c=16 (32 blocks).
	require.GreaterOrEqual(t, cfg.Decode.NumBlocks, int64(32))
	require.LessOrEqual(t, cfg.Decode.SpanBytes()+cfg.Prefill.SpanBytes(), int64(64<<20))
}

// --latency: the default run (no --prompts) adds the latency rows; a run that names its
// prompts measures those alone unless --latency on; anything else is a usage error.
func TestLatencyFlag(t *testing.T) {
	cases := []struct {
		desc  string
		args  []string
		want  bool
		usage string
	}{
		{"the default run has them", nil, true, ""},
		{"named prompts alone", []string{"--prompts", "64"}, false, ""},
		{"named prompts and on", []string{"--prompts", "64", "--latency", "on"}, true, ""},
		{"off", []string{"--latency", "off"}, false, ""},
		{"auto", []string{"--latency", "auto"}, true, ""},
		{"a wrong word", []string{"--latency", "yes"}, false, `--latency "yes": choose auto, on or off`},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			cfg, err := resolveForTest(t, append([]string{"--max-memory", "1GiB", "--layers", "2", "--concurrency", "1"}, tc.args...)...)
			if tc.usage != "" {
				var ue *usageError
				require.ErrorAs(t, err, &ue)
				require.ErrorContains(t, err, tc.usage)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Latency)
			if tc.want {
				require.GreaterOrEqual(t, cfg.Decode.NumBlocks, int64(16), "room for 16 requests at once")
			}
		})
	}
}

// --sender: auto by default, first and expose as given; expose needs one prefill rank and host
// memory (a Receive carries one sender's params), and a wrong word is a usage error.
func TestSenderFlag(t *testing.T) {
	cases := []struct {
		desc, want, usage string
		args              []string
	}{
		{"the default", bench.SenderAuto, "", nil},
		{"auto with two prefill ranks (after there)", bench.SenderAuto, "", []string{"--prefill-tp", "2"}},
		{"after", bench.SenderAfter, "", []string{"--sender", "after"}},
		{"first", bench.SenderFirst, "", []string{"--sender", "first"}},
		{"first with two prefill ranks", bench.SenderFirst, "", []string{"--sender", "first", "--prefill-tp", "2"}},
		{"expose", bench.SenderExpose, "", []string{"--sender", "expose"}},
		{"expose with two prefill ranks", "", "--sender expose: one prefill rank", []string{"--sender", "expose", "--prefill-tp", "2"}},
		{"expose with device memory", "", "--sender expose: one prefill rank", []string{"--sender", "expose", "--memory", "device"}},
		{"a wrong word", "", `--sender "before": choose auto, after, first or expose`, []string{"--sender", "before"}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			cfg, err := resolveForTest(t, append([]string{"--max-memory", "1GiB", "--layers", "2", "--concurrency", "1"}, tc.args...)...)
			if tc.usage != "" {
				var ue *usageError
				require.ErrorAs(t, err, &ue)
				require.ErrorContains(t, err, tc.usage)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Sender)
		})
	}
}

// --cluster-key reads a key file of 32 bytes, raw or hex; anything else is a usage error that
// names the file, and never prints the key.
func TestClusterKeyFlag(t *testing.T) {
	dir := t.TempDir()
	key := bytes.Repeat([]byte{0xa5}, transfer.ClusterKeyBytes)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	cases := []struct {
		desc  string
		file  string
		usage string // empty: resolves to key
	}{
		{"raw bytes", write("raw", key), ""},
		{"hex with a newline", write("hex", []byte(hex.EncodeToString(key)+"\n")), ""},
		{"too short", write("short", key[:16]), "want 32 random bytes"},
		{"not hex", write("nothex", bytes.Repeat([]byte("zz"), transfer.ClusterKeyBytes)), "want 32 random bytes"},
		{"no such file", filepath.Join(dir, "missing"), "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			cfg, err := resolveForTest(t, "--prompts", "64", "--concurrency", "1", "--max-memory", "256MiB", "--layers", "2", "--cluster-key", tc.file)
			if tc.usage != "" {
				var ue *bench.UsageError
				require.ErrorAs(t, err, &ue)
				require.ErrorContains(t, err, tc.usage)
				require.NotContains(t, err.Error(), hex.EncodeToString(key[:4]))
				return
			}
			require.NoError(t, err)
			require.Equal(t, key, cfg.ClusterKey)
			require.Equal(t, tc.file, cfg.ClusterKeyFile)
		})
	}
	cfg, err := resolveForTest(t, "--prompts", "64", "--concurrency", "1", "--max-memory", "256MiB", "--layers", "2")
	require.NoError(t, err)
	require.Nil(t, cfg.ClusterKey, "no key by default")
}
