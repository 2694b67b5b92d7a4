// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// newUCXEngineSpeaking is newUCXEngine (shared memory) for an engine that says sp in its
// hellos.
func newUCXEngineSpeaking(t testing.TB, cfg Config, sp speech) *ucxEngine {
	t.Helper()
	cfg = cfg.withDefaults()
	cfg.NumSlots = cfg.MaxConcurrent * cfg.PipelineDepth
	tr, err := ucx.New(ucx.Config{TLS: "posix,cma,self", KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(cfg.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second,
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 3 * time.Second})
	require.NoError(t, err)
	cfg.StagingMemory = tr.StagingMemory()
	e, err := newEngine(tr, cfg, sp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &ucxEngine{tr: tr, e: e}
}

// Mixed versions over UCX loopback: an older sender (no streaming, no partial requests) and a
// receiver of this build. A streaming receive fails at once with a *FeatureError (deadlines
// an hour away, the sender still waiting for a request); a plain one completes, every byte
// checked.
func TestUCXTransport_MixedVersions(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.TransferTimeout, cfg.QueueTimeout = time.Hour, time.Hour
	old := newUCXEngineSpeaking(t, cfg, lacking(FeatureStreaming|FeaturePartial))
	cur := newUCXEngine(t, "posix,cma,self", "", cfg)

	s := newUCXKV(t, dims, layout.BlockMajor, []int32{3, 9, 27}, 11)
	r := newUCXKV(t, dims, layout.LayerMajor, []int32{1, 2, 40}, 0)
	hs, err := old.e.Send(bg, Spec{ID: 1, Peer: cur.tr.Self(), Plan: s.plan, Pool: s.mem})
	require.NoError(t, err)
	hr, err := cur.e.Receive(bg, Spec{ID: 1, Peer: old.tr.Self(), Plan: r.plan, Pool: r.mem, Stream: true})
	require.NoError(t, err)
	waitQuiesced(t, hr, 30*time.Second)
	requireState(t, hr, Failed, ErrPeerLacksFeature)
	var fe *FeatureError
	require.True(t, errors.As(hr.Status().Err, &fe))
	require.Equal(t, &FeatureError{Peer: old.tr.Self(), Feature: FeatureStreaming, PeerVersion: wire.Version, PeerMinVersion: wire.MinVersion}, fe)
	require.Equal(t, Queued, hs.Status().State, "the sender never got a request")
	require.NoError(t, hr.Release()) // the id is free again

	hr, err = cur.e.Receive(bg, Spec{ID: 1, Peer: old.tr.Self(), Plan: r.plan, Pool: r.mem})
	require.NoError(t, err)
	waitQuiesced(t, hr, 30*time.Second)
	waitQuiesced(t, hs, 30*time.Second)
	requireState(t, hr, Completed)
	requireState(t, hs, Completed)
	require.Equal(t, s.stream(t), r.stream(t), "every byte")
}
