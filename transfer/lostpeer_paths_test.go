// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL9_PeerLostMidTransferOnEveryPath: a peer lost while a transfer moves, on every path
// (closePaths: staging, the pull wire read with gets or in place, direct IOV messages, RMA gets,
// RMA read in place), the survivor sending or receiving. Every data operation hangs on the wire
// when the transport reports the peer lost and cuts them, memory done: the survivor's handle
// fails with ErrPeerLost naming the peer, and since every operation's end is known nothing is
// poisoned (L9 poisons only unknown quiescence): Quiesced closes, no slot is lost or poisoned.
// TestL11_ASendToALostPeerFailsAtOnceOnEveryPath has the loss before any byte moves; over UCX,
// TestL9_UCXPeerProcessLeavingLeavesNothingPoisoned and TestUCXCMA_PeerKilledMidTransfer.
func TestL9_PeerLostMidTransferOnEveryPath(t *testing.T) {
	for _, pc := range closePaths {
		for _, survivorSends := range []bool{true, false} {
			role := map[bool]string{true: "the survivor sends", false: "the survivor receives"}[survivorSends]
			t.Run(pc.name+"/"+role, func(t *testing.T) {
				cfg := pipelineConfig()
				cfg.DirectChunkBytes, cfg.RMAMinRegionBytes = 2048, 512
				n := mem.NewNetwork()
				src, dst := memPathSide(t, n, "prefill", pc, cfg), memPathSide(t, n, "decode", pc, cfg)
				n.SetFault(func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == wire.KindData} })
				spool, splan := src.kv(t, seqBlocks(0, 16), 5)
				dpool, dplan := dst.kv(t, seqBlocks(32, 16), 0)
				hs, err := src.e.Send(bg, Spec{ID: 9, Peer: dst.self, Plan: splan, Pool: spool})
				require.NoError(t, err)
				hr, err := dst.e.Receive(bg, Spec{ID: 9, Peer: src.self, Plan: dplan, Pool: dpool})
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
					require.Equal(t, Failed, st.State, "%+v", st)
					require.ErrorIs(t, st.Err, ErrPeerLost)
					var pl *PeerLostError
					require.True(t, errors.As(st.Err, &pl), "%v", st.Err)
					require.Equal(t, lost, pl.Peer, "the error names the lost peer")
				}
				require.False(t, st.BlocksPoisoned, "every operation's end was known: %+v", st)
				waitClosed(t, h.Quiesced(), "the survivor's blocks quiesced")
				eventually(t, func() bool { return survivor.e.pool.Stats().Leased == 0 }, "every slot lease ended")
				requireSlotsAccounted(t, survivor.e)
				require.Zero(t, survivor.e.pool.Stats().Poisoned, "no slot poisoned: every operation's end was known")
				eventually(t, func() bool { return survivor.e.Health().InFlight == 0 }, "nothing left in flight")
			})
		}
	}
}
