// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL1_LapsedGraceLosesToCompletionsAlreadyInTheMailbox: a loop that wakes late, with its
// cancel grace lapsed and the completion that ended its last operation in time both waiting,
// takes the completion first: the transfer ends by the table's in-flight move (failed or
// cancelled, its blocks quiescent), never quarantined for operations that had all ended. A
// loaded host's CI run reached no in-flight failure at all before this (every one quarantined).
func TestL1_LapsedGraceLosesToCompletionsAlreadyInTheMailbox(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		cause error
		want  State
	}{
		{"a failure in flight", ErrDeadline, Failed},
		{"a cancel in flight", ErrCancelled, Cancelled},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, err := New(mem.NewNetwork().Transport("self"), fastConfig())
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.Close()) })
			h := &Handle{id: 7, eng: e, done: make(chan struct{}), quiesced: make(chan struct{}), callerRefs: 1}
			x := &xfer{h: h, eng: e, peer: "peer", path: &recordingPath{}, stopCh: make(chan struct{})}
			h.subs = []*xfer{x}
			h.m.state.Store(int32(InFlight))
			x.m.state.Store(int32(InFlight))
			rec := &opRec{id: 1}
			x.ops, x.outstanding = []*opRec{rec}, 1
			x.aborting, x.cause = true, &requestError{ID: 7, Err: tc.cause}
			lapsed := time.Now()
			x.timers.grace = lapsed.Add(-time.Millisecond)
			x.box.Push(event{op: rec, c: transport.Completion{Memory: transport.MemoryDone, Err: ErrCancelled}})

			var backoff time.Duration
			x.timerFired(lapsed, &backoff)

			require.False(t, x.quarantined, "quarantined although its one operation had ended")
			require.True(t, x.ended)
			require.Equal(t, tc.want, x.m.load())
			require.Equal(t, tc.want, h.Status().State)
			require.True(t, isClosed(h.Quiesced()), "its blocks are quiescent and the caller is told so")
		})
	}
}
