// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/stretchr/testify/require"
)

// The validated-read rule: a sender told (falsely) that its receiver is gone ends the
// exposure, quiesces and reuses its blocks while the receiver's gets are still on the wire;
// the receiver, which never heard (the sender's abort is lost), reads the changed blocks, then
// the changed generation word, and fails: it never completes with bytes that changed under it.
// Without the check the receiver completed with the reused bytes.
func TestRMAValidatedRead_SenderReusesBlocksMidRead(t *testing.T) {
	src, dst := rmaPools(t, 61)
	p := newPair(t, rmaConfig(), rmaConfig())
	p.net.Endpoint("prefill").AllowDirect(src.mem)
	p.net.Endpoint("decode").AllowDirect(dst.mem)
	var hang atomic.Bool
	hang.Store(true)
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		switch {
		case fp.Kind == wire.KindData && !fp.Generation && hang.Load():
			return mem.Fault{Hang: true} // the data gets wait on the wire until Resume
		case fp.Kind == wire.KindAbort && fp.From == "prefill":
			return mem.Fault{Drop: true} // the receiver never hears that the sender gave up
		}
		return mem.Fault{}
	})
	hs, hr := p.start(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "gets on the wire")
	require.Equal(t, PathRMA, hr.Path())

	// A keepalive false alarm at the sender only: it ends the exposure and quiesces.
	p.net.ReportPeerLost(p.net.Endpoint("prefill"), "decode", fmt.Errorf("%w: false alarm", ErrPeerLost))
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hs, Failed)
	for i := range src.mem { // the caller reuses its blocks at once, as Quiesced allows
		src.mem[i] = ^src.mem[i]
	}
	hang.Store(false)
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	requireState(t, hr, Failed)
	require.ErrorIs(t, hr.Status().Err, ErrStaleRead)
	var se *staleReadError
	require.ErrorAs(t, hr.Status().Err, &se)
	require.NotEqual(t, se.Offered, se.Read)
	require.Zero(t, p.net.Pending(), "every operation has its final verdict")
}

// Without a disturbance the generation read is one more get after the data, and the transfer
// completes; the sender's word then changes, so a late repeat of the check would fail.
func TestRMAValidatedRead_UndisturbedCompletes(t *testing.T) {
	src, dst := rmaPools(t, 62)
	p, w := directPair(t, rmaConfig(), rmaConfig(), src, dst)
	var gens atomic.Int32
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		if fp.Generation {
			gens.Add(1)
		}
		return w.judge(fp)
	})
	hs, hr := p.start(t, 1, src, dst)
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hr, Completed)
	requireState(t, hs, Completed)
	require.Equal(t, PathRMA, hr.Path())
	require.Equal(t, int32(1), gens.Load(), "one generation read")
	require.Equal(t, src.stream(t), dst.stream(t))
}

// L9 with the validated reads: an exposure poisoned for good (the receiver never released the
// sender's blocks, and is not known gone) gives its generation word back once the sender has
// given up: its blocks are never reused, so the word may change at once (a late read of it by
// the receiver fails, as it should). The words of such exposures were kept for good, and with
// every word gone each later offer was declined: the transfer fell back to IOV messages.
func TestL9_PoisonedExposureGivesItsGenerationWordBack(t *testing.T) {
	src, dst := rmaPools(t, 71)
	scfg, rcfg := rmaConfig(), rmaConfig()
	scfg.TransferTimeout, scfg.Tuning.QuarantineTimeout = 100*time.Millisecond, 50*time.Millisecond
	rcfg.TransferTimeout, rcfg.Tuning.QuarantineTimeout = time.Minute, time.Minute
	p := newPair(t, scfg, rcfg)
	p.net.Endpoint("prefill").SetGenerationWords(1)
	p.net.Endpoint("prefill").AllowDirect(src.mem)
	p.net.Endpoint("decode").AllowDirect(dst.mem)
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == wire.KindData && !fp.Generation && fp.Tag.Request == 1 {
			return mem.Fault{Hang: true} // the receiver's gets never end: it never releases
		}
		return mem.Fault{}
	})
	hs, hr := p.start(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "gets on the wire")
	require.Equal(t, PathRMA, hr.Path())
	eventually(t, func() bool { return hs.Status().BlocksPoisoned }, "the sender's exposure poisoned")
	require.NoError(t, p.src.Drain(bg), "the sender's goroutine ended")

	src2, dst2 := rmaPools(t, 72)
	p.net.Endpoint("prefill").AllowDirect(src2.mem)
	p.net.Endpoint("decode").AllowDirect(dst2.mem)
	hs2, hr2 := p.start(t, 2, src2, dst2)
	waitClosed(t, hr2.Quiesced(), "second receiver quiesced")
	waitClosed(t, hs2.Quiesced(), "second sender quiesced")
	requireState(t, hr2, Completed)
	require.Equal(t, PathRMA, hr2.Path(), "the only generation word never came back: the offer was declined")
	require.Equal(t, src2.stream(t), dst2.stream(t))
	require.False(t, isClosed(hs.Quiesced()))
}

