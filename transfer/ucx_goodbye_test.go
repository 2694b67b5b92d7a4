// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
)

// goodbyePaths are the paths a graceful departure must leave clean on the survivor, with
// the configuration that puts a transfer on each (as testL6UCX picks them).
var goodbyePaths = []struct {
	name    string
	cfg     func(*Config)
	path    Path
	shmOnly bool // the path exists only where the transport maps a peer's memory
	pool    poolKind
}{
	{"staging", func(c *Config) { c.Tuning.DisableDirect, c.Tuning.DisablePull = true, true }, PathStaging, false, goPool},
	{"staging pull", func(c *Config) {
		c.Tuning.DisableDirect, c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true, true
	}, PathStaging, false, goPool},
	// The receiver reads the sender's slots where UCX maps them (shared memory only).
	{"staging pull in place", func(c *Config) { c.Tuning.DisableDirect = true }, PathStaging, true, goPool},
	{"direct IOV messages", func(c *Config) { c.Tuning.DisableRMA = true; c.Tuning.DirectChunkBytes = 256 << 10 }, PathDirect, false, mappedPool},
	{"RMA gets", func(c *Config) {
		c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true
		c.Tuning.RMAMinRegionBytes, c.Tuning.DirectChunkBytes = 1<<10, 256<<10
	}, PathRMA, false, mappedPool},
	{"RMA read in place", func(c *Config) {
		c.Tuning.RMAMinRegionBytes, c.Tuning.InPlaceMinRegionBytes, c.Tuning.DirectChunkBytes = 1<<10, 1<<10, 256<<10
	}, PathRMA, true, mappedPool},
	// process_vm_readv of a pool the test mapped and registered (RegisterHost).
	{"CMA", func(c *Config) {
		c.Tuning.RMAMinRegionBytes, c.Tuning.DirectChunkBytes = 1<<10, 256<<10
	}, PathRMA, true, callerPool},
}

// TestL9_UCXGracefulPeerLeavesNothingPoisoned: a peer that leaves gracefully (Drain, then
// Close, as a rolling restart does) with transfers in flight to or from this engine leaves
// nothing poisoned here: its goodbye says which of its transfers ended with their operations
// quiescent, so the survivor's handles end, quiesce, and keep no slot or block out of
// circulation. Over UCX shared memory and TCP, on every path, with the survivor sending and
// receiving.
func TestL9_UCXGracefulPeerLeavesNothingPoisoned(t *testing.T) {
	dims := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 24}
	for _, tr := range ucxTransports {
		for _, pc := range goodbyePaths {
			if pc.shmOnly && tr.name != "shm" {
				continue
			}
			for _, survivorSends := range []bool{true, false} {
				role := "survivor receives"
				if survivorSends {
					role = "survivor sends"
				}
				t.Run(tr.name+"/"+pc.name+"/"+role, func(t *testing.T) {
					if tr.name == "tcp" && (pc.path == PathRMA || pc.name == "staging pull") {
						// Gets over TCP are UCX's emulation (RMAWhereEmulated): UCX 1.13 may abort the
						// whole test process (uct_tcp_ep_pending_purge: stubs.c Assertion `0') when an
						// engine closes under emulated gets it serves or whose replies are pending, as
						// TestL1_UCXCloseWithTransfersInFlightOnEveryPath and the killed-peer test skip.
						// A UCX defect, not the goodbye's; shared memory covers these paths.
						t.Skip("UCX 1.13 may abort the process when an engine closes under emulated gets over TCP")
					}
					cfg := ucxTestConfig()
					cfg.SlotBytes = 256 << 10
					cfg.TransferTimeout = 60 * time.Second          // the departure, not a deadline, ends them
					cfg.Tuning.QuarantineTimeout = 15 * time.Second // a net for verdicts late under load, not what is tested
					pc.cfg(&cfg)
					cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
					survivor := newUCXEngine(t, tr.tls, tr.dev, cfg)
					// The leaving engine's transfers never stop within its grace, as on a loaded
					// host: its Close closes their connections before the goodbye
					// (settleBeforeGoodbye), and must still say it.
					lcfg := cfg
					lcfg.Tuning.CancelGrace = time.Microsecond
					leaving := newUCXEngine(t, tr.tls, tr.dev, lcfg)
					src, dst := leaving, survivor
					if survivorSends {
						src, dst = survivor, leaving
					}
					if pc.pool == callerPool {
						ucxhooks.Hooks.AllowSameProcessCMA(dst.tr) // both engines in this process
					}
					kv := func(u *ucxEngine, seed uint64) *ucxKV {
						return ucxPathCase{pool: pc.pool}.kv(t, u, dims, seqBlocks(0, 24), seed)
					}
					var mine []*Handle // the survivor's
					for i := range 4 {
						hs, hr := startKV(t, src, dst, RequestID(900+i), kv(src, uint64(i+1)), kv(dst, 0))
						if survivorSends {
							mine = append(mine, hs)
						} else {
							mine = append(mine, hr)
						}
					}
					eventually(t, func() bool { return mine[0].Status().Bytes > 0 }, "bytes moving")
					require.Equal(t, pc.path, mine[0].Path())

					// A rolling restart: drain briefly, then close.
					ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
					_ = leaving.e.Drain(ctx)
					cancel()
					require.NoError(t, leaving.e.Close())

					inFlight := 0
					for _, h := range mine {
						select {
						case <-h.Quiesced():
						case <-time.After(cfg.Tuning.QuarantineTimeout + 20*time.Second):
						}
						st := h.Status()
						if st.State != Completed {
							inFlight++
						}
						t.Logf("request %d: %v, %d of %d bytes, blocks poisoned %v (%v)", h.ID(), st.State, st.Bytes, st.Total, st.BlocksPoisoned, st.Err)
						require.False(t, st.BlocksPoisoned, "request %d: %v", h.ID(), st.Err)
						require.True(t, isClosed(h.Quiesced()), "request %d not quiesced: %+v", h.ID(), st)
					}
					if inFlight == 0 {
						t.Skip("every transfer completed before the peer left: nothing to check (reads in place move 192 MiB in a few ms)")
					}
					if pc.pool == callerPool {
						require.NotZero(t, ucxOf(dst.tr).CMAStats().Gets, "the reads went by process_vm_readv")
					}
					ps := survivor.e.pool.Stats()
					require.Zero(t, ps.Poisoned, "slots poisoned: %+v", ps)
					require.Zero(t, ps.Leased, "slots leased: %+v", ps)
					hl := survivor.e.Health()
					require.Zero(t, hl.Numbers.PoisonedBlocks)
				})
			}
		}
	}
}

