// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// waker is how a worker's progress loop sleeps between rounds: on a timerfd read through the
// runtime's poller, so the sleep ends when asked (a Go timer cannot: with every P idle the
// runtime waits for its next timer in epoll with a millisecond timeout, and the loop's 10 us
// first back-off slept about 1.1 ms on the 2-core VM, so a control message to an idle worker
// waited that long before anybody looked; docs/benchmarks.md, "Per-request overhead"), without
// holding a P the way a sleeping system call would, and ends at once when a command or Close
// re-arms the timer to expire now.
type waker struct {
	f        *os.File // the timerfd, non-blocking: reads park in the poller
	fd       int
	sleeping atomic.Bool // set by the loop before it looks for work, then sleeps

	mu     sync.Mutex // settime against close: never an fd number reused elsewhere
	closed bool
}

func newWaker() (*waker, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ucx worker: timerfd for the progress loop's sleep: %w", err)
	}
	return &waker{f: os.NewFile(uintptr(fd), "kvx-worker-timer"), fd: fd}, nil
}

// arm sets the timer to expire after d (d <= 0: at once).
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

func (k *waker) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		_ = k.f.Close()
	}
}
