// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// run starts its prefill peers as second processes (this test binary, re-executed), meets them
// on the control connection and checks their layouts, for TP=1 and for two TP=2 ranks.
func TestRunStartsItsPeersAndShakesHands(t *testing.T) {
	for _, tp := range []string{"1", "2"} {
		t.Run("prefill-tp="+tp, func(t *testing.T) {
			cfg, err := resolveForTest(t, "--prompts", "64", "--concurrency", "1", "--prefill-tp", tp)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			err = runLoopback(ctx, cfg, outputFlags{duration: 10 * time.Millisecond, maxIters: 3}, "", &outputs{stdout: discard{}, stderr: discard{}}, func(Result) error { return nil })
			require.ErrorIs(t, err, errEngineMissing, "set-up and hello done, then the engine is missing")
			require.Less(t, time.Since(start), 20*time.Second)
		})
	}
}

// A peer that cannot start (here: told to connect to a port nobody listens on is not even
// reached; its configuration is refused) is reported with its last words, not waited for.
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
