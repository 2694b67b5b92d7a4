// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// Tags of ucxpeer's protocol (native/internal/ucxpeer).
const (
	peerTagBase = uint64(0x4b58) << 48
	peerAckTag  = peerTagBase | 0xffffffff
)

// localEngine is this process's side: a context, a worker and an endpoint to the peer.
type localEngine struct {
	ctx *Context
	w   *Worker
	ep  *Endpoint
}

func newLocal(t testing.TB, tls string, peer *peerproc.Proc) *localEngine {
	t.Helper()
	cfg := ContextConfig{TLS: tls, KeepaliveInterval: 200 * time.Millisecond}
	if strings.Contains(tls, "tcp") {
		cfg.NetDevices = "lo"
	}
	uc, err := NewContext(cfg)
	require.NoError(t, err)
	w, err := uc.NewWorker(WorkerConfig{CloseTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, err := hex.DecodeString(peer.Addr)
	require.NoError(t, err)
	ep, err := w.Connect(ctx, addr)
	require.NoError(t, err)
	peer.Connect(t, hex.EncodeToString(w.Address()))
	l := &localEngine{ctx: uc, w: w, ep: ep}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = ep.ForceClose(cctx)
		require.NoError(t, w.Close())
		require.NoError(t, uc.Close())
	})
	return l
}

func peerArgsFor(tls string, extra ...string) []string {
	args := []string{"-tls", tls}
	if strings.Contains(tls, "tcp") {
		args = append(args, "-net-devices", "lo")
	}
	return append(args, extra...)
}

// Two processes, each direction, every byte checked by the receiver.
func TestUCX_TwoProcessesEveryByteChecked(t *testing.T) {
	const total, chunk = 64 << 20, 4 << 20
	bin := peerproc.Build(t)
	for _, tr := range transports {
		for _, dir := range []string{"to-peer", "from-peer"} {
			t.Run(tr.name+"/"+dir, func(t *testing.T) {
				mode := "sink"
				if dir == "from-peer" {
					mode = "source"
				}
				peer := peerproc.Start(t, bin, peerArgsFor(tr.tls, "-mode", mode, "-total", strconv.Itoa(total),
					"-chunk", strconv.Itoa(chunk), "-seed", "11", "-report", "1000")...)
				l := newLocal(t, tr.tls, peer)
				mem := alloc(t, l.ctx, total)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var reqs []*Request
				if mode == "sink" {
					require.NoError(t, mem.FillPattern(0, total, 0, 11))
					ack := l.w.TagRecvBytes(l.ep, 256, peerAckTag, ^uint64(0))
					for i := int64(0); i < total/chunk; i++ {
						reqs = append(reqs, l.ep.TagSend(mem, i*chunk, chunk, peerTagBase|uint64(i)))
					}
					waitAll(t, 30*time.Second, reqs...)
					require.NoError(t, ack.Wait(ctx))
					require.Equal(t, "OK", string(ack.Data()), "the peer checked every byte")
				} else {
					for i := int64(0); i < total/chunk; i++ {
						reqs = append(reqs, l.ep.TagRecv(mem, i*chunk, chunk, peerTagBase|uint64(i), ^uint64(0)))
					}
					waitAll(t, 30*time.Second, reqs...)
					bad, err := mem.CheckPattern(0, total, 0, 11)
					require.NoError(t, err)
					require.Equal(t, int64(-1), bad)
					require.NoError(t, l.ep.TagSendBytes([]byte("OK"), peerAckTag).Wait(ctx))
				}
				require.Equal(t, "OK", peer.Expect(t, "DONE ", 10*time.Second))
			})
		}
	}
}

// requireAllTerminal checks that every request completed within bound of start, each with an
// error that names a peer failure or a cancel, never success into a dead peer's memory.
func requireAllTerminal(t *testing.T, reqs []*Request, start time.Time, bound time.Duration) (ok, failed, abandoned int) {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(bound))
	defer cancel()
	for i, r := range reqs {
		err := r.Wait(ctx)
		require.False(t, errors.Is(err, ErrTimeout), "request %d still pending %v after the peer stopped", i, bound)
		if err == nil {
			ok++
			continue
		}
		failed++
		if r.Abandoned() {
			abandoned++
		}
		require.True(t, errors.Is(err, ErrPeerUnreachable) || errors.Is(err, ErrCancelled) || errors.Is(err, ErrClosed),
			"request %d: %v", i, err)
	}
	return ok, failed, abandoned
}

// requireReleasedAfterClose checks L2 at the end of a failure test: memory that abandoned
// requests pin is still pinned while the worker lives, and free once it is closed.
func requireReleasedAfterClose(t *testing.T, l *localEngine, mem *Memory, abandoned int) {
	t.Helper()
	// UCX may still let go of some abandoned requests late, so at most that many pins remain.
	require.LessOrEqual(t, mem.InUse(), abandoned, "only abandoned requests may still pin memory")
	// Destroying a worker with hundreds of abandoned requests can outlast Close's wait on a
	// loaded host; the worker goes on stopping, and Close waits again (three times at most).
	err := l.w.Close()
	for i := 0; i < 2 && errors.Is(err, ErrTimeout); i++ {
		t.Logf("worker still stopping: %v; waiting again", err)
		err = l.w.Close()
	}
	require.NoError(t, err)
	require.Zero(t, mem.InUse())
	require.NoError(t, mem.Close())
}

