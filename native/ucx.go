// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdlib.h>
#include "ucx.h"

// The Go side of ucx.h's callbacks, defined in callbacks.go. Declared here by hand because a
// file with //export may not define C functions, and these adapters must be defined.
extern void kvxGoRequestDone(uint64_t user, int status, size_t length);
extern void kvxGoEndpointError(uint64_t user, int status);

static void kvx_go_on_done(void *arg, uint64_t user, ucs_status_t status, size_t length) {
	(void)arg;
	kvxGoRequestDone(user, (int)status, length);
}

static void kvx_go_on_ep_error(void *arg, uint64_t user, ucs_status_t status) {
	(void)arg;
	kvxGoEndpointError(user, (int)status);
}

static ucs_status_t kvx_go_worker_create(ucp_context_h ctx, int event_fd, kvx_ucx_worker_t **out) {
	return kvx_ucx_worker_create_efd(ctx, kvx_go_on_done, kvx_go_on_ep_error, NULL, event_fd, out);
}
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/hopstamp"
)

func statusText(st C.ucs_status_t) string { return C.GoString(C.ucs_status_string(st)) }

func statusErr(op string, st C.ucs_status_t) error {
	if st == C.UCS_OK {
		return nil
	}
	return &StatusError{Op: op, Status: int(st), Text: statusText(st)}
}

// Context is a UCX context (ucp_context_h): the transports and the memory registrations.
// Workers and memory are created from it and must be closed before it.
type Context struct {
	cfg     ContextConfig
	ctx     C.ucp_context_h
	wakeup  bool // made with UCP_FEATURE_WAKEUP: its workers can sleep until UCX has work
	mu      sync.Mutex
	closed  bool
	workers int
	mems    int
	stopLog func() // ends routing UCX's log lines to cfg.Logger
}

// NewContext opens UCX with cfg. Transport settings go into the process's environment,
// each unless already set there:
//   - UCX_MM_ERROR_HANDLING=y when the transports may include shared memory: UCX 1.13
//     otherwise drops shared memory for endpoints with peer error handling, which kvxfer
//     always uses.
//   - UCX_TCP_MAX_IOV=0, UCX_TCP_RX_SEG_SIZE=1m and UCX_TCP_TX_SEG_SIZE (cfg.TCPSegmentBytes,
//     default 64k) when they may include TCP: UCX's TCP transport completes a zero-copy send
//     twice when its connection breaks, which aborts a process that outlives its peer
//     (docs/ucx.md, "TCP without zero-copy"). TCP then copies each message into buffers of
//     the segment size; setting UCX_TCP_MAX_IOV yourself brings zero-copy back, with that
//     risk.
//   - UCX_MM_FIFO_SIZE when cfg.ShmFIFOSize is set and the transports may include shared
//     memory.
func NewContext(cfg ContextConfig) (*Context, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	var cc C.kvx_ucx_ctx_config_t
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	cstr := func(s string) *C.char {
		if s == "" {
			return nil
		}
		p := C.CString(s)
		frees = append(frees, unsafe.Pointer(p))
		return p
	}
	cc.tls = cstr(cfg.TLS)
	cc.net_devices = cstr(cfg.NetDevices)
	cc.rndv_scheme = cstr(cfg.RendezvousScheme)
	if _, set := ProcessEnv("UCX_RNDV_THRESH"); !set && cfg.RendezvousScheme != "get_zcopy" && protocolsV2() {
		cc.rndv_thresh = cstr(strconv.Itoa(eagerLimitBytes))
	}
	if cfg.rndvThresh != "" {
		cc.rndv_thresh = cstr(cfg.rndvThresh)
	}
	rndvThresh := ""
	if cc.rndv_thresh != nil {
		rndvThresh = C.GoString(cc.rndv_thresh)
	}
	if cfg.TCPSegmentBytes != 0 {
		cc.tcp_tx_seg_size = cstr(strconv.FormatInt(cfg.TCPSegmentBytes, 10))
	}
	if cfg.ShmFIFOSize != 0 {
		cc.mm_fifo_size = cstr(strconv.Itoa(cfg.ShmFIFOSize))
	}
	cc.keepalive_interval = cstr(fmt.Sprintf("%dms", cfg.KeepaliveInterval.Milliseconds()))
	if !cfg.NoRMA {
		cc.with_rma = 1
	}
	if !cfg.noWakeup {
		cc.wakeup = 1
	}
	c := &Context{cfg: cfg}
	// Routed before ucp_init, so what UCX says while it opens goes to the logger too.
	c.stopLog = routeUCXLog(cfg.Logger)
	st := C.kvx_ucx_context_create(&cc, &c.ctx)
	if st != C.UCS_OK && cc.wakeup == 1 {
		// A UCX that cannot wake its workers still moves data: its workers poll (Worker.loop).
		cc.wakeup = 0
		st = C.kvx_ucx_context_create(&cc, &c.ctx)
	}
	if st != C.UCS_OK {
		c.stopLog()
		return nil, statusErr("init context", st)
	}
	c.wakeup = cc.wakeup == 1
	recordSettings(cfg, rndvThresh)
	return c, nil
}

