// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// closeSpy is a mem transport that notes, when its Close begins, how many copies of the
// engine's mover workers were running: a transport may unmap memory they touch in Close
// (UCX unmaps its staging slots, the pools it allocated and the peers' slots mapped here).
type closeSpy struct {
	*mem.Transport
	copying *atomic.Int32
	atClose atomic.Int32
	once    sync.Once
	closing chan struct{}
}

func (s *closeSpy) Close(force bool) error {
	s.once.Do(func() {
		s.atClose.Store(s.copying.Load())
		close(s.closing)
	})
	return s.Transport.Close(force)
}

// countingStuckMover is stuckMover that also counts the copies running.
type countingStuckMover struct {
	stuckMover
	copying *atomic.Int32
}

func (m *countingStuckMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	m.copying.Add(1)
	defer m.copying.Add(-1)
	return m.stuckMover.Gather(p, off, dst)
}

func (m *countingStuckMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	m.copying.Add(1)
	defer m.copying.Add(-1)
	return m.stuckMover.Scatter(p, src, off)
}

// ScatterReadsAnyHostMemory implements AnySourceScatterer, as the host mover it wraps does: the
// pull wire's chunks are then scattered out of the sender's slot mapped here.
func (m *countingStuckMover) ScatterReadsAnyHostMemory() bool { return true }

// TestL2_CloseUnmapsNothingUnderACopy: Engine.Close force-closes the transport, which may unmap
// the memory a mover worker is copying into or out of (the process died of it over UCX). With
// a copy stuck on a mover worker of the engine that closes, the transport's Close must not
// begin until the copy has returned; then every handle ends and no slot is lost.
func TestL2_CloseUnmapsNothingUnderACopy(t *testing.T) {
	cases := []struct {
		desc   string
		cfg    func() Config
		pull   bool // staging memory exposed, the peer's slots mapped: the pull wire, read in place
		gather bool // the sender's gather is stuck, else the receiver's scatter
	}{
		{"staging: the closing sender's gather", fastConfig, false, true},
		{"staging: the closing receiver's scatter", fastConfig, false, false},
		{"pull wire: the closing sender's gather", inPlaceConfig, true, true},
		{"pull wire: the closing receiver's scatter out of the sender's mapped slot", inPlaceConfig, true, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := c.cfg()
			var copying atomic.Int32
			n := mem.NewNetwork()
			spies := map[Peer]*closeSpy{}
			engines := map[Peer]*Engine{}
			for _, name := range []Peer{"prefill", "decode"} {
				ecfg := cfg
				tr := n.Transport(name)
				if c.pull {
					ecfg.StagingMemory = make([]byte, int64(ecfg.NumSlots)*ecfg.SlotBytes)
					tr.AllowDirect(ecfg.StagingMemory)
					n.Endpoint(name).MapPeers(true)
				}
				spies[name] = &closeSpy{Transport: tr, copying: &copying, closing: make(chan struct{})}
				e, err := New(spies[name], ecfg)
				require.NoError(t, err)
				engines[name] = e
				t.Cleanup(func() { _ = e.Close() })
			}
			src, dst := pools(t, 1)
			closing := Peer("decode")
			sm := &countingStuckMover{stuckMover: stuckMover{Mover: HostMover(src.mem), gate: newGate(t), gather: true}, copying: &copying}
			rm := &countingStuckMover{stuckMover: stuckMover{Mover: HostMover(dst.mem), gate: newGate(t)}, copying: &copying}
			stuck := rm.gate
			if c.gather {
				closing, stuck = "prefill", sm.gate
				rm.let()
			} else {
				sm.let()
			}
			hs, err := engines["prefill"].Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: sm})
			require.NoError(t, err)
			hr, err := engines["decode"].Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: rm})
			require.NoError(t, err)
			waitClosed(t, stuck.entered, "a copy stuck on a mover worker")
			require.Equal(t, c.pull, hr.Pulled(), "the wire the case is about")

			closed := make(chan error, 1)
			go func() { closed <- engines[closing].Close() }()
			select {
			case <-spies[closing].closing:
				t.Errorf("the transport's Close began while the copy ran")
			case <-time.After(cfg.CancelGrace + time.Second): // Close waits for the copy as long as CloseTimeout
			}
			stuck.let()
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return once the copy had")
			}
			require.Zero(t, spies[closing].atClose.Load(), "copies running when the transport's Close began")
			other := engines["prefill"]
			if closing == "prefill" {
				other = engines["decode"]
			}
			require.NoError(t, other.Close())
			for _, h := range []*Handle{hs, hr} {
				waitClosed(t, h.Done(), "done")
				require.True(t, h.Status().State.Terminal(), "request %d: %+v", h.ID(), h.Status())
			}
			for _, e := range engines {
				requireSlotsAccounted(t, e)
			}
		})
	}
}
