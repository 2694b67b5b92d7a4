// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// A sender over UCX shared memory whose RMA offer names more memory than its key's segment
// has (a 1 MiB pool offered as 8 MiB, its ranges past the first MiB) fails the receiver with
// ErrProtocol (native.ErrOutOfBounds): nothing is read past the segment, by a copy in place
// or by a get, and nothing is written into the receiver's blocks. Over posix and sysv, in
// place and by gets.
func TestUCXRMA_AnOfferPastTheSendersSegmentIsRefused(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tc := range []struct {
		name, tls string
		gets      bool
	}{
		{"posix/in place", "posix,cma,self", false},
		{"posix/gets", "posix,cma,self", true},
		{"sysv/in place", "sysv,cma,self", false},
		{"sysv/gets", "sysv,cma,self", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.Tuning.RMAMinRegionBytes, cfg.Tuning.DisableInPlaceReads = 64<<10, tc.gets
			dst, dc := newCountingUCXEngine(t, tc.tls, cfg)
			evil, err := ucx.New(ucx.Config{TLS: tc.tls, KeepaliveInterval: 200 * time.Millisecond, StagingBytes: 1 << 20, CloseTimeout: 2 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, evil.Close(true)) })
			pool, err := evil.AllocatePool(1 << 20)
			require.NoError(t, err)
			addr, key, err := ucxOf(evil).RMAKey(pool)
			require.NoError(t, err)
			claimed := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(40, 8), 0) // blocks 40..47: past the first MiB
			require.NoError(t, ucxContract(evil).Bind(fakeRMASender{tr: ucxContract(evil), offer: func(ri *wire.RequestInfo) []*wire.RMAOffer {
				return []*wire.RMAOffer{{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce},
					Addr: addr, PoolBytes: int64(len(claimed.mem)), Layout: claimed.plan.Layout(), Selection: claimed.plan.Selection(),
					Blocks: append([]int32(nil), claimed.plan.Blocks()...), Key: key}}
			}}))
			r := mappedKV(t, dst, dims, layout.BlockMajor, seqBlocks(0, 8), 0)
			hr, err := dst.e.Receive(bg, Spec{ID: 1, Peer: evil.Self(), Plan: r.plan, Pool: r.mem})
			require.NoError(t, err)
			waitQuiesced(t, hr, 20*time.Second)
			st := hr.Status()
			require.Equal(t, Failed, st.State, "%v", st.Err)
			require.ErrorIs(t, st.Err, ErrProtocol)
			require.ErrorIs(t, st.Err, native.ErrOutOfBounds)
			require.Equal(t, PathRMA, hr.Path())
			require.Zero(t, dc.maps.Load(), "no view of the offered pool")
			require.True(t, bytes.Equal(make([]byte, len(r.mem)), r.mem), "nothing written")
		})
	}
}
