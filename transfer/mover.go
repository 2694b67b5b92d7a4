// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
)

// Mover copies a plan's stream between the caller's KV pool and staging memory. It is the seam
// through which the engine touches caller memory: the host mover works on a []byte pool, a
// device mover (CUDA) will run the same plans on the GPU. The engine calls it from its mover
// goroutines (at most GOMAXPROCS of them), so several copies of one transfer may run at once,
// each over its own stream range and its own staging memory; never after the transfer has
// ended: a transfer ends only once every copy it started has returned.
//
// A Gather or Scatter that returns has finished its copy, whatever its error, unless the error
// matches ErrQuiescenceUnknown: the mover cannot say whether the copy still runs (a device
// kernel that overran its timeout may still write). The engine then poisons the staging slot
// and the caller's blocks instead of releasing them, and Health reports the mover wedged.
//
// A Mover whose Scatter reads its source with the CPU wherever it lies in host memory (the
// host mover's does) may also have a method ScatterReadsAnyHostMemory() bool that returns
// true. The staging path's pull wire then hands it chunks straight out of the sender's slots,
// where the transport maps them into this process (transport.RMAMapper), instead of a copy in
// a slot of this engine: one copy of every byte fewer. A Mover that needs its source in the
// engine's staging memory (a device mover that looks the slot up in a registered region) has
// no such method, or returns false.
type Mover interface {
	// Gather copies stream bytes [off, off+len(dst)) of p out of the pool into dst.
	Gather(p *layout.Plan, off int64, dst []byte) error
	// Scatter copies src into the pool at stream bytes [off, off+len(src)) of p.
	Scatter(p *layout.Plan, src []byte, off int64) error
}

// anySourceScatterer is an optional method of a Mover (Mover's doc says when to have it),
// which the staging path's pull wire asks for by type assertion.
type anySourceScatterer interface {
	ScatterReadsAnyHostMemory() bool
}

// newHostMover returns the Mover for a KV pool in host memory, the one a Spec without a Mover
// gets. It copies with the C gather and scatter of package native (the same layout header as
// the CUDA kernels); a build without cgo falls back to a Go loop over the same plan math.
func newHostMover(pool []byte) Mover { return hostMover{pool: pool} }

type hostMover struct{ pool []byte }

// Gather implements Mover.
func (m hostMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	err := native.HostGather(p, m.pool, off, dst)
	if errors.Is(err, native.ErrNotSupported) {
		return goCopy(p, m.pool, off, dst, true)
	}
	return err
}

// ScatterReadsAnyHostMemory implements anySourceScatterer: the host scatter reads any host
// memory.
func (hostMover) ScatterReadsAnyHostMemory() bool { return true }

// Scatter implements Mover.
func (m hostMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	err := native.HostScatter(p, src, off, m.pool)
	if errors.Is(err, native.ErrNotSupported) {
		return goCopy(p, m.pool, off, src, false)
	}
	return err
}

// goCopy is the cgo-free host copy: it walks the stream range in runs of pool-contiguous rows
// (kvplan.RunUnits), so a packed layout copies whole blocks at a time and a strided one row by
// row.
func goCopy(p *layout.Plan, pool []byte, off int64, stream []byte, gather bool) error {
	n := int64(len(stream))
	if err := kvplan.CheckRange(p, off, n); err != nil {
		return err
	}
	if span := kvplan.PoolSpan(p); int64(len(pool)) < span {
		return &layout.FieldError{Field: "pool", Value: int64(len(pool)), Reason: fmt.Sprintf("needs %d bytes", span), Err: layout.ErrBufferTooSmall}
	}
	row := p.Layout().RowBytes()
	run := kvplan.RunUnits(p)
	pos := int64(0)
	for pos < n {
		s := off + pos
		unit, in := s/row, s%row
		// Rows left in this run: runs start at multiples of run in the stream.
		left := (run - unit%run) * row
		k := min(left-in, n-pos)
		at := kvplan.UnitOffset(p, unit) + in
		if gather {
			copy(stream[pos:pos+k], pool[at:at+k])
		} else {
			copy(pool[at:at+k], stream[pos:pos+k])
		}
		pos += k
	}
	return nil
}
