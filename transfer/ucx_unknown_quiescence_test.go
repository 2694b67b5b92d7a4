// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// TestL9_UCXUnknownQuiescenceIsPoisonOnEveryPath is the mem tests of L9's unknown quiescence
// (TestL9_UnknownQuiescenceMeansPoisonNeverRelease, TestL9_LateCompletionAfterPoisonNeverReturnsTheSlot,
// TestL9_DirectUnknownQuiescenceNeverQuiescesTheCallersBlocks,
// TestL9_RMAUnknownQuiescenceNeverQuiescesTheReceiversBlocks) over real UCX, two engines in
// this process, on every path but CMA (TestL9_UCXCMABlockedReadPoisonsTheBlocks) and device:
// staging and direct over shared memory and TCP, pull, pull in place, RMA and RMA in place over
// shared memory. One side's transport is deaf (silentOps): the engine never hears of its data
// operations, and its Cancel of them does nothing; UCX runs them to their end all the same. The
// transfer runs into its deadline and quarantine timeout. Then, as the mem tests: what those
// operations may touch is poisoned, and only it: the staging slots (a staging transfer's, and a
// pull receiver's, whose gets land in its slots), whose handle then fails and quiesces; else
// the caller's blocks (direct, RMA gets, and the in-place paths, whose one transport
// operation is the read of the sender's generation word after the copies): Status says
// BlocksPoisoned, the handle stays quarantined and Quiesced never closes. Health reports it (a
// budget of no poisoned block, and as few slots as MaxConcurrent needs). The other side
// quiesces and poisons only the slots of its own operations that never ended (countedOps): on
// staging with a deaf receiver, the sends no receive will ever match, which UCX ends over TCP
// in 1.13.1 and never over shared memory, nor over TCP in 1.22.0; elsewhere none. A sender read
// by the receiver is released by the receiver's abort, sent once nothing of its own is
// outstanding. No slot lease is lost. Then UCX's own
// completions, held till now, reach the engine late (MemoryDone): a poisoned slot never comes
// back, nothing is scattered into the caller's blocks, and poisoned blocks stay so. Both
// engines then close within their bound.
func TestL9_UCXUnknownQuiescenceIsPoisonOnEveryPath(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 16}
	ids := seqBlocks(0, 16) // 2 MiB: eight 256 KiB chunks, more than the slots hold
	paths := map[string]ucxPathCase{}
	for _, pc := range ucxCancelPaths {
		paths[pc.name] = pc
	}
	rows := []struct {
		path   string
		sender bool // the sender's operations are the deaf ones, else the receiver's
		tcp    bool // the path runs over TCP too
	}{
		{"staging", false, true}, {"staging", true, true},
		{"pull", false, false}, {"pull in place", false, false},
		{"direct", false, true}, {"direct", true, true},
		{"rma", false, false}, {"rma in place", false, false},
	}
	group := newRowGroup(t, 2) // rows mostly wait for a deadline and a quarantine
	defer group.wait()
	for _, tr := range ucxTransports {
		for _, row := range rows {
			if tr.name != "shm" && !row.tcp {
				continue
			}
			pc := paths[row.path]
			side := map[bool]string{true: "the sender deaf", false: "the receiver deaf"}[row.sender]
			group.run(tr.name+"/"+pc.name+"/"+side, func(t *testing.T) {
				cfg := ucxTestConfig()
				pc.cfg(&cfg)
				cfg.TransferTimeout = 2 * time.Second // time to reach the data operations on a loaded host
				cfg.Tuning.CancelGrace, cfg.Tuning.QuarantineTimeout = 50*time.Millisecond, 200*time.Millisecond
				cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
				// Health's budgets: no poisoned block, and every slot MaxConcurrent needs.
				cfg.MaxConcurrent, cfg.Tuning.NumSlots = 2, 2
				cfg.Tuning.PoisonedBlockBudget = tuning.None
				var deaf *silentOps
				wrap := func(u ucxImpl) Transport {
					deaf = &silentOps{heldCompletions: &heldCompletions{ucxImpl: u}}
					return deaf
				}
				// A sender read by a deaf receiver (pull, RMA) waits longer in quarantine (as the mem
				// tests' do): its exposure ends by the receiver's word, not by its own clock.
				ocfg := cfg
				read := !row.sender && (pc.want == PathRMA || pc.name != "staging")
				if read {
					ocfg.Tuning.QuarantineTimeout = 10 * time.Second
				}
				counted := &countedOps{}
				count := func(u ucxImpl) Transport {
					counted.ucxImpl = u
					return counted
				}
				var src, dst *ucxEngine
				if row.sender {
					src, dst = newUCXEngineOver(t, tr.tls, tr.dev, cfg, wrap), newUCXEngineOver(t, tr.tls, tr.dev, ocfg, count)
				} else {
					src, dst = newUCXEngineOver(t, tr.tls, tr.dev, ocfg, count), newUCXEngineOver(t, tr.tls, tr.dev, cfg, wrap)
				}
				s, r := pc.kv(t, src, dims, ids, 71), pc.kv(t, dst, dims, ids, 0)
				hs, hr := startKV(t, src, dst, 71, s, r)
				deafE, deafH, other, otherH := dst, hr, src, hs
				if row.sender {
					deafE, deafH, other, otherH = src, hs, dst, hr
				}
				// Where the end is unknown: the slots the operations use, or the caller's blocks.
				slots := pc.want == PathStaging && !(pc.name == "pull in place" && !row.sender)

				waitClosedWithin(t, deafH.Done(), "the deaf side's handle done", 30*time.Second)
				require.Equal(t, pc.want, hr.Path(), "the transfer is on the path under test")
				if slots {
					waitQuiesced(t, deafH, 20*time.Second) // its slots poisoned, the caller's blocks untouched
				} else {
					require.Eventually(t, func() bool { return deafH.Status().BlocksPoisoned }, 20*time.Second, time.Millisecond,
						"the blocks the deaf operations may touch poisoned: %+v", deafH.Status())
				}
				waitQuiesced(t, otherH, 20*time.Second)
				for _, u := range []*ucxEngine{src, dst} {
					eventually(t, func() bool { return u.e.pool.Stats().Leased == 0 }, "every slot lease ended")
					requireSlotsAccounted(t, u.e)
				}
				silenced := deaf.silenced.Load()
				require.NotZero(t, silenced, "no data operation of the transfer went through the deaf transport")

				st, pool, h := deafH.Status(), deafE.e.pool.Stats(), deafE.e.Health()
				t.Logf("%d operations deaf; deaf side %v (%v), slots %+v; other side %v (%v)",
					silenced, st.State, st.Err, pool, otherH.Status().State, otherH.Status().Err)
				require.Error(t, st.Err)
				require.NotEqual(t, Completed, st.State)
				if slots {
					// Every deaf operation held a slot of its own: each one poisoned, no other.
					require.Equal(t, int(silenced), pool.Poisoned, "the slots of unknown end poisoned, never released, and only they")
					require.Equal(t, Failed, st.State, "%v", st.Err)
					require.False(t, st.BlocksPoisoned)
					require.Equal(t, pool.Poisoned, h.Numbers.PoisonedSlots)
					require.False(t, h.Healthy, "%d of %d slots poisoned, %d needed: %+v", pool.Poisoned, pool.Total, cfg.MaxConcurrent, h.Numbers)
					require.Contains(t, h.Reason, "staging slots poisoned")
				} else {
					require.Zero(t, pool.Poisoned, "no slot's end was unknown")
					require.Equal(t, Quarantined, st.State, "quarantined for good: %v", st.Err)
					require.True(t, st.BlocksPoisoned)
					require.Equal(t, int64(1), h.Numbers.BlocksPoisoned)
					require.Equal(t, int64(len(ids)), h.Numbers.PoisonedBlocks)
					require.False(t, h.Healthy)
					require.True(t, strings.Contains(h.Reason, "KV blocks poisoned for good"), "%s", h.Reason)
					require.Zero(t, h.Numbers.Quarantined-h.Numbers.BlocksPoisoned, "a transfer still waiting in quarantine")
				}
				ost, opool := otherH.Status(), other.e.pool.Stats()
				require.False(t, ost.BlocksPoisoned, "the other side's blocks poisoned")
				open := int(counted.open.Load()) // the other side's operations UCX never ended
				if pc.name == "staging" && !row.sender {
					// The sender's chunks past those the deaf receives took: no receive will ever
					// match them, and UCX cannot cancel a send on the wire. Over shared memory
					// they never end and their slots are poisoned (both sides', as over mem);
					// over TCP UCX 1.13.1 ended them without a receive, 1.22.0 did not.
					t.Logf("the other side: %d operations never ended, %d slots poisoned", open, opool.Poisoned)
					require.Equal(t, open, opool.Poisoned, "the slots of the sends that never ended, and only they")
				} else {
					require.Zero(t, open, "an operation of the other side never ended")
					require.Zero(t, opool.Poisoned, "the other side's slots poisoned")
				}
				require.True(t, ost.State.Terminal(), "%+v", ost)

				// UCX's own completions of the deaf operations reach the engine now, late.
				time.Sleep(100 * time.Millisecond) // a poisoned handle must not quiesce by time either
				if !slots {
					require.False(t, isClosed(deafH.Quiesced()), "unknown quiescence told the caller to free its blocks")
				}
				late := deaf.release()
				t.Logf("%d late completions let through", late)
				require.NotZero(t, late, "UCX ran none of the deaf operations to its end")
				time.Sleep(200 * time.Millisecond) // the late completions go through the engine's loops
				require.Equal(t, pool, deafE.e.pool.Stats(), "a late completion put a poisoned slot back")
				require.Equal(t, st.BlocksPoisoned, deafH.Status().BlocksPoisoned)
				if !slots {
					require.False(t, isClosed(deafH.Quiesced()), "a late completion quiesced poisoned blocks")
					require.Equal(t, Quarantined, deafH.Status().State)
				}
				if slots && !row.sender {
					require.True(t, bytes.Equal(make([]byte, r.plan.Bytes()), r.stream(t)), "a late chunk was scattered into the caller's blocks")
				}

				// Close ends everything within its bound; what is poisoned stays so.
				for _, u := range []*ucxEngine{deafE, other} {
					start := time.Now()
					require.NoError(t, u.e.Close())
					require.Less(t, time.Since(start), cfg.CloseTimeout+5*time.Second, "Close past its bound")
					requireSlotsAccounted(t, u.e)
				}
				require.Equal(t, pool.Poisoned, deafE.e.pool.Stats().Poisoned)
				require.Equal(t, opool.Poisoned, other.e.pool.Stats().Poisoned)
				if !slots {
					require.False(t, isClosed(deafH.Quiesced()), "Close quiesced poisoned blocks")
				}
			})
		}
	}
}

