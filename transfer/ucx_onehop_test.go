// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/paramhooks"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// oneHopPair is an exposure over UCX and the params its receiver decodes from the blob, as a
// control plane would carry them; the receiver's pool is its own, every block of it zero.
type oneHopPair struct {
	src, dst *ucxEngine
	s, r     *ucxKV
	hs       *Handle
	cp       *ucx.ContextParams
}

func newOneHopPair(t *testing.T, tls, dev string, id RequestID, cfg Config) *oneHopPair {
	t.Helper()
	cfg.Tuning.RMAWhereEmulated = true // gets over TCP too
	cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
	src := newUCXEngine(t, tls, dev, cfg)
	dst := newUCXEngine(t, tls, dev, cfg)
	s := mappedKV(t, src, ucxExposeDims, layout.BlockMajor, seqBlocks(3, 24), 7)
	r := mappedKV(t, dst, ucxExposeDims, layout.BlockMajor, seqBlocks(30, 24), 0)
	hs, p, err := src.e.Expose(bg, Spec{ID: id, Plan: s.plan, Pool: s.mem})
	require.NoError(t, err)
	blob, err := p.MarshalBinary()
	require.NoError(t, err)
	cp, err := ucx.UnmarshalContextParams(blob)
	require.NoError(t, err)
	return &oneHopPair{src: src, dst: dst, s: s, r: r, hs: hs, cp: cp}
}

// receive starts the decode's Receive with the params (Spec.Params), as a one-hop reader.
func (p *oneHopPair) receive(t *testing.T) *Handle {
	t.Helper()
	hr, err := p.dst.e.Receive(bg, Spec{ID: p.cp.RequestID, Peer: ucx.PeerFromAddress(p.cp.WorkerAddress), Plan: p.r.plan, Pool: p.r.mem,
		Secret: p.cp.Secret, Params: p.cp})
	require.NoError(t, err)
	return hr
}

// oneHopUsed reports whether hr's receive read the params' exposure (no offer asked for).
func oneHopUsed(hr *Handle) bool {
	r, ok := hr.subs[0].path.(*rmaReceive)
	return ok && r.oneHop
}

