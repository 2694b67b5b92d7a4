// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/stretchr/testify/require"
)

// ucxRecorder is an transport.Inbound and a completion sink that remembers everything, for the
// transport.Transport contract tests of the UCX transport.
type ucxRecorder struct {
	mu      sync.Mutex
	control []ucxControl
	lost    []transport.Peer
	reports map[transport.OpID][]transport.Completion
}

type ucxControl struct {
	from transport.Peer
	msg  string
}

func newUCXRecorder() *ucxRecorder {
	return &ucxRecorder{reports: map[transport.OpID][]transport.Completion{}}
}

func (r *ucxRecorder) OnControl(from transport.Peer, msg []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.control = append(r.control, ucxControl{from, string(msg)})
}

func (r *ucxRecorder) OnPeerLost(peer transport.Peer, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost = append(r.lost, peer)
}

// done returns the completion callback of op *id (set once Post returned).
func (r *ucxRecorder) done(id *transport.OpID, ready chan struct{}) func(transport.Completion) {
	return func(c transport.Completion) {
		<-ready // the id is known once Post returned; callbacks never run inside Post
		r.mu.Lock()
		defer r.mu.Unlock()
		r.reports[*id] = append(r.reports[*id], c)
	}
}

func (r *ucxRecorder) reportsOf(id transport.OpID) []transport.Completion {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]transport.Completion(nil), r.reports[id]...)
}

// newUCXPair is two bound transports over tls. They keep RMA over TCP too
// (ServeEmulatedRMA): the tests that use them check the RMA route where UCX emulates it.
func newUCXPair(t *testing.T, tls, dev string) (a, b *ucxTransport, ra, rb *ucxRecorder) {
	t.Helper()
	var err error
	a, err = newTransport(Config{TLS: tls, NetDevices: dev, StagingBytes: 32 << 20, CloseTimeout: 2 * time.Second, ServeEmulatedRMA: true})
	require.NoError(t, err)
	b, err = newTransport(Config{TLS: tls, NetDevices: dev, StagingBytes: 32 << 20, CloseTimeout: 2 * time.Second, ServeEmulatedRMA: true})
	require.NoError(t, err)
	ra, rb = newUCXRecorder(), newUCXRecorder()
	require.NoError(t, a.Bind(ra))
	require.NoError(t, b.Bind(rb))
	t.Cleanup(func() {
		require.NoError(t, a.Close(true))
		require.NoError(t, b.Close(true))
	})
	return a, b, ra, rb
}

// post posts through f and returns the op id with its callbacks released.
func post(t *testing.T, rec *ucxRecorder, f func(done func(transport.Completion)) (transport.OpID, error)) (transport.OpID, error) {
	t.Helper()
	var id transport.OpID
	ready := make(chan struct{})
	got, err := f(rec.done(&id, ready))
	id = got
	close(ready)
	return id, err
}

func finals(cs []transport.Completion) int {
	n := 0
	for _, c := range cs {
		if c.Memory != transport.MemoryBusy {
			n++
		}
	}
	return n
}

func TestUCXTransport_ContractControlAndData(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b, ra, rb := newUCXPair(t, tr.tls, tr.dev)
			require.NoError(t, a.SendControl(b.Self(), []byte("hello from a")))
			require.Eventually(t, func() bool { rb.mu.Lock(); defer rb.mu.Unlock(); return len(rb.control) == 1 },
				5*time.Second, time.Millisecond)
			require.Equal(t, ucxControl{a.Self(), "hello from a"}, rb.control[0], "the sender is named by its address")

			src, dst := a.StagingMemory()[:1<<20], b.StagingMemory()[:1<<20]
			for i := range src {
				src[i] = byte(i * 7)
			}
			tag := transport.Tag{Request: 5, Sub: 1, Seq: 2}
			rid, err := post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) { return b.PostRecv(a.Self(), tag, dst, d) })
			require.NoError(t, err)
			sid, err := post(t, ra, func(d func(transport.Completion)) (transport.OpID, error) { return a.PostSend(b.Self(), tag, src, d) })
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(rb.reportsOf(rid)) == 1 && len(ra.reportsOf(sid)) == 1 },
				10*time.Second, time.Millisecond)
			for _, c := range []transport.Completion{rb.reportsOf(rid)[0], ra.reportsOf(sid)[0]} {
				require.NoError(t, c.Err)
				require.Equal(t, transport.MemoryDone, c.Memory)
				require.Equal(t, len(src), c.Bytes)
			}
			require.Equal(t, src, dst)
		})
	}
}

