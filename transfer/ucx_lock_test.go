// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
)

// TestUCXTransport_UnpackHoldsNoLock: a receiver unpacks the sender's remote keys when it
// accepts an RMA offer, a round trip to each lane's worker. While one is under way the
// transport's lock is free: a control message to another peer goes, and the transfer
// completes once the unpack does.
func TestUCXTransport_UnpackHoldsNoLock(t *testing.T) {
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 16}
	cfg := ucxTestConfig()
	cfg.Tuning.RMAMinRegionBytes = 4 << 10
	src := newUCXEngine(t, "posix,cma,self", "", cfg)
	dst := newUCXEngine(t, "posix,cma,self", "", cfg)
	other := newUCXEngine(t, "posix,cma,self", "", cfg)
	require.NoError(t, ucxContract(dst.tr).SendControl(other.tr.Self(), []byte("reach other first")))

	inUnpack, letGo := make(chan struct{}), make(chan struct{})
	var once bool
	ucxhooks.Hooks.SetBeforeUnpack(dst.tr, func() {
		if !once {
			once = true
			close(inUnpack)
			<-letGo
		}
	})
	ids := seqBlocks(0, 8)
	s := mappedKV(t, src, dims, layout.BlockMajor, ids, 3)
	r := mappedKV(t, dst, dims, layout.BlockMajor, ids, 0)
	hs, hr := startKV(t, src, dst, 930, s, r)
	select {
	case <-inUnpack:
	case <-time.After(20 * time.Second):
		t.Fatal("the receiver never unpacked the sender's key")
	}
	sent := make(chan error, 1)
	go func() { sent <- ucxContract(dst.tr).SendControl(other.tr.Self(), []byte("meanwhile")) }()
	select {
	case err := <-sent:
		require.NoError(t, err)
	case <-time.After(10 * time.Second): // a bound on something that must happen
		close(letGo)
		t.Fatal("the transport's lock was held across a key's unpack")
	}
	close(letGo)
	waitQuiesced(t, hr, 20*time.Second)
	waitQuiesced(t, hs, 20*time.Second)
	require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
	require.Equal(t, PathRMA, hr.Path())
	require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
}