// silentOps is a UCX transport on which the engine never hears of a data operation until the
// test lets it (release) or the transport closes: every send, receive, IOV message, get and
// read of a generation word is held as heldCompletions holds some, and a Cancel of one held
// does nothing at all, in the engine's view or UCX's. UCX still runs each to its end; the
// engine cannot tell whether its memory is still touched (a wire that hung, a cancel that
// never reported), which is unknown quiescence (L9), as mem's Fault{Hang, NeverQuiesce}.
// The generation word is read with a get, never through a mapping (heldCompletions.MapRemote):
// on the in-place paths that read is the transfer's one transport operation.
type silentOps struct {
	*heldCompletions
	silenced atomic.Int64 // operations posted deaf
}

// deaf posts an operation through hold, counting it.
func (s *silentOps) deaf(post func(deliver func(func())) (transport.OpID, error)) (transport.OpID, error) {
	id, err := s.hold(post)
	if err == nil {
		s.silenced.Add(1)
	}
	return id, err
}

func (s *silentOps) PostSend(to Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return s.deaf(func(deliver func(func())) (transport.OpID, error) {
		return s.ucxImpl.PostSend(to, tag, buf, func(c transport.Completion) { deliver(func() { done(c) }) })
	})
}

func (s *silentOps) PostRecv(from Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return s.deaf(func(deliver func(func())) (transport.OpID, error) {
		return s.ucxImpl.PostRecv(from, tag, buf, func(c transport.Completion) { deliver(func() { done(c) }) })
	})
}

