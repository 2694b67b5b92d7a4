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
			cfg.DisableDirect = !tc.direct
			dcfg := cfg
			dcfg.MaxRetries = 16 // the second receive repeats its request until the old send is gone
			p := newPair(t, cfg, dcfg)
			oldSrc, dst := pools(t, 1)
			newSrc, _ := pools(t, 2)
			var stale atomic.Bool // the old receive's messages: its first request-info is late, the rest lost
			stale.Store(true)
			var infos atomic.Int32
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if !stale.Load() || fp.From != "decode" || fp.Kind == wire.KindData {
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

func (c *collidingMem) ReserveTags(_ Peer, tag Tag) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nonces = append(c.nonces, tag.Nonce)
	if len(c.nonces) <= c.refuse {
		return nil, fmt.Errorf("%w: test", ErrTagCollision)
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
				require.ErrorIs(t, hr.Status().Err, ErrTagCollision)
				require.Equal(t, CancelledBeforeAdvertise, src.Cancel(9))
			}
		})
	}
}