// Close releases the context. Every worker and memory region made from it must be closed
// first; otherwise Close returns ErrBusy and keeps the context.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.workers > 0 || c.mems > 0 {
		return fmt.Errorf("%w: context still has %d workers and %d memory regions open", ErrBusy, c.workers, c.mems)
	}
	c.closed = true
	C.kvx_ucx_context_destroy(c.ctx)
	c.stopLog() // after the destroy: UCX may log while it cleans up
	return nil
}

func (c *Context) acquire(workers, mems int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.workers += workers
	c.mems += mems
	return nil
}

// WorkerConfig configures a worker's progress loop. The zero value is valid.
type WorkerConfig struct {
	// SpinRounds is how many empty progress rounds the loop makes, while operations are in
	// flight, before it starts sleeping between rounds. Spinning is what keeps rendezvous
	// transfers at wire speed; sleeping is what keeps an idle worker off the CPU. Default 4096.
	// A worker UCX can wake (docs/ucx.md, "An idle worker sleeps until UCX has work for it")
	// with only receives pending spins at most 20 us of them: their messages wake it.
	SpinRounds int
	// MaxSleep caps the sleep between progress rounds of a worker UCX cannot wake, and the
	// timer back-off of one that can: it bounds the delay before an incoming message or a
	// keepalive is noticed. A worker UCX can wake sleeps armed until a message, a completion,
	// a command or Close ends the sleep, for at most 20 ms (or MaxSleep if longer, and no more
	// than a quarter of the context's KeepaliveInterval). Default 1ms; at most 100ms.
	MaxSleep time.Duration
	// CloseTimeout bounds Close: how long it progresses to let cancelled and force-closed
	// operations report back before it destroys the worker. Default 2s.
	CloseTimeout time.Duration
	// AbandonGrace is how long, after an endpoint closed, UCX may still complete the
	// requests it had; the rest are then abandoned (see Request.Abandoned). Default 100ms.
	AbandonGrace time.Duration
	// OnReport, if set, hears every request posted through the worker's public methods when
	// it reports: once when Done closes, and once more when an abandoned request finally
	// settles (Request.Settled). It runs on the progress goroutine and must not block or call
	// back into the worker synchronously; queue the work instead.
	OnReport func(*Request)
	// UnexpectedBytes bounds what messages that arrived before any receive matched them may
	// hold in this process: UCX keeps such a message until a receive matches it, and a peer
	// that sends eagerly (UCX 1.22 does with the default rendezvous scheme; any peer can ask
	// for it) would otherwise grow this process at will. Each is charged its length plus
	// 16 KiB, a rendezvous request (whose data stays with the sender) the 16 KiB alone; past
	// the bound the oldest are discarded, and a receive posted for one later never matches
	// it (docs/ucx.md, "Unexpected messages"). Default 256 MiB; at least 1 MiB.
	UnexpectedBytes int64
	// Logger receives endpoint failures and close events; default the context's logger.
	Logger *zap.Logger
	// fixedSleep, when set, is every armed sleep of the loop (one UCX can end), unchecked:
	// tests make a worker whose armed sleeps last seconds, so that what ends one early is
	// seen. The back-off after ucp_worker_arm said BUSY keeps its own 10 us to MaxSleep: UCX
	// cannot end that sleep, and a test's message that came during one used to wait out the
	// seconds (a flake of TestWorker_UCXWakesTheSleepForAMessage, 3 runs in 60 on a loaded host).
	fixedSleep time.Duration
	// wakeSpin, when set, replaces the spin after activity (wakeSpin): tests shorten it to
	// see the command spin alone.
	wakeSpin time.Duration
}

