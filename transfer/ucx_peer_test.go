// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
)

// ucxEnginePool mirrors enginepeer's EnginePool (transfer/internal/enginepeer): the same dims, block-major, seeded fill.
func ucxEnginePool(t testing.TB, blocks int64, seed uint64, fill bool) ([]byte, *layout.Plan) {
	t.Helper()
	l := layout.Packed(layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2,
		TokensPerBlock: 16, NumBlocks: blocks}, layout.BlockMajor)
	mem := make([]byte, l.SpanBytes())
	if fill {
		var key [32]byte
		key[0], key[1] = byte(seed), byte(seed>>8)
		_, _ = rand.NewChaCha8(key).Read(mem)
	}
	ids := make([]int32, blocks)
	for i := range ids {
		ids[i] = int32(i)
	}
	p, err := layout.NewPlan(l, l.All(), ids)
	require.NoError(t, err)
	return mem, p
}

func ucxPeerArgs(tls, dev, mode string, blocks int64, id RequestID, timeout time.Duration) []string {
	args := []string{"-mode", mode, "-tls", tls, "-total", strconv.FormatInt(blocks, 10), "-chunk", strconv.Itoa(1 << 20),
		"-seed", "5", "-id", strconv.FormatUint(uint64(id), 10), "-timeout", timeout.String()}
	if dev != "" {
		args = append(args, "-net-devices", dev)
	}
	return args
}

func ucxPeerTestConfig() Config {
	cfg := ucxTestConfig()
	cfg.SlotBytes = 1 << 20
	cfg.TransferTimeout = 3 * time.Second
	cfg.ProgressDeadline = 500 * time.Millisecond
	cfg.Tuning.QuarantineTimeout = 2 * time.Second
	return cfg
}

// Two engines in two processes, each direction, over shared memory and TCP; every byte
// checked by the receiving side.
func TestUCXTransport_TwoProcessesEveryByteChecked(t *testing.T) {
	const blocks = 16 // 32 MiB
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		for _, dir := range []string{"peer-sends", "peer-receives"} {
			t.Run(tr.name+"/"+dir, func(t *testing.T) {
				mode := "engine-send"
				if dir == "peer-receives" {
					mode = "engine-recv"
				}
				peer := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, mode, blocks, 77, 30*time.Second)...)
				local := newUCXEngine(t, tr.tls, tr.dev, ucxPeerTestConfig())
				peer.Connect(t, string(local.tr.Self()))
				pool, plan := ucxEnginePool(t, blocks, 5, mode == "engine-recv")
				spec := Spec{ID: 77, Peer: Peer(peer.Addr), Plan: plan, Pool: pool, Timeout: 30 * time.Second}
				var h *Handle
				var err error
				if mode == "engine-send" {
					h, err = local.e.Receive(bg, spec)
				} else {
					h, err = local.e.Send(bg, spec)
				}
				require.NoError(t, err)
				waitQuiesced(t, h, 30*time.Second)
				require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
				require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 30*time.Second))
				if mode == "engine-send" {
					want, _ := ucxEnginePool(t, blocks, 5, true)
					require.True(t, bytes.Equal(want, pool), "every byte")
				}
			})
		}
	}
}

