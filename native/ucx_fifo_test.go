// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fifoClaimerEnv carries to TestFIFOClaimerChild the FIFO to claim an element of and what to do
// then: "SEGMENT SIZE ELEMSIZE die" or "SEGMENT SIZE ELEMSIZE stop", where SEGMENT is a posix
// segment's path or "sysv:SHMID".
const fifoClaimerEnv = "KVX_FIFO_CLAIMER"

// TestFIFOClaimerChild is the child side of TestL12_UCXWorkerReadsOnPastAnElementADeadWriterLeft:
// a writer of a worker's shared-memory receive FIFO that claims an element as UCX's writers do
// (moving the head past it, uct_mm_ep_get_remote_elem) and then dies before writing it ("die"),
// or is stopped there ("stop") and, once continued, writes it as an empty message.
func TestFIFOClaimerChild(t *testing.T) {
	v, ok := os.LookupEnv(fifoClaimerEnv)
	if !ok {
		t.Skip("run by TestL12_UCXWorkerReadsOnPastAnElementADeadWriterLeft only")
	}
	f := strings.Fields(v)
	require.Len(t, f, 4)
	size, err := strconv.ParseUint(f[1], 10, 64)
	require.NoError(t, err)
	elem, err := strconv.ParseUint(f[2], 10, 64)
	require.NoError(t, err)
	var b []byte
	if id, ok := strings.CutPrefix(f[0], "sysv:"); ok {
		shmid, err := strconv.Atoi(id)
		require.NoError(t, err)
		b, err = unix.SysvShmAttach(shmid, 0, 0)
		require.NoError(t, err)
	} else {
		file, err := os.OpenFile(f[0], os.O_RDWR, 0)
		require.NoError(t, err)
		fi, err := file.Stat()
		require.NoError(t, err)
		b, err = syscall.Mmap(int(file.Fd()), 0, int(fi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		require.NoError(t, err)
	}
	headp := (*uint64)(unsafe.Pointer(&b[0]))
	const armed = uint64(1) << 63
	var idx uint64
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "no claim")
		h := atomic.LoadUint64(headp)
		idx = h &^ armed
		if atomic.CompareAndSwapUint64(headp, h, idx+1) {
			break
		}
	}
	fmt.Printf("CLAIMED %d\n", idx)
	if f[3] == "die" {
		os.Exit(0) // its mapping goes with it; the element stays claimed and unwritten
	}
	// Stopped by a signal to this thread: one to the process may be taken by another thread,
	// and this one would run on into the write before the stop reached it.
	runtime.LockOSThread()
	require.NoError(t, syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP))
	e := b[192+(idx&(size-1))*elem:]
	e[1], e[2], e[3] = fifoFillAMID, 0, 0
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&e[0])), uint32(e[0]&^3|2|byte(idx/size&1))|uint32(e[1])<<8)
	fmt.Println("WROTE")
}

// startFIFOClaimer runs TestFIFOClaimerChild against w's own FIFO of transport (posix or
// sysv) and waits for its claim.
func startFIFOClaimer(t *testing.T, w *Worker, transport, mode string) *exec.Cmd {
	t.Helper()
	var segment string
	if transport == "sysv" {
		seg, ok := findSysvFIFO(w.Address(), mustHaveName(t, w.Address()))
		require.True(t, ok)
		segment = fmt.Sprintf("sysv:%d", seg.shmid)
	} else {
		seg, ok := findPosixFIFO(w.Address(), mustHaveName(t, w.Address()))
		require.True(t, ok)
		segment = seg.path()
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFIFOClaimerChild$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %s", fifoClaimerEnv, segment, shmFIFOSize(), shmFIFOElemSize(), mode))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the claimer ended before its claim")
			if strings.HasPrefix(l, "CLAIMED ") {
				if mode == "die" {
					require.NoError(t, cmd.Wait())
				}
				go func() {
					for range lines {
					}
				}()
				return cmd
			}
		case <-deadline:
			t.Fatal("no claim in 30 s")
		}
	}
}

// TestL12_UCXWorkerReadsOnPastAnElementADeadWriterLeft: a local writer killed between claiming
// an element of a worker's shared-memory receive FIFO and writing it used to wedge the worker
// for good: it reads in order and waited at that element, so no message from anyone arrived
// over shared memory again (docs/ucx.md, "A killed local peer can wedge the survivor's
// shared-memory receive queue"). The worker now writes such an element itself once it has
// stayed unwritten for fifoStuckAfter with no process that maps the FIFO paused, and the
// message sent after it arrives. A writer that is stopped (it may resume and write) is left
// alone: nothing arrives while it is stopped, everything once it has written.
func TestL12_UCXWorkerReadsOnPastAnElementADeadWriterLeft(t *testing.T) {
	for _, c := range []struct{ transport, mode string }{{"posix", "die"}, {"posix", "stop"}, {"sysv", "die"}, {"sysv", "stop"}} {
		mode := c.mode
		t.Run(c.transport+"/"+mode, func(t *testing.T) {
			p := newPairConfig(t, ContextConfig{TLS: c.transport + ",self"})
			if _, ok := findPosixFIFO(p.b.Address(), mustHaveName(t, p.b.Address())); !ok && c.transport == "posix" {
				t.Skip("this UCX names its posix FIFO without procfs (UCX_POSIX_USE_PROC_LINK=n)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The pair talks before the claim: the FIFO is in use, its head past 0.
			warm := p.b.TagRecvBytes(p.ba, 64, 1, ^uint64(0))
			require.NoError(t, p.ab.TagSendBytes([]byte("warm"), 1).Wait(ctx))
			require.NoError(t, warm.Wait(ctx))

			claimer := startFIFOClaimer(t, p.b, c.transport, mode)
			sent := time.Now()
			recv := p.b.TagRecvBytes(p.ba, 64, 2, ^uint64(0))
			require.NoError(t, p.ab.TagSendBytes([]byte("after the claim"), 2).Wait(ctx))
			if mode == "stop" {
				time.Sleep(fifoStuckAfter + 1500*time.Millisecond)
				require.False(t, recv.Completed(), "the worker wrote an element a stopped writer may still write (fills %d)", p.b.fifoFills.Load())
				require.Zero(t, p.b.fifoFills.Load())
				require.NoError(t, claimer.Process.Signal(syscall.SIGCONT))
			}
			require.NoError(t, recv.Wait(ctx), "the message sent after the claimed element")
			require.Equal(t, "after the claim", string(recv.Data()))
			t.Logf("%s: arrived %v after it was sent", mode, time.Since(sent).Round(time.Millisecond))
			want := uint64(0)
			if mode == "die" {
				want = 1
			}
			require.Equal(t, want, p.b.fifoFills.Load())
			// And the FIFO goes on working.
			again := p.b.TagRecvBytes(p.ba, 64, 3, ^uint64(0))
			require.NoError(t, p.ab.TagSendBytes([]byte("again"), 3).Wait(ctx))
			require.NoError(t, again.Wait(ctx))
		})
	}
}
