// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// quarantineCounter counts the quarantines an engine reports (what kvxfer_quarantines_total
// counts).
type quarantineCounter struct {
	nopObserver
	n atomic.Int64
}

func (q *quarantineCounter) OnQuarantine(RequestID, int, error) { q.n.Add(1) }

// A plain cancel by the receiver mid-flight, on every path: its operations (receives, gets of
// the sender's slots or pool, the read of a generation word) are on the wire for longer than
// the sender's CancelGrace, and end well within the receiver's. The receiver's abort goes once
// they have ended, so it proves the receiver reads nothing any more: the sender ends
// Cancelled (the peer withdrew its request), never quarantined, with no quarantine reported,
// and both sides quiesce. It used to be an incident on the RMA mode: the sender waited its
// CancelGrace for a release that came later, logged "transfer quarantined" and ended Failed.
func TestL3_ReceiversCancelIsACleanCancelForTheSenderOnEveryPath(t *testing.T) {
	const onWire = 200 * time.Millisecond
	for _, mp := range memPaths() {
		t.Run(mp.name, func(t *testing.T) {
			scfg, rcfg := fastConfig(), fastConfig()
			scfg.Tuning.CancelGrace = 20 * time.Millisecond // shorter than a data operation takes
			rcfg.Tuning.CancelGrace = 5 * time.Second       // longer: the receiver's operations end in it
			sq, rq := &quarantineCounter{}, &quarantineCounter{}
			scfg.Observer, rcfg.Observer = sq, rq
			p, start := mp.setup(t, scfg, rcfg)
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind != wire.KindData {
					return mem.Fault{}
				}
				return mem.Fault{Delay: onWire}
			})
			hs, hr := start(1)
			eventually(t, func() bool { return p.net.OnWire() > 0 }, "an operation on the wire")
			require.Equal(t, mp.want, hr.Path())
			require.Equal(t, CancelRequestedInFlight, p.dst.Cancel(1))
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Cancelled, ErrCancelled)
			requireState(t, hs, Cancelled, ErrCancelled, ErrPeerAborted)
			require.Zero(t, sq.n.Load(), "the sender reported a quarantine")
			require.Zero(t, rq.n.Load(), "the receiver reported a quarantine")
			require.False(t, hs.Status().BlocksPoisoned)
			require.False(t, hr.Status().BlocksPoisoned)
			for _, e := range []*Engine{p.src, p.dst} {
				require.Zero(t, e.Health().Numbers.Quarantined)
			}
		})
	}
}
