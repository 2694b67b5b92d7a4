// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// The UCX transport needs cgo (transfer/ucx_transport.go has the same constraint); without
// it the example still builds and -transport=ucx says why it cannot run.

package main

import (
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer"
)

func init() { newUCXFabric = ucxFabric }

// ucxFabric is a worker over its own UCX worker, with UCX-mapped staging memory. ContextParams
// carry the UCX worker address, which is how the decode side reaches the prefill side.
func ucxFabric(tls string, keepalive time.Duration, log *zap.Logger) (fabric, error) {
	tr, err := transfer.NewUCXTransport(transfer.UCXConfig{TLS: tls, KeepaliveInterval: keepalive,
		StagingBytes: ucxStagingBytes, Logger: log})
	if err != nil {
		return fabric{}, err
	}
	return fabric{transport: tr, staging: tr.StagingMemory(), self: tr.Self(), params: tr.ContextParams,
		senderPeer: transfer.SenderPeer}, nil
}
