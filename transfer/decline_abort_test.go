// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// poisonCounter counts the poisons an engine reports (slots and the callers' blocks).
type poisonCounter struct {
	nopObserver
	n atomic.Int64
}

func (p *poisonCounter) OnPoison(RequestID, int, string) { p.n.Add(1) }

// A receiver that asked its sender a question (the pull wire's slots, the RMA mode's offer)
// posts nothing until the answer. A sender that declines sends its first chunks as tagged
// messages right behind its decline. When the receiver aborts before the decline reaches it
// (its caller's cancel; a deadline; over UCX a sender stopped with SIGSTOP), those chunks
// used to find no receive at all: the network here, as UCX 1.13 does with a rendezvous send,
// cannot cancel a send no receive matched, so the sender's cancel did nothing, it
// quarantined, and QuarantineTimeout later poisoned its slot (staging) or its caller's blocks
// for good (direct). The receiver's abort now takes those chunks as its cancelled receives'
// would be: the sender's operations end and nothing is poisoned on either side.
func TestL3_AReceiverAbortedBeforeTheDeclineStrandsNoChunkOfTheSender(t *testing.T) {
	cases := []struct {
		desc    string
		decline wire.Kind // the sender's answer that the network holds back
		config  func() Config
		setup   func(t *testing.T, scfg, rcfg Config) (*pair, func() (hs, hr *Handle))
		want    Path // the sender's path once it declined
	}{
		{
			desc: "staging: the sender declines the pull wire", decline: wire.KindSlots, want: PathStaging, config: pullConfig,
			setup: func(t *testing.T, scfg, rcfg Config) (*pair, func() (hs, hr *Handle)) {
				scfg.Tuning.DisablePull = true
				p := newPullPair(t, scfg, rcfg)
				src, dst := pools(t, 41)
				return p, func() (*Handle, *Handle) { return p.startStaged(t, 1, src, dst) }
			},
		},
		{
			desc: "direct: the sender declines the rma mode", decline: wire.KindRMAOffer, want: PathDirect, config: rmaConfig,
			setup: func(t *testing.T, scfg, rcfg Config) (*pair, func() (hs, hr *Handle)) {
				scfg.Tuning.DisableRMA = true
				scfg.Tuning.DirectChunkBytes, rcfg.Tuning.DirectChunkBytes = 512, 512 // several chunks
				src := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 2, 3, 4), 9)
				dst := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(5, 6, 7, 8), 0)
				p, _ := directPair(t, scfg, rcfg, src, dst)
				return p, func() (*Handle, *Handle) {
					hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
					require.NoError(t, err)
					hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
					require.NoError(t, err)
					return hs, hr
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			scfg, rcfg := c.config(), c.config()
			scfg.Tuning.QuarantineTimeout = 2 * time.Second // past the chunks' delay; the sender's slot or blocks poisoned soon if they strand
			sp, rp := &poisonCounter{}, &poisonCounter{}
			scfg.Observer, rcfg.Observer = sp, rp
			p, start := c.setup(t, scfg, rcfg)
			declined := make(chan struct{}, 1)
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				switch {
				case fp.From == "prefill" && fp.Kind == c.decline:
					select {
					case declined <- struct{}{}:
					default:
					}
					return mem.Fault{Drop: true} // the receiver aborts before it hears
				case fp.From == "prefill" && fp.Kind == wire.KindData:
					// As a UCX rendezvous send: only a receive ends it. Its bytes take a
					// while, so the sender reads the receiver's abort before any completes
					// and posts no chunk past those the receiver took.
					return mem.Fault{IgnoreCancel: true, Delay: 100 * time.Millisecond}
				}
				return mem.Fault{}
			})
			hs, hr := start()
			waitClosed(t, declined, "the sender's decline")
			// Every send the sender's pipeline holds, and it posts no more until one completes.
			eventually(t, func() bool { return p.net.Pending() == scfg.Tuning.PipelineDepth }, "the sender's chunks posted behind its decline")
			require.Equal(t, CancelRequestedInFlight, p.dst.Cancel(1))
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Done(), "sender done")
			waitClosed(t, hs.Quiesced(), "sender quiesced (its chunks taken, nothing poisoned)")
			require.Equal(t, c.want, hs.Path())
			requireState(t, hr, Cancelled, ErrCancelled)
			require.False(t, hs.Status().BlocksPoisoned)
			require.False(t, hr.Status().BlocksPoisoned)
			require.Zero(t, sp.n.Load(), "the sender poisoned a slot or its blocks")
			require.Zero(t, rp.n.Load(), "the receiver poisoned a slot or its blocks")
			for _, e := range []*Engine{p.src, p.dst} {
				require.Zero(t, e.Health().Numbers.PoisonedSlots)
				require.Zero(t, e.Health().Numbers.PoisonedBlocks)
			}
		})
	}
}
