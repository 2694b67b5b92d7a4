// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// recordingPath is a path that records what the loop hands it.
type recordingPath struct{ got []*opRec }

func (*recordingPath) kind() Path                                     { return PathDirect }
func (*recordingPath) post(*buffer.Slot) bool                         { return true }
func (p *recordingPath) completed(rec *opRec, _ transport.Completion) { p.got = append(p.got, rec) }

// TestPath_SeesOnlyFinalQuiescentSuccesses holds the loop to what path.go promises every path:
// an operation's completion reaches the path only when it is final, succeeded and left its
// memory quiescent, on a transfer not aborting, and only once; the loop settles every other
// verdict itself (abort, poison) so that no path can release memory still in use.
func TestPath_SeesOnlyFinalQuiescentSuccesses(t *testing.T) {
	for _, tc := range []struct {
		desc      string
		aborting  bool
		c         transport.Completion
		reaches   bool
		poisoned  bool // the caller's blocks: the op had no slot
		abortsNow bool
	}{
		{desc: "success, memory done", c: transport.Completion{Memory: transport.MemoryDone, Bytes: 8}, reaches: true},
		{desc: "failure, memory done", c: transport.Completion{Memory: transport.MemoryDone, Err: errors.New("boom")}, abortsNow: true},
		{desc: "busy: not final", c: transport.Completion{Memory: transport.MemoryBusy, Err: ErrCancelled}, abortsNow: true},
		{desc: "unknown: poisoned, never released", c: transport.Completion{Memory: transport.MemoryUnknown, Err: errors.New("lost")}, poisoned: true, abortsNow: true},
		{desc: "success while aborting", aborting: true, c: transport.Completion{Memory: transport.MemoryDone, Bytes: 8}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			net := mem.NewNetwork()
			tr := net.Transport("self")
			t.Cleanup(func() { _ = tr.Close(true) })
			eng := &Engine{cfg: fastConfig(), tr: tr, log: zap.NewNop(), obs: nopObserver{}}
			p := &recordingPath{}
			x := &xfer{h: &Handle{id: 7, eng: eng}, eng: eng, peer: "peer", path: p, aborting: tc.aborting}
			rec, other := &opRec{id: 1, seq: 0}, &opRec{id: 2, seq: 1}
			x.ops, x.outstanding = []*opRec{rec, other}, 2 // another op keeps the transfer from ending

			x.opDone(rec, tc.c)
			x.opDone(rec, tc.c) // a transport that reports twice: the second never counts

			if tc.reaches {
				require.Equal(t, []*opRec{rec}, p.got, "a final quiescent success reaches the path, once")
			} else {
				require.Empty(t, p.got, "the loop settles this verdict; the path never sees it")
			}
			require.Equal(t, tc.poisoned, x.blocksUnknown, "blocks poisoned")
			require.Equal(t, tc.poisoned, x.h.blocksPoisoned.Load())
			if tc.abortsNow {
				require.True(t, x.aborting, "the loop aborts the transfer itself")
			}
			if tc.c.Memory == transport.MemoryBusy {
				require.False(t, rec.final, "a busy op is not final: its slot stays out until its verdict")
				require.Equal(t, 2, x.outstanding)
			} else {
				require.True(t, rec.final)
				require.Equal(t, 1, x.outstanding)
			}
		})
	}
}
