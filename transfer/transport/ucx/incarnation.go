// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"bytes"

	"github.com/kvxfer/kvxfer/transfer/internal/stale"
)

// Incarnation is this transport's current life, what its ContextParams carry: it changes
// when the transport replaces a wedged worker (Config.ReplaceWedgedWorker), as does the
// worker address. Publish it (package discovery) beside WorkerAddress.
func (t *ucxTransport) Incarnation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.life
}

// CheckParams is the sender's check that cp, params it handed out, still name this
// transport's current life: the same incarnation and worker address. Params of a life that
// is over (the worker was replaced, so nothing sent to the old address will arrive) fail at
// once with a *stale.Error matching ErrStaleIncarnation, so the request is refused
// rather than left to wait out its deadline. Call it before posting the Send of a request a
// peer asks for by its params.
func (t *ucxTransport) CheckParams(cp *ContextParams) error {
	t.mu.Lock()
	life, addr := t.life, t.addr
	t.mu.Unlock()
	switch {
	case cp.Incarnation != life:
		return &stale.Error{Peer: "this transport", Have: cp.Incarnation, Current: life, Reason: "the params are from another life of this transport"}
	case !bytes.Equal(cp.WorkerAddress, addr):
		return &stale.Error{Peer: "this transport", Have: cp.Incarnation, Current: life, Reason: "the params carry another worker address"}
	}
	return nil
}
