// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL10_CancelOutcomeIsTruthfulOnEveryPath: Cancel's outcome tells the truth on every path
// (closePaths: staging, the pull wire read with gets or in place, direct IOV messages, RMA gets,
// RMA read in place), cancelled by either side, in each phase a transfer on that path passes
// (advertised: only one side asked; in flight: every data operation hangs on the wire, as a
// stopped peer's do). A FreeNow answer finds Quiesced closed when Cancel returns; any other
// answer leaves the caller to wait for Quiesced, which then closes (the hung operations were
// cancelled and the transport said so: nothing is of unknown quiescence, so nothing is
// poisoned and no slot is lost). Both handles end, the cancelled one Cancelled with
// ErrCancelled, the other one not Completed (it never had the bytes), and a second Cancel
// finds a finished transfer. TestCancelInEachStateGivesItsOutcomeAndMemoryRule checks every
// outcome on the staging path; a queued transfer has no path yet
// (TestL10_FreeNowCancelFindsDoneAndQuiescedClosed).
func TestL10_CancelOutcomeIsTruthfulOnEveryPath(t *testing.T) {
	type phase struct {
		name  string
		start func(t *testing.T, src, dst closeSide, n *mem.Network, cancelSender bool) (cancelled, other *Handle)
	}
	spec := func(t *testing.T, side closeSide, peer Peer, blocks []int32, seed uint64) Spec {
		pool, plan := side.kv(t, blocks, seed)
		return side.spec(Spec{ID: 7, Peer: peer, Plan: plan}, pool)
	}
	phases := []phase{
		{"asked by one side only", func(t *testing.T, src, dst closeSide, _ *mem.Network, cancelSender bool) (*Handle, *Handle) {
			// Only the cancelled side asked, and the other side never comes: a Send waits
			// Queued for the receiver's request, a Receive Advertised (its request sent).
			var h *Handle
			var err error
			want := Advertised
			if cancelSender {
				want = Queued
				h, err = src.e.Send(bg, spec(t, src, dst.self, seqBlocks(0, 16), 3))
			} else {
				h, err = dst.e.Receive(bg, spec(t, dst, src.self, seqBlocks(32, 16), 0))
			}
			require.NoError(t, err)
			eventually(t, func() bool { return h.Status().State == want }, want.String())
			return h, nil
		}},
		{"in flight", func(t *testing.T, src, dst closeSide, n *mem.Network, cancelSender bool) (*Handle, *Handle) {
			n.SetFault(func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == wire.KindData} })
			hs, err := src.e.Send(bg, spec(t, src, dst.self, seqBlocks(0, 16), 3))
			require.NoError(t, err)
			hr, err := dst.e.Receive(bg, spec(t, dst, src.self, seqBlocks(32, 16), 0))
			require.NoError(t, err)
			eventually(t, func() bool { return n.OnWire() > 0 }, "an operation hung on the wire")
			// Which side is past Advertised depends on the path (the sender of the staging path
			// waits for the receiver's credits, the RMA receiver reads what the sender exposed).
			t.Logf("on the wire: sender %v, receiver %v", hs.Status().State, hr.Status().State)
			if cancelSender {
				return hs, hr
			}
			return hr, hs
		}},
	}
	for _, pc := range closePaths {
		for _, ph := range phases {
			for _, cancelSender := range []bool{true, false} {
				side := map[bool]string{true: "sender", false: "receiver"}[cancelSender]
				t.Run(pc.name+"/"+ph.name+"/the "+side+" cancels", func(t *testing.T) {
					cfg := pipelineConfig()
					cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 2048, 512
					cfg.TransferTimeout, cfg.Tuning.QuarantineTimeout = time.Minute, time.Minute // the cancel, not a timer, ends it
					n := mem.NewNetwork()
					src, dst := memPathSide(t, n, "prefill", pc, cfg), memPathSide(t, n, "decode", pc, cfg)
					h, other := ph.start(t, src, dst, n, cancelSender)
					e := map[bool]*Engine{true: src.e, false: dst.e}[cancelSender]
					if other != nil {
						require.Equal(t, pc.path, h.Path(), "the transfer is on the path under test")
						require.Equal(t, pc.pull, h.Pulled())
					}

					out := e.Cancel(h.ID())
					if out.FreeNow() {
						require.True(t, isClosed(h.Quiesced()), "Cancel answered %v with Quiesced open", out)
						require.True(t, isClosed(h.Done()), "Cancel answered %v with Done open", out)
					}
					want := CancelRequestedInFlight
					if other == nil && cancelSender { // a Send still queued
						want = CancelledBeforeAdvertise
					}
					require.Equal(t, want, out, "%s: %+v", ph.name, h.Status())

					n.SetFault(nil)
					n.Resume()
					waitClosed(t, h.Quiesced(), "the cancelled handle quiesced")
					waitClosed(t, h.Done(), "the cancelled handle done")
					st := h.Status()
					require.Equal(t, Cancelled, st.State, "%+v", st)
					require.ErrorIs(t, st.Err, ErrCancelled)
					require.False(t, st.BlocksPoisoned, "every operation's end was known: nothing to poison")
					if other != nil {
						waitClosed(t, other.Quiesced(), "the other side's handle quiesced")
						waitClosed(t, other.Done(), "the other side's handle done")
						ost := other.Status()
						require.True(t, ost.State.Terminal(), "%+v", ost)
						// Completed only with every byte: a receiver that reads the sender's slot in
						// place (no operation on the wire) may have read them all before the
						// sender's cancel reached it.
						require.True(t, ost.State != Completed || ost.Bytes == ost.Total, "%+v", ost)
						require.False(t, ost.BlocksPoisoned, "%+v", ost)
					}
					require.Equal(t, AlreadyComplete, e.Cancel(h.ID()), "a second cancel finds the transfer ended")
					hSide, otherSide := dst, src
					if cancelSender {
						hSide, otherSide = src, dst
					}
					requireDeviceHolds(t, hSide, h)
					if other != nil {
						requireDeviceHolds(t, otherSide, other)
					}
					for _, eng := range []*Engine{src.e, dst.e} {
						eventually(t, func() bool { st := eng.pool.Stats(); return st.Leased == 0 }, "every slot lease ended")
						requireSlotsAccounted(t, eng)
						require.Zero(t, eng.pool.Stats().Poisoned, "no slot poisoned: every operation's end was known")
					}
				})
			}
		}
	}
}
