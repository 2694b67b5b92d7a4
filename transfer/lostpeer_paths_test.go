// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL9_PeerLostMidTransferOnEveryPath: a peer lost while a transfer moves, on every path
// (closePaths: staging, the pull wire read with gets or in place, direct IOV messages, RMA gets,
// RMA read in place), the survivor sending or receiving. Every data operation hangs on the wire
// when the transport reports the peer lost and cuts them. The survivor's handle ends with
// ErrPeerLost naming the peer (a *PeerLostError). When the cut operations' ends are known
// (memory done) nothing is poisoned: Quiesced closes, no slot is lost. When they are not
// (mem.Fault.NeverQuiesce) the memory they may touch is poisoned and only it (L9): the staging
// slots, or the caller's blocks on the one-copy paths, whose Quiesced then never closes; a
// sender whose receiver read its memory had no operation of its own, and its exposure ends
// with the reader (L10). TestL11_ASendToALostPeerFailsAtOnceOnEveryPath has the loss before any
// byte moves; over UCX, TestL9_UCXPeerProcessLeavingLeavesNothingPoisoned and
// TestUCXCMA_PeerKilledMidTransfer.
func TestL9_PeerLostMidTransferOnEveryPath(t *testing.T) {
	for _, pc := range closePaths {
		for _, survivorSends := range []bool{true, false} {
			for _, unknown := range []bool{false, true} {
				role := map[bool]string{true: "the survivor sends", false: "the survivor receives"}[survivorSends]
				role += map[bool]string{true: "/ends unknown", false: "/ends known"}[unknown]
				t.Run(pc.name+"/"+role, func(t *testing.T) {
					cfg := pipelineConfig()
					cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 2048, 512
					cfg.Tuning.QuarantineTimeout = 200 * time.Millisecond
					n := mem.NewNetwork()
					src, dst := memPathSide(t, n, "prefill", pc, cfg), memPathSide(t, n, "decode", pc, cfg)
					n.SetFault(func(fp mem.FaultPoint) mem.Fault {
						return mem.Fault{Hang: fp.Kind == wire.KindData, NeverQuiesce: unknown}
					})
					spool, splan := src.kv(t, seqBlocks(0, 16), 5)
					dpool, dplan := dst.kv(t, seqBlocks(32, 16), 0)
					hs, err := src.e.Send(bg, src.spec(Spec{ID: 9, Peer: dst.self, Plan: splan}, spool))
					require.NoError(t, err)
					hr, err := dst.e.Receive(bg, dst.spec(Spec{ID: 9, Peer: src.self, Plan: dplan}, dpool))
					require.NoError(t, err)
					eventually(t, func() bool { return n.OnWire() > 0 }, "an operation hung on the wire")
					require.Equal(t, pc.path, hr.Path(), "the transfer is on the path under test")
					require.Equal(t, pc.pull, hr.Pulled())

					survivor, h, lost := dst, hr, src.self
					if survivorSends {
						survivor, h, lost = src, hs, dst.self
					}
					n.LosePeer(lost)
					waitClosed(t, h.Done(), "the survivor's handle done")
					st := h.Status()
					if st.State == Completed { // a receiver that read every byte in place first
						require.False(t, survivorSends, "a sender completes only when its receiver said so: %+v", st)
						require.Equal(t, st.Total, st.Bytes)
					} else {
						require.True(t, st.State == Failed || unknown && st.State == Quarantined, "%+v", st)
						require.ErrorIs(t, st.Err, ErrPeerLost)
						var pl *PeerLostError
						require.True(t, errors.As(st.Err, &pl), "%v", st.Err)
						require.Equal(t, lost, pl.Peer, "the error names the lost peer")
					}
					// What is poisoned: nothing when every end was known, or when the survivor had
					// no operation of its own (a sender whose receiver read its slot or pool: the
					// exposure ends with its reader); else the staging slots its operations used,
					// or the caller's blocks on the one-copy paths (and the in-place read's).
					want := "nothing"
					switch {
					case !unknown || survivorSends && (pc.pull || pc.path == PathRMA):
					case pc.path == PathStaging && !(pc.in && !survivorSends):
						want = "slots"
					default:
						want = "blocks"
					}
					eventually(t, func() bool {
						return survivor.e.pool.Stats().Leased == 0 && (want != "blocks" || h.Status().BlocksPoisoned)
					}, "every slot lease ended, the blocks poisoned where they must be")
					requireSlotsAccounted(t, survivor.e)
					st, slots := h.Status(), survivor.e.pool.Stats()
					require.Equal(t, want == "blocks", st.BlocksPoisoned, "blocks poisoned: %+v", st)
					require.Equal(t, want == "slots", slots.Poisoned > 0, "slots poisoned: %+v", slots)
					if want == "blocks" {
						require.False(t, isClosed(h.Quiesced()), "poisoned blocks never quiesce")
					} else {
						waitClosed(t, h.Quiesced(), "the survivor's blocks quiesced")
					}
					requireDeviceHolds(t, survivor, h) // a poisoned device pool stays held
					eventually(t, func() bool { return survivor.e.Health().Numbers.InFlight == 0 }, "nothing left in flight")
				})
			}
		}
	}
}

