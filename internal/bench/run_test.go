// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// run starts its prefill peers as second processes (this test binary, re-executed), meets them
// on the control connection, checks their layouts, and measures: for TP=1 and for two TP=2
// ranks. In a build without the engine it must stop, after the hello, saying so.
func TestRunLoopback(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, c := range []struct {
		desc                string
		prefillTP, decodeTP int
		order               layout.Order
		pool                string
		key                 bool
		path                string // the path every row took; "" leaves it to the engine
	}{
		{desc: "prefill-tp=1/pool=transport", pool: "transport"},
		{desc: "prefill-tp=2/pool=transport", prefillTP: 2, pool: "transport"},
		{desc: "prefill-tp=1/pool=caller", pool: "caller"},
		// the peer reads the key from the same file: hellos sealed, claims proven
		{desc: "prefill-tp=1/pool=transport/cluster-key", pool: "transport", key: true},
		// one prefill pool read by two decode ranks, each half the heads of a token: 1 KiB
		// pieces, read by vector gets (docs/onecopy.md, "Vector gets")
		{desc: "decode-tp=2/layer-major-nhd/pool=transport", decodeTP: 2, order: layout.LayerMajorNHD, pool: "transport", path: "rma"},
		{desc: "decode-tp=2/layer-major-nhd/pool=caller", decodeTP: 2, order: layout.LayerMajorNHD, pool: "caller", path: "rma"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := runFor(t, runSpec{layers: 4, prompts: []int64{64, 256}, concurrency: []int{1, 2}, prefillTP: c.prefillTP, decodeTP: c.decodeTP,
				order: c.order, slotBytes: 256 << 10, memCap: 512 << 20, pool: c.pool, clusterKey: c.key})
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
				if c.path != "" {
					require.Equal(t, c.path, r.Path, r.Name)
				}
				if c.decodeTP > 1 {
					require.Equal(t, c.decodeTP, r.DecodeTP, r.Name)
					require.Contains(t, r.Name, "tp1>2")
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

// --sender expose over UCX: the prefill process exposes each request and its params reach the
// decode process's Receive, which reads the prefill pool at once where the params carry a
// one-hop read's section (path rma-one-hop): over shared memory, and over TCP where gets are
// kept though emulated; over TCP without them the claim takes IOV messages. --sender first
// posts a named Send before the Receive and takes the rma path's offer. Every byte checked.
func TestRunLoopback_SenderFlows(t *testing.T) {
	skipWithoutHostCopy(t)
	cases := []struct {
		desc, sender, tls string
		emulated          bool
		path              string
		key               bool // a cluster key: the params come signed, the decode end verifies them
	}{
		{"expose over shared memory: one-hop reads", SenderExpose, "posix,cma,self", false, "rma-one-hop", false},
		{"expose over tcp, gets kept: one-hop reads", SenderExpose, "tcp,self", true, "rma-one-hop", false},
		{"expose over tcp: IOV messages", SenderExpose, "tcp,self", false, "direct", false},
		{"first over shared memory: an offer, then gets", SenderFirst, "posix,cma,self", false, "rma", false},
		{"expose over shared memory with a cluster key: one-hop reads", SenderExpose, "posix,cma,self", false, "rma-one-hop", true},
		// auto (the default): the latency rows expose (one-hop), the transfer rows after.
		{"auto over shared memory: latency rows one-hop", SenderAuto, "posix,cma,self", false, "rma", false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := runFor(t, runSpec{layers: 4, prompts: []int64{64}, concurrency: []int{1, 4}, slotBytes: 256 << 10,
				memCap: 512 << 20, tls: c.tls, sender: c.sender, rmaEmulated: c.emulated, latency: c.sender == SenderAuto, clusterKey: c.key})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var results []Result
			err := Loopback(ctx, cfg, Output{Duration: 20 * time.Millisecond, MaxIters: 20}, "",
				&Outputs{Stdout: discard{}, Stderr: discard{}}, func(r Result) error { results = append(results, r); return nil })
			if !engineBuilt {
				require.ErrorIs(t, err, errEngineMissing)
				return
			}
			require.NoError(t, err)
			if c.sender != SenderAuto {
				require.Len(t, results, 2)
			}
			latencyRows := 0
			for _, r := range results {
				require.True(t, r.Verified, r.Name)
				require.GreaterOrEqual(t, r.Requests, minIters, r.Name)
				if c.sender == SenderAuto {
					if r.Op == "latency" {
						latencyRows++
						require.Equal(t, SenderExpose, r.Sender, r.Name)
						require.Equal(t, "rma-one-hop", r.Path, r.Name)
						require.True(t, strings.HasSuffix(r.Name, " expose"), r.Name)
						continue
					}
					require.Empty(t, r.Sender, r.Name)
					require.NotContains(t, r.Name, "expose")
					require.Equal(t, c.path, r.Path, r.Name)
					continue
				}
				require.Equal(t, c.sender, r.Sender, r.Name)
				require.Equal(t, c.path, r.Path, r.Name)
			}
			if c.sender == SenderAuto {
				require.Equal(t, 4, latencyRows, "32 tokens and one block's layer, at concurrency 1 and 16")
			}
		})
	}
}