// The peer sending a request is killed (SIGKILL) or frozen (SIGSTOP) mid-transfer. On the
// survivor: the handle is done within its deadline, quiesced within the quarantine bound,
// slots are released or poisoned with free+leased+poisoned = total and none leased (L5, L9);
// a frozen peer turns health unhealthy (L12); after SIGCONT the frozen peer's late data
// lands nowhere, and a new peer's request moves every byte with health back to healthy.
func TestUCXTransport_PeerKilledOrFrozenMidTransfer(t *testing.T) {
	const blocks = 256 // 512 MiB: far more than moves before the signal
	bin := peerproc.BuildEnginePeer(t)
	// Each row has its own engine and peer processes, and mostly waits: a few at once.
	rows := newRowGroup(t, ucxBigRowsAtOnce)
	defer rows.wait()
	for _, tr := range ucxTransports {
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
			rows.run(fmt.Sprintf("%s/%v", tr.name, sig), func(t *testing.T) {
				cfg := ucxPeerTestConfig()
				// The peer fills its 512 MiB pool before it sends: at load 22 on 2 cores that
				// outlasted the 10 s queue phase, the Receive failed with no byte moved and the
				// wait below timed out (a CI rehearsal). The queue phase is not under test here.
				cfg.QueueTimeout = 2 * time.Minute
				local := newUCXEngine(t, tr.tls, tr.dev, cfg)
				peer := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-send", blocks, 21, 180*time.Second)...)
				peer.Connect(t, string(local.tr.Self()))
				// The Receive's deadline (3 s) runs from its first slot lease: asked before the
				// peer filled its pool, it ran out at load 26 with no byte moved (a CI rehearsal).
				peer.Expect(t, "FILLED", 2*time.Minute)
				pool, plan := ucxEnginePool(t, blocks, 5, false)
				h, err := local.e.Receive(bg, Spec{ID: 21, Peer: Peer(peer.Addr), Plan: plan, Pool: pool})
				require.NoError(t, err)
				require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 2*time.Minute, time.Millisecond, "the peer fills a 512 MiB pool first: slow on a loaded 2-core host")
				require.NotZero(t, h.Status().Bytes, "the request ended before any byte moved: %+v", h.Status())
				peer.Signal(t, sig)
				start := time.Now()
				sawUnhealthy := false
				for !isClosed(h.Done()) && time.Since(start) < cfg.TransferTimeout+5*time.Second {
					if !local.e.Health().Healthy {
						sawUnhealthy = true
					}
					time.Sleep(5 * time.Millisecond)
				}
				st := h.Status()
				require.True(t, isClosed(h.Done()), "not done %v after %v: %+v", time.Since(start), sig, st)
				require.NotEqual(t, Completed, st.State, "512 MiB cannot have moved before %v", sig)
				require.Error(t, st.Err)
				t.Logf("%v: handle %v after %v, unhealthy seen: %v (%v)", sig, st.State, time.Since(start), sawUnhealthy, st.Err)
				if sig == syscall.SIGSTOP {
					require.True(t, sawUnhealthy, "a frozen peer must turn health unhealthy within the progress deadline")
				}
				waitQuiesced(t, h, cfg.Tuning.QuarantineTimeout+5*time.Second)
				ps := local.e.pool.Stats()
				require.Equal(t, ps.Total, ps.Free+ps.Leased+ps.Poisoned)
				require.Zero(t, ps.Leased)
				t.Logf("slots: %d free, %d poisoned of %d", ps.Free, ps.Poisoned, ps.Total)

				if sig == syscall.SIGSTOP {
					peer.Signal(t, syscall.SIGCONT)
					time.Sleep(500 * time.Millisecond) // whatever it still sends arrives now
				}
				// A new peer: every byte of its request lands right, and health recovers.
				peer2 := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-send", 16, 22, 30*time.Second)...)
				peer2.Connect(t, string(local.tr.Self()))
				pool2, plan2 := ucxEnginePool(t, 16, 5, false)
				h2, err := local.e.Receive(bg, Spec{ID: 22, Peer: Peer(peer2.Addr), Plan: plan2, Pool: pool2, Timeout: 30 * time.Second})
				require.NoError(t, err)
				if !servedOrWedged(t, local, h2, 35*time.Second, tr.name == "shm" && sig == syscall.SIGKILL) {
					return
				}
				want, _ := ucxEnginePool(t, 16, 5, true)
				require.True(t, bytes.Equal(want, pool2), "every byte of the new peer's request")
				require.Eventually(t, func() bool { return local.e.Health().Healthy }, 10*time.Second, 10*time.Millisecond,
					"health after a new peer worked: %s", local.e.Health().Reason)
			})
		}
	}
}

// servedOrWedged waits for a new peer's request h to the survivor of a killed peer, and
// reports whether it completed. A peer killed while writing into the survivor's UCX
// shared-memory receive queue wedges that queue for good (a UCX limitation; see package ucx's probe.go):
// then the survivor's transport must say so through Health within its probe timeout, and the
// request, cancelled, must end and quiesce with no slot held; or, with
// ucx.Config.ReplaceWedgedWorker, the survivor must replace its worker and the request (sent to
// the old address) must end with no slot held. Anything else fails the test, as does a wedge
// where wedgeCan is false (no shared-memory queue, or no peer died).
func servedOrWedged(t *testing.T, u *ucxEngine, h *Handle, d time.Duration, wedgeCan bool) bool {
	t.Helper()
	start := time.Now()
	replace, base := ucxhooks.Hooks.ReplacesWedgedWorker(u.tr), ucxOf(u.tr).WorkersReplaced()
	replaced := func() bool { return ucxOf(u.tr).WorkersReplaced() > base }
	reported := func() bool { return !replace && errors.Is(ucxOf(u.tr).TransportHealth(), errTransportWedged) }
	for time.Since(start) < d && !isClosed(h.Done()) && !reported() && !replaced() {
		time.Sleep(10 * time.Millisecond)
	}
	if replaced() { // ucx.Config.ReplaceWedgedWorker: the request went to the old address
		t.Logf("UCX limitation hit: the killed peer wedged this worker's shared-memory receive queue; "+
			"the survivor replaced its worker after %v", time.Since(start).Round(time.Millisecond))
		require.True(t, wedgeCan, "a wedged receive queue where none can be")
		waitQuiesced(t, h, 15*time.Second)
		require.NotEqual(t, Completed, h.Status().State)
		require.Zero(t, u.e.pool.Stats().Leased)
		return false
	}
	if err := ucxOf(u.tr).TransportHealth(); err != nil && !replace && !isClosed(h.Done()) {
		t.Logf("UCX limitation hit: the killed peer wedged this worker's shared-memory receive queue; "+
			"the survivor reports it after %v: %v", time.Since(start).Round(time.Millisecond), err)
		require.ErrorIs(t, err, errTransportWedged)
		require.True(t, wedgeCan, "a wedged receive queue where none can be")
		hl := u.e.Health()
		require.False(t, hl.Healthy)
		require.Contains(t, hl.Reason, "wedged")
		t.Logf("cancel: %v", u.e.Cancel(h.ID()))
		waitQuiesced(t, h, 10*time.Second)
		require.NotEqual(t, Completed, h.Status().State)
		require.Zero(t, u.e.pool.Stats().Leased)
		return false
	}
	waitQuiesced(t, h, time.Until(start.Add(d))+time.Second)
	// A request still queued here, with the transport healthy, is a peer that asked and was
	// never served: say what the survivor saw, for the log.
	require.Equal(t, Completed, h.Status().State, "the new peer's request after %v: %+v; transport health: %v",
		time.Since(start), h.Status(), ucxOf(u.tr).TransportHealth())
	return true
}