func TestUCXTransport_ContractRefusesGoMemory(t *testing.T) {
	a, b, ra, _ := newUCXPair(t, "posix,cma,self", "")
	_, err := post(t, ra, func(d func(transport.Completion)) (transport.OpID, error) {
		return a.PostSend(b.Self(), transport.Tag{Request: 1}, make([]byte, 64), d)
	})
	require.ErrorIs(t, err, ErrUnregistered)
	_, err = post(t, ra, func(d func(transport.Completion)) (transport.OpID, error) {
		return a.PostRecv(b.Self(), transport.Tag{Request: 1}, make([]byte, 64), d)
	})
	require.ErrorIs(t, err, ErrUnregistered)
	time.Sleep(20 * time.Millisecond)
	ra.mu.Lock()
	defer ra.mu.Unlock()
	require.Empty(t, ra.reports, "a refused post gets no callback")
}

// Cancel: an unmatched receive reports transport.ErrCancelled with transport.MemoryDone, once; a send nobody
// receives cannot be stopped, so it reports transport.MemoryBusy, and its one final verdict comes with
// the forced close.
func TestUCXTransport_ContractCancel(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b, ra, rb := newUCXPair(t, tr.tls, tr.dev)
			rid, err := post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
				return b.PostRecv(a.Self(), transport.Tag{Request: 9}, b.StagingMemory()[:4096], d)
			})
			require.NoError(t, err)
			b.Cancel(rid)
			require.Eventually(t, func() bool { return len(rb.reportsOf(rid)) == 1 }, 5*time.Second, time.Millisecond)
			c := rb.reportsOf(rid)[0]
			require.ErrorIs(t, c.Err, transport.ErrCancelled)
			require.Equal(t, transport.MemoryDone, c.Memory)
			b.Cancel(rid) // cancelling a finished op does nothing

			sid, err := post(t, ra, func(d func(transport.Completion)) (transport.OpID, error) {
				return a.PostSend(b.Self(), transport.Tag{Request: 10}, a.StagingMemory()[:8<<20], d)
			})
			require.NoError(t, err)
			time.Sleep(20 * time.Millisecond)
			a.Cancel(sid)
			require.Eventually(t, func() bool { return len(ra.reportsOf(sid)) == 1 }, 5*time.Second, time.Millisecond)
			busy := ra.reportsOf(sid)[0]
			require.Equal(t, transport.MemoryBusy, busy.Memory)
			require.ErrorIs(t, busy.Err, transport.ErrCancelled)

			require.NoError(t, a.Close(true))
			cs := ra.reportsOf(sid)
			require.Equal(t, 1, finals(cs), "exactly one final verdict: %+v", cs)
			require.Error(t, cs[len(cs)-1].Err)
		})
	}
}

// Close(force) gives every outstanding operation exactly one final verdict before it returns,
// and every method fails with transport.ErrClosed afterwards.
func TestUCXTransport_ContractForceCloseReportsEveryOp(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b, ra, _ := newUCXPair(t, tr.tls, tr.dev)
			var ids []transport.OpID
			mem := a.StagingMemory()
			for i := 0; i < 8; i++ {
				buf := mem[i<<20 : (i+1)<<20]
				id, err := post(t, ra, func(d func(transport.Completion)) (transport.OpID, error) {
					if i%2 == 0 {
						return a.PostRecv(b.Self(), transport.Tag{Request: transport.RequestID(100 + i)}, buf, d)
					}
					return a.PostSend(b.Self(), transport.Tag{Request: transport.RequestID(100 + i)}, buf, d) // never received
				})
				require.NoError(t, err)
				ids = append(ids, id)
			}
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			require.NoError(t, a.Close(true))
			require.Less(t, time.Since(start), 5*time.Second)
			for i, id := range ids {
				cs := ra.reportsOf(id)
				require.Equal(t, 1, finals(cs), "op %d: %+v", i, cs)
				last := cs[len(cs)-1]
				require.Error(t, last.Err)
				require.Contains(t, []transport.Memory{transport.MemoryDone, transport.MemoryUnknown}, last.Memory)
			}
			require.ErrorIs(t, a.SendControl(b.Self(), []byte("x")), transport.ErrClosed)
			_, err := a.PostSend(b.Self(), transport.Tag{}, mem[:8], func(transport.Completion) {})
			require.ErrorIs(t, err, transport.ErrClosed)
			require.ErrorIs(t, a.Bind(ra), transport.ErrClosed)
		})
	}
}

