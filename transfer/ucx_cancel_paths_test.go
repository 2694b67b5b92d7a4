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
				if pc.pool == callerPool {
					ucxhooks.Hooks.AllowSameProcessCMA(dst.tr) // both engines in this process
				}
				s, r := pc.kv(t, src, big, ids, 93), pc.kv(t, dst, big, ids, 0)
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
				if pc.pool == callerPool {
					require.NotZero(t, ucxOf(dst.tr).CMAStats().Gets, "the reads went by process_vm_readv")
				}
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

// ucxCancelPaths are the paths the UCX cancel and frozen-peer tests force, each by its Config
// (and, for a peer process, by the same settings as enginepeer's flags), over shared memory and
// TCP (pull in place and RMA in place map the peer's pool, and CMA reads it with
// process_vm_readv: shared memory only).
var ucxCancelPaths = []ucxPathCase{
	{"staging", func(c *Config) { c.Tuning.DisableDirect, c.Tuning.DisablePull = true, true },
		[]string{"-disable-direct", "-disable-pull"}, goPool, PathStaging, false},
	{"direct", func(c *Config) { c.Tuning.DisableRMA = true }, []string{"-direct", "-disable-rma"}, mappedPool, PathDirect, false},
	{"pull", func(c *Config) {
		c.Tuning.DisableDirect, c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true, true
	}, []string{"-disable-direct", "-rma-where-emulated", "-disable-in-place"}, goPool, PathStaging, false},
	{"pull in place", func(c *Config) { c.Tuning.DisableDirect = true }, []string{"-disable-direct"}, goPool, PathStaging, true},
	{"rma", func(c *Config) { c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true },
		[]string{"-direct", "-rma-where-emulated", "-disable-in-place"}, mappedPool, PathRMA, false},
	{"rma in place", func(c *Config) {}, []string{"-direct"}, mappedPool, PathRMA, true}, // only shared memory maps the peer's pool
	{"cma", func(c *Config) {}, []string{"-caller"}, callerPool, PathRMA, true},          // process_vm_readv of a registered pool
}

// ucxPathCase is one row of ucxCancelPaths.
type ucxPathCase struct {
	name    string
	cfg     func(*Config)
	peer    []string // enginepeer's flags for the same configuration and pool
	pool    poolKind
	want    Path
	shmOnly bool
}

// poolKind is where a test's KV pool lives, which decides the paths it may take.
type poolKind int

const (
	goPool     poolKind = iota // Go memory: staging (and the pull wire) only
	mappedPool                 // the transport's (AllocatePool): the one-copy paths, read in place over shared memory
	callerPool                 // mapped by the test and registered (RegisterHost): the RMA mode, read by process_vm_readv over shared memory
)

// kv is a pool of this case's kind on u's side.
func (pc ucxPathCase) kv(t testing.TB, u *ucxEngine, d layout.Dims, ids []int32, seed uint64) *ucxKV {
	t.Helper()
	switch pc.pool {
	case mappedPool:
		return mappedKV(t, u, d, layout.BlockMajor, ids, seed)
	case callerPool:
		k, _ := callerKV(t, u, d, layout.BlockMajor, ids, seed, "anon")
		return k
	}
	return newUCXKV(t, d, layout.BlockMajor, ids, seed)
}

