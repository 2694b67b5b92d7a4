// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

func TestCancelInEachStateGivesItsOutcomeAndMemoryRule(t *testing.T) {
	type setup func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle)
	cases := []struct {
		desc     string
		cfg      func(*Config)
		setup    setup
		want     CancelOutcome
		final    State
		freeNow  bool
		finalErr error
	}{
		{"unknown id", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) { return p.dst, nil },
			NotFound, 0, true, nil},
		{"queued sender, no request yet", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			h, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			return p.src, h
		}, CancelledBeforeAdvertise, Cancelled, true, ErrCancelled},
		{"advertised receiver", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			eventually(t, func() bool { return h.Status().State == Advertised }, "advertised")
			return p.dst, h
		}, CancelRequestedInFlight, Cancelled, false, ErrCancelled},
		{"in flight, chunk on the wire", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			// The second chunk hangs until the cancel (the loop resumes the wire after it): a
			// 100ms delay let a loaded host's stall between seeing it in flight and the cancel
			// complete the transfer first (AlreadyComplete).
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				return mem.Fault{Hang: fp.Kind == wire.KindData && fp.Tag.Seq == 1}
			})
			_, h := p.start(t, 1, src, dst)
			eventually(t, func() bool { return h.Status().State == InFlight }, "in flight")
			return p.dst, h
		}, CancelRequestedInFlight, Failed, false, nil}, // quarantined for CancelGrace, then resolved
		{"completed", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			_, h := p.start(t, 1, src, dst)
			waitClosed(t, h.Quiesced(), "completed")
			return p.dst, h
		}, AlreadyComplete, Completed, true, nil},
		{"quarantined", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
			_, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Timeout: 300 * time.Millisecond})
			require.NoError(t, err)
			waitClosed(t, h.Done(), "quarantined")
			return p.dst, h
		}, NotCancellable, Failed, false, ErrDeadline},
		{"backend unhealthy", func(c *Config) { c.ProgressDeadline = 20 * time.Millisecond }, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
			_, h := p.start(t, 1, src, dst)
			eventually(t, func() bool { return !p.dst.Health().Healthy }, "unhealthy")
			return p.dst, h
		}, BackendUnhealthy, Cancelled, false, ErrCancelled},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Tuning.CancelGrace = 10 * time.Millisecond
			cfg.Tuning.QuarantineTimeout = 200 * time.Millisecond
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			p := newPair(t, cfg, cfg)
			src, dst := pools(t, 4)
			e, h := c.setup(t, p, src, dst)
			got := e.Cancel(1)
			require.Equal(t, c.want, got)
			require.Equal(t, c.freeNow, got.FreeNow())
			if h == nil {
				return
			}
			if got.FreeNow() {
				require.True(t, isClosed(h.Quiesced()), "%v must leave the memory quiescent on return", got)
			}
			p.net.Resume()
			waitClosed(t, h.Quiesced(), "quiesced")
			if c.final == Failed && c.finalErr == nil { // cancel raced the last chunk or the wire
				s := h.Status().State
				require.True(t, s == Cancelled || s == Completed || s == Failed, "%v", s)
			} else {
				requireState(t, h, c.final)
				if c.finalErr != nil {
					require.ErrorIs(t, h.Status().Err, c.finalErr)
				}
			}
			require.Equal(t, map[bool]CancelOutcome{true: AlreadyComplete, false: NotFound}[true], e.Cancel(1))
		})
	}
}

