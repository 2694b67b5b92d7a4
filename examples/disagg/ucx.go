// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// The UCX transport needs cgo (transfer/transport/ucx/transport.go has the same constraint); without
// it the example still builds and -transport=ucx says why it cannot run.

package main

import (
	"fmt"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"go.uber.org/zap"
)

func init() { newUCXFabric = ucxFabric }

// ucxFabric is a worker over its own UCX worker, with UCX-mapped staging memory. ContextParams
// carry the UCX worker address, which is how the decode side reaches the prefill side.
func ucxFabric(tls string, keepalive time.Duration, log *zap.Logger) (fabric, error) {
	tr, err := ucx.New(ucx.Config{TLS: tls, KeepaliveInterval: keepalive,
		StagingBytes: ucxStagingBytes, Logger: log})
	if err != nil {
		return fabric{}, err
	}
	return fabric{transport: tr, staging: tr.StagingMemory(), self: tr.Self(), params: tr.ContextParams,
		senderPeer: func(c *ucx.ContextParams) transfer.Peer { return ucx.PeerFromAddress(c.WorkerAddress) }, incarnation: tr.Incarnation, address: tr.WorkerAddress, mapPool: func(n int) ([]byte, error) { return registeredPool(tr, n) }}, nil
}

// registeredPool is how a serving process hands UCX the KV cache it owns: memory it mapped
// itself (never Go memory: UCX would keep it past every call, which cgo's rules forbid, and
// RegisterHost refuses it), registered once. The transport's Close unregisters it; the mapping
// lives as long as the process.
func registeredPool(tr *ucx.Transport, n int) ([]byte, error) {
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap of %d bytes: %w", n, err)
	}
	region, err := tr.RegisterHost(mem)
	if err != nil {
		_ = syscall.Munmap(mem)
		return nil, err
	}
	return region.Pool(), nil
}
