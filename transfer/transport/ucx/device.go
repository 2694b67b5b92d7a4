// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Device memory over UCX (docs/ucx.md, "Device memory"). The engine's staging path is kept as
// it is: slots, chunk headers, the lifecycle. What changes is where a slot's bytes live. A
// deviceTransport backs every slot twice: a host "header" region, which is what the engine
// sees as transfer.Config.StagingMemory (it writes and reads each chunk's 48-byte header there), and a
// device region of the same size, registered once with UCX, which holds each chunk's payload.
// The DeviceMover gathers a request's blocks from the caller's device pool into a slot's
// device bytes with the CUDA kernels, and scatters them out the same way; the transport sends
// every chunk as two tagged messages, the header from host memory and the payload straight
// from device memory (UCX's cuda_ipc or cuda_copy transports), and receives it the same way.
// Go never reads or writes device memory, and UCX is never handed the host header region.

// ErrDeviceMemory: device memory was asked for where it cannot work: no CUDA-enabled UCX, no
// GPU, or a spec that does not move through the transport's DeviceMover. The error's text
// says which and the fix.
var ErrDeviceMemory = errors.New("kvxfer: device memory unavailable")

// deviceMemoryError says why device memory cannot be used. It matches ErrDeviceMemory and
// unwraps to the cause (native.ErrMemoryType for a UCX without CUDA, cuda.ErrNoDevice, ...).
type deviceMemoryError struct {
	Reason string
	Err    error
}

// Error implements error.
func (e *deviceMemoryError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%v: %s", ErrDeviceMemory, e.Reason)
	}
	return fmt.Sprintf("%v: %s: %v", ErrDeviceMemory, e.Reason, e.Err)
}

// Is matches ErrDeviceMemory.
func (e *deviceMemoryError) Is(target error) bool { return target == ErrDeviceMemory }

// Unwrap returns the cause.
func (e *deviceMemoryError) Unwrap() error { return e.Err }

// DeviceMemory reports whether this transport's UCX can move CUDA device memory: a
// CUDA-enabled UCX build (the libucx-cu12 wheel, say) on a host whose CUDA driver loads its
// cuda transports. Debian's UCX cannot.
func (t *ucxTransport) DeviceMemory() bool { return t.uctx.Supports(native.MemoryCUDA) }

// DeviceConfig configures NewDevice. Zero values take the documented defaults.
type DeviceConfig struct {
	// UCX configures the transport underneath. Its StagingBytes (host staging) defaults to
	// 64 KiB here, since a device engine stages in device memory. TLS must let UCX reach
	// device memory (empty, or a list naming cuda_copy and cuda_ipc beside a host transport).
	UCX Config
	// Runtime is the opened CUDA device (cuda.Open). Required; the transport does not close it.
	Runtime *cuda.Runtime
	// StagingBytes is the size of the device staging region (and of its host header twin):
	// pass StagingMemory as transfer.Config.StagingMemory, whose NumSlots*SlotBytes must fit in it.
	// Default 512 MiB, as Config.StagingBytes.
	StagingBytes int64
	// syncTimeout bounds each wait for a gather or scatter kernel. A kernel that does not
	// finish in time may still write its slot, so the transport then refuses every later
	// operation (the GPU is not trusted again). Default 10s.
	syncTimeout time.Duration
	// bindTimeout bounds the set-up calls made on UCX's progress thread. Default 5s.
	bindTimeout time.Duration
}