// TestL10_UCXOneHopRead: over UCX shared memory and TCP, an exposure whose pool the transport
// registered carries the Exposure section in its params, and a Receive given them reads every
// byte with gets at once (no offer asked for); a read that a changed generation makes stale,
// an exposure cancelled before its read, and forged section fields (a region that does not
// hold the reads, a remote key this UCX never packed) all fail the Receive, never complete
// it, with the sender's blocks quiescent (L10) and the forgeries counted as protocol
// refusals.
func TestL10_UCXOneHopRead(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			t.Run("completes every byte", func(t *testing.T) {
				p := newOneHopPair(t, tr.tls, tr.dev, 71, ucxTestConfig())
				require.NotNil(t, paramhooks.Hooks.Exposure(p.cp), "the params carry the section")
				hr := p.receive(t)
				waitQuiesced(t, hr, 30*time.Second)
				waitQuiesced(t, p.hs, 30*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, Completed, p.hs.Status().State, "%v", p.hs.Status().Err)
				require.True(t, bytes.Equal(p.s.stream(t), p.r.stream(t)), "every byte")
				require.True(t, oneHopUsed(hr), "read from the params, no offer asked for")
				require.Equal(t, PathRMA, p.hs.Path())
				if tr.name == "shm" {
					// The word lies in memory mapped here: the loop read it, no operation
					// and no report through the transport's goroutine (rma_gen.go).
					require.Nil(t, hr.subs[0].path.(*rmaReceive).genRec, "the generation word read with an operation")
					// Read in place, shared with the movers where there are lanes: one was
					// readied as the Receive started (moverPool.standby); every copy's event
					// came back.
					if p.dst.e.tr.(transport.RMALanes).GetLanes() > 1 {
						// Counted, not standbyUntil: the first copy a worker takes ends the
						// window. Read under the lock, asserted after it: a failed assertion
						// must not leave the pool locked for Engine.Close's fence.
						m := p.dst.e.movers
						m.mu.Lock()
						standbys := m.standbys
						m.mu.Unlock()
						require.NotZero(t, standbys, "no mover readied for the copy")
					}
					require.Zero(t, hr.subs[0].moving)
				}
			})
			t.Run("without the switch: the offer's round trip", func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.noOneHop = true
				p := newOneHopPair(t, tr.tls, tr.dev, 72, cfg)
				require.Nil(t, paramhooks.Hooks.Exposure(p.cp))
				hr := p.receive(t)
				waitQuiesced(t, hr, 30*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.False(t, oneHopUsed(hr))
				require.True(t, bytes.Equal(p.s.stream(t), p.r.stream(t)), "every byte")
			})
			t.Run("a stale generation is refused", func(t *testing.T) {
				p := newOneHopPair(t, tr.tls, tr.dev, 73, ucxTestConfig())
				paramhooks.Hooks.Exposure(p.cp).Generation++ // not what the word holds: as if the sender had let go
				hr := p.receive(t)
				waitQuiesced(t, hr, 30*time.Second)
				require.Equal(t, Failed, hr.Status().State)
				require.ErrorIs(t, hr.Status().Err, ErrStaleRead)
				waitQuiesced(t, p.hs, 30*time.Second)
				require.NotEqual(t, Completed, p.hs.Status().State, "the sender does not report a read that was refused")
			})
			t.Run("an exposure cancelled before the read", func(t *testing.T) {
				p := newOneHopPair(t, tr.tls, tr.dev, 74, ucxTestConfig())
				require.Equal(t, CancelledBeforeAdvertise, p.src.e.Cancel(p.hs.ID()), "FreeNow: the word ended first")
				hr := p.receive(t)
				waitQuiesced(t, hr, 30*time.Second)
				require.Equal(t, Failed, hr.Status().State, "never completed from blocks the sender let go")
			})
			t.Run("the receiver cancels mid-read", func(t *testing.T) {
				p := newOneHopPair(t, tr.tls, tr.dev, 76, ucxTestConfig())
				hr := p.receive(t)
				eventually(t, func() bool { return hr.Status().State != Queued }, "the read started") // its request went
				out := p.dst.e.Cancel(hr.ID())
				t.Logf("cancel: %v", out)
				waitQuiesced(t, hr, 30*time.Second)
				switch out {
				case CancelledBeforeAdvertise: // before its request went: the exposure is unclaimed still
					require.Equal(t, Cancelled, hr.Status().State)
					require.Equal(t, CancelledBeforeAdvertise, p.src.e.Cancel(p.hs.ID()))
					return
				case AlreadyComplete: // the read won the race: both say so
					waitQuiesced(t, p.hs, 30*time.Second)
					require.Equal(t, Completed, hr.Status().State)
					require.Equal(t, Completed, p.hs.Status().State)
				default:
					waitQuiesced(t, p.hs, 30*time.Second)
					require.Equal(t, Cancelled, hr.Status().State, "%v: %v", out, hr.Status().Err)
					require.NotEqual(t, Completed, p.hs.Status().State, "the sender heard the release, not Done")
				}
			})
			t.Run("the sender is lost mid-read", func(t *testing.T) {
				// A Receive still queued when its sender's engine closes (the goodbye came
				// before the claim) waits out its queue phase: 3 s here (10 s took most of
				// this test's time; the sender closes as the Receive starts, so the phase
				// decides no outcome). Not yet at once (a gap).
				cfg := ucxTestConfig()
				cfg.QueueTimeout = 3 * time.Second
				p := newOneHopPair(t, tr.tls, tr.dev, 77, cfg)
				want := p.s.stream(t) // before Close, which may unmap the sender's pool
				hr := p.receive(t)
				require.NoError(t, p.src.e.Close())
				waitQuiesced(t, hr, 30*time.Second)
				if st := hr.Status(); st.State == Completed {
					require.True(t, bytes.Equal(want, p.r.stream(t)), "a read that completed has every byte")
				} else {
					require.Equal(t, Failed, st.State, "%v", st.Err)
				}
			})
			for _, f := range []struct {
				desc string
				edit func(p *oneHopPair)
			}{
				{"a region that does not hold the reads", func(p *oneHopPair) {
					paramhooks.Hooks.Exposure(p.cp).Regions = [][2]uint64{{paramhooks.Hooks.Exposure(p.cp).Addr, 64}}
				}},
				{"a remote key this UCX never packed", func(p *oneHopPair) {
					paramhooks.Hooks.Exposure(p.cp).Key = bytes.Repeat([]byte{0xff}, len(paramhooks.Hooks.Exposure(p.cp).Key))
				}},
			} {
				t.Run("forged: "+f.desc, func(t *testing.T) {
					p := newOneHopPair(t, tr.tls, tr.dev, 75, ucxTestConfig())
					f.edit(p)
					before := p.dst.e.Health().Numbers.ProtocolRefusals
					hr := p.receive(t)
					waitQuiesced(t, hr, 30*time.Second)
					require.Equal(t, Failed, hr.Status().State, "path %v oneHop %v", hr.Path(), oneHopUsed(hr))
					require.ErrorIs(t, hr.Status().Err, ErrProtocol, "%v", hr.Status().Err)
					require.Equal(t, before+1, p.dst.e.Health().Numbers.ProtocolRefusals, "counted")
					require.Zero(t, p.r.stream(t)[0], "nothing read")
					require.Equal(t, CancelledBeforeAdvertise, p.src.e.Cancel(p.hs.ID()), "the exposure was never claimed")
				})
			}
		})
	}
}

