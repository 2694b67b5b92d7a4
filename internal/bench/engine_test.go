// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// memEngines makes the decode and prefill ends as real transfer.Engines over the engine's
// in-memory transport, so the driver and the adapter are tested against the engine itself,
// without UCX.
func memEngines(t *testing.T, cfg RunConfig) (decode engineSide, prefill []engineSide) {
	t.Helper()
	network := mem.NewNetwork()
	mk := func(name string) engineSide {
		tr := network.Transport(transfer.Peer(name))
		eng, err := transfer.New(tr, engineConfig(cfg))
		require.NoError(t, err)
		t.Cleanup(func() { _ = eng.Close() })
		a := &engineAdapter{eng: eng, addr: []byte(name), peerOf: func(a []byte) transfer.Peer { return transfer.Peer(a) }}
		if !cfg.Staging { // as the UCX adapter: pools the transport may reach in place
			a.mapPool = func(n int64) ([]byte, error) {
				b := make([]byte, n)
				tr.AllowDirect(b)
				return b, nil
			}
			a.direct = tr.Direct
		}
		return a
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
	cases := []struct {
		desc string
		spec func(*runSpec)
		path string
	}{
		{"prefill-tp=1: same layouts, rma gets", func(s *runSpec) { s.prefillTP = 1 }, "rma"},
		{"prefill-tp=1 --no-rma: IOV messages", func(s *runSpec) { s.prefillTP, s.noRMA = 1, true }, "direct"},
		{"prefill-tp=2: half the heads each, ranges too small for gets", func(s *runSpec) { s.prefillTP = 2 }, "direct"},
		{"prefill-tp=1 staging", func(s *runSpec) { s.prefillTP, s.staging = 1, true }, "staging"},
		{"prefill-tp=2 staging", func(s *runSpec) { s.prefillTP, s.staging = 2, true }, "staging"},
		{"block-major to layer-major: conversion by IOV messages", func(s *runSpec) { s.decodeOrder = layout.LayerMajor }, "direct"},
		{"block-major to layer-major staging", func(s *runSpec) { s.decodeOrder, s.staging = layout.LayerMajor, true }, "staging"},
		// With a cluster key the hellos are sealed and each Send takes only a request that
		// proves its secret: a driver that did not hand the secret to both ends fails here.
		{"prefill-tp=1 with a cluster key: rma gets", func(s *runSpec) { s.prefillTP, s.clusterKey = 1, true }, "rma"},
		{"prefill-tp=2 with a cluster key", func(s *runSpec) { s.prefillTP, s.clusterKey = 2, true }, "direct"},
		{"staging with a cluster key", func(s *runSpec) { s.staging, s.clusterKey = true, true }, "staging"},
		// --sender first and expose post the prefill side before the Receive; expose hands the
		// Receive what the exposure gave out (the in-memory transport issues no params: the
		// secret alone, so the claim takes the rma path with an offer, not a one-hop read).
		{"--sender first: rma gets", func(s *runSpec) { s.sender = SenderFirst }, "rma"},
		{"--sender first with a cluster key", func(s *runSpec) { s.sender, s.clusterKey = SenderFirst, true }, "rma"},
		{"--sender first, prefill-tp=2", func(s *runSpec) { s.sender, s.prefillTP = SenderFirst, 2 }, "direct"},
		{"--sender expose: the claim takes rma gets", func(s *runSpec) { s.sender = SenderExpose }, "rma"},
		{"--sender expose with a cluster key", func(s *runSpec) { s.sender, s.clusterKey = SenderExpose, true }, "rma"},
		{"--sender expose staging", func(s *runSpec) { s.sender, s.staging = SenderExpose, true }, "staging"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := smallRun(t, c.spec)
			decode, prefill := memEngines(t, cfg)
			var out strings.Builder
			pr := NewPrinter(&out, true)
			err := runDriver(t, cfg, decode, prefill, Output{JSON: true, Duration: 20 * time.Millisecond, MaxIters: 20}, pr.Add)
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			require.Len(t, lines, 4)
			for _, line := range lines {
				var r Result
				require.NoError(t, json.Unmarshal([]byte(line), &r))
				require.True(t, r.Verified, r.Name)
				require.GreaterOrEqual(t, r.Requests, minIters, r.Name)
				require.Greater(t, r.GBps, 0.0, r.Name)
				require.Equal(t, c.path, r.Path, r.Name)
				require.Equal(t, len(cfg.ClusterKey) > 0, r.ClusterKey, r.Name)
				if cfg.Sender != SenderAfter {
					require.Equal(t, cfg.Sender, r.Sender, r.Name)
					require.True(t, strings.HasSuffix(r.Name, " "+cfg.Sender), r.Name)
				}
				if c.path != "staging" {
					require.Zero(t, r.GatherUs, "the direct path gathers nothing")
					require.Zero(t, r.ScatterUs, "the direct path scatters nothing")
				}
			}
		})
	}
}
