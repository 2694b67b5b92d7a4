// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// shortSoak is a soak small enough for `go test -race` on two cores, with every fault on and
// the clocks scaled down so each fault fits.
func shortSoak(d time.Duration) Config {
	return Config{
		Duration: d, Concurrency: 64, MaxConcurrent: 32,
		TransferTimeout: 2 * time.Second, QueueTimeout: 2 * time.Second, ProgressDeadline: time.Second,
		QuarantineTimeout: 3 * time.Second, FreezeFor: 2 * time.Second, Grace: 2 * time.Second,
	}
}

func TestSoakWithEveryFaultHoldsEveryInvariant(t *testing.T) {
	cfg := shortSoak(12 * time.Second)
	if testing.Verbose() {
		cfg.Logger = zap.NewExample()
	}
	rep, err := Run(context.Background(), cfg)
	require.NotNil(t, rep)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	t.Log("\n" + table.String())
	require.NoError(t, err)
	require.Zero(t, rep.Wedged)
	require.Zero(t, rep.LeakedSlots)
	require.Zero(t, rep.Corrupt)
	require.Zero(t, rep.ReusedPoisoned)
	require.Positive(t, rep.Completed)
	for _, path := range []string{"staging", "direct", "rma"} { // DirectFraction's requests take both one-copy modes
		require.Positive(t, rep.CompletedByPath[path], "completed by %s: %v", path, rep.CompletedByPath)
	}
	for _, f := range memFaults {
		require.Positive(t, rep.FaultsInjected[f], "fault %s", f)
	}
	if p := os.Getenv("STRESS_REPORT"); p != "" {
		b, _ := json.Marshal(rep)
		require.NoError(t, os.WriteFile(p, b, 0o644))
	}
}

// A prefill peer cut off mid-traffic and restarted: the transfers whose first post fails on
// the lost peer must still release every pipeline slot they leased (L5), on both engines.
func TestL5_LostPeerLeavesNoSlotLeased(t *testing.T) {
	cfg := shortSoak(5 * time.Second)
	cfg.Faults = []Fault{FaultLostPeer}
	rep, err := Run(context.Background(), cfg)
	require.NotNil(t, rep)
	require.NoError(t, err, "breaches: %v", rep.Breaches)
	require.Zero(t, rep.LeakedSlots)
	require.Equal(t, int64(1), rep.FaultsInjected[FaultLostPeer])
}

// NoDirect keeps every request on staging slots.
func TestSoakWithoutDirectUsesOnlyStaging(t *testing.T) {
	cfg := shortSoak(3 * time.Second)
	cfg.NoFaults, cfg.NoDirect = true, true
	rep, err := Run(context.Background(), cfg)
	require.NotNil(t, rep)
	require.NoError(t, err, "breaches: %v", rep.Breaches)
	require.Positive(t, rep.Completed)
	require.Equal(t, map[string]int64{"staging": rep.Completed}, rep.CompletedByPath)
}
