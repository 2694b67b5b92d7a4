// SPDX-License-Identifier: Apache-2.0

//go:build gpu && cgo

// More of the cross-path promises on the device gets route over real UCX, with the peer an
// enginepeer process on the same GPU (ucx_device_promises_gpu_test.go has Close, Cancel and the
// peer killed mid-transfer): a frozen peer (L12) and a peer lost before any byte moved (L11).

package transfer

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
)

// deviceGetsEngine is an engine over a plain transport with a CUDA-enabled UCX whose device
// registrations its transfers hold are counted (holds).
func deviceGetsEngine(t *testing.T, cfg Config) (*ucxEngine, *deviceHoldCounter) {
	t.Helper()
	holds := &deviceHoldCounter{}
	u := newUCXEngineOver(t, "", "", cfg, func(i ucxImpl) Transport { holds.ucxImpl = i; return holds })
	requireDeviceUCX(t, ucxOf(u.tr).DeviceMemory())
	return u, holds
}

// enginePoolOnDevice is ucxEnginePool(blocks, seed, fill) in cudaMalloc memory registered with
// u's transport: its plan, the pool as a Spec names it, and the buffer.
func enginePoolOnDevice(t *testing.T, rt *cuda.Runtime, u *ucxEngine, blocks int64, seed uint64, fill bool) (*layout.Plan, DevicePool, *cuda.Buffer) {
	t.Helper()
	host, plan := ucxEnginePool(t, blocks, seed, fill)
	buf, err := rt.Alloc(int64(len(host)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = buf.Free() })
	require.NoError(t, rt.CopyToDevice(buf.Mem(), host))
	reg, err := u.tr.RegisterDevice(buf.Mem().Addr, int64(len(host)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })
	return plan, DevicePool{Addr: reg.Addr(), Len: reg.Len()}, buf
}

// TestL12_DeviceOverUCXFrozenPeerTurnsTheOtherSideUnhealthy is
// TestL12_UCXFrozenPeerTurnsTheOtherSideUnhealthyOnEveryPath on the device gets route: the
// enginepeer (-device) stops itself (SIGSTOP) mid-transfer as the receiver (-freeze), or is
// stopped as the sender once this side's gets have read some of its pool. This side turns
// unhealthy within its progress deadline ("no transfer progressed"), or, receiving, completes
// with every byte (its gets read a stopped process's device memory without it); after SIGCONT
// the request completes on both sides, the peer checking every byte, and this side is healthy
// again, nothing poisoned, no slot lost, its device registration let go.
func TestL12_DeviceOverUCXFrozenPeerTurnsTheOtherSideUnhealthy(t *testing.T) {
	rt := openGPU(t)
	const blocks = 1024           // 2 GiB: a freeze must land among the gets
	const slack = 5 * time.Second // the deadline itself is 200 ms
	bin := peerproc.BuildEnginePeer(t)
	for _, frozen := range []string{"sender", "receiver"} {
		t.Run("frozen "+frozen, func(t *testing.T) {
			senderFrozen := frozen == "sender"
			cfg := ucxPeerTestConfig()
			cfg.TransferTimeout = 60 * time.Second // the freeze, not a deadline, is under test
			cfg.ProgressDeadline = 200 * time.Millisecond
			local, holds := deviceGetsEngine(t, cfg)
			mode := map[bool]string{true: "engine-send", false: "engine-recv"}[senderFrozen] // the peer's
			args := append(ucxPeerArgs("", "", mode, blocks, 86, 2*time.Minute), "-device")
			if !senderFrozen {
				args = append(args, "-freeze")
			}
			peer := peerproc.Start(t, bin, args...)
			peer.Connect(t, string(local.tr.Self()))
			plan, pool, buf := enginePoolOnDevice(t, rt, local, blocks, 5, !senderFrozen)
			peer.Expect(t, "FILLED", 60*time.Second)
			spec := Spec{ID: 86, Peer: Peer(peer.Addr), Plan: plan, Device: pool}
			var h *Handle
			var err error
			if senderFrozen {
				h, err = local.e.Receive(bg, spec)
				require.NoError(t, err)
				require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 60*time.Second, 20*time.Microsecond)
				if isClosed(h.Done()) {
					waitQuiesced(t, h, 30*time.Second)
					t.Skipf("the request ended before its bytes were seen moving (%v): nothing to check", h.Status().State)
				}
				peer.Signal(t, syscall.SIGSTOP)
			} else {
				h, err = local.e.Send(bg, spec)
				require.NoError(t, err)
				if peer.Expect(t, "FREEZE ", 60*time.Second) == "missed" {
					waitQuiesced(t, h, 30*time.Second)
					t.Skip("the peer's request ended before it saw bytes moving: nothing to check")
				}
			}
			froze := time.Now()
			for local.e.Health().Healthy && !isClosed(h.Done()) && time.Since(froze) < cfg.ProgressDeadline+slack {
				time.Sleep(time.Millisecond)
			}
			hl, st := local.e.Health(), h.Status()
			t.Logf("%v after the %s froze: healthy %v (%s); request %v, path %v, %d of %d bytes",
				time.Since(froze).Round(time.Millisecond), frozen, hl.Healthy, hl.Reason, st.State, h.Path(), st.Bytes, st.Total)
			require.Equal(t, PathRMA, h.Path())
			switch {
			case isClosed(h.Done()) && senderFrozen: // its gets read the stopped sender's memory to the end
				waitQuiesced(t, h, 30*time.Second)
				require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
			case isClosed(h.Done()):
				peer.Signal(t, syscall.SIGCONT)
				require.Equal(t, "true", peer.Expect(t, "THAW ", 30*time.Second), "the sender ended while its receiver was frozen: %+v", h.Status())
			default:
				require.False(t, hl.Healthy, "healthy %v after the peer froze with the request in flight: %+v", time.Since(froze), hl)
				require.Contains(t, hl.Reason, "no transfer progressed")
			}
			peer.Signal(t, syscall.SIGCONT)
			if !senderFrozen && !isClosed(h.Done()) {
				peer.Expect(t, "THAW ", 30*time.Second)
			}
			waitQuiesced(t, h, 60*time.Second)
			require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
			require.False(t, h.Status().BlocksPoisoned)
			require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 60*time.Second), "the peer's verdict")
			if senderFrozen {
				want, _ := ucxEnginePool(t, blocks, 5, true)
				got := make([]byte, len(want))
				require.NoError(t, rt.CopyFromDevice(got, buf.Mem()))
				require.True(t, bytes.Equal(want, got), "every byte")
			}
			eventually(t, func() bool { return local.e.Health().Healthy }, "healthy after the thaw")
			requireSlotsAccounted(t, local.e)
			require.Zero(t, local.e.pool.Stats().Poisoned)
			require.Zero(t, holds.n.Load(), "the device registration held after Quiesced")
		})
	}
}

