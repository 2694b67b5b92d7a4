// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// The UCX transport reports each endpoint it connects to a peer, and the engine passes it on
// to the observer (kvxfer_peer_connects_total): once for the first transfer to a peer, not
// again for the next over the same endpoint.
func TestUCXTransport_ReportsPeersConnected(t *testing.T) {
	tp := ucxTransports[0]
	rs, rr := &hookRecorder{}, &hookRecorder{}
	scfg, rcfg := ucxTestConfig(), ucxTestConfig()
	scfg.Observer, rcfg.Observer = rs, rr
	src := newUCXEngine(t, tp.tls, tp.dev, scfg)
	dst := newUCXEngine(t, tp.tls, tp.dev, rcfg)
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 16, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 8}
	connected := func(r *hookRecorder, p Peer) int {
		ev, _ := r.snapshot()
		return len(slices.DeleteFunc(ev, func(s string) bool { return s != "connected "+string(p) }))
	}
	for id := RequestID(1); id <= 2; id++ {
		skv := newUCXKV(t, dims, layout.BlockMajor, []int32{1, 2}, uint64(id))
		rkv := newUCXKV(t, dims, layout.LayerMajor, []int32{3, 4}, 0)
		hs, err := src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: skv.plan, Pool: skv.mem})
		require.NoError(t, err)
		hr, err := dst.e.Receive(bg, Spec{ID: id, Peer: src.tr.Self(), Plan: rkv.plan, Pool: rkv.mem})
		require.NoError(t, err)
		waitQuiesced(t, hr, 10*time.Second)
		waitQuiesced(t, hs, 10*time.Second)
		requireState(t, hr, Completed)
	}
	// A report travels through the transport's dispatch goroutine: wait for it, then check
	// there was exactly one per direction.
	eventually(t, func() bool { return connected(rr, src.tr.Self()) >= 1 && connected(rs, dst.tr.Self()) >= 1 }, "connects reported")
	require.Equal(t, 1, connected(rr, src.tr.Self()), "the receiver connected to the sender once")
	require.Equal(t, 1, connected(rs, dst.tr.Self()), "the sender connected to the receiver once")
}