func (c *WorkerConfig) applyDefaults(parent *zap.Logger) error {
	if c.SpinRounds == 0 {
		c.SpinRounds = 4096
	}
	if c.SpinRounds < 0 {
		return fmt.Errorf("%w: WorkerConfig.SpinRounds = %d: must not be negative", ErrInvalidArgument, c.SpinRounds)
	}
	if c.MaxSleep == 0 {
		c.MaxSleep = time.Millisecond
	}
	if c.MaxSleep < 0 || c.MaxSleep > 100*time.Millisecond {
		return fmt.Errorf("%w: WorkerConfig.MaxSleep = %v: must be in (0, 100ms]", ErrInvalidArgument, c.MaxSleep)
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 2 * time.Second
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("%w: WorkerConfig.CloseTimeout = %v: must be positive", ErrInvalidArgument, c.CloseTimeout)
	}
	if c.UnexpectedBytes == 0 {
		c.UnexpectedBytes = defaultUnexpectedBytes
	}
	if c.UnexpectedBytes < 1<<20 {
		return fmt.Errorf("%w: WorkerConfig.UnexpectedBytes = %d: must be at least 1 MiB", ErrInvalidArgument, c.UnexpectedBytes)
	}
	if c.AbandonGrace == 0 {
		c.AbandonGrace = 100 * time.Millisecond
	}
	if c.AbandonGrace < 0 || c.AbandonGrace > c.CloseTimeout {
		return fmt.Errorf("%w: WorkerConfig.AbandonGrace = %v: must be in (0, CloseTimeout]", ErrInvalidArgument, c.AbandonGrace)
	}
	if c.Logger == nil {
		c.Logger = parent
	}
	return nil
}

// Worker is a UCX worker driven by one goroutine locked to its OS thread. Every UCX call on
// the worker, its endpoints and its requests runs on that goroutine: methods hand it a
// command and return, so no caller ever blocks inside UCX and no UCX lock is needed.
type Worker struct {
	ctx *Context
	cfg WorkerConfig
	log *zap.Logger
	cw  *C.kvx_ucx_worker_t

	cmds    chan func()
	wake    *waker        // the loop's sleep, ended by a command or Close
	stopReq chan struct{} // closed by Close to ask the loop to stop
	stopped chan struct{} // closed by the loop once the worker is destroyed
	stopOne sync.Once

	// Owned by the loop goroutine.
	pending   map[*Request]struct{}
	endpoints map[*Endpoint]struct{}

	dead       bool                  // loop-owned: the C worker is destroyed; commands must not touch it
	destroying bool                  // loop-owned: inside ucp_worker_destroy; callbacks must not call UCX
	cancelling *Request              // loop-owned: the request inside kvx_ucx_cancel now
	restand    []*Request            // loop-owned: standing receives' successors to post (postStanding)
	stopping   bool                  // loop-owned: shutdown has begun; no standing receive stands again
	suspects   map[*Request]struct{} // loop-owned: receives pinned until the worker is gone
	fifos      fifoWatch             // loop-owned: FIFOs of live local peers whose endpoints closed with sends held
	ownFIFO    ownFIFOs              // loop-owned: this worker's own FIFOs, looked at for an element a dead writer left

	// inUCX (loop-owned) is how deep the loop is in UCX calls that post or cancel; an
	// endpoint failure UCX reports from inside one waits in lateErrs until the outermost
	// returns (see Worker.posting).
	inUCX    int
	lateErrs []lateEPError

	// wakeable (set by the loop before NewWorker returns) is whether UCX wakes the loop for
	// what arrives (UCP_FEATURE_WAKEUP, its fds in the waker's set): the loop then sleeps
	// until then, and spins only briefly for receives (Worker.spin).
	wakeable    bool
	inFlight    int         // loop-owned: pending requests that are not receives
	awaited     int         // loop-owned: pending IOV receives, each awaiting a message (spin)
	lastCommand time.Time   // loop-owned: when the loop last ran a command (commandSpin)
	sched       *schedWatch // loop-owned: whether goroutines wait for a P (spin)
	// emptyRounds counts the loop's progress rounds that found nothing to do, yields those
	// that gave the core away (spinYield) (for tests).
	emptyRounds, yields atomic.Uint64
	timerWakes          atomic.Uint64 // armed sleeps its timer ended (armedSleep's bound)
	fifoFills           atomic.Uint64 // elements of its own FIFO it wrote for a dead writer (ownFIFO)

	address []byte
	stats   atomic.Pointer[WorkerStats]
	// unexpDropped is the discard count last logged (publishStats, on the loop).
	unexpDropped uint64
}

