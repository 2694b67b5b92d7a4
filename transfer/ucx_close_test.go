// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/layout"
)

// TestL1_UCXCloseWithTransfersInFlightOnEveryPath is TestL1_CloseWithTransfersInFlightOnEveryPath
// over the real UCX transport, shared memory and TCP, where Close unmaps memory: the staging
// slots, the pools the transport allocated, the peers' slots and pools mapped here, the
// generation words. Closing an engine with transfers moving killed the process (SIGSEGV) when
// a mover worker still copied into a staging slot the transport had unmapped.
func TestL1_UCXCloseWithTransfersInFlightOnEveryPath(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tr := range ucxTransports {
		for _, pc := range closePaths {
			for _, closeSender := range []bool{true, false} {
				side := map[bool]string{true: "sender", false: "receiver"}[closeSender]
				t.Run(tr.name+"/"+pc.name+"/close the "+side, func(t *testing.T) {
					if tr.name == "tcp" && (pc.path == PathRMA || pc.pull) {
						// Gets over TCP are UCX's emulation (RMAWhereEmulated, off by default): UCX
						// 1.13 aborted the whole test process in its get handler ("Fatal: unexpected
						// error: Endpoint timeout") once in a full -race run when an engine closed
						// under them, as it asserts in uct_tcp_ep_pending_purge (ucx_goodbye_test.go).
						// A UCX defect, not Close's; shared memory covers these paths.
						t.Skip("UCX 1.13 may abort the process when an endpoint closes under emulated gets over TCP")
					}
					cfg := ucxTestConfig()
					// 1 MiB slots, and a grace shorter than a copy: Close finds copies queued
					// and running on the mover workers.
					cfg.SlotBytes, cfg.Tuning.PipelineDepth, cfg.Tuning.CancelGrace = 1<<20, 4, time.Microsecond
					cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
					cfg.Tuning.RMAWhereEmulated = true              // the RMA mode and the pull wire over TCP too
					cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
					pc.cfg(&cfg)
					mk := func() closeSide {
						u := newUCXEngine(t, tr.tls, tr.dev, cfg)
						side := closeSide{e: u.e, self: u.tr.Self()}
						if pc.path == PathStaging { // copies on the mover workers that take a while
							side.mover = func(pool []byte) Mover { return slowMover{Mover: newHostMover(pool), delay: 20 * time.Millisecond} }
						}
						side.kv = func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
							k := newUCXKV(t, dims, layout.BlockMajor, ids, seed)
							if pc.path != PathStaging { // one-copy paths need memory the transport registered
								k = mappedKV(t, u, dims, layout.BlockMajor, ids, seed)
							}
							return k.mem, k.plan
						}
						return side
					}
					closeMidTransfer(t, mk(), mk(), pc, closeSender, 32)
				})
			}
		}
	}
}
