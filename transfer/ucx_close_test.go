// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// TestL1_UCXCloseWithTransfersInFlightOnEveryPath is TestL1_CloseWithTransfersInFlightOnEveryPath
// over the real UCX transport, shared memory and TCP, where Close unmaps memory: the staging
// slots, the pools the transport allocated, the peers' slots and pools mapped here, the
// generation words. Closing an engine with transfers moving killed the process (SIGSEGV) when
// a mover worker still copied into a staging slot the transport had unmapped.
func TestL1_UCXCloseWithTransfersInFlightOnEveryPath(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	// closePaths are mem's too; CMA (process_vm_readv of pools the test mapped and registered)
	// exists only over UCX shared memory.
	cma := closePath{name: "CMA", cfg: func(*Config) {}, path: PathRMA}
	for _, tr := range ucxTransports {
		for _, pc := range append(closePaths[:len(closePaths):len(closePaths)], cma) {
			for _, closeSender := range []bool{true, false} {
				side := map[bool]string{true: "sender", false: "receiver"}[closeSender]
				t.Run(tr.name+"/"+pc.name+"/close the "+side, func(t *testing.T) {
					if pc.device {
						t.Skip("a device pool over UCX needs a GPU (ucx.NewDevice); the device rows run over mem with a fake device")
					}
					if tr.name == "tcp" && (pc.path == PathRMA || pc.pull) {
						// Gets over TCP are UCX's emulation (RMAWhereEmulated, off by default): UCX
						// 1.13 aborted the whole test process in its get handler ("Fatal: unexpected
						// error: Endpoint timeout") once in a full -race run when an engine closed
						// under them, as it asserts in uct_tcp_ep_pending_purge (ucx_goodbye_test.go).
						// A UCX defect, not Close's; shared memory covers these paths.
						t.Skip("UCX 1.13 may abort the process when an endpoint closes under emulated gets over TCP")
					}
					if pc.name == cma.name && tr.name != "shm" {
						t.Skip("process_vm_readv reads a peer on this host: shared memory only")
					}
					cfg := ucxTestConfig()
					// 1 MiB slots, and a grace shorter than a copy: Close finds copies queued
					// and running on the mover workers.
					cfg.SlotBytes, cfg.Tuning.PipelineDepth, cfg.Tuning.CancelGrace = 1<<20, 4, time.Microsecond
					cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
					cfg.Tuning.RMAWhereEmulated = true              // the RMA mode and the pull wire over TCP too
					cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
					pc.cfg(&cfg)
					var trs []*ucx.Transport
					var wrap func(ucxImpl) Transport
					if pc.path == PathRMA || pc.path == PathDirect {
						// These paths move a transfer's 4 MiB in a few milliseconds: some
						// completions are held, so Close finds the transfers with their bytes
						// moved and an operation outstanding (heldCompletions).
						wrap = func(u ucxImpl) Transport { return &heldCompletions{ucxImpl: u} }
					}
					mk := func() closeSide {
						u := newUCXEngineOver(t, tr.tls, tr.dev, cfg, wrap)
						trs = append(trs, u.tr)
						if pc.name == cma.name {
							ucxhooks.Hooks.AllowSameProcessCMA(u.tr) // both engines in this process
						}
						side := closeSide{e: u.e, self: u.tr.Self()}
						if pc.path == PathStaging { // copies on the mover workers that take a while
							side.mover = func(_ RequestID, pool []byte) Mover {
								return slowMover{Mover: newHostMover(pool), delay: 20 * time.Millisecond}
							}
						}
						side.kv = func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
							k := newUCXKV(t, dims, layout.BlockMajor, ids, seed)
							switch {
							case pc.name == cma.name: // mapped here and registered; Close releases the registration
								mem := mmapPool(t, len(k.mem), "anon")
								copy(mem, k.mem)
								r, err := u.tr.RegisterHost(mem)
								require.NoError(t, err)
								k.mem = r.Pool()
							case pc.path != PathStaging: // one-copy paths need memory the transport registered
								k = mappedKV(t, u, dims, layout.BlockMajor, ids, seed)
							}
							return k.mem, k.plan
						}
						return side
					}
					src, dst := mk(), mk()
					closeMidTransfer(t, src, dst, pc, closeSender, 32)
					if pc.name == cma.name {
						require.NotZero(t, ucxOf(trs[1]).CMAStats().Gets, "the reads went by process_vm_readv")
					}
				})
			}
		}
	}
}

