// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport/transporttest"
)

// The UCX transport keeps the transport.Transport contract, with its direct path and RMA gets, over
// shared memory and over TCP on loopback.
func TestConformance(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			transporttest.Run(t, transporttest.Harness{Pair: func(tb transporttest.TB) (a, b transporttest.Endpoint) {
				return conformanceEndpoint(tb, tr.tls, tr.dev), conformanceEndpoint(tb, tr.tls, tr.dev)
			}})
		})
	}
}

// conformanceEndpoint is a UCX transport whose buffers are successive parts of its staging
// memory (UCX is never handed Go memory).
func conformanceEndpoint(t transporttest.TB, tls, dev string) transporttest.Endpoint {
	tr, err := newTransport(Config{TLS: tls, NetDevices: dev, StagingBytes: 8 << 20, CloseTimeout: 2 * time.Second})
	require.NoError(t, err)
	mem := tr.StagingMemory()
	var mu sync.Mutex
	next := 0
	return transporttest.Endpoint{Transport: tr, Peer: tr.Self(), Buffer: func(n int) []byte {
		mu.Lock()
		defer mu.Unlock()
		off := (next + 63) &^ 63
		require.LessOrEqual(t, off+n, len(mem), "the conformance checks outgrew the staging memory")
		next = off + n
		return mem[off : off+n : off+n]
	}}
}
