// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// The transports the tests run over: loopback shared memory (with cma for rendezvous) and TCP
// on lo. Both exist on any Linux host with Debian's libucx0.
var transports = []struct {
	name string
	tls  string
	lane string // what ucp_ep_print_info must show for the endpoint's lanes
}{
	{"shm", "posix,cma,self", "posix/"},
	{"tcp", "tcp,self", "tcp/"},
}

// ucxPair is two engines' worth of UCX in one process: a context and a worker each, and an
// endpoint each way.
type ucxPair struct {
	ctxA, ctxB *Context
	a, b       *Worker
	ab, ba     *Endpoint
}

func newPair(t testing.TB, tls string) *ucxPair {
	t.Helper()
	return newPairConfig(t, ContextConfig{TLS: tls})
}

// newPairConfig is newPair with both contexts made from cfg (keepalive 200ms, and loopback
// only where the transports include TCP).
func newPairConfig(t testing.TB, cfg ContextConfig) *ucxPair {
	t.Helper()
	return newPairWith(t, cfg, cfg, WorkerConfig{})
}

// newPairWith is newPairConfig with a context configuration for each side and a worker
// configuration for b.
func newPairWith(t testing.TB, cfgA, cfgB ContextConfig, wcfgB WorkerConfig) *ucxPair {
	t.Helper()
	p := &ucxPair{}
	var err error
	for _, cfg := range []*ContextConfig{&cfgA, &cfgB} {
		cfg.KeepaliveInterval = 200 * time.Millisecond
		if strings.Contains(cfg.TLS, "tcp") {
			cfg.NetDevices = "lo"
		}
	}
	p.ctxA, err = NewContext(cfgA)
	require.NoError(t, err)
	p.ctxB, err = NewContext(cfgB)
	require.NoError(t, err)
	p.a, err = p.ctxA.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	p.b, err = p.ctxB.NewWorker(wcfgB)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.ab, err = p.a.Connect(ctx, p.b.Address())
	require.NoError(t, err)
	p.ba, err = p.b.Connect(ctx, p.a.Address())
	require.NoError(t, err)
	t.Cleanup(func() { p.close(t) })
	return p
}

func (p *ucxPair) close(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, p.ab.Close(ctx))
	require.NoError(t, p.ba.Close(ctx))
	require.NoError(t, p.a.Close())
	require.NoError(t, p.b.Close())
	require.NoError(t, p.ctxA.Close())
	require.NoError(t, p.ctxB.Close())
}

func alloc(t testing.TB, c *Context, n int64) *Memory {
	t.Helper()
	m, err := c.Allocate(n)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	return m
}

func waitAll(t testing.TB, d time.Duration, reqs ...*Request) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for i, r := range reqs {
		require.NoError(t, r.Wait(ctx), "request %d", i)
	}
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(peerproc.SharedBuilds(m)) // each peer built once
}

func TestUCX_StatusCodesMatchHeader(t *testing.T) {
	for name, v := range statusCodes() {
		require.Equal(t, v[1], v[0], "ucs_status_t %s", name)
	}
	for _, tc := range []struct {
		desc   string
		status int
		want   error
	}{
		{"cancel", statusCanceled, ErrCancelled},
		{"keepalive timeout of a dead peer", endpointTimeoutStatus, ErrPeerUnreachable},
		{"connection reset", statusConnectionReset, ErrPeerUnreachable},
		{"truncated", statusMessageTruncated, ErrTruncated},
		{"unsupported", statusUnsupported, ErrNotSupported},
		{"timed out", statusTimedOut, ErrTimeout},
		{"no memory", statusNoMemory, ErrUCX},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := fmt.Errorf("context: %w", &StatusError{Op: "op", Status: tc.status, Text: "x"})
			require.ErrorIs(t, err, tc.want)
			var se *StatusError
			require.True(t, errors.As(err, &se))
			require.Equal(t, tc.status, se.Status)
		})
	}
}

func TestUCX_ConfigValidationNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		make  func() error
		field string
	}{
		{"keepalive too short", func() error {
			_, err := NewContext(ContextConfig{KeepaliveInterval: time.Millisecond})
			return err
		}, "KeepaliveInterval"},
		{"unknown transport", func() error {
			_, err := NewContext(ContextConfig{TLS: "no-such-transport"})
			return err
		}, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := tc.make()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.field)
		})
	}
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	for _, tc := range []struct {
		desc  string
		cfg   WorkerConfig
		field string
	}{
		{"negative spin", WorkerConfig{SpinRounds: -1}, "SpinRounds"},
		{"sleep too long", WorkerConfig{MaxSleep: time.Second}, "MaxSleep"},
		{"negative close timeout", WorkerConfig{CloseTimeout: -time.Second}, "CloseTimeout"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := c.NewWorker(tc.cfg)
			require.ErrorIs(t, err, ErrInvalidArgument)
			require.Contains(t, err.Error(), tc.field)
		})
	}
}

