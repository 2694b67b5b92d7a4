// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// TestL3_ReceiversCancelIsACleanCancelForTheSenderOnEveryPath over real UCX, shared memory
// and TCP, on the paths where the receiver reads the sender's memory (the pull wire, the RMA
// mode with gets and in place): the receiver cancels a 256 MiB transfer while its bytes move.
// Its abort goes once its reads ended, so the sender ends Cancelled with no quarantine (over
// the RMA mode it used to log "transfer quarantined" and count one in
// kvxfer_quarantines_total, its handle Quarantined with 0 bytes). Staging and the direct
// path's IOV messages are left out here: there the sender's own sends must drain through UCX
// after the receiver's cancel, which outlasted even a 1 s sender grace in some loaded runs
// (shm staging, tcp direct); the mem table holds them.
func TestL3_UCXReceiversCancelIsACleanCancelForTheSender(t *testing.T) {
	big := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
	paths := []struct {
		name    string
		cfg     func(*Config)
		mapped  bool // the pools are the transport's (AllocatePool): the one-copy paths may run
		want    Path
		shmOnly bool
	}{
		{"pull", func(c *Config) { c.DisableDirect, c.RMAWhereEmulated, c.DisableInPlaceReads = true, true, true }, false, PathStaging, false},
		{"rma", func(c *Config) { c.RMAWhereEmulated, c.DisableInPlaceReads = true, true }, true, PathRMA, false},
		{"rma in place", func(c *Config) {}, true, PathRMA, true}, // only shared memory maps the peer's pool
	}
	for _, tr := range ucxTransports {
		for _, pc := range paths {
			if pc.shmOnly && tr.name != "shm" {
				continue
			}
			t.Run(tr.name+"/"+pc.name, func(t *testing.T) {
				scfg, rcfg := ucxTestConfig(), ucxTestConfig()
				pc.cfg(&scfg)
				pc.cfg(&rcfg)
				rcfg.CancelGrace = 5 * time.Second // the receiver's operations end within it; the sender keeps the default
				sq, rq := &quarantineCounter{}, &quarantineCounter{}
				scfg.Observer, rcfg.Observer = sq, rq
				src, dst := newUCXEngine(t, tr.tls, tr.dev, scfg), newUCXEngine(t, tr.tls, tr.dev, rcfg)
				ids := seqBlocks(0, 128)
				s, r := newUCXKV(t, big, layout.BlockMajor, ids, 91), newUCXKV(t, big, layout.BlockMajor, ids, 0)
				if pc.mapped {
					s, r = mappedKV(t, src, big, layout.BlockMajor, ids, 91), mappedKV(t, dst, big, layout.BlockMajor, ids, 0)
				}
				hs, hr := startKV(t, src, dst, 95, s, r)
				require.Eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, 30*time.Second, 50*time.Microsecond)
				out := dst.e.Cancel(95)
				t.Logf("cancel after %d bytes: %v", hr.Status().Bytes, out)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, pc.want, hr.Path())
				require.Zero(t, sq.n.Load(), "the sender reported a quarantine: %v", hs.Status().Err)
				if out == AlreadyComplete { // 256 MiB at memory speed can beat the cancel
					require.Equal(t, Completed, hr.Status().State)
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					return
				}
				require.Contains(t, []CancelOutcome{CancelRequestedInFlight, BackendUnhealthy}, out)
				require.Equal(t, Cancelled, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, Cancelled, hs.Status().State, "%v", hs.Status().Err)
				require.ErrorIs(t, hs.Status().Err, ErrPeerAborted)
				require.Zero(t, rq.n.Load(), "the receiver reported a quarantine: %v", hr.Status().Err)
				require.False(t, hr.Status().BlocksPoisoned)
				require.False(t, hs.Status().BlocksPoisoned)
			})
		}
	}
}
