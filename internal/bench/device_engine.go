// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// --memory device for run: both ends keep their KV pools in GPU memory, registered with a
// a ucx.NewDevice transport, and hand them to the engine as a serving process does (Spec.Device):
// the engine reads them by gets, GPU to GPU (the rma route), and falls back to staging slots in
// GPU memory, gathered and scattered by the CUDA kernels (the Spec's Mover), where gets cannot
// run; --staging keeps every transfer on the staging route. The scenario driver is the host one: it
// fills, scrubs and checks a host mirror of each pool, which this side pushes to and pulls
// from the GPU between rounds (poolMirror).

package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

func init() { checkDeviceRun = probeDeviceRun }

// probeDeviceRun opens the GPU and asks UCX whether it reaches CUDA memory, so that a host
// without either fails at once, in one line, before any peer process starts.
func probeDeviceRun(cfg RunConfig, stream bool) error {
	if cfg.Memory != "device" {
		return nil
	}
	if stream {
		return deviceStreamErr()
	}
	rt, err := openCUDA(cfg.Device)
	if err != nil {
		return oneLine(deviceRunErr("no usable GPU (kvxbench needs libkvxcuda.so, libcudart and a device)", err))
	}
	defer rt.Close()
	tr, err := ucx.New(ucx.Config{TLS: cfg.TLS, StagingBytes: 64 << 10})
	if err != nil {
		return oneLine(deviceRunErr("UCX", err))
	}
	ok := transportimpl.Of(tr).(interface{ DeviceMemory() bool }).DeviceMemory()
	if err := tr.Close(true); err != nil {
		return oneLine(deviceRunErr("UCX", err))
	}
	if !ok {
		return oneLine(deviceRunErr("UCX cannot move device memory", &native.MemoryTypeError{Kind: native.MemoryCUDA, UCXVersion: native.UCXVersion()}))
	}
	return nil
}

// oneLine keeps an error on one line (a library error may list loader messages).
func oneLine(err error) error {
	return fmt.Errorf("%s", strings.Join(strings.Fields(err.Error()), " "))
}

// deviceEngineSide is the engine adapter with pools in device memory.
type deviceEngineSide struct {
	*engineAdapter
	tr *ucx.Transport
	rt *cuda.Runtime

	mu    sync.Mutex
	pools map[*byte]*cuda.Buffer // host mirror -> device pool, registered with tr (Spec.Device)

	// The checks' GPU side (poolMirror), serialised by mirrorMu.
	mirrorMu sync.Mutex
	stream   *cuda.Stream
	plans    map[*layout.Plan]*cuda.DevicePlan
	scratch  *cuda.Buffer
	// hostScratch receives a plan's stream from the GPU, reused across checks.
	hostScratch []byte
}

var (
	_ engineSide = (*deviceEngineSide)(nil)
	_ poolMirror = (*deviceEngineSide)(nil)
)

// newDeviceEngineSide makes a transfer.Engine over a ucx.NewDevice transport whose host header
// region backs the engine's slots (their payloads live on the GPU).
func newDeviceEngineSide(cfg RunConfig, role string, rank int) (engineSide, error) {
	rt, err := openCUDA(cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("%s rank %d: %w", role, rank, deviceRunErr("no usable GPU", err))
	}
	ec := engineConfig(cfg) // --staging sets DisableDirect: device pools stage, never get
	tr, err := ucx.NewDevice(ucx.DeviceConfig{Runtime: rt, StagingBytes: int64(ec.Tuning.NumSlots) * ec.SlotBytes,
		UCX: ucx.Config{TLS: cfg.TLS, ServeEmulatedRMA: cfg.RMAWhereEmulated}})
	if err != nil {
		_ = rt.Close()
		return nil, fmt.Errorf("%s rank %d: %w", role, rank, err)
	}
	ec.StagingMemory = tr.StagingMemory()
	obs, err := engineObservability(cfg, role, rank)
	if err != nil {
		_ = tr.Close(true)
		_ = rt.Close()
		return nil, err
	}
	if obs != nil {
		ec.Observer = obs.observer
	}
	eng, err := transfer.New(tr, ec)
	if err != nil {
		_ = tr.Close(true)
		_ = rt.Close()
		obs.close()
		return nil, fmt.Errorf("%s rank %d: engine: %w", role, rank, err)
	}
	if err := obs.serve(eng); err != nil {
		_ = eng.Close()
		_ = rt.Close()
		return nil, err
	}
	a := &engineAdapter{eng: eng, addr: tr.WorkerAddress(), peerOf: ucx.PeerFromAddress, obs: obs}
	return &deviceEngineSide{engineAdapter: a, tr: tr, rt: rt, pools: map[*byte]*cuda.Buffer{},
		plans: map[*layout.Plan]*cuda.DevicePlan{}}, nil
}