// The UCX 1.13 trap: with peer error handling, shared memory is silently replaced by TCP
// unless UCX_MM_ERROR_HANDLING=y. Offering both, the endpoint must still choose shared memory.
func TestUCX_LoopbackUsesSharedMemory(t *testing.T) {
	for _, tc := range []struct {
		desc, tls, want, notWant string
	}{
		{"shared memory and tcp offered", "posix,sysv,cma,tcp,self", "posix/", "tcp/"},
		{"shared memory only", "posix,cma,self", "posix/", "tcp/"},
		{"tcp only", "tcp,self", "tcp/", "posix/"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := newPair(t, tc.tls)
			// Wire-up finishes with the first message each way.
			waitAll(t, 5*time.Second, p.ba.TagSendBytes([]byte("x"), 1), p.a.TagRecvBytes(nil, 8, 1, ^uint64(0)))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			info, err := p.ab.Info(ctx)
			require.NoError(t, err)
			require.Contains(t, info, tc.want, "lanes:\n%s", info)
			require.NotContains(t, info, tc.notWant, "lanes:\n%s", info)
		})
	}
}

// UCX's TCP transport completes a zero-copy send twice when the connection breaks under it
// (docs/ucx.md, "TCP without zero-copy"): UCX 1.13 aborts the survivor of a killed peer on it.
// A TCP lane must therefore copy: no protocol of the endpoint may be zero-copy. (UCX 1.13
// prints "egr/bcopy" or "egr/zcopy"; 1.22 "copy-in copy-out" or "zero-copy".)
func TestUCX_TCPNeverSendsZeroCopy(t *testing.T) {
	p := newPair(t, "tcp,self")
	waitAll(t, 5*time.Second, p.ba.TagSendBytes([]byte("x"), 1), p.a.TagRecvBytes(nil, 8, 1, ^uint64(0)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := p.ab.Info(ctx)
	require.NoError(t, err)
	require.Contains(t, info, "tcp/", "lanes:\n%s", info)
	require.True(t, strings.Contains(info, "bcopy") || strings.Contains(info, "copy-in copy-out"),
		"no copying protocol named:\n%s", info)
	for _, zcopy := range []string{"zcopy", "zero-copy"} {
		require.NotContains(t, info, zcopy, "lanes:\n%s", info)
	}
}

func TestUCX_TaggedTransfersEveryByteChecked(t *testing.T) {
	sizes := []int64{1, 100, 8 << 10, 64<<10 + 3, 1 << 20, 16<<20 + 5}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			src := alloc(t, p.ctxA, 32<<20)
			dst := alloc(t, p.ctxB, 32<<20)
			for i, n := range sizes {
				for _, mode := range []string{"contiguous", "iov"} {
					t.Run(fmt.Sprintf("%s/%d", mode, n), func(t *testing.T) {
						seed := uint64(i*2 + len(mode))
						require.NoError(t, src.FillPattern(0, n, 0, seed))
						clear(dst.Bytes()[:n+16])
						tag := uint64(1000 + i)
						var recv, send *Request
						if mode == "contiguous" {
							recv = p.ba.TagRecv(dst, 0, n, tag, ^uint64(0))
							send = p.ab.TagSend(src, 0, n, tag)
						} else {
							// Three pieces out, two pieces in, cut at odd places.
							a, b := n/3, n/2
							send = p.ab.TagSendIOV(src, []Segment{{0, a}, {a, b - a}, {b, n - b}}, tag)
							recv = p.ba.TagRecvIOV(dst, []Segment{{0, n / 4}, {n / 4, n - n/4}}, tag, ^uint64(0))
						}
						waitAll(t, 10*time.Second, recv, send)
						require.Equal(t, n, recv.Length())
						bad, err := dst.CheckPattern(0, n, 0, seed)
						require.NoError(t, err)
						require.Equal(t, int64(-1), bad, "first wrong byte")
						require.Equal(t, make([]byte, 16), dst.Bytes()[n:n+16], "bytes past the message")
					})
				}
			}
		})
	}
}

