// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// L12 for requests that fail before they became active: waiting for a silent peer's hello,
// for a request that never comes, or for one of MaxConcurrent behind a transfer that holds
// it. Each times out queued, one after another, and no byte moves: the engine is asked for
// work it cannot do, as surely as when active transfers fail one after another, and Health
// must say so within the progress deadline; once the requests stop, it recovers.
func TestL12_FailuresWhileQueuedAreAStall(t *testing.T) {
	cases := []struct {
		desc string
		cfg  func(*Config)
		// hold starts whatever keeps the requests queued (nil: nothing).
		hold func(t *testing.T, p *pair)
		// request makes one request that fails queued.
		request func(p *pair, id RequestID, dst *kvPool) (*Handle, *Engine, error)
	}{
		{
			desc: "a receiver waits for a silent peer's hello",
			request: func(p *pair, id RequestID, dst *kvPool) (*Handle, *Engine, error) {
				h, err := p.dst.Receive(bg, Spec{ID: id, Peer: "nobody", Plan: dst.plan, Pool: dst.mem})
				return h, p.dst, err
			},
		},
		{
			desc: "a sender waits for a request that never comes",
			request: func(p *pair, id RequestID, dst *kvPool) (*Handle, *Engine, error) {
				h, err := p.src.Send(bg, Spec{ID: id, Peer: "decode", Plan: dst.plan, Pool: dst.mem})
				return h, p.src, err
			},
		},
		{
			desc: "a receiver waits for admission behind a stream waiting on its model",
			cfg:  func(c *Config) { c.MaxConcurrent, c.NumSlots = 1, 2 },
			hold: func(t *testing.T, p *pair) {
				src, dst := streamPools(t, 0)
				hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true})
				require.NoError(t, err)
				hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
				require.NoError(t, err)
				eventually(t, func() bool { return hr.Status().State == Advertised && hs.Status().State == Advertised }, "the stream advertised")
				require.Equal(t, int64(1), p.dst.Health().AwaitingReady)
				t.Cleanup(func() { p.dst.Cancel(1); p.src.Cancel(1) })
			},
			request: func(p *pair, id RequestID, dst *kvPool) (*Handle, *Engine, error) {
				h, err := p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				return h, p.dst, err
			},
		},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.QueueTimeout = 100 * time.Millisecond
			cfg.ProgressDeadline = 200 * time.Millisecond
			cfg.TransferTimeout = 30 * time.Second // the stream that holds admission outlives the test
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			p := newPair(t, cfg, cfg)
			if c.hold != nil {
				c.hold(t, p)
			}
			_, dst := pools(t, 1)
			var e *Engine
			start := time.Now()
			unhealthy := false
			for id := RequestID(100); !unhealthy && time.Since(start) < 3*time.Second; id++ {
				h, eng, err := c.request(p, id, dst)
				require.NoError(t, err)
				e = eng
				waitClosed(t, h.Done(), "timed out queued")
				st := h.Status()
				require.Equal(t, Failed, st.State, "%v", st.Err)
				require.ErrorIs(t, st.Err, ErrQueueTimeout)
				require.NoError(t, h.Release())
				unhealthy = !e.Health().Healthy
			}
			hl := e.Health()
			require.True(t, unhealthy, "healthy for %v while every request failed queued: %+v", time.Since(start), hl)
			require.Contains(t, hl.Reason, "transfers were asked for and failed")
			// The requests stopped: nothing is asked for, and health recovers.
			eventually(t, func() bool { return e.Health().Healthy }, "healthy once the failed requests stopped")
		})
	}
}
