// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/stretchr/testify/require"
)

// TestLateMessageOfAnOldTransferIsNotTakenForANewOne reuses a request id: the first receive
// is cancelled while its request-info is still on its way and its abort is lost, so the
// sender starts on that stale request and its chunks wait on the wire. A new receive with the
// same id must not take those chunks (nor the old sender's abort) for its own: it completes
// with the new sender's bytes, on the staging path and on the direct one.
func TestLateMessageOfAnOldTransferIsNotTakenForANewOne(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		direct bool
	}{{"staging", false}, {"direct", true}} {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Tuning.DisableDirect = !tc.direct
			// The old send's end and release come before the new send: seconds on a loaded host,
			// and the second receive's repeats back off, so the new send waits for one of them.
			cfg.QueueTimeout = 15 * time.Second
			dcfg := cfg
			dcfg.Tuning.MaxRetries = 16 // the second receive repeats its request until the old send is gone
			p := newPair(t, cfg, dcfg)
			// The engines meet first (their hello), so that the first receive below sends its
			// request-info at once instead of waiting for the peer's hello.
			warmSrc, warmDst := pools(t, 3)
			ws, wr := p.start(t, 4, warmSrc, warmDst)
			waitClosed(t, wr.Quiesced(), "the engines met")
			waitClosed(t, ws.Quiesced(), "the engines met")
			requireState(t, wr, Completed)
			require.NoError(t, ws.Release())
			require.NoError(t, wr.Release())

			oldSrc, dst := pools(t, 1)
			newSrc, _ := pools(t, 2)
			var stale atomic.Bool // the old receive's messages: its first request-info is late, the rest lost (its hello passes: the engines must meet)
			stale.Store(true)
			var infos atomic.Int32
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if !stale.Load() || fp.From != "decode" || fp.Kind == wire.KindData || fp.Kind == wire.KindHello {
					return mem.Fault{}
				}
				if fp.Kind == wire.KindRequestInfo && infos.Add(1) == 1 {
					return mem.Fault{Delay: 50 * time.Millisecond}
				}
				return mem.Fault{Drop: true}
			})

			old, err := p.src.Send(bg, Spec{ID: 5, Peer: "decode", Plan: oldSrc.plan, Pool: oldSrc.mem, Timeout: 300 * time.Millisecond})
			require.NoError(t, err)
			first, err := p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			eventually(t, func() bool { return infos.Load() >= 1 }, "the first receive sent its request-info")
			p.dst.Cancel(5)
			waitClosed(t, first.Quiesced(), "first receive cancelled")
			require.NoError(t, first.Release())
			eventually(t, func() bool { return old.Status().State != Queued }, "the old sender took the stale request")
			stale.Store(false)

			second, err := p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			waitClosed(t, old.Done(), "old sender ended")
			require.NoError(t, old.Release())
			var fresh *Handle
			eventually(t, func() bool {
				h, err := p.src.Send(bg, Spec{ID: 5, Peer: "decode", Plan: newSrc.plan, Pool: newSrc.mem})
				fresh = h
				return !errors.Is(err, ErrDuplicate)
			}, "the old send's id is free again")
			require.NotNil(t, fresh)
			waitClosed(t, second.Done(), "second receive ended")
			requireState(t, second, Completed)
			require.Equal(t, newSrc.stream(t), dst.stream(t), "the second receive holds the new sender's bytes, not the stale ones")
			waitClosed(t, fresh.Done(), "new sender ended")
			requireState(t, fresh, Completed)
		})
	}
}

// collidingMem is a mem.Transport whose tag space collides for the first reservations.
type collidingMem struct {
	*mem.Transport
	mu       sync.Mutex
	refuse   int
	nonces   []uint64
	released int
}

func (c *collidingMem) ReserveTags(_ Peer, tag transport.Tag) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nonces = append(c.nonces, tag.Nonce)
	if len(c.nonces) <= c.refuse {
		return nil, fmt.Errorf("%w: test", errTagCollision)
	}
	return func() { c.mu.Lock(); c.released++; c.mu.Unlock() }, nil
}

// TestTagCollisionDrawsAnotherNonce: a receive whose tags collide with another transfer's
// draws another nonce and completes; one that never finds free tags fails, typed, without
// posting anything.
func TestTagCollisionDrawsAnotherNonce(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		refuse int
		want   State
	}{{"two collisions", 2, Completed}, {"no free tags", maxNonceDraws, Failed}} {
		t.Run(tc.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			src, err := New(n.Transport("prefill"), fastConfig())
			require.NoError(t, err)
			tr := &collidingMem{Transport: n.Transport("decode"), refuse: tc.refuse}
			dst, err := New(tr, fastConfig())
			require.NoError(t, err)
			defer func() { require.NoError(t, src.Close()); require.NoError(t, dst.Close()) }()
			sp, dp := pools(t, 3)
			hr, err := dst.Receive(bg, Spec{ID: 9, Peer: "prefill", Plan: dp.plan, Pool: dp.mem})
			require.NoError(t, err)
			hs, err := src.Send(bg, Spec{ID: 9, Peer: "decode", Plan: sp.plan, Pool: sp.mem, Timeout: time.Second})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receive ended")
			requireState(t, hr, tc.want)
			tr.mu.Lock()
			nonces := slices.Clone(tr.nonces)
			tr.mu.Unlock()
			require.Len(t, nonces, min(tc.refuse+1, maxNonceDraws))
			slices.Sort(nonces)
			require.Len(t, slices.Compact(nonces), len(nonces), "each draw is a new nonce")
			if tc.want == Completed {
				require.Equal(t, sp.stream(t), dp.stream(t))
				waitClosed(t, hs.Done(), "send ended")
				requireState(t, hs, Completed)
				require.NoError(t, hr.Release())
				eventually(t, func() bool { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.released == 1 }, "tags given back")
			} else {
				require.ErrorIs(t, hr.Status().Err, errTagCollision)
				require.Equal(t, CancelledBeforeAdvertise, src.Cancel(9))
			}
		})
	}
}