func TestUCX_ManySmallMessagesEveryByteChecked(t *testing.T) {
	const count, size = 2000, 3000
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			src := alloc(t, p.ctxA, count*size)
			dst := alloc(t, p.ctxB, count*size)
			require.NoError(t, src.FillPattern(0, count*size, 0, 77))
			reqs := make([]*Request, 0, 2*count)
			// Receives in reverse order of sends: tags, not arrival order, place each one.
			for i := count - 1; i >= 0; i-- {
				reqs = append(reqs, p.ba.TagRecv(dst, int64(i*size), size, uint64(i), ^uint64(0)))
			}
			for i := 0; i < count; i++ {
				reqs = append(reqs, p.ab.TagSend(src, int64(i*size), size, uint64(i)))
			}
			waitAll(t, 20*time.Second, reqs...)
			bad, err := dst.CheckPattern(0, count*size, 0, 77)
			require.NoError(t, err)
			require.Equal(t, int64(-1), bad)
		})
	}
}

// A Llama-3-8B-shaped request of 4096 tokens: 32 layers x 2 x 8 heads x 4096 x 128 x 2 B =
// 512 MiB, streamed in 16 MiB chunks with 4 in flight, every byte checked.
func TestUCX_Request4096TokensOverSharedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the 512 MiB transfer is left out")
	}
	const total = int64(32 * 2 * 8 * 4096 * 128 * 2)
	const chunk = int64(16 << 20)
	p := newPair(t, transports[0].tls)
	src := alloc(t, p.ctxA, total)
	dst := alloc(t, p.ctxB, total)
	require.NoError(t, src.FillPattern(0, total, 0, 4096))
	start := time.Now()
	var reqs []*Request
	for off := int64(0); off < total; off += chunk {
		reqs = append(reqs, p.ba.TagRecv(dst, off, chunk, uint64(off/chunk), ^uint64(0)))
	}
	window := make(chan struct{}, 4)
	for off := int64(0); off < total; off += chunk {
		window <- struct{}{}
		s := p.ab.TagSend(src, off, chunk, uint64(off/chunk))
		go func() { <-s.Done(); <-window }()
		reqs = append(reqs, s)
	}
	waitAll(t, 60*time.Second, reqs...)
	elapsed := time.Since(start)
	t.Logf("512 MiB over shared memory in %v: %.2f GB/s", elapsed, float64(total)/elapsed.Seconds()/1e9)
	bad, err := dst.CheckPattern(0, total, 0, 4096)
	require.NoError(t, err)
	require.Equal(t, int64(-1), bad)
}

func TestUCX_RMAPutGet(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			const n = 6<<20 + 8
			local := alloc(t, p.ctxA, n)
			remote := alloc(t, p.ctxB, n)
			packed, err := remote.PackRemoteKey()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			rk, err := p.ab.UnpackRemoteKey(ctx, packed)
			require.NoError(t, err)
			defer rk.Close()
			require.NoError(t, local.FillPattern(0, n, 0, 5))
			waitAll(t, 10*time.Second, p.ab.Put(local, 0, n, remote.Addr(), rk))
			waitAll(t, 10*time.Second, p.ab.Flush())
			bad, _ := remote.CheckPattern(0, n, 0, 5)
			require.Equal(t, int64(-1), bad, "put")
			clear(local.Bytes())
			waitAll(t, 10*time.Second, p.ab.Get(local, 0, n, remote.Addr()+0, rk))
			bad, _ = local.CheckPattern(0, n, 0, 5)
			require.Equal(t, int64(-1), bad, "get")
			clear(local.Bytes())
			// A fenced get behind gets still in flight: every one completes, every byte lands.
			half := int64(n / 2)
			waitAll(t, 10*time.Second, p.ab.Get(local, 0, half, remote.Addr(), rk),
				p.ab.GetFenced(local, half, n-half, remote.Addr()+uint64(half), rk))
			bad, _ = local.CheckPattern(0, n, 0, 5)
			require.Equal(t, int64(-1), bad, "fenced get")
		})
	}
}

