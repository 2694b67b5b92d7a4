// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// queuedSenderCase is where a Send waits, still Queued, when its engine closes: for its
// receiver's request, or, having taken it (the receiver advertised and waits), for one of
// MaxConcurrent or a staging slot that another transfer holds.
type queuedSenderCase struct {
	name   string
	waits  string // "request", "admission" or "slot"
	direct bool   // the receiver picks the direct path
	sender func(*Config)
}

var queuedSenderCases = []queuedSenderCase{
	{"before its request reached it", "request", false, func(*Config) {}},
	{"admission staging", "admission", false, func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots = 1, 0 }},
	{"admission direct", "admission", true, func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots = 1, 0 }},
	{"staging slot lease", "slot", false, func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots, c.Tuning.PipelineDepth = 2, 2, 2 }},
}

// queuedSenderCloses runs c between a leaving engine (the sender) and a survivor (the
// receiver): a streaming Send with no layer ready holds the sender's admission or slots (not
// for "request"), a second Send waits Queued where c says, and the leaving engine closes. Both
// of the survivor's Receives must end at once (their deadlines are a minute away), with the
// peer's abort or goodbye, quiescent, nothing poisoned, every slot back. kv gives request i's
// pools; requestDropped, for "request", reports that the receiver's request was lost.
func queuedSenderCloses(t *testing.T, c queuedSenderCase, leaving, survivor *Engine, toSurvivor, toLeaving Peer,
	kv func(send bool, i int) ([]byte, *layout.Plan), requestDropped func() bool, strictCause bool) {
	t.Helper()
	var mine []*Handle // the survivor's
	var holder *Handle
	start := func(i int, stream bool) *Handle {
		pool, plan := kv(true, i)
		hs, err := leaving.Send(bg, Spec{ID: RequestID(i), Peer: toSurvivor, Plan: plan, Pool: pool, Stream: stream})
		require.NoError(t, err)
		pool, plan = kv(false, i)
		hr, err := survivor.Receive(bg, Spec{ID: RequestID(i), Peer: toLeaving, Plan: plan, Pool: pool, Stream: stream})
		require.NoError(t, err)
		mine = append(mine, hr)
		return hs
	}
	if c.waits != "request" {
		holder = start(1, true) // no layer is ever marked ready: it holds what it took
		eventually(t, func() bool { return holder.Status().State == Advertised }, "the holder past Queued")
		if c.waits == "slot" {
			eventually(t, func() bool { return leaving.pool.Stats().Free == 0 }, "the holder has every staging slot")
		}
	}
	hs := start(2, false)
	hr := mine[len(mine)-1]
	x := hs.subs[0]
	if c.waits == "request" {
		eventually(t, requestDropped, "the receiver's request lost")
		id := x.ident.Load()
		require.True(t, id == nil || id.nonce == 0, "the Send took no request")
	} else {
		eventually(t, func() bool { id := x.ident.Load(); return id != nil && id.nonce != 0 }, "the Send took the receiver's request")
	}
	eventually(t, func() bool { return hr.Status().State == Advertised }, "the receiver advertised")
	require.Equal(t, Queued, hs.Status().State)
	if c.direct {
		require.Equal(t, PathDirect, hr.Path(), "%+v", hr.Status())
	}

	require.NoError(t, leaving.Close())
	require.ErrorIs(t, hs.Status().Err, ErrClosed, "%+v", hs.Status())
	for _, h := range mine {
		waitClosedWithin(t, h.Done(), fmt.Sprintf("request %d done", h.ID()), 30*time.Second)
		waitClosedWithin(t, h.Quiesced(), fmt.Sprintf("request %d quiesced", h.ID()), 30*time.Second)
		st := h.Status()
		t.Logf("request %d: %v (%v)", h.ID(), st.State, st.Err)
		require.Equal(t, Failed, st.State, "request %d: %v", h.ID(), st.Err)
		require.ErrorIs(t, st.Err, ErrPeerAborted, "request %d", h.ID())
		if strictCause {
			require.NotErrorIs(t, st.Err, ErrPeerLost, "request %d", h.ID())
			require.Contains(t, st.Err.Error(), fmt.Sprintf("(code %d)", wire.AbortClosed), "request %d: the sender closed", h.ID())
		}
		require.False(t, st.BlocksPoisoned, "request %d", h.ID())
	}
	ps := survivor.pool.Stats()
	require.Zero(t, ps.Poisoned, "slots poisoned: %+v", ps)
	require.Zero(t, ps.Leased, "slots leased: %+v", ps)
	require.Zero(t, survivor.Health().Numbers.PoisonedBlocks)
}

// TestL11_ClosingSenderEndsItsWaitingReceivers: a Send still Queued when its engine closes
// (waiting for its receiver's request, or, having taken it, for one of MaxConcurrent or a
// staging slot) leaves no Receive waiting out its deadline for it (L11): the receiver, which
// advertised and waits, hears the sender's abort (AbortClosed) or, where that is lost, its
// goodbye, which names the Send (with the request's nonce, or, when the request never reached
// it, with none). Over the in-memory transport, the abort delivered and lost; the handles
// end cleanly (L9), not as with a lost peer.
func TestL11_ClosingSenderEndsItsWaitingReceivers(t *testing.T) {
	for _, c := range queuedSenderCases {
		for _, abortLost := range []bool{false, true} {
			if c.waits == "request" && !abortLost {
				continue // a Send that never had the request has no nonce to abort with
			}
			name := c.name + "/abort delivered"
			if abortLost {
				name = c.name + "/abort lost"
			}
			t.Run(name, func(t *testing.T) {
				scfg, rcfg := fastConfig(), fastConfig()
				c.sender(&scfg)
				rcfg.Tuning.DisableDirect, rcfg.Tuning.DisableRMA = !c.direct, true
				p := newPair(t, scfg, rcfg)
				var dropped atomic.Int64
				p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
					switch {
					case c.waits == "request" && fp.Kind == wire.KindRequestInfo && fp.From == "decode":
						dropped.Add(1)
						return mem.Fault{Drop: true}
					case abortLost && fp.Kind == wire.KindAbort && fp.From == "prefill":
						return mem.Fault{Drop: true}
					}
					return mem.Fault{}
				})
				kv := func(send bool, i int) ([]byte, *layout.Plan) {
					src, dst := pools(t, uint64(i))
					if send {
						p.net.Endpoint("prefill").AllowDirect(src.mem)
						return src.mem, src.plan
					}
					p.net.Endpoint("decode").AllowDirect(dst.mem)
					return dst.mem, dst.plan
				}
				queuedSenderCloses(t, c, p.src, p.dst, "decode", "prefill", kv, func() bool { return dropped.Load() > 0 }, true)
			})
		}
	}
}