// TestL9_UCXPeerProcessLeavingLeavesNothingPoisoned is the rolling restart with the peer in
// its own process: it gets SIGTERM mid-transfer, drains briefly, closes (saying goodbye) and
// exits. This engine's handle ends and quiesces with nothing poisoned, over shared memory and
// TCP, on the staging, direct IOV and RMA paths, this engine sending and receiving.
func TestL9_UCXPeerProcessLeavingLeavesNothingPoisoned(t *testing.T) {
	const blocks = 128 // 256 MiB: far more than moves before the signal
	bin := peerproc.BuildEnginePeer(t)
	paths := []struct {
		name      string
		peerFlags []string      // the peer's, for when it receives (it picks the path)
		cfg       func(*Config) // ours, for when we receive
		mapped    bool
	}{
		{"staging", nil, func(c *Config) { c.Tuning.DisableDirect = true }, false},
		{"direct IOV messages", []string{"-direct", "-disable-rma"}, func(c *Config) { c.Tuning.DisableRMA = true }, true},
		{"RMA gets", []string{"-direct", "-rma-where-emulated"}, func(c *Config) { c.Tuning.RMAWhereEmulated, c.Tuning.DisableInPlaceReads = true, true }, true},
	}
	for _, tr := range ucxTransports {
		for _, pc := range paths {
			for _, survivorSends := range []bool{true, false} {
				role, mode := "survivor receives", "engine-send"
				if survivorSends {
					role, mode = "survivor sends", "engine-recv"
				}
				t.Run(tr.name+"/"+pc.name+"/"+role, func(t *testing.T) {
					if tr.name == "tcp" && pc.name == "RMA gets" && survivorSends {
						t.Skip("skipped for a defect it found (not the goodbye's: it happens with no goodbye sent): UCX 1.13 aborts this process " +
							"(uct_tcp_ep_pending_purge: stubs.c:102 Assertion `0' failed) in about 1 run in 10 when a peer whose gets over TCP " +
							"this worker emulates closes while replies to them are pending")
					}
					cfg := ucxPeerTestConfig()
					cfg.TransferTimeout = 60 * time.Second // the departure, not a deadline, ends it
					pc.cfg(&cfg)
					cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
					local := newUCXEngine(t, tr.tls, tr.dev, cfg)
					args := append(ucxPeerArgs(tr.tls, tr.dev, mode, blocks, 41, 120*time.Second), pc.peerFlags...)
					peer := peerproc.Start(t, bin, args...)
					peer.Connect(t, string(local.tr.Self()))
					pool, plan := ucxEnginePool(t, blocks, 5, survivorSends)
					if pc.mapped {
						m, err := local.tr.AllocatePool(int64(len(pool)))
						require.NoError(t, err)
						copy(m, pool)
						pool = m
					}
					spec := Spec{ID: 41, Peer: Peer(peer.Addr), Plan: plan, Pool: pool}
					var h *Handle
					var err error
					if survivorSends {
						h, err = local.e.Send(bg, spec)
					} else {
						h, err = local.e.Receive(bg, spec)
					}
					require.NoError(t, err)
					if survivorSends {
						peer.WaitGot(t, 1, 60*time.Second) // bytes are landing in the peer (an RMA sender sees none until Done)
					} else {
						eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, "bytes moving")
					}
					peer.Signal(t, syscall.SIGTERM)
					peer.Expect(t, "LEFT", 30*time.Second)
					select {
					case <-h.Quiesced():
					case <-time.After(cfg.Tuning.QuarantineTimeout + 20*time.Second):
					}
					st := h.Status()
					t.Logf("%v, %d of %d bytes, path %v, blocks poisoned %v (%v)", st.State, st.Bytes, st.Total, h.Path(), st.BlocksPoisoned, st.Err)
					if st.State == Completed {
						t.Skip("the transfer completed before the peer left: nothing to check (RMA gets over shared memory move 256 MiB in a few ms)")
					}
					require.False(t, st.BlocksPoisoned, "%v", st.Err)
					require.True(t, isClosed(h.Quiesced()), "not quiesced: %+v", st)
					ps := local.e.pool.Stats()
					require.Zero(t, ps.Poisoned, "slots poisoned: %+v", ps)
					require.Zero(t, ps.Leased, "slots leased: %+v", ps)
					require.Zero(t, local.e.Health().Numbers.PoisonedBlocks)
				})
			}
		}
	}
}