func TestUCX_CancelUnmatchedReceiveLeavesMemoryUntouched(t *testing.T) {
	p := newPair(t, transports[0].tls)
	dst := alloc(t, p.ctxB, 4096)
	src := alloc(t, p.ctxA, 4096)
	for i := range dst.Bytes() {
		dst.Bytes()[i] = 0xab
	}
	recv := p.ba.TagRecv(dst, 0, 4096, 9, ^uint64(0))
	require.True(t, recv.Cancel())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.ErrorIs(t, recv.Wait(ctx), ErrCancelled)
	// A late message with the same tag goes to UCX's unexpected queue, not into dst.
	require.NoError(t, src.FillPattern(0, 4096, 0, 1))
	waitAll(t, 5*time.Second, p.ab.TagSend(src, 0, 4096, 9))
	time.Sleep(20 * time.Millisecond)
	for i, b := range dst.Bytes() {
		require.Equal(t, byte(0xab), b, "byte %d", i)
	}
	drain := p.b.TagRecvBytes(nil, 4096, 9, ^uint64(0))
	waitAll(t, 5*time.Second, drain)
	require.Len(t, drain.Data(), 4096)
}

// L6: every UCX request is completed and freed exactly once, cancelled ones too. Cancels race
// with matching at random points; each request must report back once, and the worker's
// counters must balance: requests == callbacks == freed.
func TestL6_EveryRequestCompletedAndFreedOnce(t *testing.T) {
	p := newPair(t, transports[0].tls)
	const rounds, size = 300, 128 << 10
	src := alloc(t, p.ctxA, size)
	dst := alloc(t, p.ctxB, size)
	require.NoError(t, src.FillPattern(0, size, 0, 3))
	cancelled, completed := 0, 0
	for i := 0; i < rounds; i++ {
		recv := p.ba.TagRecv(dst, 0, size, 5, ^uint64(0))
		send := p.ab.TagSend(src, 0, size, 5)
		if i%3 != 0 {
			recv.Cancel()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := recv.Wait(ctx)
		if errors.Is(err, ErrCancelled) {
			cancelled++
			drain := p.ba.TagRecv(dst, 0, size, 5, ^uint64(0))
			require.NoError(t, drain.Wait(ctx))
		} else {
			require.NoError(t, err)
			completed++
		}
		require.NoError(t, send.Wait(ctx))
		cancel()
		bad, _ := dst.CheckPattern(0, size, 0, 3)
		require.Equal(t, int64(-1), bad, "round %d", i)
	}
	t.Logf("%d cancelled before matching, %d completed", cancelled, completed)
	for _, w := range []*Worker{p.a, p.b} {
		require.Eventually(t, func() bool { return w.Stats().Pending == 0 }, 5*time.Second, time.Millisecond)
		s := w.Stats()
		require.Equal(t, s.Requests, s.Callbacks, "%+v", s)
		require.Equal(t, s.Callbacks, s.Freed, "%+v", s)
	}
}

// An in-flight send cannot be cancelled; force-closing its endpoint completes it with an
// error, and the memory it pinned is released only then.
func TestUCX_ForceCloseCompletesInflightSend(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			src := alloc(t, p.ctxA, 8<<20)
			send := p.ab.TagSend(src, 0, 8<<20, 77) // nobody receives tag 77
			require.False(t, send.Cancel(), "a send is not cancellable")
			time.Sleep(20 * time.Millisecond)
			require.False(t, send.Completed())
			require.ErrorIs(t, src.Close(), ErrBusy, "memory under a pending send must not be released")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, p.ab.ForceClose(ctx))
			err := send.Wait(ctx)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrCancelled)
			t.Logf("send completed %v after force close: %v", time.Since(start), err)
			require.ErrorIs(t, p.ab.Err(), ErrClosed)
			// Anything posted on the closed endpoint fails at once.
			require.ErrorIs(t, p.ab.TagSend(src, 0, 8, 1).Wait(ctx), ErrClosed)
			require.Zero(t, src.InUse())
		})
	}
}

