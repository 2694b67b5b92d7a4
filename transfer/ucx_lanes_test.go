// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// The receiver chooses its path by what UCX says about the endpoint's lanes: gets over shared
// memory (native), tagged IOV messages over TCP (where UCX 1.13 emulates gets), RMA over TCP
// too when told to. Every byte checked.
func TestUCXPathChoiceFollowsTheEndpointsLanes(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tr := range ucxTransports {
		for _, keep := range []bool{false, true} {
			want := PathRMA
			if tr.name == "tcp" && !keep {
				want = PathDirect
			}
			t.Run(tr.name+"/"+map[bool]string{false: "default", true: "RMAWhereEmulated"}[keep], func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.Tuning.RMAMinRegionBytes = 64 << 10
				cfg.Tuning.DirectChunkBytes = 1 << 20
				cfg.Tuning.RMAWhereEmulated = keep
				src := newUCXEngine(t, tr.tls, tr.dev, cfg)
				dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
				require.Equal(t, tr.name == "tcp", ucxOf(dst.tr).GetsEmulated(src.tr.Self()))
				sb, rb := make([]int32, 21), make([]int32, 21)
				for j := range sb {
					sb[j], rb[j] = int32(j*3)%64, int32(63-j)
				}
				s := mappedKV(t, src, dims, layout.BlockMajor, sb, 5)
				r := mappedKV(t, dst, dims, layout.BlockMajor, rb, 0)
				hs, hr := startKV(t, src, dst, 900, s, r)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
				require.Equal(t, want, hr.Path())
				require.Equal(t, want, hs.Path())
				require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
			})
		}
	}
}

// A request's gets go round robin over ucx.Config.Lanes workers, each with its own thread:
// 21 gets over 3 lanes are 7 on each extra worker, every byte arrives, and the pool's key is
// unpacked once per lane. One lane is today's transport: no extra worker at all.
func TestUCXRMA_GetsStripedOverLanes(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tr := range ucxTransports {
		for _, lanes := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/lanes=%d", tr.name, lanes), func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.Tuning.RMAMinRegionBytes = 64 << 10
				cfg.Tuning.DirectChunkBytes = 1 << 20
				cfg.Tuning.RMAWhereEmulated = true
				cfg.Tuning.DisableInPlaceReads = true // the gets themselves, striped (rma_inplace.go copies instead)
				withLanes := func(c *ucx.Config) { c.Lanes = lanes }
				src := newUCXEngine(t, tr.tls, tr.dev, cfg, withLanes)
				dst := newUCXEngine(t, tr.tls, tr.dev, cfg, withLanes)
				sb, rb := make([]int32, 21), make([]int32, 21)
				for j := range sb {
					sb[j], rb[j] = int32(j*3)%64, int32(63-j) // no two consecutive: 21 gets
				}
				s := mappedKV(t, src, dims, layout.BlockMajor, sb, 17)
				r := mappedKV(t, dst, dims, layout.BlockMajor, rb, 0)
				hs, hr := startKV(t, src, dst, 910, s, r)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, PathRMA, hr.Path())
				require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
				extra := laneWorkers(dst.tr)
				if tr.name == "tcp" || !ucxNativeShmGets() {
					// UCX 1.13 emulates gets over TCP, 1.22 over shared memory too: they stay on
					// the transport's own worker (UCX crashed when a peer was killed under gets
					// striped over TCP lanes).
					require.Empty(t, extra, "no lanes where gets are emulated")
					keys := ucxhooks.Hooks.RemoteKeys(dst.tr)
					require.Contains(t, []int{1, 2}, keys, "the pool's key (and the generation words') on one worker")
					return
				}
				require.Len(t, extra, lanes-1)
				for i, w := range extra {
					require.Eventually(t, func() bool { st := w.Stats(); return st.InlineDone+st.Requests == 7 }, 5*time.Second,
						time.Millisecond, "lane %d carried %+v", i+1, w.Stats())
				}
				keys := ucxhooks.Hooks.RemoteKeys(dst.tr)
				// One unpacked key per lane, and the generation words' key on the transport's own
				// worker, unless its packed bytes are the pool's (TCP's keys name no memory).
				require.Contains(t, []int{lanes, lanes + 1}, keys, "one unpacked key per lane (and the generation words')")
				require.Empty(t, laneWorkers(src.tr), "a sender makes no lanes")
			})
		}
	}
}

func laneWorkers(tr *ucx.Transport) []*native.Worker { return ucxhooks.Hooks.LaneWorkers(tr) }

// ucxNativeShmGets: whether the UCX loaded serves gets over shared memory itself. UCX 1.13 does
// (posix); 1.22 gives an endpoint with peer error handling no RMA lane there and emulates them
// (docs/ucx.md, "UCX 1.22"). The two versions kvxfer is tested against.
func ucxNativeShmGets() bool { return strings.HasPrefix(native.UCXVersion(), "1.13.") }

func TestUCXConfig_LanesBounded(t *testing.T) {
	for _, n := range []int{-1, native.MaxLanes + 1} {
		_, err := ucx.New(ucx.Config{TLS: "posix,cma,self", StagingBytes: 1 << 20, Lanes: n})
		var ce *ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "ucx.Config.Lanes", ce.Field)
	}
}
