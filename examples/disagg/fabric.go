// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// fabric is everything in this example that depends on the transport: the engine's
// transport, the staging memory it needs, how the prefill worker describes a request in
// ContextParams, and how the decode worker names the sender from them. The workers are
// written against it, so moving from mem to UCX changes nothing else.
type fabric struct {
	transport transfer.Transport
	// staging backs the engine's slots; nil lets the engine allocate Go memory (mem only:
	// UCX refuses memory it has not mapped).
	staging []byte
	// self is this engine's peer name, what the other side passes as Spec.Peer.
	self transfer.Peer
	// params describes request id over the sender's plan, for the receiver.
	params func(id transfer.RequestID, plan *layout.Plan) *ucx.ContextParams
	// senderPeer names the engine a ContextParams came from.
	senderPeer func(*ucx.ContextParams) transfer.Peer
	// mapPool makes a worker's KV cache of n bytes and hands it to the transport, so the
	// engine moves it in place (the direct path, in its RMA mode): UCX registers memory the
	// process mapped itself (mmap, then RegisterHost).
	mapPool func(n int) ([]byte, error)
	// incarnation is this engine's life and address its transport address, as published in
	// the registry (package discovery).
	incarnation func() uint64
	address     func() []byte
}

// memFabric is a worker on the in-memory network. The in-memory transport has no worker
// address, so ContextParams carry the peer's name in its place.
func memFabric(network *mem.Network, name transfer.Peer) fabric {
	life := rand.Uint64() | 1
	return fabric{
		transport: network.Transport(name),
		self:      name,
		params: func(id transfer.RequestID, plan *layout.Plan) *ucx.ContextParams {
			return &ucx.ContextParams{RequestID: id, Incarnation: life, WorkerAddress: []byte(name),
				Layout: plan.Layout(), Selection: plan.Selection(), Blocks: plan.Blocks()}
		},
		senderPeer: func(c *ucx.ContextParams) transfer.Peer { return transfer.Peer(c.WorkerAddress) },
		// Go memory, not named to AllowDirect: over the in-memory network the example keeps
		// the staging path, whose sender and receiver both report a frozen wire (-freeze).
		mapPool:     func(n int) ([]byte, error) { return make([]byte, n), nil },
		incarnation: func() uint64 { return life },
		address:     func() []byte { return []byte(name) },
	}
}

// ucxStagingBytes is each UCX worker's staging region: 8 slots of the engines' 1 MiB.
const ucxStagingBytes = 8 * engineSlotBytes

// errNoUCX is what -transport=ucx says in a binary built without cgo.
var errNoUCX = errors.New("this binary was built without cgo, so without the UCX transport: " +
	"build with CGO_ENABLED=1 (and libucx-dev), or use -transport=mem")

// newUCXFabric opens a UCX worker with UCX_TLS=tls; nil when the UCX transport is not built
// (ucx.go needs cgo).
var newUCXFabric func(tls string, keepalive time.Duration, log *zap.Logger) (fabric, error)
