// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// exposeRig makes the engines of one exposure test on one transport (mem here, UCX shared
// memory and TCP in ucx_expose_test.go).
type exposeRig struct {
	// side is an engine named name, configured from cfg to run on path pc.
	side func(t *testing.T, name Peer, pc closePath, cfg Config) closeSide
	// claimOf is what a receiver takes from an exposure's params: the sender's peer name and
	// the secret. specSecret is the Spec.Secret the exposure was given (nil: drawn by Expose).
	claimOf func(t *testing.T, p transport.Params, id RequestID, sender closeSide, specSecret []byte) (Peer, []byte)
	// specSecret is the Spec.Secret an exposure is given: the mem transport issues no params,
	// so its receivers take the caller's; UCX's Expose draws one.
	specSecret func() []byte
	// die makes the sender's engine gone, as a prefill that died.
	die func(t *testing.T, sender closeSide)
}

func memExposeRig(t *testing.T) exposeRig {
	n := mem.NewNetwork()
	return exposeRig{
		side: func(t *testing.T, name Peer, pc closePath, cfg Config) closeSide {
			return memPathSide(t, n, name, pc, cfg)
		},
		claimOf: func(t *testing.T, p transport.Params, _ RequestID, sender closeSide, specSecret []byte) (Peer, []byte) {
			require.Nil(t, p, "the mem transport issues no params")
			return sender.self, specSecret
		},
		specSecret: NewClaimSecret,
		die:        func(_ *testing.T, sender closeSide) { n.LosePeer(sender.self) },
	}
}

// exposeConfig is cfg for an exposure test's engines: the observer counts refusals.
func exposeConfig(base Config, pc closePath, obs Observer) Config {
	base.Tuning.DirectChunkBytes, base.Tuning.RMAMinRegionBytes = 2048, 512
	base.Observer = obs
	return base
}

// TestL10_ExposureClaimedOnEveryPath: a Send that names no receiver (Expose) is claimed by the
// first Receive whose request proves its secret, and then runs as a Send to that receiver
// would, on each path (staging, pull, pull in place, direct, RMA, RMA in place): every byte
// arrives and both sides complete. Before the claim, a Receive with a wrong secret and one with
// none are refused (ErrUnauthenticated, counted bad-mac and unsealed) and change nothing: the
// exposure stays queued, its blocks held. After it, a second claim with the right secret is
// refused with ErrAlreadyClaimed, counted as claimed. No slot is lost.
func TestL10_ExposureClaimedOnEveryPath(t *testing.T) {
	for _, pc := range closePaths {
		t.Run("mem/"+pc.name, func(t *testing.T) {
			exposeClaimed(t, memExposeRig(t), pc, pipelineConfig(), testDims, 16)
		})
	}
}