// NewPool implements engineSide: n bytes of device memory registered with the transport (so the
// peer's gets can read it and ours write it), and the host mirror the scenario works on. The
// mirror never goes to the engine: transfers name the device pool (Spec.Device).
func (e *deviceEngineSide) NewPool(n int64) ([]byte, bool, error) {
	buf, err := e.rt.Alloc(n)
	if err != nil {
		return nil, false, fmt.Errorf("device KV pool of %s: %w", humanBytes(n), err)
	}
	// The registration lasts until the transport closes (Close closes it before freeing pools).
	if _, err := e.tr.RegisterDevice(buf.Mem().Addr, n); err != nil {
		_ = buf.Free()
		return nil, false, fmt.Errorf("device KV pool of %s: register for gets: %w", humanBytes(n), err)
	}
	host := make([]byte, n)
	e.mu.Lock()
	e.pools[unsafe.SliceData(host)] = buf
	e.mu.Unlock()
	return host, false, nil
}

// devicePool names the device pool behind a request's host mirror for Spec.Device.
func devicePool(buf *cuda.Buffer) transfer.DevicePool {
	return transfer.DevicePool{Addr: buf.Mem().Addr, Len: buf.Mem().Size}
}

func (e *deviceEngineSide) device(pool []byte) (*cuda.Buffer, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if buf := e.pools[unsafe.SliceData(pool)]; buf != nil && buf.Mem().Size == int64(len(pool)) {
		return buf, nil
	}
	return nil, fmt.Errorf("%w: a pool this engine side did not make", ucx.ErrDeviceMemory)
}

// PushPool implements poolMirror.
func (e *deviceEngineSide) PushPool(pool []byte) error {
	buf, err := e.device(pool)
	if err != nil {
		return err
	}
	return e.rt.CopyToDevice(buf.Mem(), pool)
}

// ScrubPlan implements poolMirror: the scatter kernel writes a zeroed device buffer over p's
// blocks, so a transfer that writes nothing fails its check.
func (e *deviceEngineSide) ScrubPlan(p *layout.Plan, pool []byte) error {
	return e.onPlan(p, pool, func(dp *cuda.DevicePlan, dev, tmp cuda.Mem) error {
		if err := e.rt.Memset(e.stream, tmp, 0); err != nil {
			return err
		}
		return e.rt.Scatter(e.stream, dp, tmp, 0, dev)
	}, nil)
}

// PullPlan implements poolMirror: the gather kernel packs p's blocks into one device buffer,
// one copy brings it to the host, and the host scatter puts it in the mirror's blocks.
func (e *deviceEngineSide) PullPlan(p *layout.Plan, pool []byte) error {
	return e.onPlan(p, pool, func(dp *cuda.DevicePlan, dev, tmp cuda.Mem) error {
		return e.rt.Gather(e.stream, dp, dev, 0, tmp)
	}, func(tmp cuda.Mem) error {
		if int64(cap(e.hostScratch)) < p.Bytes() {
			e.hostScratch = make([]byte, p.Bytes())
		}
		stream := e.hostScratch[:p.Bytes()]
		if err := e.rt.CopyFromDevice(stream, tmp); err != nil {
			return err
		}
		return native.HostScatter(p, stream, 0, pool)
	})
}

// onPlan runs one kernel step over p's blocks of the device pool behind pool with a scratch
// buffer of p's stream size, waits for it (bounded), then runs after, if any. Calls are
// serialised: they share the stream and the scratch buffer.
func (e *deviceEngineSide) onPlan(p *layout.Plan, pool []byte, step func(dp *cuda.DevicePlan, dev, tmp cuda.Mem) error, after func(tmp cuda.Mem) error) error {
	buf, err := e.device(pool)
	if err != nil {
		return err
	}
	e.mirrorMu.Lock()
	defer e.mirrorMu.Unlock()
	if e.stream == nil {
		if e.stream, err = e.rt.NewStream(); err != nil {
			return err
		}
	}
	dp := e.plans[p]
	if dp == nil {
		if dp, err = e.rt.UploadPlan(p); err != nil {
			return err
		}
		e.plans[p] = dp
	}
	if e.scratch == nil || e.scratch.Mem().Size < p.Bytes() {
		if e.scratch != nil {
			_ = e.scratch.Free() // the stream is idle: every onPlan waits for its work
		}
		e.scratch = nil
		if e.scratch, err = e.rt.Alloc(p.Bytes()); err != nil {
			return fmt.Errorf("scratch for the checks: %w", err)
		}
	}
	tmp, err := e.scratch.Mem().Slice(0, p.Bytes())
	if err != nil {
		return err
	}
	if err := step(dp, buf.Mem(), tmp); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
	defer cancel()
	if err := e.stream.Wait(ctx); err != nil {
		return err
	}
	if after != nil {
		return after(tmp)
	}
	return nil
}

// mirrorTimeout bounds one check step on the GPU (a kernel over at most one request's blocks).
const mirrorTimeout = time.Minute