// heldCompletions is a UCX transport on which the engine hears some operations' completions
// only once it cancels them or the transport closes: every read of an RMA receiver's generation
// word (rma_gen.go), which it reads with a get, never through a mapping of it; and every receive
// of a direct transfer's chunks but its first. UCX has ended them (a completion held is UCX's
// own), and the engine has not heard yet, as on a loaded host: the transfer stays in flight,
// its bytes moved (all of them on the RMA path) and an operation outstanding, and the
// sender's pool exposed or its chunks sent, until Close. Over shared memory and TCP those
// paths move a transfer's 4 MiB in a few milliseconds, too fast for closeMidTransfer to find
// them moving otherwise.
type heldCompletions struct {
	ucxImpl
	mu     sync.Mutex
	ops    map[*heldOp]bool // the operations whose completions are held, or will be
	closed bool
}

// heldOp is an operation whose completions are held: its id, and its callbacks not yet
// delivered.
type heldOp struct {
	id    transport.OpID
	calls []func()
	let   bool // its held callbacks were delivered; any later one goes straight through
}

// hold posts an operation (post, whose callbacks call deliver) with its completions held.
func (h *heldCompletions) hold(post func(deliver func(call func())) (transport.OpID, error)) (transport.OpID, error) {
	r := &heldOp{}
	h.mu.Lock()
	if h.ops == nil {
		h.ops = map[*heldOp]bool{}
	}
	r.let = h.closed
	if !r.let {
		h.ops[r] = true
	}
	h.mu.Unlock()
	id, err := post(func(call func()) {
		h.mu.Lock()
		if !r.let {
			r.calls = append(r.calls, call)
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		call() // on the transport's goroutine, as it came
	})
	h.mu.Lock()
	r.id = id
	if err != nil {
		delete(h.ops, r)
	}
	h.mu.Unlock()
	return id, err
}

// letLocked delivers r's held callbacks, in order, on a goroutine of its own: never inside a
// Transport method the engine called (transport.Transport's callback rules). h.mu is held.
func (h *heldCompletions) letLocked(r *heldOp) {
	calls := r.calls
	r.calls, r.let = nil, true
	delete(h.ops, r)
	go func() {
		for _, f := range calls {
			f()
		}
	}()
}

// MapRemote maps what the inner transport maps, but the 8-byte generation word: readMapped
// then reads it with PostReadGeneration (the pools the tests read are never 8 bytes).
func (h *heldCompletions) MapRemote(from Peer, key []byte, addr uint64, n int) ([]byte, func(), error) {
	if n == 8 {
		return nil, nil, nil
	}
	return h.ucxImpl.MapRemote(from, key, addr, n)
}

func (h *heldCompletions) PostReadGeneration(from Peer, tag transport.Tag, key []byte, addr uint64, done func(transport.Completion, uint64)) (transport.OpID, error) {
	return h.hold(func(deliver func(func())) (transport.OpID, error) {
		return h.ucxImpl.PostReadGeneration(from, tag, key, addr, func(c transport.Completion, v uint64) { deliver(func() { done(c, v) }) })
	})
}

func (h *heldCompletions) PostRecvIOV(from Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	if tag.Seq == 0 { // the first chunk: the transfer's bytes are seen moving
		return h.ucxImpl.PostRecvIOV(from, tag, iov, done)
	}
	return h.hold(func(deliver func(func())) (transport.OpID, error) {
		return h.ucxImpl.PostRecvIOV(from, tag, iov, func(c transport.Completion) { deliver(func() { done(c) }) })
	})
}

// Cancel lets a held operation's completions go (UCX's own reach the engine), and cancels the
// operation in UCX as well, where it may still run.
func (h *heldCompletions) Cancel(id transport.OpID) {
	h.mu.Lock()
	for r := range h.ops {
		if r.id == id {
			h.letLocked(r)
		}
	}
	h.mu.Unlock()
	h.ucxImpl.Cancel(id)
}

// Close lets every held completion go, and any later one through, then closes the transport.
func (h *heldCompletions) Close(force bool) error {
	h.mu.Lock()
	h.closed = true
	for r := range h.ops {
		h.letLocked(r)
	}
	h.mu.Unlock()
	return h.ucxImpl.Close(force)
}