// TestL9_PeerLostWhileQuarantinedOnEveryPath: a hung peer a supervisor ends. Every data
// operation hangs on the wire, the survivor's request passes its deadline and quarantines
// with them outstanding (a sender's RMA exposure or announced slots still read by the
// receiver); then the transport reports the peer lost and cuts them, their ends known. The
// survivor resolves at once, Failed with its deadline's error: nothing poisoned, Quiesced
// closed, long before the quarantine's clock (30 s) runs out. It used to
// wait out that clock on the RMA path (the exposure ended with its lost reader, but the
// transfer, aborting already, never looked again). Over UCX:
// TestL9_UCXPeerFrozenPastItsDeadlineOnEveryPath.
func TestL9_PeerLostWhileQuarantinedOnEveryPath(t *testing.T) {
	for _, pc := range closePaths {
		for _, survivorSends := range []bool{true, false} {
			role := map[bool]string{true: "the survivor sends", false: "the survivor receives"}[survivorSends]
			t.Run(pc.name+"/"+role, func(t *testing.T) {
				cfg := pipelineConfig()
				cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 2048, 512
				cfg.Tuning.QuarantineTimeout = 30 * time.Second
				n := mem.NewNetwork()
				src, dst := memPathSide(t, n, "prefill", pc, cfg), memPathSide(t, n, "decode", pc, cfg)
				n.SetFault(func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == wire.KindData} })
				spool, splan := src.kv(t, seqBlocks(0, 16), 5)
				dpool, dplan := dst.kv(t, seqBlocks(32, 16), 0)
				const deadline = 300 * time.Millisecond
				sTimeout, rTimeout := time.Minute, time.Minute
				if survivorSends {
					sTimeout = deadline
				} else {
					rTimeout = deadline
				}
				hs, err := src.e.Send(bg, src.spec(Spec{ID: 9, Peer: dst.self, Plan: splan, Timeout: sTimeout}, spool))
				require.NoError(t, err)
				hr, err := dst.e.Receive(bg, dst.spec(Spec{ID: 9, Peer: src.self, Plan: dplan, Timeout: rTimeout}, dpool))
				require.NoError(t, err)
				eventually(t, func() bool { return n.OnWire() > 0 }, "an operation hung on the wire")
				require.Equal(t, pc.path, hr.Path(), "the transfer is on the path under test")

				survivor, h, lost := dst, hr, src.self
				if survivorSends {
					survivor, h, lost = src, hs, dst.self
				}
				waitClosed(t, h.Done(), "the survivor's handle done at its deadline")
				st := h.Status()
				if st.State == Completed { // a receiver that read every byte in place first
					require.False(t, survivorSends, "a sender completes only when its receiver said so: %+v", st)
					return
				}
				require.ErrorIs(t, st.Err, ErrDeadline)
				// Past the abort's grace: what the hung peer holds keeps the transfer quarantined.
				time.Sleep(cfg.Tuning.CancelGrace + 50*time.Millisecond)
				quarantined := h.Status().State == Quarantined
				n.LosePeer(lost)
				lostAt := time.Now()
				waitClosed(t, h.Quiesced(), "the survivor's blocks quiesced once its peer was lost")
				t.Logf("quarantined before the loss %v; quiesced %v after it", quarantined, time.Since(lostAt).Round(time.Millisecond))
				require.Less(t, time.Since(lostAt), cfg.Tuning.QuarantineTimeout/2, "resolved by the loss, not the quarantine's clock")
				st = h.Status()
				require.Equal(t, Failed, st.State, "%v", st.Err)
				require.ErrorIs(t, st.Err, ErrDeadline)
				require.False(t, st.BlocksPoisoned)
				requireDeviceHolds(t, survivor, h)
				eventually(t, func() bool { return survivor.e.pool.Stats().Leased == 0 }, "every slot lease ended")
				requireSlotsAccounted(t, survivor.e)
				require.Zero(t, survivor.e.pool.Stats().Poisoned, "slots poisoned")
				eventually(t, func() bool { return survivor.e.Health().Numbers.InFlight == 0 }, "nothing left in flight")
			})
		}
	}
}
