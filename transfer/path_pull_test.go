// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// newPullPair is newPair with each engine's staging memory named to its transport
// (mem.Transport.AllowDirect), as ucx.Transport's StagingMemory is mapped: the staging path
// then runs on the pull wire unless a Config says otherwise.
func newPullPair(t testing.TB, src, dst Config) *pair {
	t.Helper()
	n := mem.NewNetwork()
	mk := func(name string, cfg Config) *Engine {
		tr := n.Transport(Peer(name))
		cfg.StagingMemory = make([]byte, int64(cfg.Tuning.NumSlots)*cfg.SlotBytes)
		tr.AllowDirect(cfg.StagingMemory)
		e, err := New(tr, cfg)
		require.NoError(t, err)
		return e
	}
	p := &pair{net: n, src: mk("prefill", src), dst: mk("decode", dst)}
	n.Endpoint("prefill").MapPeers(true) // as UCX over shared memory maps the peer's slots
	n.Endpoint("decode").MapPeers(true)
	t.Cleanup(func() {
		require.NoError(t, p.src.Close())
		require.NoError(t, p.dst.Close())
		requireSlotsAccounted(t, p.src)
		requireSlotsAccounted(t, p.dst)
	})
	return p
}

// pullConfig reads the chunks with gets, which the network's faults reach; inPlaceConfig
// lets the scatter read them in the sender's slot.
func pullConfig() Config {
	c := inPlaceConfig()
	c.Tuning.DisableInPlaceReads = true
	return c
}

func inPlaceConfig() Config {
	c := pipelineConfig()
	c.Tuning.DisableDirect = true // the pools are Go memory moved through a Mover anyway
	return c
}

// kindCounter counts the control messages of each kind that travel, and applies fault to
// each first.
type kindCounter struct {
	mu    sync.Mutex
	n     map[wire.Kind]int
	fault func(mem.FaultPoint) mem.Fault
}

// genRead counts the reads of a generation word (mem.FaultPoint.Generation), apart from data.
const genRead wire.Kind = 255

func countKinds(p *pair, fault func(mem.FaultPoint) mem.Fault) *kindCounter {
	k := &kindCounter{n: map[wire.Kind]int{}, fault: fault}
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		k.mu.Lock()
		if fp.Generation {
			k.n[genRead]++
		} else {
			k.n[fp.Kind]++
		}
		k.mu.Unlock()
		if k.fault != nil {
			return k.fault(fp)
		}
		return mem.Fault{}
	})
	return k
}

func (k *kindCounter) count(kind wire.Kind) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[kind]
}

// startStaged starts a staging Send and Receive of id (Movers on both sides).
func (p *pair) startStaged(t *testing.T, id RequestID, src, dst *kvPool) (hs, hr *Handle) {
	t.Helper()
	hs, err := p.src.Send(bg, Spec{ID: id, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: newHostMover(src.mem)})
	require.NoError(t, err)
	hr, err = p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: newHostMover(dst.mem)})
	require.NoError(t, err)
	return hs, hr
}

