// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"unsafe"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// DevicePlan is a layout.Plan with its block ids uploaded to the device. The kernels read a
// block id for every tile they copy, so the ids must live in device memory; uploading them once
// per plan keeps the launch itself free of host-to-device copies. Free it after the last
// Gather or Scatter that uses it is known to be done.
type DevicePlan struct {
	plan   *layout.Plan
	blocks *Buffer
}

// UploadPlan copies p's block ids to the device (synchronously, 4 bytes per block).
func (r *Runtime) UploadPlan(p *layout.Plan) (*DevicePlan, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("%w: UploadPlan: nil plan", ErrInvalidArgument)
	}
	ids := p.Blocks()
	n := int64(len(ids)) * 4
	buf, err := r.Alloc(n)
	if err != nil {
		return nil, err
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), n)
	if err := r.CopyToDevice(buf.Mem(), raw); err != nil {
		_ = buf.Free()
		return nil, err
	}
	return &DevicePlan{plan: p, blocks: buf}, nil
}

// Plan is the host plan this device plan was made from.
func (d *DevicePlan) Plan() *layout.Plan { return d.plan }

// Free releases the device copy of the block ids. A second Free returns ErrClosed.
func (d *DevicePlan) Free() error { return d.blocks.Free() }

// Gather enqueues on s a copy of stream bytes [off, off+dst.Size) of the plan from pool
// into dst: the device twin of native.HostGather. It returns once the kernel is launched; an
// empty dst launches nothing.
func (r *Runtime) Gather(s *Stream, p *DevicePlan, pool Mem, off int64, dst Mem) error {
	args, err := r.copyArgs("gather", s, p, pool, off, dst)
	if err != nil || args.Length == 0 {
		return err
	}
	return r.check("kvx_cuda_gather", r.kvx.gather(r.device, args, s.handle))
}

// Scatter enqueues on s a copy of src into stream bytes [off, off+src.Size) of the plan in
// pool: the device twin of native.HostScatter.
func (r *Runtime) Scatter(s *Stream, p *DevicePlan, src Mem, off int64, pool Mem) error {
	args, err := r.copyArgs("scatter", s, p, pool, off, src)
	if err != nil || args.Length == 0 {
		return err
	}
	return r.check("kvx_cuda_scatter", r.kvx.scatter(r.device, args, s.handle))
}

// copyArgs checks what the launcher cannot (the sizes of the caller's memory) and fills the
// ABI struct.
func (r *Runtime) copyArgs(op string, s *Stream, p *DevicePlan, pool Mem, off int64, buf Mem) (*copyArgs, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if err := s.usable(); err != nil {
		return nil, err
	}
	if p == nil || p.blocks.freed.Load() {
		return nil, fmt.Errorf("cuda: %s: plan: %w", op, ErrClosed)
	}
	if err := kvplan.CheckRange(p.plan, off, buf.Size); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", op, err)
	}
	l := p.plan.Layout()
	if span := kvplan.PoolSpan(p.plan); pool.Size < span {
		return nil, fmt.Errorf("%w: %s: pool holds %d bytes, the layout spans %d", ErrInvalidArgument, op, pool.Size, span)
	}
	return &copyArgs{
		Layout: l, Sel: p.plan.Selection(), Blocks: p.blocks.mem.Addr, NBlocks: int64(len(p.plan.Blocks())),
		Pool: pool.Addr, Buf: buf.Addr, Offset: off, Length: buf.Size,
	}, nil
}

// Memcpy enqueues a device-to-device copy of src into dst on s; dst must hold src.Size bytes.
func (r *Runtime) Memcpy(s *Stream, dst, src Mem) error {
	if err := r.usable(); err != nil {
		return err
	}
	if err := s.usable(); err != nil {
		return err
	}
	if dst.Size < src.Size {
		return fmt.Errorf("%w: Memcpy: %d bytes into a %d-byte range", ErrInvalidArgument, src.Size, dst.Size)
	}
	return r.check("kvx_cuda_memcpy", r.kvx.memcpy(r.device, dst.Addr, src.Addr, src.Size, s.handle))
}

// Memset enqueues filling m with the byte v on s.
func (r *Runtime) Memset(s *Stream, m Mem, v byte) error {
	if err := r.usable(); err != nil {
		return err
	}
	if err := s.usable(); err != nil {
		return err
	}
	return r.check("kvx_cuda_memset", r.kvx.memset(r.device, m.Addr, int32(v), m.Size, s.handle))
}

// spin enqueues a kernel that runs for about ms milliseconds: tests use it to hold a stream
// busy so that an event recorded after it is certainly unfinished.
func (r *Runtime) spin(s *Stream, ms int64) error {
	if err := s.usable(); err != nil {
		return err
	}
	return r.check("kvx_cuda_spin", r.kvx.spin(r.device, ms, s.handle))
}
