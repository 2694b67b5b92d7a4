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

// TestL10_UCXSendersCancelIsTruthfulOnEveryPath is TestL10_CancelOutcomeIsTruthfulOnEveryPath's
// in-flight phase over real UCX, shared memory and TCP, from the side the UCX tests did not
// cancel from: the sender cancels a 256 MiB transfer while its bytes move (the receiver's cancel
// is TestL3_UCXReceiversCancelIsACleanCancelForTheSender). A FreeNow answer finds Done and
// Quiesced closed; any other leaves the caller to wait for Quiesced, which closes within the
// bound: the sender's operations (or the receiver's reads of its pool) end known, so nothing is
// poisoned. The receiver ends too, Completed only with every byte.
func TestL10_UCXSendersCancelIsTruthfulOnEveryPath(t *testing.T) {
	big := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
	for _, tr := range ucxTransports {
		for _, pc := range ucxCancelPaths {
			if pc.shmOnly && tr.name != "shm" {
				continue
			}
			t.Run(tr.name+"/"+pc.name, func(t *testing.T) {
				cfg := ucxTestConfig()
				pc.cfg(&cfg)
				cfg.Tuning.CancelGrace = 5 * time.Second // 50 ms is short on a loaded box; a stranded op outlives 5 s
				src, dst := newUCXEngine(t, tr.tls, tr.dev, cfg), newUCXEngine(t, tr.tls, tr.dev, cfg)
				ids := seqBlocks(0, 128)
				s, r := newUCXKV(t, big, layout.BlockMajor, ids, 93), newUCXKV(t, big, layout.BlockMajor, ids, 0)
				if pc.mapped {
					s, r = mappedKV(t, src, big, layout.BlockMajor, ids, 93), mappedKV(t, dst, big, layout.BlockMajor, ids, 0)
				}
				hs, hr := startKV(t, src, dst, 97, s, r)
				require.Eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, 30*time.Second, 50*time.Microsecond)
				out := src.e.Cancel(97)
				if out.FreeNow() {
					require.True(t, isClosed(hs.Done()), "Cancel answered %v with Done open", out)
					require.True(t, isClosed(hs.Quiesced()), "Cancel answered %v with Quiesced open", out)
				}
				t.Logf("cancel after %d bytes: %v", hr.Status().Bytes, out)
				waitQuiesced(t, hs, 20*time.Second)
				waitQuiesced(t, hr, 20*time.Second)
				require.Equal(t, pc.want, hr.Path())
				if hr.Status().State == Completed { // the receiver had every byte before the cancel reached it
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
				}
				if out == AlreadyComplete {
					require.Equal(t, Completed, hs.Status().State)
				} else {
					require.Contains(t, []CancelOutcome{CancelRequestedInFlight, BackendUnhealthy}, out)
					require.Equal(t, Cancelled, hs.Status().State, "%v", hs.Status().Err)
					require.ErrorIs(t, hs.Status().Err, ErrCancelled)
				}
				require.True(t, hr.Status().State.Terminal(), "%+v", hr.Status())
				require.False(t, hs.Status().BlocksPoisoned)
				require.False(t, hr.Status().BlocksPoisoned)
				for _, u := range []*ucxEngine{src, dst} {
					eventually(t, func() bool { return u.e.pool.Stats().Leased == 0 }, "every slot lease ended")
					requireSlotsAccounted(t, u.e)
					require.Zero(t, u.e.pool.Stats().Poisoned, "staging slots poisoned")
				}
			})
		}
	}
}

// ucxCancelPaths are the paths the UCX cancel tests force, each by its Config, over shared
// memory and TCP (pull in place and RMA in place map the peer's pool: shared memory only).
var ucxCancelPaths = []struct {
	name    string
	cfg     func(*Config)
	mapped  bool // the pools are the transport's (AllocatePool): the one-copy paths may run
	want    Path
	shmOnly bool
}{
	{"staging", func(c *Config) { c.Tuning.DisableDirect, c.Tuning.DisablePull = true, true }, false, PathStaging, false},
	{"direct", func(c *Config) { c.Tuning.DisableRMA = true }, true, PathDirect, false},
	{"pull", func(c *Config) {
		c.Tuning.DisableDirect, c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true, true
	}, false, PathStaging, false},
	{"pull in place", func(c *Config) { c.Tuning.DisableDirect = true }, false, PathStaging, true},
	{"rma", func(c *Config) { c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true }, true, PathRMA, false},
	{"rma in place", func(c *Config) {}, true, PathRMA, true}, // only shared memory maps the peer's pool
}
