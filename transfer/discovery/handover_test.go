// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package discovery

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/internal/paramhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// handoverEngine is an engine over a UCX transport on TCP loopback.
func handoverEngine(t *testing.T) (*transfer.Engine, *ucx.Transport) {
	t.Helper()
	cfg := transfer.Config{
		SlotBytes:       64 << 10,
		MaxConcurrent:   2,
		TransferTimeout: 10 * time.Second,
		QueueTimeout:    10 * time.Second,
		CloseTimeout:    5 * time.Second,
		Tuning:          tuning.Config{PipelineDepth: 2, NumSlots: 4},
	}
	tr, err := ucx.New(ucx.Config{TLS: "tcp,self", NetDevices: "lo", StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second})
	if err != nil {
		t.Skipf("no UCX here: %v", err)
	}
	cfg.StagingMemory = tr.StagingMemory()
	e, err := transfer.New(tr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, tr
}

func handoverKV(t *testing.T, seed byte) ([]byte, *layout.Plan) {
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 16, ElemSize: 2, TokensPerBlock: 8, NumBlocks: 8}, layout.BlockMajor)
	mem := make([]byte, l.SpanBytes())
	for i := range mem {
		mem[i] = seed * byte(i)
	}
	p, err := layout.NewPlan(l, l.All(), []int32{1, 3, 5})
	require.NoError(t, err)
	return mem, p
}

// TestHandover_ExposedRequestReachesTheDecodeThatTakesIt: a prefill exposes a request and
// hands its params under the serving engine's key (Hand); a decode that asked first waits for
// them (Take, bounded by its context), receives with them alone, naming nobody but what the
// params say, and gets every byte. Once the exposure is done the handover is withdrawn, and
// a Take of it then ends with ctx, not found.
func TestHandover_ExposedRequestReachesTheDecodeThatTakesIt(t *testing.T) {
	srv := serveRegistry(t)
	const key = "cmpl-42.a_b"
	prefillReg := openHTTP(t, srv.URL(), Config{TTL: 2 * time.Second})
	decodeReg := openHTTP(t, srv.URL(), Config{TTL: 2 * time.Second})
	prefill, _ := handoverEngine(t)
	decode, _ := handoverEngine(t)

	taken := make(chan *ucx.ContextParams, 1)
	takeErr := make(chan error, 1)
	go func() { // the decode asks before the prefill has handed anything
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cp, err := Take(ctx, decodeReg, key)
		taken <- cp
		takeErr <- err
	}()

	smem, splan := handoverKV(t, 7)
	hs, params, err := prefill.Expose(t.Context(), transfer.Spec{ID: 9, Plan: splan, Pool: smem})
	require.NoError(t, err)
	require.NoError(t, Hand(t.Context(), prefillReg, key, params, hs.Done()))
	require.NoError(t, <-takeErr)
	cp := <-taken
	require.True(t, paramhooks.Hooks.Anonymous(cp), "the params name no receiver")
	want, err := params.MarshalBinary()
	require.NoError(t, err)
	got, err := cp.MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, want, got, "the params as handed")

	dmem, dplan := handoverKV(t, 0)
	hr, err := decode.Receive(t.Context(), transfer.Spec{ID: cp.RequestID, Peer: ucx.PeerFromAddress(cp.WorkerAddress), Secret: cp.Secret, Plan: dplan, Pool: dmem})
	require.NoError(t, err)
	for _, h := range []*transfer.Handle{hr, hs} {
		select {
		case <-h.Quiesced():
		case <-time.After(20 * time.Second):
			t.Fatalf("request %d not quiesced: %+v", h.ID(), h.Status())
		}
		require.Equal(t, transfer.Completed, h.Status().State, "%v", h.Status().Err)
	}
	sb, db := make([]byte, splan.Bytes()), make([]byte, dplan.Bytes())
	require.NoError(t, layouttest.ReferenceGather(splan, smem, sb))
	require.NoError(t, layouttest.ReferenceGather(dplan, dmem, db))
	require.True(t, bytes.Equal(sb, db), "every byte")

	require.Eventually(t, func() bool {
		_, err := decodeReg.Lookup(t.Context(), "handover."+key)
		return errors.Is(err, ErrNotFound)
	}, 10*time.Second, 10*time.Millisecond, "the handover withdrawn once the exposure is done")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = Take(ctx, decodeReg, key)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestHandover_RefusesWhatIsNoHandover: a key the registry cannot name, and a worker's own
// entry under a handover's name, are refused with ErrInvalid.
func TestHandover_RefusesWhatIsNoHandover(t *testing.T) {
	srv := serveRegistry(t)
	r := openHTTP(t, srv.URL(), Config{})
	_, err := Take(t.Context(), r, "a key/with a slash")
	require.ErrorIs(t, err, ErrInvalid)
	_, err = r.Publish(t.Context(), worker("handover.k1", "prefill", 3))
	require.NoError(t, err)
	_, err = Take(t.Context(), r, "k1")
	require.ErrorIs(t, err, ErrInvalid)
}