// TestL11_DeviceOverUCXRequestToAKilledPeerFailsAtOnce is
// TestL11_UCXSendToAKilledPeerFailsAtOnceOnEveryPath on the device gets route: a Send of a
// registered device pool queued for a peer process that is then killed fails once the loss is
// known, within a second; a Send and a Receive of device pools made after it fail at once,
// naming the peer; none is poisoned or quarantined, and none holds its device registration
// once quiescent.
func TestL11_DeviceOverUCXRequestToAKilledPeerFailsAtOnce(t *testing.T) {
	rt := openGPU(t)
	const bound, lossBound = time.Second, 10 * time.Second // the promise; docs/ucx.md, "A killed peer"
	bin := peerproc.BuildEnginePeer(t)
	cfg := ucxPeerTestConfig()
	cfg.QueueTimeout = 60 * time.Second
	q := &quarantineCounter{}
	cfg.Observer = q
	local, holds := deviceGetsEngine(t, cfg)
	peer := peerproc.Start(t, bin, append(ucxPeerArgs("", "", "engine-recv", 1, 31, 60*time.Second), "-device")...)
	p := Peer(peer.Addr)
	peer.Connect(t, string(local.tr.Self()))
	require.Eventually(t, func() bool { // its hello came: both endpoints exist
		local.e.mu.Lock()
		defer local.e.mu.Unlock()
		ph, ok := local.e.peers[p]
		return ok && chanClosed(ph.met)
	}, 30*time.Second, time.Millisecond)
	request := func(id RequestID, send bool) *Handle {
		plan, pool, _ := enginePoolOnDevice(t, rt, local, 16, uint64(id), send)
		spec := Spec{ID: id, Peer: p, Plan: plan, Device: pool}
		var h *Handle
		var err error
		if send {
			h, err = local.e.Send(bg, spec)
		} else {
			h, err = local.e.Receive(bg, spec)
		}
		require.NoError(t, err)
		return h
	}
	queued := request(41, true) // the peer asks only for 31: this Send waits for its request
	peer.Signal(t, syscall.SIGKILL)
	killed := time.Now()
	for local.e.PeerLost(p) == nil && time.Since(killed) < lossBound {
		time.Sleep(time.Millisecond)
	}
	lost := time.Now()
	require.Error(t, local.e.PeerLost(p), "not lost %v after SIGKILL", lost.Sub(killed))
	t.Logf("peer reported lost %v after SIGKILL", lost.Sub(killed).Round(time.Millisecond))
	select {
	case <-queued.Done():
	case <-time.After(bound):
		t.Fatalf("the queued Send is not done %v after its peer was lost: %+v", time.Since(lost), queued.Status())
	}
	hs := []*Handle{queued}
	for i, send := range []bool{true, false} {
		start := time.Now()
		h := request(RequestID(42+i), send)
		select {
		case <-h.Done():
		case <-time.After(bound):
			t.Fatalf("a request (send %v) to a known lost peer is not done after %v: %+v", send, bound, h.Status())
		}
		t.Logf("a request (send %v) failed %v after it was made", send, time.Since(start).Round(time.Millisecond))
		hs = append(hs, h)
	}
	for _, h := range hs {
		waitQuiesced(t, h, bound)
		st := h.Status()
		require.Equal(t, Failed, st.State, "%v", st.Err)
		var pl *PeerLostError
		require.True(t, errors.As(st.Err, &pl), "request %d: %v", h.ID(), st.Err)
		require.Equal(t, p, pl.Peer)
		require.False(t, st.BlocksPoisoned)
	}
	require.Zero(t, q.n.Load(), "a quarantine")
	require.Zero(t, holds.n.Load(), "a device registration held after Quiesced")
	requireSlotsAccounted(t, local.e)
	require.Zero(t, local.e.pool.Stats().Poisoned)
}