// TestL11_ReceiverAbortEndsItsQueuedSend: a Send that took its receiver's request and waits,
// Queued, for one of MaxConcurrent or a staging slot, or has the request and the receiver's
// abort of it at once, ends on that abort: it does not wait out QueueTimeout (a minute here)
// for what it would only give up on the moment it started. The receiver cancels; the Send
// ends cancelled by its peer (ErrPeerAborted), having started nothing and told the receiver
// nothing more.
func TestL11_ReceiverAbortEndsItsQueuedSend(t *testing.T) {
	for _, c := range queuedSenderCases {
		if c.waits == "request" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			scfg, rcfg := fastConfig(), fastConfig()
			c.sender(&scfg)
			rcfg.Tuning.DisableDirect, rcfg.Tuning.DisableRMA = !c.direct, true
			p := newPair(t, scfg, rcfg)
			var aborts atomic.Int64
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindAbort && fp.From == "prefill" {
					aborts.Add(1)
				}
				return mem.Fault{}
			})
			pool := func(send bool, i int) ([]byte, *layout.Plan) {
				src, dst := pools(t, uint64(i))
				if send {
					p.net.Endpoint("prefill").AllowDirect(src.mem)
					return src.mem, src.plan
				}
				p.net.Endpoint("decode").AllowDirect(dst.mem)
				return dst.mem, dst.plan
			}
			receiverAbortsQueuedSend(t, c, p.src, p.dst, "decode", "prefill", pool, aborts.Load)
		})
	}
}

// receiverAbortsQueuedSend runs c's queued Send (as queuedSenderCloses) and has its receiver
// cancel: the Send must end on the receiver's abort at once, with nothing sent back
// (sentAborts, where the transport can count the sender's aborts) and the holder untouched.
func receiverAbortsQueuedSend(t *testing.T, c queuedSenderCase, sender, receiver *Engine, toReceiver, toSender Peer,
	pool func(send bool, i int) ([]byte, *layout.Plan), sentAborts func() int64) {
	t.Helper()
	mk, pl := pool(true, 1)
	holder, err := sender.Send(bg, Spec{ID: 1, Peer: toReceiver, Plan: pl, Pool: mk, Stream: true})
	require.NoError(t, err)
	mk, pl = pool(false, 1)
	_, err = receiver.Receive(bg, Spec{ID: 1, Peer: toSender, Plan: pl, Pool: mk, Stream: true})
	require.NoError(t, err)
	eventually(t, func() bool { return holder.Status().State == Advertised }, "the holder past Queued")
	if c.waits == "slot" {
		eventually(t, func() bool { return sender.pool.Stats().Free == 0 }, "the holder has every staging slot")
	}
	mk, pl = pool(true, 2)
	hs, err := sender.Send(bg, Spec{ID: 2, Peer: toReceiver, Plan: pl, Pool: mk})
	require.NoError(t, err)
	mk, pl = pool(false, 2)
	hr, err := receiver.Receive(bg, Spec{ID: 2, Peer: toSender, Plan: pl, Pool: mk})
	require.NoError(t, err)
	x := hs.subs[0]
	eventually(t, func() bool { id := x.ident.Load(); return id != nil && id.nonce != 0 }, "the Send took the receiver's request")
	eventually(t, func() bool { return hr.Status().State == Advertised }, "the receiver advertised")
	require.Equal(t, Queued, hs.Status().State)
	var told int64
	if sentAborts != nil {
		told = sentAborts()
	}

	require.Equal(t, CancelRequestedInFlight, receiver.Cancel(hr.ID()))
	waitClosedWithin(t, hs.Done(), "the Send done on its receiver's abort", 30*time.Second)
	waitClosedWithin(t, hs.Quiesced(), "the Send quiesced", 30*time.Second)
	st := hs.Status()
	require.Contains(t, []State{Cancelled, Failed}, st.State, "%v", st.Err)
	require.ErrorIs(t, st.Err, ErrPeerAborted)
	require.NotErrorIs(t, st.Err, ErrQueueTimeout)
	if sentAborts != nil {
		require.Equal(t, told, sentAborts(), "no abort back to a receiver that aborted")
	}
	// Untouched: the holder is still live. Its own receiver's claim may land late on a loaded
	// host and move it from Advertised on (InFlight, a stream waiting for its pieces).
	require.Contains(t, []State{Advertised, InFlight}, holder.Status().State, "the holder is untouched")
	select {
	case <-holder.Done():
		t.Fatalf("the holder ended with the other request's abort: %v", holder.Status())
	default:
	}
	waitClosedWithin(t, hr.Quiesced(), "the receiver quiesced", 30*time.Second)
	require.Zero(t, sender.Health().Numbers.PoisonedBlocks)
	require.Zero(t, receiver.Health().Numbers.PoisonedBlocks)
}
