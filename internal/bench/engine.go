// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
)

// engineSide is what the scenario driver needs of one end's transfer engine. An adapter over
// package transfer and its UCX transport implements it; tests use an in-process one. Keeping
// the driver behind it lets the benchmark's own logic (rounds, verification, timing) be
// tested without a network.
type engineSide interface {
	// Address is this end's transport address, sent to the other end in the hello.
	Address() []byte
	// Connect makes the peer whose Address is addr known to the engine and returns how the
	// engine names it.
	Connect(ctx context.Context, addr []byte) (peerRef, error)
	// Send posts the sending side of request id: the plan's stream, read through m. secret
	// is the request's claim secret (transfer.Spec.Secret), nil without a cluster key.
	Send(ctx context.Context, id uint64, secret []byte, to peerRef, p *layout.Plan, m mover) (pendingXfer, error)
	// Receive posts the receiving side of request id, from one peer per sub (two for
	// heterogeneous TP), written through m, proving secret (as Send's) to each.
	Receive(ctx context.Context, id uint64, secret []byte, subs []recvSub, m mover) (pendingXfer, error)
	// NewPool returns a KV pool of n bytes, zeroed, and whether transfers over it may take
	// the one-copy path: memory the transport mapped (valid until Close) when the run is
	// not forced to staging, else Go memory.
	NewPool(n int64) (pool []byte, direct bool, err error)
	// Close ends the engine, bounded.
	Close() error
}

// exposer is an engineSide that can run the --sender expose flow: expose a request with no
// named receiver (transfer.Engine.Expose) and receive it from what the exposure handed out.
type exposer interface {
	// Expose posts the sending side of request id, the plan's stream read through m, for
	// whichever receiver claims it. It returns the exposure's params as its transport
	// encodes them (nil where the transport issues none) and its claim secret.
	Expose(ctx context.Context, id uint64, p *layout.Plan, m mover) (h pendingXfer, params, secret []byte, err error)
	// ReceiveExposed posts the receiving side of request id from sub's peer, with the params
	// an Expose handed out (nil: none) and its secret.
	ReceiveExposed(ctx context.Context, id uint64, params, secret []byte, sub recvSub, m mover) (pendingXfer, error)
}

// peerRef is an engine's name for a peer.
type peerRef string

// recvSub is one peer's share of a Receive.
type recvSub struct {
	peer peerRef
	plan *layout.Plan
	// prefillRank is the peer's rank; decodeRank the decode rank whose pool the share lands
	// in (--decode-tp: each rank's share is a Receive of its own).
	prefillRank, decodeRank int
}

// pendingXfer is a posted transfer.
type pendingXfer interface {
	// Done closes when the transfer's outcome is decided.
	Done() <-chan struct{}
	// Err is the outcome once Done is closed: nil on success.
	Err() error
	// Quiesced closes when the engine and transport are done with the pool's blocks.
	Quiesced() <-chan struct{}
	// Release drops the caller's reference.
	Release()
	// Path is how the transfer moved its bytes ("rma", "direct", "staging"), once Done is
	// closed; "" where the engine does not say.
	Path() string
}

// engineBuilt says whether this build has a real engine (set by the file that provides it).
var engineBuilt = false

// EngineBuilt says whether this build has the engine's UCX transport (it needs cgo); without
// it the transfer subcommands stop after their set-up and handshake, saying so.
func EngineBuilt() bool { return engineBuilt }

// newEngineSide makes this end's engine: errEngineMissing unless engine_ucx.go (cgo) is built.
var newEngineSide = func(cfg RunConfig, role string, rank int) (engineSide, error) {
	return nil, errEngineMissing
}

// mover has the method set of transfer.Mover: the engine moves the caller's pool through it.
type mover interface {
	Gather(p *layout.Plan, off int64, dst []byte) error
	Scatter(p *layout.Plan, src []byte, off int64) error
}

// timedMover is the host mover (native.HostGather and HostScatter over a []byte pool) that
// adds up the time each request spends gathering and scattering, for the table's split.
type timedMover struct {
	pool      []byte
	gatherNs  atomic.Int64
	scatterNs atomic.Int64
}

func (m *timedMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	t := time.Now()
	err := native.HostGather(p, m.pool, off, dst)
	m.gatherNs.Add(int64(time.Since(t)))
	return err
}

// ScatterReadsAnyHostMemory is the optional Mover method (transfer.Mover): the host scatter reads its
// source wherever it lies, so the pull wire may hand it the prefill end's slot in place.
func (m *timedMover) ScatterReadsAnyHostMemory() bool { return true }

func (m *timedMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	t := time.Now()
	err := native.HostScatter(p, src, off, m.pool)
	m.scatterNs.Add(int64(time.Since(t)))
	return err
}