// L12 with the validated reads: when every generation word of the sender's transport is held,
// its rma and pull offers are declined and the transfers fall back (IOV messages, staging
// messages), which must not be silent: Health is unhealthy with a reason saying so until a
// word comes back, and the declined offers are counted.
func TestL12_GenerationWordsRunOutVisibly(t *testing.T) {
	long := func(c Config) Config {
		c.TransferTimeout, c.Tuning.QuarantineTimeout = time.Minute, time.Minute
		return c
	}
	cases := []struct {
		desc  string
		pair  func(t *testing.T) *pair
		start func(t *testing.T, p *pair, id RequestID) (hs, hr *Handle)
	}{
		{desc: "rma", pair: func(t *testing.T) *pair { return newPair(t, long(rmaConfig()), long(rmaConfig())) },
			start: func(t *testing.T, p *pair, id RequestID) (*Handle, *Handle) {
				src, dst := rmaPools(t, 80+uint64(id))
				p.net.Endpoint("prefill").AllowDirect(src.mem)
				p.net.Endpoint("decode").AllowDirect(dst.mem)
				return p.start(t, id, src, dst)
			}},
		{desc: "pull", pair: func(t *testing.T) *pair { return newPullPair(t, long(pullConfig()), long(pullConfig())) },
			start: func(t *testing.T, p *pair, id RequestID) (*Handle, *Handle) {
				src, dst := pools(t, 80+uint64(id))
				return p.startStaged(t, id, src, dst)
			}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p := c.pair(t)
			p.net.Endpoint("prefill").SetGenerationWords(1)
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindData && !fp.Generation && fp.Tag.Request == 1 {
					return mem.Fault{Hang: true} // transfer 1's exposure holds the only word
				}
				return mem.Fault{}
			})
			hs1, hr1 := c.start(t, p, 1)
			eventually(t, func() bool { return p.net.OnWire() >= 1 }, "transfer 1's reads on the wire")
			h := p.src.Health()
			require.False(t, h.Healthy, "every generation word held went unreported")
			require.Contains(t, h.Reason, "all 1 generation words held")
			require.Equal(t, 1, h.Numbers.GenerationWordsHeld)
			require.Equal(t, 1, h.Numbers.GenerationWords)

			hs2, hr2 := c.start(t, p, 2)
			waitClosed(t, hr2.Quiesced(), "transfer 2 received")
			waitClosed(t, hs2.Quiesced(), "transfer 2 sent")
			requireState(t, hr2, Completed)
			require.Equal(t, int64(1), p.src.Health().Numbers.GenerationDeclines, "the declined offer counted")
			if c.desc == "rma" {
				require.Equal(t, PathDirect, hr2.Path(), "declined: IOV messages")
			}

			p.net.SetFault(nil)
			p.net.Resume()
			waitClosed(t, hr1.Quiesced(), "transfer 1 received")
			waitClosed(t, hs1.Quiesced(), "transfer 1 sent")
			requireState(t, hr1, Completed)
			eventually(t, func() bool { return p.src.Health().Healthy }, "healthy once the word came back")
			h = p.src.Health()
			require.Zero(t, h.Numbers.GenerationWordsHeld)
			require.Equal(t, int64(1), h.Numbers.GenerationDeclines)
		})
	}
}
