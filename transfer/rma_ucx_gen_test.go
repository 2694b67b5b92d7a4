// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
)

// The validated-read rule over UCX, shared memory and TCP, with the sender's pool in caller
// memory: the receiver is stopped mid-read (its worker's thread held, so no get progresses),
// the sender hears a false report that the receiver is lost, ends the exposure, quiesces and
// reuses its blocks; then the receiver goes on, reads changed blocks and the changed
// generation word, and fails with ErrStaleRead instead of completing.
func TestUCXRMA_SenderReusesBlocksMidReadFailsTheReceiver(t *testing.T) {
	dims := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
	ids := seqBlocks(0, 128) // 256 MiB in 1 MiB gets
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.Tuning.DirectChunkBytes = 1 << 20
			cfg.TransferTimeout = 60 * time.Second
			cfg.Tuning.RMAWhereEmulated = true // the RMA mode itself, over TCP too
			src := newUCXEngine(t, tr.tls, tr.dev, cfg)
			dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
			s, _ := callerKV(t, src, dims, layout.BlockMajor, ids, 21, "anon")
			var hs, hr *Handle
			release := make(chan struct{})
			held := make(chan error, 1)
			for attempt := 0; ; attempt++ {
				require.Less(t, attempt, 5, "the receiver finished before it could be stopped mid-read, five times")
				r := mappedKV(t, dst, dims, layout.BlockMajor, ids, 0)
				hs, hr = startKV(t, src, dst, RequestID(1600+attempt), s, r)
				require.Eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, 20*time.Second, 20*time.Microsecond)
				entered := make(chan struct{})
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					held <- ucxhooks.Hooks.Worker(dst.tr).RunOnThread(ctx, func() {
						close(entered)
						select { // holds the receiver's worker: no get progresses meanwhile
						case <-release:
						case <-time.After(20 * time.Second):
						}
					})
				}()
				<-entered
				if !isClosed(hr.Done()) && hr.Status().Bytes < hr.Status().Total {
					break // stopped mid-read
				}
				close(release)
				require.NoError(t, <-held)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				release = make(chan struct{})
			}
			t.Logf("receiver stopped after %d of %d bytes", hr.Status().Bytes, hr.Status().Total)
			// The false alarm, as the sender's transport would report a keepalive timeout.
			ucxhooks.Hooks.InjectPeerLost(src.tr, dst.tr.Self(), fmt.Errorf("%w: false alarm", ErrPeerLost))
			waitQuiesced(t, hs, 20*time.Second)
			require.Equal(t, Failed, hs.Status().State, "%v", hs.Status().Err)
			flipEveryByte(s.mem) // the caller reuses its blocks, as Quiesced allows
			close(release)
			require.NoError(t, <-held)
			waitQuiesced(t, hr, 30*time.Second)
			require.Equal(t, Failed, hr.Status().State, "%v", hr.Status().Err)
			require.ErrorIs(t, hr.Status().Err, ErrStaleRead)
		})
	}
}