// defaultUnexpectedBytes is WorkerConfig.UnexpectedBytes's default: four of the direct path's
// 64 MiB messages.
const defaultUnexpectedBytes = 256 << 20

// WorkerStats are the request counters of ucx.h, as last seen by the progress loop.
type WorkerStats struct {
	InlineDone uint64 // posts that finished without a request
	Requests   uint64 // posts that returned a live request
	Callbacks  uint64 // completion callbacks for those
	Freed      uint64 // ucp_request_free calls
	Cancels    uint64 // ucp_request_cancel calls
	EPErrors   uint64 // endpoint error callbacks
	EPsOpen    uint64 // endpoints not yet released
	Pending    int    // requests not yet completed
	// Dropped counts requests UCX still held when the closing worker was destroyed: UCX 1.13
	// keeps some after a forced close (docs/ucx.md, "Abandoned requests") and releases them
	// with the worker, without a callback. Each was reported failed; Requests = Callbacks +
	// Dropped once the worker is closed.
	Dropped uint64
	// Unexpected messages (WorkerConfig.UnexpectedBytes): how many are held for a later
	// receive, what they are charged, and how many were discarded to stay within the bound.
	UnexpectedHeld, UnexpectedBytes, UnexpectedDropped uint64
}

// NewWorker creates a worker and starts its progress goroutine.
func (c *Context) NewWorker(cfg WorkerConfig) (*Worker, error) {
	if err := cfg.applyDefaults(c.cfg.Logger); err != nil {
		return nil, err
	}
	wake, err := newWaker(c.wakeup)
	if err != nil {
		return nil, err
	}
	if err := c.acquire(1, 0); err != nil {
		wake.close()
		return nil, err
	}
	w := &Worker{
		ctx: c, cfg: cfg, log: cfg.Logger, wake: wake,
		cmds: make(chan func(), 1024), stopReq: make(chan struct{}), stopped: make(chan struct{}),
		pending: make(map[*Request]struct{}), endpoints: make(map[*Endpoint]struct{}), sched: newSchedWatch(),
		suspects: make(map[*Request]struct{}),
	}
	ready := make(chan error, 1)
	go w.loop(ready)
	if err := <-ready; err != nil {
		_ = c.acquire(-1, 0)
		return nil, err
	}
	return w, nil
}