func exposeClaimed(t *testing.T, rig exposeRig, pc closePath, base Config, dims layout.Dims, nBlocks int32) {
	refusals := &refusalCounter{}
	src := rig.side(t, "prefill", pc, exposeConfig(base, pc, refusals))
	dst := rig.side(t, "decode", pc, exposeConfig(base, pc, nopObserver{}))
	other := rig.side(t, "decode-2", pc, exposeConfig(base, pc, nopObserver{}))
	const id = RequestID(700)
	smem, splan := src.kv(t, seqBlocks(0, nBlocks), 7)
	specSecret := rig.specSecret()
	hs, p, err := src.e.Expose(bg, src.spec(Spec{ID: id, Plan: splan, Secret: specSecret}, smem))
	require.NoError(t, err)
	peer, secret := rig.claimOf(t, p, id, src, specSecret)
	require.Len(t, secret, claimSecretBytes)

	// Refused claims: a wrong secret, then none, from another receiver.
	omem, oplan := other.kv(t, seqBlocks(int32(dims.NumBlocks)-nBlocks, nBlocks), 0)
	for _, c := range []struct {
		secret []byte
		reason string
	}{{bytes.Repeat([]byte{0x3a}, claimSecretBytes), "bad-mac"}, {nil, "unsealed"}} {
		h := startOnceFree(t, func() (*Handle, error) {
			return other.e.Receive(bg, other.spec(Spec{ID: id, Peer: peer, Plan: oplan, Secret: c.secret}, omem))
		})
		waitClosed(t, h.Quiesced(), "a refused claim's Receive quiesced")
		requireState(t, h, Failed, ErrUnauthenticated)
		// At least once: the receiver may have resent its request before the refusal came.
		eventually(t, func() bool { return refusals.auth("claim", c.reason) >= 1 }, "the refusal counted: "+c.reason)
		require.NoError(t, h.Release())
	}
	require.Equal(t, Queued, hs.Status().State, "refused claims change nothing: %v", hs.Status().Err)
	require.False(t, isClosed(hs.Quiesced()), "the blocks stay held")

	// The claim: the transfer runs as a Send to this receiver would.
	dmem, dplan := dst.kv(t, seqBlocks(int32(dims.NumBlocks)-nBlocks, nBlocks), 0)
	hr, err := dst.e.Receive(bg, dst.spec(Spec{ID: id, Peer: peer, Plan: dplan, Secret: secret}, dmem))
	require.NoError(t, err)
	waitClosedWithin(t, hr.Quiesced(), "the claiming receiver quiesced", time.Minute)
	requireState(t, hr, Completed)
	waitClosedWithin(t, hs.Quiesced(), "the exposure quiesced", time.Minute)
	requireState(t, hs, Completed)
	got := make([]byte, dplan.Bytes())
	require.NoError(t, layouttest.ReferenceGather(dplan, dmem, got))
	want := make([]byte, splan.Bytes())
	require.NoError(t, layouttest.ReferenceGather(splan, smem, want))
	require.True(t, bytes.Equal(want, got), "every byte")
	require.Equal(t, pc.path, hr.Path(), "the receiver's path")
	require.Equal(t, pc.path, hs.Path(), "the exposure's path")
	require.Equal(t, pc.pull, hr.Pulled(), "pulled")

	// A second claim, with the right secret: already claimed, counted.
	h2 := startOnceFree(t, func() (*Handle, error) {
		return other.e.Receive(bg, other.spec(Spec{ID: id, Peer: peer, Plan: oplan, Secret: secret}, omem))
	})
	waitClosed(t, h2.Quiesced(), "the second claim's Receive quiesced")
	requireState(t, h2, Failed, ErrAlreadyClaimed)
	eventually(t, func() bool { return refusals.auth("claim", "claimed") >= 1 }, "the second claim counted")
	requireDeviceHolds(t, src, hs)
	requireDeviceHolds(t, dst, hr)
	requireDeviceHolds(t, other) // its refused claims quiesced: nothing held
	for _, e := range []*Engine{src.e, dst.e, other.e} {
		requireSlotsAccounted(t, e)
	}
}

// TestL10_UnclaimedExposureIsQueued: an exposure nobody has claimed is a queued Send of the one
// lifecycle (it has no path yet, so one case per transport covers every path): it ends Failed
// at Config.ExposureTimeout (ErrDeadline), by Cancel (CancelledBeforeAdvertise), or by Close
// (ErrClosed), each with Done and Quiesced closed together (FreeNow: nothing was read), and a
// claim that comes later fails at once with the exposure's end, not at its own queue timeout.
// An expired exposure is no stall: Health stays healthy. A prefill that dies before the claim
// fails the Receive with ErrPeerLost naming the prefill.
func TestL10_UnclaimedExposureIsQueued(t *testing.T) {
	for _, c := range unclaimedCases {
		t.Run("mem/"+c.desc, func(t *testing.T) { exposeUnclaimed(t, memExposeRig(t), c, pipelineConfig(), testDims, 16) })
	}
}

type unclaimedCase struct {
	desc string
	// end ends the exposure (or its sender) and returns what its handle and a later claim
	// fail with (nil: no later claim is tried).
	end func(t *testing.T, rig exposeRig, src closeSide, h *Handle) (State, error, error)
}