func (c *DeviceConfig) applyDefaults() error {
	if c.UCX.ReplaceWedgedWorker { // the CUDA context is made current on the worker's thread, once
		return &transport.ConfigError{Field: "ucx.DeviceConfig.UCX.ReplaceWedgedWorker", Value: true,
			Reason: "not supported by the device transport: restart the process when Health reports transport.ErrTransportWedged"}
	}
	if c.Runtime == nil {
		return &transport.ConfigError{Field: "ucx.DeviceConfig.Runtime", Value: nil, Reason: "required: open the GPU with cuda.Open"}
	}
	if c.UCX.StagingBytes == 0 {
		c.UCX.StagingBytes = 64 << 10
	}
	if c.StagingBytes == 0 {
		c.StagingBytes = defaultStagingBytes
	}
	if c.StagingBytes < 0 {
		return &transport.ConfigError{Field: "ucx.DeviceConfig.StagingBytes", Value: c.StagingBytes, Reason: "must be positive"}
	}
	if c.syncTimeout == 0 {
		c.syncTimeout = 10 * time.Second
	}
	if c.syncTimeout < 0 {
		return &transport.ConfigError{Field: "ucx.DeviceConfig.syncTimeout", Value: c.syncTimeout, Reason: "must be positive"}
	}
	if c.bindTimeout == 0 {
		c.bindTimeout = 5 * time.Second
	}
	if c.bindTimeout < 0 {
		return &transport.ConfigError{Field: "ucx.DeviceConfig.bindTimeout", Value: c.bindTimeout, Reason: "must be positive"}
	}
	return nil
}

// ucxKindDevHeader tags the header message of a device chunk. Its kind differs from data and
// control, so neither the control receive nor a host data receive can match it.
const ucxKindDevHeader = uint64(3) << ucxKindShift

// deviceTransport is a ucxTransport whose staging slots live in GPU memory; see the top of
// this file. Build the engine over it with transfer.Config.StagingMemory = StagingMemory(), and give
// every Send and Receive a Mover from NewMover: a spec without one is refused at its first
// chunk with ErrDeviceMemory (the engine would otherwise gather host bytes into the header
// region and send device bytes nobody wrote). Both ends of a transfer must use it.
type deviceTransport struct {
	*ucxTransport
	cfg     DeviceConfig
	rt      *cuda.Runtime
	dev     *cuda.Buffer   // the device staging region
	devMem  *native.Memory // its UCX registration, unmapped by ucxTransport.Close
	headers []byte         // the host twin: chunk headers only
	stream  *cuda.Stream   // gathers and scatters, in order

	mu       sync.Mutex
	composed map[transport.OpID]transport.OpID // payload op -> header op, for Cancel
	movers   map[transport.RequestID]int       // requests with a live DeviceMover
	wedged   atomic.Pointer[error]             // a kernel overran syncTimeout: nothing is trusted after
	closed   bool
}

// deviceUCX is the UCX configuration of a device transport: a get_zcopy rendezvous unless
// set (see NewDevice).
func deviceUCX(c Config) Config {
	if c.rendezvous == "" {
		c.rendezvous = "get_zcopy"
	}
	return c
}

