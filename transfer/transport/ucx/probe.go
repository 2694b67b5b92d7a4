// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The receive probe: a second UCX worker in this process sends a small control message to the
// transport's worker every Config.ProbeInterval, over the same transports a local peer would
// use. UCX's shared-memory transports give each worker one receive queue that every local
// sender writes into; a sender killed between claiming a queue element and publishing it
// leaves an element that never becomes readable, and the worker then receives nothing over
// shared memory from anyone, for good (UCX has no recovery for it). Transfers in flight turn
// the engine unhealthy by the progress rule; an idle worker would look healthy while every
// new request timed out. The probe's messages go through the same queue, so their absence
// says so whatever the traffic, and Health names the cause.

// ucxProbeOutstanding bounds the probe messages sent and not yet received: a wedged queue
// keeps them pending in the probe worker, and they must not pile up.
const ucxProbeOutstanding = 4

type ucxProbe struct {
	interval, timeout time.Duration
	uctx              *native.Context
	w                 *native.Worker
	addr              []byte // the probe worker's address: how the transport recognises its messages
	closeTimeout      time.Duration
	// onWedged, if set, runs on the probe's goroutine when the worker is found wedged
	// (Config.ReplaceWedgedWorker); the probe is retargeted before it returns.
	onWedged func(error)

	mu sync.Mutex
	ep *native.Endpoint // to the transport's worker; replaced by retarget

	sent   atomic.Uint64 // sequence of the last probe sent
	seen   atomic.Uint64 // highest sequence received by the transport's worker
	sentAt [2 * ucxProbeOutstanding]atomic.Int64

	stop    chan struct{}
	done    chan struct{}
	started bool // run is running; set under the transport's mu
	once    sync.Once
}

// startProbe opens the probe worker and connects it to the transport's worker. A probe that
// cannot be opened is logged and left out: the transport works without it.
func (t *ucxTransport) startProbe() {
	if t.cfg.ProbeInterval < 0 {
		return
	}
	p := &ucxProbe{interval: t.cfg.ProbeInterval, timeout: t.cfg.ProbeTimeout, closeTimeout: t.cfg.CloseTimeout,
		stop: make(chan struct{}), done: make(chan struct{})}
	if t.cfg.ReplaceWedgedWorker {
		p.onWedged = t.replaceWorker
	}
	if err := p.open(t.cfg, t.WorkerAddress()); err != nil {
		p.close()
		t.log.Warn("ucx receive probe not started; a wedged receive queue will show only through stalled transfers", zap.Error(err))
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed { // Close ran meanwhile and saw no probe
		p.close()
		return
	}
	t.probe.Store(p)
	p.started = true
	go p.run()
}

func (p *ucxProbe) open(cfg Config, target []byte) error {
	uctx, err := native.NewContext(native.ContextConfig{TLS: cfg.TLS, NetDevices: cfg.NetDevices,
		KeepaliveInterval: cfg.KeepaliveInterval, TCPSegmentBytes: cfg.TCPSegmentBytes, ShmFIFOSize: cfg.ShmFIFOSize, Logger: cfg.Logger, NoRMA: true})
	if err != nil {
		return err
	}
	p.uctx = uctx
	if p.w, err = uctx.NewWorker(native.WorkerConfig{Logger: cfg.Logger}); err != nil {
		return err
	}
	p.addr = p.w.Address()
	return p.retarget(target)
}

// retarget points the probe at a worker address (the transport's, or its replacement's) and
// forgets the messages still unanswered, which went to the old one.
func (p *ucxProbe) retarget(target []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.closeTimeout)
	defer cancel()
	ep, err := p.w.Connect(ctx, target)
	if err != nil {
		return err
	}
	p.mu.Lock()
	old := p.ep
	p.ep = ep
	p.seen.Store(p.sent.Load())
	p.mu.Unlock()
	if old != nil {
		_ = old.ForceClose(ctx)
	}
	return nil
}

// run sends one probe message per interval while fewer than ucxProbeOutstanding are
// unanswered. Its framing is the transport's control framing, so the message takes the same
// path as a peer's.
func (p *ucxProbe) run() {
	defer close(p.done)
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		p.mu.Lock()
		if sent := p.sent.Load(); sent-p.seen.Load() < ucxProbeOutstanding {
			seq := sent + 1
			p.sentAt[seq%uint64(len(p.sentAt))].Store(time.Now().UnixNano())
			p.sent.Store(seq)
			msg := ucxControlFrame(p.addr, binary.LittleEndian.AppendUint64(nil, seq))
			p.ep.TagSendBytes(msg, ucxKindCtrl) // its completion is not waited for: the arrival is what counts
		}
		p.mu.Unlock()
		if err := p.wedged(time.Now()); err != nil && p.onWedged != nil {
			p.onWedged(err)
		}
		select {
		case <-tick.C:
		case <-p.stop:
			return
		}
	}
}

// arrived records a probe message the transport's worker received. It reports whether b came
// from the probe (and so is not a peer's).
func (p *ucxProbe) arrived(from, payload []byte) bool {
	if p == nil || !bytes.Equal(from, p.addr) {
		return false
	}
	if len(payload) == 8 {
		seq := binary.LittleEndian.Uint64(payload)
		for {
			old := p.seen.Load()
			if seq <= old || p.seen.CompareAndSwap(old, seq) {
				break
			}
		}
	}
	return true
}

// wedged returns an error when the oldest probe message not yet received was sent more than
// the timeout ago. It never blocks.
func (p *ucxProbe) wedged(now time.Time) error {
	if p == nil {
		return nil
	}
	seen, sent := p.seen.Load(), p.sent.Load()
	if sent <= seen {
		return nil
	}
	at := p.sentAt[(seen+1)%uint64(len(p.sentAt))].Load()
	if age := now.Sub(time.Unix(0, at)); at != 0 && age > p.timeout {
		return fmt.Errorf("%w: this worker has not received its own loopback probe, sent %v ago (timeout %v): "+
			"its receive queue is wedged, as UCX's shared-memory queue is when a local peer dies while writing to it; "+
			"nothing a peer sends it will arrive until the process restarts (or use UCX_TLS without posix/sysv)",
			transport.ErrTransportWedged, age.Round(time.Millisecond), p.timeout)
	}
	return nil
}

func (p *ucxProbe) close() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		close(p.stop)
		if p.started {
			<-p.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p.mu.Lock()
		ep := p.ep
		p.mu.Unlock()
		if ep != nil {
			_ = ep.ForceClose(ctx)
		}
		if p.w != nil {
			_ = p.w.Close()
		}
		if p.uctx != nil {
			_ = p.uctx.Close()
		}
	})
}

// transport.TransportHealth implements transport.TransportHealth: an error while the receive probe says the
// worker's receive queue is wedged. It never blocks.
func (t *ucxTransport) TransportHealth() error {
	return t.probe.Load().wedged(time.Now())
}
