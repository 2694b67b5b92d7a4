// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// TestL1_UCXCloseWithTransfersInFlightOnEveryPath is TestL1_CloseWithTransfersInFlightOnEveryPath
// over the real UCX transport, shared memory and TCP, where Close unmaps memory: the staging
// slots, the pools the transport allocated, the peers' slots and pools mapped here, the
// generation words. Closing an engine with transfers moving killed the process (SIGSEGV) when
// a mover worker still copied into a staging slot the transport had unmapped.
func TestL1_UCXCloseWithTransfersInFlightOnEveryPath(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	// closePaths are mem's too; CMA (process_vm_readv of pools the test mapped and registered)
	// exists only over UCX shared memory.
	cma := closePath{name: "CMA", cfg: func(*Config) {}, path: PathRMA}
	for _, tr := range ucxTransports {
		for _, pc := range append(closePaths[:len(closePaths):len(closePaths)], cma) {
			for _, closeSender := range []bool{true, false} {
				side := map[bool]string{true: "sender", false: "receiver"}[closeSender]
				t.Run(tr.name+"/"+pc.name+"/close the "+side, func(t *testing.T) {
					if pc.device {
						t.Skip("a device pool over UCX needs a GPU (ucx.NewDevice); the device rows run over mem with a fake device")
					}
					if tr.name == "tcp" && (pc.path == PathRMA || pc.pull) {
						// Gets over TCP are UCX's emulation (RMAWhereEmulated, off by default): UCX
						// 1.13 aborted the whole test process in its get handler ("Fatal: unexpected
						// error: Endpoint timeout") once in a full -race run when an engine closed
						// under them, as it asserts in uct_tcp_ep_pending_purge (ucx_goodbye_test.go).
						// A UCX defect, not Close's; shared memory covers these paths.
						t.Skip("UCX 1.13 may abort the process when an endpoint closes under emulated gets over TCP")
					}
					if pc.name == cma.name && tr.name != "shm" {
						t.Skip("process_vm_readv reads a peer on this host: shared memory only")
					}
					cfg := ucxTestConfig()
					// 1 MiB slots, and a grace shorter than a copy: Close finds copies queued
					// and running on the mover workers.
					cfg.SlotBytes, cfg.Tuning.PipelineDepth, cfg.Tuning.CancelGrace = 1<<20, 4, time.Microsecond
					cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
					cfg.Tuning.RMAWhereEmulated = true              // the RMA mode and the pull wire over TCP too
					cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
					pc.cfg(&cfg)
					var trs []*ucx.Transport
					mk := func() closeSide {
						u := newUCXEngine(t, tr.tls, tr.dev, cfg)
						trs = append(trs, u.tr)
						if pc.name == cma.name {
							ucxhooks.Hooks.AllowSameProcessCMA(u.tr) // both engines in this process
						}
						side := closeSide{e: u.e, self: u.tr.Self()}
						if pc.path == PathStaging { // copies on the mover workers that take a while
							side.mover = func(pool []byte) Mover { return slowMover{Mover: newHostMover(pool), delay: 20 * time.Millisecond} }
						}
						side.kv = func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
							k := newUCXKV(t, dims, layout.BlockMajor, ids, seed)
							switch {
							case pc.name == cma.name: // mapped here and registered; Close releases the registration
								mem := mmapPool(t, len(k.mem), "anon")
								copy(mem, k.mem)
								r, err := u.tr.RegisterHost(mem)
								require.NoError(t, err)
								k.mem = r.Pool()
							case pc.path != PathStaging: // one-copy paths need memory the transport registered
								k = mappedKV(t, u, dims, layout.BlockMajor, ids, seed)
							}
							return k.mem, k.plan
						}
						return side
					}
					src, dst := mk(), mk()
					closeMidTransfer(t, src, dst, pc, closeSender, 32)
					if pc.name == cma.name {
						require.NotZero(t, ucxOf(trs[1]).CMAStats().Gets, "the reads went by process_vm_readv")
					}
				})
			}
		}
	}
}
