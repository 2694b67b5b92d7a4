// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// run starts its prefill peers as second processes (this test binary, re-executed), meets them
// on the control connection, checks their layouts, and measures: for TP=1 and for two TP=2
// ranks. In a build without the engine it must stop, after the hello, saying so.
func TestRunLoopback(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, c := range []struct{ tp, pool string }{{"1", "transport"}, {"2", "transport"}, {"1", "caller"}} {
		tp := c.tp
		t.Run("prefill-tp="+tp+"/pool="+c.pool, func(t *testing.T) {
			cfg, err := resolveForTest(t, "--layers", "4", "--prompts", "64,256", "--concurrency", "1,2", "--prefill-tp", tp,
				"--slot-size", "256KiB", "--max-memory", "512MiB", "--pool", c.pool)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var results []Result
			err = runLoopback(ctx, cfg, outputFlags{duration: 20 * time.Millisecond, maxIters: 20}, "",
				&outputs{stdout: discard{}, stderr: discard{}}, func(r Result) error { results = append(results, r); return nil })
			if !engineBuilt {
				require.ErrorIs(t, err, errEngineMissing, "set-up and hello done, then the engine is missing")
				return
			}
			require.NoError(t, err)
			require.Len(t, results, 4)
			for _, r := range results {
				require.True(t, r.Verified, r.Name)
				require.Greater(t, r.GBps, 0.0, r.Name)
				require.GreaterOrEqual(t, r.Requests, minIters, r.Name)
				if c.pool == "caller" { // pools the processes mapped and registered go one-copy
					require.Contains(t, []string{"rma", "direct"}, r.Path, r.Name)
				}
			}
		})
	}
}

// A peer that exits before it connects (here: it refuses its configuration) is reported with
// its last words at once, not waited for until the connect timeout.
func TestRunReportsAPeerThatDies(t *testing.T) {
	cfg, err := resolveForTest(t, "--prompts", "64", "--concurrency", "1", "--connect-timeout", "5s")
	require.NoError(t, err)
	cfg.Prefill.HeadDim = 0 // the peer refuses this configuration and exits
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err = runLoopback(ctx, cfg, outputFlags{duration: 10 * time.Millisecond, maxIters: 3}, "", &outputs{stdout: discard{}, stderr: discard{}}, func(Result) error { return nil })
	require.ErrorIs(t, err, errPeerUnreachable)
	require.ErrorContains(t, err, "prefill peer 0 exited before connecting")
	require.ErrorContains(t, err, "HeadDim")
	require.Less(t, time.Since(start), 5*time.Second, "noticed the exit, not the timeout")
}

func resolveForTest(t *testing.T, args ...string) (runConfig, error) {
	t.Helper()
	var f transferFlags
	fs := newFlagSet("run", "run", &outputs{stdout: discard{}, stderr: discard{}})
	f.register(fs, time.Second)
	require.NoError(t, parseFlags(fs, args))
	return f.resolve(func() string { return "" })
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// run --stream measures layer-wise streaming per prompt through internal/streambench and
// prints its figures under streambench's JSON names.
func TestRunStream(t *testing.T) {
	skipWithoutHostCopy(t)
	code, stdout, stderr := runMain(t, time.Minute, "run", "--stream", "--stream-transport", "mem", "--json",
		"--layers", "4", "--prompts", "64,128", "--stream-runs", "1", "--slot-size", "64KiB")
	require.Equal(t, exitOK, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2)
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &r))
	require.Equal(t, "stream custom(llama3-8b) 64", r["name"])
	for _, f := range []string{"exposed_us", "plain_us", "exposed_ratio", "stream_us", "bytes"} {
		require.Contains(t, r, f)
	}
	require.Greater(t, r["plain_us"].(float64), 0.0)

	code, stdout, stderr = runMain(t, time.Minute, "run", "--stream", "--stream-transport", "mem",
		"--layers", "2", "--prompts", "64", "--stream-runs", "1", "--slot-size", "64KiB")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "exposed ratio")

	code, _, stderr = runMain(t, 5*time.Second, "run", "--stream", "--layer-compute", "-1ms")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--layer-compute = -1ms")
}
