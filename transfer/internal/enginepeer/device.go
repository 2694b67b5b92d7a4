// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package main

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// deviceKV is -device: the pool's bytes in cudaMalloc memory of GPU 0, registered with the
// transport (RegisterDevice) and handed to the engine as transfer.Spec.Device, as a serving
// process hands over its GPU KV cache. It needs a CUDA-enabled UCX and a GPU.
type deviceKV struct {
	rt     *cuda.Runtime
	buf    *cuda.Buffer
	region *ucx.Region
}

func newDeviceKV(tr *ucx.Transport, pool []byte) (*deviceKV, error) {
	rt, err := cuda.Open(cuda.Config{})
	if err != nil {
		return nil, err
	}
	d := &deviceKV{rt: rt}
	if d.buf, err = rt.Alloc(int64(len(pool))); err != nil {
		return nil, errors.Join(err, d.close())
	}
	if err := rt.CopyToDevice(d.buf.Mem(), pool); err != nil {
		return nil, errors.Join(err, d.close())
	}
	if d.region, err = tr.RegisterDevice(d.buf.Mem().Addr, int64(len(pool))); err != nil {
		return nil, errors.Join(err, d.close())
	}
	return d, nil
}

// spec is the device pool as the engine takes it.
func (d *deviceKV) spec() transfer.DevicePool {
	return transfer.DevicePool{Addr: d.region.Addr(), Len: d.region.Len()}
}

// readBack copies the device pool to the host, to check every byte.
func (d *deviceKV) readBack(n int) ([]byte, error) {
	b := make([]byte, n)
	if err := d.rt.CopyFromDevice(b, d.buf.Mem()); err != nil {
		return nil, fmt.Errorf("reading the device pool back: %w", err)
	}
	return b, nil
}

func (d *deviceKV) close() error {
	var errs []error
	if d.region != nil {
		errs = append(errs, d.region.Unregister())
	}
	if d.buf != nil {
		errs = append(errs, d.buf.Free())
	}
	return errors.Join(append(errs, d.rt.Close())...)
}