// BenchmarkUCXOneHop32Tokens is one 32-token request (two blocks of ucxExposeDims, 256 KiB)
// exposed and received over UCX shared memory, Expose to both handles done, with the
// params' Exposure section read at once ("one-hop") and with the switch off ("offer": the
// request/offer round trip). Run both in one invocation and compare their ratio:
//
//	go test -run '^$' -bench UCXOneHop32Tokens -count 5 ./transfer/
func BenchmarkUCXOneHop32Tokens(b *testing.B) {
	for _, off := range []bool{false, true} {
		name := map[bool]string{false: "one-hop", true: "offer"}[off]
		b.Run(name, func(b *testing.B) {
			cfg := ucxTestConfig()
			cfg.noOneHop = off
			cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
			src := newUCXEngine(b, "posix,cma,self", "", cfg)
			dst := newUCXEngine(b, "posix,cma,self", "", cfg)
			s := mappedKV(b, src, ucxExposeDims, layout.BlockMajor, seqBlocks(3, 2), 7)
			r := mappedKV(b, dst, ucxExposeDims, layout.BlockMajor, seqBlocks(30, 2), 0)
			b.ResetTimer()
			for i := range b.N {
				oneHopRequest(b, src, dst, s, r, RequestID(1000+i))
			}
		})
	}
}

// oneHopRequest exposes s's blocks on src as request id, receives them into r's on dst from the
// params' blob, waits for both handles to quiesce, and releases them.
func oneHopRequest(tb testing.TB, src, dst *ucxEngine, s, r *ucxKV, id RequestID) {
	hs, p, err := src.e.Expose(bg, Spec{ID: id, Plan: s.plan, Pool: s.mem})
	if err != nil {
		tb.Fatal(err)
	}
	blob, err := p.MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	cp, err := ucx.UnmarshalContextParams(blob)
	if err != nil {
		tb.Fatal(err)
	}
	hr, err := dst.e.Receive(bg, Spec{ID: cp.RequestID, Peer: ucx.PeerFromAddress(cp.WorkerAddress), Plan: r.plan, Pool: r.mem,
		Secret: cp.Secret, Params: cp})
	if err != nil {
		tb.Fatal(err)
	}
	<-hr.Quiesced()
	<-hs.Quiesced()
	if hr.Status().State != Completed || hs.Status().State != Completed {
		tb.Fatalf("%v / %v", hr.Status().Err, hs.Status().Err)
	}
	_ = hr.Release()
	_ = hs.Release()
}