// TestPull_ChunksAreReadOutOfTheSendersSlots: with both staging memories exposed, every chunk
// is announced (SlotReady), read and taken (SlotTaken); no data message carries it. A sender or
// receiver with DisablePull keeps the data messages, and the bytes arrive either way.
func TestPull_ChunksAreReadOutOfTheSendersSlots(t *testing.T) {
	for _, tc := range []struct {
		name             string
		srcOff, dstOff   bool
		wantPull, wantOf bool
		inPlace          bool
	}{
		{name: "both pull", wantPull: true},
		{name: "in place", wantPull: true, inPlace: true},
		{name: "sender declines", srcOff: true, wantOf: true},
		{name: "receiver does not ask", dstOff: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, dc := pullConfig(), pullConfig()
			sc.Tuning.DisablePull, dc.Tuning.DisablePull = tc.srcOff, tc.dstOff
			dc.Tuning.DisableInPlaceReads = !tc.inPlace
			p := newPullPair(t, sc, dc)
			k := countKinds(p, nil)
			src, dst := pools(t, 31)
			hs, hr := p.startStaged(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receive quiesced")
			waitClosed(t, hs.Quiesced(), "send quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, src.stream(t), dst.stream(t))
			require.Equal(t, PathStaging, hr.Path())
			chunks := int((src.plan.Bytes() + hr.subs[0].chunk - 1) / hr.subs[0].chunk)
			require.Greater(t, chunks, 2)
			if tc.wantPull {
				require.Equal(t, chunks, k.count(wire.KindSlotReady), "every chunk announced once")
				require.Equal(t, chunks, k.count(wire.KindSlotTaken), "every chunk taken once")
				// One Slots answer per request: a receiver whose request moved nothing within its
				// retry timer asks again (a loaded host: ci26 saw 2), and the sender answers again.
				require.Positive(t, k.count(wire.KindSlots))
				require.LessOrEqual(t, k.count(wire.KindSlots), k.count(wire.KindRequestInfo), "at most one Slots answer per request")
				gets := chunks
				if tc.inPlace {
					gets = 0 // the scatter read each slot where it lies
				}
				require.Equal(t, gets, k.count(wire.KindData), "one get per chunk, no data message")
				require.Equal(t, 1, k.count(genRead), "the sender's generation word read once, after the last get")
			} else {
				require.Zero(t, k.count(wire.KindSlotReady))
				require.Zero(t, k.count(wire.KindSlotTaken))
				require.Equal(t, chunks, k.count(wire.KindData))
				if tc.wantOf {
					// The decline, once, or again for a repeated request (as above).
					require.Positive(t, k.count(wire.KindSlots), "the decline")
					require.LessOrEqual(t, k.count(wire.KindSlots), k.count(wire.KindRequestInfo), "at most one decline per request")
				} else {
					require.Zero(t, k.count(wire.KindSlots))
				}
			}
		})
	}
}

// TestL10_PullSendersSlotStaysOutWhileTheReceiverMayReadIt (L9, L10 on the pull wire): a
// sender cancelled while the receiver's get of its slot hangs on the wire keeps that slot
// leased, and its handle unquiesced, until the receiver's get is final and its release
// arrives; then the slot goes back, not poisoned.
func TestL10_PullSendersSlotStaysOutWhileTheReceiverMayReadIt(t *testing.T) {
	cfg := pullConfig()
	cfg.Tuning.QuarantineTimeout = time.Minute // only the release may end the exposure here
	p := newPullPair(t, cfg, cfg)
	k := countKinds(p, func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == wire.KindData && fp.Tag.Seq == 1 {
			return mem.Fault{Hang: true}
		}
		return mem.Fault{}
	})
	src, dst := pools(t, 32)
	hs, hr := p.startStaged(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "the get of chunk 1 on the wire")
	p.src.Cancel(1)
	waitClosed(t, hs.Done(), "the sender cancelled (quarantined while its slot is read)")
	time.Sleep(50 * time.Millisecond) // grace and more: nothing may release the slot now
	require.False(t, isClosed(hr.Quiesced()), "the receiver quiesced while its scatter ran")
	require.False(t, isClosed(hs.Quiesced()), "the sender quiesced while its slot was being read")
	require.NotZero(t, p.src.pool.Stats().Leased, "the slot being read went back to the pool")
	require.Zero(t, k.count(wire.KindRMARelease), "released before the get was final")
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receive quiesced once its get was final")
	waitClosed(t, hs.Quiesced(), "send quiesced on the receiver's release")
	require.Equal(t, 1, k.count(wire.KindRMARelease))
	require.ErrorIs(t, hs.Status().Err, ErrCancelled)
	st := p.src.pool.Stats()
	require.Zero(t, st.Poisoned, "the release proved the slot unread")
	require.Equal(t, st.Total, st.Free)
}

// TestL9_PullExposureNobodyEndsIsPoisoned: when the receiver's release never arrives, the
// sender's announced slot is poisoned at the quarantine timeout, never reused.
func TestL9_PullExposureNobodyEndsIsPoisoned(t *testing.T) {
	cfg := pullConfig()
	cfg.Tuning.QuarantineTimeout = 100 * time.Millisecond
	p := newPullPair(t, cfg, cfg)
	countKinds(p, func(fp mem.FaultPoint) mem.Fault {
		switch {
		case fp.Kind == wire.KindData && fp.Tag.Seq == 1:
			return mem.Fault{Hang: true}
		case fp.Kind == wire.KindRMARelease:
			return mem.Fault{Drop: true}
		}
		return mem.Fault{}
	})
	src, dst := pools(t, 33)
	hs, hr := p.startStaged(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "the get of chunk 1 on the wire")
	p.src.Cancel(1)
	waitClosed(t, hs.Quiesced(), "send resolved at the quarantine timeout")
	require.NotZero(t, p.src.pool.Stats().Poisoned, "the slot nobody proved unread was reused")
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receive quiesced")
}