// Two live receives that would match the same UCX tag are refused, not left to race: the
// second would otherwise take the first one's data.
func TestUCXTransport_ContractRefusesCollidingReceives(t *testing.T) {
	a, b, _, rb := newUCXPair(t, "posix,cma,self", "")
	tag := transport.Tag{Request: 3, Sub: 0, Seq: 7}
	mem := b.StagingMemory()
	_, err := post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.PostRecv(a.Self(), tag, mem[:4096], d)
	})
	require.NoError(t, err)
	_, err = post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.PostRecv(a.Self(), tag, mem[4096:8192], d)
	})
	require.ErrorIs(t, err, transport.ErrProtocol)
	other := tag
	other.Seq++
	_, err = post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.PostRecv(a.Self(), other, mem[4096:8192], d)
	})
	require.NoError(t, err, "the next chunk's tag is distinct")
}

// A forced close is this side going away, not its peers: the endpoints it force-closes must
// not be reported as lost peers (an engine would fail its transfers with a lost peer instead
// of ErrClosed, and an Observer's OnPeerLost would count peers that are alive).
func TestUCXTransport_ContractForceCloseLosesNoPeer(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b, ra, rb := newUCXPair(t, tr.tls, tr.dev)
			require.NoError(t, a.SendControl(b.Self(), []byte("hello from a")))
			require.NoError(t, b.SendControl(a.Self(), []byte("hello from b")))
			require.Eventually(t, func() bool {
				ra.mu.Lock()
				defer ra.mu.Unlock()
				rb.mu.Lock()
				defer rb.mu.Unlock()
				return len(ra.control) == 1 && len(rb.control) == 1
			}, 10*time.Second, time.Millisecond, "each side has an endpoint to the other")
			require.NoError(t, a.Close(true)) // every report is delivered before Close returns
			ra.mu.Lock()
			defer ra.mu.Unlock()
			require.Empty(t, ra.lost, "a peer reported lost by our own close")
		})
	}
}

// An exposure's generation may end after Close (an engine's transfer that outlived its Close
// ends its RMA exposure then): ending it must not write the generation region Close unmapped.
func TestUCXTransport_ContractGenerationEndedAfterClose(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, _, _, _ := newUCXPair(t, tr.tls, tr.dev)
			var ends []func()
			for range 64 {
				_, _, _, end, err := a.ExposeGeneration()
				require.NoError(t, err)
				ends = append(ends, end)
			}
			require.NoError(t, a.Close(true))
			for _, end := range ends {
				end() // the process dies here if it writes the unmapped region
			}
			_, _, _, _, err := a.ExposeGeneration()
			require.ErrorIs(t, err, transport.ErrClosed)
		})
	}
}

// A generation word read over each transport reads the value the exposure was given, and once
// the exposure ended the value after it: over shared memory from the word's mapping here (UCX
// 1.22 would emulate a get of it, which needs the sender's worker to answer), over TCP by a
// UCX get. The read completes once, with the word's 8 bytes, and leaves no op behind.
func TestUCXTransport_ReadGenerationSeesTheWordAsItIs(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b, _, _ := newUCXPair(t, tr.tls, tr.dev)
			addr, key, value, end, err := a.ExposeGeneration()
			require.NoError(t, err)
			require.NoError(t, b.PrepareReadGeneration(a.Self(), key))
			read := func(what string) uint64 {
				type result struct {
					c transport.Completion
					v uint64
				}
				ch := make(chan result, 2)
				_, err := b.PostReadGeneration(a.Self(), transport.Tag{Request: 7, Seq: 1}, key, addr,
					func(c transport.Completion, v uint64) { ch <- result{c, v} })
				require.NoError(t, err)
				var r result
				select {
				case r = <-ch:
				case <-time.After(30 * time.Second):
					require.FailNow(t, "no completion", "%s: reading the generation word", what)
				}
				require.NoError(t, r.c.Err, what)
				require.Equal(t, transport.MemoryDone, r.c.Memory, what)
				require.Equal(t, 8, r.c.Bytes, what)
				require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.ops) == 0 }, 10*time.Second, time.Millisecond, "%s: ops left", what)
				return r.v
			}
			require.Equal(t, value, read("exposed"))
			end()
			after := read("ended")
			require.NotEqual(t, value, after, "the word changes when its exposure ends")
			require.NotZero(t, after)
		})
	}
}