// NewDevice opens UCX, checks that it reaches CUDA memory (else an ErrDeviceMemory naming the
// fix, before any GPU memory is allocated), allocates the device
// staging region and registers it with UCX once.
func newDevice(cfg DeviceConfig) (*deviceTransport, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	// The device staging route's messages are device memory, which UCX 1.22 moves between
	// two processes by cuda_ipc gets in a get_zcopy rendezvous (21.6 GB/s for a 4k-token
	// request on an H200 without NVLink, against 0.76 GB/s by cuda_copy through host memory:
	// docs/gpu-results.md); the receiver pulls, so a cancelled receive stays safe to reuse.
	// A device engine carries no host-memory payload (host specs are refused), so UCX 1.22's
	// eager sends of large host messages under get_zcopy do not arise on it.
	t, err := newTransport(deviceUCX(cfg.UCX))
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*deviceTransport, error) {
		return nil, errors.Join(err, t.Close(true))
	}
	if !t.DeviceMemory() {
		return fail(&deviceMemoryError{Reason: "the UCX transport cannot reach CUDA memory",
			Err: &native.MemoryTypeError{Kind: native.MemoryCUDA, UCXVersion: native.UCXVersion()}})
	}
	d := &deviceTransport{ucxTransport: t, cfg: cfg, rt: cfg.Runtime, composed: map[transport.OpID]transport.OpID{},
		movers: map[transport.RequestID]int{}}
	if d.stream, err = cfg.Runtime.NewStream(); err != nil {
		return fail(&deviceMemoryError{Reason: "CUDA stream", Err: err})
	}
	if d.dev, err = cfg.Runtime.Alloc(cfg.StagingBytes); err != nil {
		_ = d.stream.Close()
		return fail(&deviceMemoryError{Reason: fmt.Sprintf("%d bytes of device staging", cfg.StagingBytes), Err: err})
	}
	// UCX's CUDA transports run on the worker's progress thread and (before UCX 1.16) expect
	// the device's context to be current there; registering from the same thread keeps the
	// registration and the transfers in one context. Any runtime call on the thread makes the
	// device's primary context current (kvx_cuda_* call cudaSetDevice first).
	ctx, cancel := context.WithTimeout(context.Background(), cfg.bindTimeout)
	defer cancel()
	var regErr error
	callErr := t.w.RunOnThread(ctx, func() {
		if _, err := d.stream.Query(); err != nil {
			regErr = err
			return
		}
		d.devMem, regErr = t.uctx.RegisterDevice(d.dev.Mem().Addr, cfg.StagingBytes)
	})
	if err := errors.Join(callErr, regErr); err != nil {
		// A call that timed out may still register later: then the region stays mapped
		// and pinned until the process exits rather than freed under UCX.
		if callErr == nil {
			_ = d.dev.Free()
		}
		_ = d.stream.Close()
		return fail(&deviceMemoryError{Reason: "registering the device staging region with UCX", Err: err})
	}
	t.mu.Lock()
	t.pools = append(t.pools, d.devMem) // unmapped by Close after the worker has settled everything
	t.mu.Unlock()
	// Go memory, never a UCX region: Direct refuses it, so an engine over this transport keeps
	// the staging path's messages and never offers these slots to a peer's gets (the pull wire,
	// docs/staging.md), which would read the headers without the payloads on the device.
	d.headers = make([]byte, cfg.StagingBytes)
	return d, nil
}

// StagingMemory is the host header region to pass as transfer.Config.StagingMemory: the engine carves
// its slots from it and writes each chunk's header there; each slot's payload bytes live at
// the same offset of the device region. It hides ucxTransport.StagingMemory.
func (d *deviceTransport) StagingMemory() []byte { return d.headers }

// offsetOf returns where b starts in the header region, or false when it lies outside.
func (d *deviceTransport) offsetOf(b []byte) (int64, bool) {
	if len(b) == 0 || len(d.headers) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(d.headers)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(d.headers)) {
		return 0, false
	}
	return int64(p - base), true
}

// usable reports why the device path cannot take another operation, if it cannot.
func (d *deviceTransport) usable() error {
	if p := d.wedged.Load(); p != nil {
		return *p
	}
	return nil
}

// PostSend implements transport.Transport: buf is a slot of StagingMemory holding a chunk header and,
// at the same offset of the device region, the payload a DeviceMover gathered.
func (d *deviceTransport) PostSend(to transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return d.postChunk(to, tag, buf, done, true)
}

// PostRecv implements transport.Transport, the receiving twin of PostSend.
func (d *deviceTransport) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return d.postChunk(from, tag, buf, done, false)
}

