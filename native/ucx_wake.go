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
//   - sleep: a wait on an epoll set of a timerfd and an eventfd (own), which ends when the
//     timer expires, or at once when a command or Close writes the eventfd (wake). The
//     back-off of a worker UCX cannot wake.
//   - sleepArmed: a wait on an epoll set that holds the same two and, given to UCX as the
//     worker's event fd (UCP_WORKER_PARAM_FIELD_EVENT_FD), UCX's own fds: after
//     ucp_worker_arm said OK it ends when a message lands or an operation completes, as well
//     as on the timer or a wake. The sleep of a worker UCX can wake.
//
// A wake writes the eventfd rather than re-arming the timer to expire now: on the 2-core
// Firecracker VM the re-arm held its caller 31-34 us at the median and woke the loop after
// 51-68 us, the write 8 us and 14 us (docs/benchmarks.md, "Where a one-block request's time
// goes on this VM"); the caller is an engine's loop, whose request waits meanwhile.
type waker struct {
	f        *os.File // the timerfd, non-blocking
	fd       int
	ev       int         // the eventfd, non-blocking: a wake writes it, each sleep drains it
	sleeping atomic.Bool // set by the loop before it looks for work, then sleeps
	held     atomic.Bool // the loop holds an unexpected message this sleep (wakeForReceive)
	armed    atomic.Bool // sleeping in sleepArmed: UCX's fds can end this sleep
	woken    atomic.Bool // a wake wrote the eventfd since the loop began this sleep
	wakes    atomic.Uint64

	own waitSet            // the timer and the eventfd
	set waitSet            // the same and UCX's fds (setfd -1: the worker cannot be woken by UCX)
	evs [8]unix.EpollEvent // the loop's: what a look at a set returns
	nev int                // how many of evs the last look filled

	mu     sync.Mutex // settime and the eventfd's write against close: never an fd number reused elsewhere
	closed bool
}

// waitSet is an epoll set in the runtime's poller.
type waitSet struct {
	f     *os.File
	setfd int
	setrc syscall.RawConn
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
	k := &waker{f: os.NewFile(uintptr(fd), "kvx-worker-timer"), fd: fd, ev: ev, set: waitSet{setfd: -1}}
	if k.own, err = k.openSet("kvx-worker-sleep"); err == nil && set {
		k.set, err = k.openSet("kvx-worker-wakeup")
	}
	if err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

// openSet makes an epoll set of the timer and the eventfd.
func (k *waker) openSet(name string) (waitSet, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return waitSet{setfd: -1}, fmt.Errorf("ucx worker: epoll set for the loop's sleep: %w", err)
	}
	// Level-triggered, as UCX adds its own: the set stays readable while the timer has
	// expired and nobody re-armed it, or a wake is not drained.
	for _, fd := range []int{k.fd, k.ev} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			_ = unix.Close(ep)
			return waitSet{setfd: -1}, fmt.Errorf("ucx worker: timerfd and eventfd into the sleep's set: %w", err)
		}
	}
	// Non-blocking, so that os.NewFile puts the set itself into the runtime's poller: an epoll
	// set is readable while anything in it is ready.
	if err := unix.SetNonblock(ep, true); err != nil {
		_ = unix.Close(ep)
		return waitSet{setfd: -1}, fmt.Errorf("ucx worker: sleep's set: %w", err)
	}
	f := os.NewFile(uintptr(ep), name)
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return waitSet{setfd: -1}, fmt.Errorf("ucx worker: sleep's set: %w", err)
	}
	return waitSet{f: f, setfd: ep, setrc: rc}, nil
}

// eventFD is the epoll set UCX is to add its fds to, or -1 without one.
func (k *waker) eventFD() int { return k.set.setfd }