// loop is the worker's progress goroutine: it creates the worker on its own locked thread,
// then alternates between commands and ucp_worker_progress until Close.
func (w *Worker) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer w.wake.close()
	st := C.kvx_go_worker_create(w.ctx.ctx, C.int(w.wake.eventFD()), &w.cw)
	if st != C.UCS_OK && w.wake.eventFD() >= 0 {
		// A UCX that would not take the set still makes a worker that polls.
		w.wake.dropSet()
		st = C.kvx_go_worker_create(w.ctx.ctx, -1, &w.cw)
	}
	if st != C.UCS_OK {
		ready <- statusErr("create worker", st)
		close(w.stopped)
		return
	}
	w.wakeable = w.wake.eventFD() >= 0
	C.kvx_ucx_worker_set_unexpected(w.cw, C.size_t(w.cfg.UnexpectedBytes))
	var addr unsafe.Pointer
	var n C.size_t
	if st := C.kvx_ucx_worker_address(w.cw, &addr, &n); st != C.UCS_OK {
		C.kvx_ucx_worker_destroy(w.cw)
		ready <- statusErr("worker address", st)
		close(w.stopped)
		return
	}
	w.address = C.GoBytes(addr, C.int(n))
	C.free(addr)
	w.publishStats()
	ready <- nil

	empty, sleep := 0, time.Duration(0)
	var quiet time.Time // when the current run of empty rounds began
	armBusy := 0        // how often ucp_worker_arm said BUSY since the last round that did anything
	for {
		// Checked every round, busy or not: a peer that never stops sending must not keep
		// Close waiting.
		select {
		case <-w.stopReq:
			w.shutdown()
			return
		default:
		}
		ran := w.runCommands()
		busy := C.kvx_ucx_progress(w.cw, 64)
		if w.postStanding() {
			busy++ // a successor posted may have taken a held message: progress again
		}
		if ran {
			w.lastCommand = time.Now()
		}
		if ran || busy > 0 {
			empty, sleep, armBusy = 0, 0, 0
			continue
		}
		w.emptyRounds.Add(1)
		if empty++; empty == 1 {
			quiet = time.Now()
		}
		if w.spin(empty, quiet) {
			if empty > spinYieldRounds {
				w.spinYield()
			}
			continue
		}
		w.publishStats()
		if w.wakeable {
			switch C.kvx_ucx_worker_arm(w.cw) {
			case C.UCS_OK:
				// Every transport will signal the set when anything arrives or completes:
				// sleep until then (or a command, Close, MaxSleep), no back-off.
				hopstamp.MarkLast("worker sleeps")
				why := w.wake.sleepArmed(w.armedSleep(), w.cw.stats.unexp_held > 0, w.idle)
				if why == wokeTimer {
					w.timerWakes.Add(1)
				}
				hopstamp.MarkLast("worker woke")
				if hopstamp.On() {
					hopstamp.MarkLast("worker woke for " + why.String())
				}
				sleep = 0
				continue
			case C.UCS_ERR_BUSY:
				// An event was queued, or a transport holds work its events do not announce
				// (a send in its pending queue, a copy in flight): progress again, and after
				// armBusyRounds of those the back-off below, which sleeps on the timer alone.
				if armBusy++; armBusy < armBusyRounds {
					continue
				}
			}
		}
		// Back off from 10us up to MaxSleep, waking at once for a command or Close.
		if sleep == 0 {
			sleep = 10 * time.Microsecond
		} else if sleep *= 2; sleep > w.cfg.MaxSleep {
			sleep = w.cfg.MaxSleep
		}
		hopstamp.MarkLast("worker backs off")
		why := w.wake.sleep(sleep, w.cw.stats.unexp_held > 0, w.idle)
		if hopstamp.On() {
			hopstamp.MarkLast("worker back-off ended by " + why.String())
		}
	}
}

// armedSleep is how long an armed sleep may last: armedSleepMax (or MaxSleep, if longer), but
// no more than a quarter of the context's keepalive interval, which UCX checks only when the
// worker progresses; or a test's fixedSleep.
func (w *Worker) armedSleep() time.Duration {
	if w.cfg.fixedSleep > 0 {
		return w.cfg.fixedSleep
	}
	d := max(w.cfg.MaxSleep, armedSleepMax)
	if ka := w.ctx.cfg.KeepaliveInterval / 4; ka > 0 {
		d = min(d, max(ka, w.cfg.MaxSleep))
	}
	return d
}

// armedSleepMax bounds a sleep UCX, a command or Close ends at once: a safety net, not what
// wakes the worker. At MaxSleep (1 ms, until 2026-11-29) every idle worker of a process woke a
// thousand times a second for nothing, taking the 2-core VM's core a read in place was copied
// on: 20 ms took the one-hop 32-token p50 from 401-428 to 349-364 us in 4 of 4 pairs
// (docs/benchmarks.md, "The armed sleep's bound").
const armedSleepMax = 20 * time.Millisecond

// armBusyRounds is how many times in a row ucp_worker_arm may say BUSY, each followed by an
// empty round, before the loop backs off on its timer.
const armBusyRounds = 16

// wakeSpin bounds the empty rounds of a worker UCX can wake when it waits only for receives
// to match: their messages will wake it, so spinning for one buys only the wake's own
// latency, for a reply that comes within a few microseconds.
const wakeSpin = 20 * time.Microsecond

