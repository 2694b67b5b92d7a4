// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// boundEater is a mem transport whose part in an engine's Close takes as long as a loaded
// host's UCX can: its Close waits closeFor before it closes (UCX's close has a bound of its
// own, ucx.Config.CloseTimeout), and with keepPeers its ClosePeer leaves the connection as it
// is, so the transfers Close stopped keep their operations on the wire and the settle before
// the goodbye waits its whole share.
type boundEater struct {
	*mem.Transport
	closeFor  time.Duration
	keepPeers bool
	once      sync.Once
}

func (b *boundEater) Close(force bool) error {
	b.once.Do(func() { <-time.After(b.closeFor) })
	return b.Transport.Close(force)
}

func (b *boundEater) ClosePeer(p Peer) {
	if !b.keepPeers {
		b.Transport.ClosePeer(p)
	}
}

// endsObserver records which handles it heard end (sub -1, a terminal state), and with block
// set holds its first callback until release closes.
type endsObserver struct {
	nopObserver
	block   bool
	release chan struct{}
	once    sync.Once
	letOnce sync.Once
	mu      sync.Mutex
	ended   map[RequestID]State
}

func (o *endsObserver) let() { o.letOnce.Do(func() { close(o.release) }) }

func (o *endsObserver) OnTransition(id RequestID, sub int, _, to State, _ Event) {
	if o.block {
		o.once.Do(func() { <-o.release })
	}
	if sub != -1 || !to.Terminal() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended[id] = to
}

func (o *endsObserver) heard(id RequestID) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.ended[id]
	return ok
}

// TestL1_CloseLeavesTheObserverItsShareOfTheBound: after Close returns, every handle's Done is
// closed, and Done closes through the observer's queue, so Close must wait for the observer to
// hear every event. The steps before that wait (CancelGrace, the settle before the goodbye, the
// copies' fence, the transport's own close with its own bound) once used the whole of
// CloseTimeout under load, leaving the observer nothing: Close failed with "the observer had not
// heard every event within CloseTimeout" though the observer was quick (the 30-minute soak, decode's
// Close at 6.157 s of 6 s). Here the transport's close, or the settle and the transport's close
// together, take the whole bound: Close must still drain the observer and return nil with every
// handle's Done closed and heard. An observer that really is slow (held until Close returns)
// makes Close fail, and the error must say it is the observer.
func TestL1_CloseLeavesTheObserverItsShareOfTheBound(t *testing.T) {
	const closeTimeout = 3 * time.Second
	paths := []closePath{closePaths[0], closePaths[4]} // staging, RMA: Close's steps are the same on each
	cases := []struct {
		desc      string
		closeFor  time.Duration // the transport's close
		keepPeers bool          // the settle before the goodbye waits its whole share
		slowObs   bool          // the observer is held until Close returns
	}{
		{desc: "the transport's close takes the whole bound", closeFor: closeTimeout},
		{desc: "the settle before the goodbye and the transport's close take the whole bound", closeFor: closeTimeout / 2, keepPeers: true},
		{desc: "the observer itself is slow", slowObs: true},
	}
	for _, pc := range paths {
		for _, c := range cases {
			t.Run(pc.name+"/"+c.desc, func(t *testing.T) {
				t.Parallel()
				cfg := pipelineConfig()
				cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 2048, 512
				// Nothing but Close ends the transfers: no timer of theirs is what this is about.
				cfg.TransferTimeout, cfg.QueueTimeout, cfg.Tuning.QuarantineTimeout = time.Minute, time.Minute, time.Minute
				cfg.CloseTimeout = closeTimeout
				pc.cfg(&cfg)
				n := mem.NewNetwork()
				n.SetFault(dataOnly(mem.Fault{Hang: true})) // every chunk and get stays on the wire
				obs := &endsObserver{block: c.slowObs, release: make(chan struct{}), ended: map[RequestID]State{}}
				src := memPathSideOver(t, n, "prefill", pc, cfg, nil)
				dcfg := cfg
				dcfg.Observer = obs
				dst := memPathSideOver(t, n, "decode", pc, dcfg, func(tr *mem.Transport) Transport {
					return &boundEater{Transport: tr, closeFor: c.closeFor, keepPeers: c.keepPeers}
				})
				t.Cleanup(obs.let) // before the engines close, also when the test failed
				var received []*Handle
				for i := range int32(4) {
					smem, splan := src.kv(t, seqBlocks(i*16, 16), uint64(i+1))
					dmem, dplan := dst.kv(t, seqBlocks(i*16, 16), 0)
					id := RequestID(700 + i)
					_, err := src.e.Send(bg, Spec{ID: id, Peer: "decode", Plan: splan, Pool: smem})
					require.NoError(t, err)
					r, err := dst.e.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dplan, Pool: dmem})
					require.NoError(t, err)
					received = append(received, r)
				}
				eventually(t, func() bool {
					for _, h := range received {
						if h.Path() != pc.path || !h.Status().State.active() {
							return false
						}
					}
					return true
				}, "every receive in flight on the path")

				err := dst.e.Close()
				if c.slowObs {
					require.ErrorContains(t, err, "the observer had not heard every event", "the error names the observer")
					obs.let()
					for _, h := range received {
						waitClosed(t, h.Done(), "Done, once the observer is let go")
					}
					return
				}
				require.NoError(t, err, "the observer is quick: Close drains it whatever the steps before took")
				for _, h := range received {
					require.True(t, isClosed(h.Done()), "request %d: Done closed when Close returned", h.ID())
					require.True(t, obs.heard(h.ID()), "request %d: the observer heard it end before Close returned", h.ID())
					require.Equal(t, Failed, h.Status().State, "request %d: %+v", h.ID(), h.Status())
				}
				requireSlotsAccounted(t, dst.e)
			})
		}
	}
}