// dropSet (the loop, when UCX would not take the set) closes the set: the worker sleeps on
// the timer and its wakes alone.
func (k *waker) dropSet() {
	if k.set.f != nil {
		_ = k.set.f.Close()
		k.set = waitSet{setfd: -1}
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
// it sleeps. A wake that races the loop's going to sleep costs at most a round, never a lost
// command: the loop looks for work after it marks itself asleep and each time it wakes. Only
// the first wake of a sleep writes the eventfd: the write costs its caller a system call (1-2
// us on the 2-core VM) and wakes a thread, and a command queued while that wake is on its way
// runs with the first, since the loop runs every queued command when it wakes.
func (k *waker) wake() {
	if k.sleeping.Load() && k.woken.CompareAndSwap(false, true) {
		k.mu.Lock()
		defer k.mu.Unlock()
		if !k.closed {
			k.wakes.Add(1)
			one := [8]byte{1}
			_, _ = unix.Write(k.ev, one[:])
		}
	}
}

// wakeForReceive (any goroutine, after queueing a receive's post) ends the loop's sleep only
// if the loop holds an unexpected message, which the receive may match at once. Otherwise the
// post waits in the queue: the message it is for wakes the loop when it lands (a sleep UCX can
// end), or lands unnoticed until the sleep's timer (one it cannot, MaxSleep at most), and the
// loop runs every queued command before it progresses, so the receive is posted before its
// message is matched either way. Waking for it bought an extra sleep and wake of the locked
// thread per message: the transport re-posts its standing control receive after each
// (docs/benchmarks.md, "Receives that wait for their message"). It reads sleeping before held:
// held was set before sleeping, so a sleep seen is a sleep whose held is seen; a post queued
// before the loop marked itself asleep is seen by the loop's idle check instead.
func (k *waker) wakeForReceive() {
	if k.sleeping.Load() && k.held.Load() {
		k.wake()
	}
}

// beginSleep (the loop) drains the eventfd and marks the loop asleep, with no wake on its way
// (a wake left over from an earlier sleep, one that raced the loop's waking, must not stand
// for this one's), and whether it holds an unexpected message (wakeForReceive), then sets the
// timer.
func (k *waker) beginSleep(d time.Duration, held bool) {
	k.woken.Store(false)
	var b [8]byte
	_, _ = unix.Read(k.ev, b[:]) // EAGAIN: nothing to drain
	k.held.Store(held)
	k.sleeping.Store(true)
	k.arm(d)
}

// wait parks in the poller until something in s is ready. The runtime's poller reports the
// set by edges; the look before each park sees what is ready already, so nothing that came
// before the park is slept through.
func (k *waker) wait(s waitSet) wakeReason {
	k.nev = 0
	_ = s.setrc.Read(func(uintptr) bool {
		n, err := unix.EpollWait(s.setfd, k.evs[:], 0)
		k.nev = max(n, 0)
		return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
	})
	if k.nev == 0 {
		return wokeError
	}
	why := wokeUCX // whatever else is in the set is UCX's
	for _, e := range k.evs[:k.nev] {
		switch int(e.Fd) {
		case k.ev:
			return wokeCommand // a command, or Close: it goes first
		case k.fd:
			why = wokeTimer
		}
	}
	return why
}

// wakeReason is what ended a sleep of the loop (its hop stamps name it: kvxbench --hops).
type wakeReason uint8

const (
	wokeWork    wakeReason = iota // work was queued before the loop parked: it did not sleep
	wokeCommand                   // a wake: a command or Close
	wokeTimer                     // the timer: the sleep's bound, or the back-off's step
	wokeUCX                       // one of UCX's fds: a message landed, an operation completed, a keepalive is due
	wokeError                     // the poller reported an error, no fd
)

func (r wakeReason) String() string {
	return [...]string{"work queued", "a command", "its timer", "UCX", "an error"}[r]
}

// sleep (the loop) waits up to d, unless idle reports there is work after all, or until
// wake, and says which ended it. held: the loop holds an unexpected message (wakeForReceive).
func (k *waker) sleep(d time.Duration, held bool, idle func() bool) wakeReason {
	k.beginSleep(d, held)
	why := wokeWork
	if idle() {
		why = k.wait(k.own)
	}
	k.sleeping.Store(false)
	return why
}

// sleepArmed (the loop, after ucp_worker_arm returned UCS_OK) waits up to d, unless idle
// reports there is work after all, until wake, or until one of UCX's fds in the set is
// ready: a message landed, an operation completed, UCX's keepalive is due. It says which
// ended it. held: as for sleep.
func (k *waker) sleepArmed(d time.Duration, held bool, idle func() bool) wakeReason {
	k.armed.Store(true)
	k.beginSleep(d, held)
	why := wokeWork
	if idle() {
		why = k.wait(k.set)
	}
	k.sleeping.Store(false)
	k.armed.Store(false)
	return why
}

func (k *waker) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		for _, s := range []waitSet{k.own, k.set} {
			if s.f != nil {
				_ = s.f.Close()
			}
		}
		_ = k.f.Close()
		_ = unix.Close(k.ev)
	}
}

// spinYieldRounds is how many empty rounds in a row a spinning worker makes before each
// further one gives its core away (spinYield).
const spinYieldRounds = 64

// spinYield (the loop, in an empty round past spinYieldRounds while it spins) gives the OS
// thread's core to any other thread waiting for one, and takes it back at once when none is
// (sched_yield: a system call of 0.3 us on the 2-core VM). A spinning worker holds a core while it
// waits for a peer or for this process's movers; on a host with fewer cores than busy threads
// (the 2-core VM: two processes' workers, engine loops and movers) the thread that would end
// the wait may be the one waiting for that core, and Go's Gosched gives away only the P, not
// the core. Over TCP (docs/benchmarks.md, "TCP 32 tokens: an arrival spin loses, a yielding
// spin to try") it lowered the 32-token p99 in 4 of 4 loaded pairs.
func (w *Worker) spinYield() {
	w.yields.Add(1)
	_, _, _ = syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}