// spin (the loop, after its empty-th empty round in a row, the first at quiet) reports
// whether to progress again at once rather than sleep. Spinning is what keeps rendezvous
// transfers at wire speed while operations are in flight; on a worker UCX cannot wake it is
// also what keeps a reply from waiting out the back-off. So: SpinRounds rounds while anything
// is pending, except that a worker UCX can wake with only receives pending (the transport's
// standing control receive is always pending) spins at most wakeSpin, and commandSpin after a
// command only while no IOV receive awaits its message: that message wakes the worker, and the
// next command of its request comes after it (over TCP the spin after a direct receiver's claim
// saved nothing and took a core from the peer answering it, docs/benchmarks.md, "The TCP
// 32-token request hop by hop on this host").
func (w *Worker) spin(empty int, quiet time.Time) bool {
	if len(w.pending) == 0 || empty >= w.cfg.SpinRounds {
		return false
	}
	if !w.wakeable || w.inFlight > 0 {
		return true
	}
	if empty == 1 {
		w.sched.next = 0 // a new run of empty rounds reads the scheduler afresh
	}
	ws := wakeSpin
	if w.cfg.wakeSpin > 0 {
		ws = w.cfg.wakeSpin
	}
	if time.Since(quiet) < ws {
		return true
	}
	return w.awaited == 0 && time.Since(w.lastCommand) < commandSpin && !w.sched.othersWait(empty)
}

// schedWatch tells a worker's command spin whether goroutines of this process wait for a P.
// The spin only saves the wake of a worker UCX can wake, with its P: on a host with few cores,
// while goroutines wait for one (16 concurrent reads copying on two cores), it takes a core
// from them and saves a wake nobody waits for, so the worker arms at once instead (docs/ucx.md,
// "An idle worker sleeps until UCX has work for it"). The runtime's scheduler metrics are read
// on the first round that asks and every schedWatchEvery rounds after: a read takes the
// scheduler's lock (about 150 ns). The 20 us spin after activity is left alone: over TCP the
// worker reading a stream's segments is the data's mover.
type schedWatch struct {
	samples []metrics.Sample
	next    int // the empty round at which to read again
	wait    bool
}

const schedWatchEvery = 32

func newSchedWatch() *schedWatch {
	return &schedWatch{samples: []metrics.Sample{
		{Name: "/sched/goroutines/runnable:goroutines"},
		{Name: "/sched/goroutines/running:goroutines"},
		{Name: "/sched/gomaxprocs:threads"},
	}}
}

// othersWait (the loop, in its empty-th empty round) reports whether more goroutines are
// runnable or running than there are Ps: some wait for one. A runtime without these metrics
// reports false, and the worker spins as it did before.
func (s *schedWatch) othersWait(empty int) bool {
	if empty < s.next {
		return s.wait
	}
	s.next = empty + schedWatchEvery
	metrics.Read(s.samples)
	var v [3]uint64
	for i, m := range s.samples {
		if m.Value.Kind() != metrics.KindUint64 {
			s.wait = false
			return false
		}
		v[i] = m.Value.Uint64()
	}
	s.wait = v[0]+v[1] > v[2]
	return s.wait
}

// commandSpin is how long a worker UCX can wake keeps spinning after it ran a command (a
// send, a get, a cancel the engine posted): one request's commands come in bursts (a one-hop
// read's claim, then its Done tens of microseconds later), and a command that finds the worker
// armed waits for a wake of its locked thread where one that finds it spinning runs at once.
// The wake took 30-60 us on the 2-core VM while it re-armed the timerfd; the eventfd's is a
// few microseconds (waker), and whether the spin still pays was not measured since.
const commandSpin = 150 * time.Microsecond

// idle (the loop, about to sleep) reports whether no command waits and Close has not begun.
func (w *Worker) idle() bool {
	select {
	case <-w.stopReq:
		return false
	default:
		return len(w.cmds) == 0
	}
}

// runCommands runs the commands queued so far, a bounded number per round so that progress
// is never starved.
func (w *Worker) runCommands() bool {
	for i := 0; i < 256; i++ {
		select {
		case f := <-w.cmds:
			hopstamp.MarkLast("worker runs a command")
			f()
		default:
			return i > 0
		}
	}
	return true
}