// mover makes request id's DeviceMover over the device pool behind m's host mirror, timed
// into m's counters as the host mover is.
// The engine calls it only where the transfer stages (--staging, or a route without gets).
func (e *deviceEngineSide) mover(id uint64, m mover) (*ucx.DeviceMover, transfer.Mover, transfer.DevicePool, error) {
	tm, ok := m.(*timedMover)
	if !ok {
		return nil, nil, transfer.DevicePool{}, fmt.Errorf("%w: request %d: not a pool of this engine side", ucx.ErrDeviceMemory, id)
	}
	buf, err := e.device(tm.pool)
	if err != nil {
		return nil, nil, transfer.DevicePool{}, err
	}
	dm, err := e.tr.NewMover(transfer.RequestID(id), buf.Mem())
	if err != nil {
		return nil, nil, transfer.DevicePool{}, err
	}
	return dm, timedDeviceMover{dm: dm, tm: tm}, devicePool(buf), nil
}

// Send implements engineSide.
func (e *deviceEngineSide) Send(ctx context.Context, id uint64, secret []byte, to peerRef, p *layout.Plan, m mover) (pendingXfer, error) {
	dm, mv, dev, err := e.mover(id, m)
	if err != nil {
		return nil, err
	}
	h, err := e.eng.Send(ctx, transfer.Spec{ID: transfer.RequestID(id), Secret: secret, Peer: transfer.Peer(to), Plan: p, Device: dev, Mover: mv})
	if err != nil {
		_ = dm.Close()
		return nil, err
	}
	return deviceHandle{handle: handle{h: h}, dm: dm}, nil
}

// Expose refuses: the exposer flow moves host pools (engineAdapter's, which this type embeds,
// would hand the engine the host mirror in place of the device pool).
func (e *deviceEngineSide) Expose(context.Context, uint64, *layout.Plan, mover) (pendingXfer, []byte, []byte, error) {
	return nil, nil, nil, errors.New("--sender expose moves host pools: not with --memory device")
}

// Receive implements engineSide.
func (e *deviceEngineSide) Receive(ctx context.Context, id uint64, secret []byte, subs []recvSub, m mover) (pendingXfer, error) {
	dm, mv, dev, err := e.mover(id, m)
	if err != nil {
		return nil, err
	}
	spec := transfer.Spec{ID: transfer.RequestID(id), Secret: secret, Device: dev, Mover: mv}
	if len(subs) == 1 {
		spec.Peer, spec.Plan = transfer.Peer(subs[0].peer), subs[0].plan
	} else {
		for _, s := range subs {
			spec.Subs = append(spec.Subs, transfer.SubSpec{Peer: transfer.Peer(s.peer), Plan: s.plan})
		}
	}
	h, err := e.eng.Receive(ctx, spec)
	if err != nil {
		_ = dm.Close()
		return nil, err
	}
	return deviceHandle{handle: handle{h: h}, dm: dm}, nil
}

// Close implements engineSide: the engine (and with it the transport), then the pools once
// the engine is done with them.
func (e *deviceEngineSide) Close() error {
	err := e.engineAdapter.Close()
	e.mu.Lock()
	pools := e.pools
	e.pools = nil
	e.mu.Unlock()
	e.mirrorMu.Lock()
	defer e.mirrorMu.Unlock()
	idle := e.stream == nil
	if !idle {
		ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
		idle = e.stream.Wait(ctx) == nil
		cancel()
		_ = e.stream.Close()
	}
	if err == nil && idle { // else a kernel or UCX may still use them: they go with the process
		for _, buf := range pools {
			_ = buf.Free()
		}
		for _, dp := range e.plans {
			_ = dp.Free()
		}
		if e.scratch != nil {
			_ = e.scratch.Free()
		}
	}
	_ = e.rt.Close()
	return err
}

// deviceHandle closes the request's DeviceMover once its transfer is done.
type deviceHandle struct {
	handle
	dm *ucx.DeviceMover
}

// Release implements pendingXfer. The mover is closed after Done (the engine makes no more
// Gather or Scatter calls then), which the engine's deadlines bound.
func (h deviceHandle) Release() {
	done := h.Done()
	h.handle.Release()
	select {
	case <-done:
		_ = h.dm.Close()
	default:
		go func() {
			select {
			case <-done:
				_ = h.dm.Close()
			case <-time.After(releaseBound):
				// Never expected (the engine's deadlines end every transfer sooner): the
				// mover's plans stay allocated rather than freed under a running kernel.
			}
		}()
	}
}

// releaseBound bounds the wait for a released transfer's Done before its mover is closed.
const releaseBound = 10 * time.Minute

// timedDeviceMover adds a DeviceMover's time to the scenario's gather and scatter counters.
type timedDeviceMover struct {
	dm *ucx.DeviceMover
	tm *timedMover
}

func (m timedDeviceMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	t := time.Now()
	err := m.dm.Gather(p, off, dst)
	m.tm.gatherNs.Add(int64(time.Since(t)))
	return err
}

func (m timedDeviceMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	t := time.Now()
	err := m.dm.Scatter(p, src, off)
	m.tm.scatterNs.Add(int64(time.Since(t)))
	return err
}
