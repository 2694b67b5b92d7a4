// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// Over TCP only, a UCX transport opens UCX without RMA unless ucx.Config.ServeEmulatedRMA is
// set (docs/security.md, "What UCX itself serves to a connected peer"), and the engine takes
// no route that needs gets from such a transport, on either side: a receiver without RMA
// never asks for an offer or the pull wire, a sender without it declines both, and the data
// moves by messages, every byte. Both sides with RMA over TCP still take the RMA mode and
// the pull wire where Tuning.RMAWhereEmulated asks for them (the routes exist; only the
// default changed).
func TestUCXTCPOnly_NoRMARouteWithoutRMA(t *testing.T) {
	tcp := ucxTransports[1]
	require.Equal(t, "tcp", tcp.name)
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cases := []struct {
		desc             string
		sendRMA, recvRMA bool // the engine keeps the RMA mode over TCP, its transport serving RMA
		staging          bool // both on the staging path (the pull wire where it runs)
		wantPath         Path
		wantPulled       bool
	}{
		{"direct: neither side serves RMA (the default)", false, false, false, PathDirect, false},
		{"direct: the receiver asks, the sender serves no RMA and declines", false, true, false, PathDirect, false},
		{"direct: the sender serves RMA, the receiver has none and never asks", true, false, false, PathDirect, false},
		{"direct: both serve RMA over TCP", true, true, false, PathRMA, false},
		{"staging: the receiver asks for the pull wire, the sender serves no RMA and declines", false, true, true, PathStaging, false},
		{"staging: both serve RMA over TCP", true, true, true, PathStaging, true},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			engine := func(rma bool) *ucxEngine {
				cfg := ucxTestConfig()
				cfg.Tuning.RMAWhereEmulated = rma // newUCXEngine: ServeEmulatedRMA with it
				cfg.Tuning.RMAMinRegionBytes = 64 << 10
				cfg.Tuning.DisableDirect = c.staging
				u := newUCXEngine(t, tcp.tls, tcp.dev, cfg)
				require.Equal(t, rma, ucxOf(u.tr).ServesRMA())
				return u
			}
			src, dst := engine(c.sendRMA), engine(c.recvRMA)
			blocks := make([]int32, 21)
			for j := range blocks {
				blocks[j] = int32(j + 4)
			}
			s := mappedKV(t, src, dims, layout.BlockMajor, blocks, uint64(i+1))
			r := mappedKV(t, dst, dims, layout.BlockMajor, blocks, 0)
			hs, hr := startKV(t, src, dst, RequestID(900+i), s, r)
			waitQuiesced(t, hr, 60*time.Second)
			waitQuiesced(t, hs, 60*time.Second)
			require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
			require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
			require.Equal(t, c.wantPath, hr.Path())
			require.Equal(t, c.wantPath, hs.Path())
			require.Equal(t, c.wantPulled, hr.Pulled(), "the pull wire")
			require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
			for _, e := range []*Engine{src.e, dst.e} {
				require.Zero(t, e.pool.Stats().Leased)
			}
		})
	}
}

// An engine told to keep the RMA mode where gets are emulated (Tuning.RMAWhereEmulated) over
// a transport that serves no RMA is refused at New with a ConfigError naming the setting,
// rather than discovered as declined offers; over a transport that serves RMA, or with the
// RMA mode off, it starts.
func TestUCXTCPOnly_NewRefusesRMAWhereEmulatedWithoutRMA(t *testing.T) {
	cases := []struct {
		desc       string
		tls, dev   string
		serve      bool // ucx.Config.ServeEmulatedRMA
		disableRMA bool
		refused    bool
	}{
		{"tcp only, no RMA: refused", "tcp,self", "lo", false, false, true},
		{"tcp only, ServeEmulatedRMA", "tcp,self", "lo", true, false, false},
		{"tcp only, no RMA, DisableRMA too", "tcp,self", "lo", false, true, false},
		{"shared memory", "posix,cma,self", "", false, false, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := ucxTestConfig().withDefaults()
			cfg.Tuning.NumSlots = cfg.MaxConcurrent * cfg.Tuning.PipelineDepth
			cfg.Tuning.RMAWhereEmulated, cfg.Tuning.DisableRMA = true, c.disableRMA
			tr, err := ucx.New(ucx.Config{TLS: c.tls, NetDevices: c.dev, StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes,
				CloseTimeout: 2 * time.Second, ProbeInterval: -1, ServeEmulatedRMA: c.serve})
			require.NoError(t, err)
			cfg.StagingMemory = tr.StagingMemory()
			e, err := New(tr, cfg)
			if !c.refused {
				require.NoError(t, err)
				require.NoError(t, e.Close())
				return
			}
			require.NoError(t, tr.Close(true))
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, "Tuning.RMAWhereEmulated", ce.Field)
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}