func TestBadInputGivesTypedErrors(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	src, dst := pools(t, 1)
	other := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 2, 3), 1)
	cases := []struct {
		desc    string
		receive bool
		spec    Spec
		want    error
		field   string
	}{
		{"nil plan", false, Spec{ID: 1, Peer: "decode", Pool: src.mem}, ErrInvalidSpec, "Plan"},
		{"empty peer", false, Spec{ID: 1, Plan: src.plan, Pool: src.mem}, ErrInvalidSpec, "Plan.Peer"},
		{"pool smaller than the layout", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem[:10]}, layout.ErrBufferTooSmall, "Pool"},
		{"negative timeout", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Timeout: -1}, ErrInvalidSpec, "Timeout"},
		{"subs on a send", false, Spec{ID: 1, Subs: []SubSpec{{Peer: "decode", Plan: src.plan}}, Pool: src.mem}, ErrInvalidSpec, "Subs"},
		{"subs and peer", true, Spec{ID: 1, Peer: "x", Subs: []SubSpec{{Peer: "prefill", Plan: dst.plan}}, Pool: dst.mem}, ErrInvalidSpec, "Subs"},
		{"one peer twice", true, Spec{ID: 1, Subs: []SubSpec{{Peer: "a", Plan: dst.plan}, {Peer: "a", Plan: dst.plan}}, Pool: dst.mem}, ErrInvalidSpec, "Subs[1].Peer"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var err error
			if c.receive {
				_, err = p.dst.Receive(bg, c.spec)
			} else {
				_, err = p.src.Send(bg, c.spec)
			}
			require.ErrorIs(t, err, c.want)
			require.ErrorIs(t, err, ErrInvalidSpec)
			var se *specError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.field, se.Field)
		})
	}

	t.Run("receiver layout the sender cannot produce", func(t *testing.T) {
		hs, err := p.src.Send(bg, Spec{ID: 50, Peer: "decode", Plan: other.plan, Pool: other.mem})
		require.NoError(t, err)
		hr, err := p.dst.Receive(bg, Spec{ID: 50, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		waitClosed(t, hs.Quiesced(), "sender")
		waitClosed(t, hr.Quiesced(), "receiver")
		requireState(t, hs, Failed, ErrIncompatible, layout.ErrIncompatible)
		requireState(t, hr, Failed, ErrIncompatible, ErrPeerAborted)
		require.Contains(t, hr.Status().Err.Error(), "Blocks = 4: receiver has 4, sender has 3")
	})

	t.Run("malformed control messages are counted and dropped", func(t *testing.T) {
		tr := p.net.Transport("vandal")
		require.NoError(t, tr.Bind(inbound{p.dst}))
		require.NoError(t, tr.SendControl("decode", []byte("not a message at all")))
		eventually(t, func() bool { return p.dst.Health().Numbers.MalformedControl == 1 }, "counted")
		require.NoError(t, tr.Close(true))
	})

	t.Run("calls after Close", func(t *testing.T) {
		n := mem.NewNetwork()
		e, err := New(n.Transport("solo"), fastConfig())
		require.NoError(t, err)
		h, err := e.Send(bg, Spec{ID: 3, Peer: "nobody", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		require.NoError(t, e.Close())
		require.NoError(t, e.Close(), "Close is idempotent")
		_, err = e.Send(bg, Spec{ID: 4, Peer: "nobody", Plan: src.plan, Pool: src.mem})
		require.ErrorIs(t, err, ErrClosed)
		_, err = e.Receive(bg, Spec{ID: 4, Peer: "nobody", Plan: src.plan, Pool: src.mem})
		require.ErrorIs(t, err, ErrClosed)
		requireState(t, h, Failed, ErrClosed)
		require.Equal(t, AlreadyComplete, e.Cancel(3))
		require.False(t, e.Health().Healthy)
		require.Contains(t, e.Health().Reason, "closed")
		require.NoError(t, e.Drain(bg))
		require.NoError(t, h.Release())
		require.ErrorIs(t, h.Release(), errOverReleased)
	})
}

// TestFaultsEndEveryTransferCleanly: each fault ends both sides with its outcome and nothing
// poisoned. Only the cases about a deadline set one (300ms, on the side whose deadline it is);
// the others keep fastConfig's far one, which a loaded host's stall cannot reach before the
// outcome they check.
func TestFaultsEndEveryTransferCleanly(t *testing.T) {
	const deadline = 300 * time.Millisecond
	cases := []struct {
		desc                   string
		fault                  func(mem.FaultPoint) mem.Fault
		lose                   bool
		srcTimeout, dstTimeout time.Duration // 0: fastConfig's
		resume                 bool          // the wire hangs until the receiver is done
		state                  State
		errs                   []error
		sender                 []error
	}{
		{"first request-info dropped, retry recovers", dropFirst(wire.KindRequestInfo), false, 0, 0, false, Completed, nil, nil},
		{"done message dropped: sender fails at its deadline, memory quiescent", dropAll(wire.KindDone), false, deadline, 0, false,
			Completed, nil, []error{ErrDeadline}},
		{"chunks delayed", dataOnly(mem.Fault{Delay: 5 * time.Millisecond}), false, 0, 0, false, Completed, nil, nil},
		{"chunk fails after 100 bytes", dataOnly(mem.Fault{FailAfter: 100}), false, 0, 0, false, Failed, []error{mem.ErrInjected}, []error{mem.ErrInjected}},
		{"peer lost mid-transfer", dataOnly(mem.Fault{Hang: true}), true, 0, 0, false, Failed, []error{ErrPeerLost}, []error{ErrPeerLost}},
		// The chunk hangs (was: delayed 600ms) until the receiver's deadline has decided it: a
		// stall across both timers could let the delayed chunk land first.
		{"chunk completes late, after the deadline", dataOnly(mem.Fault{Hang: true, IgnoreCancel: true}), false, deadline, deadline, true,
			Failed, []error{ErrDeadline}, nil},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Tuning.QuarantineTimeout = 5 * time.Second
			scfg, dcfg := cfg, cfg
			if c.srcTimeout != 0 {
				scfg.TransferTimeout = c.srcTimeout
			}
			if c.dstTimeout != 0 {
				dcfg.TransferTimeout = c.dstTimeout
			}
			p := newPair(t, scfg, dcfg)
			p.net.SetFault(c.fault)
			src, dst := pools(t, 1)
			hs, hr := p.start(t, 1, src, dst)
			if c.lose {
				eventually(t, func() bool { return p.net.OnWire() > 0 }, "on the wire")
				p.net.LosePeer("decode")
			}
			if c.resume {
				waitClosed(t, hr.Done(), "receiver done")
				p.net.Resume() // the chunk completes, late
			}
			waitClosed(t, hr.Quiesced(), "receiver")
			waitClosed(t, hs.Quiesced(), "sender")
			requireState(t, hr, c.state, c.errs...)
			if c.state == Completed {
				require.Equal(t, src.stream(t), dst.stream(t))
			}
			if c.sender != nil {
				requireState(t, hs, Failed, c.sender...)
			}
			require.Zero(t, p.src.pool.Stats().Poisoned+p.dst.pool.Stats().Poisoned, "every failure here is provably quiescent")
		})
	}
}

func dropFirst(k wire.Kind) func(mem.FaultPoint) mem.Fault {
	var dropped atomic.Bool
	return func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == k && dropped.CompareAndSwap(false, true) {
			return mem.Fault{Drop: true}
		}
		return mem.Fault{}
	}
}

