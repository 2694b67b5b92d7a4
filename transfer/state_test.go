// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestL1_TableReachesOneTerminalStateAndClosesEachChannelOnce walks every path through the
// transition table from Queued: along each, Done and Quiesced close at most once; a terminal
// state has both closed and no way out; and every state can still reach a terminal one.
func TestL1_TableReachesOneTerminalStateAndClosesEachChannelOnce(t *testing.T) {
	type walk struct {
		s           State
		done, quiet int
		path        []Event
	}
	var paths int
	var dfs func(w walk)
	dfs = func(w walk) {
		require.LessOrEqual(t, w.done, 1, "Done closed twice on %v", w.path)
		require.LessOrEqual(t, w.quiet, 1, "Quiesced closed twice on %v", w.path)
		if w.s.Terminal() {
			paths++
			require.Equal(t, 1, w.done, "terminal without Done on %v", w.path)
			require.Equal(t, 1, w.quiet, "terminal without Quiesced on %v", w.path)
			for ev := range numEvents {
				require.False(t, transitions[w.s][ev].ok, "terminal %v leaves on %v", w.s, ev)
			}
			return
		}
		if w.s == Quarantined {
			require.Equal(t, 1, w.done, "quarantined must have told the caller: %v", w.path)
			require.Equal(t, 0, w.quiet, "quarantined must keep memory pinned: %v", w.path)
		}
		moved := false
		for ev := range numEvents {
			r := transitions[w.s][ev]
			if !r.ok || (r.next == w.s) {
				continue // self-loops (progress) change nothing the walk checks
			}
			moved = true
			nw := walk{s: r.next, done: w.done, quiet: w.quiet, path: append(append([]Event(nil), w.path...), ev)}
			if r.closesDone {
				nw.done++
			}
			if r.quiesces {
				nw.quiet++
			}
			dfs(nw)
		}
		require.True(t, moved, "state %v is a dead end", w.s)
	}
	dfs(walk{s: Queued})
	require.Greater(t, paths, 10)
}

func TestApplyRefusesWhatTheTableDoesNotAllow(t *testing.T) {
	cases := []struct {
		desc string
		from State
		ev   Event
		ok   bool
		to   State
	}{
		{"advertise a queued transfer", Queued, EvAdvertise, true, Advertised},
		{"progress before advertise", Queued, EvProgress, false, Queued},
		{"complete a queued transfer", Queued, EvComplete, false, Queued},
		{"complete in flight", InFlight, EvComplete, true, Completed},
		{"fail after completion", Completed, EvFail, false, Completed},
		{"cancel-queued in flight", InFlight, EvCancelQueued, false, InFlight},
		{"resolve a quarantined cancel", Quarantined, EvResolveCancelled, true, Cancelled},
		{"complete a quarantined transfer", Quarantined, EvComplete, false, Quarantined},
		{"unknown event", Queued, numEvents, false, Queued},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var m machine
			m.state.Store(int32(c.from))
			from, r := m.apply(c.ev)
			require.Equal(t, c.from, from)
			require.Equal(t, c.ok, r.ok)
			require.Equal(t, c.to, m.load())
		})
	}
	require.Equal(t, "quarantined", Quarantined.String())
	require.Equal(t, "state(99)", State(99).String())
	require.Equal(t, "cancel-requested-in-flight", CancelRequestedInFlight.String())
}