// A peer killed with SIGKILL mid-transfer: UCX's keepalive (or the broken connection) fails
// the endpoint, and every request on the survivor, sends and receives, completes with an
// error within the bound, none abandoned: a dead process touches no memory, so the survivor's
// memory is free again once its requests ended, with the worker still open. Over shared memory
// the survivor's sends fill the dead peer's receive FIFO, and UCX used to keep most of them
// (250 of 256 abandoned) until the worker closed: Endpoint.releaseDeadPeerFIFO empties the
// FIFO once the process is gone (docs/ucx.md, "Sends to a killed shared-memory peer").
//
// Over TCP the survivor's sends are what used to abort it: UCX completes a zero-copy send
// twice when the socket write under it fails (UCX 1.13 asserted `comp->count > 0` in
// uct_tcp_ep_sendv, in some runs of a batch), so NewContext turns TCP zero-copy off
// (docs/ucx.md, "TCP without zero-copy"); TestUCX_TCPNeverSendsZeroCopy checks the setting.
func TestUCX_PeerKilledMidTransfer(t *testing.T) {
	const chunk, count = 4 << 20, 256 // 1 GiB: far more than moves before the kill
	const bound = 5 * time.Second
	bin := peerproc.Build(t)
	for _, tr := range transports {
		for _, dir := range []string{"survivor-sends", "survivor-receives"} {
			t.Run(tr.name+"/"+dir, func(t *testing.T) {
				mode := "sink"
				if dir == "survivor-receives" {
					mode = "source"
				}
				peer := peerproc.Start(t, bin, peerArgsFor(tr.tls, "-mode", mode, "-total", strconv.Itoa(chunk*count),
					"-chunk", strconv.Itoa(chunk), "-window", "4", "-check=false")...)
				l := newLocal(t, tr.tls, peer)
				mem, err := l.ctx.Allocate(chunk * 8)
				require.NoError(t, err)
				var reqs []*Request
				for i := 0; i < count; i++ {
					off := int64(i%8) * chunk
					if mode == "sink" {
						reqs = append(reqs, l.ep.TagSend(mem, off, chunk, peerTagBase|uint64(i)))
					} else {
						reqs = append(reqs, l.ep.TagRecv(mem, off, chunk, peerTagBase|uint64(i), ^uint64(0)))
					}
				}
				peer.WaitGot(t, 2, 20*time.Second)
				peer.Signal(t, syscall.SIGKILL)
				start := time.Now()
				ok, failed, abandoned := requireAllTerminal(t, reqs, start, bound)
				t.Logf("after SIGKILL: %d requests completed, %d failed (%d abandoned by UCX), all within %v",
					ok, failed, abandoned, time.Since(start))
				require.Greater(t, failed, 0)
				select {
				case <-l.ep.Failed():
				case <-time.After(bound):
					t.Fatal("endpoint not failed after its peer was killed")
				}
				require.Error(t, l.ep.Err())
				require.Zero(t, abandoned, "a dead peer holds nothing: UCX ends every request on its endpoint")
				require.Zero(t, mem.InUse(), "memory still pinned with every request ended")
				requireReleasedAfterClose(t, l, mem, abandoned)
			})
		}
	}
}

