// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
)

// The transfers that ended before a late request (a Send's receiver, an exposure's second
// claim) are remembered, at most MaxPending of them: when the table is full of entries younger
// than PendingTTL the oldest goes, so the newest ending is always answered (a late request is
// likelier for a transfer that just ended than for one that ended long ago); and the record of
// their order stays bounded when entries leave the table another way (a new Send of the id).
func TestEndedTransfersAreBoundedKeepingTheNewest(t *testing.T) {
	t.Run("the oldest goes", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Tuning.MaxPending = 4
		p := newPair(t, cfg, cfg)
		e := p.src
		for i := range 10 {
			e.rememberEnded(routeKey{"", RequestID(i)}, unanswered{code: wire.AbortCancelled, reason: fmt.Sprint(i)})
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		require.Len(t, e.unanswered, cfg.Tuning.MaxPending)
		for i := range 10 {
			_, kept := e.unanswered[routeKey{"", RequestID(i)}]
			require.Equal(t, i >= 10-cfg.Tuning.MaxPending, kept, "ended request %d kept", i)
		}
	})
	t.Run("the order's record stays bounded", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Tuning.MaxPending = 4
		p := newPair(t, cfg, cfg)
		e := p.src
		for i := range 1000 {
			key := routeKey{"decode", RequestID(i % 3)}
			e.rememberEnded(key, unanswered{code: wire.AbortCancelled})
			e.mu.Lock()
			delete(e.unanswered, key) // as a new Send of the id does (Engine.start)
			n := len(e.endedOrder) - e.endedHead
			e.mu.Unlock()
			require.LessOrEqual(t, n, 2*cfg.Tuning.MaxPending+1, "order records after %d endings", i+1)
		}
	})
	t.Run("an exposure's late claim after more endings than MaxPending", func(t *testing.T) {
		// The newest exposure that ended is refused as claimed at once, however many ended
		// before it within PendingTTL.
		cfg := fastConfig()
		cfg.Tuning.MaxPending = 2
		p := newPair(t, cfg, cfg)
		secret := NewClaimSecret()
		src, dst := pools(t, 5)
		const n = 4
		for id := RequestID(1); id <= n; id++ {
			hs, _, err := p.src.Expose(bg, Spec{ID: id, Plan: src.plan, Pool: src.mem, Secret: secret})
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Secret: secret})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "received")
			waitClosed(t, hs.Quiesced(), "sent")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.NoError(t, hr.Release())
			require.NoError(t, hs.Release())
		}
		h2 := startOnceFree(t, func() (*Handle, error) {
			return p.dst.Receive(bg, Spec{ID: n, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Secret: secret})
		})
		waitClosed(t, h2.Quiesced(), "the late claim's Receive quiesced")
		requireState(t, h2, Failed, ErrAlreadyClaimed)
	})
}

// BenchmarkRememberEndedFull is one ending remembered while the table holds MaxPending (4,096)
// endings younger than PendingTTL, as a steady 2,500 short requests a second keep it.
func BenchmarkRememberEndedFull(b *testing.B) {
	p := newPair(b, fastConfig(), fastConfig())
	e := p.src
	limit := e.cfg.Tuning.MaxPending
	for i := range limit {
		e.rememberEnded(routeKey{"", RequestID(i)}, unanswered{code: wire.AbortCancelled})
	}
	i := limit
	for b.Loop() {
		e.rememberEnded(routeKey{"", RequestID(i)}, unanswered{code: wire.AbortCancelled})
		i++
	}
}