func dropAll(k wire.Kind) func(mem.FaultPoint) mem.Fault {
	return func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Drop: fp.Kind == k} }
}

func TestConfigIsValidatedOnceWithTheFieldNamed(t *testing.T) {
	cases := []struct {
		desc  string
		mut   func(*Config)
		field string
	}{
		{"slot no larger than the header", func(c *Config) { c.SlotBytes = transport.DataHeaderBytes }, "SlotBytes"},
		{"negative concurrency", func(c *Config) { c.MaxConcurrent = -1 }, "MaxConcurrent"},
		{"negative depth", func(c *Config) { c.Tuning.PipelineDepth = -2 }, "Tuning.PipelineDepth"},
		{"negative quarantine budget", func(c *Config) { c.Tuning.QuarantineBudget = -2 }, "Tuning.QuarantineBudget"},
		{"negative poisoned-block budget", func(c *Config) { c.Tuning.PoisonedBlockBudget = -3 }, "Tuning.PoisonedBlockBudget"},
		{"negative retries", func(c *Config) { c.Tuning.MaxRetries = -2 }, "Tuning.MaxRetries"},
		{"negative deadline", func(c *Config) { c.ProgressDeadline = -time.Second }, "ProgressDeadline"},
		{"staging memory too small", func(c *Config) { c.StagingMemory = make([]byte, 100); c.Tuning.NumSlots = 4 }, "StagingMemory"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			c.mut(&cfg)
			tr := mem.NewNetwork().Transport("x")
			defer func() { require.NoError(t, tr.Close(true)) }()
			_, err := New(tr, cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, c.field, ce.Field)
		})
	}
	_, err := New(nil, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	z := Config{Tuning: tuning.Config{QuarantineBudget: tuning.None, PoisonedBlockBudget: tuning.None, MaxRetries: tuning.None}}.withDefaults()
	require.Zero(t, z.Tuning.QuarantineBudget, "tuning.None sets zero")
	require.Zero(t, z.Tuning.PoisonedBlockBudget, "tuning.None sets zero")
	require.Zero(t, z.Tuning.MaxRetries, "tuning.None sets zero")
	require.NoError(t, z.validate())
	d := Config{}.withDefaults()
	require.Equal(t, defaultQuarantineBudget, d.Tuning.QuarantineBudget)
	require.Equal(t, defaultPoisonedBlocks, d.Tuning.PoisonedBlockBudget)
	require.Equal(t, defaultMaxRetries, d.Tuning.MaxRetries)
	require.Equal(t, int64(defaultSlotBytes), d.SlotBytes)
	require.Equal(t, defaultMaxConcurrent*defaultPipelineDepth, d.Tuning.NumSlots)
	require.True(t, strings.Contains((&ConfigError{Field: "F", Value: 1, Reason: "r"}).Error(), "F = 1: r"))
	require.True(t, errors.Is(&specError{}, ErrInvalidSpec))
}

