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
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// TestL6_UCXEveryOperationCompletesExactlyOnce is TestL6 over the real UCX transport, shared
// memory and TCP, on each path (staging slots, the direct path's IOV messages, its RMA gets):
// transfers that complete, receives cancelled with their operations posted, and transfers
// cancelled while their chunks move. An opLedger under each engine checks
// that every operation posted gets exactly one final completion and nothing after it, and
// each UCX worker's own counters that every request it returned was completed and freed
// once.
func TestL6_UCXEveryOperationCompletesExactlyOnce(t *testing.T) { testL6UCX(t, false) }

// TestL6_UCXSenderEngineClosesMidTransfer adds transfers still under way when the sending
// engine closes.
func TestL6_UCXSenderEngineClosesMidTransfer(t *testing.T) { testL6UCX(t, true) }

func testL6UCX(t *testing.T, closeUnderWay bool) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	paths := []struct {
		name  string
		cfg   func(*Config)
		kinds []string
		path  Path
	}{
		{"staging", func(c *Config) { c.Tuning.DisableDirect, c.Tuning.DisablePull = true, true }, []string{"send", "receive"}, PathStaging},
		{"staging pull", func(c *Config) { c.Tuning.DisableDirect, c.Tuning.RMAWhereEmulated = true, true }, []string{"get", "generation read"}, PathStaging}, // over TCP too
		{"direct IOV messages", func(c *Config) { c.Tuning.DisableRMA = true; c.Tuning.DirectChunkBytes = 64 << 10 }, []string{"IOV send", "IOV receive"}, PathDirect},
		{"RMA gets", func(c *Config) {
			c.Tuning.RMAWhereEmulated = true
			c.Tuning.RMAMinRegionBytes = 1 << 10
			c.Tuning.DirectChunkBytes = 64 << 10
		},
			[]string{"get"}, PathRMA},
	}
	for _, tr := range ucxTransports {
		for _, pc := range paths {
			t.Run(tr.name+"/"+pc.name, func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.SlotBytes = 64 << 10
				cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
				pc.cfg(&cfg)
				src, srcLed := newLedgerUCXEngine(t, tr.tls, tr.dev, cfg)
				dst, dstLed := newLedgerUCXEngine(t, tr.tls, tr.dev, cfg)
				kv := func(u *ucxEngine, o layout.Order, seed uint64) *ucxKV {
					if pc.path == PathRMA {
						o = layout.BlockMajor // gets need ranges contiguous on both sides
					}
					if pc.path == PathStaging { // Go memory: staging whatever the config
						return newUCXKV(t, dims, o, seqBlocks(0, 16), seed)
					}
					return mappedKV(t, u, dims, o, seqBlocks(0, 16), seed)
				}

				// Transfers that complete, every byte checked.
				for i := range 3 {
					s, r := kv(src, layout.BlockMajor, uint64(i+1)), kv(dst, layout.Order(i%3), 0)
					hs, hr := startKV(t, src, dst, RequestID(100+i), s, r)
					waitQuiesced(t, hr, 20*time.Second)
					waitQuiesced(t, hs, 20*time.Second)
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, pc.path, hr.Path())
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
				}
				// Receives cancelled with their operations posted: the sender never comes.
				for i := range 2 {
					r := kv(dst, layout.LayerMajor, 0)
					hr, err := dst.e.Receive(bg, Spec{ID: RequestID(200 + i), Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
					require.NoError(t, err)
					eventually(t, func() bool { return hr.Status().State == Advertised }, "advertised")
					require.Equal(t, CancelRequestedInFlight, dst.e.Cancel(hr.ID()))
					waitQuiesced(t, hr, 20*time.Second)
					requireState(t, hr, Cancelled)
				}
				// Transfers cancelled by the receiver while their chunks move.
				var left []*Handle
				for i := range 3 {
					s, r := kv(src, layout.BlockMajor, uint64(10+i)), kv(dst, layout.LayerMajor, 0)
					hs, hr := startKV(t, src, dst, RequestID(300+i), s, r)
					left = append(left, hs, hr)
					eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, "moving")
					dst.e.Cancel(hr.ID()) // it may have completed already: any outcome will do
				}
				for _, h := range left {
					waitQuiesced(t, h, 20*time.Second)
				}
				if closeUnderWay {
					// Transfers under way when the sending engine closes.
					for i := range 3 {
						s, r := kv(src, layout.BlockMajor, uint64(20+i)), kv(dst, layout.LayerMajor, 0)
						hs, hr := startKV(t, src, dst, RequestID(400+i), s, r)
						left = append(left, hs, hr)
					}
					eventually(t, func() bool { return left[len(left)-1].Status().State != Queued }, "the last transfers started")
				}
				require.NoError(t, src.e.Close())
				for _, h := range left {
					select {
					case <-h.Done():
					case <-time.After(20 * time.Second):
						t.Fatalf("request %d not done after its sender closed: %+v", h.ID(), h.Status())
					}
				}
				require.NoError(t, dst.e.Close())

				posted := map[string]int{}
				for name, l := range map[string]*opLedger{"sender": srcLed, "receiver": dstLed} {
					require.Empty(t, l.check(), name)
					for k, v := range l.posted() {
						posted[k] += v
					}
				}
				for _, k := range pc.kinds {
					require.NotZero(t, posted[k], "no %s posted: %v", k, posted)
				}
				for name, u := range map[string]*ucxEngine{"sender": src, "receiver": dst} {
					for i, w := range ucxWorkers(u.tr) {
						s := w.Stats()
						require.Zero(t, s.Pending, "%s worker %d: %+v", name, i, s)
						if !closeUnderWay {
							require.Zero(t, s.Dropped, "%s worker %d: requests UCX never completed: %+v", name, i, s)
						}
						// Closed under way, UCX 1.13 may keep a request past the forced close
						// until the worker is destroyed (docs/ucx.md, "Abandoned requests").
						require.Equal(t, s.Requests, s.Callbacks+s.Dropped, "%s worker %d: every request completed once: %+v", name, i, s)
						require.Equal(t, s.Callbacks, s.Freed, "%s worker %d: every request freed once: %+v", name, i, s)
					}
				}
				t.Logf("posted %v", posted)
			})
		}
	}
}

// newLedgerUCXEngine is newUCXEngine with an opLedger between the engine and its transport.
func newLedgerUCXEngine(t testing.TB, tls, dev string, cfg Config) (*ucxEngine, *opLedger) {
	t.Helper()
	cfg = cfg.withDefaults()
	if cfg.Tuning.NumSlots == 0 {
		cfg.Tuning.NumSlots = cfg.MaxConcurrent * cfg.Tuning.PipelineDepth
	}
	tr, err := ucx.New(ucx.Config{TLS: tls, NetDevices: dev, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second,
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 3 * time.Second, ServeEmulatedRMA: cfg.Tuning.RMAWhereEmulated})
	require.NoError(t, err)
	cfg.StagingMemory = tr.StagingMemory()
	led := newOpLedger(ucxContract(tr))
	e, err := New(led, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &ucxEngine{tr: tr, e: e}, led
}

// ucxWorkers lists a transport's UCX workers: its own and its lanes'.
func ucxWorkers(tr *ucx.Transport) []*native.Worker {
	return append([]*native.Worker{ucxhooks.Hooks.Worker(tr)}, ucxhooks.Hooks.LaneWorkers(tr)...)
}
