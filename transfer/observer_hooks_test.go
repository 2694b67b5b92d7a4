// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// hookRecorder is an Observer with both optional extensions, recording what it hears.
type hookRecorder struct {
	nopObserver
	mu     sync.Mutex
	events []string
	starts []StartInfo
}

func (r *hookRecorder) note(s string) { r.mu.Lock(); r.events = append(r.events, s); r.mu.Unlock() }

func (r *hookRecorder) OnStart(info StartInfo) {
	r.mu.Lock()
	r.starts = append(r.starts, info)
	r.events = append(r.events, "start")
	r.mu.Unlock()
}
func (r *hookRecorder) OnTransition(id RequestID, sub int, from, to State, ev Event) {
	if sub == -1 {
		r.note("transition " + to.String())
	}
}
func (r *hookRecorder) OnPeerConnected(p Peer)       { r.note("connected " + string(p)) }
func (r *hookRecorder) OnPeerLost(p Peer, err error) { r.note("lost " + string(p)) }

func (r *hookRecorder) snapshot() ([]string, []StartInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...), append([]StartInfo(nil), r.starts...)
}

// TestObserverHooks_StartComesFirstAndPeersAreReported: the engine reports an accepted request
// (direction, peers, size) before any of its transitions, even a cancel racing the start, and
// passes peer losses and connects on.
func TestObserverHooks_StartComesFirstAndPeersAreReported(t *testing.T) {
	rec := &hookRecorder{}
	net := mem.NewNetwork()
	eng, err := New(net.Transport("prefill"), Config{Observer: rec})
	require.NoError(t, err)
	defer func() { require.NoError(t, eng.Close()) }()
	other, err := New(net.Transport("decode"), Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, other.Close()) }()

	l := layout.Packed(layout.Dims{NumLayers: 1, KVFactor: 2, NumHeads: 1, HeadDim: 8, ElemSize: 2, TokensPerBlock: 2, NumBlocks: 4}, layout.BlockMajor)
	plan, err := layout.NewPlan(l, l.All(), []int32{1, 3})
	require.NoError(t, err)
	h, err := eng.Send(context.Background(), Spec{ID: 5, Peer: "decode", Plan: plan, Pool: make([]byte, l.SpanBytes())})
	require.NoError(t, err)
	require.Equal(t, CancelledBeforeAdvertise, eng.Cancel(5))
	<-h.Quiesced()
	_, err = eng.Send(context.Background(), Spec{ID: 5, Peer: "decode", Plan: plan, Pool: make([]byte, l.SpanBytes())})
	require.ErrorIs(t, err, ErrDuplicate, "a refused request is not reported as started")

	inbound{eng}.OnPeerConnected("decode")
	net.LosePeer("decode")
	require.Eventually(t, func() bool {
		ev, _ := rec.snapshot()
		return len(ev) >= 4
	}, 5*time.Second, time.Millisecond)
	events, starts := rec.snapshot()
	require.Equal(t, []string{"start", "transition cancelled", "connected decode", "lost decode"}, events)
	require.Equal(t, []StartInfo{{ID: 5, Receive: false, Peers: []Peer{"decode"}, Bytes: plan.Bytes()}}, starts)
}
