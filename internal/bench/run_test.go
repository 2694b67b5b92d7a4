// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// run starts its prefill peers as second processes (this test binary, re-executed), meets them
// on the control connection, checks their layouts, and measures: for TP=1 and for two TP=2
// ranks. In a build without the engine it must stop, after the hello, saying so.
func TestRunLoopback(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, c := range []struct {
		tp, pool string
		key      bool
	}{{"1", "transport", false}, {"2", "transport", false}, {"1", "caller", false}, {"1", "transport", true}} {
		tp := c.tp
		name := "prefill-tp=" + tp + "/pool=" + c.pool
		if c.key { // the peer reads the key from the same file: hellos sealed, claims proven
			name += "/cluster-key"
		}
		t.Run(name, func(t *testing.T) {
			cfg := runFor(t, runSpec{layers: 4, prompts: []int64{64, 256}, concurrency: []int{1, 2}, prefillTP: map[string]int{"1": 1, "2": 2}[tp],
				slotBytes: 256 << 10, memCap: 512 << 20, pool: c.pool, clusterKey: c.key})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var results []Result
			err := Loopback(ctx, cfg, Output{Duration: 20 * time.Millisecond, MaxIters: 20}, "",
				&Outputs{Stdout: discard{}, Stderr: discard{}}, func(r Result) error { results = append(results, r); return nil })
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
				require.Equal(t, c.key, r.ClusterKey, r.Name)
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
	cfg := runFor(t, runSpec{prompts: []int64{64}, concurrency: []int{1}, connectTimeout: 5 * time.Second})
	cfg.Prefill.HeadDim = 0 // the peer refuses this configuration and exits
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := Loopback(ctx, cfg, Output{Duration: 10 * time.Millisecond, MaxIters: 3}, "", &Outputs{Stdout: discard{}, Stderr: discard{}}, func(Result) error { return nil })
	require.ErrorIs(t, err, errPeerUnreachable)
	require.ErrorContains(t, err, "prefill peer 0 exited before connecting")
	require.ErrorContains(t, err, "HeadDim")
	require.Less(t, time.Since(start), 5*time.Second, "noticed the exit, not the timeout")
}