func (d *deviceTransport) postChunk(peer transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion), send bool) (transport.OpID, error) {
	if err := d.usable(); err != nil {
		return 0, err
	}
	off, ok := d.offsetOf(buf)
	if !ok || len(buf) <= transport.DataHeaderBytes {
		return 0, fmt.Errorf("%w: a device chunk must be a slot of deviceTransport.StagingMemory longer than its %d-byte header", ErrUnregistered, transport.DataHeaderBytes)
	}
	d.mu.Lock()
	mover := d.movers[tag.Request] > 0
	d.mu.Unlock()
	if !mover {
		return 0, &deviceMemoryError{Reason: fmt.Sprintf("request %d has no DeviceMover: every Send and Receive over a deviceTransport moves its pool through deviceTransport.NewMover", tag.Request)}
	}
	n := int64(len(buf) - transport.DataHeaderBytes)
	t := d.ucxTransport
	if err := t.ensureEndpoint(peer); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, transport.ErrClosed
	}
	ep, err := t.endpointLocked(peer)
	if err != nil {
		return 0, err
	}
	sender := t.self
	if !send {
		sender = peer
	}
	payloadTag := ucxDataTag(sender, tag)
	headerTag := payloadTag&^ucxKindMask | ucxKindDevHeader
	if !send {
		for _, tg := range []uint64{payloadTag, headerTag} {
			if other, live := t.recvTag[tg]; live {
				return 0, fmt.Errorf("%w: %w: receive tag %#x collides with live op %d", transport.ErrProtocol, transport.ErrTagCollision, tg, other)
			}
		}
	}
	c := &deviceChunk{done: done}
	hdr := buf[:transport.DataHeaderBytes]
	var hop *ucxOp
	hop = t.newOpLocked(peer, send, headerTag, transport.DataHeaderBytes, func(comp transport.Completion) {
		if !send && comp.Err == nil && comp.Memory != transport.MemoryBusy {
			if got := copy(hdr, hop.req.Data()); got != transport.DataHeaderBytes {
				comp.Err = fmt.Errorf("%w: a device chunk header of %d bytes, want %d", transport.ErrProtocol, got, transport.DataHeaderBytes)
			}
		}
		c.report(comp)
	})
	pop := t.newOpLocked(peer, send, payloadTag, int(n), c.report)
	if send {
		hop.req = ep.TagSendBytes(hdr, headerTag)
		pop.req = ep.TagSendDevice(d.devMem, off+transport.DataHeaderBytes, n, payloadTag)
	} else {
		hop.req = t.w.TagRecvBytes(ep, transport.DataHeaderBytes, headerTag, ^uint64(0))
		pop.req = ep.TagRecvDevice(d.devMem, off+transport.DataHeaderBytes, n, payloadTag, ^uint64(0))
		t.recvTag[headerTag], t.recvTag[payloadTag] = hop.id, pop.id
	}
	for _, op := range []*ucxOp{hop, pop} {
		t.ops[op.id] = op
		t.byReq[op.req] = op
	}
	d.mu.Lock()
	d.composed[pop.id] = hop.id
	d.mu.Unlock()
	c.forget = func() {
		d.mu.Lock()
		delete(d.composed, pop.id)
		d.mu.Unlock()
	}
	return pop.id, nil
}

// newOpLocked makes an operation record of the ucxTransport; the caller sets its request and
// files it in ops and byReq, after which deliverRequest reports it as any other.
func (t *ucxTransport) newOpLocked(peer transport.Peer, send bool, tag uint64, size int, done func(transport.Completion)) *ucxOp {
	t.nextOp++
	return &ucxOp{id: t.nextOp, send: send, peer: peer, size: size, done: done, tag: tag}
}

// Cancel implements transport.Transport: both messages of a device chunk are cancelled.
func (d *deviceTransport) Cancel(id transport.OpID) {
	d.mu.Lock()
	header, ok := d.composed[id]
	d.mu.Unlock()
	d.ucxTransport.Cancel(id)
	if ok {
		d.ucxTransport.Cancel(header)
	}
}

// Close implements transport.Transport: the UCX transport closes (which settles every request and
// unmaps the device region), then the device region is freed once the stream is idle.
func (d *deviceTransport) Close(force bool) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	err := d.ucxTransport.Close(force)
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.syncTimeout)
	defer cancel()
	if d.usable() != nil || d.devMem.InUse() > 0 {
		// A kernel or UCX may still touch the region: it goes with the process instead.
		return errors.Join(err, d.stream.Close())
	}
	if werr := d.stream.Wait(ctx); werr != nil {
		return errors.Join(err, werr, d.stream.Close())
	}
	return errors.Join(err, d.stream.Close(), d.dev.Free())
}

