// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// This file follows transfer/transport/ucx/transport.go's build constraint: the UCX transport needs
// cgo. Without it kvxbench still builds; run, sweep, serve and connect then stop after the
// hello, saying the engine is missing.

package bench

import (
	"fmt"
	"syscall"

	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

func init() {
	newEngineSide = newUCXEngineSide
	engineBuilt = true
}

// newUCXEngineSide makes a transfer.Engine over a ucx.Transport whose UCX-mapped
// staging memory backs the engine's slots, as --tls says.
func newUCXEngineSide(cfg RunConfig, role string, rank int) (engineSide, error) {
	if cfg.Memory == "device" {
		return newDeviceEngineSide(cfg, role, rank) // device_engine.go
	}
	ec := engineConfig(cfg)
	tr, err := ucx.New(ucx.Config{TLS: cfg.TLS, StagingBytes: int64(ec.Tuning.NumSlots) * ec.SlotBytes, Lanes: cfg.Lanes, TCPSegmentBytes: cfg.TCPSegmentBytes, ShmFIFOSize: cfg.ShmFIFOSize,
		ServeEmulatedRMA: cfg.RMAWhereEmulated})
	if err != nil {
		return nil, fmt.Errorf("%s rank %d: UCX transport: %w", role, rank, err)
	}
	ec.StagingMemory = tr.StagingMemory()
	obs, err := engineObservability(cfg, role, rank)
	if err != nil {
		_ = tr.Close(true)
		return nil, err
	}
	if obs != nil {
		ec.Observer = obs.observer
	}
	eng, err := transfer.New(tr, ec)
	if err != nil {
		_ = tr.Close(true)
		obs.close()
		return nil, fmt.Errorf("%s rank %d: engine: %w", role, rank, err)
	}
	if err := obs.serve(eng); err != nil {
		_ = eng.Close()
		return nil, err
	}
	a := &engineAdapter{eng: eng, addr: tr.WorkerAddress(), peerOf: ucx.PeerFromAddress, obs: obs, decodeParams: decodeUCXParams}
	if !cfg.Staging {
		a.mapPool, a.direct = tr.AllocatePool, transportimpl.Of(tr).(transport.DirectTransport).Direct
		if cfg.Pool == "caller" {
			a.hugePages = cfg.CallerPages != "4k"
			a.mapPool = a.callerPool(tr)
		}
	}
	return a, nil
}

// decodeUCXParams decodes an exposure's ucx.ContextParams, as engineAdapter.decodeParams.
func decodeUCXParams(b []byte) (transport.Params, uint64, []byte, bool, error) {
	cp, err := ucx.UnmarshalContextParams(b)
	if err != nil {
		return nil, 0, nil, false, err
	}
	exposure, _, err := cp.OneHop()
	if err != nil {
		return nil, 0, nil, false, err
	}
	return cp, uint64(cp.RequestID), cp.Secret, exposure != nil, nil
}

// callerPool maps pools the way a serving process maps its own KV cache (mmap, with
// transparent huge pages unless --caller-pages 4k), then
// registers each with the transport once (RegisterHost). The transport's Close unregisters
// them; the adapter's Close unmaps them after it.
func (a *engineAdapter) callerPool(tr *ucx.Transport) func(n int64) ([]byte, error) {
	return func(n int64) ([]byte, error) {
		mem, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return nil, fmt.Errorf("mapping a %d-byte KV pool: %w", n, err)
		}
		if a.hugePages {
			// Before the first touch, so the pages come huge. A kernel without transparent
			// huge pages refuses the advice; the pool then keeps base pages, as with 4k.
			_ = syscall.Madvise(mem, syscall.MADV_HUGEPAGE)
		}
		region, err := tr.RegisterHost(mem)
		if err != nil {
			_ = syscall.Munmap(mem)
			return nil, err
		}
		a.unmaps = append(a.unmaps, func() { _ = syscall.Munmap(mem) })
		return region.Pool(), nil
	}
}
