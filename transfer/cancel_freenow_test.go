// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL10_FreeNowCancelFindsDoneAndQuiescedClosed: a Cancel outcome that lets the caller free
// the blocks at once (FreeNow) must find the handle's Done and Quiesced closed when Cancel
// returns, whatever the observer is doing. Done and Quiesced close through the observer's
// queue, after the observer heard the moves before them; with the observer stuck in a callback
// a FreeNow answer came while Quiesced was still open. Each case holds the receiver's observer
// in its first callback, cancels, and only then lets it go: the observer still hears every move,
// in order.
func TestL10_FreeNowCancelFindsDoneAndQuiescedClosed(t *testing.T) {
	// stuck closes once the observer is held in its first callback: each run cancels only then
	// (the observer's goroutine, not yet run on a loaded host, was not always there by the time
	// Cancel returned).
	type run func(t *testing.T, src, dst closeSide, stuck <-chan struct{}) (*Handle, CancelOutcome)
	// completed: the transfer completes while the observer is stuck; Cancel answers AlreadyComplete.
	completed := func(t *testing.T, src, dst closeSide, stuck <-chan struct{}) (*Handle, CancelOutcome) {
		smem, splan := src.kv(t, seqBlocks(0, 4), 7)
		dmem, dplan := dst.kv(t, seqBlocks(8, 4), 0)
		_, err := src.e.Send(bg, src.spec(Spec{ID: 1, Peer: dst.self, Plan: splan}, smem))
		require.NoError(t, err)
		hr, err := dst.e.Receive(bg, dst.spec(Spec{ID: 1, Peer: src.self, Plan: dplan}, dmem))
		require.NoError(t, err)
		eventually(t, func() bool { return hr.Status().State == Completed }, "completed") // Status does not wait on the observer
		waitClosed(t, stuck, "the observer held in its first callback")
		return hr, dst.e.Cancel(1)
	}
	cases := []struct {
		desc string
		path closePath
		run  run
		want CancelOutcome
	}{
		{"queued: cancelled before advertise", closePaths[0], func(t *testing.T, src, dst closeSide, stuck <-chan struct{}) (*Handle, CancelOutcome) {
			// The receiver's one admission token is taken by a receive whose sender never
			// comes: the second stays queued.
			dmem, dplan := dst.kv(t, seqBlocks(0, 4), 0)
			first, err := dst.e.Receive(bg, Spec{ID: 1, Peer: src.self, Plan: dplan, Pool: dmem})
			require.NoError(t, err)
			eventually(t, func() bool { return first.Status().State == Advertised }, "the first receive advertised")
			other, oplan := dst.kv(t, seqBlocks(8, 4), 0)
			h, err := dst.e.Receive(bg, Spec{ID: 2, Peer: src.self, Plan: oplan, Pool: other})
			require.NoError(t, err)
			require.Equal(t, Queued, h.Status().State)
			waitClosed(t, stuck, "the observer held in its first callback")
			return h, dst.e.Cancel(2)
		}, CancelledBeforeAdvertise},
	}
	for _, pc := range closePaths {
		cases = append(cases, struct {
			desc string
			path closePath
			run  run
			want CancelOutcome
		}{"completed on " + pc.name, pc, completed, AlreadyComplete})
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			obs := &blockingObserver{entered: make(chan struct{}), release: make(chan struct{}), moves: map[RequestID][]State{}}
			cfg := pipelineConfig()
			cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 2048, 512
			n := mem.NewNetwork()
			src := memPathSide(t, n, "prefill", c.path, cfg)
			cfg.Observer = obs
			cfg.MaxConcurrent, cfg.Tuning.PipelineDepth = 1, 1
			dst := memPathSide(t, n, "decode", c.path, cfg)
			var letGo sync.Once
			let := func() { letGo.Do(func() { close(obs.release) }) }
			t.Cleanup(let) // before the engines close, also when the test failed

			h, out := c.run(t, src, dst, obs.entered)
			require.Equal(t, c.want, out)
			require.True(t, out.FreeNow())
			require.True(t, isClosed(obs.entered), "the observer was stuck all along")
			require.True(t, isClosed(h.Done()), "Cancel answered %v with Done open", out)
			require.True(t, isClosed(h.Quiesced()), "Cancel answered %v with Quiesced open", out)
			requireDeviceHolds(t, dst, h)

			let()
			final := map[CancelOutcome]State{CancelledBeforeAdvertise: Cancelled, AlreadyComplete: Completed}[c.want]
			eventually(t, func() bool {
				obs.mu.Lock()
				defer obs.mu.Unlock()
				m := obs.moves[h.ID()]
				return len(m) > 0 && m[len(m)-1] == final
			}, "the observer heard the last move")
			obs.mu.Lock()
			moves := append([]State(nil), obs.moves[h.ID()]...)
			obs.mu.Unlock()
			for i := 1; i < len(moves); i++ {
				require.NotEqual(t, moves[i-1], moves[i], "moves in order, each from the state before: %v", moves)
			}
		})
	}
}
