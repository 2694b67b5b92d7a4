// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// waker is how a worker's progress loop sleeps between rounds. Two ways, both through the
// runtime's poller (a Go timer cannot do the first: with every P idle the runtime waits for
// its next timer in epoll with a millisecond timeout, and the loop's 10 us first back-off
// slept about 1.1 ms on the 2-core VM; docs/benchmarks.md, "Per-request overhead"), so a
// sleeping loop holds no P the way a sleeping system call would:
//
//   - sleep: a wait on an epoll set of the loop's own (quiet) that holds a timerfd and an
//     eventfd: it ends when the timer expires, or at once when a command or Close writes the
//     eventfd (wake). The back-off of a worker UCX cannot wake, or whose arm said BUSY.
//   - sleepArmed: a wait on an epoll set that holds the same timerfd and eventfd and, given
//     to UCX as the worker's event fd (UCP_WORKER_PARAM_FIELD_EVENT_FD), UCX's own fds: after
//     ucp_worker_arm said OK it ends when a message lands or an operation completes, as well
//     as on the timer or a wake. The sleep of a worker UCX can wake.
//
// A wake writes the eventfd, not the timer: a timerfd re-armed to expire at once took 32-53 us
// inside timerfd_settime on the 2-core Firecracker VM (likely its LAPIC deadline timer, which
// the hypervisor traps), and every command to a sleeping worker paid it; the eventfd write
// takes about 1 us (BenchmarkWakerWake).
type waker struct {
	f        *os.File // the timerfd, non-blocking
	fd       int
	ev       int         // the eventfd a wake writes; the loop drains it before each sleep
	sleeping atomic.Bool // set by the loop before it looks for work, then sleeps
	woken    atomic.Bool // a wake wrote the eventfd since the loop last drained it

	quiet   *os.File // the timerfd and the eventfd: sleep's set
	quietfd int
	quietrc syscall.RawConn

	set   *os.File // the timerfd, the eventfd and UCX's fds (nil: UCX cannot wake the worker)
	setfd int
	setrc syscall.RawConn
	evs   [8]unix.EpollEvent // the loop's: what a look at a set returns

	mu     sync.Mutex // settime and write against close: never an fd number reused elsewhere
	closed bool
}

// newWaker makes a waker; with set, an epoll set too, for UCX to add its fds to (eventFD).
func newWaker(set bool) (*waker, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ucx worker: timerfd for the progress loop's sleep: %w", err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("ucx worker: eventfd for the progress loop's wake: %w", err)
	}
	k := &waker{f: os.NewFile(uintptr(fd), "kvx-worker-timer"), fd: fd, ev: ev, setfd: -1}
	quiet, rc, qfd, err := k.openSet()
	if err == nil {
		k.quiet, k.quietrc, k.quietfd = quiet, rc, qfd
		if set {
			k.set, k.setrc, k.setfd, err = k.openSet()
		}
	}
	if err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

// openSet makes an epoll set that holds the timerfd and the eventfd, in the runtime's poller.
func (k *waker) openSet() (*os.File, syscall.RawConn, int, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, nil, -1, fmt.Errorf("ucx worker: epoll set for the progress loop's sleep: %w", err)
	}
	// Level-triggered, as UCX adds its own: the set stays readable while the timer has
	// expired and nobody re-armed it, or a wake was not drained.
	for _, fd := range []int{k.fd, k.ev} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			_ = unix.Close(ep)
			return nil, nil, -1, fmt.Errorf("ucx worker: fd %d into a sleep's set: %w", fd, err)
		}
	}
	// Non-blocking, so that os.NewFile puts the set itself into the runtime's poller: an epoll
	// set is readable while anything in it is ready.
	if err := unix.SetNonblock(ep, true); err != nil {
		_ = unix.Close(ep)
		return nil, nil, -1, fmt.Errorf("ucx worker: a sleep's set: %w", err)
	}
	f := os.NewFile(uintptr(ep), "kvx-worker-wakeup")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, nil, -1, fmt.Errorf("ucx worker: a sleep's set: %w", err)
	}
	return f, rc, ep, nil
}

// eventFD is the epoll set UCX is to add its fds to, or -1 without one.
func (k *waker) eventFD() int { return k.setfd }

// dropSet (the loop, when UCX would not take the set) closes the set: the worker sleeps on
// its quiet set alone.
func (k *waker) dropSet() {
	if k.set != nil {
		_ = k.set.Close()
		k.set, k.setfd, k.setrc = nil, -1, nil
	}
}

// arm sets the timer to expire after d (d <= 0: at once). A new setting also clears an
// expiry nobody read, so a set that was readable for the last timer is no longer.
func (k *waker) arm(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(d.Nanoseconds(), 1))}
		_ = unix.TimerfdSettime(k.fd, 0, &spec, nil)
	}
}

// wake (any goroutine, after queueing a command or closing stopReq) ends the loop's sleep if
// it sleeps, by writing the eventfd once per sleep. A wake that races the loop's drain costs
// at most one early end of a sleep, never a lost command: the loop looks for work after it
// drains and each time it wakes.
func (k *waker) wake() {
	if !k.sleeping.Load() || !k.woken.CompareAndSwap(false, true) {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		one := [8]byte{1} // an eventfd adds the host-order uint64 written; any non-zero will do
		_, _ = unix.Write(k.ev, one[:])
	}
}

// begin (the loop, about to sleep) marks it asleep, drains the wakes of earlier sleeps and
// arms the timer. Asleep first: a command queued after the drain either saw it asleep and
// wrote the eventfd again, or is seen by idle.
func (k *waker) begin(d time.Duration) {
	k.sleeping.Store(true)
	k.woken.Store(false)
	var b [8]byte
	_, _ = unix.Read(k.ev, b[:]) // EAGAIN when nobody woke it: nothing to drain
	k.arm(d)
}

// sleep (the loop) waits up to d, unless idle reports there is work after all, or until
// wake.
func (k *waker) sleep(d time.Duration, idle func() bool) {
	k.begin(d)
	if idle() {
		k.wait(k.quietrc, k.quietfd)
	}
	k.sleeping.Store(false)
}

// sleepArmed (the loop, after ucp_worker_arm returned UCS_OK) waits up to d, unless idle
// reports there is work after all, until wake, or until one of UCX's fds in the set is
// ready: a message landed, an operation completed, UCX's keepalive is due.
func (k *waker) sleepArmed(d time.Duration, idle func() bool) {
	k.begin(d)
	if idle() {
		k.wait(k.setrc, k.setfd)
	}
	k.sleeping.Store(false)
}

// wait parks in the runtime's poller until the set fd (read through rc) is ready. The poller
// reports the set by edges; the look before each park sees what is ready already, so nothing
// that came before the park is slept through.
func (k *waker) wait(rc syscall.RawConn, fd int) {
	_ = rc.Read(func(uintptr) bool {
		n, err := unix.EpollWait(fd, k.evs[:], 0)
		return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
	})
}

func (k *waker) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		_ = k.f.Close()
		_ = unix.Close(k.ev)
		if k.quiet != nil {
			_ = k.quiet.Close()
		}
		if k.set != nil {
			_ = k.set.Close()
		}
	}
}