func (s *silentOps) PostSendIOV(to Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return s.deaf(func(deliver func(func())) (transport.OpID, error) {
		return s.ucxImpl.PostSendIOV(to, tag, iov, func(c transport.Completion) { deliver(func() { done(c) }) })
	})
}

func (s *silentOps) PostRecvIOV(from Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return s.deaf(func(deliver func(func())) (transport.OpID, error) {
		return s.ucxImpl.PostRecvIOV(from, tag, iov, func(c transport.Completion) { deliver(func() { done(c) }) })
	})
}

func (s *silentOps) PostGet(from Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	return s.deaf(func(deliver func(func())) (transport.OpID, error) {
		return s.ucxImpl.PostGet(from, tag, key, addr, dst, func(c transport.Completion) { deliver(func() { done(c) }) })
	})
}

func (s *silentOps) PostReadGeneration(from Peer, tag transport.Tag, key []byte, addr uint64, done func(transport.Completion, uint64)) (transport.OpID, error) {
	return s.deaf(func(deliver func(func())) (transport.OpID, error) {
		return s.ucxImpl.PostReadGeneration(from, tag, key, addr, func(c transport.Completion, v uint64) { deliver(func() { done(c, v) }) })
	})
}

// Cancel does nothing to an operation held: the engine's cancel never reports, and UCX runs
// it to its end. Any other (one released) is cancelled in UCX.
func (s *silentOps) Cancel(id transport.OpID) {
	s.mu.Lock()
	for r := range s.ops {
		if r.id == id {
			s.mu.Unlock()
			return
		}
	}
	s.mu.Unlock()
	s.ucxImpl.Cancel(id)
}

