// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL11_DrainReceivePostedWhileAbortingHasItsGraceAndQuarantine: a staging receiver that
// aborted with every slot scattering posts and cancels the next chunk's receive once a scatter
// ends (drainAhead). A message that matched that receive before its cancel keeps it busy until
// the message ends, which here never comes (a wire that hangs, as a frozen peer's). The drain
// must be bounded as any abort's operations are: quarantined after CancelGrace, its slot
// poisoned after QuarantineTimeout, the handle cancelled and quiescent. It waited for ever
// (until Close) when the abort had found nothing outstanding and so set no clock (a CI
// rehearsal at load 26: TestCancelInEachStateGivesItsOutcomeAndMemoryRule/backend_unhealthy
// never quiesced).
func TestL11_DrainReceivePostedWhileAbortingHasItsGraceAndQuarantine(t *testing.T) {
	recvCfg := fastConfig()
	recvCfg.Tuning.PipelineDepth = 1 // one slot: while it scatters chunk 0, nothing is posted
	recvCfg.Tuning.CancelGrace = 10 * time.Millisecond
	recvCfg.Tuning.QuarantineTimeout = 300 * time.Millisecond
	p := newPair(t, fastConfig(), recvCfg)
	// Chunk 1 hangs on the wire once a receive matches it (the drain's receive does), and
	// neither side's cancel reaches it: a frozen peer's message, mid-way.
	sent := make(chan struct{}) // closed when the sender posts chunk 1
	var once sync.Once
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		hang := fp.Kind == wire.KindData && fp.Tag.Seq == 1
		if hang {
			once.Do(func() { close(sent) })
		}
		return mem.Fault{Hang: hang, IgnoreCancel: hang}
	})
	src, dst := pools(t, 4)
	m := &stuckMover{Mover: newHostMover(dst.mem), gate: newGate(t)}
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: m})
	require.NoError(t, err)
	waitClosed(t, m.entered, "the receiver scattering chunk 0 (its one slot)")
	// The drain matches chunk 1 only if it is on its way: on a loaded host the sender may not
	// have posted it yet, and an abort that reached the sender first would leave nothing to
	// hang (CI at load 6: the drain's cancel was clean and no slot poisoned).
	waitClosed(t, sent, "the sender posting chunk 1")
	require.Equal(t, CancelRequestedInFlight, p.dst.Cancel(1))
	m.let() // the scatter ends while aborting: the drain's receive goes out and matches chunk 1

	select {
	case <-hr.Quiesced():
	case <-time.After(30 * time.Second): // 10 ms grace + 300 ms quarantine; generous for a loaded host
		require.FailNow(t, "the receiver never quiesced: its drain receive had no clock", "%+v", hr.Status())
	}
	st := hr.Status()
	require.Equal(t, Cancelled, st.State, "%v", st.Err)
	require.ErrorIs(t, st.Err, ErrCancelled)
	require.False(t, st.BlocksPoisoned, "a staging slot is poisoned, never the caller's blocks")
	require.Positive(t, p.dst.Health().Numbers.PoisonedSlots, "the hung drain's slot is poisoned (L9)")
	p.net.Resume()
	waitClosed(t, hs.Done(), "sender done")
}
