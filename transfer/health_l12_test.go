// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
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
			cfg:  func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots = 1, 2 },
			hold: func(t *testing.T, p *pair) {
				src, dst := streamPools(t, 0)
				hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true})
				require.NoError(t, err)
				hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
				require.NoError(t, err)
				eventually(t, func() bool { return hr.Status().State == Advertised && hs.Status().State == Advertised }, "the stream advertised")
				require.Equal(t, int64(1), p.dst.Health().Numbers.AwaitingReady)
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
			// Ends once unhealthy (a few requests); the 10s bound only ends a failing run: 3s
			// could pass in a loaded host's stall, with the last failure a deadline old by then.
			for id := RequestID(100); !unhealthy && time.Since(start) < 10*time.Second; id++ {
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

// memPath is one way a transfer moves its bytes between two engines on a mem.Network: the
// pair, the pools and how both handles start, and the path the receiver must report.
type memPath struct {
	name   string
	setup  func(t *testing.T, src, dst Config) (p *pair, start func(id RequestID) (hs, hr *Handle))
	want   Path
	pulled bool // the staging path runs on the pull wire (Handle.Pulled)
	// declined: the sender declines the receiver's rma route first and then stages, with a
	// staging slot free at that moment or not at all, never waiting for one (path_device_stage.go).
	declined bool
}

// memPaths are the paths a mem.Network pair can take: staging through data messages, the pull
// wire (the receiver's gets of the sender's slots), the direct path's IOV messages, its RMA
// mode with gets, the RMA mode read in place where the sender's pool is mapped here, and
// device pools (Spec.Device on a fakeDevice) moved by device gets, staged through Movers, or
// staged after the sender declined the receiver's device gets.
func memPaths() []memPath {
	direct := func(t *testing.T, scfg, rcfg Config, mapped bool, src, dst *kvPool) (*pair, func(RequestID) (*Handle, *Handle)) {
		p, _ := directPair(t, scfg, rcfg, src, dst)
		for _, ep := range []Peer{"prefill", "decode"} {
			p.net.Endpoint(ep).MapPeers(mapped)
		}
		return p, func(id RequestID) (*Handle, *Handle) { return p.start(t, id, src, dst) }
	}
	// rmaMode lets the direct path take the RMA mode over the test pools' small ranges.
	rmaMode := func(cs ...*Config) {
		for _, c := range cs {
			c.Tuning.RMAMinRegionBytes, c.Tuning.DirectChunkBytes = 512, 1<<20
		}
	}
	return []memPath{
		{"staging", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			scfg.Tuning.DisableDirect, rcfg.Tuning.DisableDirect = true, true
			p := newPair(t, scfg, rcfg)
			src, dst := pools(t, 3)
			return p, func(id RequestID) (*Handle, *Handle) { return p.start(t, id, src, dst) }
		}, PathStaging, false, false},
		{"pull", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			for _, c := range []*Config{&scfg, &rcfg} {
				c.Tuning.DisableDirect, c.Tuning.DisableInPlaceReads = true, true
				c.Tuning.NumSlots = c.MaxConcurrent * c.Tuning.PipelineDepth
			}
			p := newPullPair(t, scfg, rcfg)
			src, dst := pools(t, 4)
			return p, func(id RequestID) (*Handle, *Handle) { return p.startStaged(t, id, src, dst) }
		}, PathStaging, true, false},
		{"direct", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			for _, c := range []*Config{&scfg, &rcfg} {
				c.Tuning.DisableRMA, c.Tuning.DirectChunkBytes = true, 512
			}
			src, dst := pools(t, 5)
			return direct(t, scfg, rcfg, false, src, dst)
		}, PathDirect, false, false},
		{"rma", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			rmaMode(&scfg, &rcfg)
			src, dst := rmaPools(t, 6)
			return direct(t, scfg, rcfg, false, src, dst)
		}, PathRMA, false, false},
		{"rma in place", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			rmaMode(&scfg, &rcfg)
			src, dst := rmaPools(t, 7)
			return direct(t, scfg, rcfg, true, src, dst)
		}, PathRMA, false, false},
		{"device gets", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			rmaMode(&scfg, &rcfg)
			src, dst := rmaPools(t, 8)
			return devicePathPair(t, scfg, rcfg, true, true, src, dst)
		}, PathRMA, false, false},
		{"device staging", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			src, dst := pools(t, 9)
			return devicePathPair(t, scfg, rcfg, false, false, src, dst)
		}, PathStaging, false, false},
		// The receiver takes the rma route, the sender (no device gets) declines it: both stage.
		{"device staging after a decline", func(t *testing.T, scfg, rcfg Config) (*pair, func(RequestID) (*Handle, *Handle)) {
			rmaMode(&scfg, &rcfg)
			src, dst := rmaPools(t, 10)
			return devicePathPair(t, scfg, rcfg, false, true, src, dst)
		}, PathStaging, false, true},
	}
}

// L12 on every path, for a frozen peer: every data operation (chunk, get, read of a
// generation word) hangs on the wire, as it does when the other side's process is stopped,
// so neither side moves a byte. The side still running must report unhealthy within the
// progress deadline: a receiver whose sender froze, and a sender whose receiver froze, even
// where the receiver's reads move the bytes (the RMA mode, read with gets or in place) and
// the sender sees nothing of them. Once the freeze ends the transfer completes and both
// sides are healthy again.
func TestL12_FrozenPeerTurnsTheOtherSideUnhealthyOnEveryPath(t *testing.T) {
	const slack = time.Second // a loaded CI box
	for _, mp := range memPaths() {
		for _, frozen := range []string{"receiver", "sender"} {
			t.Run(mp.name+"/frozen "+frozen, func(t *testing.T) {
				cfg := fastConfig()
				cfg.ProgressDeadline = 200 * time.Millisecond
				cfg.TransferTimeout = 30 * time.Second
				p, start := mp.setup(t, cfg, cfg)
				hang := func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == wire.KindData} }
				p.net.SetFault(hang)
				hs, hr := start(1)
				eventually(t, func() bool { return p.net.OnWire() > 0 }, "an operation hung on the wire")
				froze := time.Now()
				require.Equal(t, mp.want, hr.Path())
				require.Equal(t, mp.pulled, hr.Pulled())
				watcher := map[string]*Engine{"receiver": p.src, "sender": p.dst}[frozen]
				for watcher.Health().Healthy && time.Since(froze) < cfg.ProgressDeadline+slack {
					time.Sleep(time.Millisecond)
				}
				h := watcher.Health()
				require.False(t, h.Healthy, "healthy %v after the %s froze: %+v", time.Since(froze), frozen, h)
				require.Contains(t, h.Reason, "no transfer progressed")
				require.Equal(t, int64(1), h.Numbers.InFlight)

				p.net.SetFault(nil)
				p.net.Resume()
				waitClosed(t, hr.Quiesced(), "receiver quiesced")
				waitClosed(t, hs.Quiesced(), "sender quiesced")
				requireState(t, hr, Completed)
				requireState(t, hs, Completed)
				for _, e := range []*Engine{p.src, p.dst} {
					require.True(t, e.Health().Healthy, "after the thaw: %s", e.Health().Reason)
				}
			})
		}
	}
}