func (w *Worker) publishStats() {
	w.watchFIFOs()
	s := w.cw.stats
	w.stats.Store(&WorkerStats{
		InlineDone: uint64(s.inline_done), Requests: uint64(s.requests), Callbacks: uint64(s.callbacks),
		Freed: uint64(s.freed), Cancels: uint64(s.cancels), EPErrors: uint64(s.ep_errors),
		EPsOpen: uint64(s.eps_open), Pending: len(w.pending),
		UnexpectedHeld: uint64(s.unexp_held), UnexpectedBytes: uint64(s.unexp_bytes),
		UnexpectedDropped: uint64(s.unexp_dropped),
	})
	if d := uint64(s.unexp_dropped); d > w.unexpDropped {
		w.log.Warn("ucx worker discarded unexpected messages to stay within WorkerConfig.UnexpectedBytes",
			zap.Uint64("discarded", d-w.unexpDropped), zap.Uint64("total", d), zap.Int64("bound", w.cfg.UnexpectedBytes))
		w.unexpDropped = d
	}
}

// Stats returns the worker's counters as of its last idle moment; it never blocks.
func (w *Worker) Stats() WorkerStats {
	if s := w.stats.Load(); s != nil {
		return *s
	}
	return WorkerStats{}
}

// Address is the worker's UCX address, what a peer passes to Connect.
func (w *Worker) Address() []byte { return append([]byte(nil), w.address...) }

// submit queues f for the loop and wakes it (queue).
func (w *Worker) submit(f func()) error { return w.queue(f, w.wake.wake) }

// call runs f on the loop and waits for it, bounded by ctx.
func (w *Worker) call(ctx context.Context, f func()) error {
	done := make(chan struct{})
	if err := w.submit(func() { f(); close(done) }); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-w.stopped:
		// The loop may have run f just before stopping.
		select {
		case <-done:
			return nil
		default:
			return ErrClosed
		}
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
}

// Info returns UCX's description of the worker's transports (ucp_worker_print_info).
func (w *Worker) Info(ctx context.Context) (string, error) {
	var s string
	err := w.call(ctx, func() {
		p := C.kvx_ucx_worker_info(w.cw)
		s = C.GoString(p)
		C.free(unsafe.Pointer(p))
	})
	return s, err
}

// Close stops the worker: it force-closes every endpoint, cancels every receive, progresses
// until all requests have reported back or CloseTimeout passed, and destroys the worker.
// Requests UCX never reported back complete with ErrClosed: once the worker is destroyed,
// UCX no longer touches their memory. Close waits at most CloseTimeout plus a second; if that
// passes (ErrTimeout) the worker goes on stopping, and a later Close waits for it again.
func (w *Worker) Close() error {
	w.stopOne.Do(func() { close(w.stopReq); w.wake.wake() })
	select {
	case <-w.stopped:
		return nil
	case <-time.After(w.cfg.CloseTimeout + time.Second):
		return fmt.Errorf("%w: worker did not stop within %v", ErrTimeout, w.cfg.CloseTimeout+time.Second)
	}
}

// shutdownSettle is how long a closing worker progresses after its own requests ended, for
// the wireup messages UCX still has queued (shutdown).
const shutdownSettle = 20 * time.Millisecond