// The same with rendezvous sends on both versions (RendezvousScheme "am"): the 8 MiB send from
// a mapped region, contiguous or in IOV pieces, stays with the sender until a receive matches,
// and a forced close completes it with the close's error, its region then free. UCX 1.22 had
// never completed it: a send whose buffer UCX found registered by itself waits, once its
// endpoint fails, for an invalidation of that registration shared memory and TCP cannot do
// (kvx_ucx_tag_send_mapped; the IOV send was abandoned on 1.22 until it named the handle too).
func TestUCX_ForceCloseCompletesInflightRendezvousSend(t *testing.T) {
	sends := []struct {
		name string
		send func(ep *Endpoint, src *Memory) *Request
	}{
		{"contiguous", func(ep *Endpoint, src *Memory) *Request { return ep.TagSend(src, 0, 8<<20, 77) }},
		{"iov", func(ep *Endpoint, src *Memory) *Request {
			return ep.TagSendIOV(src, []Segment{{4 << 20, 4 << 20}, {0, 4 << 20}}, 77)
		}},
	}
	for _, tr := range transports {
		for _, sd := range sends {
			t.Run(tr.name+"/"+sd.name, func(t *testing.T) {
				p := newPairConfig(t, ContextConfig{TLS: tr.tls, RendezvousScheme: "am"})
				src := alloc(t, p.ctxA, 8<<20)
				send := sd.send(p.ab, src) // nobody receives tag 77
				// The marker behind it has arrived, so the send's rendezvous request has too.
				waitAll(t, time.Minute, p.ab.TagSendBytes([]byte("m"), 2), p.b.TagRecvBytes(nil, 8, 2, ^uint64(0)))
				require.False(t, send.Completed(), "a rendezvous send completed with no receive")
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				require.NoError(t, p.ab.ForceClose(ctx))
				err := send.Wait(ctx)
				require.ErrorIs(t, err, ErrCancelled)
				require.False(t, send.Abandoned(), "UCX kept the send after its endpoint closed")
				require.Zero(t, src.InUse())
			})
		}
	}
}

// A receive UCX matched when its peer's send stopped mid-message (the peer's engine closed:
// its endpoint force-closed as the message moved) fails when its endpoint is force-closed.
// ForceCloseDeparted, for a peer that said it sends nothing more, releases its memory at once,
// neither abandoned nor suspended; ForceClose, for a peer that may still write into it, keeps
// it pinned until the worker closes (Request.suspend). Shared memory only: the order
// ForceCloseDeparted relies on (one receive FIFO) holds there. The marker sent behind the
// rendezvous request proves the receive matched; the message (128 MiB over posix without cma,
// so its fragments are pushed by the sender's progress, not pulled by the receiver) is far
// from moved when the sender's close, a command away, cuts it.
func TestUCX_ForceCloseDepartedReleasesAReceiveMatchedMidMessage(t *testing.T) {
	const n = 128 << 20
	for _, tc := range []struct {
		name     string
		close    func(*Endpoint, context.Context) error
		released bool
	}{
		{"departed", (*Endpoint).ForceCloseDeparted, true},
		{"live", (*Endpoint).ForceClose, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var p *ucxPair
			var dst *Memory
			var recv *Request
			// A try whose whole message moved before the sender's close (a stall of the test's
			// goroutine on a loaded host) proves nothing: another, five at most.
			for try := 1; ; try++ {
				p = newPairConfig(t, ContextConfig{TLS: "posix,self"}) // no cma: the receiver cannot pull the message itself
				src := alloc(t, p.ctxA, n)
				var err error
				dst, err = p.ctxB.Allocate(n) // closed below: pinned until the worker closes on "live"
				require.NoError(t, err)
				recv = p.ba.TagRecv(dst, 0, n, 77, ^uint64(0))
				marker := p.b.TagRecvBytes(nil, 8, 2, ^uint64(0))
				send := p.ab.TagSend(src, 0, n, 77)
				require.NoError(t, p.ab.TagSendBytes([]byte("m"), 2).Wait(ctx))
				require.NoError(t, p.ab.ForceClose(ctx)) // the peer departs mid-message
				sendErr := send.Wait(ctx)
				require.NoError(t, marker.Wait(ctx), "the marker behind the rendezvous request")
				if sendErr != nil && !recv.Completed() {
					break
				}
				require.Less(t, try, 5, "all %d bytes moved before the sender's close in every try", n)
				t.Logf("try %d: the message moved before the sender's close (send: %v)", try, sendErr)
				_ = recv.Wait(ctx)
				require.NoError(t, dst.Close())
			}
			require.NoError(t, tc.close(p.ba, ctx))
			require.Error(t, recv.Wait(ctx), "the matched receive failed with its endpoint's close")
			if tc.released {
				require.Eventually(t, recv.Settled, 10*time.Second, time.Millisecond, "UCX let go of the receive")
				require.False(t, recv.Abandoned())
				require.Zero(t, dst.InUse(), "the receive's memory released")
			} else {
				require.True(t, recv.Abandoned(), "a live peer may still write into it: %v", recv.Err())
				require.NotZero(t, dst.InUse(), "the receive's memory stays pinned while the worker lives")
				require.ErrorIs(t, dst.Close(), ErrBusy)
			}
			require.NoError(t, p.b.Close())
			require.Zero(t, dst.InUse(), "nothing pinned once the worker closed")
			require.NoError(t, dst.Close())
		})
	}
}

