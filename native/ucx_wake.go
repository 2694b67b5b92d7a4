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
//   - sleep: a read of a timerfd, which ends when the timer expires, or at once when a command
//     or Close re-arms it to expire now (wake). The back-off of a worker UCX cannot wake.
//   - sleepArmed: a wait on an epoll set that holds the same timerfd and, given to UCX as the
//     worker's event fd (UCP_WORKER_PARAM_FIELD_EVENT_FD), UCX's own fds: after
//     ucp_worker_arm said OK it ends when a message lands or an operation completes, as well
//     as on the timer or a wake. The sleep of a worker UCX can wake.
type waker struct {
	f        *os.File // the timerfd, non-blocking: reads park in the poller
	fd       int
	sleeping atomic.Bool // set by the loop before it looks for work, then sleeps

	set   *os.File // the epoll set (nil: the worker cannot be woken by UCX)
	setfd int
	setrc syscall.RawConn
	evs   [8]unix.EpollEvent // the loop's: what a look at the set returns

	mu     sync.Mutex // settime against close: never an fd number reused elsewhere
	closed bool
}

// newWaker makes a waker; with set, an epoll set too, for UCX to add its fds to (eventFD).
func newWaker(set bool) (*waker, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ucx worker: timerfd for the progress loop's sleep: %w", err)
	}
	k := &waker{f: os.NewFile(uintptr(fd), "kvx-worker-timer"), fd: fd, setfd: -1}
	if set {
		if err := k.openSet(); err != nil {
			_ = k.f.Close()
			return nil, err
		}
	}
	return k, nil
}

func (k *waker) openSet() error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("ucx worker: epoll set for UCX's wakeup: %w", err)
	}
	// Level-triggered, as UCX adds its own: the set stays readable while the timer has
	// expired and nobody re-armed it.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(k.fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, k.fd, &ev); err != nil {
		_ = unix.Close(ep)
		return fmt.Errorf("ucx worker: timerfd into the wakeup set: %w", err)
	}
	// Non-blocking, so that os.NewFile puts the set itself into the runtime's poller: an epoll
	// set is readable while anything in it is ready.
	if err := unix.SetNonblock(ep, true); err != nil {
		_ = unix.Close(ep)
		return fmt.Errorf("ucx worker: wakeup set: %w", err)
	}
	f := os.NewFile(uintptr(ep), "kvx-worker-wakeup")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("ucx worker: wakeup set: %w", err)
	}
	k.set, k.setfd, k.setrc = f, ep, rc
	return nil
}

// eventFD is the epoll set UCX is to add its fds to, or -1 without one.
func (k *waker) eventFD() int { return k.setfd }

// dropSet (the loop, when UCX would not take the set) closes the set: the worker sleeps on
// the timer alone.
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
// it sleeps. A wake that races the loop's own arm costs at most that sleep, never a lost
// command: the loop looks for work each time it wakes.
func (k *waker) wake() {
	if k.sleeping.Load() {
		k.arm(0)
	}
}

// sleep (the loop) waits up to d, unless idle reports there is work after all, or until
// wake.
func (k *waker) sleep(d time.Duration, idle func() bool) {
	k.sleeping.Store(true)
	k.arm(d)
	if idle() {
		var b [8]byte
		_, _ = k.f.Read(b[:]) // parks in the poller until the timer expires
	}
	k.sleeping.Store(false)
}

// sleepArmed (the loop, after ucp_worker_arm returned UCS_OK) waits up to d, unless idle
// reports there is work after all, until wake, or until one of UCX's fds in the set is
// ready: a message landed, an operation completed, UCX's keepalive is due.
func (k *waker) sleepArmed(d time.Duration, idle func() bool) {
	k.sleeping.Store(true)
	k.arm(d)
	if idle() {
		// The runtime's poller reports the set by edges; the look before each park sees what
		// is ready already, so nothing that came before the park is slept through.
		_ = k.setrc.Read(func(uintptr) bool {
			n, err := unix.EpollWait(k.setfd, k.evs[:], 0)
			return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
		})
	}
	k.sleeping.Store(false)
}

func (k *waker) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		_ = k.f.Close()
		if k.set != nil {
			_ = k.set.Close()
		}
	}
}