func (w *Worker) shutdown() {
	defer close(w.stopped)
	defer func() { _ = w.ctx.acquire(-1, 0) }()
	w.endStanding()
	// Commands already queued run first, so their requests exist and are accounted for.
	w.runCommands()
	for ep := range w.endpoints {
		ep.startClose(true, ErrClosed)
	}
	for r := range w.pending {
		w.cancel(r)
	}
	deadline := time.Now().Add(w.cfg.CloseTimeout)
	for (len(w.pending) > 0 || len(w.endpoints) > 0) && time.Now().Before(deadline) {
		if C.kvx_ucx_progress(w.cw, 64) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	// UCX 1.13 asserts in ucp_worker_destroy (uct_tcp_ep_pending_purge: "got REP message")
	// when an endpoint UCX made for a peer's wireup still has its reply queued on a TCP lane
	// still connecting: it aborted the process once in a clean-clone CI rehearsal. Such
	// endpoints are UCX's, not in w.endpoints; a few more milliseconds of progress let the
	// connection finish and the reply go before the worker is destroyed.
	for end := time.Now().Add(shutdownSettle); time.Now().Before(end); {
		if C.kvx_ucx_progress(w.cw, 64) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	if n := len(w.pending); n > 0 {
		w.log.Warn("ucx worker closing with requests UCX never completed", zap.Int("requests", n))
	}
	w.publishStats() // the last look at the C counters: the worker is freed next
	dropped := uint64(len(w.pending))
	w.destroying = true
	C.kvx_ucx_worker_destroy(w.cw)
	w.dead = true
	for r := range w.pending {
		r.creq = nil
		r.finish(fmt.Errorf("%w: worker closed before UCX completed the request", ErrClosed), 0)
	}
	for ep := range w.endpoints {
		ep.release() // frees only kvxfer's endpoint record: UCX's went with the worker
	}
	for r := range w.suspects {
		r.settleSuspect()
	}
	w.closeFIFOs()
	if s := w.stats.Load(); s != nil {
		final := *s
		final.Pending, final.Dropped = 0, dropped
		w.stats.Store(&final)
	}
	// Commands queued after the loop stopped fail their requests rather than hang them.
	for {
		select {
		case f := <-w.cmds:
			f()
		default:
			return
		}
	}
}

// notify (loop only) hands a report to the OnReport hook, for requests the caller posted.
func (w *Worker) notify(r *Request) {
	if w.cfg.OnReport != nil && r.kind != opClose {
		w.cfg.OnReport(r)
	}
}

// stoppedNow reports, on the loop, whether the worker is gone (commands drained at shutdown).
func (w *Worker) stoppedNow() bool {
	select {
	case <-w.stopped:
		return true
	default:
		return false
	}
}

// statusCodes returns UCX's own values of the status codes ucx_errors.go names, for the test
// that keeps the two in step (test files cannot use cgo).
func statusCodes() map[string][2]int {
	return map[string][2]int{
		"OK":                 {statusOK, int(C.UCS_OK)},
		"INPROGRESS":         {statusInProgress, int(C.UCS_INPROGRESS)},
		"IO_ERROR":           {statusIOError, int(C.UCS_ERR_IO_ERROR)},
		"NO_MEMORY":          {statusNoMemory, int(C.UCS_ERR_NO_MEMORY)},
		"INVALID_PARAM":      {statusInvalidParam, int(C.UCS_ERR_INVALID_PARAM)},
		"UNREACHABLE":        {statusUnreachable, int(C.UCS_ERR_UNREACHABLE)},
		"NOT_IMPLEMENTED":    {statusNotImplemented, int(C.UCS_ERR_NOT_IMPLEMENTED)},
		"MESSAGE_TRUNCATED":  {statusMessageTruncated, int(C.UCS_ERR_MESSAGE_TRUNCATED)},
		"CANCELED":           {statusCanceled, int(C.UCS_ERR_CANCELED)},
		"TIMED_OUT":          {statusTimedOut, int(C.UCS_ERR_TIMED_OUT)},
		"UNSUPPORTED":        {statusUnsupported, int(C.UCS_ERR_UNSUPPORTED)},
		"REJECTED":           {statusRejected, int(C.UCS_ERR_REJECTED)},
		"NOT_CONNECTED":      {statusNotConnected, int(C.UCS_ERR_NOT_CONNECTED)},
		"CONNECTION_RESET":   {statusConnectionReset, int(C.UCS_ERR_CONNECTION_RESET)},
		"FIRST_LINK_FAILURE": {statusFirstLinkFailure, int(C.UCS_ERR_FIRST_LINK_FAILURE)},
		"LAST_ENDPOINT_FAIL": {statusLastEndpointFailed, int(C.UCS_ERR_LAST_ENDPOINT_FAILURE)},
	}
}

// endpointTimeoutStatus is UCS_ERR_ENDPOINT_TIMEOUT, what keepalive reports for a dead peer.
const endpointTimeoutStatus = int(C.UCS_ERR_ENDPOINT_TIMEOUT)