// TestL10_PullLostReceiverEndsTheExposure: a receiver the transport reports lost reads nothing
// more, so the sender's announced slots go back at once.
func TestL10_PullLostReceiverEndsTheExposure(t *testing.T) {
	cfg := pullConfig()
	cfg.Tuning.QuarantineTimeout = time.Minute
	p := newPullPair(t, cfg, cfg)
	countKinds(p, func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == wire.KindData && fp.Tag.Seq == 1 {
			return mem.Fault{Hang: true}
		}
		return mem.Fault{}
	})
	src, dst := pools(t, 34)
	hs, _ := p.startStaged(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "the get of chunk 1 on the wire")
	p.net.LosePeer("decode")
	waitClosed(t, hs.Quiesced(), "send quiesced when its receiver was lost")
	require.ErrorIs(t, hs.Status().Err, ErrPeerLost)
	st := p.src.pool.Stats()
	require.Zero(t, st.Poisoned)
	require.Equal(t, st.Total, st.Free)
}

// TestPull_GarbageAnnouncementsFailTheTransferAndLoseNothing: a chunk announced outside the
// sender's slots, twice, or with the wrong length is a protocol error; both sides end and every
// slot of both goes back.
func TestPull_GarbageAnnouncementsFailTheTransferAndLoseNothing(t *testing.T) {
	for name, bad := range map[string]func(m *wire.SlotReady){
		"outside the slots": func(m *wire.SlotReady) { m.Offset = 1 << 40 },
		"wrong length":      func(m *wire.SlotReady) { m.Length++ },
		"past the chunks":   func(m *wire.SlotReady) { m.Seq = 1 << 20 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := pullConfig()
			p := newPullPair(t, cfg, cfg)
			var once sync.Once
			var ours atomic.Bool
			first := make(chan struct{})
			countKinds(p, func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindSlotReady && !ours.Load() {
					once.Do(func() { close(first) })
					return mem.Fault{Drop: true} // the test speaks for the sender
				}
				return mem.Fault{}
			})
			src, dst := pools(t, 35)
			hs, hr := p.startStaged(t, 1, src, dst)
			waitClosed(t, first, "the sender announced a chunk")
			x := hr.subs[0]
			_, n := x.chunkRange(0)
			m := &wire.SlotReady{Header: wire.Header{Sub: x.wireSub, Request: 1, Nonce: x.nonce}, Seq: 0, Length: wire.DataHeaderBytes + n}
			bad(m)
			ours.Store(true)
			require.NoError(t, p.net.Endpoint("prefill").SendControl("decode", wire.Encode(m)))
			waitClosed(t, hr.Quiesced(), "receive quiesced")
			waitClosed(t, hs.Quiesced(), "send quiesced")
			require.ErrorIs(t, hr.Status().Err, ErrProtocol)
			require.ErrorIs(t, hs.Status().Err, ErrPeerAborted)
			for _, e := range []*Engine{p.src, p.dst} {
				st := e.pool.Stats()
				require.Zero(t, st.Poisoned)
				require.Equal(t, st.Total, st.Free)
			}
		})
	}
}