// release lets every held completion go, in order, and any later one straight through: UCX's
// own reports, late. It returns how many were held (UCX had ended that many reports' worth).
func (s *silentOps) release() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	n := 0
	for r := range s.ops {
		n += len(r.calls)
		s.letLocked(r)
	}
	return n
}

// countedOps is a UCX transport that counts its data operations without a final report yet
// (posted, and no completion other than transport.MemoryBusy).
type countedOps struct {
	ucxImpl
	open atomic.Int64
}

// counted posts an operation whose completions go through done, counting it open until its
// final one.
func (c *countedOps) counted(done func(transport.Completion), post func(done func(transport.Completion)) (transport.OpID, error)) (transport.OpID, error) {
	c.open.Add(1)
	id, err := post(func(x transport.Completion) {
		if x.Memory != transport.MemoryBusy {
			c.open.Add(-1)
		}
		done(x)
	})
	if err != nil {
		c.open.Add(-1)
	}
	return id, err
}

func (c *countedOps) PostSend(to Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return c.counted(done, func(d func(transport.Completion)) (transport.OpID, error) { return c.ucxImpl.PostSend(to, tag, buf, d) })
}

func (c *countedOps) PostRecv(from Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return c.counted(done, func(d func(transport.Completion)) (transport.OpID, error) {
		return c.ucxImpl.PostRecv(from, tag, buf, d)
	})
}

func (c *countedOps) PostSendIOV(to Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return c.counted(done, func(d func(transport.Completion)) (transport.OpID, error) {
		return c.ucxImpl.PostSendIOV(to, tag, iov, d)
	})
}

func (c *countedOps) PostRecvIOV(from Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return c.counted(done, func(d func(transport.Completion)) (transport.OpID, error) {
		return c.ucxImpl.PostRecvIOV(from, tag, iov, d)
	})
}

func (c *countedOps) PostGet(from Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	return c.counted(done, func(d func(transport.Completion)) (transport.OpID, error) {
		return c.ucxImpl.PostGet(from, tag, key, addr, dst, d)
	})
}

func (c *countedOps) PostReadGeneration(from Peer, tag transport.Tag, key []byte, addr uint64, done func(transport.Completion, uint64)) (transport.OpID, error) {
	var v uint64 // the word read, delivered with the final completion
	return c.counted(func(x transport.Completion) { done(x, v) }, func(d func(transport.Completion)) (transport.OpID, error) {
		return c.ucxImpl.PostReadGeneration(from, tag, key, addr, func(x transport.Completion, value uint64) { v = value; d(x) })
	})
}