var unclaimedCases = []unclaimedCase{
	{"expires", func(t *testing.T, _ exposeRig, _ closeSide, h *Handle) (State, error, error) {
		return Failed, ErrDeadline, ErrDeadline
	}},
	{"cancelled", func(t *testing.T, _ exposeRig, src closeSide, h *Handle) (State, error, error) {
		require.Equal(t, CancelledBeforeAdvertise, src.e.Cancel(h.ID()))
		require.True(t, isClosed(h.Done()) && isClosed(h.Quiesced()), "FreeNow: Done and Quiesced closed by Cancel")
		return Cancelled, ErrCancelled, ErrPeerAborted
	}},
	{"closed", func(t *testing.T, _ exposeRig, src closeSide, _ *Handle) (State, error, error) {
		require.NoError(t, src.e.Close())
		return Failed, ErrClosed, nil
	}},
	{"the prefill dies", func(t *testing.T, rig exposeRig, src closeSide, _ *Handle) (State, error, error) {
		rig.die(t, src)
		return 0, nil, ErrPeerLost
	}},
}

func exposeUnclaimed(t *testing.T, rig exposeRig, c unclaimedCase, base Config, dims layout.Dims, nBlocks int32) {
	pc := closePaths[0]
	base.QueueTimeout = 30 * time.Second // a later claim must not end by its own queue timeout
	if c.desc == "expires" {
		// Past the progress deadline: were the expiry a queued request that failed, Health
		// would call the engine stalled.
		base.ExposureTimeout, base.ProgressDeadline = 300*time.Millisecond, 100*time.Millisecond
	}
	src := rig.side(t, "prefill", pc, exposeConfig(base, pc, nopObserver{}))
	dst := rig.side(t, "decode", pc, exposeConfig(base, pc, nopObserver{}))
	const id = RequestID(710)
	smem, splan := src.kv(t, seqBlocks(0, nBlocks), 7)
	specSecret := rig.specSecret()
	hs, p, err := src.e.Expose(bg, Spec{ID: id, Plan: splan, Pool: smem, Secret: specSecret})
	require.NoError(t, err)
	peer, secret := rig.claimOf(t, p, id, src, specSecret)
	state, hErr, claimErr := c.end(t, rig, src, hs)
	if hErr != nil {
		waitClosed(t, hs.Done(), "the exposure done")
		require.True(t, isClosed(hs.Quiesced()), "its blocks quiescent with its outcome: nothing was read")
		requireState(t, hs, state, hErr)
		require.Zero(t, hs.Status().Bytes)
		if c.desc == "expires" {
			// The stall rule only: under load a UCX transport may report its own progress late.
			h := src.e.Health()
			require.NotContains(t, h.Reason, "no transfer progressed", "an exposure nobody claimed is no stall")
		}
	}
	if claimErr == nil {
		return
	}
	dmem, dplan := dst.kv(t, seqBlocks(int32(dims.NumBlocks)-nBlocks, nBlocks), 0)
	start := time.Now()
	hr, err := dst.e.Receive(bg, Spec{ID: id, Peer: peer, Plan: dplan, Pool: dmem, Secret: secret})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "the late claim's Receive quiesced")
	t.Logf("the late claim failed %v after its Receive: %v", time.Since(start).Round(time.Millisecond), hr.Status().Err)
	requireState(t, hr, Failed, claimErr)
	if errors.Is(claimErr, ErrPeerLost) {
		var pl *PeerLostError
		require.ErrorAs(t, hr.Status().Err, &pl)
		require.Equal(t, peer, pl.Peer, "the error names the prefill")
	}
}

// TestExposeRefusesANamedReceiver: an exposure names no receiver; Peer or Subs is refused
// before anything starts.
func TestExposeRefusesANamedReceiver(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	src, _ := pools(t, 1)
	_, _, err := p.src.Expose(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	var se *specError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "Peer", se.Field)
	hs, _, err := p.src.Expose(bg, Spec{ID: 1, Plan: src.plan, Pool: src.mem})
	require.NoError(t, err, "the id was never taken")
	require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(hs.ID()))
}