// TestPullValidatedRead_SenderReusesASlotMidRead: a sender told (falsely) that its receiver is
// gone ends the exposure of the slot the receiver is still reading and reuses it, a new gather
// overwriting the payload before its header (as stampChunk does); the receiver, which never
// heard, reads the torn slot, whose header still matches, then the changed generation word,
// and fails with an ErrStaleRead: it never completes with bytes that changed under it.
func TestPullValidatedRead_SenderReusesASlotMidRead(t *testing.T) {
	cfg := pullConfig()
	// Only the stale read may end the receiver: under load the steps between the first lease
	// and the resume took over fastConfig's 2 s, and the deadline ended it first (a CI failure).
	cfg.TransferTimeout = time.Minute
	p := newPullPair(t, cfg, cfg)
	src, dst := pools(t, 36)
	var hang atomic.Bool
	hang.Store(true)
	capB := cfg.SlotBytes - wire.DataHeaderBytes
	capB -= capB % src.plan.Layout().ElemSize
	var last atomic.Uint32
	last.Store(uint32((src.plan.Bytes()+capB-1)/capB - 1))
	countKinds(p, func(fp mem.FaultPoint) mem.Fault {
		switch {
		case fp.Kind == wire.KindData && !fp.Generation && fp.Tag.Seq == last.Load() && hang.Load():
			return mem.Fault{Hang: true}
		case fp.Kind == wire.KindAbort && fp.From == "prefill":
			return mem.Fault{Drop: true}
		}
		return mem.Fault{}
	})
	hs, hr := p.startStaged(t, 1, src, dst)
	// The last chunk's get on the wire and every other chunk moved: the sender's movers may
	// lease the last chunk before an earlier one, and a chunk not leased before the false alarm
	// never is (the receiver would wait out its deadline, not read a torn slot).
	before := int64(last.Load()) * int64(capB) // the bytes of every chunk but the last
	eventually(t, func() bool { return p.net.OnWire() >= 1 && hr.Status().Bytes == before },
		"the last chunk's get on the wire, every other chunk moved")
	p.net.ReportPeerLost(p.net.Endpoint("prefill"), "decode", fmt.Errorf("%w: false alarm", ErrPeerLost))
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hs, Failed)
	for i := 0; i < len(p.src.slots.mem); i += int(cfg.SlotBytes) { // every slot's payload rewritten, headers kept
		for j := i + wire.DataHeaderBytes; j < i+int(cfg.SlotBytes); j++ {
			p.src.slots.mem[j] = ^p.src.slots.mem[j]
		}
	}
	hang.Store(false)
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	requireState(t, hr, Failed)
	require.ErrorIs(t, hr.Status().Err, ErrStaleRead)
	require.Zero(t, p.net.Pending(), "every operation has its final verdict")
}

// TestPullValidatedRead_InPlaceScatterOfAReusedSlotIsStale: the same with the last chunk read
// in place (its scatter reads the sender's slot where it lies): the sender, told falsely that
// its receiver is gone, ends the exposure and reuses the slot while the scatter is held; the
// scatter then copies the changed bytes, the word read after it has changed too, and the
// receiver fails with an ErrStaleRead instead of completing.
func TestPullValidatedRead_InPlaceScatterOfAReusedSlotIsStale(t *testing.T) {
	cfg := inPlaceConfig()
	cfg.TransferTimeout = time.Minute // only the stale read may end the receiver
	p := newPullPair(t, cfg, cfg)
	k := countKinds(p, func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == wire.KindAbort && fp.From == "prefill" {
			return mem.Fault{Drop: true} // the receiver never hears that the sender gave up
		}
		return mem.Fault{}
	})
	src, dst := pools(t, 39)
	g := newGate(t)
	m := &lastScatterStuck{Mover: newHostMover(dst.mem), gate: g}
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: newHostMover(src.mem)})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: anySource{m}})
	require.NoError(t, err)
	waitClosed(t, g.entered, "the last chunk's scatter reading the sender's slot, held")
	// Every chunk announced before the sender hears the false alarm (gathers end out of order):
	// the receiver then has all it needs to reach its check.
	capB := cfg.SlotBytes - wire.DataHeaderBytes
	capB -= capB % src.plan.Layout().ElemSize
	chunks := int((src.plan.Bytes() + capB - 1) / capB)
	eventually(t, func() bool { return k.count(wire.KindSlotReady) == chunks }, "every chunk announced")
	p.net.ReportPeerLost(p.net.Endpoint("prefill"), "decode", fmt.Errorf("%w: false alarm", ErrPeerLost))
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hs, Failed)
	for i := range p.src.slots.mem { // every slot rewritten, as new gathers would
		p.src.slots.mem[i] = ^p.src.slots.mem[i]
	}
	g.let()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	requireState(t, hr, Failed)
	require.ErrorIs(t, hr.Status().Err, ErrStaleRead)
	require.Zero(t, k.count(wire.KindData), "every chunk read in place")
	require.Equal(t, 1, k.count(genRead), "the word read once, after the last scatter")
	require.Zero(t, p.net.Pending(), "every operation has its final verdict")
}

// lastScatterStuck is a Mover whose scatter of the plan's last bytes blocks at its gate.
type lastScatterStuck struct {
	Mover
	*gate
}