// deviceChunk joins the reports of a chunk's two messages into the one operation the engine
// posted: transport.MemoryBusy at most once (when either is busy, or one failed while the other is
// still out), then one final report once both are final. Both messages report on the
// transport's dispatch goroutine; the lock keeps that an implementation detail.
type deviceChunk struct {
	mu     sync.Mutex
	done   func(transport.Completion)
	forget func()
	finals int
	busy   bool
	err    error
	bytes  int
	memory transport.Memory
}

func (c *deviceChunk) report(comp transport.Completion) {
	c.mu.Lock()
	var out *transport.Completion
	if comp.Memory == transport.MemoryBusy {
		if !c.busy {
			c.busy = true
			out = &transport.Completion{Err: comp.Err, Memory: transport.MemoryBusy}
		}
	} else {
		c.finals++
		if c.err == nil {
			c.err = comp.Err
		}
		c.bytes += comp.Bytes
		if comp.Memory == transport.MemoryUnknown {
			c.memory = transport.MemoryUnknown
		}
		switch {
		case c.finals == 2:
			final := transport.Completion{Err: c.err, Memory: c.memory}
			if c.err == nil {
				final.Bytes = c.bytes
			}
			out = &final
		case comp.Err != nil && !c.busy:
			// One half failed while the other is still out: the chunk has failed, but its
			// memory is not free until the other half reports.
			c.busy = true
			out = &transport.Completion{Err: comp.Err, Memory: transport.MemoryBusy}
		}
	}
	last := c.finals == 2
	c.mu.Unlock()
	if last && c.forget != nil {
		c.forget()
	}
	if out != nil {
		c.done(*out)
	}
}

// DeviceMover moves one request's blocks between the caller's device KV pool and the device
// staging slots, with the CUDA gather and scatter kernels. Make one per request
// (NewMover), pass it as transfer.Spec.Mover, and Close it once the handle's Done has closed.
type DeviceMover struct {
	d    *deviceTransport
	id   transport.RequestID
	pool cuda.Mem

	mu     sync.Mutex
	plans  map[*layout.Plan]*cuda.DevicePlan
	events []*cuda.Event // idle events, one taken per call
	closed bool
}

// NewMover returns the Mover of request id over pool, the caller's KV pool in device memory
// (cuda.Buffer.Mem, or an inference engine's pool wrapped as cuda.Mem). Until Close, the
// transport accepts the request's chunks.
func (d *deviceTransport) NewMover(id transport.RequestID, pool cuda.Mem) (*DeviceMover, error) {
	if pool.Addr == 0 || pool.Size <= 0 {
		return nil, &deviceMemoryError{Reason: fmt.Sprintf("request %d: device pool [%#x, +%d) is empty", id, pool.Addr, pool.Size)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, transport.ErrClosed
	}
	d.movers[id]++
	return &DeviceMover{d: d, id: id, pool: pool, plans: map[*layout.Plan]*cuda.DevicePlan{}}, nil
}

// deviceSlot maps a slice of the header region onto the device region.
func (m *DeviceMover) deviceSlot(b []byte) (cuda.Mem, error) {
	off, ok := m.d.offsetOf(b)
	if !ok {
		return cuda.Mem{}, &deviceMemoryError{Reason: "the staging buffer is not in deviceTransport.StagingMemory (pass it as transfer.Config.StagingMemory)"}
	}
	return m.d.dev.Mem().Slice(off, int64(len(b)))
}

// plan returns p uploaded to the device, once per plan.
func (m *DeviceMover) plan(p *layout.Plan) (*cuda.DevicePlan, *cuda.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, fmt.Errorf("device mover of request %d: %w", m.id, transport.ErrClosed)
	}
	dp := m.plans[p]
	if dp == nil {
		if span := kvplan.PoolSpan(p); span > m.pool.Size {
			return nil, nil, &layout.FieldError{Field: "pool", Value: m.pool.Size, Reason: fmt.Sprintf("needs %d bytes", span), Err: layout.ErrBufferTooSmall}
		}
		var err error
		if dp, err = m.d.rt.UploadPlan(p); err != nil {
			return nil, nil, err
		}
		m.plans[p] = dp
	}
	var ev *cuda.Event
	if k := len(m.events); k > 0 {
		ev, m.events = m.events[k-1], m.events[:k-1]
	} else {
		var err error
		if ev, err = m.d.rt.NewEvent(false); err != nil {
			return nil, nil, err
		}
	}
	return dp, ev, nil
}

