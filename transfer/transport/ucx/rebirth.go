// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"context"
	"math/rand/v2"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// replaceWorker is Config.ReplaceWedgedWorker's recovery, run by the receive probe when it
// finds the worker's receive queue wedged (probe.go). A wedged UCX shared-memory queue
// never recovers, and it belongs to the worker: a new worker has a new one. The transport
// keeps its context (the staging region and mapped pools stay registered, their packed keys
// stay valid) and swaps the worker: new operations, endpoints and the control receive go to
// the new one at once; the old one's endpoints are closed, which reports every peer they
// reached lost (watch) and drops the keys unpacked on them, and closing the old worker settles
// every operation still in it, each reported failed with its memory released. The transport's
// address changes: to peers this is a restart of the process.
func (t *ucxTransport) replaceWorker(cause error) {
	nw, err := t.uctx.NewWorker(native.WorkerConfig{OnReport: t.enqueueRequest, Logger: t.cfg.Logger})
	if err != nil {
		// The probe tries again each interval while the worker stays wedged; the log says so
		// on attempts 1, 2, 4, 8, ... rather than once a second for as long as the process lives.
		t.replaceFailures++
		if n := t.replaceFailures; n&(n-1) == 0 {
			t.log.Error("ucx worker wedged and could not be replaced; restart the process", zap.Error(cause),
				zap.NamedError("replace", err), zap.Int("attempts", n))
		}
		return
	}
	t.replaceFailures = 0
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = nw.Close()
		return
	}
	old, oldEps := t.w, t.eps
	t.w, t.eps = nw, map[transport.Peer]*native.Endpoint{}
	for _, ep := range oldEps {
		t.retired[ep] = struct{}{} // watch reports their peers lost as retired, not dead
	}
	t.addr = nw.Address()
	t.self = PeerFromAddress(t.addr)
	t.life = rand.Uint64()
	if t.in != nil {
		t.postControlLocked() // the old control receive goes with the old worker
	}
	t.swaps++
	addr, self := append([]byte(nil), t.addr...), t.self
	t.mu.Unlock()
	t.log.Warn("ucx worker replaced: its receive queue was wedged; peers must be given the new address",
		zap.Error(cause), zap.String("self", string(self)[:min(16, len(self))]))
	if err := t.probe.Load().retarget(addr); err != nil {
		t.log.Warn("ucx receive probe lost its target", zap.Error(err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	for _, ep := range oldEps {
		_ = ep.ForceClose(ctx)
	}
	if err := old.Close(); err != nil { // settles every request of the old worker, reporting each
		t.log.Warn("closing the wedged ucx worker", zap.Error(err))
	}
}

// WorkersReplaced is how many times the transport replaced a wedged worker
// (Config.ReplaceWedgedWorker). It never blocks on UCX.
func (t *ucxTransport) WorkersReplaced() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.swaps
}