// MaxRetries: None sends a receiver's request once; zero takes the default of six resends.
// None is watched until a deadline of ten retry intervals; the default is watched until it
// resends, then cancelled: with a 200ms deadline for it too, a loaded host's stall of that
// long after the first request could fire the deadline before the first resend.
func TestMaxRetriesNoneSendsTheRequestOnce(t *testing.T) {
	for _, c := range []struct {
		desc    string
		retries int
		timeout time.Duration
		end     func(t *testing.T, p *pair, h *Handle, sent func() int64)
	}{
		{"None: once", tuning.None, 200 * time.Millisecond, func(t *testing.T, _ *pair, h *Handle, sent func() int64) {
			waitClosed(t, h.Quiesced(), "timed out")
			requireState(t, h, Failed, ErrDeadline)
			require.Equal(t, int64(1), sent())
		}},
		{"zero: the default", 0, time.Minute, func(t *testing.T, p *pair, h *Handle, sent func() int64) {
			eventually(t, func() bool { return sent() > 1 }, "the request resent")
			p.dst.Cancel(h.ID())
			waitClosed(t, h.Quiesced(), "cancelled")
		}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Tuning.MaxRetries = c.retries
			cfg.TransferTimeout = c.timeout
			p := newPair(t, cfg, cfg) // the prefill engine never sends
			var requests atomic.Int64
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindRequestInfo {
					requests.Add(1)
				}
				return mem.Fault{}
			})
			_, dst := pools(t, 1)
			h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			c.end(t, p, h, requests.Load)
		})
	}
}

func TestSenderCancelledBeforeTheRequestTellsTheReceiver(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	src, dst := pools(t, 1)
	hs, err := p.src.Send(bg, Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(3))
	require.NoError(t, p.src.Drain(bg))
	require.NoError(t, hs.Release())

	start := time.Now()
	hr, err := p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "receiver told")
	requireState(t, hr, Failed, ErrPeerAborted)
	require.Less(t, time.Since(start), fastConfig().TransferTimeout, "the receiver waited for its deadline")

	// A new Send for the id clears the record: the next request is served.
	hs, err = p.src.Send(bg, Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	require.NoError(t, hr.Release())
	eventually(t, func() bool {
		_, err := p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		return err == nil
	}, "id free again")
	waitClosed(t, hs.Quiesced(), "sent")
	requireState(t, hs, Completed)
}