// run enqueues one kernel and waits for it, at most syncTimeout. A launched kernel whose end
// cannot be told (it overran, its event reports a fault, or no event could be recorded behind
// it) may still write its slot and the pool, so its error matches
// transport.ErrQuiescenceUnknown (the engine poisons both, L9) and the transport stops
// trusting the GPU: every later operation fails. A kernel that failed to launch runs nothing.
func (m *DeviceMover) run(p *layout.Plan, launch func(dp *cuda.DevicePlan) error) error {
	if err := m.d.usable(); err != nil {
		return err
	}
	dp, ev, err := m.plan(p)
	if err != nil {
		return err
	}
	if err := launch(dp); err != nil {
		m.putEvent(ev)
		return err
	}
	if err := ev.Record(m.d.stream); err != nil {
		_ = ev.Close() // never recorded: nothing can fire it
		return m.unknownEnd("no event could be recorded behind a launched gather or scatter kernel", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.d.cfg.syncTimeout)
	defer cancel()
	if err := ev.Wait(ctx); err != nil {
		// The event is dropped, not reused: it may still fire.
		return m.unknownEnd(fmt.Sprintf("a gather or scatter kernel did not finish within %v", m.d.cfg.syncTimeout), err)
	}
	m.putEvent(ev)
	return nil
}

// unknownEnd wedges the transport (the device staging region is no longer trusted) and
// returns the error of a copy whose end cannot be told.
func (m *DeviceMover) unknownEnd(why string, err error) error {
	wedged := &deviceMemoryError{Reason: why + "; the device staging region is no longer trusted", Err: err}
	var werr error = wedged
	m.d.wedged.CompareAndSwap(nil, &werr)
	return fmt.Errorf("%w: %w", transport.ErrQuiescenceUnknown, wedged)
}

func (m *DeviceMover) putEvent(ev *cuda.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		_ = ev.Close()
		return
	}
	m.events = append(m.events, ev)
}

// Gather implements Mover: stream bytes [off, off+len(dst)) of p from the device pool into
// the device bytes behind dst, a slot of StagingMemory. It returns once the kernel is done.
func (m *DeviceMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	slot, err := m.deviceSlot(dst)
	if err != nil {
		return err
	}
	return m.run(p, func(dp *cuda.DevicePlan) error { return m.d.rt.Gather(m.d.stream, dp, m.pool, off, slot) })
}

// Scatter implements Mover: the device bytes behind src into the device pool at stream bytes
// [off, off+len(src)) of p. It returns once the kernel is done, so the slot may be reused.
func (m *DeviceMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	slot, err := m.deviceSlot(src)
	if err != nil {
		return err
	}
	return m.run(p, func(dp *cuda.DevicePlan) error { return m.d.rt.Scatter(m.d.stream, dp, slot, off, m.pool) })
}

// Close frees the uploaded plans and ends the request's right to post chunks. Call it after
// the handle's Done has closed: every Gather and Scatter has returned by then, and their
// kernels are done.
func (m *DeviceMover) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	plans, events := m.plans, m.events
	m.plans, m.events = nil, nil
	m.mu.Unlock()
	m.d.mu.Lock()
	if m.d.movers[m.id]--; m.d.movers[m.id] <= 0 {
		delete(m.d.movers, m.id)
	}
	m.d.mu.Unlock()
	var errs []error
	for _, dp := range plans {
		errs = append(errs, dp.Free())
	}
	for _, ev := range events {
		errs = append(errs, ev.Close())
	}
	return errors.Join(errs...)
}