// UCX 1.13 reports an endpoint's failure from inside the post that finds it (a TCP send that
// gets a connection reset): the endpoint is closed only once that post has returned, never
// under it, and then what was pending on it completes with the error.
func TestUCX_EndpointFailureInsidePostClosesAfterIt(t *testing.T) {
	p := newPair(t, "tcp,self")
	src := alloc(t, p.ctxA, 8<<20)
	send := p.ab.TagSend(src, 0, 8<<20, 77) // nobody receives tag 77
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var closingInside, failedInside, closingAfter bool
	require.NoError(t, p.a.call(ctx, func() {
		p.a.posting(func() {
			p.ab.reportError(endpointTimeoutStatus) // what kvxGoEndpointError does
			closingInside, failedInside = p.ab.closing, p.ab.Err() != nil
		})
		closingAfter = p.ab.closing
	}))
	require.False(t, closingInside, "the endpoint was closed inside the post")
	require.False(t, failedInside)
	require.True(t, closingAfter, "the failure was not delivered after the post")
	require.ErrorIs(t, p.ab.Err(), ErrPeerUnreachable)
	require.Error(t, send.Wait(ctx))
	select {
	case <-p.ab.closed:
	case <-ctx.Done():
		t.Fatal("the endpoint was not released")
	}
	require.Zero(t, src.InUse())
}

// Worker.Close with receives still posted: each completes, within the close bound.
func TestL11_WorkerCloseCompletesPendingReceives(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{CloseTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	m, err := c.Allocate(1 << 20)
	require.NoError(t, err)
	var reqs []*Request
	for i := 0; i < 10; i++ {
		reqs = append(reqs, w.TagRecv(m, int64(i)<<16, 1<<16, uint64(i), ^uint64(0)))
	}
	start := time.Now()
	require.NoError(t, w.Close())
	for _, r := range reqs {
		require.True(t, r.Completed())
		require.Error(t, r.Err())
	}
	require.Less(t, time.Since(start), 2*time.Second)
	require.ErrorIs(t, w.TagRecv(m, 0, 8, 1, 1).Err(), ErrClosed)
	require.NoError(t, m.Close())
	require.NoError(t, c.Close())
}

func TestUCX_InvalidRangesFailWithoutReachingUCX(t *testing.T) {
	p := newPair(t, transports[0].tls)
	m := alloc(t, p.ctxA, 1024)
	for _, tc := range []struct {
		desc string
		req  *Request
	}{
		{"offset past the end", p.ab.TagSend(m, 1025, 1, 1)},
		{"length past the end", p.ab.TagSend(m, 512, 513, 1)},
		{"negative offset", p.ba.TagRecv(m, -1, 8, 1, 1)},
		{"nil memory", p.ab.TagSend(nil, 0, 8, 1)},
		{"no segments", p.ab.TagSendIOV(m, nil, 1)},
		{"segment outside", p.ab.TagSendIOV(m, []Segment{{1000, 100}}, 1)},
		{"rkey of another endpoint", p.ab.Put(m, 0, 8, 0, &RemoteKey{ep: p.ba})},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			require.True(t, tc.req.Completed())
			require.ErrorIs(t, tc.req.Err(), ErrInvalidArgument)
		})
	}
	require.Zero(t, m.InUse())
}

// L2: nothing is freed while a reference or UCX can reach it. A context outlives its workers
// and memory; memory outlives the requests that use it.
func TestL2_NothingReleasedWhileInUse(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	m, err := c.Allocate(1 << 20)
	require.NoError(t, err)

	recv := w.TagRecv(m, 0, 1<<20, 42, ^uint64(0))
	for _, tc := range []struct {
		desc    string
		release func() error
	}{
		{"memory under a pending receive", m.Close},
		{"context with a worker and memory open", c.Close},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			require.ErrorIs(t, tc.release(), ErrBusy)
		})
	}
	require.Equal(t, 1, m.InUse())
	require.True(t, recv.Cancel())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.ErrorIs(t, recv.Wait(ctx), ErrCancelled)
	require.Zero(t, m.InUse())
	require.NoError(t, m.Close())
	require.ErrorIs(t, w.TagRecv(m, 0, 8, 1, 1).Err(), ErrClosed, "closed memory takes no new requests")
	require.ErrorIs(t, c.Close(), ErrBusy, "the worker is still open")
	require.NoError(t, w.Close())
	require.NoError(t, c.Close())
	_, err = c.NewWorker(WorkerConfig{})
	require.ErrorIs(t, err, ErrClosed)
}
