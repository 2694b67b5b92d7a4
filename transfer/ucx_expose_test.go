// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/paramhooks"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

var ucxExposeDims = layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}

// ucxExposePaths are closePaths and, over shared memory, CMA: the RMA path reading pools the
// caller mapped and registered with process_vm_readv.
var ucxExposeCMA = closePath{name: "CMA", cfg: func(c *Config) { c.Tuning.DisableInPlaceReads = true }, path: PathRMA}

// ucxExposeRig is exposeRig over the UCX transport tls/dev: the receivers take the sender's
// peer and the secret from the exposure's ContextParams, encoded and decoded as a control
// plane would carry them.
func ucxExposeRig(tls, dev string) exposeRig {
	return exposeRig{
		side: func(t *testing.T, name Peer, pc closePath, cfg Config) closeSide {
			cfg.Tuning.RMAWhereEmulated = true // the RMA mode and the pull wire over TCP too
			pc.cfg(&cfg)
			u := newUCXEngine(t, tls, dev, cfg)
			cma := pc.name == ucxExposeCMA.name
			if cma {
				ucxhooks.Hooks.AllowSameProcessCMA(u.tr) // both engines in this process
			}
			return closeSide{e: u.e, self: u.tr.Self(), kv: func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
				switch {
				case cma:
					k, _ := callerKV(t, u, ucxExposeDims, layout.BlockMajor, ids, seed, "anon")
					return k.mem, k.plan
				case pc.path != PathStaging: // one-copy paths need memory the transport registered
					k := mappedKV(t, u, ucxExposeDims, layout.BlockMajor, ids, seed)
					return k.mem, k.plan
				}
				k := newUCXKV(t, ucxExposeDims, layout.BlockMajor, ids, seed)
				return k.mem, k.plan
			}}
		},
		claimOf: func(t *testing.T, p transport.Params, id RequestID, sender closeSide, _ []byte) (Peer, []byte) {
			blob, err := p.MarshalBinary()
			require.NoError(t, err)
			cp, err := ucx.UnmarshalContextParams(blob)
			require.NoError(t, err)
			require.True(t, paramhooks.Hooks.Anonymous(cp), "the params name no receiver")
			require.Equal(t, id, cp.RequestID)
			require.Equal(t, sender.self, ucx.PeerFromAddress(cp.WorkerAddress))
			return ucx.PeerFromAddress(cp.WorkerAddress), cp.Secret
		},
		specSecret: func() []byte { return nil }, // drawn by Expose
		die: func(t *testing.T, sender closeSide) {
			require.NoError(t, sender.e.Close()) // its worker, and every endpoint to it, gone
		},
	}
}

// TestL10_UCXExposureClaimedOnEveryPath is TestL10_ExposureClaimedOnEveryPath over UCX shared
// memory and TCP, and CMA over shared memory: the receivers take the sender and the secret from
// the exposure's ContextParams blob.
func TestL10_UCXExposureClaimedOnEveryPath(t *testing.T) {
	for _, tr := range ucxTransports {
		paths := closePaths
		if tr.name == "shm" {
			paths = append(paths[:len(paths):len(paths)], ucxExposeCMA)
		}
		for _, pc := range paths {
			t.Run(tr.name+"/"+pc.name, func(t *testing.T) {
				if pc.device {
					t.Skip("a device pool over UCX needs a GPU (ucx.NewDevice); the device rows run over mem with a fake device")
				}
				cfg := ucxTestConfig()
				cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
				// The claim ends it, not a deadline: the shm/direct case's transfer outlasted
				// 10s (and waitClosed's 10s) in a -race run under load.
				cfg.TransferTimeout = time.Minute
				exposeClaimed(t, ucxExposeRig(tr.tls, tr.dev), pc, cfg, ucxExposeDims, 32)
			})
		}
	}
}

// TestL10_UCXUnclaimedExposureIsQueued is TestL10_UnclaimedExposureIsQueued over UCX shared
// memory and TCP; the prefill dies by closing its engine, whose worker address nobody answers
// then.
func TestL10_UCXUnclaimedExposureIsQueued(t *testing.T) {
	for _, tr := range ucxTransports {
		for _, c := range unclaimedCases {
			t.Run(tr.name+"/"+c.desc, func(t *testing.T) {
				exposeUnclaimed(t, ucxExposeRig(tr.tls, tr.dev), c, ucxTestConfig(), ucxExposeDims, 32)
			})
		}
	}
}

// TestUCXExposeSignsItsParams: with cluster keys, an exposure's ContextParams come sealed, so
// the decode's VerifyParams takes them, and refuses them once a field changed (here the
// anonymous flag dropped, which would make them look like a named receiver's).
func TestUCXExposeSignsItsParams(t *testing.T) {
	cfg := ucxTestConfig()
	cfg.ClusterKeys = [][]byte{clusterKey(9)}
	src := newUCXEngine(t, "tcp,self", "lo", cfg)
	dst := newUCXEngine(t, "tcp,self", "lo", cfg)
	k := newUCXKV(t, ucxExposeDims, layout.BlockMajor, seqBlocks(0, 4), 3)
	h, p, err := src.e.Expose(bg, Spec{ID: 5, Plan: k.plan, Pool: k.mem})
	require.NoError(t, err)
	blob, err := p.MarshalBinary()
	require.NoError(t, err)
	cp, err := ucx.UnmarshalContextParams(blob)
	require.NoError(t, err)
	require.True(t, paramhooks.Hooks.Sealed(cp), "sealed")
	require.NoError(t, dst.e.VerifyParams(cp))
	paramhooks.Hooks.SetAnonymous(cp, false)
	require.ErrorIs(t, dst.e.VerifyParams(cp), ErrUnauthenticated)
	require.Equal(t, CancelledBeforeAdvertise, src.e.Cancel(h.ID()))
}
