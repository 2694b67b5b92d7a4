// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
)

// memEngines makes the decode and prefill ends as real transfer.Engines over the engine's
// in-memory transport, so the driver and the adapter are tested against the engine itself,
// without UCX.
func memEngines(t *testing.T, cfg runConfig) (decode engineSide, prefill []engineSide) {
	t.Helper()
	network := transfer.NewMemNetwork()
	mk := func(name string) engineSide {
		eng, err := transfer.New(network.Transport(transfer.Peer(name)), engineConfig(cfg))
		require.NoError(t, err)
		t.Cleanup(func() { _ = eng.Close() })
		return &engineAdapter{eng: eng, addr: []byte(name), peerOf: func(a []byte) transfer.Peer { return transfer.Peer(a) }}
	}
	decode = mk("decode")
	for r := range cfg.PrefillTP {
		prefill = append(prefill, mk("prefill"+string(rune('0'+r))))
	}
	return decode, prefill
}

// The driver over the real engine: every scenario measured and every byte checked, for the
// same TP on both ends and for two prefill ranks feeding one decode rank.
func TestDriverOverTheEngine(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, tp := range []string{"1", "2"} {
		t.Run("prefill-tp="+tp, func(t *testing.T) {
			cfg := smallRun(t, "--prefill-tp", tp)
			decode, prefill := memEngines(t, cfg)
			var out strings.Builder
			pr := &printer{w: &out, json: true}
			err := runDriver(t, cfg, decode, prefill, outputFlags{json: true, duration: 20 * time.Millisecond, maxIters: 20}, pr.add)
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			require.Len(t, lines, 4)
			for _, line := range lines {
				var r Result
				require.NoError(t, json.Unmarshal([]byte(line), &r))
				require.True(t, r.Verified, r.Name)
				require.GreaterOrEqual(t, r.Requests, minIters, r.Name)
				require.Greater(t, r.GBps, 0.0, r.Name)
			}
		})
	}
}