func (m *lastScatterStuck) Scatter(p *layout.Plan, src []byte, off int64) error {
	if off+int64(len(src)) == p.Bytes() {
		m.stick()
	}
	return m.Mover.Scatter(p, src, off)
}

// TestL10_PullInPlaceSendersSlotStaysOutWhileTheScatterReadsIt (L9, L10 on the pull wire read
// in place): a sender cancelled while the receiver's scatter still reads its slot where it
// lies keeps that slot leased, and its handle unquiesced, until the scatter is over and the
// receiver's release arrives; then the slot goes back, not poisoned.
func TestL10_PullInPlaceSendersSlotStaysOutWhileTheScatterReadsIt(t *testing.T) {
	cfg := inPlaceConfig()
	cfg.Tuning.QuarantineTimeout = time.Minute // only the release may end the exposure here
	p := newPullPair(t, cfg, cfg)
	k := countKinds(p, nil)
	src, dst := pools(t, 37)
	g := newGate(t)
	m := &stuckMover{Mover: newHostMover(dst.mem), gate: g}
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: newHostMover(src.mem)})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: anySource{m}})
	require.NoError(t, err)
	waitClosed(t, g.entered, "a scatter reading the sender's slot, held")
	p.src.Cancel(1)
	waitClosed(t, hs.Done(), "the sender cancelled (quarantined while its slot is read)")
	time.Sleep(50 * time.Millisecond) // grace and more: nothing may release the slot now
	require.False(t, isClosed(hr.Quiesced()), "the receiver quiesced while its scatter ran")
	require.False(t, isClosed(hs.Quiesced()), "the sender quiesced while its slot was being read")
	require.NotZero(t, p.src.pool.Stats().Leased, "the slot being read went back to the pool")
	require.Zero(t, k.count(wire.KindRMARelease), "released while the scatter read the slot")
	g.let()
	waitClosed(t, hr.Quiesced(), "receive quiesced once its scatter returned")
	waitClosed(t, hs.Quiesced(), "send quiesced on the receiver's release")
	require.Equal(t, 1, k.count(wire.KindRMARelease))
	require.Zero(t, k.count(wire.KindData), "every chunk read in place")
	st := p.src.pool.Stats()
	require.Zero(t, st.Poisoned, "the release proved the slot unread")
	require.Equal(t, st.Total, st.Free)
}

// anySource says its wrapped Mover's Scatter reads any host memory (anySourceScatterer).
type anySource struct{ Mover }

func (anySource) ScatterReadsAnyHostMemory() bool { return true }

// TestDirectLeavesSmallRangesToThePullWire: a direct-capable receiver whose own pool ranges
// average under RMAMinRegionBytes (no RMA offer could be taken) takes the staging path's pull
// wire, read in place, instead of the direct path's IOV messages, which it beats there
// (docs/benchmarks.md); with ranges above the bound, or DisableInPlaceReads, it stays direct.
func TestDirectLeavesSmallRangesToThePullWire(t *testing.T) {
	for _, tc := range []struct {
		name      string
		minRegion int64
		noInPlace bool
		want      Path
	}{
		{name: "small ranges", want: PathStaging},
		{name: "ranges above RMAMinRegionBytes", minRegion: 256, want: PathDirect},
		{name: "DisableInPlaceReads", noInPlace: true, want: PathDirect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pipelineConfig()
			cfg.Tuning.DisableRMA = true
			if tc.minRegion > 0 {
				cfg.Tuning.RMAMinRegionBytes = tc.minRegion
			}
			cfg.Tuning.DisableInPlaceReads = tc.noInPlace
			p := newPullPair(t, cfg, cfg)
			src, dst := pools(t, 38) // block-major to layer-major: 256-byte pieces, 2 KiB ranges
			p.net.Endpoint("prefill").AllowDirect(src.mem)
			p.net.Endpoint("decode").AllowDirect(dst.mem)
			k := countKinds(p, nil)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receive quiesced")
			waitClosed(t, hs.Quiesced(), "send quiesced")
			requireState(t, hr, Completed)
			require.Equal(t, src.stream(t), dst.stream(t))
			require.Equal(t, tc.want, hr.Path())
			require.Equal(t, tc.want == PathStaging, hr.Pulled())
			if tc.want == PathStaging {
				require.NotZero(t, k.count(wire.KindSlotReady))
				require.Zero(t, k.count(wire.KindData), "read in place")
			}
		})
	}
}