// TestL10_UCXCancelWhileQueuedOrAdvertisedIsTruthfulOnEveryPath is
// TestCancelInEachStateGivesItsOutcomeAndMemoryRule's queued and advertised phases over real
// UCX, shared memory and TCP, with each path's configuration and pool (ucxCancelPaths): a Send
// whose request has not come (queued), a Receive waiting for the engine's one admission
// (queued) and a Receive whose request went to a sender with no Send yet (advertised: its
// first receives are posted on the staging path). A FreeNow answer finds Done and Quiesced
// closed; any other leaves Quiesced to close within the bound; each ends Cancelled, nothing
// quarantined or poisoned, no slot leased. Then the same two engines move a request on the
// path, every byte checked: the cancelled one left nothing in the transport in its way (its
// tags, a drain, an exposure).
func TestL10_UCXCancelWhileQueuedOrAdvertisedIsTruthfulOnEveryPath(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 16}
	ids := seqBlocks(0, 16)
	phases := []struct {
		name string
		// start returns the handle to cancel and the engine that cancels it; a Receive of
		// another id that holds the receiver's one admission is cancelled afterwards.
		start   func(t *testing.T, pc ucxPathCase, src, dst *ucxEngine) (*ucxEngine, *Handle)
		want    CancelOutcome
		receive bool
	}{
		{"queued sender", func(t *testing.T, pc ucxPathCase, src, dst *ucxEngine) (*ucxEngine, *Handle) {
			k := pc.kv(t, src, dims, ids, 3)
			h, err := src.e.Send(bg, Spec{ID: 51, Peer: dst.tr.Self(), Plan: k.plan, Pool: k.mem})
			require.NoError(t, err)
			require.Equal(t, Queued, h.Status().State)
			return src, h
		}, CancelledBeforeAdvertise, false},
		{"queued receiver", func(t *testing.T, pc ucxPathCase, src, dst *ucxEngine) (*ucxEngine, *Handle) {
			first := pc.kv(t, dst, dims, ids, 0)
			h1, err := dst.e.Receive(bg, Spec{ID: 50, Peer: src.tr.Self(), Plan: first.plan, Pool: first.mem})
			require.NoError(t, err)
			eventually(t, func() bool { return h1.Status().State == Advertised }, "the first receive holds the one admission")
			t.Cleanup(func() { dst.e.Cancel(50) })
			k := pc.kv(t, dst, dims, seqBlocks(0, 16), 0)
			h, err := dst.e.Receive(bg, Spec{ID: 51, Peer: src.tr.Self(), Plan: k.plan, Pool: k.mem})
			require.NoError(t, err)
			require.Equal(t, Queued, h.Status().State)
			return dst, h
		}, CancelledBeforeAdvertise, true},
		{"advertised receiver", func(t *testing.T, pc ucxPathCase, src, dst *ucxEngine) (*ucxEngine, *Handle) {
			k := pc.kv(t, dst, dims, ids, 0)
			h, err := dst.e.Receive(bg, Spec{ID: 51, Peer: src.tr.Self(), Plan: k.plan, Pool: k.mem})
			require.NoError(t, err)
			eventually(t, func() bool { return h.Status().State == Advertised }, "advertised")
			return dst, h
		}, CancelRequestedInFlight, true},
	}
	for _, tr := range ucxTransports {
		for _, pc := range ucxCancelPaths {
			if pc.shmOnly && tr.name != "shm" {
				continue
			}
			for _, ph := range phases {
				t.Run(tr.name+"/"+pc.name+"/"+ph.name, func(t *testing.T) {
					cfg := ucxTestConfig()
					pc.cfg(&cfg)
					cfg.MaxConcurrent, cfg.SlotBytes = 1, 64<<10 // one admission: the queued receiver waits for it
					cfg.Tuning.CancelGrace = 5 * time.Second     // a cancelled receive ends in microseconds; a stranded one outlives 5 s
					sq, rq := &quarantineCounter{}, &quarantineCounter{}
					scfg, rcfg := cfg, cfg
					scfg.Observer, rcfg.Observer = sq, rq
					src, dst := newUCXEngine(t, tr.tls, tr.dev, scfg), newUCXEngine(t, tr.tls, tr.dev, rcfg)
					if pc.pool == callerPool {
						ucxhooks.Hooks.AllowSameProcessCMA(dst.tr) // both engines in this process
					}
					u, h := ph.start(t, pc, src, dst)
					out := u.e.Cancel(51)
					require.Equal(t, ph.want, out, "%+v", h.Status())
					if out.FreeNow() {
						require.True(t, isClosed(h.Done()), "Cancel answered %v with Done open", out)
						require.True(t, isClosed(h.Quiesced()), "Cancel answered %v with Quiesced open", out)
					}
					waitQuiesced(t, h, 20*time.Second)
					st := h.Status()
					require.Equal(t, Cancelled, st.State, "%v", st.Err)
					require.ErrorIs(t, st.Err, ErrCancelled)
					require.False(t, st.BlocksPoisoned)
					require.Equal(t, AlreadyComplete, u.e.Cancel(51))
					if ph.name == "queued receiver" {
						require.Equal(t, CancelRequestedInFlight, dst.e.Cancel(50))
					}
					for _, v := range []*ucxEngine{src, dst} {
						eventually(t, func() bool { return v.e.pool.Stats().Leased == 0 }, "every slot lease ended")
						requireSlotsAccounted(t, v.e)
						require.Zero(t, v.e.pool.Stats().Poisoned, "staging slots poisoned")
					}

					// The path still serves both engines: a new request, every byte.
					s, r := pc.kv(t, src, dims, ids, 59), pc.kv(t, dst, dims, ids, 0)
					hs, hr := startKV(t, src, dst, 52, s, r)
					waitQuiesced(t, hr, 30*time.Second)
					waitQuiesced(t, hs, 30*time.Second)
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
					require.Equal(t, pc.want, hr.Path())
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					if pc.pool == callerPool {
						require.NotZero(t, ucxOf(dst.tr).CMAStats().Gets, "the reads went by process_vm_readv")
					}
					require.Zero(t, sq.n.Load(), "the sender reported a quarantine")
					require.Zero(t, rq.n.Load(), "the receiver reported a quarantine")
				})
			}
		}
	}
}
