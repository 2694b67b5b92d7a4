// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// overrunMover is a device mover whose nth copy overran its timeout: it cannot say whether the
// copy still runs (a GPU kernel that may still write), which it reports with
// ErrQuiescenceUnknown.
type overrunMover struct {
	Mover
	gather bool
	n      int32
	calls  atomic.Int32
}

func (m *overrunMover) overran() error {
	if m.calls.Add(1) == m.n {
		return fmt.Errorf("kernel did not finish within 1s: %w", ErrQuiescenceUnknown)
	}
	return nil
}

func (m *overrunMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	if m.gather {
		if err := m.overran(); err != nil {
			return err
		}
	}
	return m.Mover.Gather(p, off, dst)
}

func (m *overrunMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	if !m.gather {
		if err := m.overran(); err != nil {
			return err
		}
	}
	return m.Mover.Scatter(p, src, off)
}

// TestMoverUnknownQuiescencePoisons: a Mover that cannot say whether its copy ended leaves the
// staging slot and the caller's blocks poisoned: the handle stays quarantined for good (its
// Quiesced never closes, Status says BlocksPoisoned), the slot leaves circulation, and Health
// says the device is wedged, on the receiving side (scatter) and the sending side (gather).
func TestMoverUnknownQuiescencePoisons(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		gather bool
	}{{"scatter on the receiver", false}, {"gather on the sender", true}} {
		t.Run(tc.desc, func(t *testing.T) {
			p := newPair(t, fastConfig(), fastConfig())
			src, dst := pools(t, 11)
			m := &overrunMover{gather: tc.gather, n: 2}
			sspec := Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem}
			rspec := Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem}
			eng := p.dst
			if tc.gather {
				m.Mover, sspec.Mover, eng = newHostMover(src.mem), m, p.src
			} else {
				m.Mover, rspec.Mover = newHostMover(dst.mem), m
			}
			hs, err := p.src.Send(bg, sspec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, rspec)
			require.NoError(t, err)
			h := hr
			if tc.gather {
				h = hs
			}
			waitClosed(t, h.Done(), "the transfer with the overrun copy ended")
			eventually(t, func() bool { return h.Status().BlocksPoisoned }, "blocks poisoned")
			st := h.Status()
			require.Equal(t, Quarantined, st.State, "%v", st.Err)
			require.ErrorIs(t, st.Err, ErrQuiescenceUnknown)
			eventually(t, func() bool { return eng.Health().Numbers.PoisonedSlots == 1 }, "the slot poisoned")
			hl := eng.Health()
			require.False(t, hl.Healthy)
			require.True(t, hl.Numbers.MoverWedged)
			require.Contains(t, hl.Reason, "wedged")
			require.False(t, isClosed(h.Quiesced()), "a copy that may still run is never quiescent")
			require.NoError(t, hs.Release())
			require.NoError(t, hr.Release())
		})
	}
}