// A peer frozen with SIGSTOP never fails its connection: keepalive sees a live process. The
// survivor notices that nothing progresses, force-closes the endpoint, and every request
// completes within the bound. After SIGCONT, nothing the peer sends lands in memory whose
// receives were cancelled.
func TestUCX_PeerFrozenThenResumed(t *testing.T) {
	const chunk, count = 1 << 20, 64
	const bound = 5 * time.Second
	bin := peerproc.Build(t)
	for _, tr := range transports {
		for _, dir := range []string{"survivor-sends", "survivor-receives"} {
			t.Run(tr.name+"/"+dir, func(t *testing.T) {
				mode := "sink"
				if dir == "survivor-receives" {
					mode = "source"
				}
				// The peer moves only 8 chunks, then waits: the survivor posts more than that,
				// so some of its requests are certainly pending when the peer freezes.
				peer := peerproc.Start(t, bin, peerArgsFor(tr.tls, "-mode", mode, "-total", strconv.Itoa(chunk*count),
					"-chunk", strconv.Itoa(chunk), "-window", "2", "-check=false")...)
				l := newLocal(t, tr.tls, peer)
				mem, err := l.ctx.Allocate(chunk * count)
				require.NoError(t, err)
				const sentinel = 0xee
				for i := range mem.Bytes() {
					mem.Bytes()[i] = sentinel
				}
				var reqs []*Request
				post := func(from, to int) {
					for i := from; i < to; i++ {
						if mode == "sink" {
							reqs = append(reqs, l.ep.TagSend(mem, int64(i)*chunk, chunk, peerTagBase|uint64(i)))
						} else {
							reqs = append(reqs, l.ep.TagRecv(mem, int64(i)*chunk, chunk, peerTagBase|uint64(i), ^uint64(0)))
						}
					}
				}
				// Frozen mid-transfer: the first chunks move, the rest are posted once the peer
				// is stopped. (Posted all at once, the sends can all complete before the freeze:
				// UCX 1.13 sends 1 MiB over shared memory with peer error handling as 8 KiB
				// pieces, which a peer that polls promptly takes into its unexpected queue; a
				// peer woken by UCX's event fd did, in one run of three under -race.)
				post(0, 2)
				peer.WaitGot(t, 1, 20*time.Second)
				peer.Signal(t, syscall.SIGSTOP)
				post(2, count)
				// The survivor's progress deadline: nothing completes for a while.
				time.Sleep(300 * time.Millisecond)
				pending := 0
				for _, r := range reqs {
					if !r.Completed() {
						pending++
					}
				}
				require.Greater(t, pending, 0, "the frozen peer cannot have taken everything")
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				defer cancel()
				start := time.Now()
				require.NoError(t, l.ep.ForceClose(ctx))
				ok, failed, abandoned := requireAllTerminal(t, reqs, start, bound)
				t.Logf("frozen peer, force close: %d completed, %d failed (%d abandoned by UCX), all within %v",
					ok, failed, abandoned, time.Since(start))
				require.LessOrEqual(t, mem.InUse(), abandoned)

				peer.Signal(t, syscall.SIGCONT)
				time.Sleep(500 * time.Millisecond) // let the peer send whatever it still would
				if mode == "source" {
					for i, r := range reqs {
						if r.Err() == nil || r.Abandoned() {
							// Completed before the freeze (holds data), or abandoned: its memory
							// stays pinned, never released, so UCX may still finish it.
							continue
						}
						b := mem.Bytes()[int64(i)*chunk : int64(i+1)*chunk]
						for j, v := range b {
							if v != sentinel {
								t.Fatalf("chunk %d, cancelled at %v, was written at byte %d after SIGCONT", i, r.Err(), j)
							}
						}
					}
				}
				requireReleasedAfterClose(t, l, mem, abandoned)
			})
		}
	}
}

// A peer frozen with SIGSTOP and then killed, as a supervisor ends a hung process: the
// survivor's forced close left the sends that wait behind the frozen peer's full FIFO with UCX
// (abandoned, their memory pinned: the peer might resume and read its FIFO), and once the
// process is gone the worker empties that FIFO, UCX lets go of them and the memory is free
// again with the worker open. Over shared memory only (a TCP flush cancels what it holds), over
// each transport UCX may give the endpoint's active messages: posix, and sysv (UCX's choice
// where UCX_TLS leaves it in).
func TestUCX_PeerFrozenThenKilledLetsGoOfItsSends(t *testing.T) {
	const chunk, count = 128 << 10, 600 // rendezvous sends, more than a FIFO of 256 holds
	bin := peerproc.Build(t)
	for _, tls := range []string{"posix,cma,self", "sysv,cma,self"} {
		t.Run(strings.SplitN(tls, ",", 2)[0], func(t *testing.T) {
			peer := peerproc.Start(t, bin, peerArgsFor(tls, "-mode", "sink", "-total", strconv.Itoa(chunk*count),
				"-chunk", strconv.Itoa(chunk), "-window", "2", "-check=false")...)
			l := newLocal(t, tls, peer)
			mem, err := l.ctx.Allocate(chunk * 8)
			require.NoError(t, err)
			var reqs []*Request
			post := func(from, to int) {
				for i := from; i < to; i++ {
					reqs = append(reqs, l.ep.TagSend(mem, int64(i%8)*chunk, chunk, peerTagBase|uint64(i)))
				}
			}
			post(0, 2)
			peer.WaitGot(t, 1, 20*time.Second)
			peer.Signal(t, syscall.SIGSTOP)
			post(2, count)
			time.Sleep(300 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, l.ep.ForceClose(ctx))
			ok, failed, abandoned := requireAllTerminal(t, reqs, start, 5*time.Second)
			t.Logf("frozen peer, force close: %d completed, %d failed (%d abandoned by UCX); %d pinned", ok, failed, abandoned, mem.InUse())
			if abandoned == 0 {
				t.Skip("UCX ended every send at the forced close: nothing waits behind the frozen peer's FIFO")
			}
			require.Positive(t, mem.InUse(), "an abandoned send pins its memory while the peer may resume")

			peer.Signal(t, syscall.SIGKILL)
			killed := time.Now()
			require.Eventually(t, func() bool { return mem.InUse() == 0 }, 10*time.Second, 10*time.Millisecond,
				"memory still pinned by sends to a dead peer: %d", mem.InUse())
			t.Logf("every send let go of %v after the kill", time.Since(killed).Round(time.Millisecond))
			for i, r := range reqs {
				require.True(t, r.Settled(), "request %d not settled", i)
			}
			requireReleasedAfterClose(t, l, mem, 0)
		})
	}
}
